"""The live panel of `qprof attach`: one row per target, redrawn about once a second.

Shown only on a terminal and without --quiet (qprof.cli decides); the run
archive is the record, this panel is for the person watching the benchmark.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from qprof.attribution.live import LiveFrame, LiveMonitor, TargetRates
from qprof.archive.model import LiveData


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:.0f}%"


def _num(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def _row(r: TargetRates) -> list[str]:
    busiest = "-" if r.busiest_cpu is None else f"{_pct(r.busiest_cpu)} ({r.busiest_tid})"
    return [f"{r.comm} {r.pid}" + (f" [{r.role}]" if r.role else "") + ("" if r.alive else " (exited)"),
            _pct(r.cpu), busiest,
            _num(r.tx_dgrams_s, ",.0f"), _num(r.tx_gbit_s, ".2f"),
            _num(r.rx_dgrams_s, ",.0f"), _num(r.rx_gbit_s, ".2f"),
            _num(r.gso, ".1f"), _num(r.gro, ".1f"), _num(r.drops, ",d")]


def render_frame(f: LiveFrame) -> Group:
    """The panel for one frame: a table and, with a duration, a progress bar."""
    t = Table(title=f"qprof attach: {f.elapsed_s:.0f} s"
                    + (f" of {f.duration_s:g} s" if f.duration_s else " (Ctrl-C stops)"),
              title_justify="left", show_edge=False, pad_edge=False)
    for col in ("target", "CPU", "busiest thread", "tx dgram/s", "tx Gbit/s", "rx dgram/s", "rx Gbit/s",
                "GSO", "GRO", "drops"):
        t.add_column(col, justify="left" if col == "target" else "right")
    for r in f.targets:
        t.add_row(*_row(r))
    parts: list[Any] = [t]
    foot = f"host softirq {_pct(f.softirq_share)} of CPU time"
    if not f.probes:
        foot += "; packet columns need the packetio probes"
    parts.append(Text(foot, style="dim"))
    if f.duration_s:
        parts.append(ProgressBar(total=f.duration_s, completed=min(f.elapsed_s, f.duration_s), width=60))
    return Group(*parts)


class LiveView:
    """A rich Live display fed by AttachSession's on_tick; use as a context manager."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.monitor = LiveMonitor()
        self.live = Live(Text("qprof attach: starting", style="dim"), console=console, refresh_per_second=4,
                         transient=False)

    def __enter__(self) -> "LiveView":
        self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.live.__exit__(None, None, None)

    def tick(self, data: LiveData) -> None:
        self.live.update(render_frame(self.monitor.update(data)))

    def status(self, msg: str) -> None:
        """Status lines print above the panel."""
        self.live.console.print(Text(f"qprof: {msg}", style="dim"))
