"""The targets' files as they see them (collectors.mapfiles): a binary deleted after its process started,
one that exists only in its own mount namespace, one whose path holds another file on the host, and a
JIT's perf map in a pid namespace's private /tmp. The kernel-facing tests run tests/workloads/phases.c
(four phase functions, tests/workloads/phases.toml names one category each) from a private tmpfs that
only its mount namespace sees, attach the real `qprof attach`, and read the report."""

from __future__ import annotations

import json
import math
import os
import secrets
import shutil
import struct
import subprocess
from pathlib import Path
from typing import Any, Iterator

import pytest

from conftest import ROOT, qprof
from qprof.collectors import procfs
from qprof.collectors.procfs import MappedFile, ns_pid, parse_maps
from qprof.collectors import mapfiles
from qprof.collectors.mapfiles import ABSENT, DIFFERENT, MISC_MMAP_BUILD_ID, SAME, stamp_mmap2, view_of

WORKLOAD = ROOT / "tests" / "workloads"
PHASES = ("qprof_phase_seal", "qprof_phase_frame", "qprof_phase_send", "qprof_phase_log")
SECONDS = "3"


# ---- pure parts -------------------------------------------------------------------------------------

MAPS = """\
55ad953e0000-55ad953e1000 r--p 00000000 00:27 2    /mnt/phases (deleted)
55ad953e1000-55ad953e2000 r-xp 00001000 00:27 2    /mnt/phases (deleted)
55ad953e3000-55ad953e4000 r-xp 00003000 00:27 2    /mnt/phases (deleted)
7f0000000000-7f0000100000 r-xp 00000000 08:01 12   /usr/lib/x86_64-linux-gnu/libc.so.6
7f0000200000-7f0000201000 r-xp 00000000 00:00 0    [vdso]
7f0000300000-7f0000301000 rwxp 00000000 00:00 0
zzzz-7f0000401000 r-xp 00000000 08:01 13   /bad/start
7f0000500000-7f0000400000 r-xp 00000000 08:01 14   /bad/backwards
7f0000600000 r-xp 00000000 08:01 15   /bad/no-range
truncated line
"""


def test_maps_name_each_executable_file_once_with_its_map_files_link() -> None:
    got = parse_maps(MAPS)
    assert [m.name for m in got] == ["/mnt/phases (deleted)", "/usr/lib/x86_64-linux-gnu/libc.so.6"]
    exe = got[0]
    assert exe.deleted and exe.path == "/mnt/phases" and not got[1].deleted
    assert exe.map_files(42) == "/proc/42/map_files/55ad953e1000-55ad953e2000"
    assert parse_maps("") == [] and procfs.mapped_files(-1) == []


@pytest.mark.parametrize("status, want", [
    ("Name:\tx\nNSpid:\t12345\n", 12345),
    ("NSpid:\t12345\t7\t1\n", 1),  # the innermost namespace's pid is last
    ("Name:\tx\n", None),
    ("NSpid:\t12x\t7\n", None),
    ("NSpid:\n", None),
    (None, None),
])
def test_ns_pid(status: str | None, want: int | None) -> None:
    assert ns_pid(status) == want


def _mmap2(pid: int, name: str, misc: int = 2) -> bytearray:
    body = struct.pack("<IIQQQIIQQII", pid, pid, 0x1000, 0x1000, 0, 8, 1, 77, 0, 5, 2)
    fname = name.encode() + b"\0"
    fname += b"\0" * (-len(fname) % 8)
    rec = bytearray(struct.pack("<IHH", 10, misc, 8 + len(body) + len(fname)) + body + fname)
    return rec


def test_stamp_mmap2_puts_the_build_id_where_the_inode_was() -> None:
    bid = bytes.fromhex("0d3dbb39adbd57490dae7b3de2a252beac2e4005")
    rec = _mmap2(7, "/mnt/phases (deleted)")
    assert stamp_mmap2(rec, 0, len(rec), {(7, "/mnt/phases (deleted)"): bid})
    _t, misc, size = struct.unpack_from("<IHH", rec, 0)
    assert misc & MISC_MMAP_BUILD_ID and size == len(rec)
    assert rec[40] == 20 and bytes(rec[44:64]) == bid
    assert struct.unpack_from("<II", rec, 64) == (5, 2)  # prot and flags untouched
    assert rec[72:].split(b"\0")[0] == b"/mnt/phases (deleted)"
    assert not stamp_mmap2(rec, 0, len(rec), {(7, "/mnt/phases (deleted)"): bid}), "stamped once"
    other = _mmap2(8, "/mnt/phases (deleted)")
    assert not stamp_mmap2(other, 0, len(other), {(7, "/mnt/phases (deleted)"): bid}), "another pid's"
    assert not stamp_mmap2(other, 0, 40, {(8, "/mnt/phases (deleted)"): bid}), "too short a record"
    assert not stamp_mmap2(other, 8, len(other), {(8, "/mnt/phases (deleted)"): bid}), "past the buffer"


def test_stamps_of_a_run_skip_what_is_not_a_build_id(tmp_path: Path) -> None:
    assert mapfiles.stamps(tmp_path) == {}
    (tmp_path / "mapped-files.json").write_text("{not json")
    assert mapfiles.stamps(tmp_path) == {}
    (tmp_path / "mapped-files.json").write_text(json.dumps([
        {"pid": 3, "name": "/a", "build_id": "ab" * 20}, {"pid": 3, "name": "/b", "build_id": "zz"},
        {"pid": 3, "name": "/c", "build_id": "ab" * 21}, {"name": "/d"}, 5]))
    assert mapfiles.stamps(tmp_path) == {(3, "/a"): bytes.fromhex("ab" * 20)}


def test_our_own_files_are_the_hosts_and_a_gone_process_is_said_in_one_line() -> None:
    me = os.getpid()
    views = [view_of(me, m) for m in procfs.mapped_files(me)]
    assert views and all(v.host == SAME and not v.note for v in views if v.build_id), views
    gone = view_of(2 ** 22 + 1, MappedFile("/usr/bin/true", 0x1000, 0x2000))
    assert gone.host == mapfiles.UNREAD and gone.note.count("\n") == 0 and "/usr/bin/true" in gone.note


# ---- the real thing ---------------------------------------------------------------------------------

def _build(out: Path, *defines: str) -> tuple[Path, str]:
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler (make test installs gcc)")
    build_id = secrets.token_hex(20)
    exe = out / f"phases-{build_id[:8]}"
    subprocess.run([cc, "-O2", "-g", "-fno-omit-frame-pointer", "-Wall", "-Wextra", "-Werror", *defines,
                    f"-Wl,--build-id=0x{build_id}", "-o", str(exe), str(WORKLOAD / "phases.c")], check=True)
    return exe, build_id


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    if shutil.which("unshare") is None:
        pytest.skip("unshare missing (make test installs util-linux)")
    return _build(tmp_path_factory.mktemp("phases"))


class Namespaced:
    """phases run from a tmpfs mounted on /mnt in a mount namespace of its own: /mnt/NAME exists there only."""

    def __init__(self, exe: Path, name: str, *args: str, pid_ns: bool = False) -> None:
        self.inner = f"/mnt/{name}"
        tmp = " && mount -t tmpfs qprof-tmp /tmp" if pid_ns else ""
        script = f"mount -t tmpfs qprof-ns /mnt && cp {exe} {self.inner}{tmp} && exec {self.inner} {' '.join(args)}"
        cmd = ["unshare", "-m", "--propagation", "private"] + (["-p", "-f"] if pid_ns else []) + ["sh", "-c", script]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        self.proc.stdout.readline()  # its pid, once it runs (its own pid namespace's, with pid_ns)
        self.pid = self._host_pid() if pid_ns else self.proc.pid

    def _host_pid(self) -> int:
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()
        return int(children[0])

    def wait(self) -> None:
        assert self.proc.wait(60) == 0, self.proc.stderr.read() if self.proc.stderr else ""


def _attach(pid: int, run: Path, cache: Path) -> dict[str, Any]:
    qprof("attach", str(pid), "-o", str(run), "--probes", "none", "-q",
          env={**os.environ, "QPROF_SYMBOL_CACHE": str(cache)})
    rep = json.loads(qprof("report", str(run), "--format", "json", "--top", "30",
                           "--mapping", str(WORKLOAD / "phases.toml")).stdout)
    (p,) = rep["processes"]
    return p


def _names(p: dict[str, Any]) -> set[str]:
    return {s["symbol"] for syms in p["top_symbols"].values() for s in syms}


def _same_share(a: float, n: int, b: float, m: int) -> bool:
    """Two sampled shares consistent with one true share: within 4 standard errors of their difference."""
    pooled = (a * n + b * m) / (n + m)
    return abs(a - b) <= 4 * math.sqrt(max(pooled * (1 - pooled), 1e-4) * (1 / n + 1 / m))


@pytest.fixture
def in_place(kernel_facing: None, built: tuple[Path, str], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The same workload from the same namespace, its file left in place: what the deleted run must match."""
    base = tmp_path_factory.mktemp("in-place")
    ns = Namespaced(built[0], f"qprof-{secrets.token_hex(4)}", SECONDS)
    p = _attach(ns.pid, base / "run", base / "cache")
    ns.wait()
    return p


@pytest.mark.root
def test_a_deleted_binary_in_its_own_mount_namespace_is_named(
        kernel_facing: None, built: tuple[Path, str], in_place: dict[str, Any], tmp_path: Path) -> None:
    ns = Namespaced(built[0], f"qprof-{secrets.token_hex(4)}", SECONDS)
    os.unlink(f"/proc/{ns.pid}/root{ns.inner}")
    assert os.readlink(f"/proc/{ns.pid}/exe").endswith(" (deleted)")
    p = _attach(ns.pid, tmp_path / "run", tmp_path / "cache")
    ns.wait()
    u, u0 = p["categories"]["Uncategorized"], in_place["categories"]["Uncategorized"]
    print(f"\ndeleted: {sorted(set(PHASES) & _names(p))}, Uncategorized {u:.1%} of {p['samples']} samples; "
          f"in place: {sorted(set(PHASES) & _names(in_place))}, {u0:.1%} of {in_place['samples']}")
    assert set(PHASES) <= _names(in_place), _names(in_place)
    assert set(PHASES) <= _names(p), _names(p)
    assert _same_share(u, p["samples"], u0, in_place["samples"]), (u, u0)
    exe = next(o for o in p["symbols"] if o["object"].endswith(" (deleted)"))
    assert exe["how"] == "symtab" and exe["unnamed_share"] < 0.01, exe
    kept = json.loads((tmp_path / "run" / "mapped-files.json").read_text())
    assert [(v["name"], v["build_id"], v["host"]) for v in kept] == [(f"{ns.inner} (deleted)", built[1], ABSENT)]


@pytest.mark.root
def test_another_file_at_the_same_path_on_the_host_is_never_used(
        kernel_facing: None, built: tuple[Path, str], tmp_path: Path) -> None:
    name = f"qprof-{secrets.token_hex(4)}"
    decoy, decoy_id = _build(tmp_path, *(f"-D{f}=decoy_{f.rsplit('_', 1)[1]}" for f in PHASES))
    host = Path("/mnt") / name
    shutil.copy(decoy, host)
    try:
        ns = Namespaced(built[0], name, SECONDS)
        p = _attach(ns.pid, tmp_path / "run", tmp_path / "cache")
        ns.wait()
    finally:
        host.unlink()
    names = _names(p)
    print(f"\nhost decoy at {host}: {sorted(names & set(PHASES))}; notes: {[o['note'] for o in p['symbols'] if o['note']]}")
    assert not any(n.startswith("decoy_") for n in names), names
    assert set(PHASES) <= names, names
    exe = next(o for o in p["symbols"] if o["object"] == str(host))
    assert f"the host's {host} is another file (build-id {decoy_id}" in exe["note"] and "not used" in exe["note"]
    assert [v["host"] for v in json.loads((tmp_path / "run" / "mapped-files.json").read_text())] == [DIFFERENT]


@pytest.mark.root
def test_a_jit_map_in_a_pid_namespace_is_read_through_its_root(kernel_facing: None, built: tuple[Path, str],
                                                              tmp_path: Path) -> None:
    ns = Namespaced(built[0], "qprof-jit", "1", "--perf-map", pid_ns=True)
    try:
        assert ns_pid(Path(f"/proc/{ns.pid}/status").read_text()) == 1
        assert not Path(f"/tmp/perf-{ns.pid}.map").exists() and not Path("/tmp/perf-1.map").exists()
        (got,) = mapfiles.keep_jit_maps(tmp_path, [ns.pid])
        assert got.source == f"/proc/{ns.pid}/root/tmp/perf-1.map", got
        assert (tmp_path / "perf-maps" / f"perf-{ns.pid}.map").read_text().endswith(" 100 qprof_phase_jit\n")
    finally:
        ns.wait()
    (gone,) = mapfiles.keep_jit_maps(tmp_path / "gone", [ns.pid])
    assert gone.source is None and gone.note == f"pid {ns.pid}: gone before its perf map was looked for"
