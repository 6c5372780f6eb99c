"""Targets that appear during a run (`attach --cgroup`): how their pids reach the probe groups.

A followed run's targets grow two ways. A target's new process (a worker a server's master forks)
is made a target by the groups' own fork programs, in the kernel, at its birth: nothing here is in
its way. A process that appears otherwise (moved into the followed cgroup, started by a process
that is not a target) is found by the session, which hands its pid to ProbeCollector.add_targets.

The libbpf loaders are child processes: they learn such pids from a file in the run directory
(probe-targets.pids), one decimal pid a line, appended by the collector and read by every loader at
each turn of its window loop (a stat and, when it grew, a read of what was added: the cheapest
channel that each loader can poll at its own pace and that a restarted reader can read from the
start). The file is also the run's record of what was added and in which order. bpftrace children
learn them from a system call qprof makes (probes.bpftrace.announce).
"""

from __future__ import annotations

import os
from pathlib import Path

from qprof import runfiles


def targets_file(out: Path) -> Path:
    """Where the pids added during a run are appended: probe-targets.pids."""
    return out / runfiles.probe_file("targets", "pids")


def parse_pids(chunk: bytes) -> tuple[list[int], int]:
    """The pids of the complete lines of `chunk`, and how many bytes those lines took (a line still
    being written is left for the next read). A line that is not a positive decimal number is
    skipped: a damaged line costs that pid, not the others."""
    end = chunk.rfind(b"\n") + 1
    pids = []
    for line in chunk[:end].split(b"\n"):
        line = line.strip()
        if line.isdigit() and int(line) > 0:
            pids.append(int(line))
    return pids, end


class TargetsWriter:
    """The collector's side: each pid appended in one write(2) to a file opened O_APPEND."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_CLOEXEC,
                                       0o600)

    def add(self, pids: list[int]) -> None:
        if pids and self._fd is not None:
            os.write(self._fd, "".join(f"{int(p)}\n" for p in pids).encode())

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class TargetsReader:
    """A loader's side: `new()` returns the pids appended since its last call."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0

    def new(self) -> list[int]:
        try:
            if os.stat(self.path).st_size <= self._offset:
                return []
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except OSError:
            return []
        pids, used = parse_pids(chunk)
        self._offset += used
        return pids
