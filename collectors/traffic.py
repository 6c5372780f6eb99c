"""Bytes each target moves, over the run: TCP from the kernel's socket counters, UDP from the probes.

TCP (collectors.tcpinfo): every poll dumps the TCP sockets of each target's
network namespace and keeps those whose inode one of the targets holds;
destroy broadcasts give each closed socket's last counters. A socket's bytes
are counted from its first sighting: a socket already open when the run
started starts from its counters then (the first poll, before the targets are
released), a later one from zero. The run's record goes to tcp.json: per
socket its owner, addresses, and first and last counters.

UDP has no per-socket byte counters in the kernel: the packetio probes'
sampling windows estimate each process's bytes (probes/packetio/windows.py);
their running totals, as the probes last printed them, are sampled at each
poll, so the time series costs nothing more.

Each poll returns a `Traffic` record (archive.model): per target, the cumulative bytes
(sent, received) since the start, TCP and UDP; the UDP totals count up to `udp_through`,
the end of the probes' last whole sampling period, up to ~1.5 s before the reading.
The session puts it into that moment's /proc reading: one time series, one clock
(CLOCK_MONOTONIC).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from qprof import runfiles
from qprof import archive
from qprof.archive import schema
from qprof.archive.model import TcpCounters, TcpRecord, TcpSocket as TcpSocketRecord, Traffic
from qprof.collectors.netns import netns_id
from qprof.collectors.tcpinfo import TCP_LISTEN, TcpDiag, TcpSocket
from qprof.jsonvalue import Json
from qprof.probes.packetio.maps import Windows
from qprof.probes.sockets import socket_inodes

# s: the longest a namespace goes undumped while its socket counts stand still (a socket that opened as
# another closed: its counters are cumulative, so it is counted whole when found). A dump walks the
# established hash twice; at 1 s it was a tenth of the collector's CPU beside a QUIC transfer.
FULL_DUMP_S = 5.0


@dataclass
class _Tracked:
    pid: int
    sock: TcpSocket
    first: TcpCounters
    last: TcpCounters
    first_time: float
    last_time: float
    closed: bool = False

    def moved(self) -> tuple[int, int]:
        """(sent, received) payload bytes since first seen: acknowledged out, in-order in."""
        return (self.last.payload_sent - self.first.payload_sent,
                self.last.bytes_received - self.first.bytes_received)

    def record(self) -> TcpSocketRecord:
        """As tcp.json records it."""
        s = self.sock
        return TcpSocketRecord(self.pid, self.first, self.last, s.cookie, 6 if s.family == 10 else 4, s.local, s.peer,
                               self.first_time, self.last_time, self.closed)


def _counters(s: TcpSocket) -> TcpCounters | None:
    """A socket's counters (None: the kernel sent no tcp_info, so no payload figures)."""
    sent, received = s.payload_sent, s.bytes_received
    if sent is None or received is None:
        return None
    return TcpCounters(sent, received, s.bytes_acked or 0, s.bytes_sent or 0, s.bytes_retrans or 0, s.segs_out or 0,
                       s.segs_in or 0)


def udp_totals(maps: dict[str, Json]) -> tuple[dict[int, tuple[float, float]], float | None]:
    """Per process, the packetio windows' running estimates of UDP bytes sent and received, and the
    CLOCK_MONOTONIC time they count up to (None from a loader that did not say). Each is the estimator's
    (probes.packetio.estimate: scaled to the namespace's kernel counters over the same periods), as the
    report's totals are: the windows' plain sums followed the few windows of each second, and a timeline
    interval's rate read 0.8x to 1.3x the namespace's exact one while the transfer ran steadily."""
    raw = maps.get("@windows")
    if isinstance(raw, dict) and isinstance(groups := raw.get("groups"), dict):
        # the processes' groups only: a thread's is not read here, and checking each one's shape (its
        # variance terms among them) every second was a tenth of the collector's CPU beside quic-go
        raw = {**raw, "groups": {k: g for k, g in groups.items() if k.isdigit()}}
    found = schema.probe_maps({"@windows": raw}).get("@windows")
    w = found.usable() if isinstance(found, Windows) else None
    if w is None or "tx_bytes" not in w.series or "rx_bytes" not in w.series:
        return {}, None
    out: dict[int, tuple[float, float]] = {}
    for k in w.groups:
        sample = w.sample(k) if k.isdigit() else None
        if sample is not None:
            totals = sample.totals(list(sample.sum))
            out[int(k)] = (round(max(0.0, totals["tx_bytes"])), round(max(0.0, totals["rx_bytes"])))
    return out, w.through_mono


@dataclass
class TrafficRecorder:
    """Polls the targets' TCP sockets and folds in the probes' UDP totals; see the module docstring."""

    out: Path
    pids: list[int]
    status: Callable[[str], None] = lambda msg: None
    diags: dict[str, TcpDiag] = field(default_factory=dict)
    tracked: dict[tuple[str, int], _Tracked] = field(default_factory=dict)
    unowned: dict[str, int] = field(default_factory=lambda: {"sockets": 0, "payload_sent": 0, "bytes_received": 0})
    errors: list[str] = field(default_factory=list)
    _polls: int = 0
    _dumps: int = 0
    _next_dump: dict[str, float] = field(default_factory=dict)
    # the windows' statistics last decoded (kept to be compared by identity: MapTail replaces the object
    # when a new line arrives) and their totals: decoding them was a fifth of qprof's CPU while attached
    _windows_read: object = None
    _udp: tuple[dict[int, tuple[float, float]], float | None] = ({}, None)

    def start(self, now: float) -> Traffic:
        """Open sock_diag in each target's namespace and take the first counters."""
        self.follow(self.pids)
        return self.poll(now, {})

    def follow(self, pids: list[int]) -> None:
        """Targets that joined (a followed service's new worker): a sock_diag in each namespace not yet
        watched; their sockets are counted from the next poll."""
        for pid in pids:
            if pid not in self.pids:
                self.pids.append(pid)
            ns = netns_id(pid)
            if ns is None or ns in self.diags:
                continue
            try:
                self.diags[ns] = TcpDiag(pid)
            except OSError as e:
                self._error(f"sock_diag in {ns} (pid {pid}): {e.strerror or e}: TCP bytes not counted there")

    def _error(self, msg: str) -> None:
        if msg not in self.errors:
            self.errors.append(msg)
            self.status(f"warning: {msg}")

    def poll(self, now: float, udp_maps: dict[str, Json], final: bool = False) -> Traffic:
        """One reading of the targets' TCP sockets; the cumulative bytes per target, both kinds.
        A namespace is dumped when a target's socket there is open, when its TCP socket counts moved
        (a socket opened or closed), at least every FULL_DUMP_S, and at the first and `final` poll;
        between those, sockets that close are still read from the destroy broadcasts."""
        owners: dict[int, int] | None = None
        first_poll = self._polls == 0
        self._polls += 1
        open_in = {k[0] for k, t in self.tracked.items() if not t.closed}
        for ns, diag in self.diags.items():
            try:
                due = first_poll or final or ns in open_in or now >= self._next_dump.get(ns, 0.0)
                live = diag.dump() if due else diag.dump_if_moved()
                if live is not None:
                    self._dumps += 1
                    self._next_dump[ns] = now + FULL_DUMP_S
                gone = diag.destroyed()
            except OSError as e:
                self._error(f"sock_diag in {ns}: {e.strerror or e}")
                continue
            for s in live or []:
                key = (ns, s.cookie)
                t = self.tracked.get(key)
                counters = _counters(s)
                if counters is None or s.state == TCP_LISTEN:
                    continue
                if t is None:
                    if owners is None:
                        owners = {int(i): p for p in self.pids for i in socket_inodes(p)}
                    owner = owners.get(s.inode)
                    if owner is None:
                        continue
                    base = counters if first_poll else TcpCounters(0, 0)
                    t = self.tracked[key] = _Tracked(owner, s, base, counters, now, now)
                t.last, t.last_time = counters, now
            for s in gone:
                counters = _counters(s)
                t = self.tracked.get((ns, s.cookie))
                if counters is None:
                    continue
                if t is None:  # opened and closed between two polls: whose it was is unknown
                    if s.state != TCP_LISTEN and (counters.payload_sent or counters.bytes_received):
                        self.unowned["sockets"] += 1
                        self.unowned["payload_sent"] += counters.payload_sent
                        self.unowned["bytes_received"] += counters.bytes_received
                    continue
                t.last, t.last_time, t.closed = counters, now, True
        tcp: dict[int, tuple[float, float]] = {}
        for t in self.tracked.values():
            sent, received = t.moved()
            before = tcp.get(t.pid, (0, 0))
            tcp[t.pid] = (before[0] + sent, before[1] + received)
        windows = udp_maps.get("@windows")
        if windows is not self._windows_read:  # the loader prints once a second, readings come 4 times
            self._windows_read, self._udp = windows, udp_totals(udp_maps)
        totals, through = self._udp
        udp = {p: v for p, v in totals.items() if p in self.pids}
        return Traffic(tcp, udp, through if udp else None)

    def record(self) -> TcpRecord:
        """tcp.json: the connections tracked, what closed unowned, how the polls went."""
        return TcpRecord([t.record() for t in self.tracked.values()],
                         "sock_diag tcp_info (payload sent: acknowledged, once; received: in order) and its "
                         "socket-destroy broadcasts", self._polls, self._dumps, sorted(self.diags), list(self.errors),
                         sum(d.lost_events for d in self.diags.values()), dict(self.unowned))

    def finish(self, now: float, udp_maps: dict[str, Json]) -> Traffic:
        """A last reading (sockets closed at the end), the record written to tcp.json, sockets closed."""
        last = self.poll(now, udp_maps, final=True)
        archive.write_json_atomic(self.out / runfiles.TCP, schema.encode(self.record()))
        self.close()
        return last

    def close(self) -> None:
        for d in self.diags.values():
            d.close()
        self.diags = {}
