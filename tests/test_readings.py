"""The collector's periodic readings, made cheap (collectors.procfs, probes.mapsout): each runs several
times a second beside the targets, so each reads as little as gives the same answer as the full read."""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import replace
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from qprof.archive.identity import READ_SIZE, read_proc
from qprof.collectors import procfs
from qprof.collectors.procfs import _switches
from qprof.probes.mapsout import MapTail, last_path, read_maps


def _switches_by_lines(status: str | None) -> tuple[int | None, int | None]:
    """The two counts read line by line, as /proc/PID/status is laid out."""
    found: dict[str, int] = {}
    for line in (status or "").splitlines():
        key, _, value = line.partition(":")
        if key in ("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches") and value.strip().isdigit():
            found[key] = int(value)
    return found.get("voluntary_ctxt_switches"), found.get("nonvoluntary_ctxt_switches")


def test_switches_of_a_real_status_match_a_line_by_line_read() -> None:
    status = read_proc(f"/proc/{os.getpid()}/status")
    assert status is not None
    voluntary, involuntary = _switches(status)
    assert voluntary is not None and involuntary is not None
    assert (voluntary, involuntary) == _switches_by_lines(status)
    assert _switches(None) == (None, None) and _switches("Name:\tx\n") == (None, None)
    assert _switches("voluntary_ctxt_switches:\tlots\n") == (None, None)


_LINE = st.sampled_from(["voluntary_ctxt_switches", "nonvoluntary_ctxt_switches", "Name", "Threads"]).flatmap(
    lambda k: st.tuples(st.just(k), st.one_of(st.integers(0, 10**12).map(str), st.text(max_size=6))))


@settings(max_examples=300, deadline=None)
@given(st.lists(_LINE, max_size=8))
def test_switches_agree_with_a_line_by_line_read_on_any_status(lines: list[tuple[str, str]]) -> None:
    # the kernel writes each key once, and a line's value has no line break
    lines = [(k, v.replace("\n", " ").replace("\r", " ")) for k, v in dict(lines).items()]
    status = "Name:\tq\n" + "".join(f"{k}:\t{v}\n" for k, v in lines)
    assert _switches(status) == _switches_by_lines(status)


def test_read_proc_reads_a_file_of_many_records_whole_and_a_gone_file_is_none(tmp_path: Path) -> None:
    """A seq_file of many records comes a page of them per read(2), so only a single-record file may be
    taken from one short read: kallsyms (~5 MB, stable while nothing loads) read both ways is whole."""
    assert READ_SIZE > 4096
    for attempt in range(3):  # a BPF program loaded between the two reads changes it: read again
        mine, plain = read_proc("/proc/kallsyms"), Path("/proc/kallsyms").read_text()
        if mine == plain:
            break
    assert mine == plain and mine is not None and len(mine) > 4 * READ_SIZE
    big = tmp_path / "big"
    data = bytes(range(97, 123)) * (3 * READ_SIZE // 26 + 5)
    big.write_bytes(data)
    assert read_proc(str(big)) == read_proc(str(big), one_record=True) == data.decode()
    exact = tmp_path / "exact"
    exact.write_bytes(b"x" * READ_SIZE)
    assert read_proc(str(exact), one_record=True) == "x" * READ_SIZE
    assert read_proc(str(tmp_path / "none")) is None and read_proc(str(tmp_path / "none"), one_record=True) is None
    status = f"/proc/{os.getpid()}/task/{os.getpid()}/status"
    one, whole = read_proc(status, one_record=True), read_proc(status)
    assert one is not None and whole is not None and one.splitlines()[0] == whole.splitlines()[0]
    assert one.endswith("\n") and "nonvoluntary_ctxt_switches" in one


def test_vm_size_grows_with_a_mapping_and_a_gone_process_has_none() -> None:
    import mmap
    before = procfs.vm_size(os.getpid())
    assert before is not None and before > 0
    with mmap.mmap(-1, 64 << 20) as m:
        assert procfs.vm_size(os.getpid()) == before + (64 << 20)
        m[0] = 1
    child = subprocess.Popen(["true"])
    child.wait()
    assert procfs.vm_size(child.pid) is None


def test_affinity_is_the_system_calls_and_the_status_files() -> None:
    child = subprocess.Popen(["sleep", "30"])
    try:
        os.sched_setaffinity(child.pid, {0})
        limits = procfs.cpu_limits(child.pid, [])
        status = read_proc(f"/proc/{child.pid}/status") or ""
        listed = next(line.split(":", 1)[1] for line in status.splitlines() if line.startswith("Cpus_allowed_list:"))
        assert limits.cpus_allowed == procfs.cpu_list(listed) == [0]
    finally:
        child.kill()
        child.wait()
    assert procfs.cpu_limits(child.pid, []).cpus_allowed is None


def _print(f: object, maps: dict[str, object]) -> None:
    assert hasattr(f, "write")
    f.write(json.dumps({"type": "map", "data": maps}) + "\n")  # type: ignore[attr-defined]
    f.flush()  # type: ignore[attr-defined]


def test_a_compacted_stream_keeps_every_maps_last_value(tmp_path: Path) -> None:
    out = tmp_path / "probe-x.jsonl"
    with open(out, "a", encoding="utf-8") as f:
        tail = MapTail(out)
        _print(f, {"@once": {"1": 5}, "@count": {"1": 1}})
        _print(f, {"@count": {"1": 2}})
        f.write('{"type": "map", "da')  # a print cut off: not yet a line
        f.flush()
        tail.compact()
        assert out.stat().st_size == 0
        kept = {"type": "map", "data": {"@once": {"1": 5}, "@count": {"1": 2}}}
        assert json.loads(last_path(out).read_text()) == kept
        _print(f, {"@count": {"1": 3}})  # the stream starts again
        assert tail.read() == {"@once": {"1": 5}, "@count": {"1": 3}}
        assert read_maps(out) == tail.read()
        # a tail made after a compaction starts from what it kept
        assert MapTail(out).read() == {"@once": {"1": 5}, "@count": {"1": 3}}
        tail.compact()
        _print(f, {"@count": {"1": 4}})
        assert MapTail(out).read() == tail.read() == read_maps(out) == {"@once": {"1": 5}, "@count": {"1": 4}}


def test_a_thread_that_has_not_run_keeps_its_switches_and_system_call_without_reading_them() -> None:
    """thread_times given the last reading: a sleeping thread's two files are not read again, and what
    it gives equals a full read; a thread that ran is read whole."""
    child = subprocess.Popen(["sleep", "30"])
    try:
        deadline = time.monotonic() + 10
        while (full := procfs.thread_times(child.pid))[0].syscall in (None, "running") and time.monotonic() < deadline:
            time.sleep(0.05)  # until it sleeps in its nanosleep
        (t,) = full
        assert t.state == "S" and t.syscall is not None and t.voluntary is not None
        # a reading whose syscall and switches differ: kept, so these files were not read again
        marked = [replace(t, syscall="marked", voluntary=-1, involuntary=-2)]
        (again,) = procfs.thread_times(child.pid, marked)
        assert (again.syscall, again.voluntary, again.involuntary) == ("marked", -1, -2)
        assert replace(again, syscall=t.syscall, voluntary=t.voluntary, involuntary=t.involuntary) == t
        # another schedstat (it ran) or another state: read whole
        ran = [replace(t, on_cpu_s=(t.on_cpu_s or 0) - 1e-3, syscall="marked")]
        assert procfs.thread_times(child.pid, ran) == full
        woke = [replace(t, state="R", syscall="marked")]
        assert procfs.thread_times(child.pid, woke) == full
    finally:
        child.kill()
        child.wait()
