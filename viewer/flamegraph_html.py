"""A flame graph as one self-contained HTML page, drawn by d3-flame-graph (viewer/vendor).

The page inlines d3, d3-flame-graph and the tree as JSON: it opens offline,
from a mail attachment or a CI artefact. d3-flame-graph gives zoom (click a
frame; "Reset zoom"), search ("Search" box or Ctrl-F: regular expression,
matched frames highlighted, the share of time they cover) and per-frame
tooltips; colours come from viewer.palette through its colour mapper, so a
frame has the same colour as in the SVG. URL parameters `?s=REGEX` and
`?z=FRAME` search and zoom at load, as in the SVG.

Symbol names are untrusted: the tree travels as JSON in a non-executed
<script type="application/json"> block with `<`, `>` and `&` escaped, and the
page only ever puts names into the document as text (d3's .text(), textContent).
"""

from __future__ import annotations

import html
import json
from importlib import resources
from typing import Any, Callable

from qprof.viewer.flametree import Flame, FrameNode
from qprof.viewer.palette import SEARCH_MATCH, category_colour

VENDOR = ("d3/d3.min.js", "d3-flame-graph/d3-flamegraph.umd.min.js")
VENDOR_CSS = "d3-flame-graph/d3-flamegraph.css"


def vendored(name: str) -> str:
    """A vendored file's text (package data of qprof.viewer)."""
    text = resources.files("qprof.viewer").joinpath("vendor", name).read_text(encoding="utf-8")
    # inlined into <script>/<style>: nothing may close the element early
    return text.replace("</script", "<\\/script").replace("</style", "<\\/style")


def script_json(text: str) -> str:
    """JSON safe inside a <script> element: no `</script>`, no `<!--`, no entity surprises."""
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def tree_json(root: FrameNode, fields: Callable[[FrameNode], dict[str, Any]]) -> str:
    """The tree as d3-flame-graph's nested {name, value, children} JSON, written without recursion
    (json.dumps recurses once per level and stops at Python's recursion limit)."""
    parts: list[str] = []
    stack: list[FrameNode | str] = [root]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            parts.append(item)
            continue
        head = json.dumps(fields(item), separators=(",", ":"))[:-1]
        kids = item.sorted_children()
        if not kids:
            parts.append(head + "}")
            continue
        parts.append(head + ',"children":[')
        stack.append("]}")
        for i in range(len(kids) - 1, -1, -1):
            stack.append(kids[i])
            if i:
                stack.append(",")
    return "".join(parts)


_CSS = """
body { font-family: Verdana, "DejaVu Sans", sans-serif; margin: 12px 16px; color: #111; }
h1 { font-size: 18px; margin: 0 0 4px 0; }
#subtitle { font-size: 12px; color: #444; margin: 0 0 8px 0; }
#legend { display: flex; flex-wrap: wrap; gap: 6px 18px; font-size: 13px; margin: 6px 0 10px 0; }
.legend-item { display: inline-flex; align-items: center; gap: 6px; }
.swatch { display: inline-block; width: 12px; height: 12px; border: 1px solid #555; }
#controls { font-size: 13px; margin-bottom: 6px; display: flex; gap: 8px; align-items: center; }
#controls input { width: 260px; }
#matched, #details { font-size: 12px; color: #333; min-height: 1.3em; }
.d3-flame-graph-label { font-size: 11px; }
"""

_JS = """
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("qprof-data").textContent);
  var MATCH = "%(match)s";
  var legend = document.getElementById("legend");
  data.legend.forEach(function (item) {
    var span = document.createElement("span"), sw = document.createElement("span"), t = document.createElement("span");
    span.className = "legend-item";
    span.setAttribute("data-category", item.category);
    sw.className = "swatch";
    sw.style.background = item.colour;
    t.className = "legend-text";
    t.textContent = item.category + " " + (100 * item.share).toFixed(1) + "%%";
    span.appendChild(sw);
    span.appendChild(t);
    legend.appendChild(span);
  });
  function pattern(term) {
    try { return new RegExp(term); }
    catch (err) { return new RegExp(term.replace(/[.*+?^${}()|[\\]\\\\]/g, "\\\\$&")); }
  }
  var matched = document.getElementById("matched"), details = document.getElementById("details");
  var width = Math.max(600, document.getElementById("chart").clientWidth);
  var chart = flamegraph.default()
    .width(width)
    .cellHeight(18)
    .minFrameSize(0.5)
    .transitionDuration(250)
    .title("")
    .label(function (d) { return d.data.tip; })
    .setColorMapper(function (d) { return d.highlight ? MATCH : d.data.fill; })
    .setSearchMatch(function (d, term) { return !!term && pattern(term).test(d.data.name); })
    .setSearchHandler(function (results, sum, total) {
      matched.textContent = results.length ? "Matched: " + (100 * sum / total).toFixed(1) + "%% of the time shown ("
        + results.length + " frames)" : "Matched: nothing";
    })
    .setDetailsElement(details);
  d3.select("#chart").datum(data.tree).call(chart);
  var box = document.getElementById("term");
  function search() { if (box.value) chart.search(box.value); else { chart.clear(); matched.textContent = ""; } }
  document.getElementById("controls").addEventListener("submit", function (e) { e.preventDefault(); search(); });
  document.getElementById("clear").addEventListener("click", function () { box.value = ""; search(); });
  document.getElementById("reset").addEventListener("click", function () { chart.resetZoom(); });
  window.addEventListener("keydown", function (e) {
    if ((e.ctrlKey || e.metaKey) && (e.key === "f" || e.key === "F")) { e.preventDefault(); box.focus(); box.select(); }
  });
  var q = new URLSearchParams(window.location.search);
  if (q.get("z") !== null) {
    var hit = d3.select("#chart").datum().descendants().find(function (d) { return d.data.name === q.get("z"); });
    if (hit) chart.zoomTo(hit);
  }
  if (q.get("s")) { box.value = q.get("s"); search(); }
})();
""" % {"match": SEARCH_MATCH}


def flame_html(flame: Flame) -> str:
    """The page: title, subtitle, legend of category shares, search/zoom controls, the graph."""
    total = flame.root.period or 1

    def fields(n: FrameNode) -> dict[str, Any]:
        return {"name": n.name, "value": n.period, "samples": n.samples, "share": round(n.period / total, 6),
                "category": n.category, "fill": n.colour, "tip": flame.describe(n)}

    data = {"legend": [{"category": c, "share": s, "colour": category_colour(c)} for c, s in flame.shares().items()]}
    doc = json.dumps(data)[:-1] + ',"tree":' + tree_json(flame.root, fields) + "}"
    css = vendored(VENDOR_CSS)
    scripts = "\n".join(f"<script>{vendored(name)}</script>" for name in VENDOR)
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{html.escape(flame.title)}</title>
<style>{css}</style>
<style>{_CSS}</style>
</head>
<body>
<h1>{html.escape(flame.title)}</h1>
<p id="subtitle">{html.escape(flame.subtitle)}</p>
<div id="legend"></div>
<form id="controls"><input id="term" type="search" placeholder="search frames (regular expression)">
<button type="submit">Search</button><button type="button" id="clear">Clear</button>
<button type="button" id="reset">Reset zoom</button><span id="matched"></span></form>
<div id="chart"></div>
<div id="details"></div>
<script type="application/json" id="qprof-data">{script_json(doc)}</script>
{scripts}
<script>{_JS}</script>
</body>
</html>
"""
