"""qprof's wall-clock split per thread against a workload that measures its own waits.

tests/workloads/waits.c runs threads that block for known reasons and time every
blocking call themselves (tests/test_waits_workload.py checks that their own
figures add up): w-net in recvfrom fed by another process (network), w-timer in
clock_nanosleep and epoll_wait timeouts (timer), w-cond in pthread_cond_wait
signalled by a thread of its process (thread), w-signal asleep (timer), w-disk in
O_DIRECT reads (disk) and short sleeps (timer). qprof runs it with its default
options; each thread's shares of its window (on a CPU, runnable, each wait
kind) must match the workload's own within 2 pp (and what the thread's two
clocks part by at its switches), quiet and beside a busy process per CPU
(--busy). On a CPU is the thread's own task-clock, which stops
and starts at the context switches as qprof's probe does; runnable is the rest
of the time it wanted a CPU (schedstat run-queue wait, plus what the kernel's
CPU clock counts on-CPU from a wakeup that preempts); each kind is its calls'
wall time less their run-queue wait and the larger of their CPU clock and
task-clock (the CPU clock leaves out what the host took from the vCPU).
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
        # Split at its task-clock, as qprof splits at the switches. The CPU clock runs past the task-clock by a
        # preempting wakeup's wait (P) and falls short of it by what the host took while the thread ran (steal,
        # S); a call's larger clock and the run-queue's max(0, CPU - task-clock) are each off by min(P, S)
        # (waits.c). CI read w-disk's disk 3-6 pp above qprof's, its runnable as far below, with the CPU clock.
        tc, cpu, rq = own["task_clock_s"], own["cpu_s"], own["schedstat_runqueue_s"]
        want = {"on_cpu": tc / window, "runnable": (rq + max(0.0, cpu - tc)) / window,
                **{k: (own["in_call_s"][k] - own["in_call_runqueue_s"][k]
                       - max(own["in_call_cpu_s"][k], own["in_call_task_clock_s"][k])) / window for k in kinds}}
        # Where a switch's edges fall is the clocks' own choice: qprof's wakeup is sched_waking on the waker's CPU
        # (a halted vCPU's wake-up is runnable to it, off-CPU to the run-queue clock) and its on-CPU starts at the
        # sched_switch, before the task-clock's sched-in (here ~1.4 pp of w-disk's window, quiet). The thread's
        # two clocks part by as much at its switches: each state may be off by that too.
        allowed = TOLERANCE + abs(tc - cpu) / window
        lines.append(f"{name:9s} task-clock - CPU clock {(tc - cpu) / window:+.1%} of the window: "
                     f"allowed {allowed:.1%} a state")
        got = ours["shares"]
        assert abs(sum(ours["seconds"].values()) - ours["window_s"]) <= 0.02 * ours["window_s"]
        for state, w in want.items():
            g = got[state]
            lines.append(f"{name:9s} {state:9s} own {w:6.1%}  qprof {g:6.1%}  diff {g - w:+.1%}")
            if abs(g - w) > allowed:
                bad.append(lines[-1])
        # what its own clock does not name must be small in qprof's split too
        rest = sum(v for k, v in got.items() if k not in want)
        lines.append(f"{name:9s} {'(rest)':9s} qprof {rest:6.1%}")
        if rest > TOLERANCE:
            bad.append(lines[-1])
    print("\n".join(lines))
    assert not bad, "\n".join(bad)
