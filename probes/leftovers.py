"""What a qprof run may leave in the kernel or the process table, counted from outside.

Used by the tests and bench/faults.py to prove that nothing of qprof's outlives it, whatever
ended it (normal stop, Ctrl-C, SIGTERM, SIGKILL, a crashing helper). qprof's processes are
found by what qprof started, never by names (a runner's name can be part of any path):
- its session: every helper qprof starts takes a process group of its own but stays in
  qprof's session (probes.children), so a caller that starts qprof as a session leader finds
  all of them by that session id, also after qprof died and they were reparented. The kernel
  keeps the id from being reused while any member lives.
- its run directory: a helper whose command line has the run directory or a path under it as
  an argument (perf -o RUN/..., bpftrace RUN/probe-*.bt, perf script -i RUN/...), or that
  holds a file there open (the libbpf loader writes its maps through its stdout), compared
  as whole paths, never as substrings.
BPF programs and the perf events/uprobes they attach to are found with bpftool and the
holders' fdinfo, the same way qprof measures probe cost.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from qprof.probes.sockets import fd_targets


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


def _bpftool_json(*args: str) -> list[dict[str, object]]:
    """bpftool's JSON listing: its objects (each a program or an attachment), [] when bpftool cannot tell."""
    bpftool = shutil.which("bpftool")
    if bpftool is None:
        return []
    try:
        r = subprocess.run([bpftool, *args, "-j"], capture_output=True, text=True, timeout=30)
        data = json.loads(r.stdout or "[]")
    except (OSError, subprocess.SubprocessError, json.JSONDecodeError):
        return []
    return [d for d in data if isinstance(d, dict)] if isinstance(data, list) else []


def bpf_programs() -> set[int]:
    """Ids of every BPF program loaded on the host now."""
    ids = (p.get("id") for p in _bpftool_json("prog", "list"))
    return {i for i in ids if isinstance(i, int)}  # bpftool writes a program's id as a JSON number


@dataclass(frozen=True)
class PerfAttachment:
    """A BPF program attached through a perf event: the process holding it and the event's kind."""

    pid: int
    fd_type: str  # tracepoint, kprobe, uprobe, uretprobe...; "" when bpftool did not say


def perf_attachments() -> list[PerfAttachment]:
    """BPF programs attached through perf events (tracepoints, uprobes): bpftool perf list, each entry
    read once (one without a pid is no process's)."""
    out = []
    for entry in _bpftool_json("perf", "list"):
        match entry:
            case {"pid": int(pid), "fd_type": str(kind)}:
                out.append(PerfAttachment(pid, kind))
            case {"pid": int(pid)}:
                out.append(PerfAttachment(pid, ""))
    return out


def all_pids() -> set[int]:
    return {int(p) for p in os.listdir("/proc") if p.isdigit()}


def _stat(pid: int) -> list[str] | None:
    """/proc/PID/stat after the command name: [state, ppid, pgrp, session, ...]; None if gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _alive(fields: list[str] | None) -> bool:
    return fields is not None and fields[0] not in ("Z", "X")  # a zombie holds nothing


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def _describe(pid: int) -> str:
    return " ".join(_cmdline(pid))[:160]


def session_members(sid: int) -> set[int]:
    """Live processes of session `sid`: what a session leader started, however deep, wherever
    it was reparented (unless it made a session of its own, which qprof's helpers never do)."""
    found = set()
    for pid in all_pids():
        fields = _stat(pid)
        if _alive(fields) and fields is not None and fields[3] == str(sid):
            found.add(pid)
    return found


def _within(path: str, root: str, cwd: str | None) -> bool:
    """Is `path` (relative ones taken from `cwd`) `root` or a path under it, as whole components?"""
    if not path.startswith("/"):
        if cwd is None:
            return False
        path = os.path.join(cwd, path)
    path = os.path.normpath(path.removesuffix(" (deleted)"))
    return path == root or path.startswith(root + "/")


def _names_path(pid: int, roots: list[str]) -> bool:
    try:
        cwd: str | None = os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        cwd = None
    if any(_within(arg, r, cwd) for arg in _cmdline(pid)[1:] for r in roots):
        return True
    for target in fd_targets(pid):
        if target.startswith("/") and any(_within(target, r, None) for r in roots):
            return True
    return False


def processes_naming(path: Path, exclude: Iterable[int] = ()) -> set[int]:
    """Live processes with `path` or a path under it as an argument, or a file under it open."""
    roots = sorted({os.path.normpath(os.path.abspath(path)), os.path.realpath(path)})
    skip = {os.getpid(), *exclude}
    return {pid for pid in all_pids() - skip if _alive(_stat(pid)) and _names_path(pid, roots)}


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


def find_leftovers(run: Path | None, progs_before: set[int], sessions: Iterable[int] = ()) -> Leftovers:
    """One look: the processes of `sessions` (qprof started as their leader) and those naming
    `run`, the BPF programs they hold or that nobody holds, their perf events and uprobes."""
    pids = set().union(*(session_members(s) for s in sessions)) - {os.getpid()}
    if run is not None:
        pids |= processes_naming(run)
    orphans = orphan_programs(progs_before)
    held = owned_prog_ids(pids) - progs_before
    attached = [a for a in perf_attachments() if a.pid in pids]
    uprobes = sum(1 for a in attached if a.fd_type in ("uprobe", "uretprobe"))
    return Leftovers({p: _describe(p) for p in sorted(pids)}, len(orphans | held),
                     len(attached) - uprobes, uprobes)


def leftovers(run: Path | None, progs_before: set[int], sessions: Iterable[int] = (),
              timeout: float = 15.0) -> Leftovers:
    """What of a run is still there once `timeout` has passed (a helper told to stop may take a
    moment, a freed program an RCU grace period): see find_leftovers."""
    sessions = list(sessions)
    deadline = time.monotonic() + timeout
    while True:
        found = find_leftovers(run, progs_before, sessions)
        if found.total == 0 or time.monotonic() > deadline:
            return found
        time.sleep(0.2)
