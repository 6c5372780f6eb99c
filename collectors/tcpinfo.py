"""TCP bytes per socket from the kernel's own counters (sock_diag netlink), at no per-packet cost.

Every TCP socket keeps `tcp_info`: bytes_acked (sequence space the peer
acknowledged: payload, plus one for the SYN and one for the FIN),
bytes_received (sequence space received in order: payload, plus one for a
FIN), bytes_sent and bytes_retrans (payload sent, and of it sent again).
Payload sent is min(bytes_acked - 1, bytes_sent - bytes_retrans): exact,
acknowledged, retransmissions once; payload received is bytes_received,
one byte over once the peer closed. qprof reads them two ways, per network namespace:
  - a dump of every TCP socket with its tcp_info (SOCK_DIAG_BY_FAMILY,
    INET_DIAG_INFO), read periodically like the UDP socket table: live
    sockets, with their inode to find the owning process;
  - the kernel's socket-destroy broadcasts (SKNLGRP_INET{,6}_TCP_DESTROY,
    `ss -E`): each TCP socket's tcp_info as it is freed, so the bytes moved
    between the last dump and its close are not lost. They come from a
    workqueue, so the owner is known from an earlier dump (by the socket cookie).
Neither costs the traffic anything: the counters are the kernel's, kept anyway.
The sockets are made in the target's namespace (collectors.netns) and read
with non-blocking calls.
"""

from __future__ import annotations

import errno
import os
import socket
from dataclasses import dataclass

from qprof.collectors.netns import in_netns_of
from qprof.collectors.sockdiag import INET_DIAG_INFO, NETLINK_SOCK_DIAG, DiagSocket, InetDiag, parse_messages

SKNLGRP_INET_TCP_DESTROY, SKNLGRP_INET6_TCP_DESTROY = 1, 3
TCP_LISTEN = 10
RCVBUF = 8 << 20  # room for destroy broadcasts between two reads

# struct tcp_info offsets (include/uapi/linux/tcp.h), stable since Linux 4.6 (bytes_sent: 4.19)
_TCPI_BYTES_ACKED, _TCPI_BYTES_RECEIVED, _TCPI_BYTES_SENT, _TCPI_BYTES_RETRANS = 120, 128, 200, 208
_TCPI_SEGS = 136  # segs_out, segs_in (u32 each)


@dataclass(frozen=True)
class TcpSocket:
    """One TCP socket's identity and counters as the kernel reported them."""

    cookie: int
    inode: int
    family: int
    state: int
    local: str
    peer: str
    bytes_acked: int | None  # None: the kernel sent no tcp_info (or too old a one)
    bytes_received: int | None
    bytes_sent: int | None
    bytes_retrans: int | None
    segs_out: int | None
    segs_in: int | None

    @property
    def payload_sent(self) -> int | None:
        """Payload bytes sent and acknowledged, each once (see the module docstring)."""
        if self.bytes_acked is None:
            return None
        acked = max(0, self.bytes_acked - 1)  # the SYN's sequence number
        if self.bytes_sent is None or self.bytes_retrans is None:
            return acked
        return min(acked, self.bytes_sent - self.bytes_retrans)

    @classmethod
    def from_diag(cls, d: DiagSocket, local: str, peer: str) -> "TcpSocket":
        info = d.attrs.get(INET_DIAG_INFO, b"")
        return cls(d.cookie, d.inode, d.family, d.state, local, peer,
                   _u64(info, _TCPI_BYTES_ACKED), _u64(info, _TCPI_BYTES_RECEIVED), _u64(info, _TCPI_BYTES_SENT),
                   _u64(info, _TCPI_BYTES_RETRANS), _u32(info, _TCPI_SEGS), _u32(info, _TCPI_SEGS + 4))


def _u64(info: bytes, off: int) -> int | None:
    return int.from_bytes(info[off:off + 8], "little") if len(info) >= off + 8 else None


def _u32(info: bytes, off: int) -> int | None:
    return int.from_bytes(info[off:off + 4], "little") if len(info) >= off + 4 else None


class TcpDiag:
    """Dumps and destroy broadcasts of one network namespace (the one `pid` lives in)."""

    def __init__(self, pid: int) -> None:
        self.diag = InetDiag(pid)
        try:
            self.events = in_netns_of(pid, self._open_events)
            # an open /proc/PID/net file keeps reading that namespace after PID exits
            self._sockstat = os.open(f"/proc/{pid}/net/sockstat", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            self.diag.close()
            raise
        self._counts_at_dump: bytes | None = None
        self.lost_events = 0  # destroy broadcasts the kernel dropped (receive buffer full)

    @staticmethod
    def _open_events() -> socket.socket:
        events = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK,
                               NETLINK_SOCK_DIAG)
        try:
            try:
                events.setsockopt(socket.SOL_SOCKET, 33, RCVBUF)  # SO_RCVBUFFORCE (root)
            except OSError:
                events.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF)
            events.bind((0, (1 << (SKNLGRP_INET_TCP_DESTROY - 1)) | (1 << (SKNLGRP_INET6_TCP_DESTROY - 1))))
        except OSError:
            events.close()
            raise
        return events

    def _socket(self, d: DiagSocket) -> TcpSocket:
        return TcpSocket.from_diag(d, *self.diag.addresses(d))

    def _counts(self) -> bytes:
        """The namespace's TCP sockets in use, orphaned and in time-wait (/proc/net/sockstat: O(1))."""
        os.lseek(self._sockstat, 0, os.SEEK_SET)
        for line in os.read(self._sockstat, 4096).splitlines():
            if line.startswith(b"TCP:"):
                return b" ".join(line.split()[1:7])
        return b""

    def dump(self) -> list[TcpSocket]:
        """Every TCP socket of the namespace now, v4 and v6, with its counters."""
        return self._dump(self._counts())

    def dump_if_moved(self) -> list[TcpSocket] | None:
        """A dump, or None while the namespace's TCP socket counts stand still since the last one. A
        dump walks the kernel's whole established hash (262,144 buckets, 2 MiB, ~0.3 ms per family on
        qprof's test VM): a poll that finds no socket of the targets skips it until one opens or closes."""
        counts = self._counts()
        return None if counts == self._counts_at_dump else self._dump(counts)

    def _dump(self, counts: bytes) -> list[TcpSocket]:
        self._counts_at_dump = counts
        return [self._socket(d) for d in self.diag.dump(socket.IPPROTO_TCP, (INET_DIAG_INFO,))]

    def destroyed(self) -> list[TcpSocket]:
        """TCP sockets freed since the last call, with their last counters."""
        out: list[TcpSocket] = []
        while True:
            try:
                data = self.diag.recv(self.events)
            except BlockingIOError:
                return out
            except OSError as e:
                if e.errno == errno.ENOBUFS:  # the kernel dropped broadcasts: counted, reading goes on
                    self.lost_events += 1
                    continue
                raise
            out += [self._socket(d) for d in parse_messages(data)[0]]

    def close(self) -> None:
        self.diag.close()
        self.events.close()
        os.close(self._sockstat)
