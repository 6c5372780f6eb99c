"""Socket tables from the kernel's sock_diag netlink (inet_diag): what `ss` reads, without forking it.

One request dumps every socket of a protocol and address family in the
network namespace the netlink socket was made in (collectors.netns), with the
extensions asked for (tcp_info, socket memory). Forking `ss` for the same
table cost qprof ~10 ms of CPU each time, taken from the CPUs the targets are
measured on; a dump costs a walk of the kernel's socket hash table (~0.3 ms
here). Addresses are formatted the way `ss -n` prints them, so tables read
either way compare.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass, field

from qprof.collectors import netlink
from qprof.collectors.netns import in_netns_of

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
# inet_diag extensions (include/uapi/linux/inet_diag.h): requested as bit (n - 1), returned as attribute n
INET_DIAG_INFO = 2
INET_DIAG_SKMEMINFO = 7
INET_DIAG_SKV6ONLY = 11
ALL_STATES = 0xFFFFFFFF

_REQ = struct.Struct("=BBBxI48s")  # inet_diag_req_v2: family, protocol, ext, pad, states, sockid
_MSG = struct.Struct("=BBBB2s2s16s16sIQIIIII")  # inet_diag_msg


@dataclass(frozen=True)
class DiagSocket:
    """One socket as inet_diag reported it: identity, and the extensions' raw attributes by number."""

    family: int
    state: int
    local_ip: bytes  # 4 or 16 bytes, network order
    local_port: int
    peer_ip: bytes
    peer_port: int
    ifindex: int  # the device the socket is bound to, 0 for none
    cookie: int
    inode: int
    attrs: dict[int, bytes] = field(default_factory=dict)

    @property
    def v6only(self) -> bool | None:
        """IPV6_V6ONLY of an AF_INET6 socket (None when the kernel did not say)."""
        raw = self.attrs.get(INET_DIAG_SKV6ONLY)
        return bool(raw[0]) if raw else None


def format_addr(family: int, ip: bytes, port: int, v6only: bool | None = None, ifname: str | None = None) -> str:
    """An address as `ss -n` prints it: 127.0.0.1:4433, [::1]:4433, 127.0.0.1%lo:4433; a dual-stack
    IPv6 wildcard is *, a zero port is *."""
    if family == socket.AF_INET:
        host = socket.inet_ntop(socket.AF_INET, ip[:4])
    elif ip == bytes(16) and not v6only:
        host = "*"
    else:
        host = f"[{socket.inet_ntop(socket.AF_INET6, ip[:16])}]"
    if ifname:
        host += f"%{ifname}"
    return f"{host}:{port or '*'}"


def parse_messages(data: bytes) -> tuple[list[DiagSocket], bool, int]:
    """Netlink messages -> (sockets, done, error number); `done` at NLMSG_DONE. Damaged or truncated
    messages are skipped: a reader of the kernel's answer takes what it can."""
    found, done, err = netlink.messages(data)
    return [d for mtype, body in found if (d := _socket(mtype, body)) is not None], done, err


def _socket(mtype: int, body: bytes) -> DiagSocket | None:
    """An inet_diag message's socket; None for another message or one too short to hold one."""
    if mtype != SOCK_DIAG_BY_FAMILY or len(body) < _MSG.size:
        return None
    fam, state, _t, _r, sport, dport, src, dst, ifindex, cookie, _e, _rq, _wq, _uid, inode = _MSG.unpack_from(body)
    return DiagSocket(fam, state, src, struct.unpack(">H", sport)[0], dst, struct.unpack(">H", dport)[0],
                      ifindex, cookie, inode, netlink.attributes(body, _MSG.size))


class InetDiag:
    """A sock_diag socket in one network namespace (the one `pid` lives in) and its dumps."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.sock = in_netns_of(pid, lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC,
                                                           NETLINK_SOCK_DIAG))
        self._seq = 0
        # one receive buffer for the run: recv(n) allocated (and freed) n bytes per call, 1 MiB
        # several times a poll, though a message is a few KiB
        self.buf = bytearray(1 << 20)
        self._ifnames: dict[int, str] = {}

    def ifname(self, index: int) -> str | None:
        """The name of a device of the namespace (its index if it is gone), None for index 0."""
        if not index:
            return None
        if index not in self._ifnames:
            try:
                self._ifnames[index] = in_netns_of(self.pid, lambda: socket.if_indextoname(index))
            except OSError:
                self._ifnames[index] = str(index)
        return self._ifnames[index]

    def addresses(self, d: DiagSocket) -> tuple[str, str]:
        """(local, peer) as `ss -n` prints them."""
        return (format_addr(d.family, d.local_ip, d.local_port, d.v6only, self.ifname(d.ifindex)),
                format_addr(d.family, d.peer_ip, d.peer_port, d.v6only))

    def dump(self, protocol: int, extensions: tuple[int, ...] = (),
             families: tuple[int, ...] = (socket.AF_INET, socket.AF_INET6)) -> list[DiagSocket]:
        """Every socket of `protocol` in the namespace now, with these extensions' attributes."""
        ext = 0
        for e in extensions:
            ext |= 1 << (e - 1)
        found: list[DiagSocket] = []
        for family in families:
            self._seq += 1
            req = _REQ.pack(family, protocol, ext, ALL_STATES, bytes(48))
            found += [d for mtype, body in netlink.dump(self.sock, SOCK_DIAG_BY_FAMILY, req, self._seq, self.buf,
                                                         "sock_diag dump")
                      if (d := _socket(mtype, body)) is not None]
        return found

    def recv(self, sock: socket.socket) -> bytes:
        """One datagram from a netlink socket, through the run's buffer."""
        n = sock.recv_into(self.buf)
        return bytes(memoryview(self.buf)[:n])

    def close(self) -> None:
        self.sock.close()
