"""The wall-clock ground truth (tests/workloads/waits.c) is self-consistent.

waits.c runs named threads that measure every blocking call themselves
(CLOCK_MONOTONIC around it, their CPU clock and /proc schedstat before and
after): w-net in recvfrom (network), w-timer and w-signal in clock_nanosleep
and epoll_wait (timer), w-cond in pthread_cond_wait (thread), w-disk in O_DIRECT
pread (disk) and between bursts in clock_nanosleep (timer). Before qprof's
off-CPU accounting is compared with it, the truth itself must add up:

  window = cpu + run-queue wait + sum over kinds of off-CPU time in calls

per thread, where off-CPU time in calls is the wall time inside them less the
CPU and the run-queue wait inside them (after a wakeup a thread waits for a
CPU before the call returns). The plain sum cpu + run-queue + in-call wall time
counts those twice: ~1% for most threads on a quiet host, 15-20% for w-disk,
whose pread is a third CPU and run-queue wait, and up to ~12% with --busy.

The threads' duty cycles are checked too: each one's in-call share of its
window less the run-queue wait of its computation (which a loaded host adds
to every round and does not change what the thread does) against the nominal
cycle, w-timer 3/5, w-net 4/5, w-cond and w-signal 6/7, within 10 pp.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT, build_c, steal_s, stolen_since

WORKLOAD = ROOT / "tests" / "workloads"
SECONDS = 2.0
THREADS = {"w-net", "w-timer", "w-cond", "w-signal", "w-disk"}
# thread -> (kind, nominal in-call share of a round, rounds per second)
DUTY = {
    "w-net": ("network", 4 / 5, 200),       # a datagram every 5 ms, 1 ms of computation each
    "w-timer": ("timer", 3 / 5, 1000 / 5),  # 2 ms of computation, 3 ms asleep (4 ms every 10th)
    "w-cond": ("thread", 6 / 7, 1000 / 7),  # signalled every 7 ms, 1 ms of computation each
    "w-signal": ("timer", 6 / 7, 1000 / 7),
}
CONSISTENCY = 0.03  # of the window
PER_SWITCH_S = 20e-6  # how far the task-clock and the CPU clock may part at each call (see below)
SHARE_BAND = 0.10


def alive(pid: int, name: str) -> bool:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() == name
    except OSError:
        return False


@pytest.mark.parametrize("mode", ["quiet", "busy"])
def test_waits_workload_adds_up(tmp_path: Path, mode: str) -> None:
    binary = build_c(WORKLOAD / "waits.c", "waits", ["-pthread"])
    out = tmp_path / "waits.json"
    work = tmp_path / "work"
    work.mkdir()
    cmd = [str(binary), str(SECONDS), str(out), str(work)] + (["--busy"] if mode == "busy" else [])
    stolen = steal_s()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    stolen = stolen_since(stolen)
    assert proc.returncode == 0, proc.stderr
    truth = json.loads(out.read_text())
    assert proc.stdout.splitlines()[0] == str(truth["pid"]), "the pid first, for a profiler to attach"
    assert list(work.iterdir()) == [], "the disk file is removed"
    assert not alive(truth["feeder_pid"], "w-feeder")
    assert not any(alive(p, "w-hog") for p in truth["hog_pids"])
    assert len(truth["hog_pids"]) == (truth["cpus"] if mode == "busy" else 0)
    assert truth["disk_mode"] in ("O_DIRECT", "fadvise")
    assert set(truth["threads"]) == THREADS

    print(f"\n{mode}: the host took {stolen:.3f} CPU s of the VM's; "
          f"disk {truth['disk_mode']}, {truth['disk_reads']} reads, "
          f"{truth['disk_read_off_cpu_us']:.1f} us off-CPU each")
    for name, t in sorted(truth["threads"].items()):
        window, cpu, rq = t["window_s"], t["cpu_s"], t["schedstat_runqueue_s"]
        in_call, off = sum(t["in_call_s"].values()), sum(t["off_cpu_s"].values())
        exact = (cpu + rq + off - window) / window
        plain = (cpu + rq + in_call - window) / window
        print(f"  {name:8s} window {window:.3f} s = cpu {cpu:.3f} (task-clock {t['task_clock_s']:.3f}) "
              f"+ run-queue {rq:.3f} + off-CPU {off:.3f} "
              f"{exact:+.2%} (cpu + run-queue + in-call {plain:+.2%}); "
              + ", ".join(f"{k} {v / window:.1%} of the window in calls" for k, v in t["in_call_s"].items()))
        assert t["tid"] > 0
        assert SECONDS * 0.95 <= window <= SECONDS * 1.2, window
        assert cpu > 0.01 and abs(t["schedstat_on_cpu_s"] - cpu) <= CONSISTENCY * window
        # The two clocks split each switch differently: the CPU clock charges a wake-up that preempts from
        # the wake-up on, the task-clock from the switch; and the task-clock (sched_clock) counts what the
        # host took from the vCPU while the thread ran (steal), which the CPU clock leaves out. Measured
        # 2026-11-28 beside the hogs: -12 to +13 us a call, w-disk's 4,500-4,900 reads the most (-28 to
        # +66 ms), and +165 ms once in CI (38 us a read: the host's disk work lands right after each read
        # is submitted). What the host took cannot pass what it took from all the VM's CPUs in the run.
        tc_slack = CONSISTENCY * window + t["calls"] * PER_SWITCH_S
        assert -tc_slack <= t["task_clock_s"] - cpu <= tc_slack + stolen, (name, t["task_clock_s"], cpu,
                                                                            t["calls"], stolen)
        for kind, wall in t["in_call_s"].items():
            assert wall > 0, (name, kind)
            assert t["off_cpu_s"][kind] >= -0.001, (name, kind)
            assert t["in_call_cpu_s"][kind] + t["in_call_runqueue_s"][kind] <= wall + 0.001, (name, kind)
            assert 0 < t["in_call_task_clock_s"][kind] <= t["task_clock_s"], (name, kind)
            assert t["in_call_task_clock_s"][kind] + t["in_call_runqueue_s"][kind] <= wall + 0.001, (name, kind)
        assert abs(exact) <= CONSISTENCY, f"{name}: window {window} vs {cpu + rq + off}"
        assert abs(t["residual_s"] + exact * window) < 1e-5, "residual_s is that difference"
        assert t["calls"] == sum(t["calls_by_function"].values()) or name == "w-cond"

    threads = truth["threads"]
    for name, (kind, nominal, rate) in DUTY.items():
        t = threads[name]
        # the run-queue wait of the computation stretches rounds on a loaded host: not part of the cycle
        computing_rq = t["schedstat_runqueue_s"] - sum(t["in_call_runqueue_s"].values())
        share = t["in_call_s"][kind] / (t["window_s"] - computing_rq)
        print(f"  {name:8s} {kind} {share:.1%} of its rounds (nominal {nominal:.1%})")
        assert abs(share - nominal) <= SHARE_BAND, (name, share)
        if name in ("w-net", "w-signal"):  # paced by a clock, not by their own CPU
            assert abs(t["calls"] / t["window_s"] - rate) <= 0.1 * rate, (name, t["calls"])
    timer = threads["w-timer"]["calls_by_function"]
    assert timer["epoll_wait"] == sum(timer.values()) // 10, "every 10th timer wait is an epoll_wait"
    cond = threads["w-cond"]["calls_by_function"]["pthread_cond_wait"]
    assert cond >= 0.9 * threads["w-signal"]["calls"], "w-cond waits for (almost) every signal"

    disk = threads["w-disk"]
    assert truth["disk_reads"] == disk["calls_by_function"]["pread"] > 0
    if truth["disk_note"]:
        print(f"  w-disk: {truth['disk_note']}")
    else:
        assert disk["off_cpu_s"]["disk"] >= 0.02 * disk["window_s"]
    if mode == "busy":
        assert threads["w-timer"]["schedstat_runqueue_s"] >= 0.05 * threads["w-timer"]["window_s"], \
            "the hogs make threads wait for a CPU"
