"""A flame graph as one standalone SVG file: readable printed (papers), interactive in a browser.

Static: every frame is a rectangle with its name cut to fit, a <title> tooltip
(samples, CPU time, share, category) and a legend with each category's share,
so the file reads the same when embedded as an image, where no script runs.
Opened in a browser, the embedded script adds what flame graph SVGs usually
carry: click a frame to zoom into it (its callers stay, faded, below), "Reset
Zoom" or Escape to go back, Ctrl-F or "Search" to highlight frames matching a
regular expression with the share of time they cover ("Matched: x%"); the URL
parameters `?s=REGEX` and `?z=FRAME` search and zoom at load.

Symbol names are untrusted data (any bytes a binary's symbol table holds):
they only ever reach the file through xml_text/xml_attr, which escape markup
and replace characters XML 1.0 cannot carry; the script reads names from
attributes and writes them back as text, never as markup.
"""

from __future__ import annotations

import re
from typing import Callable, Sequence
from xml.sax.saxutils import escape

from qprof.viewer.flametree import Flame, FrameNode
from qprof.viewer.palette import SEARCH_MATCH, category_colour

WIDTH = 1200  # px: flamegraph.pl's default
PAD = 10
FRAME_H = 16
FONT = 12
CHAR_W = FONT * 0.59  # average glyph width of Verdana at FONT px, as flamegraph.pl estimates it
MIN_W = 0.1  # px: narrower frames (and what they hold) are left out, as flamegraph.pl does
_INVALID_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def xml_safe(s: str) -> str:
    """Replace what XML 1.0 cannot hold (control characters, lone surrogates, U+FFFE/F) with U+FFFD."""
    return _INVALID_XML.sub("\ufffd", s)


def xml_text(s: str) -> str:
    """Character data: markup escaped; CR kept as a reference (a parser would turn it into LF)."""
    return escape(xml_safe(s), {"\r": "&#13;"})


def xml_attr(s: str) -> str:
    """A double- or single-quoted attribute value; whitespace kept as references (attribute values
    are normalised to spaces otherwise)."""
    return escape(xml_safe(s), {'"': "&quot;", "'": "&apos;", "\n": "&#10;", "\r": "&#13;", "\t": "&#9;"})


def fit_label(name: str, width: float) -> str:
    """The frame's name cut to `width` px (".." marks the cut); empty when not even 3 characters fit."""
    n = int((width - 6) // CHAR_W)
    if n < 3:
        return ""
    return name if len(name) <= n else name[:n - 2] + ".."


def layout(root: FrameNode, width: float) -> list[tuple[FrameNode, int, float, float]]:
    """(node, depth, x, w) of every frame at least MIN_W wide, in pre-order; x from 0, widths by period."""
    if root.period <= 0:
        return []
    scale = width / root.period
    out: list[tuple[FrameNode, int, float, float]] = []
    stack: list[tuple[FrameNode, int, float]] = [(root, 0, 0.0)]
    while stack:
        node, depth, x = stack.pop()
        w = node.period * scale
        if w < MIN_W:
            continue
        out.append((node, depth, x, w))
        kids = []
        cx = x
        for c in node.sorted_children():
            kids.append((c, depth + 1, cx))
            cx += c.period * scale
        stack.extend(reversed(kids))
    return out


_CSS = """
text { font-family: Verdana, "DejaVu Sans", sans-serif; font-size: 12px; fill: #000; }
#title { font-size: 17px; }
#subtitle, #details, #matched { font-size: 11px; fill: #333; }
.f rect { stroke: #fff; stroke-width: 0.3; }
.f:hover rect { stroke: #000; stroke-width: 0.6; cursor: pointer; }
.f text { pointer-events: none; }
.btn { cursor: pointer; fill: #24589b; }
.hide { display: none; }
.parent { opacity: 0.55; }
"""

# The interactive part; plain ES5 DOM code, reading everything from the document.
_JS = """
(function () {
  "use strict";
  var PAD = %(pad)d, CHAR_W = %(char_w).4f, MATCH = "%(match)s";
  var frames = [], W = 0, zoomed = null, term = null, details, matched, searchBtn, resetBtn;

  function label(f, w) {
    var n = Math.floor((w - 6) / CHAR_W);
    if (n < 3) return "";
    return f.name.length <= n ? f.name : f.name.slice(0, n - 2) + "..";
  }
  function place(f, x, w) {
    f.r.setAttribute("x", x.toFixed(2));
    f.r.setAttribute("width", w.toFixed(2));
    f.t.setAttribute("x", (x + 3).toFixed(2));
    f.t.textContent = label(f, w);
  }
  function frameOf(el) {
    while (el && el.getAttribute) {
      if (el.getAttribute("class") && (" " + el.getAttribute("class") + " ").indexOf(" f ") >= 0) {
        return frames[+el.getAttribute("data-i")];
      }
      el = el.parentNode;
    }
    return null;
  }
  function zoom(z) {
    var k = W / z.w, eps = 1e-6;
    zoomed = z;
    resetBtn.classList.remove("hide");
    frames.forEach(function (f) {
      f.g.classList.remove("hide");
      f.g.classList.remove("parent");
      if (f.d >= z.d && f.x >= z.x - eps && f.x + f.w <= z.x + z.w + eps) {
        place(f, PAD + (f.x - z.x) * k, f.w * k);
      } else if (f.d < z.d && f.x <= z.x + eps && f.x + f.w >= z.x + z.w - eps) {
        place(f, PAD, W);
        f.g.classList.add("parent");
      } else {
        f.g.classList.add("hide");
      }
    });
    if (term !== null) search(term);
  }
  function unzoom() {
    zoomed = null;
    resetBtn.classList.add("hide");
    frames.forEach(function (f) {
      f.g.classList.remove("hide");
      f.g.classList.remove("parent");
      place(f, f.x, f.w);
    });
    if (term !== null) search(term);
  }
  function search(t) {
    var re, spans = [], lo, hi, sum = 0, end = -Infinity;
    try { re = new RegExp(t); } catch (err) { re = new RegExp(t.replace(/[.*+?^${}()|[\\]\\\\]/g, "\\\\$&")); }
    term = t;
    frames.forEach(function (f) {
      if (re.test(f.name)) {
        f.r.setAttribute("fill", MATCH);
        spans.push([f.x, f.x + f.w]);
      } else {
        f.r.setAttribute("fill", f.fill);
      }
    });
    lo = zoomed ? zoomed.x : PAD;
    hi = zoomed ? zoomed.x + zoomed.w : PAD + W;
    spans = spans.map(function (s) { return [Math.max(s[0], lo), Math.min(s[1], hi)]; })
                 .filter(function (s) { return s[1] > s[0]; })
                 .sort(function (a, b) { return a[0] - b[0]; });
    spans.forEach(function (s) {
      var a = Math.max(s[0], end);
      if (s[1] > a) sum += s[1] - a;
      end = Math.max(end, s[1]);
    });
    matched.textContent = "Matched: " + (100 * sum / (hi - lo)).toFixed(1) + "%%";
    searchBtn.textContent = "Reset Search";
  }
  function resetSearch() {
    term = null;
    frames.forEach(function (f) { f.r.setAttribute("fill", f.fill); });
    matched.textContent = " ";
    searchBtn.textContent = "Search";
  }
  function ask() {
    var t = window.prompt("Search frames (regular expression)", term || "");
    if (t) search(t);
  }
  function init() {
    var area = document.getElementById("frames"), gs = area.getElementsByTagName("g"), i, q, z;
    details = document.getElementById("details");
    matched = document.getElementById("matched");
    searchBtn = document.getElementById("search");
    resetBtn = document.getElementById("unzoom");
    W = parseFloat(area.getAttribute("data-width"));
    for (i = 0; i < gs.length; i++) {
      var g = gs[i], r = g.getElementsByTagName("rect")[0];
      frames.push({g: g, r: r, t: g.getElementsByTagName("text")[0], name: g.getAttribute("data-name"),
                   d: +g.getAttribute("data-d"), x: +r.getAttribute("x"), w: +r.getAttribute("width"),
                   fill: r.getAttribute("fill"),
                   tip: g.getElementsByTagName("title")[0].textContent.split("\\n").slice(0, 3).join("; ")});
      g.setAttribute("data-i", String(i));
    }
    area.addEventListener("click", function (e) { var f = frameOf(e.target); if (f) zoom(f); });
    area.addEventListener("mouseover", function (e) { var f = frameOf(e.target); if (f) details.textContent = f.tip; });
    area.addEventListener("mouseout", function () { details.textContent = " "; });
    searchBtn.addEventListener("click", function () { if (term !== null) resetSearch(); else ask(); });
    resetBtn.addEventListener("click", unzoom);
    window.addEventListener("keydown", function (e) {
      if ((e.ctrlKey || e.metaKey) && (e.key === "f" || e.key === "F")) { e.preventDefault(); ask(); }
      else if (e.key === "Escape") { resetSearch(); unzoom(); }
    });
    q = new URLSearchParams(window.location.search);
    z = q.get("z");
    if (z !== null) {
      for (i = 0; i < frames.length; i++) { if (frames[i].name === z) { zoom(frames[i]); break; } }
    }
    if (q.get("s")) search(q.get("s"));
  }
  window.addEventListener("load", init);
})();
""" % {"pad": PAD, "char_w": CHAR_W, "match": SEARCH_MATCH}


def _legend(items: Sequence[tuple[str, str]], width: int, y0: float) -> tuple[list[str], float]:
    """Swatch + text per item, wrapped into rows; returns the elements and the height used."""
    out = ['<g id="legend">']
    x, y = float(PAD), y0
    for text, colour in items:
        w = 18 + len(text) * CHAR_W + 18
        if x + w > width - PAD and x > PAD:
            x, y = float(PAD), y + 18
        out.append(f'<g class="legend-item"><rect x="{x:.1f}" y="{y:.1f}" width="12" height="12" '
                   f'fill="{xml_attr(colour)}" stroke="#555" stroke-width="0.5"/>'
                   f'<text x="{x + 17:.1f}" y="{y + 10.5:.1f}">{xml_text(text)}</text></g>')
        x += w
    out.append("</g>")
    return out, (y - y0) + 18


def render_svg(root: FrameNode, *, title: str, subtitle: str, fill: Callable[[FrameNode], str],
               describe: Callable[[FrameNode], str], legend: Sequence[tuple[str, str]],
               width: int = WIDTH) -> str:
    """The whole SVG document for a tree: `fill` colours a frame, `describe` is its tooltip text,
    `legend` (text, colour) explains the colours. Widths follow each frame's period."""
    graph_w = width - 2 * PAD
    frames = layout(root, graph_w)
    depth = max((d for _, d, _, _ in frames), default=0)
    legend_el, legend_h = _legend(legend, width, 50.0)
    top = 50 + legend_h + 10
    height = int(top + (depth + 1) * FRAME_H + 30)
    sub = subtitle if len(subtitle) * 11 * 0.59 <= graph_w else fit_label(subtitle, graph_w * 12 / 11)
    out = [
        '<?xml version="1.0" encoding="UTF-8" standalone="no"?>',
        f'<svg xmlns="http://www.w3.org/2000/svg" version="1.1" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}">',
        f"<style>{_CSS}</style>",
        f'<script type="text/ecmascript"><![CDATA[{_JS}]]></script>',
        f'<rect x="0" y="0" width="{width}" height="{height}" fill="#ffffff"/>',
        f'<text id="title" x="{width / 2:.0f}" y="24" text-anchor="middle">{xml_text(title)}</text>',
        f'<text id="subtitle" x="{width / 2:.0f}" y="40" text-anchor="middle">{xml_text(sub)}'
        f"<title>{xml_text(subtitle)}</title></text>",
        f'<text id="unzoom" class="btn hide" x="{PAD}" y="24">Reset Zoom</text>',
        f'<text id="search" class="btn" x="{width - PAD}" y="24" text-anchor="end">Search</text>',
        *legend_el,
        f'<g id="frames" data-width="{graph_w}">',
    ]
    for node, d, x, w in frames:
        y = top + (depth - d) * FRAME_H
        out.append(f'<g class="f" data-name="{xml_attr(node.name)}" data-d="{d}">'
                   f"<title>{xml_text(describe(node))}</title>"
                   f'<rect x="{PAD + x:.2f}" y="{y}" width="{w:.2f}" height="{FRAME_H - 1}" '
                   f'fill="{xml_attr(fill(node))}" rx="2" ry="2"/>'
                   f'<text x="{PAD + x + 3:.2f}" y="{y + 11.5}">{xml_text(fit_label(node.name, w))}</text></g>')
    out += [
        "</g>",
        f'<text id="details" x="{PAD}" y="{height - 10}"> </text>',
        f'<text id="matched" x="{width - PAD}" y="{height - 10}" text-anchor="end"> </text>',
        "</svg>",
        "",
    ]
    return "\n".join(out)


def flame_svg(flame: Flame) -> str:
    """A category-coloured flame graph with the legend of category shares."""
    legend = [(text, category_colour(c)) for c, text in flame.legend()]
    return render_svg(flame.root, title=flame.title, subtitle=flame.subtitle, fill=lambda n: n.colour,
                      describe=flame.describe, legend=legend)
