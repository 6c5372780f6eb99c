"""The sampling windows and their estimator, as pure logic: window lengths, the statistics kept,
exactness when every period is counted whole, and the coverage of the 95% intervals on simulated
traffic (the real-kernel counterpart is tests/test_probes.py::test_sampled_counts_hold_the_truth)."""

from __future__ import annotations

import math
import os
import socket

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from conftest import examples
from qprof.attribution.packetio import apportion
from qprof.probes.packetio.estimate import MIN_SEEN, Estimate, GroupSample, t975
from qprof.probes.packetio import windows
from qprof.probes.packetio.sampler import NetnsCounters
from qprof.archive import schema
from qprof.probes.packetio.maps import PacketioMaps, Windows, kernel_counters_for

SERIES = ("tx_msgs", "tx_bytes")


def test_window_is_the_whole_period_while_the_hooks_fit_the_budget() -> None:
    budget = windows.CPU_BUDGET / windows.EVENT_COST_S
    last = windows.PERIOD_S / 2  # a window GROWTH would let grow past the period
    assert windows.window_length(0, last) == windows.PERIOD_S
    assert windows.window_length(int(budget * last), last) == windows.PERIOD_S
    # ten times the budget's rate: a tenth of the period
    assert windows.window_length(int(budget * 10 * last), last) == pytest.approx(windows.PERIOD_S / 10, rel=1e-3)
    assert windows.window_length(10**12, last) == windows.MIN_WINDOW_S


def test_window_grows_at_most_fourfold() -> None:
    """A low rate seen in a short window (the first 20 ms, a handshake) opens a window four times as
    long, not the whole period: the transfer that follows meets the budget within two windows."""
    first = windows.START_PERIOD_S
    assert windows.window_length(10, first, 0.1) == pytest.approx(windows.GROWTH * first)
    assert windows.window_length(0, first, 0.1) == pytest.approx(windows.GROWTH * first)
    assert windows.window_length(10, windows.GROWTH * first, 0.1) == 0.1
    # a high rate still shortens it below the cap
    budget = windows.CPU_BUDGET / windows.EVENT_COST_S
    assert windows.window_length(int(budget * first * 10), first, 0.1) == pytest.approx(0.01, rel=1e-3)


def test_growing_windows_are_whole_periods_while_the_rate_fits() -> None:
    """The steps from the first 20 ms to a whole period are periods of their own, counted whole (the
    overrun check watches them); a window held short by the budget stays a part of its period."""
    first, budget = windows.START_PERIOD_S, windows.budget_rate()
    step = windows.GROWTH * first
    assert windows.next_window(10, first, first) == pytest.approx((step, step))
    assert windows.next_window(0, step, first + step) == (windows.FIRST_PERIOD_S, windows.FIRST_PERIOD_S)
    # over the budget: a part of the full period, whatever the growth cap
    assert windows.next_window(int(budget * first * 10), first, first) == \
        pytest.approx((windows.FIRST_PERIOD_S, windows.FIRST_PERIOD_S / 10), rel=1e-3)
    # a transfer ended: the window grows back in whole periods
    assert windows.next_window(0, 0.005, 30.0) == pytest.approx((0.02, 0.02))


@given(st.integers(0, 10**9), st.floats(0, 10), st.floats(0, 3600), st.floats(1, 1e7))
@settings(max_examples=examples(200))
def test_next_window_fits_its_period(events: int, counted_s: float, elapsed_s: float, budget: float) -> None:
    period, window = windows.next_window(events, counted_s, elapsed_s, budget)
    assert windows.MIN_WINDOW_S <= window <= period <= windows.PERIOD_S
    assert window == period or events > budget * counted_s, "sampled only over the budget"


@given(st.integers(0, 10**9), st.integers(0, 10**9))
@settings(max_examples=examples(200))
def test_window_never_grows_with_the_rate(a: int, b: int) -> None:
    lo, hi = sorted((a, b))
    assert windows.MIN_WINDOW_S <= windows.window_length(hi, 0.1) <= windows.window_length(lo, 0.1) <= windows.PERIOD_S


def test_budget_follows_the_targets_cpu() -> None:
    """Each target on a CPU of its own: the whole budget; half a CPU each (a busy host): half of it,
    so a target's probe share stays what it is on a quiet host; idle targets keep a floor."""
    assert windows.budget_scale(0.2, 0.1, 2) == 1.0
    assert windows.budget_scale(0.3, 0.1, 1) == 1.0  # a multi-threaded target: never over the budget
    assert windows.budget_scale(0.1, 0.1, 2) == pytest.approx(0.5)
    assert windows.budget_scale(0.0, 0.1, 2) == windows.MIN_BUDGET_SCALE
    assert windows.budget_scale(0.1, 0.0, 2) == 1.0 and windows.budget_scale(0.1, 0.1, 0) == 1.0
    # the same rate with half the budget: a window half as long
    rate_events = int(windows.CPU_BUDGET / windows.EVENT_COST_S * 2 * 0.2)
    full = windows.window_length(rate_events, 0.2)
    half = windows.window_length(rate_events, 0.2, windows.PERIOD_S,
                                 windows.CPU_BUDGET * 0.5 / windows.EVENT_COST_S)
    assert half == pytest.approx(full / 2)


@given(st.floats(allow_nan=True, allow_infinity=True), st.floats(allow_nan=True, allow_infinity=True),
       st.integers(-3, 64))
@settings(max_examples=examples(300))
def test_budget_scale_stays_within_its_bounds(cpu: float, elapsed: float, n: int) -> None:
    assert windows.MIN_BUDGET_SCALE <= windows.budget_scale(cpu, elapsed, n) <= 1.0


def test_periods_start_short_and_grow() -> None:
    assert windows.period_length(0) == windows.FIRST_PERIOD_S
    assert windows.period_length(3.5) == pytest.approx(0.35)
    assert windows.period_length(3600) == windows.PERIOD_S
    # a 2 s transfer still gets the windows a variance estimate needs (probes.packetio.estimate.MIN_SEEN)
    t, n = 0.0, 0
    while t < 2.0:
        t += windows.period_length(t)
        n += 1
    assert n >= 2 * MIN_SEEN


def test_a_whole_period_ends_when_the_hooks_overrun_the_budget() -> None:
    """A transfer starting in a whole-period window is cut off at the next check, not counted to the
    period's end; a rate within the budget, or a short burst, is not."""
    budget = windows.CPU_BUDGET / windows.EVENT_COST_S
    assert not windows.overran(0, windows.CHECK_S, budget)
    assert not windows.overran(int(budget * windows.CHECK_S), windows.CHECK_S, budget)
    assert not windows.overran(int(budget * windows.CHECK_S), 0.0, budget)
    # a 1 GiB ngtcp2 transfer's ~900k hook runs a second, one check into the window
    assert windows.overran(int(900e3 * windows.CHECK_S), windows.CHECK_S, budget)
    # a handshake's few dozen runs in the first check do not end a period, nor does a burst worth
    # BURST_S of the whole budget from targets idle until then (the lowest budget scale): the plain
    # sender's 3000 sends of test_probes, two hook runs each
    assert not windows.overran(50, windows.CHECK_S, budget)
    low = windows.budget_rate(windows.MIN_BUDGET_SCALE)
    burst = int(windows.OVERRUN * budget * windows.BURST_S)
    assert not windows.overran(burst, windows.CHECK_S, low) and windows.overran(burst + 1, windows.CHECK_S, low)
    assert not windows.overran(2 * 3000, windows.CHECK_S, low)


def test_checks_slow_down_while_the_hooks_are_quiet_and_not_while_they_run() -> None:
    budget = windows.budget_rate()
    wait, waits = windows.CHECK_S, []
    for _ in range(5):  # idle targets: a few hook runs of other tasks
        wait = windows.next_check(wait, 3, wait, budget)
        waits.append(wait)
    assert waits == sorted(waits) and waits[-1] == windows.CHECK_IDLE_S and waits[0] == 2 * windows.CHECK_S
    # a transfer starts: the next check is CHECK_S away, and stays so while it runs
    assert windows.next_check(windows.CHECK_IDLE_S, int(900e3 * windows.CHECK_IDLE_S), windows.CHECK_IDLE_S,
                              budget) == windows.CHECK_S
    assert windows.next_check(windows.CHECK_S, int(budget * windows.CHECK_S), windows.CHECK_S, budget) == windows.CHECK_S
    # however late a quiet check wakes, the next is no further than CHECK_IDLE_S
    assert windows.next_check(1.0, 0, 1.0, budget) == windows.CHECK_IDLE_S
    # the latest a transfer of ~900k hook runs a second is seen costs what a quiet spell allows: ~11 ms
    assert 900e3 * windows.CHECK_IDLE_S * windows.EVENT_COST_S <= 0.012


@given(st.floats(0, 10), st.integers(0, 10**9), st.floats(0, 10), st.floats(1, 1e7))
@settings(max_examples=examples(200))
def test_a_check_is_never_nearer_than_check_s_nor_further_than_check_idle_s(wait: float, runs: int, over: float,
                                                                          budget: float) -> None:
    assert windows.CHECK_S <= windows.next_check(wait, runs, over, budget) <= windows.CHECK_IDLE_S


@given(st.integers(0, 10**9), st.floats(0, 10), st.floats(1, 1e7))
@settings(max_examples=examples(200))
def test_overrun_is_monotone_in_the_runs(events: int, counted_s: float, budget: float) -> None:
    if windows.overran(events, counted_s, budget):
        assert windows.overran(events + 1, counted_s, budget)
        assert events > budget * counted_s  # never below the budget's own rate


def test_triangle_index_covers_the_matrix_once() -> None:
    n = 7
    seen = sorted(windows.tri_index(i, j, n) for i in range(n) for j in range(i, n))
    assert seen == list(range(n * (n + 1) // 2))


def _sample(stats: windows.WindowStats, key: str, totals: dict[str, float], expansion: float = 0.0) -> GroupSample:
    g = stats.groups[key]
    return GroupSample(stats.series, g.sum, g.counted, g.seen, g.q, stats.periods, stats.full_periods,
                       {"tx_msgs": "mib_out", "tx_bytes": "mib_out"}, totals, expansion)


def test_whole_periods_are_exact() -> None:
    stats = windows.WindowStats(SERIES)
    truth = 0
    for k in range(20):
        y = [10 + k, 1200 * (10 + k)]
        truth += y[0]
        stats.add_window(0.2, 0.2, {"1": ("ns", y)}, {"ns": (0.0, float(y[0] + 3), 0.0)})
    est = _sample(stats, "1", {"mib_out": float(truth + 60)}).total("tx_msgs")
    assert est.exact and est.value == truth and est.holds(truth) and not est.holds(truth + 1)


def test_a_process_never_seen_in_a_window_gets_only_what_is_certain() -> None:
    stats = windows.WindowStats(SERIES)
    for _ in range(30):
        stats.add_window(0.2, 0.01, {"1": ("ns", [0, 0])}, {"ns": (0.0, 50.0, 0.0)})
    s = _sample(stats, "1", {"mib_out": 30000.0})
    est = s.estimate(lambda t: t["tx_msgs"], floor=0.0, ceiling=30000.0)
    assert est is not None and not est.exact and (est.low, est.high) == (0.0, 30000.0)
    assert est.holds(3000) and not est.holds(30001)


def _simulate(rng: np.random.Generator, other_share: float, periods: int = 40, bins_per_period: int = 200,
              duty: float = 0.05, whole: str = "") -> tuple[int, GroupSample, float]:
    """A target's messages and another process's in 1 ms bins, a rate that drifts and bursts; one
    window per period at a uniform random place, as the sampler draws them; `whole`: which periods are
    counted whole, as a pattern repeated over them ("ws": every other one). Returns (truth, sample,
    namespace total)."""
    n = periods * bins_per_period
    rate = 40 * np.exp(np.cumsum(rng.normal(0, 0.02, n)))  # slow drift
    rate *= np.where(rng.random(n) < 0.01, 5.0, 1.0)  # bursts
    target = rng.poisson(rate)
    other = rng.poisson(rate * other_share / max(1e-9, 1 - other_share)) if other_share else np.zeros(n, int)
    stats = windows.WindowStats(SERIES)
    sampled = max(1, int(bins_per_period * duty))
    for k in range(periods):
        w = bins_per_period if whole and whole[k % len(whole)] == "w" else sampled
        start = k * bins_per_period + int(rng.integers(0, bins_per_period - w + 1))
        y = int(target[start:start + w].sum())
        x = float(y + other[start:start + w].sum())
        stats.add_window(bins_per_period, w, {"1": ("ns", [y, 1200 * y])}, {"ns": (0.0, x, 0.0)})
    total = float(target.sum() + other.sum())
    return int(target.sum()), _sample(stats, "1", {"mib_out": total}), total


def _coverage(rng: np.random.Generator, other_share: float, whole: str = "", runs: int = 400
              ) -> tuple[int, list[float]]:
    """Of `runs` simulated runs (_simulate), how many tx_msgs intervals held the truth, and each
    interval's relative half-width."""
    held, widths = 0, []
    for _ in range(runs):
        truth, sample, _ = _simulate(rng, other_share, whole=whole)
        est = sample.total("tx_msgs")
        held += est.holds(truth)
        widths.append(est.relative_half_width() or 0.0)
    return held, widths


@pytest.mark.parametrize("other_share", [0.2, 0.5, 0.9])
def test_intervals_hold_the_truth_95_percent_of_the_time(other_share: float) -> None:
    """Coverage over 400 simulated runs: the 95% intervals hold the truth in 90-99.5% of them. A
    binomial 95% has sd 1.1 pp at n=400; bursty traffic and a variance estimated from 40 periods
    (fewer effective degrees of freedom than the t quantile assumes) hold it ~92-93% here, with the
    estimated sd matching the true one in rms. Seeded: the same runs every time."""
    held, widths = _coverage(np.random.default_rng(20261123), other_share)
    print(f"other traffic {other_share:.0%}: {held}/400 held, median half-width {np.median(widths):.2%}")
    assert 0.90 <= held / 400 <= 0.995


@pytest.mark.parametrize("whole", ["ws", "wws"])
def test_intervals_hold_the_truth_when_whole_and_sampled_periods_alternate(whole: str) -> None:
    """The sampler counts a period whole whenever the hooks' rate fits the budget, so a rate near it
    alternates whole and sampled periods. A sampled period beside a whole one is all the variance of
    their difference; weighing that pair by the mean of the two periods' unsampled shares gave each
    sampled period half its variance: 84% and 85% of the intervals held the truth (other traffic 90%),
    95.5% and 98% with the larger weight. Seeded: the same runs every time."""
    held, _ = _coverage(np.random.default_rng(20261129), 0.9, whole)
    print(f"periods {whole!r}: {held}/400 held")
    assert 0.90 <= held / 400 <= 0.995


def test_a_target_alone_in_its_namespace_is_counted_by_the_kernel() -> None:
    """Its messages are its namespace's: the regression on the kernel's exact total recovers it."""
    rng = np.random.default_rng(7)
    for _ in range(20):
        truth, sample, total = _simulate(rng, 0.0)
        est = sample.total("tx_msgs")
        assert est.value == pytest.approx(truth) and est.holds(truth) and (est.relative_half_width() or 0) < 1e-6


def test_the_kernel_counter_narrows_the_interval_as_the_target_dominates() -> None:
    rng = np.random.default_rng(7)
    mostly = np.median([_simulate(rng, 0.2)[1].total("tx_msgs").relative_half_width() for _ in range(50)])
    crowded = np.median([_simulate(rng, 0.9)[1].total("tx_msgs").relative_half_width() for _ in range(50)])
    assert mostly < crowded * 0.75


def test_ratio_of_totals_gets_an_interval_from_the_delta_method() -> None:
    rng = np.random.default_rng(11)
    truth, sample, _ = _simulate(rng, 0.5)
    est = sample.estimate(lambda t: t["tx_bytes"] / t["tx_msgs"] if t["tx_msgs"] else None)
    assert est is not None and est.value == pytest.approx(1200) and est.low is not None and est.high is not None
    assert est.low <= 1200 <= est.high


def _perturbed_loopback(rng: np.random.Generator, periods: int = 40, bins: int = 200,
                        duty: float = 0.1) -> tuple[dict[str, int], windows.WindowStats, dict[str, float]]:
    """A GSO sender and its receiver's ACKs on one loopback, in 1 ms bins, with what the per-packet
    programs do to it while they count: inside a window the sender runs 15% slower and its GSO
    batches shrink from 14 to 11 segments (what real windows showed: UDP InDatagrams/OutDatagrams
    6-20% lower inside them than outside). Returns the sender's true totals, its window statistics
    and the namespace's kernel totals."""
    rate = 300 * np.exp(np.cumsum(rng.normal(0, 0.02, periods * bins)))  # segments per bin, drifting
    w = int(bins * duty)
    starts = [k * bins + int(rng.integers(0, bins - w + 1)) for k in range(periods)]
    inside = np.zeros(periods * bins, bool)
    for s in starts:
        inside[s:s + w] = True
    segs = rng.poisson(np.where(inside, rate * 0.85, rate))
    skbs = np.ceil(segs / np.where(inside, 11, 14)).astype(int)
    acks = rng.poisson(segs / 10)
    per_bin = {"tx_skbs": skbs, "tx_bytes": segs * 1200, "tx_dgrams": segs}
    kernel = {"mib_in": segs + acks, "mib_out": skbs + acks, "ip_out_octets": segs * 1200 + skbs * 28 + acks * 78}
    stats = windows.WindowStats(tuple(per_bin))
    for s in starts:
        stats.add_window(bins, w, {"1": ("ns", [int(v[s:s + w].sum()) for v in per_bin.values()])},
                         {"ns": tuple(float(kernel[a][s:s + w].sum()) for a in windows.AUX)})
    return ({k: int(v.sum()) for k, v in per_bin.items()}, stats, {k: float(v.sum()) for k, v in kernel.items()})


def test_sent_bytes_and_datagrams_scale_to_ip_octets_when_the_probes_change_the_batching() -> None:
    """A datagram's bytes do not change with the batching the probes disturb: scaled to the namespace's
    IP OutOctets the sender's bytes and segments are within 0.2% of the truth in every run (what
    moves them at all is its peer's 78-byte ACKs and one 28-byte header per batch in the octets); scaled
    to UDP OutDatagrams (one per GSO batch, plus the ACKs), as archives without OutOctets are,
    its bytes come out ~10% low. Its sends (skbs) have only OutDatagrams, whose mix of its batches and
    its peer's ACKs the probes change: they come out ~12% high here, the limit README states."""
    rng = np.random.default_rng(20261124)
    worst, best_on_skbs, skbs_err = 0.0, math.inf, []
    for _ in range(50):
        truth, stats, kernel = _perturbed_loopback(rng)
        g = stats.groups["1"]
        aux_of = {"tx_skbs": "mib_out", "tx_bytes": "mib_out", "tx_dgrams": "mib_out"}
        scaled = GroupSample(stats.series, g.sum, g.counted, g.seen, g.q, stats.periods, stats.full_periods,
                             aux_of, kernel, 0.0, {n: kernel_counters_for(n) for n in aux_of})
        worst = max(worst, *(abs(scaled.total(n).value / truth[n] - 1) for n in ("tx_bytes", "tx_dgrams")))
        skbs_err.append(scaled.total("tx_skbs").value / truth["tx_skbs"] - 1)
        on_skbs = GroupSample(stats.series, g.sum, g.counted, g.seen, g.q, stats.periods, stats.full_periods,
                              aux_of, {"mib_out": kernel["mib_out"]}, 0.0).total("tx_bytes")
        best_on_skbs = min(best_on_skbs, abs(on_skbs.value / truth["tx_bytes"] - 1))
    print(f"bytes, segments scaled to OutOctets: worst error {worst:.3%}; bytes scaled to "
          f"OutDatagrams: best {best_on_skbs:.1%}; sends: median {np.median(skbs_err):+.1%}")
    assert worst <= 0.002 and best_on_skbs >= 0.05


def test_edge_term_widens_every_sampled_interval() -> None:
    rng = np.random.default_rng(3)
    _, sample, _ = _simulate(rng, 0.0)
    plain = sample.total("tx_msgs")
    edged = GroupSample(sample.series, sample.sum, sample.counted, sample.seen, sample.q, sample.periods,
                        sample.full_periods, sample.aux_of, sample.aux_total, expansion=800.0).total("tx_msgs")
    assert edged.value == plain.value and edged.high - plain.high == pytest.approx(800.0, rel=0.01)


def test_t_quantiles() -> None:
    assert t975(1) == pytest.approx(12.706) and t975(10) == pytest.approx(2.228) and t975(1000) == 1.96
    assert all(t975(d) > t975(d + 1) for d in range(1, 30))


def test_estimate_json_shapes() -> None:
    assert Estimate.of(3.0).interval() == [3.0, 3.0]
    assert Estimate(3.0, 1.0, None, False).interval() == [1.0, None]
    assert Estimate(3.0, None, None, False).interval() is None and not Estimate(3.0, None, None, False).holds(3.0)
    assert math.isclose(Estimate(10.0, 9.0, 11.0, False).relative_half_width() or 0, 0.1)


JSONISH = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
                       lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
                       max_leaves=20)


@given(st.dictionaries(st.sampled_from(["series", "periods", "full_periods", "groups", "netns", "events", "budget",
                                        "span_s", "counted_s", "expansion", "x"]), JSONISH))
@settings(max_examples=examples(300), deadline=None)  # its first example may import what the readers import lazily
@example(obj={"series": [], "periods": None, "full_periods": None, "events": {"": math.inf}})  # fresh-clone run184
def test_damaged_windows_never_raise(obj: dict) -> None:
    """Damaged windows read as the archive reads them (a map of the wrong shape is left out, `@windows`
    of the sampler's shape is decoded) and as a live view holds them (raw): never an exception."""
    raw = {"@windows": obj, "@udp_drops": obj, "@ports": obj, "@tx_gso_segs": obj}
    maps = schema.probe_maps(raw)
    assert schema.conforms(obj, schema.shape_of(Windows)) == isinstance(maps.get("@windows"), Windows)
    for m in (maps, raw):
        w = PacketioMaps.from_maps(m).windows
        assert w is None or all(g.fits(len(w.series)) for g in w.groups.values())


def test_namespace_counters_move_with_one_datagram() -> None:
    """The counters the windows are scaled to, read as the sampler reads them: one 1000-byte UDP
    datagram over loopback raises OutDatagrams and InDatagrams by at least one (other processes may
    send too) and OutOctets by at least its bytes plus the IP and UDP headers."""
    counters = NetnsCounters(os.getpid())
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as rx, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx:
        rx.bind(("127.0.0.1", 0))
        before = counters.read()
        tx.sendto(b"x" * 1000, rx.getsockname())
        assert len(rx.recv(2000)) == 1000
        after = counters.read()
    d = dict(zip(windows.AUX, (b - a for a, b in zip(before, after))))
    assert d["mib_out"] >= 1 and d["mib_in"] >= 1 and d["ip_out_octets"] >= 1028, d


@settings(max_examples=examples(300), deadline=None)
@given(st.integers(-10**9, 10**9), st.dictionaries(st.integers(0, 64), st.floats(0, 1e9), max_size=8))
def test_a_process_estimate_shared_among_its_threads_adds_up(total: int, seen: dict[int, float]) -> None:
    """Each thread's packet figures are its share of its process's estimate, in whole counts: summed over
    the threads they are the process's figure exactly (rows, the thread table), never off by rounding
    or by a thread first seen in a later window."""
    parts = apportion(total, seen)
    assert set(parts) == set(seen)
    if any(v > 0 for v in seen.values()):
        assert sum(parts.values()) == total
        assert all(p == 0 for t, p in parts.items() if seen[t] <= 0)
    else:
        assert all(p == 0 for p in parts.values())
