"""Folding in parallel time slices gives exactly the stacks of one sequential `perf script`."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import ngtcp2_capture
from qprof.collectors import perfdata
from qprof.collectors.archive import Run
from qprof.collectors.folding import fold_run, merge, run_specs, time_slices
from qprof.collectors.perf import script_command
from qprof.collectors.perfscript import ParseStats, Sample, parse_samples
from qprof.collectors.stacks import fold, read_stacks

# ---------------------------------------------------------------- pure parts


def _inside(t: int, window: tuple[int | None, int | None]) -> bool:
    start, end = window
    return (start is None or t >= start) and (end is None or t <= end)


@settings(max_examples=300)
@given(st.integers(1, 2**62), st.integers(0, 10**6), st.integers(1, 9), st.lists(st.integers(-50, 10**6 + 50),
                                                                             max_size=30))
def test_time_slices_cover_every_timestamp_once(first: int, span: int, n: int, offsets: list[int]) -> None:
    slices = time_slices((first, first + span), n)
    assert len(slices) == (n if span >= n else 1)
    for t in [first + o for o in offsets] + [first, first + span]:
        assert sum(_inside(t, w) for w in slices) == 1
    assert slices[0][0] is None and slices[-1][1] is None  # samples outside the recorded window still count


def test_no_window_one_slice() -> None:
    assert time_slices(None, 4) == [(None, None)]
    assert time_slices((10, 20), 1) == [(None, None)]


_samples = st.lists(st.builds(Sample, st.integers(1, 3), st.integers(1, 3), st.sampled_from(["a", "b"]),
                              st.integers(0, 1000), st.lists(st.sampled_from([("f", "/x"), ("g", "/y")]),
                                                             max_size=3).map(tuple)), max_size=40)


@settings(max_examples=200)
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


def _perf_file(path: Path, records: list[tuple[int, bytes]], sample_time: tuple[int, int] | None) -> None:
    """A minimal perf.data: header, records (type, payload), and optionally the SAMPLE_TIME feature."""
    data = b"".join(struct.pack("<IHH", t, 0, 8 + len(p)) + p for t, p in records)
    data_off = 104
    feats = 1 << perfdata.HEADER_SAMPLE_TIME if sample_time else 0
    sections = b""
    if sample_time:
        sec_off = data_off + len(data) + 16
        sections = struct.pack("<QQ", sec_off, 16) + struct.pack("<QQ", *sample_time)
    head = struct.pack("<8sQQQQQQQQ", b"PERFILE2", 104, 136, 0, 0, data_off, len(data), 0, 0)
    path.write_bytes(head + feats.to_bytes(32, "little") + data + sections)


def test_sample_time_range_from_header(tmp_path: Path) -> None:
    f = tmp_path / "perf.data"
    _perf_file(f, [(9, b"x" * 24)], (5_000_000_123, 9_000_000_456))
    assert perfdata.sample_time_range(f) == (5_000_000_123, 9_000_000_456)
    _perf_file(f, [(9, b"x" * 24)], None)
    assert perfdata.sample_time_range(f) is None
    f.write_bytes(b"not perf")
    assert perfdata.sample_time_range(f) is None


def test_neutralize_ksymbols_across_mapping_windows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import mmap

    monkeypatch.setattr(perfdata, "_WINDOW", mmap.ALLOCATIONGRANULARITY)
    # records of odd sizes, so that headers fall on and across window edges
    recs = [(perfdata.PERF_RECORD_KSYMBOL if i % 3 == 0 else 9, bytes(8 * (i % 50) + 8)) for i in range(400)]
    f = tmp_path / "perf.data"
    _perf_file(f, recs, (1, 2))
    assert perfdata.neutralize_ksymbols(f) == sum(1 for t, _ in recs if t == perfdata.PERF_RECORD_KSYMBOL)
    raw = f.read_bytes()
    pos, types = 104, []
    while pos < 104 + sum(8 + len(p) for _, p in recs):
        t, _m, size = struct.unpack_from("<IHH", raw, pos)
        types.append(t)
        pos += size
    assert types == [perfdata.PERF_RECORD_FINISHED_INIT if t == perfdata.PERF_RECORD_KSYMBOL else t for t, _ in recs]
    assert perfdata.sample_time_range(f) == (1, 2), "the rest of the file is untouched"


# ---------------------------------------------------------------- real captures


@pytest.fixture(scope="module", params=["dwarf", "fp"])
def capture(request: pytest.FixtureRequest, ngtcp2_tools: None, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ngtcp2_capture(tmp_path_factory.mktemp(f"fold-{request.param}") / "run", 1 << 30,
                          unwind=request.param, probes=())


def _copy(run: Path, dest: Path) -> Path:
    """The run's metadata and perf data (hard links) without its stacks: a place to fold again."""
    dest.mkdir()
    shutil.copy(run / "meta.json", dest / "meta.json")
    for f in run.glob("perf-*.data"):
        (dest / f.name).hardlink_to(f)
    return dest


def _category_samples(run: Path) -> Counter[tuple[int, str]]:
    from qprof.attribution.mapping import MappingSet
    from qprof.attribution.profile import attribute

    profile = attribute(Run.open(run), MappingSet.load([]))
    return Counter({(p.pid, cat): n for p in profile.processes for cat, n in p.breakdown.category_samples.items()})


@pytest.mark.root
@pytest.mark.slow
def test_parallel_fold_equals_sequential(capture: Path, tmp_path: Path) -> None:
    perf = shutil.which("perf")
    assert perf is not None
    meta = json.loads((capture / "meta.json").read_text())
    (group,) = meta["sampling"]["groups"]
    data = capture / group["perf_data"]
    # the time window perf recorded is the one `perf report` shows
    header = subprocess.run([perf, "report", "--header-only", "-i", str(data)], capture_output=True, text=True).stdout
    first, last = perfdata.sample_time_range(data)  # type: ignore[misc]
    assert f"time of first sample : {first // 10**9}.{first % 10**9 // 1000:06d}" in header
    assert f"time of last sample : {last // 10**9}.{last % 10**9 // 1000:06d}" in header

    # the previous implementation: one perf script over the whole file, the line parser, fold
    ref_stats = ParseStats()
    with subprocess.Popen(script_command(perf, data, group["pids"]), stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL, text=True, errors="replace") as p:
        reference = fold(parse_samples(p.stdout, ref_stats))  # type: ignore[arg-type]
    assert p.returncode == 0 and ref_stats.samples > 1000

    counts = {}
    for jobs in (1, 2, 3):
        run = _copy(capture, tmp_path / f"jobs{jobs}")
        assert len(run_specs(run, meta, jobs)) == jobs
        stats = fold_run(perf, run, meta, jobs=jobs)
        records = list(read_stacks(run / "stacks.jsonl.gz"))
        assert records == reference, f"jobs={jobs}: same stacks, counts, periods and order"
        assert (stats.samples, stats.bad_lines) == (ref_stats.samples, ref_stats.bad_lines)
        counts[jobs] = _category_samples(run)
    assert counts[1] == counts[2] == counts[3]
    assert sum(counts[1].values()) == ref_stats.samples
    assert {pid for pid, _ in counts[1]} == set(group["pids"])
