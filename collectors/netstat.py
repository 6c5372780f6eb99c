"""Network facts read without probes: UDP MIB counters, qdiscs, socket buffers, sysctls, softirq counts.

Read at the start and the end of a run; differences are the run's. Counters
are read in each target's own network namespace (/proc/PID/net, nsenter),
so targets in other namespaces are measured where they live.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from typing import Any

from qprof.collectors import procfs
from qprof.probes.sockets import snmp_table, socket_fds

SYSCTLS = ("net/core/rmem_default", "net/core/rmem_max", "net/core/wmem_default", "net/core/wmem_max",
           "net/ipv4/udp_mem", "net/ipv4/udp_rmem_min", "net/ipv4/udp_wmem_min")
_SKMEM = re.compile(r"skmem:\(([^)]*)\)")
_INODE = re.compile(r"\bino:(\d+)")
_SKMEM_KEYS = {"r": "rmem_alloc", "rb": "rcvbuf", "t": "wmem_alloc", "tb": "sndbuf", "d": "drops"}


def netns_id(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None


def udp_mib(pid: int) -> dict[str, int]:
    """Udp and Udp6 counters of the target's network namespace."""
    out: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/net/snmp", encoding="ascii") as f:
            out.update({k: int(v) for k, v in snmp_table(f.read(), "Udp:").items()})
    except (OSError, ValueError):
        pass
    try:
        with open(f"/proc/{pid}/net/snmp6", encoding="ascii") as f:
            for ln in f:
                k, _, v = ln.partition(" ")
                if k.startswith("Udp6"):
                    out[k] = int(v)
    except (OSError, ValueError):
        pass
    return out


def sysctls() -> dict[str, str]:
    out = {}
    for name in SYSCTLS:
        try:
            with open(f"/proc/sys/{name}", encoding="ascii") as f:
                out[name.replace("/", ".")] = " ".join(f.read().split())
        except OSError:
            continue
    return out


def parse_ss(text: str, owners: dict[str, list[tuple[int, int]]]) -> list[dict[str, Any]]:
    """Sockets named in `owners` (inode -> (pid, fd) holding it) from `ss -uamneH` output (a socket
    line with its inode, then its skmem line)."""
    socks: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    for line in text.splitlines():
        m = _SKMEM.search(line)
        if m and current is not None:
            for item in m.group(1).split(","):
                key = item.rstrip("0123456789")
                if key in _SKMEM_KEYS and item[len(key):].isdigit():
                    current[_SKMEM_KEYS[key]] = int(item[len(key):])
            continue
        if not line or line[0].isspace():
            continue
        parts = line.split()
        ino = _INODE.search(line)
        mine = owners.get(ino.group(1), []) if ino else []
        current = None
        if len(parts) >= 4 and mine:
            current = {"local": parts[3], "peer": parts[4] if len(parts) > 4 else "",
                       "port": _port(parts[3]), "pids": sorted({p for p, _ in mine}),
                       "fds": sorted({fd for _, fd in mine})}
            socks.append(current)
    return socks


def _port(addr: str) -> int | None:
    tail = addr.rsplit(":", 1)[-1]
    return int(tail) if tail.isdigit() else None


def udp_sockets(pids: list[int]) -> tuple[list[dict[str, Any]], str | None]:
    """UDP sockets of the targets with buffer sizes and drop counters, per network namespace."""
    ss = shutil.which("ss")
    if ss is None:
        return [], "ss not found (Debian: apt-get install iproute2)"
    by_ns: dict[str, list[int]] = {}
    for p in pids:
        ns = netns_id(p)
        if ns is not None:
            by_ns.setdefault(ns, []).append(p)
    socks: list[dict[str, Any]] = []
    mine = netns_id(os.getpid())
    for ns, members in by_ns.items():
        # the targets' own fd tables name their sockets: `ss -p` would read every process's (~20 ms)
        owners: dict[str, list[tuple[int, int]]] = {}
        for p in members:
            for inode, fds in socket_fds(p).items():
                owners.setdefault(inode, []).extend((p, fd) for fd in fds)
        cmd = [ss, "-uamneH"]
        if ns != mine:
            cmd = ["nsenter", f"--net=/proc/{members[0]}/ns/net", *cmd]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.SubprocessError) as e:
            return socks, f"ss failed: {e}"
        socks += parse_ss(r.stdout, owners)
    return socks, None


def softirq_counts() -> dict[str, list[int]]:
    """NET_RX/NET_TX softirq runs per CPU since boot (/proc/softirqs)."""
    out: dict[str, list[int]] = {}
    try:
        with open("/proc/softirqs", encoding="ascii") as f:
            for ln in f:
                name, _, rest = ln.partition(":")
                if name.strip() in ("NET_RX", "NET_TX"):
                    out[name.strip()] = [int(x) for x in rest.split()]
    except (OSError, ValueError):
        pass
    return out


def softirq_seconds() -> dict[str, float]:
    """Per-CPU time spent in softirqs since boot (/proc/stat; tick-sampled unless the kernel
    has IRQ_TIME_ACCOUNTING): the probe-free measure of softirq load."""
    return {cpu: t[6] / procfs.CLK_TCK for cpu, t in procfs.cpu_ticks().items() if len(t) > 6}


_QDISC_KEYS = ("bytes", "packets", "drops", "overlimits", "requeues", "backlog", "qlen")


def qdiscs(pid: int) -> list[dict[str, Any]]:
    """Queueing disciplines of the target's network namespace with their counters (`tc -s qdisc`):
    drops and overlimits there mean a queue or shaper on the way out was full or holding packets."""
    tc = shutil.which("tc")
    if tc is None:
        return []
    cmd = [tc, "-s", "-j", "qdisc", "show"]
    if netns_id(pid) != netns_id(os.getpid()):
        cmd = ["nsenter", f"--net=/proc/{pid}/ns/net", *cmd]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
        found = json.loads(r.stdout or "[]")
    except (OSError, subprocess.SubprocessError, ValueError):
        return []
    return [{"dev": q.get("dev"), "kind": q.get("kind"), "handle": q.get("handle"),
             **{k: q.get(k) for k in _QDISC_KEYS}} for q in found if isinstance(q, dict) and q.get("dev") != "lo"]


def netns_qdiscs(pids: list[int]) -> dict[str, dict[str, Any]]:
    """The qdiscs of each network namespace the targets live in: {netns: {"pids": [...], "qdiscs": [...]}}."""
    out: dict[str, dict[str, Any]] = {}
    for p in pids:
        ns = netns_id(p)
        if ns is None:
            continue
        if ns not in out:
            out[ns] = {"pids": [], "qdiscs": qdiscs(p)}
        out[ns]["pids"].append(p)
    return out


def snapshot(pids: list[int]) -> dict[str, Any]:
    """Namespace-wide counters and host settings at one moment (sockets are tracked separately)."""
    mibs: dict[str, Any] = {}
    for p in pids:
        ns = netns_id(p)
        if ns is not None and ns not in mibs:
            mibs[ns] = {"pids": [q for q in pids if netns_id(q) == ns], "udp": udp_mib(p)}
    return {"time": time.time(), "udp_mib": mibs, "sysctl": sysctls(), "softirqs": softirq_counts(),
            "softirq_seconds": softirq_seconds()}
