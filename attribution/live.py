"""Per-second figures for the live view of `qprof attach`, from the session's raw live data.

Rates are differences of cumulative counters between two ticks, over the time
between the two /proc readings (not the tick period, which drifts), so a late
tick neither inflates nor deflates them. Packet counts go through the same
analysis as the report (attribution.packetio), so the live numbers and the
final report agree on what a datagram is. They are printed by the probe loader
about once a second, on its own clock, and cover the sampling periods committed
so far: their rates are taken over those periods' time (the windows' span), and
a tick that finds no new print keeps the last rates instead of showing zero; the
first print's rates are its averages since the probes started.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from qprof.attribution.packetio import analyse
from qprof.archive import schema
from qprof.archive.model import LiveData, ProbeRecord, ProcReading


@dataclass
class TargetRates:
    pid: int
    comm: str
    role: str | None
    alive: bool
    cpu: float | None = None  # process on-CPU time per second (1.0 = one CPU busy)
    busiest_tid: int | None = None
    busiest_cpu: float | None = None
    tx_dgrams_s: float | None = None  # None: no packetio probes
    rx_dgrams_s: float | None = None
    tx_gbit_s: float | None = None
    rx_gbit_s: float | None = None
    gso: float | None = None  # datagrams per transmitted skb over the interval (1.0: no GSO)
    gro: float | None = None  # datagrams per received message over the interval (1.0: no GRO)
    drops: int | None = None  # datagrams dropped at its ports so far


@dataclass
class LiveFrame:
    elapsed_s: float
    duration_s: float | None
    targets: list[TargetRates] = field(default_factory=list)
    softirq_share: float | None = None  # host softirq time / all CPU time over the interval
    probes: bool = False


Packets = tuple[float, float, float, float, float, float]  # tx dgrams/bytes/skbs, rx dgrams/bytes/msgs


@dataclass
class _Counters:
    mono: float
    on_cpu: dict[int, dict[int, float]]  # pid -> tid -> on-CPU seconds
    softirq_s: float
    cpus: int


@dataclass
class _PacketCounts:
    time_s: float  # the counts' own time: the sampling windows' span, or the reading's clock (counted whole)
    windowed: bool  # which of the two clocks time_s is on
    by_pid: dict[int, Packets]


@dataclass
class _PacketRates:
    tx_dgrams_s: float | None
    rx_dgrams_s: float | None
    tx_gbit_s: float
    rx_gbit_s: float
    gso: float | None
    gro: float | None


def _on_cpu(reading: ProcReading) -> dict[int, dict[int, float]]:
    return {pid: {t.tid: t.on_cpu_s if t.on_cpu_s is not None else t.utime_s + t.stime_s for t in threads}
            for pid, threads in reading.threads.items()}


def _rate(now: float, before: float, dt: float) -> float | None:
    return max(0.0, now - before) / dt if dt > 0 else None


class LiveMonitor:
    """Turns consecutive LiveData into LiveFrames (the first one has no rates yet)."""

    def __init__(self) -> None:
        self._prev: _Counters | None = None
        self._packets: _PacketCounts | None = None  # the counts the last packet rates ended at
        self._packet_rates: dict[int, _PacketRates] = {}

    def _update_packets(self, counts: _PacketCounts) -> None:
        """New packet rates when the counts' time moved on since the last ones; else keep them."""
        before = self._packets
        if before is not None and counts.time_s <= before.time_s:
            return
        self._packets = counts
        if before is None:
            return
        dt = counts.time_s - before.time_s
        for pid, now in counts.by_pid.items():
            if pid not in before.by_pid:
                continue
            (txd, txb, txs, rxd, rxb, rxm), (ptxd, ptxb, ptxs, prxd, prxb, prxm) = now, before.by_pid[pid]
            self._packet_rates[pid] = _PacketRates(
                _rate(txd, ptxd, dt), _rate(rxd, prxd, dt),
                (_rate(txb, ptxb, dt) or 0.0) * 8 / 1e9, (_rate(rxb, prxb, dt) or 0.0) * 8 / 1e9,
                (txd - ptxd) / (txs - ptxs) if txs > ptxs else None,
                (rxd - prxd) / (rxm - prxm) if rxm > prxm else None)

    def update(self, d: LiveData) -> LiveFrame:
        pids = [t.pid for t in d.targets]
        maps = schema.probe_maps(d.maps)
        pio = analyse(ProbeRecord.of_maps({"packetio": maps}), pids) if maps else None
        if pio is not None:
            windowed = pio.sampling is not None
            if self._packets is not None and self._packets.windowed != windowed:
                # another clock: counts from before packetio's first print (another group printed first,
                # no windows yet) were on the readings' clock, which the windows' span never passes
                self._packets = None
            if windowed and self._packets is None:
                # the windows' counts and their span start at zero with the probes: the first print's
                # rates are its averages since then (a second print can be 2 s later)
                self._packets = _PacketCounts(0.0, True, {p: (0.0,) * 6 for p in pio.processes})
            self._update_packets(_PacketCounts(
                pio.sampling.span_s if pio.sampling is not None else d.reading.mono, windowed,
                {p: (v.tx.dgrams, v.tx.bytes, v.tx.skbs, v.rx.dgrams, v.rx.bytes, v.rx.msgs)
                 for p, v in pio.processes.items()}))
        now = _Counters(d.reading.mono, _on_cpu(d.reading), sum(d.softirq_seconds.values()),
                        max(1, len(d.softirq_seconds)))
        prev, self._prev = self._prev, now
        dt = now.mono - prev.mono if prev is not None else 0.0
        frame = LiveFrame(d.elapsed_s, d.duration_s, probes=pio is not None)
        if prev is not None and dt > 0:
            frame.softirq_share = _rate(now.softirq_s, prev.softirq_s, dt * now.cpus)
        for t in d.targets:
            pid = t.pid
            threads = now.on_cpu.get(pid, {})
            r = TargetRates(pid, t.comm, t.role, bool(threads))
            if pio is not None and pid in pio.processes:
                r.drops = sum(pio.processes[pid].drops.values())
            frame.targets.append(r)
            if prev is None or dt <= 0:
                continue
            before = prev.on_cpu.get(pid, {})
            per_thread = {tid: _rate(s, before.get(tid, s), dt) or 0.0 for tid, s in threads.items()}
            if per_thread:
                r.cpu = sum(per_thread.values())
                r.busiest_tid, r.busiest_cpu = max(per_thread.items(), key=lambda kv: kv[1])
            if (pr := self._packet_rates.get(pid)) is not None:
                r.tx_dgrams_s, r.rx_dgrams_s, r.tx_gbit_s, r.rx_gbit_s, r.gso, r.gro = \
                    pr.tx_dgrams_s, pr.rx_dgrams_s, pr.tx_gbit_s, pr.rx_gbit_s, pr.gso, pr.gro
        return frame
