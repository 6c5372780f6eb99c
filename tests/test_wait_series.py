"""The wall clock over time: the waits loader's series per 100 ms (probes/waits/series.py) and the timeline's
`wall` (attribution.timeline, `report --timeline` text and JSON, the HTML page).

Synthetic first: the loader's binning (series.Binner) on hand-made cumulative totals, the reader on good
and damaged files, and a hand-made archive whose series has known answers, through the real command line;
a run without a series prints exactly what it printed before (no `wall_s`, no columns, no script).
Then the real kernel: `qprof attach` for ~3 s on a program that sleeps 1 s (timer), spins 1 s (on a CPU),
then blocks 1 s in a UDP recvfrom until a datagram comes (network); each phase's bins, 2 bins in from
its edges (the program writes the CLOCK_MONOTONIC time each phase starts), must show its state dominant
(the spin's: on a CPU, or runnable where a loaded host preempts it, never a wait), hold one thread's
bin to 1%, and agree with perf's CPU in the same bin (its samples, on the same clock) within 15 ms.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st

from conftest import attach_held, edited_meta, examples, qprof
from qprof import archive, runfiles
from qprof.archive.model import STATUS_COMPLETE, Meta, Sampling, Target
from qprof.archive.stacks import BIN_S, Sample, fold, write_stacks
from qprof.probes.waits.maps import STATES
from qprof.probes.waits.series import BIN_NS, MAX_SPREAD, Binner, WaitSeries, file_name

B = BIN_NS
K = "[kernel.kallsyms]"
SEND = (("udp_sendmsg", K), ("__sys_sendmsg", K))
MS = 1_000_000
T0 = 5000.0  # the run's first /proc reading, CLOCK_MONOTONIC seconds
FIRST = int(T0 * 10)  # its bin


def _vec(**ns: int) -> list[int]:
    return [ns.get(s, 0) for s in STATES]


# -- the loader's binning


def test_binner_cuts_each_process_at_the_edges() -> None:
    start = 10 * B + 40 * MS  # the loader starts 40 ms into a bin
    b = Binner(start)
    assert b.header() == {"bin_ns": B, "start_ns": start, "states": list(STATES)}
    assert b.next_edge(start) == 11 * B and b.edge_before(11 * B + 5) == 11 * B
    # first edge: two threads of pid 1 (60 ms each since the start), one of pid 2
    line = b.cut(11 * B, [(1, 11, _vec(on_cpu=60 * MS)), (1, 12, _vec(timer=50 * MS, runnable=10 * MS)),
                          (2, 21, _vec(network=60 * MS))], {})
    assert line == {"t": 10 * B, "d": {"1,on_cpu": 60 * MS, "1,runnable": 10 * MS, "1,timer": 50 * MS,
                                       "2,network": 60 * MS}}
    # second edge: thread 12 exited 30 ms in and left the map (its final totals in `exited`), a new one came
    line = b.cut(12 * B, [(1, 11, _vec(on_cpu=160 * MS)), (1, 13, _vec(runnable=5 * MS, thread=45 * MS)),
                          (2, 21, _vec(network=150 * MS, on_cpu=10 * MS))],
                 {(1, 12): _vec(timer=80 * MS, runnable=10 * MS)})
    assert line == {"t": 11 * B, "d": {"1,on_cpu": 100 * MS, "1,runnable": 5 * MS, "1,timer": 30 * MS,
                                       "1,thread": 45 * MS, "2,on_cpu": 10 * MS, "2,network": 90 * MS}}
    # late by two bins: one line for them; a thread no event had told about (placed on a CPU by /proc)
    # turns out to have been runnable: the split is corrected, its time stays what elapsed
    line = b.cut(14 * B, [(1, 11, _vec(on_cpu=160 * MS, runnable=200 * MS)), (1, 13, _vec(runnable=5 * MS, thread=245 * MS)),
                          (2, 21, _vec(network=350 * MS, on_cpu=10 * MS))], {})
    assert line is not None and line["t"] == 12 * B and line["n"] == 2
    assert line["d"] == {"1,runnable": 200 * MS, "1,thread": 200 * MS, "2,network": 200 * MS}
    # the stop, 30 ms into a bin; a tid used again by another process counts from zero
    line = b.cut(14 * B + 30 * MS, [(3, 11, _vec(other=20 * MS))], {})
    assert line == {"t": 14 * B, "d": {"3,other": 20 * MS}}
    assert b.cut(14 * B + 30 * MS, [], {}) is None  # nothing elapsed


def test_binner_keeps_bins_to_their_length_when_the_read_is_late() -> None:
    """Intervals that closed after the edge, before the loader read the map, are whole in the totals:
    the bin keeps its length, the excess goes to the next bin, nothing is lost."""
    b = Binner(0)
    lines = [b.cut(B, [(1, 1, _vec(on_cpu=B))], {})]
    # read 4 ms late: it blocked (timer) 40 ms before the edge and woke 4 ms after it; that 44 ms wait closed
    lines.append(b.cut(2 * B, [(1, 1, _vec(on_cpu=B + 60 * MS, timer=44 * MS))], {}))
    lines.append(b.cut(3 * B, [(1, 1, _vec(on_cpu=B + 156 * MS, timer=44 * MS))], {}))  # read on time
    d = [ln["d"] for ln in lines if ln is not None]
    assert [sum(x.values()) for x in d] == [B, B, B]
    assert d[1] == {"1,on_cpu": 60 * MS * B // (104 * MS) + 1, "1,timer": 44 * MS * B // (104 * MS)}
    assert sum(x.get("1,on_cpu", 0) for x in d) == B + 156 * MS and sum(x.get("1,timer", 0) for x in d) == 44 * MS


def test_binner_keeps_a_bins_time_when_a_state_is_corrected() -> None:
    b = Binner(0)
    b.cut(B, [(1, 1, _vec(on_cpu=B))], {})  # /proc said R: on a CPU
    line = b.cut(2 * B, [(1, 1, _vec(runnable=2 * B))], {})  # its first event: runnable all along
    assert line == {"t": B, "d": {"1,runnable": B}}


# -- the reader


def _write(path: Path, lines: list[Any], tail: str = "") -> Path:
    path.write_text("".join((ln if isinstance(ln, str) else json.dumps(ln)) + "\n" for ln in lines) + tail)
    return path


def test_series_round_trip_and_damaged_lines(tmp_path: Path) -> None:
    b = Binner(3 * B + 10 * MS)
    lines: list[Any] = [b.header()]
    lines.append(b.cut(4 * B, [(7, 7, _vec(on_cpu=90 * MS))], {}))
    lines.append(b.cut(5 * B, [(7, 7, _vec(on_cpu=150 * MS, timer=40 * MS))], {}))
    lines.append(b.cut(8 * B, [(7, 7, _vec(on_cpu=150 * MS, timer=340 * MS))], {}))  # n: 3
    damaged = ['{"t": 1, "d": {"7,on_cpu": -5}}', '{"t": 1, "d": {"7,bogus": 5}}', '{"t": -1, "d": {}}',
               '{"t": 1.5, "d": {}}', '{"t": 1, "d": {"x,on_cpu": 1}}', '{"t": 1, "d": []}',
               f'{{"t": 1, "n": {MAX_SPREAD + 1}, "d": {{}}}}', '{"t": true, "d": {}}', '[1, 2]', "not json",
               '{"bin_ns": 5}']  # a second header is no bin
    path = _write(tmp_path / file_name(), lines + damaged, tail='{"t": 900000000, "d": {"7,on_')  # cut by a kill
    s = WaitSeries.read(path)
    assert s is not None and s.bin_ns == B and s.start_ns == 3 * B + 10 * MS
    assert (s.lines, s.damaged) == (3, len(damaged) + 1)
    assert s.pids == [7] and s.process(7) == {**dict.fromkeys(STATES, 0), "on_cpu": 150 * MS, "timer": 340 * MS}
    assert s.bins[7] == {3: {"on_cpu": 90 * MS}, 4: {"on_cpu": 60 * MS, "timer": 40 * MS},
                         5: {"timer": 100 * MS}, 6: {"timer": 100 * MS}, 7: {"timer": 100 * MS}}
    # as a long run's merged timeline bins (2 bins each), and as bins that are no multiple of the file's
    assert s.over(7, 2 * B) == {1: {"on_cpu": 90e6}, 2: {"on_cpu": 60e6, "timer": 140e6}, 3: {"timer": 200e6}}
    half = s.over(7, B // 2)
    assert half[6] == half[7] == {"on_cpu": 45e6} and half[15] == {"timer": 50e6}
    assert WaitSeries.read(tmp_path / "absent") is None
    assert WaitSeries.parse([]) == WaitSeries()
    # a header that says nothing usable: the default bin, counted
    assert WaitSeries.parse(['{"bin_ns": 0}', '{"t": 0, "d": {"1,timer": 3}}']).damaged == 1
    huge = WaitSeries.parse(['{"bin_ns": 1e18}', '{"t": 0, "d": {"1,timer": 3}}'])  # over() would never end
    assert huge.damaged == 1 and huge.bin_ns == B


_JSON = st.recursive(st.none() | st.booleans() | st.integers(-2, 10**12) | st.floats(allow_nan=True) |
                     st.sampled_from(["7,on_cpu", "7,timer", "x", "t", "d", "n", "bin_ns"]),
                     lambda kids: st.lists(kids, max_size=4) | st.dictionaries(
                         st.sampled_from(["t", "d", "n", "bin_ns", "start_ns", "7,on_cpu", "8,network", "7,bogus", "x,timer"]),
                         kids, max_size=5), max_leaves=12)


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(st.one_of(_JSON.map(json.dumps), st.text(max_size=40), st.binary(max_size=40)), max_size=12))
def test_any_file_reads_without_raising(lines: list[str | bytes]) -> None:
    s = WaitSeries.parse(lines)
    assert s.lines + s.damaged <= len(lines) and s.bin_ns > 0
    for per in s.bins.values():
        for cell in per.values():
            assert set(cell) <= set(STATES) and all(v >= 0 for v in cell.values())


def test_the_series_bin_is_the_timelines() -> None:
    import qprof.attribution.timeline  # noqa: F401  (checks it at import)

    assert BIN_NS == round(BIN_S * 1e9)
    assert file_name() == runfiles.probe_file("waits", "series.jsonl") == "probe-waits.series.jsonl"


# -- the timeline, from a hand-made archive


def _reading(t: float) -> dict[str, Any]:
    return {"t": 1.7e9 + t, "mono": T0 + t, "threads": {"7": [{"tid": 7, "comm": "srv", "state": "R",
                                                                "utime_s": t, "stime_s": 0.0, "cpu": 0}]},
            "tcp": {"7": [0, 0]}}


def _series(bins: dict[int, dict[str, int]], pid: int = 7) -> list[Any]:
    return [{"bin_ns": B, "start_ns": FIRST * B, "states": list(STATES)},
            *({"t": (FIRST + i) * B, "d": {f"{pid},{s}": v for s, v in d.items()}} for i, d in sorted(bins.items()))]


# two threads: bins 0-1 one spins and one sleeps, bin 2 both wait for the network (one of them runnable a
# tenth of it), bin 3 one waits for another thread, bin 4 one exited mid-bin: its 50 ms are the bin's
WALL = {0: {"on_cpu": 100 * MS, "timer": 100 * MS}, 1: {"on_cpu": 100 * MS, "timer": 100 * MS},
        2: {"network": 180 * MS, "runnable": 20 * MS}, 3: {"thread": 200 * MS}, 4: {"other": 150 * MS}}


@pytest.fixture
def run(tmp_path: Path, user_config: Path) -> Path:
    path = tmp_path / "run"
    path.mkdir()
    archive.write_meta(path, Meta(status=STATUS_COMPLETE, sampling=Sampling(frequency=999, clock="monotonic"),
                                  targets=[Target(7, "srv", "server")]))
    write_stacks(path / runfiles.STACKS, fold([Sample(7, 7, "srv", MS, SEND, FIRST + b) for b in (0, 1)
                                               for _ in range(100)]))
    (path / runfiles.PROC).write_text("".join(json.dumps(_reading(t)) + "\n" for t in (0.0, 0.25, 0.5)))
    return path


def _json_timeline(run: Path) -> dict[str, Any]:
    return json.loads(qprof("report", str(run), "--format", "json", "--timeline").stdout)["timeline"]


def test_timeline_wall_clock_known_answer(run: Path) -> None:
    without = _json_timeline(run)
    text_without = qprof("report", str(run), "--timeline").stdout
    (t,) = without["targets"]
    assert "wall_s" not in t and "wall clock" not in text_without
    _write(run / file_name(), _series(WALL), tail='{"t": 5')  # the loader killed mid-line
    tl = _json_timeline(run)
    (t,) = tl["targets"]
    assert tl["bins"] == 6 and list(t["wall_s"]) == list(STATES)
    assert t["wall_s"]["on_cpu"] == [0.1, 0.1, 0.0, 0.0, 0.0, 0.0]
    assert t["wall_s"]["timer"] == [0.1, 0.1, 0.0, 0.0, 0.0, 0.0]
    assert t["wall_s"]["network"] == [0.0, 0.0, 0.18, 0.0, 0.0, 0.0]
    assert t["wall_s"]["runnable"] == [0.0, 0.0, 0.02, 0.0, 0.0, 0.0]
    assert t["wall_s"]["thread"][3] == 0.2 and t["wall_s"]["other"][4] == 0.15 and not any(t["wall_s"]["disk"])
    # everything else is what it was without the series
    assert {k: v for k, v in t.items() if k != "wall_s"} == without["targets"][0]
    assert {k: v for k, v in tl.items() if k != "targets"} == {k: v for k, v in without.items() if k != "targets"}

    out = qprof("report", str(run), "--timeline").stdout
    assert "wall clock: share of its threads' time per state (waits probes)" in out
    header = next(ln for ln in out.splitlines() if ln.startswith("t (s)"))
    cols = [c.strip() for c in re.split(r"[┃│]", header)]
    assert cols[-6:] == ["on CPU", "runnable", "network", "timer", "thread", "other"]  # no disk: none
    rows = {ln.split("│")[0].strip(): [c.strip() for c in ln.split("│")[-6:]]
            for ln in out.splitlines() if re.match(r"^\s+0\.[0-5]\s", ln)}
    assert rows["0.0"] == ["50%", "", "", "50%", "", ""]
    assert rows["0.2"] == ["", "10%", "90%", "", "", ""]
    assert rows["0.3"] == ["", "", "", "", "100%", ""] and rows["0.4"] == ["", "", "", "", "", "100%"]
    assert rows["0.5"] == [""] * 6  # no time in the series there
    # without the series again: the text as it was
    (run / file_name()).unlink()
    assert qprof("report", str(run), "--timeline").stdout == text_without


def test_unaligned_runs_and_other_pids_get_no_wall_clock(run: Path) -> None:
    _write(run / file_name(), _series(WALL, pid=8))  # another process's series only
    assert "wall_s" not in _json_timeline(run)["targets"][0]
    _write(run / file_name(), _series(WALL))
    with edited_meta(run) as meta:
        meta.sampling.clock = None  # no common clock: the series cannot be placed
    tl = _json_timeline(run)
    assert not tl["aligned"] and "wall_s" not in tl["targets"][0]


def test_long_runs_merged_bins_sum_the_series(run: Path) -> None:
    """A long run's folded bins are merged (the stacks header's bin_grain): the series' bins are merged alike."""
    write_stacks(run / runfiles.STACKS, fold([Sample(7, 7, "srv", MS, SEND, FIRST + b) for b in (0, 1)
                                              for _ in range(100)]), header={"bin_grain": 2})
    _write(run / file_name(), _series(WALL))
    tl = _json_timeline(run)
    (t,) = tl["targets"]
    assert tl["bin_s"] == pytest.approx(2 * BIN_S) and tl["bins"] == 3
    assert t["wall_s"]["on_cpu"] == [0.2, 0.0, 0.0] and t["wall_s"]["timer"] == [0.2, 0.0, 0.0]
    assert t["wall_s"]["network"] == [0.0, 0.18, 0.0] and t["wall_s"]["thread"] == [0.0, 0.2, 0.0]
    assert t["wall_s"]["other"] == [0.0, 0.0, 0.15]


def test_html_page_draws_the_wall_clock_only_with_a_series(run: Path, tmp_path: Path) -> None:
    plain = tmp_path / "plain.html"
    qprof("flamegraph", str(run), "-o", str(plain))
    assert "tl-wall" not in plain.read_text()
    _write(run / file_name(), _series(WALL))
    page = tmp_path / "wall.html"
    qprof("flamegraph", str(run), "-o", str(page))
    text = page.read_text()
    assert "tl-wall" in text and '"wall_s"' in text
    # the page without the series is the page with it less the wall clock's data and script
    assert len(text) > len(plain.read_text())
    if shutil.which("chromium") is None:
        pytest.skip("chromium missing (make test installs it): the page's drawing is not checked")
    from test_flamegraph_real import browse

    dom = browse(page.as_uri(), tmp_path)
    walls = re.findall(r'<svg class="tl-wall" data-pid="7".*?</svg>', dom, re.S)
    assert len(walls) == 1
    areas = dict(re.findall(r'<path class="tl-wall-area" data-state="(\w+)" fill="[^"]*" d="([^"]*)"', walls[0]))
    assert list(areas) == list(STATES)
    # each area's thickness (its top edge against its bottom edge, drawn back): the states with time have one
    for state in STATES:
        pts = [(float(x), float(y)) for x, y in re.findall(r"[ML]([\d.e+-]+),([\d.e+-]+)", areas[state])]
        top, bottom = pts[:len(pts) // 2], pts[len(pts) // 2:][::-1]
        thick = max(abs(a[1] - b[1]) for a, b in zip(top, bottom))
        assert (thick > 1) == any(d.get(state) for d in WALL.values()), (state, thick)
    assert dom.index('class="tl-chart"') < dom.index('class="tl-wall"'), "under the CPU chart"


# -- the real kernel

PHASES = r"""
import socket, sys, time
marks = open(sys.argv[1], "w", buffering=1)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("127.0.0.1", 0))
def mark(name):
    marks.write(f"{name} {time.monotonic_ns()} {s.getsockname()[1]}\n")
mark("timer")
time.sleep(1.0)
mark("on_cpu")
end = time.monotonic() + 1.0
while time.monotonic() < end:
    pass
mark("network")
s.recvfrom(100)
mark("end")
"""


def _marks(path: Path) -> dict[str, tuple[int, int]]:
    try:
        return {name: (int(t), int(port)) for name, t, port in (ln.split() for ln in path.read_text().splitlines())}
    except (OSError, ValueError):
        return {}


@pytest.mark.root
def test_attach_shows_timer_then_on_cpu_then_network(kernel_facing: None, tmp_path: Path) -> None:
    from qprof.probes import libbpf

    if not libbpf.VMLINUX_BTF.exists() or shutil.which("clang") is None or shutil.which("bpftool") is None:
        pytest.skip("the waits probes need the kernel's BTF, clang and bpftool (make test installs them)")
    script, marks = tmp_path / "phases.py", tmp_path / "marks"
    script.write_text(PHASES)
    run = tmp_path / "run"
    done = threading.Event()

    def feeder() -> None:
        """One datagram 1 s after the program blocks in recvfrom (sent from this process: not a target)."""
        while not done.is_set():
            got = _marks(marks)
            if "network" in got:
                t, port = got["network"]
                time.sleep(max(0.0, (t + 1_000_000_000 - time.monotonic_ns()) / 1e9))
                with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                    s.sendto(b"x", ("127.0.0.1", port))
                return
            time.sleep(0.01)

    feed = threading.Thread(target=feeder, daemon=True)
    feed.start()
    try:
        attach_held([sys.executable, str(script), str(marks)], run, duration=10.0)
    finally:
        done.set()
        feed.join(5)
    got = _marks(marks)
    assert list(got) == ["timer", "on_cpu", "network", "end"], got
    series = WaitSeries.read(run / file_name())
    assert series is not None and series.damaged == 0 and series.lines >= 25, series
    probes = json.loads((run / runfiles.PROBES).read_text())
    assert probes["programs"]["waits"]["series"] == file_name()

    tl = _json_timeline(run)
    assert tl["aligned"] and tl["bin_s"] == BIN_S
    (t,) = [x for x in tl["targets"] if "wall_s" in x]
    wall = t["wall_s"]
    first = int(json.loads((run / runfiles.PROC).read_text().splitlines()[0])["mono"] / BIN_S)

    def bin_of(ns: int) -> int:
        return ns // BIN_NS - first

    edges = [bin_of(got[n][0]) for n in ("timer", "on_cpu", "network", "end")]
    print(f"\nphase bins {edges}, {series.lines} series lines, loader series CPU "
          f"{probes['programs']['waits']['maps']['@wait_stats'].get('series_cpu_s')} s")
    for (phase, lo, hi) in zip(("timer", "on_cpu", "network"), edges, edges[1:]):
        bins = range(lo + 2, hi - 1)  # 2 bins in from each edge
        assert len(bins) >= 5, (phase, lo, hi)
        ran = 0.0
        for b in bins:
            secs = {s: wall[s][b] for s in STATES}
            total = sum(secs.values())
            shares = {s: round(v / total, 3) for s, v in secs.items() if v} if total else {}
            print(f"  {phase:8s} bin {b}: {shares}; perf {sum(t['cpu_cores'][c][b] for c in t['cpu_cores']):.2f} cores")
            # one thread, alive the whole bin: its states add up to the bin (the loader keeps bins to their length)
            assert abs(total - BIN_S) <= 0.01 * BIN_S, (phase, b, secs)
            dominant = max(secs, key=secs.__getitem__)
            # the perf samples' CPU in the bin (the same clock, other bins' edges: the cross-check of both)
            cpu = sum(t["cpu_cores"][c][b] for c in t["cpu_cores"]) * BIN_S
            assert abs(cpu - secs["on_cpu"]) <= 0.15 * BIN_S, (phase, b, cpu, secs)
            if phase == "on_cpu":
                # spinning: on a CPU, or on a loaded host waiting for one (preempted: runnable, the host's
                # doing), never waiting for anything else
                assert dominant in ("on_cpu", "runnable") and secs["on_cpu"] + secs["runnable"] >= 0.9 * total, \
                    (b, shares)
                ran += secs["on_cpu"]
            else:
                assert dominant == phase and secs[phase] >= 0.9 * total, (b, shares)
        if phase == "on_cpu":  # and it did run: on an idle host, all of it (2 CPUs at load 8: a quarter)
            assert ran >= 0.2 * len(bins) * BIN_S, ran
