"""The lab's path with delay and loss against the real kernel (the forwarder of lab/path in a third
namespace): the round-trip time a UDP ping-pong measures, the fraction a seeded loss drops and the
forwarder's own count of it, its CPU during a bulk transfer, and nothing left behind."""

from __future__ import annotations

import math
import os
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import ROOT
from qprof.netlab import NETNS_DIR, PREFIX, Lab, LabError, cleanup

pytestmark = [pytest.mark.root]

DELAY_MS = 15.0
# How far above 2 x the delay a round trip may come back. Measured here (2 CPUs, 2026-11-27, 50
# pings each run): as the network sees it (kernel receive timestamps on both ends, the echo's own
# turnaround taken out) median 0.15-0.3 ms above 30 ms, the slowest 0.2-0.5 ms above: that is the
# forwarder's wake-up twice (SCHED_FIFO, timer slack 1 ns; late by 30-100 us on average, a VM's
# idle vCPU waking); as Python measures it from sending to reading the echo, median 0.3-0.6 ms above,
# single pings up to 4 ms above when the endpoints (not real-time) wait for a CPU.
NET_SLACK_MS = 1.0  # the median and 90th percentile of the network's RTT
RTT_SLACK_MS = 2.0  # the median of the RTT Python measures
SO_TIMESTAMPNS = 35  # SOL_SOCKET: receive timestamps in ns (CLOCK_REALTIME), not named by Python's socket
SO_RCVBUFFORCE = 33  # SOL_SOCKET: SO_RCVBUF past net.core.rmem_max (root)
LOSS = 0.02
DATAGRAMS = 5000
DIRECTIONS = ("server_to_client", "client_to_server")  # the path's two directions, as the forwarder prints them


@pytest.fixture(scope="module")
def forwarder() -> Any:
    """lab.path.command, with the forwarder built (or taken from the cache)."""
    if os.geteuid() != 0:
        pytest.skip("the network lab needs root")
    for tool, pkg in (("ip", "iproute2"), ("tc", "iproute2"), ("ethtool", "ethtool")):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} missing (make test installs {pkg})")
    from lab.path import BuildUnavailable, binary, command

    try:
        binary()
    except BuildUnavailable as e:
        pytest.skip(str(e))
    return command


def no_ipv6(lab: Lab) -> None:
    """No IPv6 chatter (router solicitations, MLD) across the path while a test counts frames."""
    for role in ("server", "client"):
        with lab.entered(role):
            Path("/proc/sys/net/ipv6/conf/all/disable_ipv6").write_text("1")


ECHO = """
import socket, struct, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, 35, 1)  # SO_TIMESTAMPNS (Python names no constant for it)
s.bind((sys.argv[1], int(sys.argv[2])))
print("ready", flush=True)
while True:
    data, anc, _, peer = s.recvmsg(2048, 64)
    sec, nsec = struct.unpack("qq", anc[0][2][:16])  # the kernel's receive time (CLOCK_REALTIME)
    s.sendto(struct.pack("q", time.time_ns() - (sec * 10**9 + nsec)) + data[8:], peer)  # + how long it took here
"""


def echo_server(lab: Lab, port: int) -> subprocess.Popen[bytes]:
    """A UDP echo in the server's namespace that says in each reply how long it held the datagram."""
    p = lab.popen("server", [sys.executable, "-c", ECHO, lab.server_addr, str(port)], stdout=subprocess.PIPE)
    assert p.stdout is not None and p.stdout.readline() == b"ready\n"
    return p


def test_a_path_needs_its_forwarder_and_sane_settings() -> None:
    with pytest.raises(LabError, match="forwarder=lab.path.command"):
        Lab(delay_ms=5)
    with pytest.raises(LabError, match="loss 1.5 is out of range"):
        Lab(loss=1.5, forwarder=lambda spec: [])
    with pytest.raises(LabError, match="delay -1"):
        Lab(delay_ms=-1, forwarder=lambda spec: [])
    plain = Lab()
    assert not plain.has_path
    assert Lab(delay_ms=50, forwarder=lambda spec: []).path_queue_bytes == 6_250_000 + (2 << 20)  # 1 Gbit/s x 50 ms
    assert Lab(loss=0.1, forwarder=lambda spec: []).path_queue_bytes == 2 << 20  # one pass of the forwarder's reads


def test_rtt_is_twice_the_delay(forwarder: Any) -> None:
    """A UDP ping-pong across a path of 15 ms each way: 30 ms and a little, never less. The network's
    round trip is taken from kernel timestamps: the client's receive stamp minus its send time, less
    the time the echo held the datagram (its own receive stamp to its send), so neither side's
    scheduling counts; the round trip Python sees is printed and held to a looser bound."""
    with Lab(delay_ms=DELAY_MS, forwarder=forwarder) as lab:
        echo_server(lab, 7000)
        with lab.socket("client") as cli:
            cli.settimeout(2)
            cli.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            net, seen = [], []
            for i in range(53):
                payload = bytes(8) + i.to_bytes(4, "big") * 25
                t0, p0 = time.time_ns(), time.perf_counter()
                cli.sendto(payload, (lab.server_addr, 7000))
                data, anc, _, _ = cli.recvmsg(2048, 64)
                seen.append((time.perf_counter() - p0) * 1e3)
                assert data[8:] == payload[8:]
                sec, nsec = struct.unpack("qq", anc[0][2][:16])
                held = struct.unpack("q", data[:8])[0]
                net.append((sec * 10**9 + nsec - t0 - held) / 1e6)
                time.sleep(0.005)
        stats = lab.path_stats()
        fwd_pid = lab.forwarder_pid
    net, seen = sorted(net[3:]), sorted(seen[3:])  # the first exchanges resolve ARP (it crosses the path too)
    median, p90 = statistics.median(net), net[int(0.9 * len(net))]
    late = {d: (stats[d]["late_mean_us"], stats[d]["late_max_us"]) for d in DIRECTIONS}
    held_by = [stats[d]["late_held_over_500us"] for d in DIRECTIONS]
    print(f"\nRTT across a path of {DELAY_MS:g} ms each way ({len(net)} pings): network min {net[0]:.3f} median "
          f"{median:.3f} p90 {p90:.3f} max {net[-1]:.3f} ms; as Python sees it min {seen[0]:.3f} median "
          f"{statistics.median(seen):.3f} max {seen[-1]:.3f} ms; forwarder {stats['sched']}, "
          f"late (mean, max us) {late}, held off over 0.5 ms {held_by}")
    assert net[0] >= 2 * DELAY_MS, "a frame left the path before its delay"
    assert median <= 2 * DELAY_MS + NET_SLACK_MS
    # The slowest tenth may pass the bound (the 90th percentile within it), and one more ping for each frame
    # the forwarder was held off over half the slack (the guest's scheduler, or the host taking the VM's CPUs:
    # CI read its mean lateness 207-221 us, 2-7x a quiet host's, and the 90th percentile 31.15 ms).
    held = sum(held_by)
    over = sum(1 for r in net if r > 2 * DELAY_MS + NET_SLACK_MS)
    assert over <= len(net) - int(0.9 * len(net)) - 1 + held, (p90, over, held)
    assert 2 * DELAY_MS <= statistics.median(seen) <= 2 * DELAY_MS + RTT_SLACK_MS
    for d in DIRECTIONS:
        c = stats[d]
        assert c["forwarded"] >= 50 and c["random_drops"] == c["queue_drops"] == c["socket_drops"] == 0
    assert lab.path_final is not None and lab.path_final["event"] == "exit"
    assert not Path(f"/proc/{fwd_pid}").exists()


def test_loss_drops_the_fraction_asked_and_counts_it(forwarder: Any) -> None:
    with Lab(loss=LOSS, seed=7, forwarder=forwarder) as lab:
        no_ipv6(lab)
        with lab.socket("server") as srv, lab.socket("client") as cli:
            cli.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 16 << 20)  # past rmem_max: hold them all
            cli.bind((lab.client_addr, 9100))
            srv.connect((lab.client_addr, 9100))
            cli.settimeout(0.2)
            for _ in range(50):  # resolve ARP both ways (a lost reply is asked again)
                srv.send(b"warm-up")
                try:
                    if cli.recv(100) == b"warm-up":
                        break
                except socket.timeout:
                    continue
            else:
                pytest.fail("nothing crossed the path")
            time.sleep(0.3)
            while True:  # drain the warm-up's late copies
                try:
                    cli.recv(100)
                except socket.timeout:
                    break
            before = lab.path_stats()["server_to_client"]
            got: set[int] = set()
            for i in range(DATAGRAMS):
                srv.send(i.to_bytes(4, "big") + b"q" * 96)
                if i % 100 == 99:  # ~50k datagrams/s: well within what the path forwards
                    time.sleep(0.002)
            cli.settimeout(0.5)
            while True:
                try:
                    got.add(int.from_bytes(cli.recv(200)[:4], "big"))
                except socket.timeout:
                    break
        after = lab.path_stats()["server_to_client"]
    delta = {k: after[k] - before[k] for k in ("received", "forwarded", "random_drops", "queue_drops", "socket_drops")}
    missing = DATAGRAMS - len(got)
    fraction = len(got) / DATAGRAMS
    sd = math.sqrt(LOSS * (1 - LOSS) / DATAGRAMS)
    print(f"\nloss {LOSS}: {len(got)} of {DATAGRAMS} datagrams arrived ({fraction:.4f}; expected {1 - LOSS} "
          f"+- {4 * sd:.4f} at 4 sd); the forwarder counted {delta}")
    assert abs(fraction - (1 - LOSS)) <= 4 * sd
    assert delta["received"] == DATAGRAMS, "frames other than the test's crossed the path meanwhile"
    assert delta["random_drops"] == missing
    assert delta["queue_drops"] == delta["socket_drops"] == 0
    assert delta["forwarded"] == len(got)


BULK_RATE_MBIT = 200
BULK_SECONDS = 2.0
# The forwarder's CPU, measured here (2026-11-27) in this test: 0.10-0.13 cores, 6-8.5 us per frame
# (a third of it the receiving side's softirq work the kernel runs in its send calls); frames late
# by 0.2-0.6 ms at most, none by 1 ms. Alone with TCP over 5 ms each way: 0.08 cores at 100 Mbit/s,
# 0.22 at 500, 0.39 at 800, 5-8 us per frame; an ngtcp2 transfer 0.13 cores at 270 Mbit/s.
FORWARDER_MAX_CORES = 0.25
FORWARDER_MAX_US_PER_FRAME = 30.0
TCP_SINK = """
import socket, sys, time
l = socket.socket(); l.bind((sys.argv[1], 5001)); l.listen(1)
print("ready", flush=True)
c, _ = l.accept(); n = 0; t0 = None
while True:
    d = c.recv(1 << 20)
    if not d: break
    if t0 is None: t0 = time.monotonic()
    n += len(d)
print(n, time.monotonic() - t0, flush=True)
"""
TCP_SOURCE = """
import socket, sys, time
s = socket.create_connection((sys.argv[1], 5001)); buf = b"x" * (1 << 18); end = time.monotonic() + float(sys.argv[2])
while time.monotonic() < end: s.sendall(buf)
s.close()
"""
UDP_SEGMENT = 103  # SOL_UDP option: the kernel cuts one large send into datagrams of this size (GSO)


def test_bulk_transfer_through_a_delayed_path_costs_the_forwarder_little(forwarder: Any) -> None:
    """TCP from server to client at a tbf rate of 200 Mbit/s across 5 ms each way: the rate holds, the
    forwarder drops nothing and is never late by much, and its CPU is a small share of a core. Then a
    QUIC-like burst of UDP GSO sends: cut to MTU-sized frames before the path (no GSO frame reaches it)."""
    with Lab(delay_ms=5, rate_mbit=BULK_RATE_MBIT, forwarder=forwarder) as lab:
        sink = lab.popen("client", [sys.executable, "-c", TCP_SINK, lab.client_addr], stdout=subprocess.PIPE, text=True)
        assert sink.stdout is not None and sink.stdout.readline() == "ready\n"
        before = lab.path_stats()
        t0 = time.monotonic()
        source = lab.popen("server", [sys.executable, "-c", TCP_SOURCE, lab.client_addr, str(BULK_SECONDS)])
        assert source.wait(30) == 0
        nbytes, seconds = (float(x) for x in sink.stdout.readline().split())
        assert sink.wait(10) == 0
        after = lab.path_stats()
        wall = time.monotonic() - t0
        gso = udp_gso_burst(lab)
    down, up = after["server_to_client"], after["client_to_server"]
    frames = sum(after[d]["forwarded"] - before[d]["forwarded"] for d in DIRECTIONS)
    cpu = after["cpu_seconds"] - before["cpu_seconds"]
    goodput = nbytes * 8 / seconds / 1e6
    print(f"\nTCP across 5 ms each way, tbf {BULK_RATE_MBIT} Mbit/s: {goodput:.1f} Mbit/s of payload "
          f"in {seconds:.2f} s; "
          f"forwarder ({after['sched']}): {cpu:.3f} CPU s in {wall:.2f} s = {cpu / wall:.3f} cores, {frames} frames, "
          f"{cpu / frames * 1e6:.2f} us/frame; queued at most {down['max_queued_bytes']} bytes; late at most "
          f"{down['late_max_us']:.0f} us down, {up['late_max_us']:.0f} us up ({down['late_over_1ms']} and "
          f"{up['late_over_1ms']} frames over 1 ms; of its own work at most {down['late_own_max_us']:.0f} and "
          f"{up['late_own_max_us']:.0f} us, {down['late_own_over_1ms']} and {up['late_own_over_1ms']} over 1 ms; "
          f"longest oversleep {after['oversleep_max_us']:.0f} us); UDP GSO burst: {gso}")
    assert goodput >= 0.8 * BULK_RATE_MBIT * 1448 / 1514, "the rate limit's rate was not reached across the path"
    for c in (down, up):
        assert c["queue_drops"] == c["socket_drops"] == c["send_errors"] == c["random_drops"] == 0
        assert c["gso_frames"] == c["truncated"] == 0, "frames larger than the MTU reached the path"
    assert cpu / wall < FORWARDER_MAX_CORES, "the forwarder took a large share of a core"
    assert cpu / frames < FORWARDER_MAX_US_PER_FRAME * 1e-6
    # Frames late in all, 2026-11-28: 0-1.2% of them over 1 ms and up to 50 ms, 8-35% while the host took
    # the VM's CPUs away for 5-15 ms at a time; the forwarder cannot help that, and its counters take it
    # out where the guest sees it (steal, an oversleep). Not all of it: a stall the host spends in its
    # own work on the guest's behalf reads as the guest's CPU time (one of six over 2 ms in a minute of a
    # FIFO thread's duty cycle here). Late by its own reckoning: none over 1 ms on a quiet host, 0.2-1.2%
    # in the worst minutes; a forwarder waking 2 ms late made 55% late. One such stall makes every frame
    # due in it late: 2026-11-29, one of 33 ms made 540 of the 16,800 frames a second late (1.5%). So the
    # frames of the longest stall at the direction's rate are allowed beyond 1% (a forwarder waking 2 ms
    # late still fails by far; one that cannot keep up drops frames or misses the rate, checked above).
    for d, c in zip(DIRECTIONS, (down, up)):
        n = after[d]["forwarded"] - before[d]["forwarded"]
        allowed = 0.01 * n + n / wall * c["late_own_max_us"] / 1e6
        assert c["late_own_over_1ms"] <= allowed, ("the forwarder fell behind", d, c["late_own_over_1ms"], allowed)
    assert gso["received"] == gso["sent"] and gso["gso_frames"] == 0


def udp_gso_burst(lab: Lab, sends: int = 100, segments: int = 10, size: int = 1200) -> dict[str, int]:
    """`sends` UDP GSO sends of `segments` datagrams each from server to client; what arrived."""
    before = lab.path_stats()["server_to_client"]
    with lab.socket("server") as srv, lab.socket("client") as cli:
        cli.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 16 << 20)  # past rmem_max: hold them all
        cli.bind((lab.client_addr, 9200))
        srv.setsockopt(socket.IPPROTO_UDP, UDP_SEGMENT, size)
        for _ in range(sends):
            srv.sendto(b"g" * (size * segments), (lab.client_addr, 9200))
            time.sleep(0.0005)
        cli.settimeout(0.3)
        received = 0
        while True:
            try:
                received += len(cli.recv(65536)) == size
            except socket.timeout:
                break
    after = lab.path_stats()["server_to_client"]
    return {"sent": sends * segments, "received": received, "gso_frames": after["gso_frames"] - before["gso_frames"]}


def path_leftovers(lab_id: str, pid: int | None) -> list[str]:
    found = [p.name for p in NETNS_DIR.glob(f"{PREFIX}{lab_id}-*")] if NETNS_DIR.is_dir() else []
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    found += [line for line in links.splitlines() if f"ql{lab_id}" in line]
    if pid is not None and Path(f"/proc/{pid}").exists() and "forwarder" in Path(f"/proc/{pid}/comm").read_text():
        found.append(f"forwarder pid {pid}")
    found += [str(p) for p in Path("/run/qprof-lab").glob(f"{lab_id}.*")]
    return found


LAB_SCRIPT = """
import sys, time
sys.path.insert(0, {root!r})
from lab.path import path_lab
with path_lab(delay_ms=5, loss=0.01, loss_both=True) as lab:
    print(lab.id, lab.forwarder_pid, flush=True)
    time.sleep(600)
"""


def test_nothing_left_after_exit_or_a_killed_owner(forwarder: Any) -> None:
    with Lab(delay_ms=1, loss=0.5, loss_both=True, forwarder=forwarder) as lab:
        lab_id, pid = lab.id, lab.forwarder_pid
        assert f"{PREFIX}{lab_id}-path" in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                                          text=True).stdout
        assert lab.path_stats()["client_to_server"]["loss"] == 0.5
    assert path_leftovers(lab_id, pid) == []

    proc = subprocess.Popen([sys.executable, "-c", LAB_SCRIPT.format(root=str(ROOT))], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().split()
        assert len(line) == 2, proc.stderr.read() if proc.stderr else ""
        lab_id, pid = line[0], int(line[1])
        assert f"forwarder pid {pid}" in path_leftovers(lab_id, pid)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        assert path_leftovers(lab_id, pid), "a killed owner cannot clean up: its path is left over"
        removed = cleanup()
        assert any(f"{lab_id}-path" in r for r in removed), removed
        deadline = time.monotonic() + 5
        while path_leftovers(lab_id, pid) and time.monotonic() < deadline:  # the forwarder is not our child
            time.sleep(0.05)
        assert path_leftovers(lab_id, pid) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
