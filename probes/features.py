"""What the running kernel and host let qprof do, detected at run time.

Attach checks these before touching a target so that a missing facility is one
clear line, not a perf error deep in a log.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from qprof.cachefiles import CACHE_HOME, read_json, write_json
from qprof.errors import QprofError

CAP_SYS_PTRACE = 19
CAP_SYS_ADMIN = 21
CAP_PERFMON = 38


def effective_capabilities() -> int:
    try:
        with open("/proc/self/status", encoding="utf-8") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return int(line.split()[1], 16)
    except (OSError, ValueError):
        pass
    return 0


def perf_event_paranoid() -> int | None:
    try:
        with open("/proc/sys/kernel/perf_event_paranoid", encoding="utf-8") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def require_sampling_privileges() -> None:
    """Sampling other processes' kernel stacks needs root or CAP_PERFMON (or CAP_SYS_ADMIN) with CAP_SYS_PTRACE."""
    if os.geteuid() == 0:
        return
    caps = effective_capabilities()

    def has(bit: int) -> bool:
        return bool(caps >> bit & 1)

    missing = []
    if not (has(CAP_PERFMON) or has(CAP_SYS_ADMIN)):
        missing.append("CAP_PERFMON")
    if not has(CAP_SYS_PTRACE):
        missing.append("CAP_SYS_PTRACE")
    if missing:
        raise QprofError(f"not root and missing {', '.join(missing)} "
                         f"(perf_event_paranoid={perf_event_paranoid()}): run qprof as root, e.g. with sudo")


MIN_PERF = (5, 10)  # perf record -D -1 with --control fifo:ctl,ack
MIN_BPFTRACE = (0, 17)  # the probe scripts' syntax and its JSON output


def version_tuple(text: str | None) -> tuple[int, ...] | None:
    return tuple(int(x) for x in text.split(".")) if text else None


def require_perf() -> str:
    """Path of a working perf binary of a version qprof can drive; one clear line otherwise
    (Debian's wrapper without a matching perf_X.Y fails here too: it prints no version)."""
    path = shutil.which("perf")
    if path is None:
        raise QprofError("perf not found on PATH: install it (Debian: apt-get install linux-perf)")
    version = tool_version("perf")
    if version is None:
        raise QprofError(f"{path} does not run or print its version (`perf --version`): install "
                         "the perf matching this kernel (Debian: apt-get install linux-perf)")
    if version_tuple(version) < MIN_PERF:  # type: ignore[operator]
        raise QprofError(f"perf {version} is too old: qprof needs perf {'.'.join(map(str, MIN_PERF))} "
                         "or newer (Debian: apt-get install linux-perf)")
    return path


def bpftrace_problem() -> str | None:
    """Why qprof's probes cannot run with the bpftrace on PATH, or None when they can."""
    path = shutil.which("bpftrace")
    if path is None:
        return "bpftrace not found (Debian: apt-get install bpftrace)"
    version = tool_version("bpftrace")
    if version is None:
        return f"{path} does not run or print its version (`bpftrace --version`)"
    if version_tuple(version) < MIN_BPFTRACE:  # type: ignore[operator]
        return (f"bpftrace {version} is too old: qprof's probes need "
                f"{'.'.join(map(str, MIN_BPFTRACE))} or newer")
    return None


def tool_version(tool: str) -> str | None:
    """`tool --version`'s version number, or None when the tool is absent or broken."""
    path = shutil.which(tool)
    out = version_output(path) if path is not None else ""
    m = re.search(r"v?(\d+\.\d+(?:\.\d+)?)", out)
    return m.group(1) if m else None


VERSIONS = CACHE_HOME / "versions.json"


def version_output(path: str) -> str:
    """`path --version`'s standard output ('' when it cannot run), asked once per binary: remembered in
    this process and in ~/.cache/qprof/versions.json by the file's identity (device, inode, size,
    mtime), so another file at the path, or the same one changed, is asked again. Every attach asked
    clang's (the probes' compile key), bpftrace's and perf's: ~50 ms of CPU."""
    try:
        st = os.stat(path)
    except OSError:
        return ""
    return _version_output(path, (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))


@lru_cache(maxsize=None)
def _version_output(path: str, identity: tuple[int, int, int, int]) -> str:
    key = f"{path}:{':'.join(map(str, identity))}"
    known = read_json(VERSIONS)
    if isinstance(known.get(key), str):
        return str(known[key])
    try:
        r = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return ""
    if r.returncode == 0:
        known = {k: v for k, v in known.items() if not k.startswith(path + ":")}  # its older identities
        known[key] = r.stdout
        write_json(VERSIONS, known)
    return r.stdout


def bpftrace_version() -> str | None:
    return tool_version("bpftrace")


_PMU_DIR = "/sys/bus/event_source/devices"
_NR_PERF_EVENT_OPEN = 298  # x86_64


def _hardware_cycles() -> bool:
    """Can this host count CPU cycles? (VMs often expose no PMU: perf then falls back to cpu-clock.)"""
    import ctypes

    attr = (ctypes.c_uint8 * 128)()
    ctypes.c_uint32.from_buffer(attr, 0).value = 0  # PERF_TYPE_HARDWARE
    ctypes.c_uint32.from_buffer(attr, 4).value = 128  # size
    ctypes.c_uint64.from_buffer(attr, 8).value = 0  # PERF_COUNT_HW_CPU_CYCLES
    ctypes.c_uint64.from_buffer(attr, 40).value = 1 | 1 << 5  # disabled, exclude_kernel
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.syscall(_NR_PERF_EVENT_OPEN, ctypes.byref(attr), 0, -1, -1, 0)
    if fd >= 0:
        os.close(fd)
        return True
    return False


def kernel_features() -> dict[str, str | int | float | bool | None]:
    """What this kernel offers qprof, detected now (recorded in every run archive).

    kprobes and fentry are not used by the shipped probes (tracepoints are the
    portable floor); they are reported so users know what their own probes can use.
    """
    return {
        "kernel_btf": os.path.exists("/sys/kernel/btf/vmlinux"),
        "tracefs_mounted": os.path.exists("/sys/kernel/tracing/events"),
        "kprobes": os.path.isdir(f"{_PMU_DIR}/kprobe"),
        "uprobes": os.path.isdir(f"{_PMU_DIR}/uprobe"),
        "hardware_cycles": _hardware_cycles(),
        "perf_event_paranoid": perf_event_paranoid(),
        "bpftrace": bpftrace_version(),
    }


@dataclass(frozen=True)
class CgroupLine:
    """One line of /proc/PID/cgroup: a hierarchy's id, its controllers, the process's path in it. On
    cgroup v2 the one line is `0::/path` (id 0, no controllers); a v1 hierarchy names its controllers
    (`4:cpu,cpuacct:/path`) or itself (`1:name=systemd:/path`)."""

    hierarchy: int
    controllers: tuple[str, ...]
    path: str

    @property
    def unified(self) -> bool:
        """The cgroup v2 line."""
        return self.hierarchy == 0 and not self.controllers

    def __str__(self) -> str:
        return f"{self.hierarchy}:{','.join(self.controllers)}:{self.path}"


def parse_cgroups(text: str) -> list[CgroupLine]:
    """The lines of a /proc/PID/cgroup text; a line not of that form is skipped."""
    out = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3 and parts[0].isdigit():
            out.append(CgroupLine(int(parts[0]), tuple(c for c in parts[1].split(",") if c), parts[2]))
    return out


def cgroups_of(pid: int) -> list[CgroupLine]:
    """The cgroups the process is in, one per hierarchy; [] once it is gone. The one reader of
    /proc/PID/cgroup: the sampling cgroup's setup, the /proc readings (quota, cpuset, pressure) and
    the target's record all go through it."""
    try:
        text = Path(f"/proc/{pid}/cgroup").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    return parse_cgroups(text)


@dataclass(frozen=True)
class Hierarchy:
    """The cgroup hierarchy perf resolves `-G NAME` against (tools/perf/util/cgroup.c does the same lookup)."""

    mount: Path
    version: str  # "v1" (a hierarchy with perf_event) or "v2"

    def path_of(self, pid: int) -> str | None:
        """The pid's cgroup path in this hierarchy, or None (gone, or not in it)."""
        for line in cgroups_of(pid):
            if (self.version == "v1" and "perf_event" in line.controllers) or (self.version == "v2" and line.unified):
                return line.path
        return None


@dataclass(frozen=True)
class Mount:
    """One line of the mount table: where, what filesystem type, with which options."""

    where: Path
    fstype: str
    options: tuple[str, ...]


def mount_table(text: str | None = None) -> list[Mount]:
    """/proc/self/mounts (or `text` in its format); [] when it cannot be read. Short lines are skipped."""
    if text is None:
        try:
            text = Path("/proc/self/mounts").read_text()
        except OSError:
            return []
    return [Mount(Path(f[1]), f[2], tuple(f[3].split(","))) for f in (ln.split() for ln in text.splitlines())
            if len(f) >= 4]


def pressure_hierarchy(mounts: str | None = None) -> Hierarchy | None:
    """The cgroup2 mount whose cgroups keep CPU pressure (PSI), or None (no cgroup2, or no PSI)."""
    for m in mount_table(mounts):
        if m.fstype == "cgroup2" and (mounts is not None or (m.where / "cpu.pressure").exists()):
            return Hierarchy(m.where, "v2")
    return None


def find_hierarchy(mounts: str | None = None) -> Hierarchy | None:
    """The perf_event v1 hierarchy if one is mounted, else the cgroup2 mount, else None."""
    v2 = None
    for m in mount_table(mounts):
        if m.fstype == "cgroup" and "perf_event" in m.options:
            return Hierarchy(m.where, "v1")
        if m.fstype == "cgroup2" and v2 is None:
            v2 = Hierarchy(m.where, "v2")
    return v2
