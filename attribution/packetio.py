"""Packet I/O efficiency from the probes: batching, GSO/GRO, drops, buffers, softirq.

Turns the raw probe maps of a run (probes.json) into per-process figures a
QUIC maintainer acts on: datagrams per syscall each way, whether GSO/GRO were
enabled on the socket and what the kernel actually did, the ACK ratio
(datagrams received per datagram sent), drops matched to the targets' ports
with their kernel reason, socket buffer sizes against the system defaults, and
network softirq time with the share that ran in the targets' own threads.

Since the default probes count in sampling windows (probes/packetio/windows.py),
counts are estimates with 95% intervals (probes.packetio.estimate) unless the whole
run was counted; every figure carries which it is.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

from qprof.attribution import probemaps
from qprof.probes.packetio.estimate import Estimate, GroupSample
from qprof.archive import schema
from qprof.archive.model import ProbeCost, ProbeRecord, UdpSocket, UnavailableProbe
from qprof.jsonvalue import JsonObject
from qprof.probes.packetio.maps import Windows

_MIB_KEYS = ("InDatagrams", "OutDatagrams", "RcvbufErrors", "SndbufErrors", "InErrors", "NoPorts",
             "MemErrors", "InCsumErrors")


@dataclass(frozen=True)
class SyscallTime:
    """One syscall of one process, from the opt-in `syscalls` probes: calls, time, p50/p99 (bucket midpoints)."""

    calls: int
    total_s: float
    mean_us: float
    p50_us: float | None
    p99_us: float | None

    def to_json(self) -> JsonObject:
        return {"calls": self.calls, "total_s": self.total_s, "mean_us": self.mean_us, "p50_us": self.p50_us,
                "p99_us": self.p99_us}


def _syscall_time(maps: Mapping[str, object], procs: dict[int, "ProcessPacketIO"]) -> None:
    """Per process and syscall: calls, total time, and p50/p99 from the `syscalls` probe group."""
    totals = probemaps.values(maps, "@syscall_total_ns")
    hists = probemaps.histograms(maps, "@syscall_ns")
    for key, n in probemaps.values(maps, "@syscall_calls").items():
        pid_s, _, probe = key.partition(",")
        if not pid_s.isdigit() or int(pid_s) not in procs or not n:
            continue
        name = probe.rsplit("sys_exit_", 1)[-1]
        total = int(totals.get(key, 0))
        h = hists.get(key, probemaps.Histogram())
        procs[int(pid_s)].syscall_time[name] = SyscallTime(
            int(n), round(total / 1e9, 6), round(total / n / 1e3, 3),
            _r((h.quantile(0.5) or 0) / 1e3), _r((h.quantile(0.99) or 0) / 1e3))


@dataclass
class Direction:
    """One direction (tx or rx) of one process or thread."""

    msgs: int = 0
    bytes: int = 0
    dgrams: int = 0
    skbs: int = 0
    mmsg_calls: int = 0
    mmsg_msgs: int = 0
    empty: int = 0  # rx: receive calls that found nothing (EAGAIN)
    errors: int = 0
    offload_skbs: int = 0  # tx: GSO skbs; rx: GRO-coalesced skbs
    offload_socket_msgs: int = 0  # tx: msgs on sockets with UDP_SEGMENT set; rx: with UDP_GRO set
    gro_dgrams: int = 0  # rx: datagrams inside GRO-coalesced skbs

    def finish_rx(self) -> None:
        """Receive side: one skb per message; a GRO skb holds gro_dgrams / offload_skbs datagrams."""
        self.skbs = self.msgs
        self.dgrams = self.msgs - self.offload_skbs + self.gro_dgrams

    @property
    def syscalls(self) -> int:
        """Calls that moved data: one per message, except a sendmmsg/recvmmsg counts once."""
        return max(0, self.msgs - self.mmsg_msgs + self.mmsg_calls)

    def per_syscall(self) -> float | None:
        return self.dgrams / self.syscalls if self.syscalls else None

    def to_json(self) -> dict[str, int | float | None]:
        return {"syscalls": self.syscalls, "messages": self.msgs, "bytes": self.bytes, "datagrams": self.dgrams,
                "skbs": self.skbs, "mmsg_calls": self.mmsg_calls, "empty_calls": self.empty,
                "errors": self.errors, "datagrams_per_syscall": _r(self.per_syscall())}


def _r(x: float | None, nd: int = 3) -> float | None:
    return None if x is None else round(x, nd)


@dataclass(frozen=True)
class Gso:
    """Segmentation offload on send: whether the socket asked for it and what the kernel did."""

    enabled: str  # "socket option", "per-call cmsg" or "no"
    gso_sends: int
    segments_per_gso_send: float | None
    segment_size: float | None  # the median of the probes' histogram

    def to_json(self) -> dict[str, str | int | float | None]:
        return {"enabled": self.enabled, "gso_sends": self.gso_sends,
                "segments_per_gso_send": self.segments_per_gso_send, "segment_size": self.segment_size}


@dataclass(frozen=True)
class Gro:
    """Receive offload: whether the socket asked for it and how many datagrams a receive held."""

    enabled: str  # "socket option" or "no"
    coalesced_receives: int
    datagrams_per_receive: float | None

    def to_json(self) -> dict[str, str | int | float | None]:
        return {"enabled": self.enabled, "coalesced_receives": self.coalesced_receives,
                "datagrams_per_receive": self.datagrams_per_receive}


@dataclass
class ProcessPacketIO:
    pid: int
    tx: Direction = field(default_factory=Direction)
    rx: Direction = field(default_factory=Direction)
    threads: dict[int, tuple[Direction, Direction]] = field(default_factory=dict)
    ports: set[int] = field(default_factory=set)
    gso_segment_size: float | None = None
    gso_segs_median: float | None = None
    gro_segs_median: float | None = None
    sockets: list[UdpSocket] = field(default_factory=list)
    drops: dict[str, int] = field(default_factory=dict)  # reason name -> datagrams dropped at our ports
    syscall_time: dict[str, SyscallTime] = field(default_factory=dict)  # opt-in `syscalls` probes
    estimates: dict[str, Estimate] = field(default_factory=dict)  # headline figures with their intervals

    def thread(self, tid: int) -> tuple[Direction, Direction]:
        return self.threads.setdefault(tid, (Direction(), Direction()))

    @property
    def gso(self) -> "Gso":
        enabled = "socket option" if self.tx.offload_socket_msgs else (
            "per-call cmsg" if self.tx.offload_skbs else "no")
        used = self.tx.offload_skbs
        return Gso(enabled, used, _r((self.tx.dgrams - (self.tx.skbs - used)) / used) if used else None,
                   self.gso_segment_size)

    @property
    def gro(self) -> "Gro":
        return Gro("socket option" if self.rx.offload_socket_msgs else "no", self.rx.offload_skbs,
                   _r(self.rx.dgrams / self.rx.skbs) if self.rx.skbs else None)

    @property
    def ack_ratio(self) -> float | None:
        """Datagrams received per datagram sent (a bulk receiver's is its ACK frequency, inverted)."""
        return _r(self.rx.dgrams / self.tx.dgrams) if self.tx.dgrams else None

    @property
    def exact(self) -> bool:
        return all(e.exact for e in self.estimates.values())

    def to_json(self) -> JsonObject:
        return {"tx": self.tx.to_json(), "rx": self.rx.to_json(), "gso": self.gso.to_json(), "gro": self.gro.to_json(),
                "ack_ratio": self.ack_ratio, "ports": sorted(self.ports),
                "sockets": [schema.encode(sk) for sk in self.sockets],
                "drops": self.drops, "syscall_time": {k: v.to_json() for k, v in self.syscall_time.items()},
                "counted": "exact" if self.exact else "sampled",
                "estimates": {k: {"value": _r(e.value), "interval": e.interval(), "exact": e.exact}
                              for k, e in sorted(self.estimates.items())},
                "threads": {str(t): {"tx": a.to_json(), "rx": b.to_json()} for t, (a, b) in sorted(self.threads.items())}}


@dataclass
class PacketIO:
    """The whole run's packet I/O picture."""

    processes: dict[int, ProcessPacketIO]
    softirq: "Softirq"
    udp_mib: dict[str, dict[str, int | float]]
    sysctl: dict[str, str | float]
    cost: ProbeCost | None  # what the BPF programs cost (the report carries it as probes.json has it)
    unavailable: list[UnavailableProbe]
    sampling: "SamplingSummary | None" = None  # how the packet counts were taken (None: counted whole)

    def to_json(self) -> JsonObject:
        return {"processes": {str(p): v.to_json() for p, v in sorted(self.processes.items())},
                "softirq": self.softirq.to_json(), "udp_mib_delta": self.udp_mib, "sysctl": self.sysctl,
                "probe_cost": None if self.cost is None else schema.encode(self.cost),
                "unavailable": [{"probe": u.probe, "reason": u.reason} for u in self.unavailable],
                "sampling": None if self.sampling is None else self.sampling.to_json()}


# struct counts (probes/packetio/packetio.bpf.c) -> (direction, Direction attribute)
_COUNTERS = {
    "tx_msgs": ("tx", "msgs"), "tx_bytes": ("tx", "bytes"), "tx_errors": ("tx", "errors"),
    "tx_dgrams": ("tx", "dgrams"), "tx_skbs": ("tx", "skbs"), "tx_gso_skbs": ("tx", "offload_skbs"),
    "tx_gso_sockopt_msgs": ("tx", "offload_socket_msgs"),
    "rx_msgs": ("rx", "msgs"), "rx_bytes": ("rx", "bytes"), "rx_empty": ("rx", "empty"),
    "rx_gro_dgrams": ("rx", "gro_dgrams"), "rx_gro_skbs": ("rx", "offload_skbs"),
    "rx_gro_socket_msgs": ("rx", "offload_socket_msgs"),
}
# the opt-in syscalls group's batching counts (exact: bpftrace counts every call)
_MMSG_MAPS = {"@tx_mmsg_calls": ("tx", "mmsg_calls"), "@tx_mmsg_msgs": ("tx", "mmsg_msgs"),
              "@rx_mmsg_calls": ("rx", "mmsg_calls"), "@rx_mmsg_msgs": ("rx", "mmsg_msgs")}


def _fill(pair: tuple[Direction, Direction], totals: Mapping[str, float]) -> None:
    for name, (direction, attr) in _COUNTERS.items():
        if name in totals:
            d = pair[0 if direction == "tx" else 1]
            setattr(d, attr, getattr(d, attr) + int(round(totals[name])))


def _fill_threads(proc: ProcessPacketIO, totals: Mapping[str, float], sums: Mapping[int, Sequence[float]],
                  series: list[str]) -> None:
    """The process's estimated totals shared among its threads in proportion to what each was seen doing
    in the windows, in whole counts that add up to the process's. Each thread estimated on its own would
    not add up: a thread first seen in a later window is scaled to the kernel's counters from there on."""
    index = {name: i for i, name in enumerate(series)}
    for name, (direction, attr) in _COUNTERS.items():
        if name not in totals or name not in index:
            continue
        parts = apportion(int(round(totals[name])), {tid: s[index[name]] for tid, s in sums.items()})
        for tid, n in parts.items():
            d = proc.thread(tid)[0 if direction == "tx" else 1]
            setattr(d, attr, getattr(d, attr) + n)


def apportion(total: int, weights: dict[int, float]) -> dict[int, int]:
    """`total` split in proportion to `weights` into whole parts that sum to it (largest remainder);
    all zero when nothing was seen."""
    w = sum(v for v in weights.values() if v > 0)
    if w <= 0 or total == 0:
        return {k: 0 for k in weights}
    sign, whole = (1 if total > 0 else -1), abs(total)
    raw = {k: whole * max(v, 0.0) / w for k, v in weights.items()}
    out = {k: int(x) for k, x in raw.items()}
    for k in sorted(raw, key=lambda k: (out[k] - raw[k], k))[:whole - sum(out.values())]:
        out[k] += 1
    return {k: sign * v for k, v in out.items()}


def _rx_dgrams(t: Mapping[str, float]) -> float:
    return t["rx_msgs"] - t["rx_gro_skbs"] + t["rx_gro_dgrams"]


def _ratio(a: float, b: float) -> float | None:
    return a / b if b else None


# the counters _headline's figures read: windows whose series lack one are damaged, not estimated
HEADLINE_COUNTERS = frozenset({"tx_dgrams", "tx_bytes", "tx_msgs", "tx_skbs", "tx_gso_skbs",
                               "rx_bytes", "rx_msgs", "rx_gro_skbs", "rx_gro_dgrams"})


def _headline(sample: GroupSample, tx: Direction, rx: Direction) -> dict[str, Estimate]:
    """The figures a report leads with, as estimates of functions of the totals."""
    tx_calls = tx.mmsg_calls - tx.mmsg_msgs  # + messages: calls that moved data (mmsg counts are exact)
    rx_calls = rx.mmsg_calls - rx.mmsg_msgs
    figures: dict[str, Callable[[Mapping[str, float]], float | None]] = {
        "tx.datagrams": lambda t: t["tx_dgrams"], "tx.bytes": lambda t: t["tx_bytes"],
        "tx.messages": lambda t: t["tx_msgs"], "rx.datagrams": _rx_dgrams, "rx.bytes": lambda t: t["rx_bytes"],
        "rx.messages": lambda t: t["rx_msgs"],
        "tx.datagrams_per_syscall": lambda t: _ratio(t["tx_dgrams"], t["tx_msgs"] + tx_calls),
        "rx.datagrams_per_syscall": lambda t: _ratio(_rx_dgrams(t), t["rx_msgs"] + rx_calls),
        "gso.segments_per_gso_send":
            lambda t: _ratio(t["tx_dgrams"] - t["tx_skbs"] + t["tx_gso_skbs"], t["tx_gso_skbs"]),
        "gro.datagrams_per_receive": lambda t: _ratio(_rx_dgrams(t), t["rx_msgs"]),
        "ack_ratio": lambda t: _ratio(_rx_dgrams(t), t["tx_dgrams"]),
    }
    # what the namespace's counters allow: a process sent or received at most all of its messages
    ceilings = {"tx.messages": sample.aux_total.get("mib_out"), "rx.messages": sample.aux_total.get("mib_in")}
    out = {}
    for name, f in figures.items():
        floor = None
        if name.endswith((".datagrams", ".bytes", ".messages")):
            counted = sample.counted
            idx = {n: i for i, n in enumerate(sample.series)}
            floor = f({n: float(counted[i]) for n, i in idx.items()})
        est = sample.estimate(f, floor=floor, ceiling=ceilings.get(name))
        if est is not None:
            out[name] = est
    return out


@dataclass(frozen=True)
class SamplingSummary:
    """How the packet counts were taken: the sampler's windows against the run (probes/packetio/windows.py)."""

    exact: bool
    periods: int
    full_periods: int
    span_s: float
    counted_s: float
    coverage: float | None  # share of the run inside windows
    hook_runs: dict[str, int]
    budget: dict[str, float]

    METHOD = ("per-packet programs counting in one window per period, the window's length set by "
              "the hook rate against a CPU budget; totals scaled to the kernel's counters of each "
              "namespace (bytes and datagrams sent to its IP OutOctets, all else to its UDP "
              "datagrams; regression estimator), 95% intervals by the delta method")

    @classmethod
    def of(cls, w: Windows) -> "SamplingSummary":
        return cls(w.exact, w.periods, w.full_periods, round(w.span_s, 3), round(w.counted_s, 3),
                   _r(w.counted_s / w.span_s) if w.span_s else None, w.events, w.budget)

    def to_json(self) -> JsonObject:
        return {"method": self.METHOD, "exact": self.exact, "periods": self.periods,
                "full_periods": self.full_periods, "span_s": self.span_s, "counted_s": self.counted_s,
                "coverage": self.coverage, "hook_runs": self.hook_runs, "budget": self.budget}


def analyse(probes: ProbeRecord, pids: list[int]) -> PacketIO | None:
    """Build the packet I/O picture; None when the run has no probe data. The opt-in groups sharpen
    it: syscalls adds the mmsg batching and syscall times, softirq the network softirq time."""
    ran = "packetio" in probes.programs
    rec = probes.packetio()
    procs: dict[int, ProcessPacketIO] = {p: ProcessPacketIO(p) for p in pids}
    mmsg = probes.maps("syscalls")
    for name, (direction, attr) in _MMSG_MAPS.items():
        for key, value in probemaps.counters(mmsg, name):
            if len(key) >= 2 and key[0] in procs:
                proc = procs[key[0]]
                for d in (getattr(proc, direction), proc.thread(key[1])[0 if direction == "tx" else 1]):
                    setattr(d, attr, getattr(d, attr) + value)
    for (pid, tid), counts in rec.exact_counts.items():
        if pid in procs:
            _fill((procs[pid].tx, procs[pid].rx), counts)
            _fill(procs[pid].thread(tid), counts)
    w = rec.windows
    if w is not None and not HEADLINE_COUNTERS <= set(w.series):
        w = None  # a damaged probes.json (a series renamed or lost): its sums cannot be told apart
    for pid, proc in procs.items():
        proc.ports |= rec.ports.get(pid, set())
        sample = w.sample(str(pid)) if w is not None else None
        if w is not None and sample is not None:
            totals = sample.totals(list(sample.sum))
            _fill((proc.tx, proc.rx), totals)
            mine = {int(t): w.groups[g].sum for g in w.groups
                    for p, _, t in [g.partition(",")] if t and p == str(pid)}
            _fill_threads(proc, totals, mine, list(w.series))
        for rx in [proc.rx] + [t[1] for t in proc.threads.values()]:
            rx.finish_rx()
        if sample is not None:
            proc.estimates = _headline(sample, proc.tx, proc.rx)
        proc.gso_segment_size = probemaps.Histogram.of(rec.hists.get("@tx_gso_size", {}).get(pid)).median
        proc.gso_segs_median = probemaps.Histogram.of(rec.hists.get("@tx_gso_segs", {}).get(pid)).median
        proc.gro_segs_median = probemaps.Histogram.of(rec.hists.get("@rx_gro_segs", {}).get(pid)).median
    _syscall_time(mmsg, procs)
    names = probes.drop_reason_names
    for sk in probes.sockets:
        for pid in sk.pids:
            if pid in procs:
                procs[pid].sockets.append(sk)
                if sk.port:
                    procs[pid].ports.add(sk.port)
    port_owner = {port: pid for pid, p in procs.items() for port in p.ports}
    for (reason, port), n in rec.udp_drops.items():
        if port in port_owner:
            label = names.get(reason, str(reason))
            d = procs[port_owner[port]].drops
            d[label] = d.get(label, 0) + n
    if not ran and not probes.sockets:
        return None
    sirq_maps = probes.maps("softirq") or probes.maps("packetio")
    return PacketIO(procs, _softirq(sirq_maps, probes), _mib_delta(probes), dict(probes.before.sysctl),
                    probes.cost, list(probes.unavailable), SamplingSummary.of(w) if w is not None else None)


@dataclass(frozen=True)
class Softirq:
    """Softirq time over the run, per CPU: the network softirqs (opt-in softirq probes, with the share
    that ran in the targets' own threads), or all softirqs from /proc/stat."""

    source: str
    per_cpu: Mapping[str, Mapping[str, float | None]]  # CPU -> its figures (seconds, runs)
    total_s: float
    in_target_s: float | None = None
    in_target_share: float | None = None

    def to_json(self) -> JsonObject:
        return {"source": self.source, "per_cpu": self.per_cpu, "total_s": self.total_s,
                "in_target_s": self.in_target_s, "in_target_share": self.in_target_share}


def _softirq(maps: Mapping[str, object], probes: ProbeRecord) -> Softirq:
    """Network softirq time per CPU from the opt-in softirq probes; otherwise all softirq time per
    CPU from /proc/stat (tick-sampled) and the NET_RX/NET_TX run counts."""
    probed = probemaps.counters(maps, "@softirq_ns")
    if probed:
        per_cpu: dict[int, dict[str, float]] = defaultdict(lambda: {"net_rx_s": 0.0, "net_tx_s": 0.0,
                                                                    "in_target_s": 0.0})
        for key, ns in probed:
            if len(key) < 3:
                continue
            cpu, vec, in_target = key[:3]
            slot = per_cpu[cpu]
            slot["net_rx_s" if vec == 3 else "net_tx_s"] += ns / 1e9
            if in_target:
                slot["in_target_s"] += ns / 1e9
        total = sum(v["net_rx_s"] + v["net_tx_s"] for v in per_cpu.values())
        in_target_s = sum(v["in_target_s"] for v in per_cpu.values())
        return Softirq("softirq probes (network softirqs)",
                       {str(c): {k: round(x, 6) for k, x in v.items()} for c, v in sorted(per_cpu.items())},
                       round(total, 6), round(in_target_s, 6), _r(in_target_s / total) if total else None)
    s0, s1 = probes.before.softirq_seconds, probes.after.softirq_seconds
    c0, c1 = probes.before.softirqs, probes.after.softirqs

    def runs(vector: str, cpu: int) -> float | None:
        """The vector's runs on `cpu` between the snapshots; None when either lacks that CPU."""
        a, b = c0.get(vector) or [], c1.get(vector) or []
        return b[cpu] - a[cpu] if cpu < len(a) and cpu < len(b) else None

    per_cpu2: dict[str, dict[str, float | None]] = {}
    total2 = 0.0
    for i, t in s1.items():
        seconds = round(t - s0.get(i, t), 6)
        total2 += seconds
        per_cpu2[str(i)] = {"softirq_s": seconds, "net_rx_runs": runs("NET_RX", i), "net_tx_runs": runs("NET_TX", i)}
    return Softirq("/proc/stat (all softirqs, tick-sampled); the targets' own share is the Packet I/O "
                   "softirq subcategory of their samples", per_cpu2, round(total2, 6))


def _mib_delta(probes: ProbeRecord) -> dict[str, dict[str, int | float]]:
    before, after = probes.before.udp_mib, probes.after.udp_mib
    out = {}
    for ns, a in after.items():
        b = before[ns].udp if ns in before else {}
        out[ns] = {k: a.udp.get(k, 0) - b.get(k, 0) for k in _MIB_KEYS if k in a.udp}
    return out
