"""eBPF probes against ground truth: real kernel, real endpoints, exact counts.
(Nothing left behind however a run ends: tests/test_faults.py.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, qprof
from qprof.collectors.session import AttachOptions, AttachSession
from qprof.endpoints import StoppedProcess

pytestmark = [pytest.mark.root, pytest.mark.slow]
UDP_PAIR = ROOT / "tests" / "workloads" / "udp_pair.py"


def report_json(run: Path) -> dict:
    return json.loads(qprof("report", str(run), "--format", "json").stdout)


def test_plain_sender_exactly_one_datagram_per_send_and_drops_counted_exactly(
        probes_available: None, tmp_path: Path) -> None:
    n, size = 3000, 1200
    sink = subprocess.Popen([sys.executable, str(UDP_PAIR), "sink", "4096"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert sink.stdout is not None and sink.stdin is not None
        port = int(sink.stdout.readline())
        sender = StoppedProcess([sys.executable, str(UDP_PAIR), "send", str(port), str(n), str(size)])
        received: list[int] = []

        def drained() -> bool:
            if sender.poll() is None:
                return False
            sink.stdin.write("drain\n")
            sink.stdin.flush()
            received.append(int(sink.stdout.readline()))  # the sink keeps its socket open
            return True

        run = tmp_path / "run"
        AttachSession(AttachOptions(pids=[sink.pid, sender.pid], out=run, probes=("packetio", "syscalls")),
                      on_ready=sender.release, stop_when=drained).run()
    finally:
        if sink.stdin is not None:
            sink.stdin.close()
        sink.kill()
        sink.wait()
    assert sender.returncode == 0
    dropped = n - received[0]
    assert dropped > n // 2, "a paused receiver with a 4 KiB buffer drops most datagrams"
    pio = report_json(run)["packet_io"]
    snd, rcv = pio["processes"][str(sender.pid)], pio["processes"][str(sink.pid)]
    print(f"\nsent {n}, received {received[0]}, dropped {dropped}; qprof: {rcv['drops']}")
    assert snd["tx"]["messages"] == n and snd["tx"]["datagrams"] == n and snd["tx"]["syscalls"] == n
    assert snd["tx"]["datagrams_per_syscall"] == 1.0
    assert snd["gso"]["enabled"] == "no" and snd["gso"]["gso_sends"] == 0
    assert snd["syscall_time"]["sendto"]["calls"] == n and snd["syscall_time"]["sendto"]["total_s"] > 0
    assert rcv["rx"]["datagrams"] == received[0] and rcv["rx"]["messages"] == received[0]
    assert rcv["drops"] == {"SOCKET_RCVBUFF": dropped}
    (sock,) = rcv["sockets"]
    assert sock["last"]["drops"] - sock["first"]["drops"] == dropped
    assert sock["last"]["rcvbuf"] <= 2 * 4096 + 4096, "SO_RCVBUF as the kernel applied it"
    mib = next(iter(pio["udp_mib_delta"].values()))
    assert mib["RcvbufErrors"] >= dropped
    recs = report_json(run)["recommendations"]
    assert any(r["topic"] == "receive buffer" and r["pid"] == sink.pid for r in recs)


def test_ngtcp2_server_sends_with_gso(probes_available: None, ngtcp2_tools: None, tmp_path: Path) -> None:
    run = tmp_path / "run"
    qprof("demo", "--size", "256M", "-o", str(run))
    rep = report_json(run)
    roles = {p["role"]: p["pid"] for p in rep["processes"]}
    srv = rep["packet_io"]["processes"][str(roles["server"])]
    cli = rep["packet_io"]["processes"][str(roles["client"])]
    print("\nserver gso:", srv["gso"], "client rx:", cli["rx"])
    assert srv["gso"]["gso_sends"] > 0 and srv["gso"]["segments_per_gso_send"] > 1
    assert srv["tx"]["datagrams_per_syscall"] > 1
    # what the server sent is what the client received or the kernel dropped; the demo's veth can
    # also drop whole GSO skbs (one kfree_skb for many datagrams), so the books balance from below
    got = cli["rx"]["datagrams"] + sum(cli["drops"].values())
    assert 0.9 * srv["tx"]["datagrams"] <= got <= srv["tx"]["datagrams"]
    assert cli["gro"]["enabled"] == "no" and cli["rx"]["datagrams_per_syscall"] == pytest.approx(1.0, abs=0.01)
    cost = rep["packet_io"]["probe_cost"]
    assert cost["bpf_run_cnt"] > 0 and cost["bpf_run_time_ns"] > 0, "probe cost is measured"
