"""Flame graphs without a kernel: the tree and its colouring, escaping of hostile names, the SVG, HTML and
speedscope writers, the vendored scripts, and `qprof flamegraph`'s input checks (on a fake archive).

Real captures, a real browser and real speedscope totals are in test_flamegraph_real.py.
"""

from __future__ import annotations

import colorsys
import hashlib
import json
import re
import runpy
import shutil
import tempfile
import tomllib
import xml.etree.ElementTree as ET
from fnmatch import fnmatch
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import ROOT, as_nobody, edited_meta, examples, qprof, shell_mode
from test_archive import CLIENT, SERVER, _fake_run
from test_bad_input import one_line_error
from qprof.attribution.categories import CATEGORIES, CONNECTION, CRYPTO, IO, PACKET_IO, UNCATEGORIZED
from qprof.viewer.flamegraph_html import flame_html, script_json, tree_json
from qprof.viewer.flamegraph_svg import MIN_W, fit_label, layout, render_svg, xml_safe
from qprof.viewer.flametree import ROOT as ROOT_FRAME, Flame, FrameNode
from qprof.viewer.palette import FAMILIES, frame_colour
from qprof.viewer.speedscope import speedscope_doc

SVG = "{http://www.w3.org/2000/svg}"
K = "[kernel.kallsyms]"
LIBC = "/usr/lib/x86_64-linux-gnu/libc.so.6"


pytestmark = pytest.mark.usefixtures("user_config")


def hls(colour: str) -> tuple[float, float, float]:
    """(hue degrees, lightness, saturation) of `#rrggbb` or `rgb(r, g, b)`."""
    m = re.fullmatch(r"#([0-9a-f]{2})([0-9a-f]{2})([0-9a-f]{2})", colour)
    rgb = [int(x, 16) for x in m.groups()] if m else [int(x) for x in re.findall(r"\d+", colour)[:3]]
    h, light, s = colorsys.rgb_to_hls(*(c / 255 for c in rgb))
    return h * 360, light, s


def in_family(colour: str, category: str) -> bool:
    """Is the colour a shade of the category's hue family (palette.FAMILIES), within rounding?"""
    f = FAMILIES[category]
    h, light, s = hls(colour)
    if f.saturation == 0:
        return s < 0.02 and f.lightness[0] - 0.01 <= light <= f.lightness[1] + 0.01
    return f.hue[0] - 1.5 <= h <= f.hue[1] + 1.5 and abs(s - f.saturation) < 0.03 \
        and f.lightness[0] - 0.01 <= light <= f.lightness[1] + 0.01


# ------------------------------------------------------------------ the tree and its colours

HOSTILE = ["<", ">", "&", "&amp;", '"', "'", ";", "]]>", "</script>", "<!--", "\x00", "\x1b[31m", "\ud800",
           "\ufffe", "漢字", "ünï", "\r\n", "\t", " ", "", "[unknown]", "a;b c", "${x}", "\\", "%s%n"]
names = st.one_of(st.sampled_from(HOSTILE), st.text(max_size=12),
                  st.lists(st.sampled_from(HOSTILE), max_size=4).map("".join))
frames_st = st.lists(st.tuples(names, st.sampled_from([K, LIBC, "[unknown]", "/opt/ä b/<lib>.so"])), max_size=10)
stacks_st = st.lists(st.tuples(frames_st, st.sampled_from(CATEGORIES), st.integers(1, 40),
                               st.integers(1, 10**7)), min_size=1, max_size=15)


def tree_of(stacks: list[tuple[list[tuple[str, str]], str, int, int]]) -> FrameNode:
    root = FrameNode(ROOT_FRAME)
    for frames, cat, n, per in stacks:
        root.add([("proc (pid 1)", "")] + frames, cat, n, per)
    return root


def flame_of(root: FrameNode) -> Flame:
    return Flame(root, "t <&> \"title\"", "s", 1e-9, [])


@settings(max_examples=examples(150), deadline=None)
@given(stacks_st)
def test_tree_totals_and_majority(stacks: list) -> None:
    root = tree_of(stacks)
    assert root.samples == sum(s[2] for s in stacks) and root.period == sum(s[3] for s in stacks)
    for node, _ in root.walk():
        assert node.self_samples >= 0
        assert node.samples == node.self_samples + sum(c.samples for c in node.children.values())
        assert sum(node.categories.values()) == node.period
        best = max(node.categories.values())
        # the largest share wins; a tie goes to the category listed first in the report
        assert node.category == next(c for c in CATEGORIES if node.categories[c] == best)
        assert in_family(node.colour, node.category)


def test_frame_colour_is_the_majority_of_its_samples() -> None:
    """memcpy under AEAD and under sendmsg: the frame takes the category holding most of its time."""
    root = FrameNode(ROOT_FRAME)
    main, memcpy = ("main", "/usr/bin/app"), ("memcpy", LIBC)
    root.add([main, memcpy], CRYPTO, 3, 3_000_000)
    root.add([main, memcpy], PACKET_IO, 5, 2_000_000)  # more samples, less time: time decides
    root.add([main, ("recv", LIBC)], IO, 1, 4_000_000)
    m = root.find(["main", "memcpy"])
    assert m is not None and m.category == CRYPTO
    assert m.mix() == [(CRYPTO, 0.6), (PACKET_IO, 0.4)]
    top = root.find(["main"])
    assert top is not None and top.category == IO  # 4 ms of I/O against 3 of Crypto and 2 of Packet I/O
    tie = FrameNode(ROOT_FRAME)
    tie.add([main], CONNECTION, 1, 10)
    tie.add([main], PACKET_IO, 1, 10)
    assert tie.find(["main"]).category == PACKET_IO  # type: ignore[union-attr]


def test_colours_one_family_per_category_shade_by_name() -> None:
    for cat in CATEGORIES:
        shades = {frame_colour(cat, f"fn_{i}") for i in range(40)}
        assert all(in_family(c, cat) for c in shades)
        assert len(shades) > 20, f"{cat}: shades vary with the name"
        assert frame_colour(cat, "udp_sendmsg_[k]") == frame_colour(cat, "udp_sendmsg_[k]")
    assert not in_family(frame_colour(PACKET_IO, "x"), CRYPTO)
    assert not in_family(frame_colour(UNCATEGORIZED, "x"), IO)


# ------------------------------------------------------------------ SVG

@settings(max_examples=examples(150), deadline=None)
@given(stacks_st)
def test_svg_carries_any_name_as_text(stacks: list) -> None:
    """Hostile names (markup, quotes, NUL, lone surrogates, CR) stay data: the SVG parses, every frame's
    name and tooltip come back as text (characters XML cannot hold replaced by U+FFFD)."""
    root = tree_of(stacks)
    flame = flame_of(root)
    svg = render_svg(root, title=flame.title, subtitle="s <b>", fill=lambda n: n.colour, describe=flame.describe,
                     legend=[("x <&> y", "#000000")])
    doc = ET.fromstring(svg.encode("utf-8"))
    groups = [g for g in doc.iter(f"{SVG}g") if g.get("class") == "f"]
    drawn = layout(root, 1180)
    assert len(groups) == len(drawn)
    for g, (node, depth, _, w) in zip(groups, drawn):
        assert g.get("data-name") == xml_safe(node.name)
        assert int(g.get("data-d") or -1) == depth
        title = g.find(f"{SVG}title")
        assert title is not None and title.text == xml_safe(flame.describe(node))
        rect = g.find(f"{SVG}rect")
        assert rect is not None and float(rect.get("width") or 0) == pytest.approx(w, abs=0.006)
        assert w >= MIN_W
    assert doc.find(f".//{SVG}text[@id='title']").text == flame.title  # type: ignore[union-attr]


def test_svg_deep_stack_and_min_width() -> None:
    root = FrameNode(ROOT_FRAME)
    root.add([(f"f{i}", LIBC) for i in range(3000)], CRYPTO, 1, 1_000_000)
    root.add([("tiny", LIBC)], IO, 1, 1)  # far below 0.1 px of 1180: left out, as flamegraph.pl does
    svg = render_svg(root, title="deep", subtitle="", fill=lambda n: n.colour, describe=lambda n: n.name,
                     legend=[])
    doc = ET.fromstring(svg.encode())
    names_drawn = [g.get("data-name") for g in doc.iter(f"{SVG}g") if g.get("class") == "f"]
    assert len(names_drawn) == 3001 and "tiny" not in names_drawn
    assert int(doc.get("height") or 0) > 3000 * 16


def test_fit_label() -> None:
    assert fit_label("udp_sendmsg", 1000) == "udp_sendmsg"
    assert fit_label("udp_sendmsg", 10) == ""
    cut = fit_label("a_very_long_function_name", 60)
    assert cut.endswith("..") and 3 <= len(cut) < 25


# ------------------------------------------------------------------ HTML and speedscope writers

def _unnest(d: dict) -> list[tuple[int, str, int]]:
    out, stack = [], [(d, 0)]
    while stack:
        n, depth = stack.pop()
        out.append((depth, n["name"], n["value"]))
        stack.extend((c, depth + 1) for c in reversed(n.get("children", [])))
    return out


@settings(max_examples=examples(100), deadline=None)
@given(stacks_st)
def test_html_data_round_trips_and_cannot_close_its_script(stacks: list) -> None:
    root = tree_of(stacks)
    text = tree_json(root, lambda n: {"name": n.name, "value": n.period})
    assert _unnest(json.loads(text)) == [(d, n.name, n.period) for n, d in root.walk()]
    safe = script_json(text)
    assert "<" not in safe and ">" not in safe and "&" not in safe
    assert json.loads(safe) == json.loads(text)
    page = flame_html(flame_of(root))
    data = page.split('<script type="application/json" id="qprof-data">', 1)[1].split("</script>", 1)[0]
    doc = json.loads(data)  # the block ends where the JSON ends: no name closed it early
    assert _unnest(doc["tree"]) == [(d, n.name, n.period) for n, d in root.walk()]
    assert [x["category"] for x in doc["legend"]] == list(CATEGORIES)
    # the page shows the legend text Python formatted (the terminal's rounding), not its own
    shares = flame_of(root).shares()
    assert [x["text"] for x in doc["legend"]] == [f"{c} {shares[c]:.1%}" for c in CATEGORIES]


def test_writers_handle_very_deep_stacks() -> None:
    """json.dumps recurses per level; the writers must not (DWARF unwinding can give deep stacks)."""
    root = FrameNode(ROOT_FRAME)
    root.add([("p (pid 1)", "")] + [(f"f{i}", LIBC) for i in range(5000)], CRYPTO, 2, 2_000_000)
    flame = flame_of(root)
    page = flame_html(flame)
    assert page.count('"name":"f4999"') == 1
    ss = speedscope_doc(flame)
    (prof,) = ss["profiles"]
    assert prof["weights"] == [2] and len(prof["samples"][0]) == 5000


def test_speedscope_shape() -> None:
    root = FrameNode(ROOT_FRAME)
    a, b = ("a", "/bin/x"), ("b", LIBC)
    root.add([("x (pid 1)", ""), a, b], CRYPTO, 3, 3)
    root.add([("x (pid 1)", ""), a], CRYPTO, 2, 2)
    root.add([("x (pid 1)", "")], UNCATEGORIZED, 1, 1)  # no stack at all
    root.add([("y (pid 2)", ""), b, a], IO, 4, 4)
    doc = speedscope_doc(flame_of(root))
    assert doc["$schema"] == "https://www.speedscope.app/file-format-schema.json"
    frames = [(f["name"], f.get("file")) for f in doc["shared"]["frames"]]
    assert len(set(frames)) == len(frames)
    px, py = doc["profiles"]
    assert (px["name"], px["type"], px["unit"]) == ("x (pid 1)", "sampled", "none")
    stacks = {tuple(frames[i][0] for i in s): w for s, w in zip(px["samples"], px["weights"])}
    assert stacks == {("[no stack]",): 1, ("a",): 2, ("a", "b"): 3}  # root first
    assert px["endValue"] == sum(px["weights"]) == 6 and sum(py["weights"]) == 4


# ------------------------------------------------------------------ vendored scripts

def test_vendored_files_match_their_note_and_ship_as_package_data() -> None:
    vendor = ROOT / "viewer" / "vendor"
    note = (vendor / "README.md").read_text()
    sums = dict((name, digest) for digest, name in re.findall(r"^([0-9a-f]{64})  (\S+)$", note, re.M))
    files = sorted(str(p.relative_to(vendor)) for p in vendor.rglob("*") if p.is_file() and p.name != "README.md")
    assert sorted(sums) == files
    for name, digest in sums.items():
        assert hashlib.sha256((vendor / name).read_bytes()).hexdigest() == digest, name
    assert "d3-flame-graph" in note and "5.0.0" in note and "7.9.2" in note
    assert "Apache License" in (vendor / "d3-flame-graph" / "LICENSE").read_text()
    assert "ISC" in note and "Permission to use" in (vendor / "d3" / "LICENSE").read_text()
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    packages = runpy.run_path(str(ROOT / "setup.py"), run_name="setup")["packages"]()
    # each package's globs are relative to its folder under viewer/ (qprof.viewer.vendor.d3: vendor/d3)
    globs = ["/".join([*pkg.split(".")[2:], g]) for pkg, gs in setuptools["package-data"].items()
             if pkg.startswith("qprof.viewer") and pkg in packages for g in gs]
    for f in files + ["README.md"]:
        assert any(fnmatch(f"vendor/{f}", g) for g in globs), f"vendor/{f} is not package data"


# ------------------------------------------------------------------ the command line, on a fake archive

def test_cli_svg_legend_is_the_reports_shares(tmp_path: Path) -> None:
    run = _fake_run(tmp_path)
    out = tmp_path / "server.svg"
    r = qprof("flamegraph", str(run), "--pid", str(SERVER), "-o", str(out))
    assert r.stdout.strip() == str(out)
    assert out.stat().st_mode & 0o777 == shell_mode()  # made to be shared, as the shell makes files
    report = json.loads(qprof("report", str(run), "--format", "json").stdout)
    shares = next(p for p in report["processes"] if p["pid"] == SERVER)["categories"]
    doc = ET.parse(out).getroot()
    legend = doc.find(f".//{SVG}g[@id='legend']")
    assert legend is not None
    assert [t.text for t in legend.iter(f"{SVG}text")] == [f"{c} {shares[c]:.1%}" for c in CATEGORIES]
    frames = {g.get("data-name"): g for g in doc.iter(f"{SVG}g") if g.get("class") == "f"}
    assert f"gtlsserver (pid {SERVER}, server)" in frames and f"client (pid {CLIENT}, client)" not in frames
    ip = frames["ip_output_[k]"]
    assert in_family(ip.find(f"{SVG}rect").get("fill"), PACKET_IO)  # type: ignore[union-attr,arg-type]
    tip = ip.find(f"{SVG}title").text  # type: ignore[union-attr]
    assert tip.startswith("ip_output_[k]\n4 samples, 4.0 ms CPU, 36.36% of shown\ncategory: Packet I/O")
    gnutls = frames["gnutls_cipher_encrypt2"].find(f"{SVG}rect").get("fill")  # type: ignore[union-attr]
    assert in_family(gnutls, CRYPTO)  # type: ignore[arg-type]


def test_cli_speedscope_and_html(tmp_path: Path) -> None:
    run = _fake_run(tmp_path)
    qprof("flamegraph", str(run), "-o", str(tmp_path / "all.speedscope.json"))
    doc = json.loads((tmp_path / "all.speedscope.json").read_text())
    report = json.loads(qprof("report", str(run), "--format", "json").stdout)
    want = {f"{p['comm']} (pid {p['pid']}" + (f", {p['role']})" if p["role"] else ")"): p["samples"]
            for p in report["processes"]}
    assert {p["name"]: sum(p["weights"]) for p in doc["profiles"]} == want
    n = len(doc["shared"]["frames"])
    assert all(0 <= i < n for p in doc["profiles"] for s in p["samples"] for i in s)
    qprof("flamegraph", str(run), "--role", "server", "--thread", str(SERVER + 1), "-o", str(tmp_path / "t.html"))
    page = (tmp_path / "t.html").read_text()
    assert "d3js.org v7.9.2" in page and "d3-flame-graph-label" in page
    assert not re.search(r"<script[^>]+src=|<link[^>]+href=", page), "nothing loads from elsewhere"
    data = json.loads(page.split('id="qprof-data">', 1)[1].split("</script>", 1)[0])
    (proc,) = data["tree"]["children"]
    assert proc["name"] == f"gtlsserver (pid {SERVER}, server)" and proc["samples"] == 5  # thread `worker` only


def test_cli_default_output_next_to_the_run(tmp_path: Path) -> None:
    run = _fake_run(tmp_path)
    r = qprof("flamegraph", str(run), "--role", "client")
    out = tmp_path / f"{run.name}-flamegraph-client.svg"
    assert r.stdout.strip() == str(out) and out.is_file()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_cli_bad_selection_and_output(tmp_path: Path) -> None:
    run = _fake_run(tmp_path)
    fg = lambda *a: qprof("flamegraph", str(run), *a, check=False)  # noqa: E731
    one_line_error(fg("--pid", "9999"), "no samples of pid 9999", f"{SERVER} gtlsserver", "--pid")
    one_line_error(fg("--thread", "9999", "--pid", str(CLIENT)), "no samples of thread 9999", f"{CLIENT} client")
    one_line_error(fg("--role", "server", "--pid", str(CLIENT)), f"pid {CLIENT} is not the server")
    one_line_error(fg("-o", str(tmp_path / "f.png")), "unknown output format '.png'", ".svg, .html, .speedscope.json")
    # `.json` is qprof's JSON report everywhere; a flame graph for speedscope says so in its name
    one_line_error(fg("-o", str(tmp_path / "f.json")), "unknown output format '.json'", ".speedscope.json")
    one_line_error(fg("-o", str(tmp_path / "f")), "unknown output format '(no suffix)'")
    one_line_error(fg("-o", str(tmp_path / "no" / "f.svg")), "does not exist")
    (tmp_path / "d.svg").mkdir()
    one_line_error(fg("-o", str(tmp_path / "d.svg")), "is a directory")
    (tmp_path / "link.svg").symlink_to(tmp_path / "elsewhere.svg")
    one_line_error(fg("-o", str(tmp_path / "link.svg")), "symbolic link")
    assert not (tmp_path / "elsewhere.svg").exists(), "nothing written through the link"
    one_line_error(qprof("flamegraph", str(tmp_path / "nope"), check=False), "not a run directory")
    with edited_meta(run) as meta:
        for t in meta.targets:
            t.role = None
    one_line_error(fg("--role", "client"), "has no client", "--server PID / --client PID")


def test_cli_unwritable_output_directory() -> None:
    """Not root: the directory's permissions, not qprof, say no; one line, nothing left behind."""
    base = Path(tempfile.mkdtemp(prefix="qprof-test-"))
    try:
        run = _fake_run(base)
        for p in [base, *base.rglob("*")]:
            p.chmod(0o755 if p.is_dir() else 0o644)
        ro = base / "ro"
        ro.mkdir(mode=0o755)
        r = as_nobody(["flamegraph", str(run), "-o", str(ro / "f.svg")], base)
        one_line_error(r, f"cannot write to directory {ro}", "choose another -o")
        assert list(ro.iterdir()) == []
    finally:
        shutil.rmtree(base)
