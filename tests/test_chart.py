"""`qprof table --chart`: the comparison chart's bars and goodput panel (pure), its SVG parsed, and the
chart of real runs looked at in headless Chromium (the legend's colours, one bar per configuration and
side, the hover script running)."""

from __future__ import annotations

import math
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from conftest import qprof
from qprof.attribution.categories import CATEGORIES
from qprof.attribution.stats import min_n
from qprof.viewer.chart import BAR_W, CHAR_W, LABEL_ANGLE, PANEL_H, bars, chart_html, chart_svg
from qprof.viewer.palette import category_colour
from qprof.viewer.rows import TABLE_COLUMNS, Notice, TableRow, configuration

SVG = "{http://www.w3.org/2000/svg}"


def _rows(run: str, role: str, shares: dict[str, float], cpu_s: float = 2.0, moved: int | None = 10 ** 9,
          stack: str = "ngtcp2", pid: int = 1, goodput: float | None = None,
          conf: str | None = None) -> list[TableRow]:
    """A run's table rows for one side; its configuration by default as a run without a recorded one
    is placed (by its directory's name)."""
    out = []
    for c in CATEGORIES:
        row: dict[str, Any] = dict.fromkeys(TABLE_COLUMNS)
        row.update(run=run, configuration=conf or configuration(run), pid=pid, comm=role, role=role, stack=stack,
                   category=c, share=shares.get(c, 0.0), cpu_seconds=cpu_s * shares.get(c, 0.0), tx_bytes=moved,
                   rx_bytes=0 if moved else None, goodput_gbps=goodput, configuration_recorded=conf is not None)
        out.append(TableRow(**row))
    return out


def test_configurations_and_repetitions() -> None:
    assert configuration("/x/gso-on/rep-03") == "gso-on" and configuration("/x/gso-on") == "gso-on"
    assert configuration("rep-1") == "rep-1"  # nothing above it to name the configuration
    rows = [r for i in range(3) for r in _rows(f"/s/gso/rep-0{i}", "server", {"Crypto": 0.2 + i / 10,
                                                                              "Packet I/O": 0.5})]
    rows += _rows("/s/no-gso", "client", {"Packet I/O": 1.0}, moved=None, pid=2)
    (gso, nogso) = bars(rows)
    assert (gso.configuration, gso.side, gso.runs) == ("gso", "server", 3)
    assert gso.share["Crypto"].median == pytest.approx(0.3) and gso.share["Packet I/O"].median == 0.5
    assert gso.per_gb["Crypto"].median == pytest.approx(0.6)  # 2 CPU s x 0.3 over 1 GB
    assert nogso.per_gb == {} and nogso.label == "ngtcp2 no-gso · client"
    assert gso.label == "ngtcp2 gso · server"
    (alone,) = bars(_rows("/s/default/rep-01", "server", {"Crypto": 1.0}))
    assert alone.label == "ngtcp2 · server", "one configuration: the stacks name the bars"
    # the configuration a run records wins over its directory's name
    (a, b) = bars(_rows("/s/x/rep-01", "server", {"Crypto": 1.0}, conf="ngtcp2/gso-on")
                  + _rows("/s/x/rep-02", "server", {"Crypto": 1.0}, conf="ngtcp2/gso-off"))
    assert (a.label, b.label) == ("ngtcp2/gso-on · server", "ngtcp2/gso-off · server")


def test_goodput_panel_one_bar_per_configuration() -> None:
    """Each configuration's goodput (its runs' median; each run's client's figure), one bar as wide as
    its sides, a whisker from the runs an interval needs on, its label under it."""
    rows = []
    for i in range(min_n()):
        run = f"/s/gso/rep-0{i}"
        rows += _rows(run, "server", {"Crypto": 1.0}, goodput=9.0) + \
            _rows(run, "client", {"Crypto": 1.0}, pid=2, goodput=2.0 + i / 10)
    rows += _rows("/s/no-gso/rep-01", "server", {"Crypto": 1.0}, goodput=1.0) + \
        _rows("/s/no-gso/rep-01", "client", {"Crypto": 1.0}, pid=2, goodput=1.0)
    drawn = bars(rows)
    assert {b.configuration: b.goodput.median for b in drawn} == {"gso": pytest.approx(2.25), "no-gso": 1.0}
    root = _svg(chart_svg(drawn))
    goodput = [el for el in root.iter(f"{SVG}rect") if el.get("class") == "goodput"]
    assert [(el.get("data-tip") or "").split(":")[0] for el in goodput] == ["gso", "no-gso"]
    gso_bars = [float(el.get("x")) for el in root.iter(f"{SVG}rect") if el.get("class") == "seg"  # type: ignore
                and (el.get("data-tip") or "").startswith("ngtcp2 gso")]
    assert float(goodput[0].get("x")) == min(gso_bars)  # type: ignore[arg-type]
    assert float(goodput[0].get("width")) == pytest.approx(max(gso_bars) + BAR_W - min(gso_bars))  # type: ignore
    assert float(goodput[1].get("height")) / float(goodput[0].get("height")) == pytest.approx(1 / 2.25)  # type: ignore
    labels = [el.text for el in root.iter(f"{SVG}text") if el.get("class") == "label"]
    assert labels[-2:] == ["gso", "no-gso"]
    assert "median of 1 run; no interval" in (goodput[1].get("data-tip") or "")
    whiskers = [el for el in root.iter(f"{SVG}path") if el.get("class") == "whisker"]
    assert len(whiskers) == 2 * 2 + 1  # the gso sides' Crypto, both panels, and its goodput
    nothing = _svg(chart_svg(bars(_rows("/r", "server", {"Crypto": 1.0}))))
    assert any("no run measured its goodput" in (el.text or "") for el in nothing.iter(f"{SVG}text"))


def test_chart_says_what_the_summary_warns_of() -> None:
    notice = Notice("runs pooled into one summary row were measured differently: unwinding (dwarf, fp)", True)
    root = _svg(chart_svg(bars(_rows("/r", "server", {"Crypto": 1.0})), notices=[notice]))
    notes = " ".join(el.text or "" for el in root.iter(f"{SVG}text") if el.get("class") == "note")
    assert "Warning: runs pooled into one summary row were measured differently" in notes


def _svg(text: str) -> ET.Element:
    return ET.fromstring(text)


def test_svg_bars_legend_whiskers_and_room() -> None:
    few = [r for i in range(2) for r in _rows(f"/a/quic-go-long-setting-name/rep-0{i}", "server",
                                               {"Crypto": 0.4, "Packet I/O": 0.6}, stack="quic-go")]
    many = [r for i in range(min_n()) for r in _rows(f"/a/b/rep-0{i}", "client",
                                                     {"Crypto": 0.3 + i / 100, "Uncategorized": 0.7 - i / 100})]
    drawn = bars(few + many)
    root = _svg(chart_svg(drawn))
    width, height = float(root.get("width")), float(root.get("height"))  # type: ignore[arg-type]
    legend = [el.get("fill") for el in root.iter(f"{SVG}rect") if el.get("class") == "legend"]
    assert legend == [category_colour(c) for c in CATEGORIES]
    labels = [el for el in root.iter(f"{SVG}text") if el.get("class") == "label"]
    assert [el.text for el in labels] == [b.label for b in drawn] * 2 + ["quic-go-long-setting-name", "b"]
    for el in labels:  # turned labels end under their bar: their start stays inside the picture
        reach = len(el.text or "") * CHAR_W
        x = float(el.get("x"))  # type: ignore[arg-type]
        y = float(el.get("y"))  # type: ignore[arg-type]
        a = math.radians(LABEL_ANGLE)
        assert x - reach * math.cos(a) >= 0 and y + reach * math.sin(a) <= height, el.text
        assert x <= width
    segs = [el for el in root.iter(f"{SVG}rect") if el.get("class") == "seg"]
    share_h = {b.label: 0.0 for b in drawn}
    for el in segs[:len(segs) // 2]:  # the share panel's segments come first
        label = (el.get("data-tip") or "").split(":")[0]
        share_h[label] += float(el.get("height"))  # type: ignore[arg-type]
    assert all(h == pytest.approx(PANEL_H, abs=0.05) for h in share_h.values()), share_h
    whiskers = [el for el in root.iter(f"{SVG}path") if el.get("class") == "whisker"]
    assert len(whiskers) == 2 * 2  # only the bar with enough runs, its two categories, both panels
    assert float(segs[0].get("width")) == BAR_W  # type: ignore[arg-type]
    notes = " ".join(el.text or "" for el in root.iter(f"{SVG}text") if el.get("class") == "note")
    assert "runs per bar: 2, 6" in notes and f"where a bar has {min_n()} runs or more" in notes


def test_chart_without_bytes_says_so() -> None:
    root = _svg(chart_svg(bars(_rows("/r", "server", {"Crypto": 1.0}, moved=None))))
    assert any("no run counted the bytes" in (el.text or "") for el in root.iter(f"{SVG}text"))
    with pytest.raises(ValueError):
        chart_svg([])


def test_html_carries_the_svg_the_data_and_nothing_from_elsewhere() -> None:
    page = chart_html(bars(_rows("/r</script>", "server", {"Crypto": 1.0})))
    assert "<svg" in page and 'id="qprof-chart"' in page and "</script>\",\"" not in page
    assert not re.search(r"<script[^>]+src=|<link[^>]+href=|https?://(?!www\.w3\.org)", page)


def _chromium(url: str, tmp: Path, screenshot: Path | None = None) -> str:
    exe = shutil.which("chromium")
    if exe is None:
        pytest.skip("chromium missing (make test installs it)")
    cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
           f"--user-data-dir={tmp / 'chromium-profile'}", "--window-size=1400,1400", "--virtual-time-budget=3000"]
    cmd += [f"--screenshot={screenshot}"] if screenshot else ["--dump-dom"]
    r = subprocess.run([*cmd, url], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


def _columns(img: Any, y: int, colour: str) -> int:
    """Runs of `colour` along row y of the screenshot: one per bar whose bottom segment it is."""
    want = tuple(int(colour[i:i + 2], 16) for i in (1, 3, 5))
    runs, inside = 0, False
    for x in range(img.width):
        hit = all(abs(a - b) <= 6 for a, b in zip(img.getpixel((x, y))[:3], want))
        runs += hit and not inside
        inside = hit
    return runs


@pytest.mark.root
@pytest.mark.slow
def test_chart_of_real_runs_in_chromium(ngtcp2_capture: Any, tmp_path: Path) -> None:
    from PIL import Image

    runs = []
    for name in ("gso", "no-gso"):  # a configuration is its directory's name
        runs.append(tmp_path / name)
        shutil.copytree(ngtcp2_capture(name), runs[-1])
    svg, page = tmp_path / "c.svg", tmp_path / "c.html"
    r = qprof("table", *map(str, runs), "--chart", str(svg))
    assert "svg chart of 4 bars from 2 runs written" in r.stderr
    qprof("table", *map(str, runs), "--chart", str(page))
    root = ET.parse(svg).getroot()
    labels = [el.text for el in root.iter(f"{SVG}text") if el.get("class") == "label"]
    assert labels[:4] == ["ngtcp2 gso · server", "ngtcp2 gso · client", "ngtcp2 no-gso · server",
                          "ngtcp2 no-gso · client"]
    assert labels[-2:] == ["gso", "no-gso"]  # the goodput panel's
    shot = tmp_path / "c.png"
    _chromium(svg.as_uri(), tmp_path, shot)
    img = Image.open(shot).convert("RGB")
    colours = {img.getpixel((x, y)) for x in range(0, img.width, 2) for y in range(0, img.height, 2)}
    for c in CATEGORIES:  # the legend is drawn whatever the runs hold
        want = tuple(int(category_colour(c)[i:i + 2], 16) for i in (1, 3, 5))
        assert any(all(abs(a - b) <= 6 for a, b in zip(px, want)) for px in colours), c
    # along a row just above the share panel's axis, every bar shows its Packet I/O segment
    base = [float(el.get("y1")) for el in root.iter(f"{SVG}line") if el.get("stroke") == "#999"][0]  # type: ignore
    assert _columns(img, int(base) - 3, category_colour("Packet I/O")) == 4
    dom = _chromium(page.as_uri(), tmp_path)
    segs = re.findall(r'<rect class="seg"[^>]*>(.*?)</rect>', dom)
    assert segs and all("<title>" not in s for s in segs), "the page's script replaced the tooltips"
    assert "data-tip=" in dom and "CPU s/GB" in dom
    print(f"\nchart of {(len(labels) - 2) // 2} bars: {svg.stat().st_size:,} bytes SVG, {page.stat().st_size:,} bytes HTML")
