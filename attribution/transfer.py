"""One goodput per process, defined once: the bytes it moved over the span in which it moved them.

Three goodputs were printed for one transfer (the table's over a /proc window,
the timeline's spread over the whole run, the API's another), so a figure was
believed by no one. Here it is computed once per process and every output
prints this one (attribution.analysis hands it to the verdict, the JSON
report, the table, the timeline, `qprof.load`, the flame graphs and diff):

- bytes: the payload of the direction that moved more. TCP from the kernel's
  socket counters (exact: acknowledged payload sent, in-order payload
  received); UDP from the packetio probes, each datagram's payload (for QUIC
  its packets' headers and AEAD tags are in it: the application's own bytes
  are a few percent fewer), exact or estimated from sampling windows with a
  95% interval.
- span: from its first to its last sample in a send or receive path (Packet
  I/O other than waiting in poll), to the sampling interval (2 ms at 499 Hz of
  its CPU time); the handshake's few packets are in it, idle time before and
  after is not. Archives without sample times fall back to the first and last
  /proc reading of the process (every 0.25 s), and say so.
"""

from __future__ import annotations

from dataclasses import dataclass

from qprof.attribution.packetio import PacketIO
from qprof.attribution.tcp import TcpIO
from qprof.archive.model import ProcReading
from qprof.jsonvalue import JsonObject

SPAN_FROM_SAMPLES = "its first to last sample in a send or receive path"
SPAN_FROM_PROC = "its first to last /proc reading (every 0.25 s; this archive has no sample times)"


@dataclass(frozen=True)
class Transfer:
    """What one process moved and when."""

    pid: int
    bytes: int | None  # payload of the direction that moved more
    direction: str | None  # "sent" or "received"
    protocol: str | None  # "UDP" or "TCP"
    counted: str  # "exact", "estimated ±1.2%" (95% interval), or "" when nothing was counted
    start_s: float | None  # CLOCK_MONOTONIC seconds, the clock of samples and readings
    end_s: float | None
    span_from: str

    @property
    def seconds(self) -> float | None:
        if self.start_s is None or self.end_s is None or self.end_s <= self.start_s:
            return None
        return self.end_s - self.start_s

    @property
    def gbps(self) -> float | None:
        s = self.seconds
        return self.bytes * 8 / s / 1e9 if self.bytes and s else None

    def describe(self) -> str:
        """One line: the figure with how it was measured."""
        if self.gbps is None:
            return "goodput: – (no bytes counted or no span)" if not self.bytes else \
                f"moved {self.bytes / 1e6:,.1f} MB; goodput: – (no span)"
        what = f"{self.protocol} payload {self.direction}" + (" (QUIC headers and tags included)"
                                                              if self.protocol == "UDP" else "")
        return (f"goodput {self.gbps:.2f} Gbit/s: {(self.bytes or 0) / 1e6:,.1f} MB of {what}, {self.counted}, over "
                f"{self.seconds:.3f} s from {self.span_from}")

    def to_json(self) -> JsonObject:
        def r(x: float | None, n: int = 6) -> float | None:
            return None if x is None else round(x, n)

        return {"bytes": self.bytes, "direction": self.direction, "protocol": self.protocol, "counted": self.counted,
                "start_s": r(self.start_s), "end_s": r(self.end_s), "seconds": r(self.seconds),
                "gbps": r(self.gbps, 4), "span_from": self.span_from}


def _proc_span(readings: list[ProcReading], pid: int) -> tuple[float | None, float | None]:
    seen = [r.mono for r in readings if r.threads.get(pid)]
    return (seen[0], seen[-1]) if len(seen) >= 2 else (None, None)


def transfer(pid: int, pio: PacketIO | None, tcp: TcpIO | None, span_ns: tuple[int, int] | None,
             readings: list[ProcReading]) -> Transfer:
    """The process's transfer: bytes from the probes or TCP counters, span from its packet samples."""
    moved: list[tuple[int, str, str, str]] = []  # (bytes, direction, protocol, counted)
    t = tcp.processes.get(pid) if tcp is not None else None
    if t is not None and t.moved:
        moved.append((t.sent, "sent", "TCP", "exact") if t.sent >= t.received else
                     (t.received, "received", "TCP", "exact"))
    p = pio.processes.get(pid) if pio is not None else None
    if p is not None and (p.tx.bytes or p.rx.bytes):
        key, d = ("tx.bytes", p.tx) if p.tx.bytes >= p.rx.bytes else ("rx.bytes", p.rx)
        est = p.estimates.get(key)
        half = est.relative_half_width() if est is not None and not est.exact else None
        counted = "exact" if est is None or est.exact else \
            (f"estimated ±{half:.1%}" if half is not None else "estimated (no interval)")
        moved.append((d.bytes, "sent" if key == "tx.bytes" else "received", "UDP", counted))
    b, direction, protocol, counted = max(moved) if moved else (None, None, None, "")
    start: float | None
    end: float | None
    if span_ns is not None:
        start, end, how = span_ns[0] / 1e9, span_ns[1] / 1e9, SPAN_FROM_SAMPLES
    else:
        (start, end), how = _proc_span(readings, pid), SPAN_FROM_PROC
    return Transfer(pid, b, direction, protocol, counted, start, end, how)


WINDOW_ALL = "its /proc readings, first to last"
WINDOW_TRANSFER = "the readings inside its transfer (first to last packet)"
MIN_WINDOW_S = 0.5  # readings inside a transfer spanning less than this are too few to judge by


def working(readings: list[ProcReading], pid: int, moved: Transfer | None) -> tuple[list[ProcReading], str]:
    """The readings a process is judged and described over (the verdict, the thread view): those inside
    its transfer when they span MIN_WINDOW_S (idle time before it started and after it ended, as when
    attach runs on after the client exits, would dilute every share), else all in which it appears."""
    rs = [r for r in readings if r.threads.get(pid)]
    if moved is not None and moved.span_from == SPAN_FROM_SAMPLES and moved.start_s is not None \
            and moved.end_s is not None:
        inside = [r for r in rs if moved.start_s <= r.mono <= moved.end_s]
        if len(inside) >= 2 and inside[-1].mono - inside[0].mono >= MIN_WINDOW_S:
            return inside, WINDOW_TRANSFER
    return rs, WINDOW_ALL
