"""A service as its manager runs it (attach --cgroup), against the real thing.

A server with 4 worker processes behind SO_REUSEPORT (tests/workloads/workers.c), started in a
cgroup of its own as systemd or a container runtime starts a service, and a sender of 32 flows;
qprof follows the cgroup, default options, the sender attached as the client. Mid-run one worker
is stopped and the master replaces it: the new worker must be followed from its fork (its
datagrams as it counted them itself), the report must have all five workers and the master with
the killed one marked exited, and nothing about the service may change: no process moved, no
cgroup made inside it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import ROOT, build_c, qprof
from qprof.archive.model import Service
from qprof.collectors.service import resolve_cgroup, v2_hierarchy
from qprof.collectors.session import AttachOptions, AttachSession
from qprof.endpoints import StoppedProcess
from qprof.errors import QprofError
from qprof.probes.features import Hierarchy

from test_probes import agrees, report_json

pytestmark = [pytest.mark.root, pytest.mark.slow]
WORKERS = ROOT / "tests" / "workloads" / "workers.c"
SECONDS, RATE, FLOWS = 3.0, 8000, 32
KILL_AT = 1.2  # s after the sender starts


def _hierarchy() -> Hierarchy:
    try:
        return v2_hierarchy()
    except QprofError as e:
        pytest.skip(str(e))


@pytest.fixture
def service_cgroup() -> "Path":
    """A cgroup of the service's own, as a service manager makes one; everything left in it killed after."""
    h = _hierarchy()
    cg = h.mount / f"qprof-test-service-{os.getpid()}"
    cg.mkdir()
    try:
        yield cg
    finally:
        for _ in range(50):
            procs = (cg / "cgroup.procs").read_text().split()
            if not procs:
                break
            for p in procs:
                try:
                    os.kill(int(p), signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.05)
        cg.rmdir()


def _cgroup_line(pid: int) -> str | None:
    try:
        return next((ln for ln in Path(f"/proc/{pid}/cgroup").read_text().splitlines() if ln.startswith("0::")), None)
    except OSError:
        return None


def test_a_worker_replaced_mid_run_is_followed_and_nothing_of_the_service_changes(
        probes_available: None, service_cgroup: Path, tmp_path: Path) -> None:
    exe = build_c(WORKERS, "workers", [])
    procs_file = service_cgroup / "cgroup.procs"
    master = subprocess.Popen([str(exe), "serve", "4"], stdout=subprocess.PIPE, text=True,
                              preexec_fn=lambda: procs_file.write_text("0"))
    sender: StoppedProcess | None = None
    try:
        assert master.stdout is not None
        port = int(master.stdout.readline().split()[1])
        workers = [int(p) for p in procs_file.read_text().split() if int(p) != master.pid]
        assert len(workers) == 4
        placed = {p: _cgroup_line(p) for p in [master.pid, *workers]}
        sender = StoppedProcess([str(exe), "send", str(port), str(SECONDS), str(RATE), str(FLOWS)],
                                stdout=subprocess.PIPE, text=True)
        started: list[float] = []
        seen_inside: set[str] = set()
        moved: list[str] = []

        def release() -> None:
            assert sender is not None
            sender.release()
            started.append(time.monotonic())

        def watch() -> bool:
            """Mid-run: stop one worker (the master replaces it); every tick, check nothing was moved."""
            assert sender is not None
            seen_inside.update(d.name for d in service_cgroup.iterdir() if d.is_dir())
            moved.extend(f"{p}: {placed[p]} -> {now}" for p in placed
                         if (now := _cgroup_line(p)) is not None and now != placed[p])
            if started and time.monotonic() - started[0] > KILL_AT and workers[0] in placed:
                os.kill(workers[0], signal.SIGTERM)
                placed.pop(workers[0])
            return sender.poll() is not None and time.monotonic() - started[0] > SECONDS + 0.5

        name = resolve_cgroup(str(service_cgroup), _hierarchy(), "server")
        run = tmp_path / "run"
        AttachSession(AttachOptions(pids=[sender.pid], roles={sender.pid: "client"}, out=run, services=[name]),
                      on_ready=release, stop_when=watch).run()
        sent = [int(x) for x in sender.communicate(timeout=30)[0].split()[1:]]
        master.send_signal(signal.SIGTERM)
        lines = master.communicate(timeout=30)[0].splitlines()
    finally:
        for p in (sender, master):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
    replaced = [ln.split() for ln in lines if ln.startswith("replaced")]
    assert len(replaced) == 1 and int(replaced[0][1]) == workers[0]
    new = int(replaced[0][2])
    truth = {int(f[1]): (int(f[2]), int(f[3])) for f in (ln.split() for ln in lines if ln.startswith("worker"))}
    assert set(truth) == {*workers, new}
    # the stopped worker leaves what was queued on its socket unread: a few datagrams at most
    assert 0.99 * sent[0] <= sum(d for d, _ in truth.values()) <= sent[0]
    assert not moved, f"a process of the service changed cgroup: {moved}"
    assert not seen_inside, f"qprof made cgroups inside the service's: {seen_inside}"

    report = report_json(run)
    svc = report["services"]
    assert [s["name"] for s in svc] == [name.name] and svc[0]["role"] == "server"
    members = {p["pid"]: p for p in svc[0]["processes"]}
    assert set(members) == {master.pid, *workers, new}, "the service's five workers and its master"
    assert members[new]["joined_s"] is not None and 0 < members[new]["joined_s"] < SECONDS + 1
    assert all(members[p]["joined_s"] is None for p in [master.pid, *workers])
    assert members[workers[0]]["exited"] and not any(members[p]["exited"] for p in [*workers[1:], new])
    meta = json.loads((run / "meta.json").read_text())
    roles = {t["pid"]: t["role"] for t in meta["targets"]}
    assert all(roles[p] == "server" for p in members) and roles[sender.pid] == "client"
    pio = report["packet_io"]["processes"]
    bad, off = [], {}
    for pid, (dgrams, nbytes) in truth.items():
        assert members[pid]["samples"] > 0, f"worker {pid} has no samples"
        est = pio[str(pid)]["estimates"]
        for key, want in (("rx.datagrams", dgrams), ("rx.bytes", nbytes)):
            if not agrees(est[key], want, widen=3.0):
                bad.append(f"worker {pid} {key}: truth {want}, {est[key]}")
        e = est["rx.datagrams"]
        lo, hi = e["interval"] or (e["value"], e["value"])
        off[pid] = round((e["value"] - dgrams) / max(hi - e["value"], e["value"] - lo, 1.0), 2)
    print(f"\nworkers {sorted(truth)} (new {new} joined at {members[new]['joined_s']} s): received "
          f"{ {p: d for p, (d, _) in truth.items()} }, estimates off by {off} half-widths; disagreeing: {bad}")
    assert not bad
    evidence = report["verdict"]["evidence"]  # each process judged, and the service as one side
    assert {f"server {p}" for p in [*workers, new]} | {f"server service {name.name}", "client"} <= set(evidence)
    assert sorted(evidence[f"server service {name.name}"]["members"]) == sorted([*workers, new])
    text = qprof("report", str(run)).stdout
    assert f"server service {name.name}: 6 processes, 1 joined during the run, 1 exited" in text


def test_a_cgroup_is_named_by_its_directory_or_its_path(service_cgroup: Path) -> None:
    h = _hierarchy()
    rel = "/" + service_cgroup.name
    assert resolve_cgroup(str(service_cgroup), h).name == rel
    assert resolve_cgroup(rel, h).name == rel
    assert resolve_cgroup(service_cgroup.name + "/", h, "client") == Service(rel, "client")


@pytest.mark.parametrize("arg, says", [("/no-such-service.service", "no cgroup '/no-such-service.service'"),
                                       ("/", "is the root cgroup"), ("", "--cgroup needs a path")])
def test_a_wrong_cgroup_is_refused_in_one_line(arg: str, says: str) -> None:
    with pytest.raises(QprofError, match=re.escape(says)):
        resolve_cgroup(arg, _hierarchy())


def test_unit_and_empty_cgroup_errors_from_the_command_line(service_cgroup: Path, tmp_path: Path) -> None:
    r = qprof("attach", "--unit", "quic.service", "-d", "1", "-o", str(tmp_path / "a"), check=False)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode != 0 and len(lines) == 1
    if not Path("/run/systemd/system").is_dir():  # this host's service manager is not systemd
        assert "needs systemd as the service manager" in lines[0] and "--cgroup" in lines[0]
    r = qprof("attach", "--server-cgroup", str(service_cgroup), "-d", "1", "-o", str(tmp_path / "b"), check=False)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode != 0 and len(lines) == 1 and "holds no process: start the service first" in lines[0]
    assert not (tmp_path / "b").exists()
