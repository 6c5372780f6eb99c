"""Read what the live /proc says about a target: identity, mapped objects, per-thread CPU time, its
cgroup's quota and pressure; one reading of them all is a line of proc.jsonl (`reading`).

Only what a report needs is kept: no environment, no file contents, and
cmdline option values that look like secrets are redacted before they reach
the archive. The records read here are the archive's own (archive.model: ProcReading and its
parts, Target): what the session writes is what a report reads back. A process's identity (boot,
start time), which the archive reader also asks about, is archive.identity's.
"""

from __future__ import annotations

import os
import re
import select
import time
from dataclasses import dataclass
from typing import Iterable

from qprof.archive.identity import PID_MAX_LIMIT, is_alive, is_zombie, read_proc, stat_fields
from qprof.archive.model import CgroupReading, Limits, Pressure, ProcReading, Target, ThreadReading
from qprof.errors import QprofError
from qprof.probes.features import CgroupLine, cgroups_of

CLK_TCK = os.sysconf("SC_CLK_TCK")

_SECRET_WORDS = r"[\w.-]*(token|key|passw(or)?d|passwd|secret|credential|auth)[\w.-]*"
_SECRET_OPT = re.compile(rf"(?i)^-{{1,2}}{_SECRET_WORDS}$")
_SECRET_ASSIGN = re.compile(rf"(?i)^-{{0,2}}{_SECRET_WORDS}$")  # --key=x and KEY=x (env-style)
REDACTED = "<redacted>"


def redact_cmdline(argv: list[str]) -> list[str]:
    """Hide the values of options named like secrets: --token=x, --api-key x, --password x,
    and NAME=value words such as API_KEY=x (`env API_KEY=x server` puts them in argv)."""
    out: list[str] = []
    redact_next = False
    for arg in argv:
        if redact_next and not arg.startswith("-"):
            out.append(REDACTED)
            redact_next = False
            continue
        redact_next = False
        if "=" in arg:
            name, _, _value = arg.partition("=")
            if _SECRET_ASSIGN.match(name):
                out.append(f"{name}={REDACTED}")
                continue
        elif _SECRET_OPT.match(arg):
            redact_next = True
        out.append(arg)
    return out


def check_pid(pid: int) -> None:
    """Fail with one clear line when `pid` is not a live process we may inspect."""
    if not 0 < pid <= PID_MAX_LIMIT:
        raise QprofError(f"{pid} is not a valid pid: give the pid of a running process (see `pgrep`)")
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        raise QprofError(f"no process with pid {pid}: check it with `ps -p {pid}`") from None
    except PermissionError:
        raise QprofError(f"not allowed to inspect pid {pid}: run qprof as root "
                         "(perf needs CAP_PERFMON and CAP_SYS_PTRACE for other users' processes)") from None
    if is_zombie(pid):
        raise QprofError(f"pid {pid} has already exited (zombie): attach while it runs")


class ExitWatch:
    """Whether targets still run. A pidfd becomes readable when its process exits (a zombie has),
    which poll(2) answers without the /proc/PID/stat read `is_alive` needs (a multi-threaded target's
    stat sums all its threads); a pidfd also outlives a reused pid, and the collector sleeps on the
    pidfds of the processes still running (`waiting`), so an exit wakes it at once. Where pidfd_open
    is refused (kernels before 5.3) it asks `is_alive`."""

    def __init__(self) -> None:
        self._fds: dict[int, int | None] = {}  # pid -> its pidfd; -1: seen gone; None: no pidfd

    def alive(self, pid: int) -> bool:
        if pid not in self._fds:
            try:
                self._fds[pid] = os.pidfd_open(pid)
            except ProcessLookupError:
                self._fds[pid] = -1
            except OSError:  # no pidfd here
                self._fds[pid] = None
        fd = self._fds[pid]
        if fd is None:
            return is_alive(pid)
        if fd >= 0 and select.select([fd], [], [], 0)[0]:  # exited: it stays so, asked no more
            os.close(fd)
            self._fds[pid] = fd = -1
        return fd >= 0

    def waiting(self, pids: Iterable[int]) -> list[int] | None:
        """The pidfds of these processes that still run (readable at their exit), or None when one of
        them has no pidfd: its exit is seen only by asking again."""
        fds = []
        for pid in pids:
            if self.alive(pid):
                fd = self._fds[pid]
                if fd is None:
                    return None
                fds.append(fd)
        return fds

    def close(self) -> None:
        for fd in self._fds.values():
            if fd is not None and fd >= 0:
                os.close(fd)
        self._fds.clear()

    def __enter__(self) -> "ExitWatch":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def parent_of(pid: int) -> int | None:
    """A process's parent pid (None: gone)."""
    stat = read_proc(f"/proc/{pid}/stat")
    try:
        return int(stat_fields(stat)[1][1]) if stat is not None else None
    except (IndexError, ValueError):
        return None


DELETED = " (deleted)"  # what /proc/PID/maps (and perf) append to a mapped file's path once it is unlinked


@dataclass(frozen=True)
class MappedFile:
    """One executable mapping of a file, as /proc/PID/maps shows it (the reader's view of the path)."""

    name: str  # the path as maps and perf name it, " (deleted)" kept
    start: int
    end: int

    @property
    def deleted(self) -> bool:
        return self.name.endswith(DELETED)

    @property
    def path(self) -> str:
        """The path in the process's mount namespace, without the deleted mark."""
        return self.name.removesuffix(DELETED)

    def map_files(self, pid: int) -> str:
        """The kernel's link to the mapped file itself, readable (as root) when the file is deleted or
        lives in another mount namespace: /proc/PID/map_files/START-END, hex without leading zeros."""
        return f"/proc/{pid}/map_files/{self.start:x}-{self.end:x}"


def parse_maps(text: str) -> list[MappedFile]:
    """The executable file mappings of a maps text, first one of each file; lines that are not one are
    skipped (maps of a process that is exiting can be cut short)."""
    seen: dict[str, MappedFile] = {}
    for line in text.splitlines():
        parts = line.split(None, 5)
        if len(parts) != 6 or "x" not in parts[1] or not parts[5].startswith("/"):
            continue
        lo, dash, hi = parts[0].partition("-")
        try:
            start, end = int(lo, 16), int(hi, 16)
        except ValueError:
            continue
        if dash and start < end:
            seen.setdefault(parts[5], MappedFile(parts[5], start, end))
    return list(seen.values())


def mapped_files(pid: int) -> list[MappedFile]:
    """The files mapped executable into the process (none once it is gone)."""
    return parse_maps(read_proc(f"/proc/{pid}/maps") or "")


def vm_size(pid: int) -> int | None:
    """The process's virtual memory size in bytes (/proc/PID/stat's vsize), None once it is gone."""
    stat = read_proc(f"/proc/{pid}/stat", one_record=True)
    fields = stat_fields(stat)[1] if stat else []
    return int(fields[20]) if len(fields) > 20 and fields[20].isdigit() else None


def mapped_objects(pid: int) -> list[str]:
    """Files mapped executable into the process: the binary and its shared libraries (as perf names them)."""
    return [m.name for m in mapped_files(pid)]


def ns_pid(status: str | None) -> int | None:
    """The process's pid in its own (innermost) pid namespace: the last NSpid field of /proc/PID/status,
    the number a JIT names its /tmp/perf-PID.map with. None when the line is missing or malformed."""
    for line in (status or "").splitlines():
        if line.startswith("NSpid:"):
            fields = line.split()[1:]
            return int(fields[-1]) if fields and all(f.isdigit() for f in fields) else None
    return None


def target_info(pid: int) -> Target:
    """Identity of a target for the archive (no environment is read); its objects, which only the
    collectors describe (collectors.elf), are left to them: mapped_objects(pid)."""
    raw = read_proc(f"/proc/{pid}/cmdline") or ""
    argv = [a for a in raw.split("\0") if a]
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        exe = None
    return Target(pid, (read_proc(f"/proc/{pid}/comm") or "").strip(), exe=exe, cmdline=redact_cmdline(argv),
                  threads={t.tid: t.comm for t in thread_times(pid)}, cgroup=[str(c) for c in cgroups_of(pid)])


def thread_times(pid: int, before: list[ThreadReading] | None = None) -> list[ThreadReading]:
    """Cumulative CPU and run-queue time per thread, read now; empty once the process is gone. `before`:
    the last reading's; a thread in the same state that has not run since (its schedstat stands still)
    switched no context and is in the same system call: those two files are not read again (most of a
    runtime's threads sleep between two readings)."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    last = {r.tid: r for r in before or ()}
    out: list[ThreadReading] = []
    for t in tids:
        stat = read_proc(f"/proc/{pid}/task/{t}/stat", one_record=True)
        if stat is None:
            continue
        comm, f = stat_fields(stat)
        sched = (read_proc(f"/proc/{pid}/task/{t}/schedstat", one_record=True) or "").split()
        on_cpu = int(sched[0]) / 1e9 if len(sched) >= 2 else None  # ns on a CPU
        run_delay = int(sched[1]) / 1e9 if len(sched) >= 2 else None  # ns runnable but waiting for one
        prev = last.get(int(t))
        if prev is not None and on_cpu is not None and (prev.on_cpu_s, prev.run_delay_s, prev.state) == \
                (on_cpu, run_delay, f[0]):
            syscall, voluntary, involuntary = prev.syscall, prev.voluntary, prev.involuntary
        else:
            # a running task's syscall file says "running" (task_current_syscall cannot stop it): not read
            sc = ["running"] if f[0] == "R" else \
                (read_proc(f"/proc/{pid}/task/{t}/syscall", one_record=True) or "").split()
            syscall = sc[0] if sc else None
            voluntary, involuntary = _switches(read_proc(f"/proc/{pid}/task/{t}/status", one_record=True))
        out.append(ThreadReading(
            int(t), comm, utime_s=int(f[11]) / CLK_TCK, stime_s=int(f[12]) / CLK_TCK, state=f[0],
            on_cpu_s=on_cpu, run_delay_s=run_delay, syscall=syscall, cpu=int(f[36]) if len(f) > 36 else -1,
            voluntary=voluntary, involuntary=involuntary))
    return out


def _switches(status: str | None) -> tuple[int | None, int | None]:
    """(voluntary, nonvoluntary) context switches from a task's /proc status, None when absent. The two
    lines end the file: found by search, not by splitting its ~60 lines (4 times a second per thread)."""
    if not status:
        return None, None
    return _status_count(status, "\nvoluntary_ctxt_switches:"), _status_count(status, "\nnonvoluntary_ctxt_switches:")


def _status_count(status: str, key: str) -> int | None:
    at = status.rfind(key)
    if at < 0:
        return None
    end = status.find("\n", at + len(key))
    value = status[at + len(key):end if end >= 0 else len(status)].strip()
    return int(value) if value.isdigit() else None


# the child cgroup `--scope cgroup` moves targets into: qprof-sample-<owner pid>-<owner start ticks>-<n>
SAMPLING_CGROUP_PREFIX = "qprof-sample-"
SAMPLING_CGROUP_NAME = re.compile(re.escape(SAMPLING_CGROUP_PREFIX) + r"(\d+)-(\d+)-\d+$")


def outer_path(path: str) -> str:
    """A cgroup path without qprof's sampling child (collectors.perfcgroup): where the quota lives."""
    head, _, leaf = path.rstrip("/").rpartition("/")
    return (head or "/") if SAMPLING_CGROUP_NAME.match(leaf) else path


def _cpu_cgroup(cgroups: list[CgroupLine]) -> tuple[str, str] | None:
    """(version, path) of the cgroup that governs the process's CPU time: the v1 cpu controller's,
    else the v2 one's (qprof's own sampling child holds no quota: its parent's)."""
    v2 = None
    for c in cgroups:
        if "cpu" in c.controllers:
            return "v1", outer_path(c.path)
        if c.hierarchy == 0:
            v2 = outer_path(c.path)
    return ("v2", v2) if v2 is not None else None


def _kv(text: str | None) -> dict[str, int]:
    out = {}
    for line in (text or "").splitlines():
        k, _, v = line.partition(" ")
        if v.strip().lstrip("-").isdigit():
            out[k] = int(v)
    return out


def cgroup_cpu(cgroups: list[CgroupLine]) -> CgroupReading | None:
    """CPU quota and throttling of the cgroup a process is in (v1 cpu controller or v2 cpu.max)."""
    found = _cpu_cgroup(cgroups)
    if found is None:
        return None
    version, path = found
    if version == "v1":
        base = f"/sys/fs/cgroup/cpu{path}"
        quota = int((read_proc(f"{base}/cpu.cfs_quota_us") or "-1").strip() or -1)
        period = int((read_proc(f"{base}/cpu.cfs_period_us") or "100000").strip() or 100000)
        stat = _kv(read_proc(f"{base}/cpu.stat"))
        throttled = stat.get("throttled_time", 0) / 1e9
    else:
        base = next((f"{root}{path}" for root in _V2_ROOTS if os.path.exists(f"{root}{path}/cpu.stat")),
                    f"/sys/fs/cgroup{path}")
        q, _, per = (read_proc(f"{base}/cpu.max") or "max 100000").strip().partition(" ")
        quota, period = (-1 if q == "max" else int(q)), int(per or 100000)
        stat = _kv(read_proc(f"{base}/cpu.stat"))
        throttled = stat.get("throttled_usec", 0) / 1e6
    return CgroupReading(stat.get("nr_periods", 0), stat.get("nr_throttled", 0), throttled, path=path,
                         quota_cores=quota / period if quota > 0 and period > 0 else None, version=version)


def cpu_list(text: str | None) -> list[int] | None:
    """'0-3,6' -> [0, 1, 2, 3, 6]; None for text that is not a CPU list."""
    if not text or not text.strip():
        return None
    out: list[int] = []
    try:
        for part in text.strip().split(","):
            lo, _, hi = part.partition("-")
            out += range(int(lo), int(hi or lo) + 1)
    except ValueError:
        return None
    return out


def _pressure(text: str | None) -> Pressure | None:
    """A PSI file's cumulative stall times (`some` and `full` lines; a kernel may give only `some`)."""
    found: dict[str, float] = {}
    for line in (text or "").splitlines():
        kind, _, rest = line.partition(" ")
        total = next((kv[6:] for kv in rest.split() if kv.startswith("total=")), None)
        if kind in ("some", "full") and total and total.isdigit():
            found[kind] = int(total) / 1e6
    return Pressure(found.get("some"), found.get("full")) if found else None


_V2_ROOTS = ("/sys/fs/cgroup", "/sys/fs/cgroup/unified")


def cpu_limits(pid: int, cgroups: list[CgroupLine]) -> Limits:
    """What bounds the process's CPU beside a quota: its affinity, its cpuset's CPUs, and the CPU
    pressure (PSI) of its v2 cgroup with how many processes share that cgroup (one: qprof's child
    of its own, collectors.perfcgroup)."""
    cpus_allowed: list[int] | None = None
    cpuset: list[int] | None = None
    pressure: Pressure | None = None
    procs: int | None = None
    try:  # the affinity as a system call: /proc/PID/status is formatted whole for its one line
        cpus_allowed = sorted(os.sched_getaffinity(pid))
    except OSError:
        pass
    for c in cgroups:
        if "cpuset" in c.controllers:
            cpuset = cpu_list(read_proc(f"/sys/fs/cgroup/cpuset{c.path}/cpuset.effective_cpus"))
        elif c.hierarchy == 0:
            # the cpuset is the outer cgroup's (qprof's child has no controller); the pressure is of the
            # cgroup it is in, qprof's child included: that child holds only this target
            path, outer = c.path, outer_path(c.path)
            for root in _V2_ROOTS:
                base = f"{root}{path.rstrip('/')}"
                if cpuset is None and os.path.exists(f"{root}{outer.rstrip('/')}/cpuset.cpus.effective"):
                    cpuset = cpu_list(read_proc(f"{root}{outer.rstrip('/')}/cpuset.cpus.effective"))
                if path != "/" and os.path.exists(f"{base}/cpu.pressure"):
                    pressure = _pressure(read_proc(f"{base}/cpu.pressure"))
                    procs = len((read_proc(f"{base}/cgroup.procs") or "").split())
                    break
    return Limits(cpus_allowed, cpuset, pressure, procs)


def reading(pids: list[int], before: ProcReading | None = None) -> ProcReading:
    """One timestamped /proc reading for all targets (a line of proc.jsonl, without the byte totals
    the session adds), with the host's CPU pressure (PSI, absent on kernels without it) and each
    CPU's idle time: whether the CPUs a stalled target may use were saturated, or idle while it
    waited (attribution.verdict). A target gone has no threads, no cgroup and no limits. `before`: the
    last reading, whose threads that have not run since are read in part (thread_times)."""
    t, mono = time.time(), time.monotonic()
    threads: dict[int, list[ThreadReading]] = {}
    cgroups: dict[int, CgroupReading] = {}
    limits: dict[int, Limits] = {}
    for p in pids:
        threads[p] = thread_times(p, before.threads.get(p) if before is not None else None)
        lines = cgroups_of(p)
        cg = cgroup_cpu(lines)
        if cg is not None:
            cgroups[p] = cg
        limits[p] = cpu_limits(p, lines)
    return ProcReading(mono, threads, t=t, cgroups=cgroups, limits=limits,
                       pressure=_pressure(read_proc("/proc/pressure/cpu")),
                       cpu_idle={int(cpu): (v[3] + v[4]) / CLK_TCK for cpu, v in cpu_ticks().items() if len(v) > 4})


def cpu_ticks() -> dict[str, list[int]]:
    """Each CPU's /proc/stat line since boot, in clock ticks (user nice system idle iowait irq
    softirq steal ...), by CPU number; {} if unreadable."""
    out: dict[str, list[int]] = {}
    for ln in (read_proc("/proc/stat") or "").splitlines():
        name, _, cols = ln.partition(" ")
        if name.startswith("cpu") and name[3:].isdigit():
            try:
                out[name[3:]] = [int(c) for c in cols.split()]
            except ValueError:
                continue
    return out


def descendants(pid: int) -> list[int]:
    """`pid` and every process it started that still runs (a forking server's workers; bpftrace under
    the `unshare` and `sh` that start it)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children", encoding="ascii") as f:
                    todo += [int(c) for c in f.read().split()]
        except OSError:
            continue
    return out
