"""Where sampled functions start, read by the one ELF reader (probes.elf), recorded at the end of a run
(functions.json, collectors.functions) and used by pprof and OTLP (attribution.symbols.FrameAddresses).

The ground truth is binutils' `nm` on tests/workloads/phases.c built with a chosen build-id. The fast
tests build archives by hand: the recorded starts survive the binary's replacement; an archive without
them reads the file at its recorded path only when its build-id is the run's; a damaged functions.json
is one line, never a traceback. The kernel-facing test attaches to the workload, writes pprof, replaces
the binary by a rebuild (another build-id) and deletes it, and writes pprof again: the same bytes.
"""

from __future__ import annotations

import gzip
import json
import os
import secrets
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from conftest import ROOT, qprof
from qprof import runfiles
from qprof.archive import Run, schema, write_meta
from qprof.archive.model import MappedObject, Meta, ObjectSymbols, Sampling, Target
from qprof.archive.stacks import StackRecord, write_stacks
from qprof.attribution.symbols import FrameAddresses
from qprof.collectors import elf as collected, functions
from qprof.probes.elf import DYNSYM, SYMTAB, ElfObject, build_id, forget_starts, function_starts
from qprof.viewer.pprof import profile_class

MOVED = "-falign-functions=256"  # a rebuild whose functions start elsewhere
PHASES = ("qprof_phase_seal", "qprof_phase_frame", "qprof_phase_send", "qprof_phase_log")


def _build(exe: Path, *flags: str) -> str:
    """phases.c built at `exe` with a new build-id (returned); `flags`: a rebuild that moves its functions."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None or shutil.which("nm") is None:
        pytest.skip("needs a C compiler and binutils (make test installs them)")
    bid = secrets.token_hex(20)
    tmp = exe.with_name(exe.name + ".new")
    subprocess.run([cc, "-O2", "-g", "-fno-omit-frame-pointer", "-Wall", "-Wextra", "-Werror",
                    *flags, f"-Wl,--build-id=0x{bid}", "-o", str(tmp), str(ROOT / "tests" / "workloads" / "phases.c")],
                   check=True)
    tmp.replace(exe)  # a new file at the path, as a package upgrade or a deploy leaves it
    forget_starts()
    return bid


def _nm(exe: Path) -> dict[str, int]:
    """The functions binutils lists in the object's symbol table: name -> address."""
    out = subprocess.run(["nm", "--defined-only", str(exe)], capture_output=True, text=True, check=True).stdout
    return {parts[2]: int(parts[0], 16) for parts in (ln.split() for ln in out.splitlines())
            if len(parts) == 3 and parts[1] in "Tt"}


def test_the_reader_finds_what_nm_lists(tmp_path: Path) -> None:
    exe = tmp_path / "phases"
    bid = _build(exe)
    nm = _nm(exe)
    with ElfObject.open(str(exe)) as obj:
        assert obj.build_id() == bid and obj.fullest() == SYMTAB and obj.interpreted()
        defined = {f.name: f.address for f in obj.functions(SYMTAB) if f.defined}
        text = [s for s in obj.segments() if s.executable]
    assert {n: defined.get(n) for n in nm} == nm
    assert all(n in function_starts(str(exe)) and function_starts(str(exe))[n] == nm[n] for n in (*PHASES, "main"))
    assert any(s.vaddr <= nm["main"] < s.vaddr + s.filesz for s in text)
    stripped = tmp_path / "stripped"
    subprocess.run(["strip", "-o", str(stripped), str(exe)], check=True)
    with ElfObject.open(str(stripped)) as obj:
        assert obj.fullest() == DYNSYM and obj.build_id() == bid
        assert not set(PHASES) & {f.name for f in obj.functions(DYNSYM)}
    info = collected.object_info(str(exe))
    assert (info.build_id, info.symbols, info.dynamic) == (bid, "symtab", True) and info.frame_pointers is not None


def test_damaged_objects_are_said_unreadable_never_raised(tmp_path: Path) -> None:
    whole = tmp_path / "phases"
    _build(whole)
    for name, data in (("empty", b""), ("text", b"not an ELF file\n"), ("cut", whole.read_bytes()[:3000])):
        p = tmp_path / name
        p.write_bytes(data)
        got, why = build_id(str(p))
        assert why is not None or name == "cut", (name, got)
        assert function_starts(str(p)) == {}
        assert collected.object_info(str(p)).symbols in ("unreadable", "none"), name


def test_frame_pointers_judged_before_are_remembered_by_build_id(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """An object's frame pointers are judged once per build-id (and symbol table): the same answer
    without judging again; a rebuilt file (a new build-id) and its stripped copy judged anew; a damaged
    entry judged again."""
    monkeypatch.setattr(collected, "JUDGED", tmp_path / "judged.json")
    monkeypatch.setattr(collected, "_remembered", None)
    judge = collected._frame_pointers
    judged: list[str] = []
    monkeypatch.setattr(collected, "_frame_pointers", lambda obj, go: judged.append("x") or judge(obj, go))
    exe = tmp_path / "phases"
    bid = _build(exe)

    def info(path: Path) -> MappedObject:
        collected.object_info.cache_clear()
        return collected.object_info(str(path))

    first = info(exe)
    assert first.build_id == bid and first.symbols == "symtab" and len(judged) == 1
    monkeypatch.setattr(collected, "_remembered", None)  # a new process: from the file
    assert info(exe) == first and len(judged) == 1
    stripped = tmp_path / "stripped"
    subprocess.run(["strip", "-o", str(stripped), str(exe)], check=True)
    assert info(stripped).symbols == "dynsym" and len(judged) == 2
    bid2 = _build(exe)
    assert info(exe).build_id == bid2 != bid and len(judged) == 3
    doc = json.loads((tmp_path / "judged.json").read_text())
    (tmp_path / "judged.json").write_text(json.dumps({k: "damaged" for k in doc}))
    monkeypatch.setattr(collected, "_remembered", None)
    assert info(exe).frame_pointers == first.frame_pointers and len(judged) == 4
    collected.object_info.cache_clear()


def _archive(run: Path, exe: Path, bid: str) -> Run:
    """A run archive of one process sampled in the phases and main of `exe` (and in the kernel)."""
    run.mkdir()
    write_meta(run, Meta(status="complete", sampling=Sampling(event="cpu-clock", frequency=99),
                         targets=[Target(pid=7, comm="phases", exe=str(exe),
                                         objects=[MappedObject(str(exe), bid, "symtab")])],
                         symbols=[ObjectSymbols(str(exe), bid, "symtab")], duration_s=1.0))
    frames = [((p, str(exe)), ("main", str(exe))) for p in PHASES]
    recs = [StackRecord(7, 7, "phases", 10, 10_000_000, f) for f in frames]
    recs.append(StackRecord(7, 7, "phases", 2, 2_000_000, (("[unknown]", str(exe)), ("do_syscall_64", "[kernel.kallsyms]"))))
    write_stacks(run / runfiles.STACKS, recs)
    return Run.open(run)


def _addresses(run: Path) -> tuple[dict[str, int], str | None]:
    address = FrameAddresses(Run.open(run))
    exe = Run.open(run).meta.targets[0].exe
    assert exe is not None
    return {n: address(n, exe) for n in (*PHASES, "main")}, address.note()


def test_recorded_starts_outlive_the_binary(tmp_path: Path) -> None:
    exe = tmp_path / "bin" / "phases"
    exe.parent.mkdir()
    bid = _build(exe)
    nm = _nm(exe)
    want = {n: nm[n] for n in (*PHASES, "main")}
    run = _archive(tmp_path / "run", exe, bid)
    starts = functions.write(run.path, functions.stack_frames(run.path / runfiles.STACKS), run.meta,
                             lambda pid, path: None)
    (obj,) = starts.objects
    assert (obj.path, obj.build_id, obj.starts, obj.source) == (str(exe), bid, want, str(exe))
    assert schema.decode(type(starts), json.loads((run.path / runfiles.FUNCTIONS).read_text())) == starts
    assert _addresses(run.path) == (want, None)
    _build(exe, MOVED)  # rebuilt: other addresses at the same path, which the archive never reads again
    assert _nm(exe) != nm and _addresses(run.path) == (want, None)
    exe.unlink()
    assert _addresses(run.path) == (want, None)


def test_recording_refuses_a_file_with_another_build_id(tmp_path: Path) -> None:
    exe = tmp_path / "phases"
    run = _archive(tmp_path / "run", exe, _build(exe))
    _build(exe)
    (obj,) = functions.record(functions.stack_frames(run.path / runfiles.STACKS), run.meta,
                              lambda pid, path: None).objects
    assert obj.starts == {} and obj.note == "no file with its build-id could be read"


def test_an_older_archive_reads_the_file_only_with_the_runs_build_id(tmp_path: Path) -> None:
    exe = tmp_path / "phases"
    bid = _build(exe)
    nm = _nm(exe)
    run = _archive(tmp_path / "run", exe, bid)  # no functions.json: as qprof wrote runs before it
    assert _addresses(run.path) == ({n: nm[n] for n in (*PHASES, "main")}, None)
    _build(exe, MOVED)
    got, note = _addresses(run.path)
    assert set(got.values()) == {0}
    assert note == ("addresses 0 in 1 object(s) whose file, at the path the run recorded, cannot be checked by "
                    "build-id: phases (not the file the run mapped)")
    exe.unlink()
    assert _addresses(run.path) == ({n: 0 for n in got}, note.replace("not the file the run mapped", "not there"))


@pytest.mark.parametrize("damage", ['{"objects": [{"path": 3}', '{"objects": [{"path": "/x", "build_id": 5}]}',
                                    "[]", "\x00\x01"])
def test_a_damaged_address_file_is_one_line(tmp_path: Path, damage: str) -> None:
    exe = tmp_path / "phases"
    bid = _build(exe)
    nm = _nm(exe)
    run = _archive(tmp_path / "run", exe, bid)
    (run.path / runfiles.FUNCTIONS).write_text(damage)
    got, note = _addresses(run.path)
    assert got == {n: nm[n] for n in (*PHASES, "main")}  # from the file, whose build-id is the run's
    assert note is not None and "\n" not in note and str(run.path / runfiles.FUNCTIONS) in note
    out = tmp_path / "a.pb.gz"
    r = qprof("report", str(run.path), "--format", "pprof", "-o", str(out))
    said = [ln for ln in r.stderr.splitlines() if ln.startswith("qprof:")]
    assert len(said) == 1 and "(note: " in said[0] and "Traceback" not in r.stderr, r.stderr
    prof = profile_class()()
    prof.ParseFromString(gzip.decompress(out.read_bytes()))
    assert note in [prof.string_table[c] for c in prof.comment]


# ---- kernel-facing: attach, pprof, the binary rebuilt and deleted, pprof again ---------------------------

def _locations(profile: Path) -> dict[str, int]:
    prof = profile_class()()
    prof.ParseFromString(gzip.decompress(profile.read_bytes()))
    s = prof.string_table
    names = {f.id: s[f.system_name] for f in prof.function}
    files = {m.id: s[m.filename] for m in prof.mapping}
    return {names[loc.line[0].function_id]: loc.address for loc in prof.location
            if files[loc.mapping_id].endswith("/phases")}


@pytest.mark.root
def test_pprof_after_the_binary_was_rebuilt_and_deleted_is_the_same(kernel_facing: None, tmp_path: Path) -> None:
    exe = tmp_path / "bin" / "phases"
    exe.parent.mkdir()
    _build(exe)
    nm = _nm(exe)
    proc = subprocess.Popen([str(exe), "6"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        proc.stdout.readline()  # it runs
        run = tmp_path / "run"
        qprof("attach", str(proc.pid), "-o", str(run), "--probes", "none", "-q", "-d", "3",
              env={**os.environ, "QPROF_SYMBOL_CACHE": str(tmp_path / "cache")})
    finally:
        proc.kill()
        proc.wait()
    before, after, gone = tmp_path / "a.pb.gz", tmp_path / "b.pb.gz", tmp_path / "c.pb.gz"
    qprof("report", str(run), "--format", "pprof", "-o", str(before))
    _build(exe, MOVED)
    assert _nm(exe) != nm
    time.sleep(0.01)
    qprof("report", str(run), "--format", "pprof", "-o", str(after))
    exe.unlink()
    qprof("report", str(run), "--format", "pprof", "-o", str(gone))
    assert before.read_bytes() == after.read_bytes() == gone.read_bytes()
    got = _locations(before)
    print("\n" + "\n".join(f"{n}: {a:#x}" for n, a in sorted(got.items())))
    assert set(PHASES) <= set(got), got
    # a sample can land in a PLT stub (`clock_gettime@plt`, a name perf makes up: no symbol table
    # holds it, nor nm's list), about one run in two here: only functions are compared with nm
    named = {n: a for n, a in got.items() if not n.startswith("[") and not n.endswith("@plt")}
    assert named == {n: nm[n] for n in named}, (named, nm)
