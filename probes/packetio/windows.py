"""Sampling windows for the per-packet programs: how long each one is, and what is kept of it.

Time is cut into periods (PERIOD_S). In each period the per-packet programs are
counting during one window of length w placed at random in the period; w comes
from the hook rate seen in the previous window so that the hooks' expected cost
stays within a CPU budget. When the whole period fits the budget the window is
the period: low-rate runs are counted exactly, high-rate ones sampled.

Per window and per group (a process, or one thread of it) the counts y are
kept as the window's expansion z = y / pi, pi = w / P (a stratified sample with
one window per period: z estimates the period's total). What the estimator
needs later (probes.packetio.estimate) is accumulated here, not the windows:
  sum  = sum of z           (Horvitz-Thompson total of each series)
  counted = sum of y        (what was actually counted: a hard lower bound)
  seen = windows with y > 0 (a series seen in few windows has no usable variance estimate)
  q    = sum of h_k (z_k - z_{k-1})(z_k - z_{k-1})^T, h_k = 1 - min(pi_k, pi_{k-1})
         (successive differences: the variance of a stratified sample with one unit per
         stratum; h_k makes fully counted periods contribute no variance. A sampled period
         beside a whole one varies alone in their difference, so the pair weighs as two
         sampled ones would: with the mean of the two, 1 - (pi_k + pi_{k-1}) / 2, periods
         alternating whole and sampled got half their variance, and 84-85% of the 95%
         intervals held the truth in simulation; tests/test_sampling.py)
The series are the group's counters followed by the kernel's counters of its network
namespace read around the same window (UDP InDatagrams and OutDatagrams, IP OutOctets):
the relation of the two is what lets the estimator scale to the kernel's exact totals.
"""

from __future__ import annotations

from dataclasses import dataclass, field

FIRST_PERIOD_S = 0.2  # periods while a run is young: a run of 2 s gets ~10 windows, enough for a variance
PERIOD_S = 1.0  # ... growing to this from 2 s on (elapsed / 10): one window a second from 10 s on
# (0.5 s, two a second, had the loader at ~8 ms of CPU a second on a long quic-go transfer: each
# window's attach and detach, counter reads and sums; a long run's variance has periods enough)
# Each window costs the loader an attach and a detach of the four hooks (~1.5 ms of CPU here, with IPIs
# to every CPU as the kernel patches the tracepoints' static keys: they interrupt the targets too), so
# windows come no more often than the estimates need. (0.1 s first periods, ~19 windows in a 2 s
# transfer, had the loader at 1.6-2.8% of a CPU.) What a period costs the targets does not depend on
# its length: the window is the budget's share of it.
# The run's first period is short and counted whole: nothing is known of the rate yet. Attached to a
# running 1 GiB ngtcp2 transfer (~900k hook runs a second, all tasks), a whole period of FIRST_PERIOD_S
# would count ~180k runs (54 ms of CPU at EVENT_COST_S); START_PERIOD_S counts a tenth of that.
START_PERIOD_S = 0.02
# A window is at most GROWTH times the last one, so a low rate measured in a short window grows to a
# whole period in steps. While the rate fits the budget those steps are whole periods of their own
# (next_window), so the overrun check below watches them: `qprof demo`'s client starts ~0.1 s after
# the hooks, in the 0.08 s step after the first period. (As parts of a 0.2 s period they were counted
# to their end: up to 80 ms of the transfer at the full hook rate, 1.8% of the demo client's samples.)
GROWTH = 4.0
# Attaching and detaching the four hooks costs the loader ~1.5 ms of CPU here (and waits ~10 ms for
# RCU grace periods as the tracepoints' static keys flip): a window shorter than this measures little.
MIN_WINDOW_S = 0.002
# A whole-period window looks at the hook rate every CHECK_S (one map lookup, ~10 us): a transfer
# starting mid-period at OVERRUN times the budget's rate or more ends the period there, counted whole,
# instead of running unsampled to its end (~135 ms of hook CPU for a 0.5 s period of a 1 GiB
# ngtcp2 transfer; ~5 ms with these checks). A burst worth BURST_S of the whole budget (whatever
# budget_scale says) never ends a period, however short the time it came in: a handshake, or a few
# thousand datagrams from a target idle until then (2 x 0.2 s x 16.7k = 6.7k hook runs, ~2 ms of
# hook CPU), stay counted whole.
CHECK_S = 0.01
OVERRUN = 2.0
BURST_S = 0.2
# Each check costs the loader ~160 us of CPU here (a wake-up, a map lookup, Python): 100 a second were two
# thirds of its CPU beside idle targets (0.82 CPU s in a 30 s attach of two `sleep`s, 0.34 with checks every
# 50 ms). So a check whose hook runs came under QUIET of the budget's rate doubles the wait to the next, up to
# CHECK_IDLE_S; any more and checks are CHECK_S apart again. A transfer starting after a quiet spell is seen
# up to CHECK_IDLE_S late: ~36k hook runs of a 1 GiB ngtcp2 transfer (~11 ms of its CPU), once per start.
CHECK_IDLE_S = 0.04
QUIET = 0.1
# Hook runs the windows may cost, all tasks together: CPU_BUDGET of one CPU at EVENT_COST_S a run.
# EVENT_COST_S is what one hook run costs a target on qprof's 2-vCPU test VM as its own samples see it:
# in a fresh-clone `qprof demo` (1 GiB) the client's probe frames were 18 of 877 samples (36 ms) for
# ~115k hook runs in its windows, ~310 ns a run; counting four per-packet tracepoints with `perf stat`
# slowed the same transfer ~16% for 2.0 M runs per GiB, 250-450 ns a run. (`bench/probe_overhead.py
# --events` times dispatch and program alone, ~120 ns: too little, so at 120 ns the windows spent 2.5x
# their budget and the demo client's probe frames passed 2%.) Other hosts are cheaper, so there the
# budget buys less CPU than it says.
CPU_BUDGET = 0.005
EVENT_COST_S = 300e-9
# The budget follows the targets: CPU_BUDGET while each target keeps a CPU busy, less in proportion
# as their CPU per target falls (a busy host, a pinned or starved target). The hooks' cost lands in
# the targets' own system calls, so with a fixed budget a target with half a CPU carried twice the
# probe share (fresh-clone run72: tquic's client 2.16% of its samples beside one busy process).
# At least MIN_BUDGET_SCALE of it: a mostly idle target's few packets are still counted whole.
MIN_BUDGET_SCALE = 0.1
# The targets' CPU time comes from /proc in clock ticks (10 ms): the scale is taken over at least
# SCALE_SPAN_S, not over the first periods' 20 and 80 ms (one tick more or less is half the scale).
SCALE_SPAN_S = 0.1
# the namespace's kernel counters, in the order the sampler reads them (NetnsCounters.parse)
AUX = ("mib_in", "mib_out", "ip_out_octets")


def period_length(elapsed_s: float) -> float:
    """Periods start short and grow to PERIOD_S: the variance estimate needs many periods, and
    each sampled one costs an attach and a detach of the hooks (a tenth of the time elapsed: a run
    gets ~10 more periods each time its length grows e-fold)."""
    return min(PERIOD_S, max(FIRST_PERIOD_S, elapsed_s / 10))


def budget_scale(targets_cpu_s: float, elapsed_s: float, ntargets: int) -> float:
    """The share of CPU_BUDGET the next window may spend: the targets' CPU seconds per second per
    target over the last period, within [MIN_BUDGET_SCALE, 1]."""
    if elapsed_s <= 0 or ntargets <= 0 or targets_cpu_s != targets_cpu_s:  # NaN: unknown
        return 1.0
    return min(1.0, max(MIN_BUDGET_SCALE, targets_cpu_s / elapsed_s / ntargets))


def budget_rate(scale: float = 1.0) -> float:
    """Hook runs a second the windows may cost: `scale` (budget_scale) of CPU_BUDGET at EVENT_COST_S a run."""
    return CPU_BUDGET * scale / EVENT_COST_S


def fits_budget(events: int, counted_s: float, budget_events_s: float) -> bool:
    """Whether `events` hook runs in `counted_s` are within the budget's rate (nothing counted: they are)."""
    return counted_s <= 0 or events <= budget_events_s * counted_s


def window_length(events: int, counted_s: float, period_s: float = PERIOD_S,
                  budget_events_s: float = budget_rate(), min_window_s: float = MIN_WINDOW_S) -> float:
    """The next window's length from the hook runs counted in the last window (all tasks, `counted_s`
    long): the whole period when that rate fits the budget, else the budget's share of it; never more
    than GROWTH times the last window."""
    if counted_s <= 0:
        return period_s
    want = period_s if fits_budget(events, counted_s, budget_events_s) else \
        max(min_window_s, period_s * budget_events_s * counted_s / events)
    return min(period_s, want, max(min_window_s, GROWTH * counted_s))


def next_window(events: int, counted_s: float, elapsed_s: float,
                budget_events_s: float = budget_rate()) -> tuple[float, float]:
    """(period, window) after a window of `counted_s` that counted `events` hook runs, `elapsed_s`
    into the run. A window held short only by GROWTH while the rate fits the budget is a whole
    period of its own: counted whole, so the overrun check watches it."""
    period = period_length(elapsed_s)
    window = window_length(events, counted_s, period, budget_events_s)
    if window < period and fits_budget(events, counted_s, budget_events_s):
        return window, window
    return period, window


def overran(events: int, counted_s: float, budget_events_s: float) -> bool:
    """Whether a whole-period window's hook runs so far (`counted_s` into it) went past OVERRUN times
    the budget, with a burst of BURST_S of the whole budget allowed: the period ends there (it is
    counted whole up to then, so nothing is estimated)."""
    return counted_s > 0 and events > OVERRUN * max(budget_events_s * counted_s, budget_rate() * BURST_S)


def next_check(wait_s: float, runs: int, over_s: float, budget_events_s: float) -> float:
    """The wait to a whole-period window's next overrun check, after a wait of `wait_s` whose check saw `runs`
    hook runs over `over_s`: CHECK_S while the hooks run, doubling to CHECK_IDLE_S while they are quiet."""
    if runs > QUIET * budget_events_s * over_s:
        return CHECK_S
    return min(CHECK_IDLE_S, max(CHECK_S, 2 * wait_s))


def tri_index(i: int, j: int, n: int) -> int:
    """Position of (i, j), i <= j, in the row-major upper triangle of an n x n matrix."""
    return i * n - i * (i - 1) // 2 + (j - i)


@dataclass
class GroupStats:
    """What is kept of one group's windows (see the module docstring)."""

    netns: str
    n: int  # series: counters + AUX
    sum: list[float] = field(default_factory=list)
    counted: list[float] = field(default_factory=list)
    seen: list[int] = field(default_factory=list)
    q: list[float] = field(default_factory=list)
    prev: list[float] | None = None  # z of the last window
    # its namespace's kernel counters (AUX) before its first period: a group first seen later (a process
    # that joined, a thread that started) is scaled to the counters of its own periods only
    since: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.sum = self.sum or [0.0] * self.n
        self.counted = self.counted or [0] * self.n
        self.seen = self.seen or [0] * self.n
        self.q = self.q or [0.0] * (self.n * (self.n + 1) // 2)

    def add(self, y: list[float], pi: float, h: float, prev_aux: list[float] | None) -> None:
        z = [v / pi for v in y]
        for i, v in enumerate(y):
            self.sum[i] += z[i]
            self.counted[i] += v
            self.seen[i] += v > 0
        # a group seen for the first time had no counts in the window before, but its
        # namespace's counters did: the difference starts from there
        prev = self.prev if self.prev is not None else \
            ([0.0] * (self.n - len(AUX)) + list(prev_aux) if prev_aux is not None else None)
        if prev is not None and h > 0:
            d = [a - b for a, b in zip(z, prev)]
            n = self.n
            for i in range(n):
                if d[i] == 0:
                    continue
                base = tri_index(i, i, n)
                for j in range(i, n):
                    self.q[base + j - i] += h * d[i] * d[j]
        self.prev = z

    def to_json(self) -> dict[str, object]:
        return {"netns": self.netns, "sum": [round(v, 3) for v in self.sum],
                "counted": [round(v, 3) for v in self.counted], "seen": self.seen,
                "q": self.q,  # full precision: the regression's variance is a difference of large terms
                **({"since": [round(v, 3) for v in self.since]} if any(self.since) else {})}


class WindowStats:
    """All groups' statistics over the windows so far, plus the frame they were drawn from."""

    def __init__(self, counters: tuple[str, ...]) -> None:
        self.series = tuple(counters) + AUX
        self.groups: dict[str, GroupStats] = {}
        self.periods = 0
        self.full_periods = 0
        self.span_s = 0.0  # the periods' total length
        self.counted_s = 0.0  # the windows' total length
        self.expansion = 0.0  # sum of 1/pi over partial windows: what one event at each edge weighs
        self._prev_pi: float | None = None
        self._prev_aux: dict[str, list[float]] = {}  # netns -> z of its counters in the last window

    def add_window(self, period_s: float, window_s: float, counts: dict[str, tuple[str, list[int]]],
                   aux: dict[str, tuple[float, ...]], before: dict[str, tuple[float, ...]] | None = None) -> None:
        """One period: its length, its window's, each group's (netns, counter deltas) in the window,
        and each namespace's kernel counter deltas in the window (in AUX's order). Groups seen
        before but silent in this window count zeros. `before`: each namespace's kernel counters
        counted before this period, where a group first seen now starts."""
        pi = min(1.0, window_s / period_s) if period_s > 0 else 1.0
        h = 0.0 if self._prev_pi is None else 1.0 - min(pi, self._prev_pi)
        ncounters = len(self.series) - len(AUX)
        for key, (netns, y) in counts.items():
            if key not in self.groups:
                start = (before or {}).get(netns)
                self.groups[key] = GroupStats(netns, len(self.series),
                                              since=list(start) if start is not None and self.periods else [])
        for key, g in self.groups.items():
            y = list(counts[key][1]) if key in counts else [0] * ncounters
            a = aux.get(g.netns, (0.0,) * len(AUX))
            if len(a) != len(AUX):
                raise ValueError(f"a namespace's window has {len(a)} kernel counters, not {len(AUX)}")
            g.add(y + list(a), pi, h, self._prev_aux.get(g.netns))
        self._prev_aux = {ns: [v / pi for v in a] for ns, a in aux.items()}
        self._prev_pi = pi
        self.periods += 1
        self.full_periods += pi >= 1.0
        self.span_s += period_s
        self.counted_s += window_s
        if pi < 1.0:
            self.expansion += 1.0 / pi

    def to_json(self) -> dict[str, object]:
        return {"series": list(self.series), "periods": self.periods, "full_periods": self.full_periods,
                "span_s": round(self.span_s, 6), "counted_s": round(self.counted_s, 6),
                "expansion": round(self.expansion, 3),
                "groups": {k: g.to_json() for k, g in self.groups.items()}}
