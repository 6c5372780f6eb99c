"""`qprof table` on the terminal: many runs side by side, then a summary.

The rows and the summary are viewer.rows'; this module only shows them (the
CSV and parquet files are viewer.outputs'). On the terminal a run's process is
one line with the five shares as columns (the long form, one row per category,
is what the files hold: the shape pandas and R group by).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from qprof.attribution.categories import CATEGORIES
from qprof.viewer.rows import SUMMARY_METHOD, Row
from qprof.viewer.terminal import COLOURS

def _pct(x: Any) -> str:
    return "–" if x is None else f"{x:.1%}"


def _num(x: Any, spec: str) -> str:
    return "–" if x is None else format(x, spec)


def render(rows: list[Row], console: Console) -> None:
    """One line per run x process: run, stack, role, the five shares, CPU s, goodput, verdict."""
    t = Table(box=None, pad_edge=False, title="share of each process's sampled CPU time", title_justify="left")
    for col in ("run", "stack", "role"):
        t.add_column(col, overflow="fold")
    for cat in CATEGORIES:
        t.add_column(cat, justify="right", style=COLOURS[cat])
    for col in ("CPU s", "Gbit/s", "verdict"):
        t.add_column(col, justify="right" if col != "verdict" else "left")
    procs: dict[tuple[Any, Any], dict[str, Row]] = {}
    for r in rows:
        procs.setdefault((r["run"], r["pid"]), {})[r["category"]] = r
    for (run, pid), cats in procs.items():
        first = next(iter(cats.values()))
        t.add_row(Text(Path(run).name), Text(first["stack"] or "–"), Text(f"{first['role'] or first['comm']}"),
                  *[_pct(cats[c]["share"]) if c in cats else "–" for c in CATEGORIES],
                  _num(sum(c["cpu_seconds"] for c in cats.values()), ".2f"),
                  _num(first["goodput_gbps"], ".2f"), Text(first["verdict"] or "–"))
    console.print(t)


def render_summary(summary: list[Row], console: Console) -> None:
    """Median share per (stack, role, category) over the runs, with its 95% interval when n allows one."""
    t = Table(box=None, pad_edge=False, title="summary over runs: median and 95% CI", title_justify="left")
    settings = any(s["configuration"] is not None for s in summary)
    columns = ("stack", "role", "category", "n", "share", "CI", "CPU s", "CI ")
    for col in (("setting",) if settings else ()) + columns:
        t.add_column(col, justify="left" if col in ("setting", "stack", "role", "category") else "right")
    for s in summary:
        ci = (f"[{s['share_ci_low']:.1%}, {s['share_ci_high']:.1%}]" if s["share_ci_low"] is not None
              else "n/a")
        ci_cpu = (f"[{s['cpu_seconds_ci_low']:.2f}, {s['cpu_seconds_ci_high']:.2f}]"
                  if s["cpu_seconds_ci_low"] is not None else "n/a")
        t.add_row(*([Text(str(s["configuration"]))] if settings else []), Text(s["stack"] or "–"),
                  Text(str(s["role"])), Text(s["category"], style=COLOURS[s["category"]]),
                  str(s["n"]), _pct(s["share_median"]), ci, _num(s["cpu_seconds_median"], ".2f"), ci_cpu)
    console.print(t)
    notes = sorted({s["ci_note"] for s in summary if s["ci_note"]})
    console.print(Text(SUMMARY_METHOD + (f"; n/a: {'; '.join(notes)}" if notes else ""), style="dim"))
