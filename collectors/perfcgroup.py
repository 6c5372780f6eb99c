"""A cgroup of its own for each target: sampled on its own CPU time (`--scope auto|cgroup`), its stalls
measured apart (CPU pressure).

A cgroup-filtered per-CPU event (`perf record -a -G CG`) counts only while a
task of CG runs: its timer stops when a target is switched out and resumes
with the rest of its period when one is switched in, so samples fall on the
targets' CPU time evenly. System-wide sampling (`--scope system`: -a, every
task, filtered by pid when folding) ticks on wall-clock time instead, and a
target's work that starts when it wakes falls at a fixed phase of the ticks:
tquic's client spent 12.4% of its CPU hashing what it received; system-wide
samples put 6.8-13.1% there, cgroup samples 11.4-12.6% (6 runs each,
interleaved). Per-task events (-p) keep the same clock but perf 6.1 spins a
core after a pre-existing thread exits (see collectors.perf). The cgroup also
filters in the kernel, has no per-task event to hang up, and holds threads or
children a target creates later from birth.

The cost: every context switch between a task inside CG and one outside
schedules the events out or in, which re-arms the sampling timer (or
reprograms the PMU). Measured on qprof's 2-vCPU VM with a pipe ping-pong
pinned to one CPU, one side in CG: 1.7 us a round trip without perf, 1.7 us
with system-wide sampling, 9-10 us with cgroup sampling (cpu-clock; 13-20 us
with cycles). A 1 GiB ngtcp2 transfer with both ends attached was not
measurably slower for it (bench/probe_overhead.py, default-both against
system-both).

Each target is moved into a fresh child of the cgroup it is in
(`<its cgroup>/qprof-sample-<owner>-<n>`, one per target) in the hierarchy
perf resolves -G against: the cgroup v1 hierarchy that has the perf_event
controller, else cgroup v2. A child cgroup has no controller of its own
enabled (its parent holds processes, so it cannot enable any), so quotas and
weights of the parent still govern the targets; procfs strips this component
when it reads a target's CPU quota.

The same children give each target its own CPU pressure (PSI): in cgroup v2
every cgroup keeps one, with or without controllers, for the tasks in it and
below. A target started from a shell shares the shell's cgroup with everything
else started there, and two targets of one run share it with each other, so
without a child of its own a multi-threaded target has no stall figure (its
threads' summed run-queue time counts them waiting for each other too: no
limit from outside). Where perf's hierarchy is v1, or sampling is system-wide,
the session makes these children in cgroup v2 for the pressure alone.

Moving them back is the job of a watchdog process (collectors.cgroupwatch) that holds the read end of
a pipe from qprof: on EOF — qprof closed it, exited, or was SIGKILLed — it
moves every task still in the child cgroup back to the original cgroup and
removes the child. A leftover whose owner and watchdog both died is removed
by the next qprof that starts (`cleanup_leftovers`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from qprof.archive.identity import process_identity
from qprof.collectors import cgroupwatch
from qprof.collectors.cgroupwatch import STOP_SIGNALS, move, restore
from qprof.collectors.procfs import SAMPLING_CGROUP_NAME as _NAME
from qprof.collectors.procfs import SAMPLING_CGROUP_PREFIX as PREFIX
from qprof.probes.children import born_ignoring
from qprof.probes.features import Hierarchy


def _starttime(pid: int) -> str:
    return str(process_identity(pid).start_ticks)


def cleanup_leftovers(h: Hierarchy) -> list[str]:
    """Remove sampling cgroups whose owning qprof is gone (it and its watchdog were killed)."""
    removed = []
    for dirpath, dirnames, _ in os.walk(h.mount):
        for d in list(dirnames):
            m = _NAME.match(d)
            if m is None:
                continue
            dirnames.remove(d)
            if _starttime(int(m.group(1))) == m.group(2):
                continue  # a live qprof's
            child = Path(dirpath) / d
            restore(child, Path(dirpath))
            removed.append(str(child))
    return removed


class SampleCgroups:
    """Each target moved into a child cgroup of its own, in one hierarchy."""

    def __init__(self, h: Hierarchy) -> None:
        self.h = h
        self.children: list[tuple[Path, Path]] = []  # (child, original)
        self._watchdog: subprocess.Popen[bytes] | None = None

    def place(self, pids: list[int]) -> list[str]:
        """Move each of `pids` into a child cgroup of its own; returns their names (paths from the
        hierarchy's root: what `perf record -G` takes, one per event).

        One child per target, not one per cgroup the targets share: in cgroup v2 every cgroup keeps
        its own CPU pressure (PSI), so each target's stalls are measured apart from the other
        target's and from whatever else shares its cgroup (a shell's, a service's).
        Raises OSError when the hierarchy refuses (read-only, a threaded cgroup...)."""
        paths = []
        for pid in pids:
            path = self.h.path_of(pid)
            if path is None:
                raise OSError(f"pid {pid} is not in the {self.h.version} cgroup hierarchy at {self.h.mount}")
            paths.append((pid, path))
        me, start = os.getpid(), _starttime(os.getpid())
        if self._watchdog is None:
            self._start_watchdog()
        names = []
        for pid, path in paths:
            original = self.h.mount / path.lstrip("/")
            child = original / f"{PREFIX}{me}-{start}-{len(self.children)}"
            child.mkdir(mode=0o755)
            self.children.append((child, original))
            self._tell_watchdog(child, original)
            if not move(pid, child) and Path(f"/proc/{pid}").exists():
                raise OSError(f"cannot move pid {pid} into {child}")
            names.append(str(child.relative_to(self.h.mount)))
        return names

    def _start_watchdog(self) -> None:
        # its own process group, SIGINT/SIGTERM/SIGHUP ignored from birth: a Ctrl-C to qprof's terminal
        # must not kill it before qprof closes the pipe (one landing while it was being spawned did, and
        # the run lost its cgroups to a broken pipe); in qprof's session like every helper
        self._watchdog = subprocess.Popen([sys.executable, "-I", "-S", cgroupwatch.__file__],
                                          stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, process_group=0,
                                          preexec_fn=born_ignoring(*STOP_SIGNALS))

    def _tell_watchdog(self, child: Path, original: Path) -> None:
        assert self._watchdog is not None and self._watchdog.stdin is not None
        self._watchdog.stdin.write(json.dumps([str(child), str(original)]).encode() + b"\n")
        self._watchdog.stdin.flush()

    def release(self, timeout: float = 10.0) -> None:
        """Targets back where they were, children removed (the watchdog does it; we wait for it)."""
        w, self._watchdog = self._watchdog, None
        if w is None:
            return
        assert w.stdin is not None
        w.stdin.close()
        try:
            w.wait(timeout)
        except subprocess.TimeoutExpired:
            w.kill()
            w.wait()
        for child, original in self.children:  # if the watchdog failed: the same work, here
            if child.exists():
                restore(child, original)
        self.children.clear()
