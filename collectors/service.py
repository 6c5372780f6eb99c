"""Targets named by what runs them: a cgroup (`attach --cgroup PATH`) or a systemd unit (`--unit NAME`).

A service is a cgroup: systemd puts a unit's processes in one (`/system.slice/NAME.service`), a
container runtime a container's, and every process a member forks is born in it. Following the
cgroup, not a list of pids, is what keeps a server with a worker per core profiled across a
reload: a worker started during the run is a member from its first instruction.

Nothing the service manager owns is touched: perf samples the cgroup as it is (`perf record -G`
counts a task of the cgroup or of any cgroup below it), no process is moved, no controller or limit
written. The session asks `Followed.arrivals()` about once a second for members it has not seen.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

from qprof.archive.identity import process_identity
from qprof.collectors import procfs
from qprof.archive.model import Service
from qprof.errors import QprofError
from qprof.probes.features import Hierarchy, find_hierarchy, pressure_hierarchy


def v2_hierarchy() -> Hierarchy:
    """The cgroup v2 mount, where services live (systemd, container runtimes); refused without one."""
    h = pressure_hierarchy() or find_hierarchy()
    if h is None or h.version != "v2":
        raise QprofError("--cgroup/--unit need the cgroup v2 hierarchy mounted (/sys/fs/cgroup or "
                         "/sys/fs/cgroup/unified): give the service's pids instead")
    return h


def resolve_cgroup(arg: str, h: Hierarchy, role: str | None = None) -> Service:
    """`--cgroup`'s value as a path from the hierarchy's root: either a directory under its mount
    (/sys/fs/cgroup/...) or the path /proc/PID/cgroup shows (/system.slice/x.service)."""
    text = arg.strip()
    if not text:
        raise QprofError("--cgroup needs a path: the cgroup's directory, or its path as /proc/PID/cgroup shows it")
    p = Path(text)
    mount = h.mount.resolve()
    if p.is_absolute() and p.resolve().is_relative_to(mount) and p.exists():
        rel = "/" + str(p.resolve().relative_to(mount)).strip(".")
    else:
        rel = "/" + text.strip("/")
    rel = "/" if rel in ("/", "/.") else rel.rstrip("/")
    where = mount / rel.lstrip("/")
    if not (where / "cgroup.procs").is_file():
        raise QprofError(f"no cgroup {arg!r} in the {h.version} hierarchy at {h.mount}: give its directory "
                         f"there or its path as /proc/PID/cgroup shows it (e.g. /system.slice/NAME.service)")
    if rel == "/":
        raise QprofError(f"--cgroup {arg!r} is the root cgroup: every process on the host; name a service's or "
                         "a container's cgroup, or give pids")
    return Service(rel, role)


def resolve_unit(name: str, h: Hierarchy, role: str | None = None) -> Service:
    """A systemd unit's cgroup, as systemd reports it. Only where systemd is the service manager."""
    if not Path("/run/systemd/system").is_dir() or shutil.which("systemctl") is None:
        raise QprofError(f"--unit {name} needs systemd as the service manager, and this host runs "
                         f"{_init_name()} as pid 1: give the service's cgroup with --cgroup PATH")
    unit = name if "." in name else f"{name}.service"
    r = subprocess.run(["systemctl", "show", "--property=ControlGroup", "--value", unit],
                       capture_output=True, text=True, timeout=10)
    cg = r.stdout.strip()
    if r.returncode != 0 or not cg:
        raise QprofError(f"unit {unit} has no cgroup ({(r.stderr.strip() or 'is it running?')}): "
                         "start it, or check the name with `systemctl list-units`")
    t = resolve_cgroup(cg, h, role)
    return Service(t.name, role, unit)


def _init_name() -> str:
    try:
        return Path("/proc/1/comm").read_text().strip() or "?"
    except OSError:
        return "?"


def members(h: Hierarchy, name: str) -> list[int]:
    """Every process in the cgroup and the cgroups below it (a container's own sub-cgroups), sorted."""
    found: set[int] = set()
    for dirpath, _dirs, files in os.walk(h.mount / name.lstrip("/")):
        if "cgroup.procs" not in files:
            continue
        try:
            found.update(int(x) for x in (Path(dirpath) / "cgroup.procs").read_text().split())
        except (OSError, ValueError):
            continue  # removed while walked
    return sorted(found)


class Followed:
    """The followed cgroups of one run and which of their members were already seen."""

    def __init__(self, h: Hierarchy, targets: list[Service]) -> None:
        self.h, self.targets = h, targets
        self.seen: set[int] = set()
        self.since = _uptime_ticks()  # qprof's helpers start after this; a service qprof started, before

    def start(self) -> dict[int, Service]:
        """The members at the start, each with the cgroup it was found in; refuses an empty service."""
        found = self.arrivals()
        empty = [t.unit or t.name for t in self.targets if t not in found.values()]
        if empty:
            raise QprofError(f"cgroup {', '.join(empty)} holds no process: start the service first, or name the "
                             "cgroup its processes are in (see /proc/PID/cgroup)")
        return found

    def arrivals(self) -> dict[int, Service]:
        """Members not seen before (a worker forked or moved in since the last look)."""
        new: dict[int, Service] = {}
        for t in self.targets:
            for pid in members(self.h, t.name):
                if pid not in self.seen and pid not in new:
                    self.seen.add(pid)
                    if not _ours(pid, self.since):
                        new[pid] = t
        return new

    def empty(self) -> bool:
        return not any(not _ours(p, self.since) for t in self.targets for p in members(self.h, t.name))


def _ours(pid: int, since: int) -> bool:
    """qprof or a helper it started while observing (perf, a probe loader, ...): never a target, even
    when qprof runs inside the cgroup it follows (a container profiling itself). A process qprof's
    process started before (a test, or `record`, starting the service) is the service's."""
    me, below = os.getpid(), pid
    at: int | None = pid
    for _ in range(64):  # a chain of parents, not a loop: pids are reused only after exit
        if at == me:
            started = process_identity(below).start_ticks
            return below == me or (started is not None and started >= since)
        if at is None or at <= 1:
            return False
        below, at = at, procfs.parent_of(at)
    return False


def _uptime_ticks() -> int:
    """Now, in the clock of /proc/PID/stat's start time (clock ticks since boot)."""
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * os.sysconf("SC_CLK_TCK"))
