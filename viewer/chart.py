"""Many runs at a glance: one stacked bar per configuration and side, the figure studies draw by hand.

The studies behind qprof compare stacks and settings with one bar per
implementation and side, split into the categories; a second panel puts the
same CPU time per gigabyte moved, so a faster run is not mistaken for a
costlier one; a third, each configuration's goodput, what the comparison is
for. Runs of one configuration are repetitions (the configuration each run's
meta.json records: viewer.rows.place_runs), and a bar is the median over them
with the distribution-free 95% interval of the median as a whisker
(attribution.stats; none below the runs an interval needs, said under the
chart, as are runs pooled though measured differently). Colours are the
flame graphs' category hues (viewer.palette).

The SVG is a figure as is: fixed text sizes, room computed for every label,
no script, no font or file from elsewhere; each segment carries a <title>
with its figures. The HTML page holds the same SVG and shows those figures in
a box that follows the pointer.
"""

from __future__ import annotations

import html
import json
import math
import textwrap
from dataclasses import dataclass
from typing import Sequence

from qprof.attribution.categories import CATEGORIES
from qprof.attribution.stats import METHOD, MedianCI, median_ci, min_n
from qprof.viewer.flamegraph_svg import xml_attr, xml_text
from qprof.viewer.palette import category_colour
from qprof.viewer.rows import Notice, TableRow, configuration_summaries, side_label


FONT = 12  # px: labels and ticks
NOTE_FONT = 10
CHAR_W = 0.62 * FONT  # a generous average advance of the sans-serif fonts at FONT px
BAR_W, BAR_GAP, GROUP_GAP = 28, 8, 26
PANEL_H = 230
LEFT_MIN, RIGHT, TOP = 74, 24, 78
LABEL_ANGLE = 40  # degrees the bar labels are turned
GOODPUT_COLOUR = "#5a7896"


@dataclass(frozen=True)
class Bar:
    """One configuration and side over its runs: each category's median share and CPU s per GB."""

    configuration: str
    stack: str | None
    side: str  # server, client, or the process name when the run had no roles
    runs: int
    share: dict[str, MedianCI]
    per_gb: dict[str, MedianCI]  # empty when no run counted the bytes the side moved
    label: str  # "stack setting · side"; the setting left out when every bar has the same
    goodput: MedianCI  # Gbit/s, the configuration's (viewer.rows.ConfigurationSummary), the same on each side


def _label(conf: str, stack: str | None, side: str, one_configuration: bool) -> str:
    return f"{stack} · {side}" if one_configuration and stack else side_label(conf, stack, side)


def bars(rows: Sequence[TableRow]) -> list[Bar]:
    """The bars of `qprof table`'s rows (viewer.rows.TABLE_COLUMNS): servers before clients, in the
    order the configurations first appear."""
    one_configuration = len({r.configuration for r in rows}) == 1
    goodput = {c: s.goodput for c, s in configuration_summaries(rows).items()}
    procs: dict[tuple[str, str | None, str], dict[tuple[str, int], dict[str, TableRow]]] = {}
    for r in rows:
        key = (r.configuration, r.stack, r.role or r.comm)
        procs.setdefault(key, {}).setdefault((r.run, r.pid), {})[r.category] = r
    out = []
    for (conf, stack, side), per_run in procs.items():
        shares: dict[str, list[float]] = {c: [] for c in CATEGORIES}
        per_gb: dict[str, list[float]] = {c: [] for c in CATEGORIES}
        for cats in per_run.values():
            first = next(iter(cats.values()))
            moved = (first.tx_bytes or 0) + (first.rx_bytes or 0)
            for c in CATEGORIES:
                row = cats.get(c)
                if row is None:
                    continue
                shares[c].append(row.share)
                if moved > 0:
                    per_gb[c].append(row.cpu_seconds / (moved / 1e9))
        out.append(Bar(conf, stack, side, len(per_run), {c: median_ci(v) for c, v in shares.items()},
                       {c: median_ci(v) for c, v in per_gb.items()} if any(per_gb.values()) else {},
                       _label(conf, stack, side, one_configuration), goodput[conf]))
    order = {"server": 0, "client": 1}
    confs = list(dict.fromkeys(b.configuration for b in out))
    return sorted(out, key=lambda b: (confs.index(b.configuration), str(b.stack), order.get(b.side, 2), b.side))


def _nice_max(x: float) -> float:
    """The axis top: the first of 1, 1.5, 2, 2.5, 3, 4, 5, 6, 8 or 10 times a power of ten at or above x."""
    if x <= 0:
        return 1.0
    e: float = 10 ** math.floor(math.log10(x))
    return next(m * e for m in (1, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10) if m * e >= x * 0.999)


@dataclass(frozen=True)
class _Panel:
    title: str
    values: list[dict[str, MedianCI]]  # per bar
    top: float
    tick: str  # format of the axis ticks
    unit: str  # of the tooltip figures
    normalise: bool = False  # each bar scaled to the panel's top (the shares)


def _label_room(labels: Sequence[str]) -> tuple[float, float]:
    """(height below the axis, reach left of the first bar) the turned labels need."""
    longest = max((len(s) for s in labels), default=0) * CHAR_W
    a = math.radians(LABEL_ANGLE)
    return longest * math.sin(a) + FONT + 14, longest * math.cos(a)


def _tip(bar: Bar, cat: str, ci: MedianCI, unit: str, fmt: str) -> str:
    interval = f"95% CI [{format(ci.low, fmt)}, {format(ci.high, fmt)}]" if ci.low is not None and ci.high is not None \
        else "no interval (fewer runs than one needs)"
    return (f"{bar.label}: {cat} {format(ci.median or 0.0, fmt)}{unit}, median of {ci.n} run"
            f"{'s' if ci.n != 1 else ''}; {interval}")


def _notes(bars_: Sequence[Bar], columns: int, notices: Sequence[Notice] = ()) -> list[str]:
    """The lines under the chart, wrapped to `columns`: what a bar is, how its whiskers were drawn, and
    what the summary would warn of (viewer.rows.summary_notices)."""
    runs = ", ".join(map(str, sorted({b.runs for b in bars_})))
    text = (f"Bars: each category's median over a configuration's runs (runs per bar: {runs}); in the upper "
            "panel scaled so each bar is 100% (the categories' medians need not add up to it); goodput: the "
            "median of each configuration's runs (each run's client's figure, else its largest). Whiskers: the "
            f"95% interval of each median, a {METHOD}")
    if min(b.runs for b in bars_) < min_n():
        text += f", drawn where a bar has {min_n()} runs or more"
    lines = textwrap.wrap(text + ".", columns)
    for n in notices:
        lines += textwrap.wrap(("Warning: " if n.warning else "Note: ") + n.text + ".", columns)
    return lines


def _scale(vals: dict[str, MedianCI], panel: "_Panel") -> float:
    """The share panel's bars are scaled to 100%; the per-GB panel's are as measured."""
    total = sum(ci.median or 0.0 for ci in vals.values())
    return 1.0 / total if panel.normalise and total > 0 else 1.0


def _axis(out: list[str], top: float, tick: str, left: float, right: float, base: float) -> None:
    """A panel's ticks and grid lines, from its base up PANEL_H."""
    for i in range(6):
        v = top * i / 5
        y = base - PANEL_H * i / 5
        out.append(f'<line x1="{left:.1f}" x2="{right:.1f}" y1="{y:.1f}" y2="{y:.1f}" '
                   f'stroke="{"#999" if i == 0 else "#e4e4e4"}"/>'
                   f'<text x="{left - 6:.1f}" y="{y + 4:.1f}" text-anchor="end">{format(v, tick)}</text>')


def _turned(out: list[str], label: str, cx: float, base: float) -> None:
    ly = base + 14
    out.append(f'<text class="label" x="{cx:.1f}" y="{ly:.1f}" text-anchor="end" '
               f'transform="rotate(-{LABEL_ANGLE} {cx:.1f} {ly:.1f})">{xml_text(label)}</text>')


def _whisker(out: list[str], cx: float, lo: float, hi: float) -> None:
    out.append(f'<path class="whisker" d="M{cx:.1f},{lo:.2f}V{hi:.2f}M{cx - 4:.1f},{lo:.2f}'
               f'H{cx + 4:.1f}M{cx - 4:.1f},{hi:.2f}H{cx + 4:.1f}" stroke="#222" fill="none"/>')


def _goodput_panel(out: list[str], bars_: Sequence[Bar], xs: Sequence[float], y0: float, left: float,
                   right: float) -> None:
    """One bar per configuration, as wide as its sides' bars: the median goodput of its runs."""
    spans: dict[str, tuple[float, float, MedianCI]] = {}
    for b, bx in zip(bars_, xs):
        x0, _, ci = spans.get(b.configuration, (bx, bx, b.goodput))
        spans[b.configuration] = (x0, bx + BAR_W, ci)
    top = _nice_max(max((ci.high if ci.high is not None else ci.median or 0.0) for _, _, ci in spans.values()))
    base = y0 + PANEL_H
    out.append(f'<text x="{left:.1f}" y="{y0 - 8:.1f}" font-weight="bold">goodput (Gbit/s): the median of each '
               'configuration\'s runs</text>')
    if all(ci.median is None for _, _, ci in spans.values()):
        out.append(f'<text x="{left + 10:.1f}" y="{y0 + PANEL_H / 2:.1f}">no run measured its goodput (record '
                   'with the packetio probes, or over TCP)</text>')
    _axis(out, top, ".3g", left, right, base)
    for conf, (x0, x1, ci) in spans.items():
        if ci.median is not None:
            h = PANEL_H * ci.median / top
            note = (f"95% CI [{ci.low:.3g}, {ci.high:.3g}]" if ci.low is not None and ci.high is not None
                    else "no interval (fewer runs than one needs)")
            tip = f"{conf}: goodput {ci.median:.3g} Gbit/s, median of {ci.n} run{'s' if ci.n != 1 else ''}; {note}"
            out.append(f'<rect class="goodput" x="{x0:.1f}" y="{base - h:.2f}" width="{x1 - x0:.1f}" '
                       f'height="{h:.2f}" fill="{GOODPUT_COLOUR}" data-tip="{xml_attr(tip)}"><title>'
                       f'{xml_text(tip)}</title></rect>')
            if ci.low is not None and ci.high is not None:
                _whisker(out, (x0 + x1) / 2, base - PANEL_H * ci.low / top, base - PANEL_H * ci.high / top)
        _turned(out, conf, (x0 + x1) / 2, base)


def chart_svg(bars_: Sequence[Bar], title: str = "qprof: CPU time by category",
              notices: Sequence[Notice] = ()) -> str:
    """The figure: a legend, the share panel, the CPU seconds per GB panel, one bar per entry, and the
    goodput panel, one bar per configuration; under it the notes and `notices`."""
    if not bars_:
        raise ValueError("no bars to draw")
    labels = [b.label for b in bars_]
    below, reach = _label_room(labels)
    left = max(LEFT_MIN, reach - BAR_W / 2 + 8)
    xs: list[float] = []
    x = left + GROUP_GAP / 2
    for i, b in enumerate(bars_):
        if i and (b.configuration, b.stack) != (bars_[i - 1].configuration, bars_[i - 1].stack):
            x += GROUP_GAP  # a gap between the cells (a stack under a configuration), none between its sides
        xs.append(x)
        x += BAR_W + BAR_GAP
    legend_w = sum(16 + len(c) * CHAR_W + 18 for c in CATEGORIES)
    width = max(x + RIGHT, left + legend_w + RIGHT, 560.0)
    notes = _notes(bars_, int((width - left - RIGHT) / (0.62 * NOTE_FONT)), notices)
    gb_top = max((sum(ci.median or 0.0 for ci in b.per_gb.values()) for b in bars_), default=0.0)
    gb_top = max([gb_top] + [(sum(ci.median or 0.0 for ci in b.per_gb.values()) - (ci.median or 0.0)
                              + (ci.high or 0.0)) for b in bars_ for ci in b.per_gb.values()])
    panels = [_Panel("share of each side's sampled CPU time", [b.share for b in bars_], 1.0, ".0%", "", True),
              _Panel("CPU seconds per GB moved (sent + received)", [b.per_gb for b in bars_],
                     _nice_max(gb_top), ".3g", " CPU s/GB")]
    panel_h = PANEL_H + 28 + below
    height = TOP + (len(panels) + 1) * panel_h + 14 + 13 * len(notes)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
           f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="DejaVu Sans, Verdana, sans-serif" '
           f'font-size="{FONT}">',
           f'<rect width="{width:.0f}" height="{height:.0f}" fill="#fff"/>',
           f'<text x="{left:.1f}" y="22" font-size="16" font-weight="bold">{xml_text(title)}</text>']
    # legend
    lx = left
    for c in CATEGORIES:
        out.append(f'<rect class="legend" x="{lx:.1f}" y="36" width="12" height="12" fill="{category_colour(c)}"/>'
                   f'<text x="{lx + 16:.1f}" y="46">{xml_text(c)}</text>')
        lx += 16 + len(c) * CHAR_W + 18
    for k, panel in enumerate(panels):
        y0 = TOP + k * panel_h + 22  # the panel's top edge
        base = y0 + PANEL_H
        out.append(f'<text x="{left:.1f}" y="{y0 - 8:.1f}" font-weight="bold">{xml_text(panel.title)}</text>')
        if not any(panel.values):
            out.append(f'<text x="{left + 10:.1f}" y="{y0 + PANEL_H / 2:.1f}">no run counted the bytes its '
                       'sides moved (record with the packetio probes, or over TCP)</text>')
        _axis(out, panel.top, panel.tick, left, width - RIGHT, base)
        for b, bx, vals in zip(bars_, xs, panel.values):
            cum, scale = 0.0, _scale(vals, panel)
            for c in CATEGORIES:
                ci = vals.get(c)
                if ci is None or not ci.median:
                    continue
                h = PANEL_H * ci.median * scale / panel.top
                y = base - PANEL_H * cum / panel.top - h
                tip = _tip(b, c, ci, panel.unit, panel.tick if panel.tick != ".0%" else ".1%")
                out.append(f'<rect class="seg" x="{bx:.1f}" y="{y:.2f}" width="{BAR_W}" height="{h:.2f}" '
                           f'fill="{category_colour(c)}" data-tip="{xml_attr(tip)}"><title>{xml_text(tip)}'
                           f'</title></rect>')
                if ci.low is not None and ci.high is not None:
                    _whisker(out, bx + BAR_W / 2, base - PANEL_H * (cum + ci.low * scale) / panel.top,
                             base - PANEL_H * (cum + ci.high * scale) / panel.top)
                cum += ci.median * scale
        for b, bx in zip(bars_, xs):  # the labels, turned, ending under their bar
            _turned(out, b.label, bx + BAR_W / 2, base)
    _goodput_panel(out, bars_, xs, TOP + len(panels) * panel_h + 22, left, width - RIGHT)
    y = height - 13 * len(notes) + 4
    for n in notes:
        out.append(f'<text class="note" x="{left:.1f}" y="{y:.1f}" font-size="{NOTE_FONT}" fill="#444">'
                   f'{xml_text(n)}</text>')
        y += 13
    out.append("</svg>")
    return "\n".join(out) + "\n"


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ margin: 16px; background: #fff; }}
#tip {{ position: fixed; display: none; max-width: 420px; padding: 6px 8px; background: #222; color: #fff;
       font: 12px "DejaVu Sans", Verdana, sans-serif; border-radius: 3px; pointer-events: none; }}
.seg:hover, .goodput:hover {{ stroke: #000; stroke-width: 1.5; }}
</style></head><body>
{svg}
<div id="tip"></div>
<script type="application/json" id="qprof-chart">{data}</script>
<script>
(function () {{
  var tip = document.getElementById("tip");
  document.querySelectorAll("[data-tip]").forEach(function (el) {{
    var t = el.querySelector("title"); if (t) t.remove();  // the box replaces the browser's tooltip
    el.addEventListener("mousemove", function (e) {{
      tip.textContent = el.getAttribute("data-tip"); tip.style.display = "block";
      tip.style.left = (e.clientX + 14) + "px"; tip.style.top = (e.clientY + 14) + "px";
    }});
    el.addEventListener("mouseleave", function () {{ tip.style.display = "none"; }});
  }});
}})();
</script>
</body></html>
"""


def chart_html(bars_: Sequence[Bar], title: str = "qprof: CPU time by category",
               notices: Sequence[Notice] = ()) -> str:
    """The SVG in a page that shows each segment's figures on hover; the bars' data rides along as JSON."""
    data = [{"label": b.label, "configuration": b.configuration, "stack": b.stack, "side": b.side, "runs": b.runs,
             "share": {c: ci.median for c, ci in b.share.items()},
             "cpu_s_per_gb": {c: ci.median for c, ci in b.per_gb.items()},
             "goodput_gbps": b.goodput.median} for b in bars_]
    text = json.dumps(data).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    return _PAGE.format(title=html.escape(title), svg=chart_svg(bars_, title, notices), data=text)
