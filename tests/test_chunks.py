"""Long runs: perf data rotated in chunks, folded while sampling goes on, never counted twice.

One real capture with small chunks, all raw data kept (module-scoped); the tests fold, cut
and refold copies of it.
"""

from __future__ import annotations

import json
import mmap
import os
import shutil
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import edited_meta, examples, qprof
from qprof.archive import Run
from qprof.archive.model import STATUS_COLLECTING, SampleGroup
from qprof.collectors import nativefold, perfdata
from qprof.collectors.mapfiles import PERF_RECORD_MMAP2
from qprof.collectors.chunks import ChunkFolder, FoldState
from qprof.collectors.folding import fold_files
from qprof.runfiles import chunk_files
from qprof.archive.stacks import (Sample, StacksHeader, add_counts, fold, read_stacks, records, stacks_header,
                                  write_stacks)
from qprof.probes.mapsout import read_maps
from qprof.probes.children import BACKGROUND_NICE
from qprof.probes.features import require_perf
from qprof.collectors.perf import DEFAULT_FREQUENCY

pytestmark = [pytest.mark.root]
# busy for 8 s of its own CPU time, then exits (which ends the attach): the capture holds about
# as many samples on a busy host as on a quiet one, it only takes longer
BUSY = "import time\nx = 0\nwhile time.process_time() < 8:\n    x += 1\n"


@pytest.fixture(scope="module")
def capture(kernel_facing: None, tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("chunks") / "run"
    target = subprocess.Popen([sys.executable, "-c", BUSY])
    try:
        qprof("attach", str(target.pid), "--unwind", "dwarf", "--chunk-size", "2M", "--keep-raw",
              "--probes", "none", "-o", str(run), "-q")
    finally:
        target.kill()
        target.wait()
    return run


def totals(run: Path) -> dict[int, int]:
    out: dict[int, int] = {}
    for r in read_stacks(run / "stacks.jsonl.gz"):
        out[r.pid] = out.get(r.pid, 0) + r.samples
    return out


def groups(run: Path) -> list[SampleGroup]:
    return Run.open(run).meta.sampling.groups


def test_rotated_and_folded_while_sampling(capture: Path) -> None:
    meta = Run.open(capture).meta
    head = stacks_header(capture / "stacks.jsonl.gz")
    raw = [p.name for p in chunk_files(capture, "perf-dwarf.data", include_current=True)]
    assert meta.status == "complete" and meta.chunks is not None and meta.chunks.folded >= 3, meta.chunks
    assert head is not None and sorted(head.folded) == sorted(raw), "every chunk folded once"
    # the target's 8 s of CPU minus what it used before sampling started (qprof's start-up, < 3 s)
    assert meta.parse is not None and head.samples == meta.parse.samples == sum(totals(capture).values()) > 5 * DEFAULT_FREQUENCY * 0.9
    assert not (capture / "perf-dwarf.data").exists(), "perf renamed its last file too"


def test_later_chunks_resolve_symbols_too(capture: Path, tmp_path: Path) -> None:
    """Chunks after the first hold no mmap records of a process that started before: perf still
    names its frames. Every full chunk after the first is folded alone (ChunkFolder folds each
    chunk by itself) and their samples of the target must be named. All of them, not one: a
    2 MiB chunk of a system-wide capture holds whatever else ran on the host too, and on a busy
    host one chunk held only 58 of the target's samples."""
    chunks = chunk_files(capture, "perf-dwarf.data", include_current=False)
    later = chunks[1:-1]  # the very last is what perf wrote after the stop
    assert len(later) >= 2, "the capture rotated too few chunks"
    run = tmp_path / "later-only"
    run.mkdir()
    for c in later:
        shutil.copy(c, run / c.name)
    st = ChunkFolder(require_perf(), run, groups(capture), keep_raw=True).finish()
    assert (stacks_header(run / "stacks.jsonl.gz") or StacksHeader()).folded == [c.name for c in later], "each chunk folded alone"
    recs = list(read_stacks(run / "stacks.jsonl.gz"))
    named = sum(r.samples for r in recs if any(sym != "[unknown]" for sym, _ in r.frames))
    # at >= 1000 samples the named share is measured to within 1.4 pp (two binomial standard
    # errors at 95%): well inside the 5 pp margin
    assert st.samples >= 1000 and named / st.samples > 0.95, (st.samples, named)


def test_refold_from_scratch_matches(capture: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(capture, run)
    r = qprof("report", "--refold", str(run), "--format", "json", "--timeline")
    assert "refolded" in r.stderr
    assert totals(run) == totals(capture)
    # the refold's report takes the records it wrote without reading them back: the file's report
    assert r.stdout == qprof("report", str(run), "--format", "json", "--timeline").stdout


def test_a_damaged_stacks_file_says_refold_and_refold_re_creates_it(capture: Path, tmp_path: Path) -> None:
    """The raw data kept (--keep-raw): the error names `report --refold`, which then folds it all again."""
    run = tmp_path / "run"
    shutil.copytree(capture, run)
    whole = (capture / "stacks.jsonl.gz").read_bytes()
    (run / "stacks.jsonl.gz").write_bytes(whole[: len(whole) // 2])
    r = qprof("report", str(run), "--format", "json", check=False)
    assert r.returncode == 2 and f"qprof report --refold {run}" in r.stderr, r.stderr
    qprof("report", "--refold", str(run), "--format", "json")
    assert totals(run) == totals(capture)


def test_the_last_pass_writes_the_stacks_file_once(capture: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Every chunk folded at the end (attach's last pass, --refold) is written in one stacks file, not
    one rewrite of the whole table per chunk; the result is the same."""
    run = tmp_path / "run"
    shutil.copytree(capture, run)
    assert len(chunk_files(run, "perf-dwarf.data", include_current=True)) >= 3
    writes: list[Path] = []
    save = FoldState.save
    monkeypatch.setattr(FoldState, "save", lambda self, path, seal=True: (writes.append(path), save(self, path, seal))[1])
    (run / "stacks.jsonl.gz").unlink()
    ChunkFolder(require_perf(), run, groups(run), keep_raw=True).finish()
    assert writes == [run / "stacks.jsonl.gz"]
    assert totals(run) == totals(capture)


def test_cut_short_run_refolds_only_what_is_missing(capture: Path, tmp_path: Path) -> None:
    """As if qprof was killed after folding two chunks (deleted once folded): report reads those
    two and warns; --refold adds the others; nothing is counted twice."""
    run = tmp_path / "run"
    shutil.copytree(capture, run)
    chunks = chunk_files(run, "perf-dwarf.data", include_current=False)
    (run / "stacks.jsonl.gz").unlink()
    folder = ChunkFolder(require_perf(), run, groups(run))
    for c in chunks[:2]:  # as the background passes fold them: each saved, then deleted
        folder._fold_chunks([c], groups(run)[0], urgent=True)
        folder._saved([c], final=False)
    # the newest folded chunk stays until the next is folded: its mappings name that one's exited processes
    assert not chunks[0].exists() and chunks[1].exists()
    with edited_meta(run) as meta:
        meta.status = STATUS_COLLECTING  # its collector is long gone
    r = qprof("report", str(run), "--format", "json")
    assert "is incomplete" in r.stderr and f"{len(chunks) - 2} perf data chunk(s)" in r.stderr
    assert json.loads(r.stdout)["run"]["status"] == "incomplete"
    partial = sum(totals(run).values())
    assert 0 < partial < sum(totals(capture).values())
    qprof("report", "--refold", str(run), "--format", "json")
    assert totals(run) == totals(capture)


def test_a_chunk_finished_after_the_last_look_for_new_members_waits(capture: Path, tmp_path: Path) -> None:
    """A followed service (attach --cgroup): a chunk perf finished after the session last looked for
    new processes may hold one not yet in its group's pids, which folding would drop; it waits for
    the next look, and the final pass folds everything."""
    run = _unfolded(capture, tmp_path / "run")
    done = chunk_files(run, "perf-dwarf.data", include_current=False)
    assert len(done) >= 3
    folder = ChunkFolder(require_perf(), run, groups(run), keep_raw=True)
    folder.targets_seen = min(c.stat().st_mtime for c in done) - 1.0
    folder.fold_pass(final=False)
    assert folder.state.folded == []
    os.utime(done[-1], (time.time() + 60, time.time() + 60))  # finished after the next look
    folder.targets_seen = time.time()
    folder.fold_pass(final=False)
    assert sorted(folder.state.folded) == sorted(c.name for c in done[:-1])
    folder.finish()
    assert done[-1].name in folder.state.folded and totals(run) == totals(capture)


def test_report_folds_a_run_killed_before_its_first_fold(capture: Path, tmp_path: Path) -> None:
    """Killed before any chunk was folded: the raw data is all there, so `report` on the boot that
    recorded the run folds it itself and says so; another user's archive is not put through perf
    unasked (one line says why and how)."""
    run = _unfolded(capture, tmp_path / "run")
    (run / "functions.json").unlink()  # written at a run's end: a killed run has none
    with edited_meta(run) as meta:
        meta.status = STATUS_COLLECTING  # its collector is long gone
    theirs = tmp_path / "theirs"
    shutil.copytree(run, theirs)
    os.chown(theirs, 65534, 65534)
    r = qprof("report", str(theirs), "--format", "json", check=False)
    assert r.returncode == 2 and "belongs to uid 65534" in r.stderr and "--refold" in r.stderr, r.stderr
    assert not (theirs / "stacks.jsonl.gz").exists()
    r = qprof("report", str(run), "--format", "json")
    assert "cut short before any perf data was folded: folding it now" in r.stderr
    assert json.loads(r.stdout)["run"]["status"] == "incomplete"
    assert totals(run) == totals(capture)
    # the function starts pprof and OTLP need, recorded by the fold from the files that are still the run's
    assert json.loads((run / "functions.json").read_text()) == json.loads((capture / "functions.json").read_text())


def test_folded_chunks_stay_on_disk_until_a_write_counts_them(capture: Path, tmp_path: Path) -> None:
    """The stacks file is written again only every SAVE_S or once folded and waiting chunks fill half the
    raw budget (each write is the whole table); until then the folded chunks stay on disk, so a kill
    loses none, and the last pass writes and deletes them all."""
    run = _unfolded(capture, tmp_path / "run")
    chunks = chunk_files(run, "perf-dwarf.data", include_current=False)
    size = max(c.stat().st_size for c in chunks)
    folder = ChunkFolder(require_perf(), run, groups(run), raw_budget=size * 10 * len(chunks))
    folder.fold_pass(final=False)
    assert folder.state.folded == [c.name for c in chunks]
    assert not (run / "stacks.jsonl.gz").exists() and all(c.exists() for c in chunks), "nothing written yet"
    folder.finish()
    assert totals(run) == totals(capture) and not any(c.exists() for c in chunks)
    # half the budget filled: written (and deleted but the newest) as the pass goes
    run2 = _unfolded(capture, tmp_path / "run2")
    chunks = chunk_files(run2, "perf-dwarf.data", include_current=False)
    budget = sum(c.stat().st_size for c in chunks) + 1  # all of them wait at first: none dropped
    folder = ChunkFolder(require_perf(), run2, groups(run2), raw_budget=budget)
    folder.fold_pass(final=False)
    head = stacks_header(run2 / "stacks.jsonl.gz") or StacksHeader()
    assert head.folded and not head.dropped and set(head.folded) <= {c.name for c in chunks}
    kept = [c for c in chunks if c.exists()]
    assert sum(c.stat().st_size for c in kept[1:]) <= budget // 2, "folded chunks kept: half the budget"
    folder.finish()
    assert totals(run2) == totals(capture)


def test_raw_budget_drops_the_oldest_and_says_so(capture: Path, tmp_path: Path) -> None:
    run = _unfolded(capture, tmp_path / "run")
    chunks = chunk_files(run, "perf-dwarf.data", include_current=False)
    said: list[str] = []
    folder = ChunkFolder(require_perf(), run, groups(run), raw_budget=chunks[-1].stat().st_size + 1,
                         status=said.append)
    folder.fold_pass(final=False)
    head = stacks_header(run / "stacks.jsonl.gz") or StacksHeader()
    assert len(head.dropped) == len(chunks) - 1 and head.folded == [chunks[-1].name]
    assert all(not c.exists() for c in chunks[:-1])
    assert chunks[-1].exists(), "the folded one stays as the next's context"
    assert any("folding is slower than sampling" in s for s in said)
    folder.finish()
    assert not chunks[-1].exists(), "the last pass deletes every folded chunk"


def _unfolded(capture: Path, dest: Path) -> Path:
    """A copy of the capture with its raw chunks and no stacks file: what an attach had to fold."""
    shutil.copytree(capture, dest)
    (dest / "stacks.jsonl.gz").unlink()
    return dest


def _native(capture: Path, dest: Path, otherwise: str) -> tuple[Path, SampleGroup, list[Path]]:
    """_unfolded for a test of qprof's native folder (skipped where it is not built: `otherwise` says what
    folds then), with its recorder and finished chunks."""
    if nativefold.chosen() is None:
        pytest.skip(f"qprof's native folder is not built (`make setup`): {otherwise}")
    run = _unfolded(capture, dest)
    (group,) = groups(run)
    return run, group, chunk_files(run, group.perf_data, include_current=False)


def _folded_in_one_pass(run: Path, group: SampleGroup, dest: Path, leave_out: Path | None = None) -> Path:
    """A run of copies of `run`'s chunks (but `leave_out`) folded by one last pass: what the attach's passes
    chunk by chunk must give."""
    dest.mkdir()
    for c in chunk_files(run, group.perf_data, include_current=True):
        if c != leave_out:
            shutil.copy(c, dest / c.name)
    ChunkFolder(require_perf(), dest, [group], keep_raw=True).finish()
    return dest


def _gone_at_the_switch(chunk: Path, pid: int) -> int:
    """Rewrite `chunk` as perf writes it when `pid` exited while perf wrote the switch's mappings: its
    samples are there, its mappings and name are not (moved to pid 0, which no fold keeps)."""
    moved = 0
    with open(chunk, "r+b") as f, mmap.mmap(f.fileno(), 0) as m:
        _magic, _size, _attr_size, _ao, _as, off, size, _eo, _es = perfdata._HEADER.unpack_from(m, 0)
        end = off + size
        while off + perfdata._REC.size <= end:
            rtype, _misc, rsize = perfdata._REC.unpack_from(m, off)
            # MMAP, COMM and MMAP2 records begin with pid, tid
            if rtype in (1, 3, PERF_RECORD_MMAP2) and struct.unpack_from("<I", m, off + 8)[0] == pid:
                struct.pack_into("<II", m, off + 8, 0, 0)
                moved += 1
            off += max(rsize, perfdata._REC.size)
    return moved


def test_a_process_gone_at_a_switch_keeps_its_names(capture: Path, tmp_path: Path) -> None:
    """perf writes every live process's mappings at each switch; one that exits while it does gets none in
    the new chunk, though its last samples land there (CI 2026-11-29: a Python target's finalisation was
    named by the report's refold and not by the attach, which had folded that chunk alone). Folded after
    the chunk before, wherever a fold starts (a new folder process, or the one kept for the recorder), they keep
    their names: the attach's passes give what one fold of every chunk gives."""
    run, group, chunks = _native(capture, tmp_path / "run", "perf script reads each chunk alone")
    gone = chunks[2]
    assert _gone_at_the_switch(gone, group.pids[0]) > 0

    def named_share(path: Path, context: Path | None) -> float:
        acc, st = fold_files(require_perf(), [path], run / "log", list(group.pids), 1, context=context)
        named = sum(slot[0] for k, slot in acc.items()
                    if any(sym != "[unknown]" and dso != "[kernel.kallsyms]" for sym, dso in k[3]))
        assert st.samples > 100, st.samples
        return named / st.samples

    assert named_share(gone, None) < 0.05, "alone, the chunk names none of the process's own frames"
    assert named_share(gone, chunks[1]) > 0.95
    whole = _folded_in_one_pass(run, group, tmp_path / "whole")
    folder = ChunkFolder(require_perf(), run, [group])
    folder.fold_pass(final=False)  # each finished chunk folded alone, as an attach's background passes do
    assert folder.state.folded == [c.name for c in chunks]
    assert group.perf_data in folder._servers, "the passes while sampling keep one folder for the recorder"
    folder.finish()
    assert not folder._servers
    assert list(read_stacks(run / "stacks.jsonl.gz")) == list(read_stacks(whole / "stacks.jsonl.gz"))


def test_a_damaged_chunk_is_named_and_the_kept_folder_folds_the_rest(capture: Path, tmp_path: Path) -> None:
    """A chunk the kept folder cannot read (perf died writing it) is recorded as unreadable; the same
    folder process folds the chunks after it, and every other chunk counts what one fold of them gives."""
    run, group, chunks = _native(capture, tmp_path / "run", "chunks are folded one process each")
    bad = chunks[1]
    bad.write_bytes(b"PERFILE2" + b"\xff" * 64)  # a header that points nowhere
    whole = _folded_in_one_pass(run, group, tmp_path / "whole", leave_out=bad)
    folder = ChunkFolder(require_perf(), run, [group], keep_raw=True)
    folder.fold_pass(final=False)
    server = folder._servers[group.perf_data]
    assert [u["chunk"] for u in folder.state.unreadable] == [bad.name]
    assert folder.state.folded == [c.name for c in chunks]  # the damaged one too: never tried again
    folder.finish()
    assert server.proc.returncode == 0, "one folder served every chunk and ended cleanly"
    assert totals(run) == totals(whole)


def _perf_script_niceness(stop: threading.Event, seen: set[int]) -> None:
    """The niceness of every folder (perf script or the native one) this process runs, until `stop`."""
    me = str(os.getpid())
    while not stop.is_set():
        for d in os.listdir("/proc"):
            try:
                with open(f"/proc/{d}/stat") as f:
                    comm, rest = f.read().rsplit(")", 1)
            except OSError:
                continue
            fields = rest.split()
            if (comm.endswith("(perf") or "(qprof-perffold" in comm) and fields[1] == me:
                seen.add(int(fields[16]))
        time.sleep(0.005)


@pytest.mark.parametrize("behind", [False, True])
def test_folding_while_sampling_takes_only_cpu_the_targets_leave(capture: Path, tmp_path: Path,
                                                                 behind: bool) -> None:
    """While sampling goes on, the folder runs at the lowest priority; with half the raw budget
    waiting it runs at the targets' priority to catch up (past the whole budget chunks are lost)."""
    run = _unfolded(capture, tmp_path / "run")
    chunks = chunk_files(run, "perf-dwarf.data", include_current=False)
    for c in chunks[4:]:  # four chunks show both priorities
        c.unlink()
    chunks = chunks[:4]
    backlog = sum(c.stat().st_size for c in chunks)
    budget = backlog * 3 // 2 if behind else backlog * 4
    folder = ChunkFolder(require_perf(), run, groups(run), raw_budget=budget)
    stop, seen = threading.Event(), set()
    watcher = threading.Thread(target=_perf_script_niceness, args=(stop, seen))
    watcher.start()
    try:
        folder.fold_pass(final=False)
    finally:
        stop.set()
        watcher.join()
    assert folder.state.folded == [c.name for c in chunks] and not folder.state.dropped
    # the first chunk folds at the backlog's priority; later ones may catch up below half
    own = os.getpriority(os.PRIO_PROCESS, 0)
    assert seen and (own in seen if behind else seen == {min(19, own + BACKGROUND_NICE)})


@settings(max_examples=examples(60), deadline=None)
@given(st.lists(st.builds(Sample, st.integers(1, 3), st.integers(1, 3), st.sampled_from(["a", "b c"]),
                          st.integers(0, 10**9), st.sampled_from([(), (("f", "[kernel.kallsyms]"),)])),
                max_size=20),
       st.lists(st.text(max_size=12), max_size=4))
def test_header_round_trip(tmp_path_factory: pytest.TempPathFactory, samples: list, folded: list) -> None:
    p = tmp_path_factory.mktemp("h") / "s.jsonl.gz"
    recs = fold(samples)
    write_stacks(p, recs, StacksHeader(folded=folded, samples=len(samples)))
    assert list(read_stacks(p)) == recs
    assert stacks_header(p) == StacksHeader(folded=folded, samples=len(samples))
    st_ = FoldState.load(p)
    assert st_.folded == folded and sum(v[0] for v in st_.acc.values()) == len(samples)


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(st.one_of(st.text(max_size=40), st.sampled_from([
    '{"type": "map", "data": {"@a": {"1,2": 3}}}', '{"type": "map", "data": {"@a": {"1,2": 5}}',
    '{"type": "hist", "data": {"@h": [{"min": 0, "max": 4, "count": 2}]}}', '{"type": "map"}',
    '{"type": "map", "data": []}', "[" * 5000, '{"type": "printf", "data": "x"}'])), max_size=12))
def test_read_maps_never_raises(tmp_path_factory: pytest.TempPathFactory, lines: list[str]) -> None:
    p = tmp_path_factory.mktemp("m") / "probe-x.jsonl"
    p.write_text("\n".join(lines), encoding="utf-8")
    maps = read_maps(p)
    assert isinstance(maps, dict)
    if '{"type": "map", "data": {"@a": {"1,2": 3}}}' in lines:
        assert "@a" in maps


def test_time_bins_coarsen_past_their_budget(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A long run's (stack, bin) pairs stay under the budget, sealed ones counted: bins double in length,
    CPU time kept."""
    from qprof.collectors import chunks
    from qprof.collectors.chunks import FoldState

    monkeypatch.setattr(chunks, "MAX_BIN_ENTRIES", 100)
    monkeypatch.setattr(chunks, "SEAL_AT", 4)
    st = FoldState()
    stacks = [((f"f{i}", "/x"),) for i in range(3)]
    for b in range(0, 200, 10):  # 20 chunks of 10 bins, 3 stacks in each bin; saved after each, as an attach does
        st.merge({(1, 1, "x", s): [10, 10 * 7, {b + k: 7 for k in range(10)}] for s in stacks})
        st.save(tmp_path / "s.jsonl.gz")
    assert st.bin_entries() <= 100 and st.bin_grain == 8 and st.sealed
    for r in st.records():
        assert sum(p for _, p in r.bins) == r.period == 200 * 7
        assert all(b % 8 == 0 for b, _ in r.bins) and [b for b, _ in r.bins] == sorted({b for b, _ in r.bins})
    assert list(read_stacks(tmp_path / "s.jsonl.gz")) == st.records()
    assert st.header().bin_grain == 8


_CHUNK = st.dictionaries(st.tuples(st.integers(1, 2), st.sampled_from([(("a", "/x"),), (("b", "/x"), ("a", "/x"))])),
                         st.tuples(st.integers(1, 5), st.dictionaries(st.integers(0, 60), st.integers(1, 9),
                                                                      min_size=1, max_size=12)),
                         max_size=4)


@settings(max_examples=examples(150), deadline=None)
@given(st.lists(st.tuples(_CHUNK, st.booleans()), max_size=12), st.integers(1, 6), st.sampled_from([10**9, 12, 40]))
def test_sealed_bins_save_what_plain_sums_give(tmp_path_factory: pytest.TempPathFactory,
                                               chunks_: list[tuple[dict, bool]], seal_at: int, budget: int) -> None:
    """Chunks in any time order, saved after any of them: the stacks file and the records are the plain
    sums' (sealed bins unsealed where an older bin comes late), at the grain the bins' budget left."""
    from qprof.collectors import chunks

    p = tmp_path_factory.mktemp("seal") / "s.jsonl.gz"
    plain: dict = {}
    state = chunks.FoldState()
    old = chunks.SEAL_AT, chunks.MAX_BIN_ENTRIES
    chunks.SEAL_AT, chunks.MAX_BIN_ENTRIES = seal_at, budget
    try:
        for chunk, save in chunks_:
            part = {(tid, tid, "x", frames): [n, sum(bins.values()), dict(bins), [min(bins), max(bins)]]
                    for (tid, frames), (n, bins) in chunk.items()}
            for k, slot in part.items():
                add_counts(plain, k, slot[0], slot[1], slot[2].items(), (slot[3][0], slot[3][1]))
            state.merge(part)
            if save:
                state.save(p)
        state.save(p)
    finally:
        chunks.SEAL_AT, chunks.MAX_BIN_ENTRIES = old
    g = state.bin_grain
    for slot in plain.values():
        coarse: dict = {}
        for b, v in slot[2].items():
            coarse[b - b % g] = coarse.get(b - b % g, 0) + v
        slot[2] = coarse
    assert state.records() == records(plain)
    assert list(read_stacks(p)) == records(plain)
    assert g == 1 or state.bin_entries() <= budget
