"""TCP byte counters from sock_diag: a real loopback connection counted to the byte, live and after close,
in this namespace and in another one (the netlink parser's tests are in test_sockdiag)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from qprof.collectors.tcpinfo import TcpDiag
from qprof.collectors import traffic
from qprof.collectors.traffic import TrafficRecorder

N = 3_000_000


def _pair() -> tuple[socket.socket, socket.socket, socket.socket]:
    lst = socket.socket()
    lst.bind(("127.0.0.1", 0))
    lst.listen()
    cli = socket.create_connection(lst.getsockname())
    srv, _ = lst.accept()
    return lst, cli, srv


def _drain(sock: socket.socket, n: int) -> None:
    got = 0
    while got < n:
        got += len(sock.recv(1 << 20))


@pytest.mark.root
def test_live_and_destroyed_counters_are_exact(kernel_facing: None) -> None:
    diag = TcpDiag(os.getpid())
    lst, cli, srv = _pair()
    try:
        reader = threading.Thread(target=_drain, args=(srv, N))
        reader.start()
        cli.sendall(os.urandom(N))
        reader.join()
        srv.sendall(b"x" * 1000)
        _drain(cli, 1000)
        port = cli.getsockname()[1]
        live = {s.cookie: s for s in diag.dump() if s.local.endswith(f":{port}")}
        (mine,) = live.values()
        assert mine.inode == os.fstat(cli.fileno()).st_ino
        assert (mine.payload_sent, mine.bytes_received) == (N, 1000)
        assert mine.bytes_acked == N + 1  # and the SYN
    finally:
        for s in (cli, srv, lst):
            s.close()
    deadline = time.monotonic() + 5
    gone: dict[int, object] = {}
    while mine.cookie not in gone and time.monotonic() < deadline:
        gone.update({s.cookie: s for s in diag.destroyed()})
        time.sleep(0.02)
    last = gone[mine.cookie]
    # the FIN takes a sequence number each way: received is one over once the peer closed
    assert last.payload_sent == N and last.bytes_received in (1000, 1001)  # type: ignore[attr-defined]
    assert diag.lost_events == 0
    diag.close()


@pytest.mark.root
def test_recorder_counts_a_process_in_another_namespace(kernel_facing: None, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A child in a network namespace of its own sends to itself over TCP: the recorder finds its sockets
    there, counts both ends to the byte while open, and keeps the last counters after they close.
    Polls skip the dump while the namespace's TCP counts stand still (the periodic dump is pushed past
    the test), and the connection's opening alone makes the next poll dump and find it."""
    monkeypatch.setattr(traffic, "FULL_DUMP_S", 3600.0)
    if subprocess.run(["unshare", "--net", "true"], capture_output=True).returncode:
        pytest.skip("unshare --net unavailable (make test installs util-linux)")
    script = (
        "import socket, sys, time\n"
        "sys.stdin.readline()\n"
        "l = socket.socket(); l.bind(('127.0.0.1', 0)); l.listen()\n"
        "c = socket.create_connection(l.getsockname()); s, _ = l.accept()\n"
        f"c.sendall(b'a' * {N}); got = 0\n"
        f"while got < {N}: got += len(s.recv(1 << 20))\n"
        "print('sent', flush=True); sys.stdin.readline(); c.close(); s.close()\n")
    child = subprocess.Popen(["unshare", "--net", "sh", "-c", f"ip link set lo up && exec {sys.executable} -c \"$0\"",
                              script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        time.sleep(0.3)
        assert child.poll() is None
        rec = TrafficRecorder(tmp_path, [child.pid])
        rec.start(time.monotonic())
        for _ in range(5):
            rec.poll(time.monotonic(), {})
        assert rec.record().dumps == 1  # the start's: nothing opened or closed since
        assert child.stdin is not None and child.stdout is not None
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "sent"
        mid = rec.poll(time.monotonic(), {})
        assert mid.tcp[child.pid] == (N, N)  # both ends are the child's: N out, N in
        assert rec.record().dumps == 2
        child.stdin.write("close\n")
        child.stdin.flush()
        child.wait(10)
        time.sleep(0.1)
        last = rec.finish(time.monotonic(), {})
        sent, received = last.tcp[child.pid]
        assert sent == N and N <= received <= N + 2  # a FIN each way
        record = json.loads((tmp_path / "tcp.json").read_text())
        assert any(s["closed"] for s in record["sockets"]) and rec.errors == []
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()
