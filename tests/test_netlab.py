"""The network lab against the real kernel: reachability, the rate limit and the CPU cap as
measured from outside, and nothing left behind however the lab ends."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conftest import ROOT
from lab.scenarios import ReceiveBufferClamp
from qprof.netlab import NETNS_DIR, PREFIX, STATE_DIR, Hog, Lab, cleanup, cpu_cgroups, lab_roots, pressure_root

pytestmark = [pytest.mark.root]
HZ = os.sysconf("SC_CLK_TCK")
WIRE_OVERHEAD = 14 + 20 + 8  # Ethernet, IPv4, UDP headers: what tbf counts beside the payload


@pytest.fixture(scope="module")
def lab_tools() -> None:
    if os.geteuid() != 0:
        pytest.skip("the network lab needs root")
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} missing (make test installs iproute2)")


def leftovers(lab_id: str) -> list[str]:
    """Anything of lab `lab_id` still on the host."""
    found = [p.name for p in NETNS_DIR.glob(f"{PREFIX}{lab_id}-*")] if NETNS_DIR.is_dir() else []
    ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    found += [line for line in ns.splitlines() if lab_id in line]
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    found += [line for line in links.splitlines() if f"ql{lab_id}" in line]
    found += [str(root / f"{PREFIX}{lab_id}") for root in lab_roots() if (root / f"{PREFIX}{lab_id}").exists()]
    if (STATE_DIR / f"{lab_id}.json").exists():
        found.append(str(STATE_DIR / f"{lab_id}.json"))
    return found


def cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def test_udp_echo_between_namespaces_and_isolation(lab_tools: None) -> None:
    with Lab() as lab:
        srv = lab.socket("server")
        cli = lab.socket("client")
        with srv, cli:
            srv.bind((lab.server_addr, 7777))
            srv.settimeout(5)
            cli.settimeout(5)
            for i in range(5):
                msg = f"ping {i}".encode()
                cli.sendto(msg, (lab.server_addr, 7777))
                data, peer = srv.recvfrom(100)
                assert data == msg and peer[0] == lab.client_addr
                srv.sendto(data.replace(b"ping", b"pong"), peer)
                assert cli.recvfrom(100) == (f"pong {i}".encode(), (lab.server_addr, 7777))
        for role in ("server", "client"):
            out = subprocess.run(["ip", "-n", lab.netns(role), "-o", "link"], capture_output=True, text=True).stdout
            assert "lo: <LOOPBACK,UP" in out
            assert f"{lab.link(role)}@" in out and "mtu 1500" in out.split(lab.link(role))[1]
        # the addresses exist only inside the namespaces: none on this host, no route to them here
        assert lab.server_addr not in subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True).stdout
        routes = subprocess.run(["ip", "-4", "route"], capture_output=True, text=True).stdout
        assert f"10.77.{lab.n}." not in routes


def test_rate_limit_observed_at_the_receiver(lab_tools: None) -> None:
    rate_mbit = 100
    seconds, payload = 3.0, 1400
    with Lab(rate_mbit=rate_mbit) as lab:
        rx = lab.socket("server")
        with rx:
            rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
            rx.bind((lab.server_addr, 9000))
            rx.settimeout(5)
            # the sender offers 2.5x the shaped rate, paced per millisecond, from the client namespace
            sender = textwrap.dedent(f"""
                import socket, time
                s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                buf = b"x" * {payload}
                per_ms = int({rate_mbit} * 2.5 * 1e6 / 8 / {payload + WIRE_OVERHEAD} / 1000) + 1
                end = time.monotonic() + {seconds}
                while (now := time.monotonic()) < end:
                    for _ in range(per_ms):
                        s.sendto(buf, ("{lab.server_addr}", 9000))
                    time.sleep(max(0.0, 0.001 - (time.monotonic() - now)))
            """)
            proc = lab.popen("client", [sys.executable, "-c", sender])
            rx.recv(65536)
            start = time.monotonic()
            got, window = 0, (start + 0.5, start + seconds - 0.5)  # steady state: after the bucket's burst
            while True:
                try:
                    n = rx.recv(65536)
                except socket.timeout:
                    break
                now = time.monotonic()
                if window[0] <= now < window[1]:
                    got += 1
                elif now >= window[1]:
                    break
                assert len(n) == payload
            assert proc.wait(10) == 0
        measured = got * (payload + WIRE_OVERHEAD) * 8 / (window[1] - window[0]) / 1e6
        print(f"\ntbf {rate_mbit} Mbit/s: receiver measured {measured:.1f} Mbit/s on the wire "
              f"({measured * payload / (payload + WIRE_OVERHEAD):.1f} Mbit/s of payload)")
        assert measured == pytest.approx(rate_mbit, rel=0.25)


def test_cpu_cap_observed_from_proc(lab_tools: None) -> None:
    if cpu_cgroups() is None:
        pytest.skip("no cgroup hierarchy with the cpu controller")
    with Lab(cpu={"client": 0.3}) as lab:
        capped = lab.popen("client", [sys.executable, "-c", "while True: pass"])
        free = lab.popen("server", [sys.executable, "-c", "while True: pass"])
        time.sleep(0.5)
        t0, c0, f0 = time.monotonic(), cpu_ticks(capped.pid), cpu_ticks(free.pid)
        time.sleep(3.0)
        took = time.monotonic() - t0
        cores = (cpu_ticks(capped.pid) - c0) / HZ / took
        free_cores = (cpu_ticks(free.pid) - f0) / HZ / took
        stat = lab.throttling("client")
        print(f"\ncapped at 0.3: busy loop got {cores:.3f} cores (uncapped one beside it: {free_cores:.2f}); "
              f"cpu.stat {stat}")
        assert cores == pytest.approx(0.3, abs=0.1)
        assert stat.get("nr_throttled", 0) > 0
        assert free_cores > 0.45, "the uncapped role is not capped"


def test_affinity_cpuset_weight_and_a_busy_neighbour_as_set(lab_tools: None) -> None:
    """What the verdict's contention scenarios build, seen from /proc and the cgroup files; all removed after."""
    if (os.cpu_count() or 1) < 2:
        pytest.skip("affinity and cpuset placement need two CPUs; this host has one")
    with Lab(cpus={"server": (0,)}, cpusets={"client": (1,)}, weights={"client": 8.0},
             hogs=(Hog(cpus=(0,)), Hog(cpuset_of="client"))) as lab:
        lab_id = lab.id
        srv, cli = lab.popen("server", ["sleep", "60"]), lab.popen("client", ["sleep", "60"])
        hogs = [p for p in lab._procs if p not in (srv, cli)]
        assert os.sched_getaffinity(srv.pid) == {0} and os.sched_getaffinity(cli.pid) == {1}
        assert [os.sched_getaffinity(h.pid) for h in hogs] == [{0}, {1}]
        cpu = cpu_cgroups()
        assert cpu is not None
        weight = "cpu.shares" if cpu.version == 1 else "cpu.weight"
        assert (lab.cgroup("client") / weight).read_text().strip() == ("8192" if cpu.version == 1 else "800")
        if pressure_root() is not None:  # a v2 cgroup each, for per-side CPU pressure
            v2 = [line for line in Path(f"/proc/{srv.pid}/cgroup").read_text().splitlines() if line.startswith("0::")]
            assert v2 == [f"0::/{PREFIX}{lab_id}/server"]
        t0, c0 = time.monotonic(), cpu_ticks(hogs[0].pid)
        time.sleep(1.0)
        cores = (cpu_ticks(hogs[0].pid) - c0) / HZ / (time.monotonic() - t0)
        print(f"\nbusy neighbour on CPU 0: {cores:.2f} cores")
        assert cores > 0.3, "the busy neighbour does not run"
    assert leftovers(lab_id) == []
    assert all(h.poll() is not None for h in hogs)


def test_without_own_cgroups_everything_shares_the_shells(lab_tools: None) -> None:
    """The scenarios with no cgroup made for the sides: server, client and busy neighbour share one v2 cgroup
    (and the creator's cpu cgroup); a capped role shares its capped cgroup with the hog that says so."""
    me = _cpu_line(os.getpid())
    with Lab(own_cgroups=False, cpu={"client": 0.3}, hogs=(Hog(), Hog(quota_of="client"))) as lab:
        lab_id = lab.id
        srv, cli = lab.popen("server", ["sleep", "60"]), lab.popen("client", ["sleep", "60"])
        free, capped = [p for p in lab._procs if p not in (srv, cli)]
        cpu = cpu_cgroups()
        assert cpu is not None
        if cpu.version == 1:
            assert _cpu_line(srv.pid) == _cpu_line(free.pid) == me, "no cpu cgroup made for them"
        assert _cpu_line(cli.pid) == _cpu_line(capped.pid) != me and lab.cgroup("client") is not None
        if pressure_root() is not None:
            shell = {_v2_line(p.pid) for p in (srv, cli, free, capped)}
            assert shell == {f"0::/{PREFIX}{lab_id}/shell"}, shell
    assert leftovers(lab_id) == []
    with pytest.raises(Exception, match="CPU weights need a cgroup per role"):
        Lab(own_cgroups=False, weights={"client": 8.0})
    with pytest.raises(Exception, match="quota that is not set"):
        Lab(own_cgroups=False, hogs=(Hog(quota_of="server"),))


def _cpu_line(pid: int) -> str:
    return next(ln.split(":", 2)[2] for ln in Path(f"/proc/{pid}/cgroup").read_text().splitlines()
                if "cpu" in ln.split(":")[1].split(",") or ln.startswith("0::"))


def _v2_line(pid: int) -> str:
    return next(ln for ln in Path(f"/proc/{pid}/cgroup").read_text().splitlines() if ln.startswith("0::"))


RAISER = """
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("127.0.0.1", 0))
SO_RCVBUFFORCE = 33
for i in range(400):
    if i in (0, 100):  # raise it, as stacks do at start and some again later
        s.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 1 << 20)
    print(s.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF), flush=True)
    time.sleep(0.01)
"""


def test_receive_buffer_clamp_holds_a_running_programs_buffer(lab_tools: None) -> None:
    """The receive-buffer scenario's clamp: a program that raises its buffer, twice, is set back each time."""
    proc = subprocess.Popen([sys.executable, "-c", RAISER], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    sizes = [int(proc.stdout.readline())]
    clamp = ReceiveBufferClamp(proc.pid, 4096, interval=0.005).start()
    try:
        sizes += [int(line) for line in proc.stdout]
    finally:
        clamp.stop()
        proc.wait(10)
    assert sizes[0] == 2 << 20  # the kernel doubles what is asked
    assert sizes.index(8192) < 100, "not set back before the program's second raise"
    assert sizes[-1] == 8192 and clamp.sets >= 2, "the second raise was not set back"


def test_transfer_placed_in_namespaces_and_cgroups(lab_tools: None) -> None:
    """Transfer's placement: the real programs (not a wrapper) start in their namespace and cgroup."""
    if shutil.which("gtlsserver") is None or shutil.which("gtlsclient") is None:
        pytest.skip("ngtcp2 tools missing (make test installs ngtcp2-server, ngtcp2-client)")
    from lab.transfers import Ngtcp2Transfer

    with Lab(cpu={"server": 0.5}) as lab:
        with Ngtcp2Transfer(8 << 20, host=lab.server_addr, placement=lab.placements()) as xfer:
            server = xfer.start_server()
            client = xfer.start_client_stopped()
            for pid, role, comm in ((server, "server", "gtlsserver"), (client, "client", "gtlsclient")):
                assert Path(f"/proc/{pid}/comm").read_text().strip() == comm  # held at the real program
                assert os.stat(f"/proc/{pid}/ns/net").st_ino == os.stat(lab.netns_path(role)).st_ino
                assert str(lab.cgroup(role)).endswith(f"{PREFIX}{lab.id}/{role}")
                assert str(pid) in (lab.cgroup(role) / "cgroup.procs").read_text().split()  # type: ignore[operator]
            xfer.release_client()
            assert xfer.client is not None and xfer.client.wait(60) == 0


def test_nothing_left_after_exit_or_exception(lab_tools: None) -> None:
    with Lab(rate_mbit=50, cpu={"server": 0.3}) as lab:
        lab_id = lab.id
        assert leftovers(lab_id)
    assert leftovers(lab_id) == []

    with pytest.raises(RuntimeError, match="boom"):
        with Lab(rate_mbit=50, cpu={"server": 0.3, "client": 0.5}) as lab:
            lab_id = lab.id
            sleeper = lab.popen("server", ["sleep", "600"])
            # a process started some other way, found through the namespace and cgroup
            stray = subprocess.Popen(["sleep", "600"], preexec_fn=lab.placement("client").preexec)
            raise RuntimeError("boom")
    assert leftovers(lab_id) == []
    assert sleeper.poll() is not None
    stray.wait(5)


LAB_SCRIPT = """
import sys, time
sys.path.insert(0, {root!r})
from qprof.netlab import Lab
with Lab(rate_mbit=50, cpu={{"server": 0.3}}) as lab:
    lab.popen("client", ["sleep", "600"])
    print(lab.id, flush=True)
    time.sleep(600)
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
def test_nothing_left_after_a_signal(lab_tools: None, sig: signal.Signals) -> None:
    """SIGINT and SIGTERM tear the lab down; after SIGKILL the next cleanup() does.

    The lab script gets SIGINT's default disposition, as a command run from a terminal has: when the
    suite itself runs as a background job of a non-interactive shell (`make test &` in a script),
    SIGINT is ignored and that would be inherited, and an ignored Ctrl-C stops nothing."""
    proc = subprocess.Popen([sys.executable, "-c", LAB_SCRIPT.format(root=str(ROOT))], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert proc.stdout is not None
        lab_id = proc.stdout.readline().strip()
        assert lab_id and leftovers(lab_id)
        proc.send_signal(sig)
        proc.wait(30)
        if sig == signal.SIGKILL:
            assert leftovers(lab_id), "a killed owner cannot clean up: its lab is left over"
            removed = cleanup()
            assert any(lab_id in r for r in removed), removed
        assert leftovers(lab_id) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_cleanup_leaves_a_live_lab_alone(lab_tools: None) -> None:
    with Lab() as lab:
        cleanup()
        assert len(leftovers(lab.id)) >= 3  # two namespaces, the cgroup, the state file
        with lab.socket("server") as s:
            s.bind((lab.server_addr, 0))
