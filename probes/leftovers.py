"""What a qprof run may leave in the kernel or the process table, counted from outside.

Used by the tests and bench/faults.py to prove that nothing of qprof's outlives
it, whatever ended it (normal stop, Ctrl-C, SIGTERM, SIGKILL, a crashing helper).
Everything qprof starts names the run directory on its command line (perf -o
RUN/..., bpftrace RUN/probe-*.bt, perf script -i RUN/...), so its processes are
found by that; BPF programs and the perf events/uprobes they attach to are
found with bpftool and the holders' fdinfo, the same way qprof measures probe cost.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path



def owned_prog_ids(pids: set[int]) -> set[int]:
    """Ids of the BPF programs these processes hold open (fdinfo `prog_id:`); no bpftool pid support needed."""
    ids: set[int] = set()
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fdinfo")
        except OSError:
            continue
        for fd in fds:
            try:
                with open(f"/proc/{pid}/fdinfo/{fd}", encoding="ascii", errors="replace") as f:
                    for line in f:
                        if line.startswith("prog_id:"):
                            ids.add(int(line.split()[1]))
            except (OSError, ValueError):
                continue
    return ids


def _bpftool_json(*args: str) -> list[dict]:
    bpftool = shutil.which("bpftool")
    if bpftool is None:
        return []
    try:
        r = subprocess.run([bpftool, *args, "-j"], capture_output=True, text=True, timeout=30)
        data = json.loads(r.stdout or "[]")
    except (OSError, subprocess.SubprocessError, json.JSONDecodeError):
        return []
    return data if isinstance(data, list) else []


def bpf_programs() -> set[int]:
    """Ids of every BPF program loaded on the host now."""
    return {int(p["id"]) for p in _bpftool_json("prog", "list") if "id" in p}


def perf_attachments() -> list[dict]:
    """BPF programs attached through perf events (tracepoints, uprobes): bpftool perf list."""
    return _bpftool_json("perf", "list")


def all_pids() -> set[int]:
    return {int(p) for p in os.listdir("/proc") if p.isdigit()}


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _holds_file_under(pid: int, path: Path) -> bool:
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(str(path)):
                return True
        except OSError:
            continue
    return False


def processes_naming(path: Path, exclude: set[int] = frozenset()) -> dict[int, str]:
    """Live processes whose command line names `path` (perf, bpftrace) or that hold a file under it
    (the libbpf probe runner writes there through its stdout), pid -> cmdline."""
    found = {}
    for pid in all_pids() - exclude - {os.getpid()}:
        cmd = _cmdline(pid)
        if "pytest" in cmd or "bench/faults.py" in cmd:
            continue
        if str(path) in cmd or _holds_file_under(pid, path):
            found[pid] = cmd[:160]
    return found


def orphan_programs(before: set[int]) -> set[int]:
    """Programs loaded since `before` that no live process holds: left behind in the kernel
    (a program whose holder just exited is freed after an RCU grace period: callers retry)."""
    return bpf_programs() - before - owned_prog_ids(all_pids())


@dataclass
class Leftovers:
    """Counts of what a run left behind; all zero when it cleaned up."""

    processes: dict[int, str]
    bpf_programs: int
    perf_events: int
    uprobes: int

    @property
    def total(self) -> int:
        return len(self.processes) + self.bpf_programs + self.perf_events + self.uprobes

    def describe(self) -> str:
        return (f"{self.bpf_programs} BPF programs, {self.perf_events} perf events, "
                f"{self.uprobes} uprobes, {len(self.processes)} processes")


def leftovers(run: Path, progs_before: set[int], dead_pids: set[int] = frozenset(),
              timeout: float = 15.0) -> Leftovers:
    """What of the run in `run` is still there: its processes (still alive after `timeout`: a
    helper told to stop may take a moment), BPF programs held by them or by nobody, and perf
    events/uprobes attached by them or by `dead_pids` (qprof itself, a killed target)."""
    deadline = time.monotonic() + timeout
    while True:
        procs = processes_naming(run)
        orphans = orphan_programs(progs_before)
        held = owned_prog_ids(set(procs))
        owners = set(procs) | set(dead_pids)
        attached = [a for a in perf_attachments() if a.get("pid") in owners]
        found = Leftovers(procs, len(orphans | (held - progs_before)),
                          sum(1 for a in attached if a.get("fd_type") != "uprobe"
                              and a.get("fd_type") != "uretprobe"),
                          sum(1 for a in attached if a.get("fd_type") in ("uprobe", "uretprobe")))
        if found.total == 0 or time.monotonic() > deadline:
            return found
        time.sleep(0.2)
