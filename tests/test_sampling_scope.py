"""Sampling kept to the targets in the kernel (collectors.perfcgroup): real perf, real cgroupfs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import qprof
from qprof.collectors.perfcgroup import PREFIX, cleanup_leftovers
from qprof.collectors import procfs
from qprof.collectors.procfs import outer_path
from qprof.probes.features import cgroups_of, find_hierarchy, parse_cgroups

BUSY = [sys.executable, "-c", "while True: pass"]


def _pids_in(run: Path) -> set[int]:
    """Every pid with a sample in the run's raw perf data (kept with --keep-raw), all chunks."""
    from qprof.runfiles import chunk_files

    pids: set[int] = set()
    for data in chunk_files(run, "perf-dwarf.data", include_current=True):
        out = subprocess.run(["perf", "script", "-i", str(data), "-F", "pid"], capture_output=True, text=True)
        pids |= {int(x) for x in out.stdout.split() if x.isdigit()}
    return pids


def _cgroup_line(pid: int) -> str:
    return next(ln for ln in Path(f"/proc/{pid}/cgroup").read_text().splitlines() if ln.startswith("0::"))


@pytest.fixture()
def busy_pair() -> tuple[subprocess.Popen[bytes], subprocess.Popen[bytes]]:
    a, b = subprocess.Popen(BUSY), subprocess.Popen(BUSY)
    time.sleep(0.3)
    yield a, b
    for p in (a, b):
        p.kill()
        p.wait()


def test_cgroup_scope_samples_only_the_target_and_puts_it_back(kernel_facing: None, tmp_path: Path,
                                                                busy_pair: tuple) -> None:
    h = find_hierarchy()
    if h is None:
        pytest.skip("no cgroup hierarchy mounted: sampling falls back to system-wide (tested below)")
    target, other = busy_pair
    before = _cgroup_line(target.pid)
    run = tmp_path / "run"
    qprof("attach", str(target.pid), "-d", "1.5", "-o", str(run), "--probes", "none", "--scope", "cgroup",
          "--keep-raw")
    meta = json.loads((run / "meta.json").read_text())
    scope = meta["sampling"]["scope"]
    assert scope["mode"] == "cgroup" and scope["cgroups"][0].rsplit("/", 1)[-1].startswith(PREFIX)
    # filtered in the kernel: the busy neighbour on the other core left no sample at all
    assert _pids_in(run) == {target.pid}
    # the target itself is fully sampled: sampled CPU time matches its /proc CPU time
    proc = json.loads(qprof("report", str(run), "--format", "json").stdout)["processes"][0]
    assert proc["cpu_seconds"] == pytest.approx(proc["proc_cpu_seconds"], rel=0.15)
    assert _cgroup_line(target.pid) == before, "the target is back in its own cgroup"
    assert not [d for d, _, _ in os.walk(h.mount) if Path(d).name.startswith(PREFIX)]


def test_system_scope_samples_everything_and_keeps_the_target(kernel_facing: None, tmp_path: Path,
                                                              busy_pair: tuple) -> None:
    target, other = busy_pair
    run = tmp_path / "run"
    qprof("attach", str(target.pid), "-d", "1.5", "-o", str(run), "--probes", "none", "--scope", "system",
          "--keep-raw")
    meta = json.loads((run / "meta.json").read_text())
    assert meta["sampling"]["scope"]["mode"] == "system"
    assert {target.pid, other.pid} <= _pids_in(run)
    rep = json.loads(qprof("report", str(run), "--format", "json").stdout)
    assert [p["pid"] for p in rep["processes"]] == [target.pid]


def test_default_scope_samples_the_targets_own_cpu_time(kernel_facing: None, tmp_path: Path,
                                                         busy_pair: tuple) -> None:
    if find_hierarchy() is None:
        pytest.skip("no cgroup hierarchy mounted: the default falls back to system-wide (tested below)")
    target, _ = busy_pair
    run = tmp_path / "run"
    qprof("attach", str(target.pid), "-d", "1", "-o", str(run), "--probes", "none", "-q")
    scope = json.loads((run / "meta.json").read_text())["sampling"]["scope"]
    assert (scope["mode"], scope["requested"]) == ("cgroup", "auto") and scope["cgroups"], scope


def test_default_scope_falls_back_to_system_without_a_cgroup_hierarchy(kernel_facing: None, tmp_path: Path,
                                                                       busy_pair: tuple) -> None:
    """No cgroup hierarchy in qprof's mount namespace (as in some containers): attach still samples,
    system-wide, says why, and records it; an explicit --scope cgroup refuses."""
    target, _ = busy_pair
    unmount = "; ".join(f"umount -l {m}" for m in _cgroup_mounts())
    run = tmp_path / "run"
    att = [sys.executable, "-m", "qprof.cli", "attach", str(target.pid), "-d", "1", "--probes", "none"]
    r = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                        f'{unmount}; exec "$@"', "sh", *att, "-o", str(run)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    said = " ".join(r.stderr.split())  # the console wraps long lines
    assert "sampling system-wide: no cgroup for the targets (no cgroup hierarchy is mounted)" in said, said
    scope = json.loads((run / "meta.json").read_text())["sampling"]["scope"]
    assert (scope["mode"], scope["requested"], scope["cgroups"]) == ("system", "auto", []), scope
    assert scope["fallback"] == "no cgroup hierarchy is mounted"
    rep = json.loads(qprof("report", str(run), "--format", "json").stdout)
    assert [p["pid"] for p in rep["processes"]] == [target.pid] and rep["processes"][0]["samples"] > 0
    r = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                        f'{unmount}; exec "$@"', "sh", *att, "--scope", "cgroup", "-o", str(tmp_path / "refused")],
                       capture_output=True, text=True)
    assert r.returncode != 0 and "use --scope system" in r.stderr, r.stderr


def _cgroup_mounts() -> list[str]:
    """Mount points of every cgroup filesystem, deepest first (so an outer tmpfs holding them goes last)."""
    mounts = [ln.split()[1] for ln in Path("/proc/self/mounts").read_text().splitlines()
              if ln.split()[2] in ("cgroup", "cgroup2")]
    return sorted(mounts, key=len, reverse=True)


def test_a_leftover_of_a_killed_owner_is_removed_and_its_tasks_put_back(kernel_facing: None) -> None:
    h = find_hierarchy()
    if h is None:
        pytest.skip("no cgroup hierarchy mounted")
    dead = subprocess.Popen(["true"])
    dead.wait()  # a pid whose owner is gone (start time cannot match)
    victim = subprocess.Popen(["sleep", "30"])
    try:
        home = h.path_of(victim.pid)
        assert home is not None
        parent = h.mount / home.lstrip("/")
        leftover = parent / f"{PREFIX}{dead.pid}-1-0"
        leftover.mkdir()
        (leftover / "cgroup.procs").write_text(str(victim.pid))
        assert h.path_of(victim.pid) != home
        assert str(leftover) in cleanup_leftovers(h)
        assert not leftover.exists() and h.path_of(victim.pid) == home
    finally:
        victim.kill()
        victim.wait()


def test_watchdog_puts_the_target_back_after_qprof_is_killed(kernel_facing: None, tmp_path: Path,
                                                             busy_pair: tuple) -> None:
    if find_hierarchy() is None:
        pytest.skip("no cgroup hierarchy mounted")
    target, _ = busy_pair
    before = _cgroup_line(target.pid)
    att = subprocess.Popen([sys.executable, "-m", "qprof.cli", "attach", str(target.pid), "-o",
                            str(tmp_path / "run"), "--probes", "none", "--scope", "cgroup", "-q"])
    deadline = time.monotonic() + 30
    while _cgroup_line(target.pid) == before:
        assert att.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    att.send_signal(signal.SIGKILL)
    att.wait()
    deadline = time.monotonic() + 10
    while _cgroup_line(target.pid) != before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _cgroup_line(target.pid) == before


def test_hierarchy_lookup_matches_perf() -> None:
    v1 = "cgroup /sys/fs/cgroup/perf_event cgroup rw,nosuid,perf_event 0 0\n"
    v2 = "cgroup2 /sys/fs/cgroup/unified cgroup2 rw,nosuid 0 0\n"
    other = "cgroup /sys/fs/cgroup/cpu cgroup rw,cpu,cpuacct 0 0\n"
    assert find_hierarchy(v2 + v1).version == "v1"  # a v1 perf_event hierarchy wins, as in perf
    h = find_hierarchy(other + v2)
    assert h is not None and h.version == "v2" and str(h.mount) == "/sys/fs/cgroup/unified"
    assert find_hierarchy(other) is None and find_hierarchy("") is None and find_hierarchy("junk\n\n") is None


def test_outer_path_strips_only_qprofs_child() -> None:
    assert outer_path(f"/a/b/{PREFIX}12-345-0") == "/a/b"
    assert outer_path(f"/{PREFIX}12-345-0") == "/"
    assert outer_path("/a/qprof-sample-x") == "/a/qprof-sample-x"
    assert outer_path("/system.slice/x.service") == "/system.slice/x.service"


def test_proc_cgroup_lines_parse_once_for_every_reader() -> None:
    """/proc/PID/cgroup in both versions: the v1 hierarchies name their controllers (or themselves),
    v2 is the one `0::` line; a line of another form is skipped. Each reader picks from the same
    parse: perf's hierarchy, the CPU quota's cgroup, the cpuset, the pressure."""
    v1 = parse_cgroups("12:cpu,cpuacct:/a/qprof-sample-1-2-0\n4:perf_event:/p\n1:name=systemd:/s\nbad line\n"
                       "x:cpu:/no\n0::/u\n")
    assert [(c.hierarchy, c.controllers, c.path, c.unified) for c in v1] == [
        (12, ("cpu", "cpuacct"), "/a/qprof-sample-1-2-0", False), (4, ("perf_event",), "/p", False),
        (1, ("name=systemd",), "/s", False), (0, (), "/u", True)]
    assert [str(c) for c in v1] == ["12:cpu,cpuacct:/a/qprof-sample-1-2-0", "4:perf_event:/p", "1:name=systemd:/s",
                                    "0::/u"]
    assert procfs._cpu_cgroup(v1) == ("v1", "/a")  # the quota is its parent's: qprof's child holds none
    assert procfs._cpu_cgroup(parse_cgroups("0::/x.slice/qprof-sample-1-2-3\n")) == ("v2", "/x.slice")
    assert procfs._cpu_cgroup(parse_cgroups("")) is None
    me = cgroups_of(os.getpid())
    assert me and [str(c) for c in me] == Path("/proc/self/cgroup").read_text().splitlines()
    h = find_hierarchy()
    if h is not None:
        assert h.path_of(os.getpid()) == next(c.path for c in me
                                              if (c.unified if h.version == "v2" else "perf_event" in c.controllers))
    assert cgroups_of(4194303) == [] and (h is None or h.path_of(4194303) is None)
