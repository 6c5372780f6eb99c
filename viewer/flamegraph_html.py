"""A flame graph as one self-contained HTML page, drawn by d3-flame-graph (viewer/vendor).

The page inlines d3, d3-flame-graph and the tree as JSON: it opens offline,
from a mail attachment or a CI artefact. d3-flame-graph gives zoom (click a
frame; "Reset zoom"), search ("Search" box or Ctrl-F: regular expression,
matched frames highlighted, the share of time they cover) and per-frame
tooltips; colours come from viewer.palette through its colour mapper, so a
frame has the same colour as in the SVG. URL parameters `?s=REGEX` and
`?z=FRAME` search and zoom at load, as in the SVG.

Above the graph, a timeline per process shown (attribution.timeline): its
CPU in cores per 100 ms, stacked by category in the category colours, and
its goodput (Gbit/s, right axis) as a step line, so handshake, slow start,
stalls and steady state show where the graph below only has totals. With the
waits probes' series (attribution.timeline's `wall`), under each CPU chart the
wall clock of the process's threads per 100 ms, stacked by state (on a CPU,
runnable, and what they waited for) in the off-CPU flame graph's colours, in
threads (a bin's seconds in a state / the bin): its own script, added only
then, so a page of a run without the series is what it always was.

Symbol names are untrusted: the tree travels as JSON in a non-executed
<script type="application/json"> block with `<`, `>` and `&` escaped, and the
page only ever puts names into the document as text (d3's .text(), textContent).
"""

from __future__ import annotations

import html
import json
from importlib import resources
from typing import Callable

from qprof.attribution.categories import CATEGORIES
from qprof.attribution.waits import LABELS, STATES
from qprof.jsonvalue import JsonObject
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


def tree_json(root: FrameNode, fields: Callable[[FrameNode], JsonObject]) -> str:
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
.tl-title { font-size: 13px; margin: 8px 0 0 0; }
.tl-note { font-size: 12px; color: #444; }
.tl-chart text { font-size: 11px; }
.tl-goodput { fill: none; stroke: #111; stroke-width: 1.5px; }
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
    t.textContent = item.text;
    span.appendChild(sw);
    span.appendChild(t);
    legend.appendChild(span);
  });
  function pattern(term) {
    try { return new RegExp(term); }
    catch (err) { return new RegExp(term.replace(/[.*+?^${}()|[\\]\\\\]/g, "\\\\$&")); }
  }
  function drawTimeline(tl, colours, width) {
    var box = d3.select("#timeline");
    if (!tl || !tl.targets.length) { box.append("p").attr("class", "tl-note").text("no timeline in this run"); return; }
    if (!tl.aligned) {
      box.append("p").attr("class", "tl-note")
        .text("samples and byte readings of this run have no common clock: CPU only, from its first sample");
    }
    var cats = data.legend.map(function (l) { return l.category; });
    var m = {top: 18, right: 56, bottom: 26, left: 44}, h = 140;
    tl.targets.forEach(function (t) {
      var n = t.cpu_cores[cats[0]].length, rows = [];
      for (var i = 0; i < n; i++) {
        var row = {t: i * tl.bin_s};
        cats.forEach(function (c) { row[c] = t.cpu_cores[c][i]; });
        rows.push(row);
      }
      if (n) rows.push(Object.assign({}, rows[n - 1], {t: n * tl.bin_s}));  // the last bin's right edge
      var name = t.comm + " (pid " + t.pid + (t.role ? ", " + t.role : "") + ")";
      box.append("p").attr("class", "tl-title")
        .text(name + ": CPU cores by category per " + tl.bin_s + " s" +
              (t.traffic ? "; goodput (Gbit/s, right axis, from " + t.traffic + ")" : ""));
      var svg = box.append("svg").attr("class", "tl-chart").attr("data-pid", t.pid)
        .attr("width", width).attr("height", h + m.top + m.bottom);
      var g = svg.append("g").attr("transform", "translate(" + m.left + "," + m.top + ")");
      var w = width - m.left - m.right;
      var series = d3.stack().keys(cats)(rows);
      var top = d3.max(series[series.length - 1] || [], function (d) { return d[1]; }) || 1;
      var x = d3.scaleLinear().domain([0, Math.max(n * tl.bin_s, tl.bin_s)]).range([0, w]);
      var y = d3.scaleLinear().domain([0, Math.max(1, top)]).nice().range([h, 0]);
      var area = d3.area().curve(d3.curveStepAfter).x(function (d) { return x(d.data.t); })
        .y0(function (d) { return y(d[0]); }).y1(function (d) { return y(d[1]); });
      g.selectAll("path.tl-area").data(series).enter().append("path").attr("class", "tl-area")
        .attr("data-category", function (d) { return d.key; })
        .attr("fill", function (d) { return colours[d.key]; }).attr("d", area)
        .append("title").text(function (d) { return d.key; });
      g.append("g").attr("transform", "translate(0," + h + ")").call(d3.axisBottom(x).ticks(10))
        .append("text").attr("x", w).attr("y", 22).attr("fill", "#111").attr("text-anchor", "end").text("s");
      g.append("g").call(d3.axisLeft(y).ticks(4))
        .append("text").attr("x", 0).attr("y", -8).attr("fill", "#111").attr("text-anchor", "middle").text("cores");
      if (t.goodput_gbps.length) {
        var gmax = d3.max(t.goodput_gbps, function (r) { return r[2]; }) || 1;
        var y2 = d3.scaleLinear().domain([0, gmax]).nice().range([h, 0]);
        var pts = [];
        t.goodput_gbps.forEach(function (r) { pts.push([r[0], r[2]], [r[1], r[2]]); });
        g.append("path").attr("class", "tl-goodput")
          .attr("d", d3.line().x(function (p) { return x(p[0]); }).y(function (p) { return y2(p[1]); })(pts))
          .append("title").text("goodput, Gbit/s");
        g.append("g").attr("transform", "translate(" + w + ",0)").call(d3.axisRight(y2).ticks(4))
          .append("text").attr("x", 0).attr("y", -8).attr("fill", "#111").attr("text-anchor", "middle").text("Gbit/s");
      }
    });
  }
  var matched = document.getElementById("matched"), details = document.getElementById("details");
  var width = Math.max(600, document.getElementById("chart").clientWidth);
  var chart = flamegraph.default()
    .width(width)
    .cellHeight(18)
    .minFrameSize(0.5)
    .transitionDuration(0)  // the first draw (and a zoom or search asked for in the URL) is final at once
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
  drawTimeline(data.timeline, data.colours, width);
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
  chart.transitionDuration(250);  // the user's zooms and searches animate
})();
""" % {"match": SEARCH_MATCH}


# The wall clock per process under its CPU chart (runs after _JS, which drew the CPU charts).
_WALL_JS = """
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("qprof-data").textContent);
  var tl = data.timeline, states = @STATES@, colours = @COLOURS@, labels = @LABELS@;
  if (!tl) return;
  var width = Math.max(600, document.getElementById("chart").clientWidth);
  var m = {top: 18, right: 56, bottom: 26, left: 44}, h = 90;
  tl.targets.forEach(function (t) {
    if (!t.wall_s) return;
    var cpu = document.querySelector('svg.tl-chart[data-pid="' + t.pid + '"]');
    if (!cpu) return;
    var n = t.wall_s[states[0]].length, rows = [];
    for (var i = 0; i < n; i++) {
      var row = {t: i * tl.bin_s};
      states.forEach(function (s) { row[s] = t.wall_s[s][i] / tl.bin_s; });
      rows.push(row);
    }
    if (n) rows.push(Object.assign({}, rows[n - 1], {t: n * tl.bin_s}));
    var used = states.filter(function (s) { return t.wall_s[s].some(function (v) { return v > 0; }); });
    var holder = document.createElement("div");
    holder.className = "tl-wall-box";
    cpu.parentNode.insertBefore(holder, cpu.nextSibling);
    var box = d3.select(holder);
    var title = box.append("p").attr("class", "tl-title")
      .text(t.comm + " (pid " + t.pid + "): its threads' wall clock by state per " + tl.bin_s + " s (threads; waits probes) ");
    used.forEach(function (s) {
      var item = title.append("span").attr("class", "legend-item").attr("data-state", s).style("margin-left", "10px");
      item.append("span").attr("class", "swatch").style("background", colours[s]);
      item.append("span").text(labels[s]);
    });
    var svg = box.append("svg").attr("class", "tl-wall").attr("data-pid", t.pid)
      .attr("width", width).attr("height", h + m.top + m.bottom);
    var g = svg.append("g").attr("transform", "translate(" + m.left + "," + m.top + ")");
    var w = width - m.left - m.right;
    var series = d3.stack().keys(states)(rows);
    var top = d3.max(series[series.length - 1] || [], function (d) { return d[1]; }) || 1;
    var x = d3.scaleLinear().domain([0, Math.max(n * tl.bin_s, tl.bin_s)]).range([0, w]);
    var y = d3.scaleLinear().domain([0, Math.max(1, top)]).nice().range([h, 0]);
    var area = d3.area().curve(d3.curveStepAfter).x(function (d) { return x(d.data.t); })
      .y0(function (d) { return y(d[0]); }).y1(function (d) { return y(d[1]); });
    g.selectAll("path.tl-wall-area").data(series).enter().append("path").attr("class", "tl-wall-area")
      .attr("data-state", function (d) { return d.key; })
      .attr("fill", function (d) { return colours[d.key]; }).attr("d", area)
      .append("title").text(function (d) { return labels[d.key]; });
    g.append("g").attr("transform", "translate(0," + h + ")").call(d3.axisBottom(x).ticks(10))
      .append("text").attr("x", w).attr("y", 22).attr("fill", "#111").attr("text-anchor", "end").text("s");
    g.append("g").call(d3.axisLeft(y).ticks(3))
      .append("text").attr("x", 0).attr("y", -8).attr("fill", "#111").attr("text-anchor", "middle").text("threads");
  });
})();
""".replace("@STATES@", json.dumps(list(STATES))).replace(
    "@COLOURS@", json.dumps({s: category_colour(s) for s in STATES})).replace("@LABELS@", json.dumps(LABELS))


def flame_html(flame: Flame) -> str:
    """The page: title, subtitle, legend of category shares, search/zoom controls, the graph."""
    total = flame.root.period or 1

    def fields(n: FrameNode) -> JsonObject:
        return {"name": n.name, "value": n.period, "samples": n.samples, "share": round(n.period / total, 6),
                "category": n.category, "fill": n.colour, "tip": flame.describe(n)}

    data = {"legend": [{"category": c, "text": text, "colour": category_colour(c)} for c, text in flame.legend()],
            "colours": {c: category_colour(c) for c in CATEGORIES},
            "timeline": flame.timeline.to_json() if flame.timeline is not None else None}
    doc = json.dumps(data)[:-1] + ',"tree":' + tree_json(flame.root, fields) + "}"
    css = vendored(VENDOR_CSS)
    scripts = "\n".join(f"<script>{vendored(name)}</script>" for name in VENDOR)
    # the wall clock under each CPU chart: only with the waits probes' series (else the page is unchanged)
    wall = flame.timeline is not None and any(t.wall is not None for t in flame.timeline.targets)
    wall_script = f"<script>{_WALL_JS}</script>\n" if wall else ""
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
<div id="timeline"></div>
<form id="controls"><input id="term" type="search" placeholder="search frames (regular expression)">
<button type="submit">Search</button><button type="button" id="clear">Clear</button>
<button type="button" id="reset">Reset zoom</button><span id="matched"></span></form>
<div id="chart"></div>
<div id="details"></div>
<script type="application/json" id="qprof-data">{script_json(doc)}</script>
{scripts}
<script>{_JS}</script>
{wall_script}</body>
</html>
"""
