"""TCP bytes per process from the kernel's socket counters (tcp.json, collectors.traffic).

What a TCP+TLS baseline needs beside its samples: how much each process moved,
so its CPU time can be put per GB and set beside a QUIC endpoint's. Sent
bytes are the acknowledged payload (TLS records and HTTP framing included,
retransmissions once), received bytes the in-order payload
(collectors.tcpinfo); bytes_retrans is what was sent again.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from qprof.archive.model import TcpRecord, TcpSocket
from qprof.jsonvalue import JsonObject


@dataclass
class ProcessTcp:
    pid: int
    sent: int = 0  # acknowledged payload bytes
    received: int = 0
    retransmitted: int = 0
    sockets: list[TcpSocket] = field(default_factory=list)

    @property
    def moved(self) -> int:
        return self.sent + self.received

    def to_json(self) -> JsonObject:
        return {"sent_bytes": self.sent, "received_bytes": self.received,
                "retransmitted_bytes": self.retransmitted,
                "sockets": len(self.sockets), "closed": sum(s.closed for s in self.sockets),
                "connections": [{"local": s.local, "peer": s.peer, "closed": s.closed,
                                 "sent_bytes": s.last.payload_sent - s.first.payload_sent,
                                 "received_bytes": s.last.bytes_received - s.first.bytes_received}
                                for s in self.sockets]}


@dataclass
class TcpIO:
    """The run's TCP picture: per process, and what could not be given an owner."""

    processes: dict[int, ProcessTcp]
    unowned: dict[str, int]
    errors: list[str]
    lost_destroy_events: int
    source: str

    def to_json(self) -> JsonObject:
        return {"source": self.source, "processes": {str(p): v.to_json() for p, v in sorted(self.processes.items())},
                "unowned_closed": self.unowned, "lost_destroy_events": self.lost_destroy_events,
                "errors": self.errors}


def analyse(record: TcpRecord | None, pids: list[int]) -> TcpIO | None:
    """Per-process TCP bytes; None for a run recorded without (older archives)."""
    if record is None:
        return None
    procs = {p: ProcessTcp(p) for p in pids}
    for s in record.sockets:
        p = procs.get(s.pid)
        if p is None:
            continue
        p.sent += s.last.payload_sent - s.first.payload_sent
        p.received += s.last.bytes_received - s.first.bytes_received
        p.retransmitted += s.last.bytes_retrans - s.first.bytes_retrans
        p.sockets.append(s)
    return TcpIO(procs, dict(record.unowned_closed), list(record.errors), record.lost_destroy_events, record.source)
