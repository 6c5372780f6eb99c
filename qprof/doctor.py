"""`qprof doctor`: what this host lets qprof do, one line per check, with a fix where there is one.

Read-only: it changes nothing (tracefs is not mounted; bpftrace and perf are
only asked for their versions, and a BPF load is tried only through bpftrace's
own feature listing). The exit status says whether `attach` can run fully (0),
partly (1: sampling works, some probes do not), or not at all (2).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass

from qprof.probes import btf
from qprof.probes.registry import GROUPS
from qprof.probes.features import (CAP_PERFMON, CAP_SYS_ADMIN, CAP_SYS_PTRACE, effective_capabilities,
                                   find_hierarchy, kernel_features, tool_version)

OK, PARTIAL, NONE = 0, 1, 2
@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    needed_for: str = "probes"  # "sampling" failures make attach impossible


def run_checks(pid: int | None = None) -> list[Check]:
    feats = kernel_features()
    caps = effective_capabilities()
    root = os.geteuid() == 0
    checks: list[Check] = []
    has_caps = root or (bool(caps >> CAP_PERFMON & 1) or bool(caps >> CAP_SYS_ADMIN & 1)) and \
        bool(caps >> CAP_SYS_PTRACE & 1)
    checks.append(Check("privileges", has_caps,
                        "root" if root else f"uid {os.geteuid()}, effective capabilities {caps:#x}",
                        "run as root (or grant CAP_PERFMON, CAP_SYS_PTRACE and CAP_BPF)", "sampling"))
    paranoid = feats.get("perf_event_paranoid")
    # an int (the sysctl's value) or None when it could not be read: features.perf_event_paranoid
    checks.append(Check("perf_event_paranoid", root or (isinstance(paranoid, int) and paranoid <= 1),
                        f"{paranoid}", "as root it does not matter; otherwise sysctl kernel.perf_event_paranoid=1",
                        "sampling"))
    perf = tool_version("perf")
    checks.append(Check("perf", perf is not None, f"version {perf}" if perf else "not found",
                        "apt-get install linux-perf", "sampling"))
    checks.append(Check("hardware cycle counter", bool(feats.get("hardware_cycles")),
                        "available" if feats.get("hardware_cycles") else "not available (VM?)",
                        "none needed: qprof samples with the cpu-clock software event", "information"))
    bpft = tool_version("bpftrace")
    checks.append(Check("bpftrace", bpft is not None, f"version {bpft}" if bpft else "not found",
                        "apt-get install bpftrace"))
    checks.append(Check("bpftool", shutil.which("bpftool") is not None,
                        "found" if shutil.which("bpftool") else "not found",
                        "apt-get install bpftool (BTF lookups, probe cost)"))
    checks.append(Check("kernel BTF", bool(feats.get("kernel_btf")), "/sys/kernel/btf/vmlinux",
                        "a kernel built with CONFIG_DEBUG_INFO_BTF"))
    checks.append(Check("tracefs", True,
                        "mounted" if feats.get("tracefs_mounted") else
                        "not mounted on the host: qprof mounts it only inside bpftrace's own mount namespace",
                        needed_for="information"))
    checks.append(Check("uprobes", bool(feats.get("uprobes")), "uprobe PMU present" if feats.get("uprobes")
                        else "no uprobe PMU", "a kernel with CONFIG_UPROBE_EVENTS (needed by --probes crypto)"))
    checks.append(Check("kprobes", bool(feats.get("kprobes")), "kprobe PMU present" if feats.get("kprobes")
                        else "not built (CONFIG_KPROBES unset): qprof's probes use tracepoints instead",
                        needed_for="information"))
    checks.append(Check("fentry/fexit", False, "not used by qprof's probes: BTF tracepoints (tp_btf) instead",
                        needed_for="information"))
    clang, headers = shutil.which("clang"), os.path.exists("/usr/include/bpf/bpf_helpers.h")
    checks.append(Check("clang and libbpf headers", bool(clang and headers),
                        "found (the packetio probes are compiled once per kernel)" if clang and headers else
                        f"missing {' and '.join(n for n, ok in (('clang', clang), ('libbpf-dev', headers)) if not ok)}",
                        "apt-get install clang libbpf-dev (needed by the default packetio probes)"))
    h = find_hierarchy()
    checks.append(Check("sampling cgroup", h is not None,
                        f"samples follow the targets' own CPU time through {h.version} {h.mount}" if h
                        else "no cgroup hierarchy: attach samples system-wide, which misplaces work that "
                             "starts when a target wakes",
                        "mount cgroup2 (or a v1 perf_event hierarchy)", "information"))
    try:
        for group, tps in ((name, g.tracepoints) for name, g in GROUPS.items() if g.tracepoints):
            missing = [tp for tp in tps if not btf.tracepoint_exists(tp)]
            checks.append(Check(f"probes: {group}", not missing,
                                "all tracepoints present" if not missing else f"missing {', '.join(missing)}",
                                "a newer kernel (sock_*_length need Linux 6.3+)" if missing else ""))
    except btf.BTFUnavailable as e:
        checks.append(Check("probe tracepoints", False, str(e), "install bpftool; a kernel with BTF"))
    if pid is not None:
        checks += _target_checks(pid)
    return checks


def _target_checks(pid: int) -> list[Check]:
    from qprof.archive.identity import is_alive
    from qprof.collectors import procfs
    from qprof.collectors import elf
    from qprof.collectors.session import choose_unwind

    out: list[Check] = []
    if not is_alive(pid):
        return [Check(f"pid {pid}", False, "no such process", f"check it with `ps -p {pid}`", "sampling")]
    target = procfs.target_info(pid)
    mode, why = choose_unwind("auto", elf.object_info(target.exe) if target.exe else None)
    out.append(Check(f"pid {pid} unwinding", True, f"{mode}: {why}", needed_for="information"))
    for path in procfs.mapped_objects(pid):
        o = elf.object_info(path)
        debuglink = _has_debuglink(path)
        detail = (f"{o.symbols} symbols, build-id {o.build_id or 'none'}, "
                  f"frame pointers {'yes' if o.frame_pointers else 'no' if o.frame_pointers is False else '?'}"
                  + (", .gnu_debuglink" if debuglink else ""))
        out.append(Check(f"  {os.path.basename(path)}", o.symbols == "symtab", detail,
                         "stripped to exported symbols: install its -dbgsym package for names" if o.symbols != "symtab"
                         else "", "information"))
    return out


def _has_debuglink(path: str) -> bool:
    try:
        r = subprocess.run(["readelf", "-S", "-W", path], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return False
    return ".gnu_debuglink" in r.stdout


def verdict(checks: list[Check]) -> int:
    if any(not c.ok and c.needed_for == "sampling" for c in checks):
        return NONE
    if any(not c.ok and c.needed_for == "probes" for c in checks):
        return PARTIAL
    return OK
