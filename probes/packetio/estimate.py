"""Totals and ratios, with 95% intervals, from counts taken in sampling windows.

The packetio probes count during one window per period (probes/packetio/windows.py
keeps, per group, the expanded window sums `sum`, the raw `counted` sums and the
successive-difference cross-products `q`). Here they become estimates:

- a total T_j is the regression estimator S_j + b_j (X - S_aux): the
  Horvitz-Thompson sum of the windows, corrected by how far the windows' sum of
  the kernel's exact UDP counter of the namespace (S_aux) fell from its true total
  over the run (X), with b_j = q_j,aux / q_aux,aux from the same windows. A target
  whose datagrams are most of its namespace's gets b ~ its share and an almost
  exact total; one drowned in other traffic gets b ~ 0, the plain time sample.
  Its variance is never larger than the plain sample's (to first order);
- any figure made of totals (datagrams per call, GSO segments per send, ACK
  ratio) is a function of the sums; its variance comes from the delta method,
  grad' V grad, with V = K / (2 (K - 1)) * q estimated from successive differences
  over the K periods (stratified sampling, one window per period);
- the interval is value +- (t(0.975, K - 1) * sd + edge): `edge` bounds what the
  programs and the kernel's counters cannot agree on at a window's edges, a
  datagram in flight as the window opens or closes (sampled at ~1 per window
  here): one event of each series per window, times the window's expansion 1/pi,
  propagated through f with |gradient|. A total's lower end is never below
  what was counted, nor its upper end above what the namespace's counters allow.
  Runs counted whole (every window a full period) are exact;
- a figure resting on series seen in fewer than MIN_SEEN windows (a burst between
  windows, a process that hardly sent) has no usable variance estimate: its
  interval is then only what is certain, from what was counted to what the
  namespace's counters allow (unbounded where they say nothing).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Callable, Mapping, Sequence

MIN_SEEN = 5
# two-sided 95% quantiles of Student's t for 1..30 degrees of freedom; 1.96 beyond
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042)


def t975(df: int) -> float:
    return _T975[df - 1] if 1 <= df <= len(_T975) else 1.96


@dataclass(frozen=True)
class Estimate:
    """A figure with its 95% interval; exact figures have low == high == value. An end that
    nothing bounds is None (a ratio resting on too few windows has neither)."""

    value: float
    low: float | None
    high: float | None
    exact: bool

    @staticmethod
    def of(value: float) -> "Estimate":
        return Estimate(value, value, value, True)

    def interval(self, nd: int = 3) -> list[float | None] | None:
        if self.low is None and self.high is None:
            return None
        return [None if x is None else round(x, nd) for x in (self.low, self.high)]

    def holds(self, truth: float) -> bool:
        """Is `truth` inside the interval (an unbounded end holds everything on its side)?"""
        if self.exact:
            return truth == self.value
        return (self.low is None or self.low <= truth) and (self.high is None or truth <= self.high) \
            and not (self.low is None and self.high is None)

    def relative_half_width(self) -> float | None:
        if self.low is None or self.high is None or not self.value:
            return None
        return (self.high - self.low) / 2 / abs(self.value)


@dataclass(frozen=True)
class GroupSample:
    """One group's window statistics and what they are scaled to.

    series: names of the sums (counters, then the kernel counters); aux_of: counter -> the
    kernel counter its messages are part of (one event each: what an event at a window's edge
    weighs); aux_total: kernel counter -> its exact total over the run (absent when it could not
    be read); scale_to: counter -> tiers of kernel counters its total may be scaled to, best kind
    first (probes.packetio.maps.kernel_counters_for); by default its aux_of counter."""

    series: Sequence[str]
    sum: Sequence[float]
    counted: Sequence[float]
    seen: Sequence[int]
    q: Sequence[float]
    periods: int
    full_periods: int
    aux_of: Mapping[str, str]
    aux_total: Mapping[str, float]
    expansion: float = 0.0  # sum of 1/pi over the partial windows
    scale_to: Mapping[str, Sequence[Sequence[str]]] | None = None

    @property
    def exact(self) -> bool:
        return self.periods > 0 and self.full_periods == self.periods

    def _index(self) -> dict[str, int]:
        return {name: i for i, name in enumerate(self.series)}

    @cached_property
    def _kernel(self) -> frozenset[str]:
        names = set(self.aux_total) | set(self.aux_of.values())
        for tiers in (self.scale_to or {}).values():
            names.update(n for tier in tiers for n in tier)
        return frozenset(names)

    @cached_property
    def _slopes(self) -> dict[str, tuple[int, float]]:
        """counter -> (index of the kernel counter it is regressed on, slope b) where one applies:
        from the first tier of its candidates with a counter this run has, the one that follows it
        most closely across the windows (highest squared correlation), the tier's first on a tie.
        Within a tier the candidates count the same thing (bytes, or datagrams), so the choice
        only picks the direction (a sender sharing loopback with its receiver follows both)."""
        idx = self._index()
        out = {}
        for name, i in idx.items():
            own = self.aux_of.get(name)
            if own is None:
                continue
            tiers = (self.scale_to or {}).get(name) or ((own,),)
            qii = self._cov(i, i)
            for tier in tiers:
                best: tuple[float, int, int] | None = None  # (r^2, -rank, index)
                for rank, aux in enumerate(tier):
                    a = idx.get(aux)
                    if a is None or aux not in self.aux_total or self._cov(a, a) <= 0:
                        continue
                    qaa = self._cov(a, a)
                    r2 = self._cov(i, a) ** 2 / (qii * qaa) if qii > 0 else 0.0
                    if best is None or (r2, -rank) > best[:2]:
                        best = (r2, -rank, a)
                if best is not None:
                    a = best[2]
                    out[name] = (a, self._cov(i, a) / self._cov(a, a))
                    break
        return out

    def totals(self, s: Sequence[float]) -> dict[str, float]:
        """Every counter's total from sums `s` (the estimator as a function of the sums)."""
        slopes = {} if self.exact else self._slopes
        out = {}
        for name, i in self._index().items():
            if name in self._kernel:
                continue
            if name in slopes:
                a, b = slopes[name]
                out[name] = s[i] + b * (self.aux_total[self.series[a]] - s[a])
            else:
                out[name] = s[i]
        return out

    def _cov(self, i: int, j: int) -> float:
        n = len(self.series)
        a, b = min(i, j), max(i, j)
        return self.q[a * n - a * (a - 1) // 2 + (b - a)]

    def estimate(self, f: Callable[[Mapping[str, float]], float | None], floor: float | None = None,
                 ceiling: float | None = None) -> Estimate | None:
        """f of the totals, with its interval; None where f is undefined (a zero denominator).
        `floor`/`ceiling`: what the true value certainly is at least / at most."""
        base = list(self.sum)
        value = f(self.totals(base))
        if value is None or not math.isfinite(value):
            return None
        if ceiling is not None:
            value = min(value, ceiling)
        if floor is not None:
            value = max(value, floor)
        if self.exact:
            return Estimate.of(value)
        n = len(base)
        grad = [0.0] * n
        for i in range(n):
            step = max(abs(base[i]) * 1e-6, 1e-3)
            hi, lo = list(base), list(base)
            hi[i] += step
            lo[i] = max(0.0, lo[i] - step)
            fh, fl = f(self.totals(hi)), f(self.totals(lo))
            if fh is None or fl is None:
                continue
            grad[i] = (fh - fl) / (hi[i] - lo[i])
        # the series f rests on; one never seen adds nothing known (a zero), unless it is all there is
        used = [i for i in range(n) if grad[i] and self.series[i] not in self._kernel and self.seen[i] > 0]
        if self.periods < 2 or not used or min(self.seen[i] for i in used) < MIN_SEEN:
            return Estimate(value, floor, ceiling, False)
        var = sum(grad[i] * grad[j] * self._cov(i, j) for i in range(n) if grad[i] for j in range(n) if grad[j])
        var *= self.periods / (2 * (self.periods - 1))
        var += self._slope_variance(grad)
        half = t975(self.periods - 1) * math.sqrt(max(var, 0.0)) + self._edge(grad)
        low, high = value - half, value + half
        if floor is not None:
            low = max(low, floor)
        if ceiling is not None:
            high = max(value, min(high, ceiling))
        return Estimate(value, low, high, False)

    def _slope_variance(self, grad: Sequence[float]) -> float:
        """What the slopes b being estimated from the same windows adds: (X - S_aux)^2 Var(b),
        Var(b) = q_e,e / ((K - 2) q_aux,aux), e the residual of a series on its kernel counter (as
        for a least-squares slope through the successive differences). Without it the
        intervals of a target sharing its namespace held the truth ~92% of the time in simulation."""
        if self.periods < 3:
            return 0.0
        out = 0.0
        for name, (a, b) in self._slopes.items():
            i = self._index()[name]
            if not grad[i]:
                continue
            qaa = self._cov(a, a)
            qee = max(0.0, self._cov(i, i) - 2 * b * self._cov(i, a) + b * b * qaa)
            gap = self.aux_total[self.series[a]] - self.sum[a]
            out += grad[i] ** 2 * gap * gap * qee / ((self.periods - 2) * qaa)
        return out

    def _edge(self, grad: Sequence[float]) -> float:
        """One event per window edge pair in every series, each event the size of the series'
        own (its count per kernel-counter message), expanded like the windows."""
        idx = self._index()
        out = 0.0
        for name, i in idx.items():
            aux = self.aux_of.get(name)
            if not grad[i] or aux not in idx or not self.counted[idx[aux]]:
                continue
            per_event = self.counted[i] / self.counted[idx[aux]]
            out += abs(grad[i]) * per_event * self.expansion
        return out

    def total(self, name: str) -> Estimate:
        """One counter's total over the run."""
        i = self._index()[name]
        est = self.estimate(lambda t: t[name], floor=float(self.counted[i]))
        assert est is not None
        return est
