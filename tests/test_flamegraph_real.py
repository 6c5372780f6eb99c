"""Flame graphs of a real ngtcp2 transfer, the HTML and SVG checked in a real browser.

Headless Chromium renders the pages: a screenshot must show the category colours (not a blank page), and
the DOM after the scripts ran must hold the named frames, their tooltips, the legend with the report's
shares, and the search and zoom results. The speedscope export must hold the report's sample counts.
"""

from __future__ import annotations

import colorsys
import json
import shutil
import subprocess
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from PIL import Image

from conftest import qprof
from test_flamegraph import SVG, in_family
from qprof.attribution.categories import CATEGORIES, CRYPTO, PACKET_IO
from qprof.viewer.palette import FAMILIES, SEARCH_MATCH

pytestmark = [pytest.mark.root, pytest.mark.slow]
WINDOW = (1400, 1000)


def browse(url: str, tmp: Path, screenshot: Path | None = None) -> str:
    """Load `url` in headless Chromium, let its scripts run, return the DOM (or write a screenshot)."""
    exe = shutil.which("chromium")
    if exe is None:
        pytest.skip("chromium missing (make test installs it)")
    cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
           f"--user-data-dir={tmp / 'chromium-profile'}", f"--window-size={WINDOW[0]},{WINDOW[1]}",
           "--virtual-time-budget=5000"]
    cmd += [f"--screenshot={screenshot}"] if screenshot else ["--dump-dom"]
    r = subprocess.run([*cmd, url], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    if screenshot:
        assert screenshot.is_file(), r.stderr[-2000:]
    return r.stdout


def family_pixels(png: Path, category: str) -> int:
    """Pixels whose hue is in the category's family and clearly coloured (the page blends frames with white
    at 0.8 opacity: hue kept, saturation lowered)."""
    lo, hi = FAMILIES[category].hue
    n = 0
    for (r, g, b), count in ((c, k) for k, c in Image.open(png).convert("RGB").getcolors(1 << 24) or []):
        h, _, s = colorsys.rgb_to_hls(r / 255, g / 255, b / 255)
        if s > 0.3 and lo - 2 <= h * 360 <= hi + 2:
            n += count
    return n


def assert_not_blank(png: Path) -> None:
    im = Image.open(png).convert("RGB")
    assert im.size == WINDOW
    colours = im.getcolors(1 << 24) or []
    white = sum(k for k, c in colours if c == (255, 255, 255))
    assert len(colours) > 50 and white < 0.9 * im.size[0] * im.size[1], "the page drew a flame graph"


class Frames(HTMLParser):
    """Frames of a dumped flame graph DOM: d3-flame-graph's <g class="frame" name=..> and the SVG's
    <g class="f" data-name=..>, each with its rect's fill and width, title text and classes."""

    def __init__(self) -> None:
        super().__init__()
        self.frames: list[dict[str, Any]] = []
        self.texts: dict[str, str] = {}  # "matched" (search result), "legend" (items joined by "|")
        self._cur: dict[str, Any] | None = None
        self._in: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        cls = (a.get("class") or "").split()
        if tag == "g" and ("frame" in cls or "f" in cls):
            self._cur = {"name": a.get("name") or a.get("data-name"), "class": cls, "title": ""}
            self.frames.append(self._cur)
        elif tag == "rect" and self._cur is not None and "fill" not in self._cur:
            self._cur.update(fill=a.get("fill"), width=float(a.get("width") or 0))
        elif tag == "title" and self._cur is not None:
            self._in = "title"
        elif a.get("id") == "matched" or "legend-text" in cls:
            self._in = "matched" if a.get("id") == "matched" else "legend"
            self.texts[self._in] = self.texts.get(self._in, "") + ("|" if self._in == "legend" else "")

    def handle_endtag(self, tag: str) -> None:
        if self._in is not None and tag in ("title", "span", "text"):
            self._in = None

    def handle_data(self, data: str) -> None:
        if self._in == "title" and self._cur is not None:
            self._cur["title"] += data
        elif self._in is not None:
            self.texts[self._in] += data

    def named(self, name: str) -> list[dict[str, Any]]:
        return [f for f in self.frames if f["name"] == name]


def parse_dom(html: str) -> Frames:
    p = Frames()
    p.feed(html)
    return p


def report_of(run: Path) -> dict[str, Any]:
    return json.loads(qprof("report", str(run), "--format", "json").stdout)


def role_of(report: dict[str, Any], role: str) -> dict[str, Any]:
    return next(p for p in report["processes"] if p["role"] == role)


def legend_agrees(legend: list[str], shares: dict[str, float]) -> bool:
    """The legend names every category, in order, with the report's share to its one decimal. The
    report's JSON rounds shares to 6 places, so a share within 5e-7 of a rounding tie may print one
    tenth apart from the legend, which formats the unrounded one: the tolerance is the two roundings'."""
    if [item.rsplit(" ", 1)[0] for item in legend] != list(CATEGORIES):
        return False
    return all(abs(float(item.rsplit(" ", 1)[1].rstrip("%")) - 100 * shares[c]) <= 0.05 + 5e-5
               for item, c in zip(legend, CATEGORIES))


def test_html_flame_graph_in_chromium(ngtcp2_capture: Any, tmp_path: Path) -> None:
    run = ngtcp2_capture("gso")
    out = tmp_path / "server.html"
    qprof("flamegraph", str(run), "--role", "server", "-o", str(out))
    size = out.stat().st_size
    print(f"\nHTML flame graph of the server: {size:,} bytes")
    shot = tmp_path / "html.png"
    browse(out.as_uri(), tmp_path, screenshot=shot)
    assert_not_blank(shot)
    blue, red = family_pixels(shot, PACKET_IO), family_pixels(shot, CRYPTO)
    print(f"pixels in the Packet I/O family {blue:,}, Crypto family {red:,}")
    assert blue > 2000 and red > 2000, "frames drew in their categories' colours"

    dom = parse_dom(browse(out.as_uri() + "?s=" + quote("^gnutls_aead_cipher_"), tmp_path))
    srv = role_of(report_of(run), "server")
    legend = dom.texts["legend"].strip("|").split("|")
    assert legend_agrees(legend, srv["categories"]), (legend, srv["categories"])
    assert len(dom.frames) > 50
    (proc,) = dom.named(f"gtlsserver (pid {srv['pid']}, server)")
    assert f"{srv['samples']:,} samples" in proc["title"] and "100.00% of shown" in proc["title"]
    sends = dom.named("__sys_sendmsg_[k]")
    assert sends and all(in_family(f["fill"], PACKET_IO) for f in sends)
    assert all("samples" in f["title"] and "% of shown" in f["title"] and "category: Packet I/O" in f["title"]
               for f in sends)
    aead = dom.named("gnutls_aead_cipher_encrypt")
    assert aead and all(f["fill"] == SEARCH_MATCH for f in aead), "search highlighted the matches"
    assert "category: Crypto" in aead[0]["title"]
    matched = float(dom.texts["matched"].split("Matched: ")[1].split("%")[0])
    assert 1.0 < matched < 60.0, dom.texts["matched"]


def test_svg_flame_graph_static_and_in_chromium(ngtcp2_capture: Any, tmp_path: Path) -> None:
    run = ngtcp2_capture("gso")
    out = tmp_path / "server.svg"
    qprof("flamegraph", str(run), "--role", "server", "-o", str(out))
    print(f"\nSVG flame graph of the server: {out.stat().st_size:,} bytes")
    srv = role_of(report_of(run), "server")
    doc = ET.parse(out).getroot()
    legend = doc.find(f".//{SVG}g[@id='legend']")
    assert legend is not None and legend_agrees([t.text or "" for t in legend.iter(f"{SVG}text")], srv["categories"])
    frames = [g for g in doc.iter(f"{SVG}g") if g.get("class") == "f"]
    assert len(frames) > 50
    for g in frames:
        title = g.find(f"{SVG}title")
        assert title is not None and title.text and title.text.startswith(g.get("data-name") or "")
        assert " samples, " in title.text and "% of shown" in title.text and "category: " in title.text
    fill = {g.get("data-name"): g.find(f"{SVG}rect").get("fill") for g in frames}  # type: ignore[union-attr]
    assert in_family(fill["__sys_sendmsg_[k]"], PACKET_IO)  # type: ignore[arg-type]
    assert in_family(fill["gnutls_aead_cipher_encrypt"], CRYPTO)  # type: ignore[arg-type]

    shot = tmp_path / "svg.png"
    browse(out.as_uri(), tmp_path, screenshot=shot)
    assert_not_blank(shot)
    assert family_pixels(shot, PACKET_IO) > 2000 and family_pixels(shot, CRYPTO) > 2000
    # the embedded script: search from the URL highlights and measures; zoom hides what is not under the frame
    dom = parse_dom(browse(out.as_uri() + "?s=sendmsg", tmp_path))
    hits = [f for f in dom.frames if "sendmsg" in (f["name"] or "")]
    assert hits and all(f["fill"] == SEARCH_MATCH for f in hits)
    assert all(f["fill"] != SEARCH_MATCH for f in dom.frames if "sendmsg" not in (f["name"] or ""))
    assert 1.0 < float(dom.texts["matched"].removeprefix("Matched: ").rstrip("%")) < 80.0
    # not a valid regular expression: searched as plain text, and both viewers measure the same share
    literal = "?s=" + quote("g_[k")  # the kernel frames of sendmsg, recvmsg, ... (an unclosed class)
    svg_share = float(parse_dom(browse(out.as_uri() + literal, tmp_path)).texts["matched"].split()[1].rstrip("%"))
    qprof("flamegraph", str(run), "--role", "server", "-o", str(tmp_path / "server.html"))
    html_share = float(parse_dom(browse((tmp_path / "server.html").as_uri() + literal, tmp_path))
                       .texts["matched"].split()[1].rstrip("%"))
    assert svg_share > 1.0 and svg_share == pytest.approx(html_share, abs=0.5)
    dom = parse_dom(browse(out.as_uri() + "?z=" + quote("__sys_sendmsg_[k]"), tmp_path))
    zoomed = dom.named("__sys_sendmsg_[k]")
    assert any(f["width"] == pytest.approx(1180, abs=0.01) and "hide" not in f["class"] for f in zoomed)
    assert any("hide" in f["class"] for f in dom.frames) and any("parent" in f["class"] for f in dom.frames)
    assert all("hide" in f["class"] for f in dom.named("gnutls_aead_cipher_encrypt"))


def test_speedscope_totals_are_the_reports(ngtcp2_capture: Any, tmp_path: Path) -> None:
    run = ngtcp2_capture("gso")
    report = report_of(run)
    out = tmp_path / "all.speedscope.json"
    qprof("flamegraph", str(run), "-o", str(out))
    doc = json.loads(out.read_text())
    assert doc["$schema"] == "https://www.speedscope.app/file-format-schema.json"
    assert set(doc) >= {"shared", "profiles", "name", "activeProfileIndex", "exporter"}
    n = len(doc["shared"]["frames"])
    assert all(isinstance(f["name"], str) for f in doc["shared"]["frames"])
    by_name = {p["name"]: p for p in doc["profiles"]}
    for p in report["processes"]:
        prof = by_name[f"{p['comm']} (pid {p['pid']}, {p['role']})"]
        assert prof["type"] == "sampled" and prof["unit"] == "none"
        assert len(prof["samples"]) == len(prof["weights"])
        assert all(s and all(0 <= i < n for i in s) for s in prof["samples"])
        assert sum(prof["weights"]) == prof["endValue"] == p["samples"]
    srv = role_of(report, "server")
    main = next(t for t in srv["threads"] if t["tid"] == srv["pid"])
    qprof("flamegraph", str(run), "--pid", str(srv["pid"]), "--thread", str(main["tid"]),
          "-o", str(tmp_path / "t.speedscope.json"))
    (prof,) = json.loads((tmp_path / "t.speedscope.json").read_text())["profiles"]
    assert sum(prof["weights"]) == main["samples"]
