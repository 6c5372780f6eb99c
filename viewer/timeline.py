"""`qprof report --timeline` in the terminal: per target, CPU by category and goodput over the run.

One row per slice of the run (the 100 ms bins merged so a run fits in about
`rows` lines), each category's CPU in cores in its colour, the total as a
bar, and the goodput of the slice (Gbit/s, the time-weighted mean of the
rates that overlap it). With the waits probes' series (attribution.timeline's `wall`), the row
goes on with the wall clock of the target's threads in the slice: each state's share of their
time (on a CPU, runnable, then what they waited for), one column per state the target spent
time in, in the state colours of the off-CPU flame graph. A run without the series prints as
it always did.
"""

from __future__ import annotations

import math

from rich.console import Console
from rich.table import Table
from rich.text import Text

from qprof.attribution.categories import CATEGORIES
from qprof.attribution.timeline import TargetTimeline, Timeline
from qprof.attribution.waits import STATES
from qprof.viewer.palette import TERMINAL, WAIT_FAMILIES

WALL_HEADERS = {"on_cpu": "on CPU", "runnable": "runnable", "network": "network", "timer": "timer",
                "thread": "thread", "disk": "disk", "other": "other"}
assert tuple(WALL_HEADERS) == STATES

BAR_CORES = 20  # bar characters per CPU core


def _mean_rate(spans: list[tuple[float, float, float]], a: float, b: float) -> float | None:
    """Time-weighted mean over [a, b] of piecewise-constant rates; None when none overlaps."""
    total, covered = 0.0, 0.0
    for s, e, g in spans:
        lap = min(b, e) - max(a, s)
        if lap > 0:
            total += g * lap
            covered += lap
    return total / (b - a) if covered else None


def _target_table(t: TargetTimeline, bin_s: float, rows: int) -> Table:
    per_row = max(1, math.ceil(len(t.cpu) / rows))
    name = f"{t.comm} (pid {t.pid}" + (f", {t.role})" if t.role else ")")
    traffic = f"; goodput from {t.traffic}" if t.traffic else ""
    # the wall clock's states the target spent time in (none: no series, nothing added)
    states = [s for s in STATES if t.wall is not None and any(b.get(s) for b in t.wall)]
    wall = "; wall clock: share of its threads' time per state (waits probes)" if states else ""
    table = Table(title=f"timeline of {name}: CPU cores by category per {per_row * bin_s:g} s{traffic}{wall}",
                  title_justify="left", show_edge=False, pad_edge=False)
    table.add_column("t (s)", justify="right")
    for c in CATEGORIES:
        table.add_column(c, justify="right", style=TERMINAL[c])
    table.add_column("CPU", justify="left", no_wrap=True)
    table.add_column("Gbit/s", justify="right")
    for s in states:
        table.add_column(WALL_HEADERS[s], justify="right", style=WAIT_FAMILIES[s].terminal)
    spans = t.goodput
    for i in range(0, len(t.cpu), per_row):
        chunk = t.cpu[i:i + per_row]
        cores = {c: sum(b.get(c, 0.0) for b in chunk) / len(chunk) for c in CATEGORIES}
        total = sum(cores.values())
        bar = Text()
        for c in CATEGORIES:
            bar.append("█" * round(cores[c] * BAR_CORES), style=TERMINAL[c])
        g = _mean_rate(spans, i * bin_s, (i + len(chunk)) * bin_s)
        shares = t.wall_shares(i, i + len(chunk)) if states else None
        table.add_row(f"{i * bin_s:.1f}", *[f"{cores[c]:.2f}" if cores[c] else "" for c in CATEGORIES],
                      bar.append(f" {total:.2f}"), "" if g is None else f"{g:.2f}",
                      *[f"{100 * shares[s]:.0f}%" if shares and shares[s] else "" for s in states])
    return table


def render_timeline(tl: Timeline, console: Console, rows: int = 30) -> None:
    if not tl.aligned:
        console.print(Text("timeline: this run's samples and readings have no common clock (recorded by an older "
                           "qprof): CPU from its first sample, no goodput", style="yellow"))
    for t in tl.targets:
        console.print()
        console.print(_target_table(t, tl.bin_s, rows))
