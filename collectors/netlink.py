"""Netlink's framing, shared by qprof's two readers of kernel tables (collectors.sockdiag: sockets;
collectors.qdiscs: queueing disciplines): the messages of one datagram, a message's attributes, and a
dump (one request, answers until NLMSG_DONE). What the tools qprof would otherwise fork (`ss`, `tc`)
read, without the ~5-10 ms of CPU a fork and exec of each costs qprof at every reading."""

from __future__ import annotations

import errno
import os
import socket
import struct
from typing import Iterator

NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
NLA_TYPE_MASK = 0x3FFF  # an attribute's type without its NESTED and NET_BYTEORDER flags

HEADER = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, sequence, port
_RTA = struct.Struct("=HH")


def messages(data: bytes) -> tuple[list[tuple[int, bytes]], bool, int]:
    """A datagram's messages as (type, body), and (done, error number): done at NLMSG_DONE or an error.
    A message claiming more than the datagram holds ends the reading: a reader of the kernel's answer
    takes what it can."""
    out: list[tuple[int, bytes]] = []
    off = 0
    while off + HEADER.size <= len(data):
        length, mtype, _flags, _seq, _pid = HEADER.unpack_from(data, off)
        if length < HEADER.size or off + length > len(data):
            break
        body = data[off + HEADER.size: off + length]
        off += (length + 3) & ~3
        if mtype == NLMSG_DONE:
            return out, True, 0
        if mtype == NLMSG_ERROR:
            code = -struct.unpack_from("=i", body)[0] if len(body) >= 4 else errno.EIO
            return out, True, code
        out.append((mtype, body))
    return out, False, 0


def attributes(body: bytes, start: int = 0) -> dict[int, bytes]:
    """The attributes from `start` on, by type (flags masked off); one claiming more than is there gets
    what is there, one shorter than its own header ends them."""
    attrs: dict[int, bytes] = {}
    a = start
    while a + _RTA.size <= len(body):
        alen, atype = _RTA.unpack_from(body, a)
        if alen < _RTA.size:
            break
        attrs[atype & NLA_TYPE_MASK] = body[a + _RTA.size: a + alen]
        a += (alen + 3) & ~3
    return attrs


def dump(sock: socket.socket, mtype: int, payload: bytes, seq: int, buf: bytearray,
         what: str = "netlink dump") -> Iterator[tuple[int, bytes]]:
    """One dump request of `mtype` with `payload`, then every message of the answer (read through
    `buf`); OSError ("`what`: the error") when the kernel answers with an error."""
    sock.send(HEADER.pack(HEADER.size + len(payload), mtype, NLM_F_REQUEST | NLM_F_DUMP, seq, 0) + payload)
    while True:
        n = sock.recv_into(buf)
        found, done, err = messages(bytes(memoryview(buf)[:n]))
        yield from found
        if err:
            raise OSError(err, f"{what}: {os.strerror(err)}")
        if done:
            return
