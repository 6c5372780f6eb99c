"""The round trip read from datagram timing (attribution.rtt) and the timing file it reads (probes.packetio.timing).

Synthetic endpoints with a known delay: an ACK-clocked sender over a path (its receives are its sends
delayed by the round trip, its sends follow its receives), a paced sender on a short path (its timer
period must not be read as the round trip), and unrelated traffic (no round trip claimed). The real
one, against each stack's qlog over the lab's path, is in test_verdict_scenarios.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from qprof.attribution.rtt import round_trip
from qprof.probes.packetio.timing import Drainer, Stretch, TimingFile

BIN_S = (1 << 17) / 1e9


def clocked(rtt_bins: int, n: int, seed: int, jitter: int = 3) -> Stretch:
    """A window-limited sender: every receive (an ACK) releases sends at once; each send comes back
    as a receive one round trip (+ jitter) later; losses and cwnd changes make bursts uneven."""
    rng = random.Random(seed)
    send, recv = [0] * n, [0] * n
    for t in range(0, min(n, rtt_bins), 3):  # the first flight
        send[t] += rng.randint(1, 4)
    for t in range(n):
        if recv[t]:  # acknowledgements clock out more data, a little more or less than they freed
            send[t] += max(0, recv[t] + rng.choice((-1, 0, 0, 1)))
        if send[t]:
            back = t + rtt_bins + rng.randint(-jitter, jitter)
            if back >= n:
                continue
            if rng.random() > 0.01:
                recv[back] += send[t]
            else:  # lost: sent again when its loss is noticed, a round trip on
                send[back] += send[t]
    return Stretch(0, send, recv)


def paced(period_bins: int, delay_bins: int, n: int, seed: int) -> Stretch:
    """A sender paced by its timer: a burst every period, each acknowledged `delay_bins` later."""
    rng = random.Random(seed)
    send, recv = [0] * n, [0] * n
    for t in range(0, n, period_bins):
        t2 = min(n - 1, t + rng.randint(0, 1))
        send[t2] += rng.randint(3, 6)
        if t2 + delay_bins < n:
            recv[t2 + delay_bins] += send[t2] // 2 + rng.randint(0, 1)
    return Stretch(0, send, recv)


@pytest.mark.parametrize("rtt_ms", [1, 10, 30, 50, 150])
def test_clocked_sender_reads_its_round_trip(rtt_ms: float) -> None:
    bins = round(rtt_ms * 1e-3 / BIN_S)
    rt = round_trip([clocked(bins, 40_000, seed=rtt_ms, jitter=max(1, min(3, bins // 10)))], BIN_S)
    assert rt is not None
    # within the jitter, and never more than 5% off (the verdict's test asks 20% of the stack's own RTT)
    assert abs(rt.ms - bins * BIN_S * 1e3) <= max(0.05 * bins, 4) * BIN_S * 1e3, rt


def test_paced_timer_is_not_the_round_trip() -> None:
    # a 2 ms pacing period on a 0.26 ms path: the plain correlation peaks at every period
    rt = round_trip([paced(period_bins=15, delay_bins=2, n=40_000, seed=1)], BIN_S)
    assert rt is not None and abs(rt.ms - 2 * BIN_S * 1e3) <= BIN_S * 1e3, rt


def test_unrelated_traffic_claims_nothing() -> None:
    rng = random.Random(7)
    s = Stretch(0, [rng.randint(0, 3) for _ in range(30_000)], [rng.randint(0, 3) for _ in range(30_000)])
    assert round_trip([s], BIN_S) is None


def test_short_or_empty_stretches_claim_nothing() -> None:
    assert round_trip([], BIN_S) is None
    assert round_trip([Stretch(0, [1] * 100, [1] * 100)], BIN_S) is None
    assert round_trip([Stretch(0, [0] * 5000, [0] * 5000)], BIN_S) is None


def echoed(rtt_bins: int, n: int, seed: int) -> Stretch:
    """Bursts at random times, each acknowledged a round trip (+- 2 bins) later."""
    rng = random.Random(seed)
    send, recv = [0] * n, [0] * n
    for t in range(n):
        if rng.random() < 0.05:
            send[t] = rng.randint(1, 8)
            back = t + rtt_bins + rng.randint(-2, 2)
            if back < n:
                recv[back] += send[t]
    return Stretch(0, send, recv)


def test_windows_pool_into_one_estimate() -> None:
    # sampled windows of ~60 ms (460 bins) of a 10 ms path: pairs across a window's edge are lost,
    # the windows' correlations add up
    whole = echoed(76, 46_000, seed=3)
    pieces = [Stretch(i, whole.send[i:i + 460], whole.recv[i:i + 460]) for i in range(0, 46_000, 1000)]
    rt = round_trip(pieces, BIN_S)
    assert rt is not None and abs(rt.ms - 76 * BIN_S * 1e3) <= 2 * BIN_S * 1e3, rt


class Ring:
    """The programs' ring as the loader sees it: bins of two targets, two directions."""

    def __init__(self, bins: int) -> None:
        self.bins = bins
        self.n = [[[0] * bins for _ in range(2)] for _ in range(2)]

    def add(self, t: int, d: int, bin_no: int, k: int = 1) -> None:
        self.n[t][d][bin_no % self.bins] += k

    def take(self, t: int, d: int, i: int, j: int) -> list[int]:
        out = self.n[t][d][i:j]
        self.n[t][d][i:j] = [0] * (j - i)
        return out


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1), st.integers(0, 1), st.integers(0, 3000), st.integers(1, 5)),
                max_size=200),
       st.integers(3, 7))  # spans of at most 1001 bins: the loader drains before the ring goes round
def test_drained_bins_read_back_as_written(tmp_path_factory: pytest.TempPathFactory,
                                           events: list[tuple[int, int, int, int]], drains: int) -> None:
    path = tmp_path_factory.mktemp("timing") / "t.jsonl"
    shift, bins, base = 17, 1024, 5_000_000
    ring = Ring(bins)
    d = Drainer(path, [101, 202], shift, bins, ring.take)
    d.open()
    d.start(base << shift)
    want = {0: [[0] * 3001, [0] * 3001], 1: [[0] * 3001, [0] * 3001]}
    edges = sorted({0, 3001, *[3001 * k // drains for k in range(1, drains)]})
    for lo, hi in zip(edges, edges[1:]):  # events of each span, then a drain at its end (< the ring's length)
        for t, dirn, b, k in events:
            if lo <= b < hi:
                ring.add(t, dirn, base + b, k)
                want[t][dirn][b] += k
        d.drain((base + hi) << shift)
    d.stop((base + 3001) << shift)
    d.close()
    got = TimingFile.read(path)
    assert got is not None and got.damaged_lines == 0 and got.pids == [101, 202]
    for t, pid in enumerate((101, 202)):
        st_ = got.stretches.get(pid, [])
        if not any(want[t][0]) and not any(want[t][1]):
            continue
        assert len(st_) == 1 and st_[0].start_bin == base
        send, recv = list(st_[0].send), list(st_[0].recv)
        assert send[:3001] == want[t][0] and recv[:3001] == want[t][1]
        assert not any(send[3001:]) and not any(recv[3001:])


def test_damaged_lines_are_skipped_and_counted(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    lines = [{"shift": 17, "pids": [5]}, {"on": 100},
             {"pid": 5, "t": 100, "n": 4, "s": [0, 2, 1, 3], "r": [1, 1]},
             {"pid": 5, "t": 104, "n": 2, "s": [9, 1], "r": []},  # a bin outside its line
             {"pid": 5, "t": 90, "n": 2, "s": [], "r": []}]  # before its counting began
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n{\"pid\": 5, \"t\": 1\n" + json.dumps({"off": 108}) + "\n")
    got = TimingFile.read(path)
    assert got is not None and got.damaged_lines == 3
    (s,) = got.stretches[5]
    assert list(s.send) == [2, 0, 3, 0, 0, 0, 0, 0] and list(s.recv) == [0, 1, 0, 0, 0, 0, 0, 0]


def test_no_file_or_no_header_is_no_timing(tmp_path: Path) -> None:
    assert TimingFile.read(tmp_path / "absent.jsonl") is None
    (tmp_path / "bad.jsonl").write_text("not json\n")
    assert TimingFile.read(tmp_path / "bad.jsonl") is None
