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
import struct
from dataclasses import dataclass

from qprof.collectors.netns import in_netns_of

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
INET_DIAG_INFO = 2
SKNLGRP_INET_TCP_DESTROY, SKNLGRP_INET6_TCP_DESTROY = 1, 3
ALL_STATES = 0xFFFFFFFF
TCP_LISTEN = 10
RCVBUF = 8 << 20  # room for destroy broadcasts between two reads

_NLMSGHDR = struct.Struct("=IHHII")
_REQ = struct.Struct("=BBBxI48s")  # inet_diag_req_v2: family, protocol, ext, pad, states, sockid
_MSG = struct.Struct("=BBBB2s2s16s16sIQIIIII")  # inet_diag_msg
_RTA = struct.Struct("=HH")
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


def _addr(family: int, raw: bytes, port: bytes) -> str:
    p = struct.unpack(">H", port)[0]
    if family == socket.AF_INET:
        return f"{socket.inet_ntop(socket.AF_INET, raw[:4])}:{p}"
    return f"[{socket.inet_ntop(socket.AF_INET6, raw)}]:{p}"


def _u64(info: bytes, off: int) -> int | None:
    return struct.unpack_from("=Q", info, off)[0] if len(info) >= off + 8 else None


def _u32(info: bytes, off: int) -> int | None:
    return struct.unpack_from("=I", info, off)[0] if len(info) >= off + 4 else None


def parse_messages(data: bytes) -> tuple[list[TcpSocket], bool, int]:
    """Netlink messages -> (sockets, done, error number); `done` at NLMSG_DONE."""
    out: list[TcpSocket] = []
    off = 0
    while off + _NLMSGHDR.size <= len(data):
        length, mtype, _flags, _seq, _pid = _NLMSGHDR.unpack_from(data, off)
        if length < _NLMSGHDR.size or off + length > len(data):
            break
        body = data[off + _NLMSGHDR.size: off + length]
        off += (length + 3) & ~3
        if mtype == NLMSG_DONE:
            return out, True, 0
        if mtype == NLMSG_ERROR:
            code = -struct.unpack_from("=i", body)[0] if len(body) >= 4 else errno.EIO
            return out, True, code
        if mtype != SOCK_DIAG_BY_FAMILY or len(body) < _MSG.size:
            continue
        fam, state, _t, _r, sport, dport, src, dst, _if, cookie, _e, _rq, _wq, _uid, inode = _MSG.unpack_from(body)
        info = b""
        a = _MSG.size
        while a + _RTA.size <= len(body):
            alen, atype = _RTA.unpack_from(body, a)
            if alen < _RTA.size:
                break
            if atype == INET_DIAG_INFO:
                info = body[a + _RTA.size: a + alen]
            a += (alen + 3) & ~3
        out.append(TcpSocket(cookie, inode, fam, state, _addr(fam, src, sport), _addr(fam, dst, dport),
                             _u64(info, _TCPI_BYTES_ACKED), _u64(info, _TCPI_BYTES_RECEIVED),
                             _u64(info, _TCPI_BYTES_SENT), _u64(info, _TCPI_BYTES_RETRANS), _u32(info, _TCPI_SEGS),
                             _u32(info, _TCPI_SEGS + 4)))
    return out, False, 0


class TcpDiag:
    """Dumps and destroy broadcasts of one network namespace (the one `pid` lives in)."""

    def __init__(self, pid: int) -> None:
        self.dumper, self.events = in_netns_of(pid, self._open)
        self._seq = 0
        # one receive buffer for the run: recv(n) allocated (and freed) n bytes per call, 1 MiB
        # several times a poll, though a message is a few KiB and the broadcast socket mostly empty
        self._buf = bytearray(1 << 20)
        self.lost_events = 0  # destroy broadcasts the kernel dropped (receive buffer full)

    @staticmethod
    def _open() -> tuple[socket.socket, socket.socket]:
        dumper = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_SOCK_DIAG)
        events = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK,
                               NETLINK_SOCK_DIAG)
        try:
            try:
                events.setsockopt(socket.SOL_SOCKET, 33, RCVBUF)  # SO_RCVBUFFORCE (root)
            except OSError:
                events.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF)
            events.bind((0, (1 << (SKNLGRP_INET_TCP_DESTROY - 1)) | (1 << (SKNLGRP_INET6_TCP_DESTROY - 1))))
        except OSError:
            dumper.close()
            events.close()
            raise
        return dumper, events

    def dump(self) -> list[TcpSocket]:
        """Every TCP socket of the namespace now, v4 and v6, with its counters."""
        found: list[TcpSocket] = []
        for family in (socket.AF_INET, socket.AF_INET6):
            self._seq += 1
            req = _REQ.pack(family, socket.IPPROTO_TCP, 1 << (INET_DIAG_INFO - 1), ALL_STATES, bytes(48))
            self.dumper.send(_NLMSGHDR.pack(_NLMSGHDR.size + len(req), SOCK_DIAG_BY_FAMILY,
                                            NLM_F_REQUEST | NLM_F_DUMP, self._seq, 0) + req)
            while True:
                socks, done, err = parse_messages(self._recv(self.dumper))
                found += socks
                if err:
                    raise OSError(err, f"sock_diag dump: {os.strerror(err)}")
                if done:
                    break
        return found

    def destroyed(self) -> list[TcpSocket]:
        """TCP sockets freed since the last call, with their last counters."""
        out: list[TcpSocket] = []
        while True:
            try:
                data = self._recv(self.events)
            except BlockingIOError:
                return out
            except OSError as e:
                if e.errno == errno.ENOBUFS:  # the kernel dropped broadcasts: counted, reading goes on
                    self.lost_events += 1
                    continue
                raise
            out += parse_messages(data)[0]

    def _recv(self, sock: socket.socket) -> bytes:
        n = sock.recv_into(self._buf)
        return bytes(memoryview(self._buf)[:n])

    def close(self) -> None:
        self.dumper.close()
        self.events.close()
