"""Kernel tables over netlink: the UDP table qprof records from sock_diag (addresses, buffers, drops) against
`ss` and against the datagrams a full socket really lost, in this namespace and in another; the qdiscs
read from rtnetlink against `tc` in another namespace, a shaper dropping there; the parsers on damaged
and random input."""

from __future__ import annotations

import os
import socket
import json
import struct
import subprocess
import sys
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qprof.archive import schema
from qprof.archive.model import Qdisc
from qprof.collectors import qdiscs
from qprof.collectors.netstat import UdpSocketTable
from qprof.collectors.sockdiag import parse_messages

SENT = 200


def _ss_rows() -> dict[int, tuple[str, str, dict[str, int]]]:
    """inode -> (local, peer, skmem) from `ss -uamneH`, the reference the table is formatted after."""
    out = subprocess.run(["ss", "-uamneH"], capture_output=True, text=True, check=True).stdout
    rows: dict[int, tuple[str, str, dict[str, int]]] = {}
    last: int | None = None
    names = {"r": "rmem_alloc", "rb": "rcvbuf", "t": "wmem_alloc", "tb": "sndbuf", "d": "drops"}
    for line in out.splitlines():
        if "skmem:(" in line and last is not None:
            items = line.split("skmem:(")[1].split(")")[0].split(",")
            mem = {names[k]: int(i[len(k):]) for i in items for k in [i.rstrip("0123456789")] if k in names}
            rows[last] = (*rows[last][:2], mem)
        elif line and not line[0].isspace():
            parts = line.split()
            ino = next(int(p[4:]) for p in parts if p.startswith("ino:"))
            rows[ino], last = (parts[3], parts[4], {}), ino
    return rows


@pytest.mark.root
def test_udp_table_matches_ss_and_counts_every_drop(kernel_facing: None) -> None:
    """Every kind of UDP socket `ss` formats differently, and one receiver whose small buffer overflowed:
    the table agrees with `ss` field by field, and its drop count plus the datagrams still queued is
    exactly what was sent."""
    recv = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    recv.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    recv.bind(("0.0.0.0", 0))
    dual = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    dual.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    dual.bind(("::", 0))
    v6only = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    v6only.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    v6only.bind(("::", 0))
    send = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    send.bind(("127.0.0.1", 0))
    send.connect(("127.0.0.1", recv.getsockname()[1]))
    loop6 = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    loop6.bind(("::1", 0))
    loop6.connect(("::1", dual.getsockname()[1]))
    mapped = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    mapped.connect(("::ffff:127.0.0.1", recv.getsockname()[1]))
    bound = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    bound.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, b"lo")
    bound.bind(("127.0.0.1", 0))
    socks = [recv, dual, v6only, send, loop6, mapped, bound]
    table = UdpSocketTable([os.getpid()])
    try:
        for _ in range(SENT):
            send.send(b"x" * 1000)
        rows, err = table.read()
        ref = _ss_rows()
        assert err is None
        by_inode = {os.fstat(s.fileno()).st_ino: s for s in socks}
        mine = {r.fds[0]: r for r in rows if r.fds[0] in {s.fileno() for s in socks}}
        assert set(mine) == {s.fileno() for s in socks}
        for inode, s in by_inode.items():
            row = mine[s.fileno()]
            local, peer, mem = ref[inode]
            assert (row.local, row.peer) == (local, peer)
            assert {k: row.counters[k] for k in mem} == mem
            assert row.port == s.getsockname()[1] and row.pids == [os.getpid()]
        recv.setblocking(False)
        queued = 0
        while True:
            try:
                recv.recv(2048)
            except BlockingIOError:
                break
            queued += 1
        drops = mine[recv.fileno()].counters["drops"]
        assert drops > 0 and drops + queued == SENT
    finally:
        table.close()
        for s in socks:
            s.close()


@pytest.mark.root
def test_udp_table_reads_a_target_in_another_namespace(kernel_facing: None) -> None:
    if subprocess.run(["unshare", "--net", "true"], capture_output=True).returncode:
        pytest.skip("unshare --net unavailable (make test installs util-linux)")
    script = ("import socket, sys\n"
              "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(('127.0.0.1', 0))\n"
              "print(s.getsockname()[1], flush=True); sys.stdin.readline()\n")
    child = subprocess.Popen(["unshare", "--net", "sh", "-c", f"ip link set lo up && exec {sys.executable} -c \"$0\"",
                              script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    table = UdpSocketTable([child.pid])
    try:
        assert child.stdout is not None
        port = int(child.stdout.readline())
        time.sleep(0.05)  # the exec'd python holds the socket from here
        rows, err = table.read()
        assert err is None
        assert [(r.local, r.pids) for r in rows] == [(f"127.0.0.1:{port}", [child.pid])]
        # the same port is not bound in this namespace: the row came from the child's
        probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        probe.bind(("127.0.0.1", port))
        probe.close()
    finally:
        table.close()
        child.kill()
        child.wait()


def test_parser_takes_what_it_can_of_damaged_messages() -> None:
    assert parse_messages(b"") == ([], False, 0)
    assert parse_messages(b"\x01\x02") == ([], False, 0)
    hdr = struct.Struct("=IHHII")
    done = hdr.pack(hdr.size + 4, 3, 0, 1, 0) + b"\0" * 4
    assert parse_messages(done) == ([], True, 0)
    err = hdr.pack(hdr.size + 4, 2, 0, 1, 0) + struct.pack("=i", -13)
    assert parse_messages(err) == ([], True, 13)
    short = hdr.pack(hdr.size + 8, 20, 0, 1, 0) + b"\0" * 8  # a diag message too short to hold one
    assert parse_messages(short) == ([], False, 0)
    liar = hdr.pack(10_000, 20, 0, 1, 0) + b"\0" * 80  # claims more than there is
    assert parse_messages(liar) == ([], False, 0)
    msg = struct.pack("=BBBB2s2s16s16sIQIIIII", 2, 7, 0, 0, b"\x11\x51", b"\0\0", b"\x7f\0\0\x01" + bytes(12),
                      bytes(16), 0, 42, 0, 0, 0, 0, 99)
    attr = struct.pack("=HH", 4 + 3, 11) + b"\x01\0"  # claims 3 bytes, 2 are there: it gets those
    one = hdr.pack(hdr.size + len(msg) + len(attr), 20, 0, 1, 0) + msg + attr
    (sock,), more, code = parse_messages(one)
    assert (sock.local_port, sock.cookie, sock.inode, more, code) == (4433, 42, 99, False, 0)
    assert sock.attrs == {11: b"\x01\0"} and sock.v6only is True


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400))
def test_parser_never_raises_on_random_bytes(data: bytes) -> None:
    socks, done, code = parse_messages(data)
    assert isinstance(done, bool) and isinstance(code, int) and all(s.inode >= 0 for s in socks)


QDISC_SCRIPT = """
set -e
ip link set lo up
ip link add q0 type veth peer name q1
ip link set q0 up
ip link set q1 up
ip addr add 10.77.0.1/24 dev q0
ip neigh add 10.77.0.2 lladdr 02:00:00:00:00:02 dev q0
tc qdisc add dev q0 root handle 7: tbf rate 1mbit burst 2k limit 3k
exec "$0" -c 'import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for _ in range(300):
    s.sendto(b"x" * 1000, ("10.77.0.2", 9))
print("sent", flush=True)
sys.stdin.readline()'
"""


@pytest.mark.root
def test_qdiscs_read_as_tc_prints_them_in_another_namespace(kernel_facing: None) -> None:
    """A target in a namespace of its own behind a tbf shaper that it overran: the qdiscs read from
    rtnetlink are tc's, field by field (tc run in that namespace), the shaper's drops among them."""
    if subprocess.run(["unshare", "--net", "ip", "link", "add", "v0", "type", "veth", "peer", "name", "v1"],
                      capture_output=True).returncode:
        pytest.skip("unshare --net or veth unavailable here (make test installs util-linux, iproute2)")
    child = subprocess.Popen(["unshare", "--net", "sh", "-c", QDISC_SCRIPT, sys.executable], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "sent"
        deadline = time.monotonic() + 10
        while any(q.qlen for q in qdiscs.qdiscs(child.pid)) and time.monotonic() < deadline:
            time.sleep(0.01)  # the shaper sends what it queued (3 kB at 1 Mbit/s): the counters then stand still
        mine = qdiscs.qdiscs(child.pid)
        out = subprocess.run(["nsenter", f"--net=/proc/{child.pid}/ns/net", "tc", "-s", "-j", "qdisc", "show"],
                             capture_output=True, text=True, check=True).stdout
        shape = schema.shape_of(Qdisc)
        ref = tuple(schema.decode(Qdisc, q) for q in json.loads(out) if schema.conforms(q, shape))
        assert sorted(mine, key=repr) == sorted(ref, key=repr) and ref
        tbf = next(q for q in mine if q.kind == "tbf")
        assert (tbf.dev, tbf.handle) == ("q0", "7:") and tbf.drops > 0 and tbf.packets + tbf.drops >= 300
    finally:
        child.kill()
        child.wait()


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_qdisc_parser_never_raises_on_random_bytes(data: bytes) -> None:
    q = qdiscs.parse(data, {})
    assert q is None or isinstance(q, Qdisc)
