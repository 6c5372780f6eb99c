"""Queueing disciplines and their counters from rtnetlink (an RTM_GETQDISC dump): what
`tc -s -j qdisc show` prints, read in the target's network namespace without forking tc.

A reading is taken at the start, every few seconds and at the end of an attach (collectors.probing):
forking `tc` (through `nsenter` for another namespace) cost ~8 ms of qprof's CPU each time, the
dump ~0.2 ms. The fields are tc's: the kind, the handle as tc writes it ("1:"), the device's name,
bytes and packets (the 64-bit packet count where the kernel gives one), drops, overlimits, requeues,
backlog (bytes) and qlen. The kernel leaves out what tc leaves out (the built-in noop qdisc).
"""

from __future__ import annotations

import socket
import struct

from qprof.archive.model import Qdisc
from qprof.collectors import netlink
from qprof.collectors.netns import in_netns_of

RTM_NEWQDISC, RTM_GETQDISC = 36, 38
TCA_KIND, TCA_STATS, TCA_STATS2 = 1, 3, 7
TCA_STATS_BASIC, TCA_STATS_QUEUE, TCA_STATS_PKT64 = 1, 3, 8

_TCMSG = struct.Struct("=BBHiIII")  # family, pads, ifindex, handle, parent, info
_BASIC = struct.Struct("=QI")  # gnet_stats_basic: bytes, packets
_QUEUE = struct.Struct("=IIIII")  # gnet_stats_queue: qlen, backlog, drops, requeues, overlimits
_TC_STATS = struct.Struct("=QIIIIIII")  # tc_stats (the older attribute): bytes, packets, drops, overlimits, bps,
#                                         pps, qlen, backlog


def parse(body: bytes, ifname: dict[int, str]) -> Qdisc | None:
    """One RTM_NEWQDISC message's qdisc (`ifname`: the namespace's device names by index); None when the
    message is too short to be one."""
    if len(body) < _TCMSG.size:
        return None
    _f, _p1, _p2, ifindex, handle, _parent, _info = _TCMSG.unpack_from(body)
    attrs = netlink.attributes(body, _TCMSG.size)
    kind = attrs.get(TCA_KIND, b"").split(b"\0", 1)[0].decode("ascii", "replace") or None
    n: dict[str, int] = {}
    stats2 = attrs.get(TCA_STATS2)
    if stats2 is not None:
        st = netlink.attributes(stats2)
        if len(basic := st.get(TCA_STATS_BASIC, b"")) >= _BASIC.size:
            n["bytes"], n["packets"] = _BASIC.unpack_from(basic)
        if len(pkt64 := st.get(TCA_STATS_PKT64, b"")) >= 8:
            (n["packets"],) = struct.unpack_from("=Q", pkt64)
        if len(queue := st.get(TCA_STATS_QUEUE, b"")) >= _QUEUE.size:
            n["qlen"], n["backlog"], n["drops"], n["requeues"], n["overlimits"] = _QUEUE.unpack_from(queue)
    elif len(old := attrs.get(TCA_STATS, b"")) >= _TC_STATS.size:
        n["bytes"], n["packets"], n["drops"], n["overlimits"], _bps, _pps, n["qlen"], n["backlog"] = \
            _TC_STATS.unpack_from(old)
    return Qdisc(dev=ifname.get(ifindex, str(ifindex)), kind=kind, handle=f"{handle >> 16:x}:", **n)


def _dump() -> tuple[Qdisc, ...]:
    """Every qdisc of this thread's network namespace."""
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, socket.NETLINK_ROUTE) as sock:
        bodies = [body for mtype, body in netlink.dump(sock, RTM_GETQDISC, _TCMSG.pack(0, 0, 0, 0, 0, 0, 0), 1,
                                                       bytearray(1 << 16), "qdisc dump") if mtype == RTM_NEWQDISC]
    names = dict(socket.if_nameindex())
    return tuple(q for q in (parse(b, names) for b in bodies) if q is not None)


def qdiscs(pid: int) -> tuple[Qdisc, ...]:
    """The qdiscs of `pid`'s network namespace now; OSError when it cannot be read (the target gone)."""
    return in_netns_of(pid, _dump)
