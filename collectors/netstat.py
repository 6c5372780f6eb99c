"""Network facts read without probes: UDP MIB counters, qdiscs, socket buffers, sysctls, softirq counts.

Read at the start and the end of a run; differences are the run's. Counters
are read in each target's own network namespace (/proc/PID/net, netlink sockets made there),
so targets in other namespaces are measured where they live.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass, field

from qprof.archive.model import HostSnapshot, Qdisc, UdpMib
from qprof.collectors import procfs
from qprof.collectors.netns import by_netns
from qprof.collectors.qdiscs import qdiscs as read_qdiscs
from qprof.collectors.sockdiag import INET_DIAG_SKMEMINFO, InetDiag
from qprof.probes.sockets import snmp_table, socket_fds

SYSCTLS = ("net/core/rmem_default", "net/core/rmem_max", "net/core/wmem_default", "net/core/wmem_max",
           "net/ipv4/udp_mem", "net/ipv4/udp_rmem_min", "net/ipv4/udp_wmem_min")


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


# struct sk_meminfo slots (include/uapi/linux/sock_diag.h) and the names qprof's records give them
_SKMEM = {0: "rmem_alloc", 1: "rcvbuf", 2: "wmem_alloc", 3: "sndbuf", 8: "drops"}


def skmem(raw: bytes) -> dict[str, int]:
    """INET_DIAG_SKMEMINFO's u32 slots by name; slots the kernel did not send are left out."""
    return {name: int.from_bytes(raw[4 * i:4 * i + 4], "little")
            for i, name in _SKMEM.items() if len(raw) >= 4 * i + 4}


@dataclass(frozen=True)
class SocketReading:
    """One UDP socket of the targets at one reading: addresses as `ss -n` prints them, its owners, and
    its buffers and drop counter (the sk_meminfo slots the kernel sent)."""

    local: str
    peer: str
    port: int | None
    pids: list[int]
    fds: list[int]
    counters: dict[str, int] = field(default_factory=dict)


class UdpSocketTable:
    """The targets' UDP sockets with buffer sizes and drop counters, read through sock_diag in each
    network namespace they live in (one netlink socket per namespace for the run, no process forked:
    `ss` cost ~10 ms of CPU a reading). Owners come from the targets' own fd tables."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = pids
        self._diags: dict[str, InetDiag] = {}

    def read(self) -> tuple[list[SocketReading], str | None]:
        """(sockets, error)."""
        socks: list[SocketReading] = []
        for ns, members in by_netns(self.pids).items():
            owners: dict[str, list[tuple[int, int]]] = {}
            for p in members:
                for inode, fds in socket_fds(p).items():
                    owners.setdefault(inode, []).extend((p, fd) for fd in fds)
            try:
                diag = self._diags.get(ns)
                if diag is None:
                    diag = self._diags[ns] = InetDiag(members[0])
                found = diag.dump(socket.IPPROTO_UDP, (INET_DIAG_SKMEMINFO,))
            except OSError as e:
                return socks, f"sock_diag in {ns}: {e.strerror or e}"
            for d in found:
                mine = owners.get(str(d.inode))
                if not mine:
                    continue
                local, peer = diag.addresses(d)
                socks.append(SocketReading(local, peer, d.local_port or None, sorted({p for p, _ in mine}),
                                           sorted({fd for _, fd in mine}),
                                           skmem(d.attrs.get(INET_DIAG_SKMEMINFO, b""))))
        return socks, None

    def close(self) -> None:
        for d in self._diags.values():
            d.close()
        self._diags.clear()


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


def softirq_seconds() -> dict[int, float]:
    """Per-CPU time spent in softirqs since boot (/proc/stat; tick-sampled unless the kernel
    has IRQ_TIME_ACCOUNTING): the probe-free measure of softirq load."""
    return {int(cpu): t[6] / procfs.CLK_TCK for cpu, t in procfs.cpu_ticks().items() if len(t) > 6}


def qdiscs(pid: int) -> tuple[Qdisc, ...]:
    """Queueing disciplines of the target's network namespace with their counters (what `tc -s qdisc`
    prints, from rtnetlink: collectors.qdiscs): drops and overlimits there mean a queue or shaper on the
    way out was full or holding packets. () when they cannot be read (the namespace is gone)."""
    try:
        return tuple(q for q in read_qdiscs(pid) if q.dev != "lo")
    except OSError:
        return ()


@dataclass(frozen=True)
class NamespaceQdiscs:
    pids: list[int]
    qdiscs: tuple[Qdisc, ...]


def netns_qdiscs(pids: list[int]) -> dict[str, NamespaceQdiscs]:
    """The qdiscs of each network namespace the targets live in."""
    return {ns: NamespaceQdiscs(members, qdiscs(members[0])) for ns, members in by_netns(pids).items()}


def snapshot(pids: list[int]) -> HostSnapshot:
    """Namespace-wide counters and host settings at one moment (sockets are tracked separately)."""
    mibs = {ns: UdpMib(members, dict(udp_mib(members[0]))) for ns, members in by_netns(pids).items()}
    # the record holds counts as int | float (an archive's JSON may read either): a list per vector, as read
    softirqs: dict[str, list[int | float]] = {vec: list(cpus) for vec, cpus in softirq_counts().items()}
    return HostSnapshot(softirq_seconds=softirq_seconds(), softirqs=softirqs, sysctl=dict(sysctls()),
                        time=time.time(), udp_mib=mibs)
