"""`qprof table` on the terminal: many runs side by side, then a summary.

The rows and the summary are viewer.rows'; this module only shows them (the
CSV and parquet files are viewer.outputs'). On the terminal a run's process is
one line with the five shares as columns (the long form, one row per category,
is what the files hold: the shape pandas and R group by).
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from qprof.attribution.categories import CATEGORIES
from qprof.attribution.stats import min_n
from qprof.viewer.rows import SUMMARY_METHOD, Notice, SummaryRow, TableRow, run_names
from qprof.viewer.terminal import COLOURS

def _pct(x: float | None) -> str:
    return "–" if x is None else f"{x:.1%}"


def _num(x: float | None, spec: str) -> str:
    return "–" if x is None else format(x, spec)


def render(rows: list[TableRow], console: Console) -> None:
    """One line per run x process: run (its path relative to the runs' common root), stack, role, the
    five shares, CPU s, goodput, verdict."""
    t = Table(box=None, pad_edge=False, title="share of each process's sampled CPU time", title_justify="left")
    for col in ("run", "stack", "role"):
        t.add_column(col, overflow="fold")
    for cat in CATEGORIES:
        t.add_column(cat, justify="right", style=COLOURS[cat])
    for col in ("CPU s", "Gbit/s", "verdict"):
        t.add_column(col, justify="right" if col != "verdict" else "left")
    procs: dict[tuple[str, int], dict[str, TableRow]] = {}
    for r in rows:
        procs.setdefault((r.run, r.pid), {})[r.category] = r
    names = run_names(list(dict.fromkeys(r.run for r in rows)))
    for (run, pid), cats in procs.items():
        first = next(iter(cats.values()))
        t.add_row(Text(names[run]), Text(first.stack or "–"), Text(f"{first.role or first.comm}"),
                  *[_pct(cats[c].share) if c in cats else "–" for c in CATEGORIES],
                  _num(sum(c.cpu_seconds for c in cats.values()), ".2f"),
                  _num(first.goodput_gbps, ".2f"), Text(first.verdict or "–"))
    console.print(t)


def _interval(low: float | None, high: float | None, spec: str) -> str:
    return f"[{format(low, spec)}, {format(high, spec)}]" if low is not None else "n/a"


def render_summary(summary: list[SummaryRow], notices: list[Notice], console: Console) -> None:
    """Per configuration: its runs, goodput (median, 95% interval or how many runs one needs) and the
    verdicts seen; then the median share and CPU s per configuration x side x category; then the
    notices (viewer.rows.summary_notices), a warning in bold."""
    confs = {s.configuration: s for s in summary}  # the configuration's figures are on each of its rows
    t = Table(box=None, pad_edge=False, title="summary over runs, per configuration: median and 95% CI",
              title_justify="left")
    for col in ("configuration", "runs", "Gbit/s", "95% CI", "verdicts seen"):
        t.add_column(col, justify="right" if col in ("runs", "Gbit/s") else "left")
    for conf, s in confs.items():
        why = s.goodput_ci_note
        t.add_row(Text(conf), str(s.runs), _num(s.goodput_gbps_median, ".2f"),
                  f"n/a ({why})" if why else _interval(s.goodput_gbps_ci_low, s.goodput_gbps_ci_high, ".2f"),
                  Text(s.verdicts))
    console.print(t)
    t = Table(box=None, pad_edge=False, title="per configuration, side and category: share of the side's sampled "
                                              "CPU time", title_justify="left")
    for col in ("configuration", "stack", "role", "category", "n", "share", "95% CI", "CPU s", "95% CI "):
        t.add_column(col, justify="left" if col in ("configuration", "stack", "role", "category") else "right")
    for s in summary:
        t.add_row(Text(s.configuration), Text(s.stack or "–"), Text(str(s.role)),
                  Text(s.category, style=COLOURS[s.category]), str(s.n), _pct(s.share_median),
                  _interval(s.share_ci_low, s.share_ci_high, ".1%"), _num(s.cpu_seconds_median, ".2f"),
                  _interval(s.cpu_seconds_ci_low, s.cpu_seconds_ci_high, ".2f"))
    console.print(t)
    few = sorted({s.n for s in summary if s.ci_note})
    console.print(Text(SUMMARY_METHOD + (f"; n/a: an interval needs {min_n()} runs, these rows have "
                                         f"{', '.join(map(str, few))}" if few else ""), style="dim"))
    for n in notices:
        console.print(Text(f"warning: {n.text}", style="bold yellow") if n.warning else Text(f"note: {n.text}",
                                                                                            style="dim"))
