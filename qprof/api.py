"""The Python API: a run archive as pandas DataFrames, for notebooks and studies.

    import qprof
    r = qprof.load("qprof-run-20260101-120000")
    r.categories.pivot(index=["pid", "comm"], columns="category", values="share")

Why a separate entry: studies built these tables by hand from `report
--format json`. `load` runs the same analysis as `qprof report` (analyse_run)
and flattens the same typed report (viewer.report, with every symbol instead
of the top few) through viewer.rows, so the numbers are the report's. pandas is imported only when load is called (viewer.frames), so
the CLI stays fast.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:
    import pandas as pd

    from qprof.viewer.report import Report

ALL_SYMBOLS = sys.maxsize  # `top` for the report: list every symbol


@dataclass
class RunData:
    """One run archive as DataFrames (columns: viewer.rows.*_COLUMNS).

    categories  one row per process x category: run, pid, comm, role (server/client or
                None), stack (QUIC stack mapping the process was read with), category,
                share (of the process's sampled CPU time; a process's five sum to 1),
                cpu_seconds, samples
    symbols     one row per process x category x leaf symbol (self time): run, pid,
                comm, role, category, symbol, dso, samples, share, cpu_seconds
    probes      eBPF packet I/O counters, one row per process (tid NaN) and one per
                thread (tid set; per-process columns NaN): tx_/rx_ syscalls,
                messages, bytes, datagrams, skbs, mmsg_calls, empty_calls, errors,
                datagrams_per_syscall; gso_enabled, gso_sends,
                gso_segments_per_gso_send, gso_segment_size; gro_enabled,
                gro_coalesced_receives, gro_datagrams_per_receive; ack_ratio, drops
                (at its ports), drop_reasons ("REASON=n;..."), ports. Empty when the
                run had no probes (--probes none).
    verdict     one row per judged side (role server/client) with its evidence
                (viewer.rows.VERDICT_COLUMNS: busiest thread's on-CPU, run-queue and
                blocked shares, process cores, capacity, quota, throttling, drops,
                goodput_gbps, cpu_limited, reasons), then a row with role "overall";
                limited_by, summary and notes are on every row. Empty without roles.
    meta        one row: run, status, start_time, duration_s, stop_reason, hostname,
                cpus, cpu_model, kernel, event, frequency, unwind, probes, stack, perf
                (version), samples, cpu_seconds, goodput_gbps, verdict
    report      the JSON report itself (`qprof report --format json`, every symbol)
    """

    categories: pd.DataFrame
    symbols: pd.DataFrame
    probes: pd.DataFrame
    verdict: pd.DataFrame
    meta: pd.DataFrame
    report: dict[str, Any]


def typed_report(run: str | os.PathLike[str], mappings: Sequence[str | os.PathLike[str]] = (),
                 stack: str | None = None, top: int = ALL_SYMBOLS) -> Report:
    """The report of one run (viewer.report: what every output renders), with `top` symbols."""
    from qprof.attribution.analysis import analyse_run
    from qprof.attribution.mapping import MappingSet
    from qprof.archive import Run
    from qprof.viewer.report import report_of

    r = Run.open(Path(run))
    r.require_stacks()
    return report_of(analyse_run(r, MappingSet.load([str(m) for m in mappings]), stack), top)


def report_of(run: str | os.PathLike[str], mappings: Sequence[str | os.PathLike[str]] = (),
              stack: str | None = None, top: int = ALL_SYMBOLS) -> dict[str, Any]:
    """The JSON report of one run (what `qprof report --format json` prints, with `top` symbols)."""
    from qprof.viewer.json_report import to_dict

    return to_dict(typed_report(run, mappings, stack, top))


def load(run: str | os.PathLike[str], mappings: Sequence[str | os.PathLike[str]] = (),
         stack: str | None = None) -> RunData:
    """Analyse a run archive as `qprof report` does and return its data as DataFrames (see RunData).

    `mappings`: extra mapping files (TOML), taking precedence over the shipped ones
    (`--mapping`); `stack`: force this stack's mapping file (`--stack`). Bad input
    (not a run, no folded stacks, an invalid mapping file) raises qprof.errors.QprofError."""
    from qprof.viewer import rows
    from qprof.viewer.frames import frame
    from qprof.viewer.json_report import to_dict

    report = typed_report(run, mappings, stack)
    return RunData(
        categories=frame(rows.category_rows(report), rows.CATEGORY_COLUMNS),
        symbols=frame(rows.symbol_rows(report), rows.SYMBOL_COLUMNS),
        probes=frame(rows.probe_rows(report), rows.PROBE_COLUMNS),
        verdict=frame(rows.verdict_rows(report), rows.VERDICT_COLUMNS),
        meta=frame([rows.run_row(report)], rows.RUN_COLUMNS),
        report=to_dict(report),
    )
