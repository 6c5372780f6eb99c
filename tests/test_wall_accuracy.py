"""qprof's wall-clock split per thread against a workload that measures its own waits.

tests/workloads/waits.c runs threads that block for known reasons and time every
blocking call themselves (tests/test_waits_workload.py checks that their own
figures add up): w-net in recvfrom fed by another process (network), w-timer in
clock_nanosleep and epoll_wait timeouts (timer), w-cond in pthread_cond_wait
signalled by a thread of its process (thread), w-signal asleep (timer), w-disk in
O_DIRECT reads (disk) and short sleeps (timer). qprof runs it with its default
options; each thread's shares of its window (on a CPU, runnable, each wait
kind) must match the workload's own within 2 pp, quiet and beside a busy
process per CPU (--busy). On a CPU is the thread's own task-clock, which stops
and starts at the context switches as qprof's probe does; runnable is the rest
of the time it wanted a CPU (CPU clock + schedstat run-queue wait), since the
kernel's CPU clock counts a wakeup that preempts as on-CPU from the wakeup.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from conftest import ROOT, build_c, qprof

WORKLOAD = ROOT / "tests" / "workloads"
RUN_S = 5.0
TOLERANCE = 0.02  # share of a thread's window, per state: the bound
# thread -> the kinds its own clock measures
KINDS = {"w-net": ("network",), "w-timer": ("timer",), "w-cond": ("thread",), "w-signal": ("timer",),
         "w-disk": ("disk", "timer")}


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root for perf and the probes")
@pytest.mark.parametrize("mode", ["quiet", "busy"])
def test_wall_clock_split_matches_the_workloads_own_clock(tmp_path: Path, mode: str) -> None:
    """qprof runs the workload itself (`qprof record`), held at exec until sampling and the probes are
    live: qprof's window of each thread is the thread's whole life, as the workload's own clock's is."""
    binary = build_c(WORKLOAD / "waits.c", "waits", ["-pthread"])
    truth_file, work, run = tmp_path / "waits.json", tmp_path / "work", tmp_path / "run"
    work.mkdir()
    qprof("record", "-o", str(run), "--", str(binary), str(RUN_S), str(truth_file), str(work),
          *(["--busy"] if mode == "busy" else []))
    truth = json.loads(truth_file.read_text())
    report = json.loads(qprof("report", str(run), "--format", "json").stdout)
    wall = next(p for p in report["processes"] if p["pid"] == truth["pid"])["wall_clock"]
    assert wall is not None, "no wall clock: the waits probes did not run"
    seen = {t["comm"]: t for t in wall["threads"]}
    lines, bad = [], []
    for name, kinds in KINDS.items():
        own, ours = truth["threads"][name], seen[name]
        window = own["window_s"]
        # split at its task-clock, as qprof splits at the switches (waits.c: the kernel's CPU clock
        # charges a thread that preempts on wakeup from the wakeup)
        wanted_cpu = own["cpu_s"] + own["schedstat_runqueue_s"]
        want = {"on_cpu": own["task_clock_s"] / window,
                "runnable": (wanted_cpu - own["task_clock_s"]) / window,
                **{k: own["off_cpu_s"].get(k, 0.0) / window for k in kinds}}
        got = ours["shares"]
        assert abs(sum(ours["seconds"].values()) - ours["window_s"]) <= 0.02 * ours["window_s"]
        for state, w in want.items():
            g = got[state]
            lines.append(f"{name:9s} {state:9s} own {w:6.1%}  qprof {g:6.1%}  diff {g - w:+.1%}")
            if abs(g - w) > TOLERANCE:
                bad.append(lines[-1])
        # what its own clock does not name must be small in qprof's split too
        rest = sum(v for k, v in got.items() if k not in want)
        lines.append(f"{name:9s} {'(rest)':9s} qprof {rest:6.1%}")
        if rest > TOLERANCE:
            bad.append(lines[-1])
    print("\n".join(lines))
    assert not bad, "\n".join(bad)
