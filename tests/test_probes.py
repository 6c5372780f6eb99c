"""eBPF probes against ground truth: real kernel, real endpoints, exact counts, no leftovers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import QPROF, ROOT, qprof
from qprof.collectors.session import AttachOptions, AttachSession
from qprof.endpoints import StoppedProcess

pytestmark = [pytest.mark.root, pytest.mark.slow]
UDP_PAIR = ROOT / "tests" / "workloads" / "udp_pair.py"


def report_json(run: Path) -> dict:
    return json.loads(qprof("report", str(run), "--format", "json").stdout)


def bpf_state() -> tuple[set[str], set[str]]:
    """BPF program ids and perf-event attachments (pid:fd) alive on the host."""
    progs = json.loads(subprocess.run(["bpftool", "prog", "list", "-j"], capture_output=True, text=True).stdout or "[]")
    perf = json.loads(subprocess.run(["bpftool", "perf", "list", "-j"], capture_output=True, text=True).stdout or "[]")
    return {str(p["id"]) for p in progs}, {f"{p.get('pid')}:{p.get('fd')}" for p in perf}


def _holds(pid: str, path: Path) -> bool:
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(str(path)):
                return True
        except OSError:
            continue
    return False


def processes_using(path: Path, timeout: float = 15.0) -> list[str]:
    """Live processes whose command line names `path` or that hold a file under it (qprof's perf,
    bpftrace and libbpf probe runner do)."""
    deadline = time.monotonic() + timeout
    while True:
        users = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if "pytest" not in cmd and (str(path) in cmd or _holds(pid, path)):
                users.append(f"{pid}: {cmd[:120]}")
        if not users or time.monotonic() > deadline:
            return users
        time.sleep(0.2)


def sampling_cgroups_of(owner: int, timeout: float = 10.0) -> list[str]:
    """qprof's sampling cgroups (collectors.perfcgroup) that `owner` made and that still exist."""
    from qprof.collectors.perfcgroup import PREFIX
    from qprof.probes.features import find_hierarchy

    h = find_hierarchy()
    if h is None:
        return []
    deadline = time.monotonic() + timeout
    while True:
        left = [d for d, _, _ in os.walk(h.mount) if Path(d).name.startswith(f"{PREFIX}{owner}-")]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def orphan_programs(progs_before: set[str], timeout: float = 10.0) -> set[str]:
    """New BPF programs that no live process holds: left behind (other tools' programs are held;
    a program whose holder just exited is freed after an RCU grace period, hence the retries)."""
    from qprof.collectors.probes import owned_prog_ids

    deadline = time.monotonic() + timeout
    while True:
        held = {str(i) for i in owned_prog_ids({int(p) for p in os.listdir("/proc") if p.isdigit()})}
        orphans = bpf_state()[0] - progs_before - held
        if not orphans or time.monotonic() > deadline:
            return orphans
        time.sleep(0.2)


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


@pytest.mark.parametrize("how", ["normal", "target SIGKILL", "qprof SIGINT", "qprof SIGKILL"])
def test_no_probes_left_behind(probes_available: None, tmp_path: Path, how: str) -> None:
    progs0, _ = bpf_state()
    target = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(0.01)"])
    run = tmp_path / "run"
    try:
        att = subprocess.Popen([*QPROF, "attach", str(target.pid), "-o", str(run), "-d", "30"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while not (run / "probes.json").exists() or \
                "attach_seconds" not in json.dumps(json.loads((run / "probes.json").read_text())):
            assert att.poll() is None, att.communicate()[1]
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert len(bpf_state()[0] - progs0) > 0, "probes are attached while running"
        if how == "normal":
            att.send_signal(signal.SIGINT)  # the ordinary stop of an open-ended attach
        elif how == "target SIGKILL":
            target.kill()
        elif how == "qprof SIGINT":
            time.sleep(0.5)
            att.send_signal(signal.SIGINT)
        else:
            att.kill()
        att.wait(120)
    finally:
        target.kill()
        target.wait()
    assert processes_using(run) == [], "perf or a probe process outlived qprof"
    assert sampling_cgroups_of(att.pid) == [], "the sampling cgroup outlived qprof"
    assert orphan_programs(progs0) == set(), "BPF programs left behind"
    perf1 = bpf_state()[1]
    assert not [p for p in perf1 if p.split(":")[0] in {str(target.pid), str(att.pid)}], \
        "perf-event attachments left behind"
    assert open("/proc/sys/kernel/bpf_stats_enabled").read().strip() == "0"
    if how != "qprof SIGKILL":
        assert att.returncode == 0
        assert json.loads((run / "meta.json").read_text())["status"] == "complete"
    # whatever happened, what was collected is readable
    probes = json.loads((run / "probes.json").read_text())
    assert probes["groups"] == ["packetio"]


def test_packetio_without_clang_is_reported_and_sampling_goes_on(probes_available: None, tmp_path: Path) -> None:
    """Fault injection: a PATH holding every tool qprof runs except clang, and an empty probe cache."""
    import shutil

    bindir = tmp_path / "bin"
    bindir.mkdir()
    for tool in ("perf", "bpftool", "bpftrace", "unshare", "ss", "sh", "mount", "ip"):
        found = shutil.which(tool)
        if found:
            (bindir / tool).symlink_to(found)
    env = {**os.environ, "PATH": str(bindir), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    target = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        r = qprof("attach", str(target.pid), "-d", "1", "-o", str(tmp_path / "run"), env=env)
    finally:
        target.kill()
        target.wait()
    assert "clang not found" in r.stderr and "apt-get install clang" in r.stderr
    probes = json.loads((tmp_path / "run" / "probes.json").read_text())
    assert [u["probe"] for u in probes["unavailable"]] == ["packetio"]
    assert json.loads((tmp_path / "run" / "meta.json").read_text())["parse"]["samples"] > 100  # sampling went on


def test_packetio_object_is_built_once_per_kernel(probes_available: None, tmp_path: Path) -> None:
    from qprof.probes import libbpf

    first = libbpf.build("packetio", tmp_path)
    mtime = first.stat().st_mtime_ns
    assert libbpf.build("packetio", tmp_path) == first and first.stat().st_mtime_ns == mtime
    head = first.read_bytes()[:20]
    assert head[:4] == b"\x7fELF" and int.from_bytes(head[18:20], "little") == 247, "an ELF object for EM_BPF"
