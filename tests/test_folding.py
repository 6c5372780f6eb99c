"""Folding in parallel time slices gives exactly the stacks of one sequential `perf script`; the native
folder gives that reference's samples per thread and its stacks, within what its unwinder does better
(tests/test_folding.py::test_native_fold_agrees_with_perf_script says how close)."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import capture_ngtcp2, examples
from qprof.collectors import debuginfo, nativefold, perfdata
from qprof.archive import Run
from qprof.collectors.folding import (SliceSpec, _intersect, fold_run, merge, run_slices, run_specs, split_files,
                                     time_slices)
from qprof.collectors.perf import DWARF_STACK_BYTES, script_command
from qprof.collectors.perfscript import ParseStats, StackNeed, StreamFolder
from qprof.archive.stacks import Sample, StackRecord, fold, read_stacks
from qprof.runfiles import chunk_files
from qprof.errors import QprofError

# ---------------------------------------------------------------- pure parts


def _inside(t: int, window: tuple[int | None, int | None]) -> bool:
    start, end = window
    return (start is None or t >= start) and (end is None or t <= end)


@settings(max_examples=examples(300))
@given(st.lists(st.integers(0, 2**63), max_size=8), st.lists(st.integers(0, 2**63), max_size=30))
def test_time_slices_cover_every_timestamp_once(cuts: list[int], times: list[int]) -> None:
    slices = time_slices(cuts)
    assert len(slices) == len(set(cuts)) + 1
    for t in times + cuts + [c + 1 for c in cuts] + [0]:
        assert sum(_inside(t, w) for w in slices) == 1
    assert slices[0][0] is None and slices[-1][1] is None  # every sample counts, whatever the cuts


@settings(max_examples=examples(300))
@given(st.lists(st.integers(0, 10**6), max_size=6), st.integers(0, 10**6), st.lists(st.integers(0, 10**6), max_size=30))
def test_a_pid_that_moved_groups_is_read_once(cuts: list[int], moved: int, times: list[int]) -> None:
    """A target that exec'd into an image unwound the other way: the old group holds its samples
    up to the move, the new one after it; every time falls in exactly one slice of one of them."""
    old, new = [None, moved], [moved + 1, None]
    for t in times + cuts + [moved, moved + 1, 0]:
        hits = sum(_inside(t, w) for span in (old, new) for s in time_slices(cuts)
                   for w in [_intersect(s, span)] if w is not None)
        assert hits == 1, t


_samples = st.lists(st.builds(Sample, st.integers(1, 3), st.integers(1, 3), st.sampled_from(["a", "b"]),
                              st.integers(0, 1000), st.lists(st.sampled_from([("f", "/x"), ("g", "/y")]),
                                                             max_size=3).map(tuple)), max_size=40)


@settings(max_examples=examples(200))
@given(_samples, st.lists(st.integers(0, 40), max_size=4))
def test_merge_of_consecutive_parts_is_the_whole_fold(samples: list[Sample], cuts: list[int]) -> None:
    bounds = [0, *sorted(c for c in cuts if c <= len(samples)), len(samples)]
    parts = []
    for a, b in zip(bounds, bounds[1:]):
        st_ = ParseStats(samples=b - a, bad_lines=1, bad_examples=[f"bad {a}"])
        parts.append((fold(samples[a:b]), st_))
    records, stats = merge(parts)
    assert records == fold(samples)
    assert stats.samples == len(samples) and stats.bad_lines == len(parts)
    assert stats.bad_examples == [f"bad {a}" for a in bounds[:-1]][:5]


SAMPLE_TYPE = perfdata.SAMPLE_IP | perfdata.SAMPLE_TID | perfdata.SAMPLE_TIME | (1 << 5)  # + CALLCHAIN
ATTR_SIZE = 128 + 16  # perf_event_attr and its ids section


def _perf_file(path: Path, records: list[tuple[int, bytes]], sample_types: tuple[int, ...] = (SAMPLE_TYPE,)) -> None:
    """A minimal perf.data: header, one attr per sample type, records (type, payload)."""
    attrs = b"".join(struct.pack("<IIQQQ", 1, 128, 0, 999, st).ljust(ATTR_SIZE, b"\0") for st in sample_types)
    data = b"".join(struct.pack("<IHH", t, 0, 8 + len(p)) + p for t, p in records)
    attrs_off = 104
    data_off = attrs_off + len(attrs)
    head = struct.pack("<8sQQQQQQQQ", b"PERFILE2", 104, ATTR_SIZE, attrs_off, len(attrs), data_off, len(data), 0, 0)
    path.write_bytes(head + bytes(32) + attrs + data)


def _sample(time_ns: int, extra: int, pid: int = 7) -> tuple[int, bytes]:
    return perfdata.PERF_RECORD_SAMPLE, struct.pack("<QIIQ", 0x401000, pid, pid, time_ns) + bytes(8 * extra)


def test_prepare_retypes_ksymbols_across_mapping_windows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import mmap

    monkeypatch.setattr(perfdata, "_WINDOW", mmap.ALLOCATIONGRANULARITY)
    # records of odd sizes (perf pads to 8 bytes; these do not), so that headers fall on and across window edges
    recs = [(perfdata.PERF_RECORD_KSYMBOL if i % 3 == 0 else 3, bytes(3 * (i % 50) + 1)) for i in range(700)]
    f = tmp_path / "perf.data"
    _perf_file(f, recs)
    assert perfdata.neutralize_ksymbols(f) == sum(1 for t, _ in recs if t == perfdata.PERF_RECORD_KSYMBOL)
    raw = f.read_bytes()
    pos, types = len(raw) - sum(8 + len(p) for _, p in recs), []
    while pos < len(raw):
        t, _m, size = struct.unpack_from("<IHH", raw, pos)
        types.append(t)
        pos += size
    assert types == [perfdata.PERF_RECORD_FINISHED_INIT if t == perfdata.PERF_RECORD_KSYMBOL else t for t, _ in recs]
    assert perfdata.neutralize_ksymbols(f) == 0, "a second pass finds nothing left to repair"


def test_prepare_cuts_at_quantiles_of_the_targets_samples(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import mmap

    monkeypatch.setattr(perfdata, "_WINDOW", mmap.ALLOCATIONGRANULARITY)
    monkeypatch.setattr(perfdata._Quantiles.__init__, "__defaults__", (64,))  # thin the kept times early
    # the targets (pid 7) sample from t=1000 on; another process (pid 9) fills the first half of the data
    recs = [_sample(10 + i, 40, pid=9) for i in range(500)] + [_sample(1000 + 10 * i, i % 7) for i in range(1000)]
    f = tmp_path / "perf.data"
    _perf_file(f, recs)
    got = perfdata.prepare(f, 4, pids=[7])
    assert got.samples == 1000 and len(got.cuts) == 3
    for k, cut in enumerate(got.cuts, 1):  # each cut near k/4 of the targets' samples
        assert abs((cut - 1000) / 10 - 1000 * k / 4) <= 16
    windows = time_slices(got.cuts)
    counts = [sum(_inside(1000 + 10 * i, w) for i in range(1000)) for w in windows]
    assert sum(counts) == 1000 and all(230 <= c <= 270 for c in counts)
    assert perfdata.prepare(f, 4).samples == 1500, "without pids every sample counts"


def test_prepare_without_a_common_time_field_does_not_cut(tmp_path: Path) -> None:
    f = tmp_path / "perf.data"
    _perf_file(f, [_sample(5, 0)] * 10, (SAMPLE_TYPE, SAMPLE_TYPE | (1 << 16)))  # layouts differ
    assert perfdata.prepare(f, 3).cuts == []
    _perf_file(f, [_sample(5, 0)] * 10, (perfdata.SAMPLE_IP,))  # no time in samples
    assert perfdata.prepare(f, 3).cuts == []
    f.write_bytes(b"not perf data at all, but long enough for a header" * 3)
    with pytest.raises(QprofError, match="not a perf.data file"):
        perfdata.prepare(f, 2)


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(st.integers(0, 5000), max_size=12), st.integers(1, 6))
def test_split_files_keeps_every_file_once_in_order(sizes: list[int], parts: int) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        files = []
        for i, n in enumerate(sizes):
            f = Path(tmp) / f"c{i:02d}"
            f.write_bytes(b"x" * n)
            files.append(f)
        runs = split_files(files, parts)
        assert [f for r in runs for f in r] == files and all(runs) and len(runs) <= parts
        if len(files) >= parts and sum(sizes) and min(sizes) > 0:
            # no run is more than its fair share plus one file
            assert max(sum(f.stat().st_size for f in r) for r in runs) <= sum(sizes) / parts + max(sizes)


def _folder_lines(*objs: object) -> list[bytes]:
    return [json.dumps(o).encode() for o in objs]


STATS_LINE = {nativefold.STATS_KEY: {"samples": 3, "errors": 0}}


def test_folder_output_names_each_frame_once_for_a_served_folder() -> None:
    """The folder names a frame once in its life: a served folder's next file gives records by the ids the
    file before named, and every stack holds the table's own frame objects."""
    table: nativefold.FrameTable = {}
    first: list[StackRecord] = []
    lines = _folder_lines(["f", 7, "recvmsg", "[kernel.kallsyms]"], ["f", 2, "main", "/usr/bin/x"],
                          [10, 11, "x", 2, 4000, [7, 2], [5, 1000, 6, 3000], 500, 690], STATS_LINE)
    assert nativefold.read_output(lines, "a", first, ParseStats(), table) == ""
    assert first == [StackRecord(10, 11, "x", 2, 4000, (("recvmsg", "[kernel.kallsyms]"), ("main", "/usr/bin/x")),
                                 ((5, 1000), (6, 3000)), (500, 690))]
    second: list[StackRecord] = []
    assert nativefold.read_output(_folder_lines([10, 12, "x", 1, 2000, [2], [], 700, 700], STATS_LINE),
                                  "b", second, ParseStats(), table) == ""
    assert second[0].frames[0] is first[0].frames[1] and second[0].bins == ()
    fresh: list[StackRecord] = []
    with pytest.raises(QprofError, match="not a stack record of named frames"):  # a new table knows no id
        nativefold.read_output(_folder_lines([10, 12, "x", 1, 2000, [2], [], 700, 700]), "c", fresh, ParseStats())


@pytest.mark.parametrize("line, why", [
    ([10, 11, "x", 1, 10, [0], [5], 1, 1], "not a stack record"),  # a bin without its period
    ([10, 11, "x", 1, 10, [0], [], 1], "not a stack record"),  # a field short
    ([10, 11, 3, 1, 10, [0], [], 1, 1], "not a stack record"),  # comm not text
    ([10, 11, "x", True, 10, [0], [], 1, 1], "not a stack record"),  # a count that is not a number
    ([10, 11, "x", -1, 10, [0], [], 1, 1], "negative count"),
    ([10, 11, "x", 1, 10, [0], [5, -3], 1, 1], "negative count"),
    ([10, 11, "x", 1, 10, [0], [], 9, 1], "first sample after its last"),
    (["f", "0", "a", "b"], "frame name"),
    ({"pid": 1}, "no form qprof reads"),
])
def test_folder_output_refuses_what_it_cannot_read(line: object, why: str) -> None:
    with pytest.raises(QprofError, match=why):
        nativefold.read_output(_folder_lines(["f", 0, "s", "o"], line), "chunk", [], ParseStats())


_JSON = st.recursive(st.none() | st.booleans() | st.integers(-5, 5) | st.text(max_size=3),
                     lambda inner: st.lists(inner, max_size=9), max_leaves=20)


@settings(max_examples=examples(300))
@given(st.lists(_JSON, max_size=6))
def test_folder_output_of_any_shape_reads_or_is_refused(objs: list[object]) -> None:
    """Whatever a damaged or mismatched folder writes, reading it gives records or a QprofError, nothing else."""
    recs: list[StackRecord] = []
    try:
        nativefold.read_output(_folder_lines(["f", 0, "s", "o"], *objs), "chunk", recs, ParseStats())
    except QprofError:
        return
    assert all(isinstance(r, StackRecord) and all(set(map(type, f)) == {str} and len(f) == 2 for f in r.frames)
               for r in recs)


# ---------------------------------------------------------------- real captures


@pytest.fixture(scope="module", params=["dwarf", "fp"])
def capture(request: pytest.FixtureRequest, ngtcp2_tools: None, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return capture_ngtcp2(tmp_path_factory.mktemp(f"fold-{request.param}") / "run", 1 << 30,
                          unwind=request.param, probes=(), keep_raw=True, chunk_bytes=1 << 40)


def _copy(run: Path, dest: Path) -> Path:
    """The run's metadata and perf data (hard links) without its stacks: a place to fold again."""
    dest.mkdir()
    shutil.copy(run / "meta.json", dest / "meta.json")
    for f in run.glob("perf-*.data*"):
        (dest / f.name).hardlink_to(f)
    return dest


def _category_samples(run: Path) -> Counter[tuple[int, str]]:
    from qprof.attribution.mapping import MappingSet
    from qprof.attribution.profile import attribute

    profile = attribute(Run.open(run), MappingSet.load([]))
    return Counter({(p.pid, cat): n for p in profile.processes for cat, n in p.breakdown.category_samples.items()})


def _reference(perf: str, capture: Path) -> tuple[list[StackRecord], ParseStats]:
    """The plain way: one perf script over the whole file, folded whole (over the same build-id cache
    the run's symbols were prepared in)."""
    (group,) = Run.open(capture).meta.sampling.groups
    (data,) = chunk_files(capture, group.perf_data, include_current=True)  # one chunk: chunk_bytes is 1 TiB
    perfdata.prepare(data, 1, group.pids)
    stats = ParseStats()
    with subprocess.Popen(script_command(perf, data, group.pids, buildid_dir=debuginfo.cache_root()),
                          stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL, text=True, errors="replace") as p:
        assert p.stdout is not None
        folder = StreamFolder(stats)
        folder.feed(p.stdout.read())
        reference = folder.finish()
    assert p.returncode == 0 and stats.samples > 1000
    return reference, stats


@pytest.mark.root
@pytest.mark.slow
def test_parallel_fold_equals_sequential(capture: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QPROF_FOLD", "perf-script")
    perf = shutil.which("perf")
    assert perf is not None
    groups = Run.open(capture).meta.sampling.groups
    (group,) = groups
    (data,) = chunk_files(capture, group.perf_data, include_current=True)
    # the cuts split the target samples into slices that each do a share of the work
    cuts = perfdata.prepare(data, 3, group.pids).cuts
    parts = run_slices(perf, [SliceSpec(data, tmp_path / "perf.log", group.pids, w) for w in time_slices(cuts)], 3)
    per_slice = [st_.samples for _, st_ in parts]
    assert len(per_slice) == 3 and all(n > 0.05 * sum(per_slice) for n in per_slice), per_slice
    reference, ref_stats = _reference(perf, capture)

    counts = {}
    for jobs in (1, 2, 3):
        run = _copy(capture, tmp_path / f"jobs{jobs}")
        assert len(run_specs(run, groups, jobs)) == jobs
        stats = fold_run(perf, run, groups, jobs=jobs)
        records = list(read_stacks(run / "stacks.jsonl.gz"))
        assert records == reference, f"jobs={jobs}: same stacks, counts, periods and order"
        assert (stats.samples, stats.bad_lines) == (ref_stats.samples, ref_stats.bad_lines)
        counts[jobs] = _category_samples(run)
    assert counts[1] == counts[2] == counts[3]
    assert sum(counts[1].values()) == ref_stats.samples
    assert {pid for pid, _ in counts[1]} == set(group.pids)


STACKS_AGREE = 0.995  # share of samples whose whole stack must be perf script's (measured: 99.56-100%)
CATEGORY_PP = 0.5  # the limit on a category share's difference, percentage points


@pytest.mark.root
@pytest.mark.slow
def test_native_fold_agrees_with_perf_script(capture: Path, tmp_path: Path) -> None:
    """The native folder (built by make setup) on a real ngtcp2 capture against one perf script: the
    same samples of every thread, the same stacks for nearly all of them (where they part, the two
    unwinders stop at different frames), categories within 0.5 pp."""
    folder = nativefold.built()
    assert folder is not None, "qprof's native folder is not built: `make setup` builds it"
    perf = shutil.which("perf")
    assert perf is not None
    groups = Run.open(capture).meta.sampling.groups
    reference, ref_stats = _reference(perf, capture)
    ref_run = _copy(capture, tmp_path / "perf-script")
    from qprof.archive.stacks import write_stacks

    write_stacks(ref_run / "stacks.jsonl.gz", reference)
    run = _copy(capture, tmp_path / "native")
    stats = fold_run(perf, run, groups)
    records = list(read_stacks(run / "stacks.jsonl.gz"))
    assert stats.folder == nativefold.NAME and stats.bad_lines == 0, stats.bad_examples

    def per_thread(recs: list[StackRecord]) -> Counter[tuple[int, int]]:
        out: Counter[tuple[int, int]] = Counter()
        for r in recs:
            out[(r.pid, r.tid)] += r.samples
        return out

    assert per_thread(records) == per_thread(reference) and stats.samples == ref_stats.samples
    ours = Counter({(r.pid, r.tid, r.frames): r.samples for r in records})
    same = sum(min(n, ours[(r.pid, r.tid, r.frames)]) for r in reference for n in [r.samples])
    print(f"\n{stats.samples} samples, {same / stats.samples:.3%} with perf script's whole stack; "
          f"the folder used {stats.script_cpu_s:.2f} CPU s")
    assert same >= STACKS_AGREE * stats.samples
    a, b = _category_samples(ref_run), _category_samples(run)
    for pid, cat in a.keys() | b.keys():
        n = sum(v for (p, _), v in a.items() if p == pid)
        assert abs(a[(pid, cat)] - b[(pid, cat)]) / n * 100 <= CATEGORY_PP, (pid, cat, a[(pid, cat)], b[(pid, cat)])


def _each(folder: Path, data: Path, pids: list[int], limit: int | None) -> tuple[dict[tuple[int, int], list[str]], dict[str, Any]]:
    """Every sample's stack (by time and thread) as the folder unwinds it, perhaps as if perf had copied
    only `limit` bytes; and its statistics."""
    cmd = nativefold.command(folder, [data], pids, debuginfo.cache_root())
    cmd[1:1] = ["--each", *(["--copy-limit", str(limit)] if limit is not None else [])]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.splitlines()
    stats = json.loads(out[-1])[nativefold.STATS_KEY]
    stacks: dict[tuple[int, int], list[str]] = {}
    for line in out[:-1]:
        s = json.loads(line)
        stacks.setdefault((s["time"], s["tid"]), []).append(json.dumps(s["frames"]))
    return stacks, stats


@pytest.mark.root
@pytest.mark.slow
@pytest.mark.parametrize("capture", ["dwarf"], indirect=True)
def test_stack_need_says_which_stacks_a_copy_cuts(capture: Path) -> None:
    """The folder's measure of how far unwinding read into each DWARF stack copy (what the report's
    count of stacks cut at the copy's end rests on), held against the folder itself on a real ngtcp2
    capture: folded again as if perf had copied less (--copy-limit), only the stacks that read past the
    limit change; at the deepest finished stack's need, none that finished changes."""
    folder = nativefold.built()
    assert folder is not None, "qprof's native folder is not built: `make setup` builds it"
    (group,) = Run.open(capture).meta.sampling.groups
    (data,) = chunk_files(capture, group.perf_data, include_current=True)
    full, stats = _each(folder, data, group.pids, None)
    needs = {int(p): StackNeed.parse(n) for p, n in stats["stack_need"].items()}
    whole = StackNeed()
    for n in needs.values():
        whole.absorb(n)
    finished = sorted(b for b, c in whole.needed.items() for _ in range(c))
    assert set(needs) == set(group.pids) and whole.copied == DWARF_STACK_BYTES and len(finished) > 200, needs
    print(f"\n{whole.stacks} stacks, {whole.truncated} past the {DWARF_STACK_BYTES} B copy; bytes the finished "
          f"ones read: median {finished[len(finished) // 2]}, deepest {whole.deepest}; "
          + "; ".join(f"pid {p}: {n.truncated} of {n.stacks} past the copy" for p, n in needs.items()))
    limit = finished[len(finished) * 4 // 5]  # a fifth or so of the finished stacks read past it
    for copy in (limit, whole.deepest):
        past = sum(c for b, c in whole.needed.items() if b > copy)
        cut, cut_stats = _each(folder, data, group.pids, copy)
        assert cut.keys() == full.keys()
        changed = sum(1 for k, v in full.items() if sorted(v) != sorted(cut[k]))
        truncated = sum(n["truncated"] for n in cut_stats["stack_need"].values())
        print(f"copy {copy} B: {changed} stacks changed, {truncated} past it; measured to read past it: {past}")
        # no stack that read within the copy changes; one that read past it changes, unless its deepest
        # read only told the unwinder where the stack ends (166 of 166 did on the capture of 2026-11-29)
        assert whole.truncated <= truncated <= whole.truncated + past
        assert changed <= past + whole.truncated and changed >= 0.9 * past
