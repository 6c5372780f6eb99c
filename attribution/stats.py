"""The median of repeated measurements and a distribution-free confidence interval for it.

Why this method: a study repeats a profile a handful of times (3 to 10) and
nothing says its shares are normally distributed (they are bounded, often
skewed, sometimes bimodal when a run lands on another CPU). The order-statistic
interval needs no such assumption: for sorted values x(1) <= ... <= x(n), the
interval [x(j), x(n+1-j)] contains the population median with probability at
least 1 - 2 P(B <= j-1), B ~ Binomial(n, 1/2), whatever the distribution. We
take the largest j (the narrowest interval) whose coverage reaches the level.

For 95% such an interval exists from n = 6 on: even [min, max] covers the
median with probability only 1 - 2^(1-n) (93.75% at n = 5, 75% at n = 3).
Below that no interval is given, and the reason is said, rather than one that
covers less than it claims. Computed exactly with integers: no seed, no
randomness, the same answer for any order of the values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Sequence

LEVEL = 0.95
METHOD = "distribution-free order-statistic interval for the median (binomial, exact coverage)"


@dataclass(frozen=True)
class MedianCI:
    """Median of n values and, when n allows it, an interval [low, high] with its exact coverage."""

    n: int
    median: float | None
    low: float | None
    high: float | None
    coverage: float | None  # exact probability that [low, high] contains the median (>= level)
    note: str | None  # why there is no interval

    @property
    def available(self) -> bool:
        return self.low is not None


def median(values: Sequence[float]) -> float:
    """The middle value, or the mean of the two middle values."""
    if not values:
        raise ValueError("median of no values")
    xs = sorted(values)
    mid = len(xs) // 2
    return float(xs[mid]) if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2


def _coverage(n: int, j: int) -> Fraction:
    """P(x(j) <= median <= x(n+1-j)) = 1 - 2 P(B <= j-1), B ~ Binomial(n, 1/2)."""
    tail = sum(math.comb(n, i) for i in range(j))
    return 1 - Fraction(2 * tail, 2 ** n)


def min_n(level: float = LEVEL) -> int:
    """The fewest values for which an interval with this coverage exists ([min, max])."""
    n = 1
    while _coverage(n, 1) < Fraction(level):
        n += 1
    return n


def median_ci(values: Sequence[float], level: float = LEVEL) -> MedianCI:
    """Median and order-statistic confidence interval of `values` (NaN is refused: drop unknowns first)."""
    if not 0 < level < 1:
        raise ValueError(f"level {level} must be between 0 and 1")
    xs = sorted(float(v) for v in values)
    if any(math.isnan(x) for x in xs):
        raise ValueError("NaN among the values: leave unknown measurements out")
    n = len(xs)
    if n == 0:
        return MedianCI(0, None, None, None, None, "no values")
    med = median(xs)
    target = Fraction(level)
    if _coverage(n, 1) < target:
        need = min_n(level)
        return MedianCI(n, med, None, None, None,
                        f"n={n}: a distribution-free {level:.0%} interval needs n>={need}")
    j = 1
    while j + 1 <= (n + 1) // 2 and _coverage(n, j + 1) >= target:
        j += 1
    return MedianCI(n, med, xs[j - 1], xs[n - j], float(_coverage(n, j)), None)
