"""Median and its order-statistic confidence interval."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qprof.attribution.stats import median, median_ci, min_n
from conftest import examples

_values = st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=60)


def test_known_ranks_from_tables() -> None:
    xs = list(range(1, 21))
    # n=10: ranks 2 and 9 (coverage 1 - 2*11/1024); n=20: ranks 6 and 15 (0.9586)
    ci = median_ci(xs[:10])
    assert (ci.low, ci.high, ci.median) == (2, 9, 5.5)
    assert ci.coverage == pytest.approx(1 - 22 / 1024)
    ci = median_ci(xs)
    assert (ci.low, ci.high) == (6, 15) and ci.coverage == pytest.approx(0.958610535)


def test_smallest_n_is_six_for_95_percent() -> None:
    assert min_n(0.95) == 6
    ci = median_ci([3.0, 1.0, 2.0, 6.0, 5.0, 4.0])
    assert (ci.low, ci.high, ci.median) == (1.0, 6.0, 3.5) and ci.coverage == pytest.approx(62 / 64)
    for n in range(0, 6):
        ci = median_ci([float(i) for i in range(n)])
        assert not ci.available and ci.low is None and ci.high is None and ci.coverage is None
        assert ci.note is not None and (n == 0 or "needs n>=6" in ci.note)
    assert median_ci([1.0, 2.0, 3.0]).median == 2.0


def test_lower_level_needs_fewer_values() -> None:
    assert min_n(0.75) == 3
    ci = median_ci([5.0, 1.0, 3.0], level=0.75)
    assert (ci.low, ci.high, ci.coverage) == (1.0, 5.0, 0.75)


def test_nan_and_bad_level_refused() -> None:
    with pytest.raises(ValueError):
        median_ci([1.0, math.nan])
    with pytest.raises(ValueError):
        median_ci([1.0], level=1.0)
    with pytest.raises(ValueError):
        median([])


@settings(max_examples=examples(300))
@given(_values)
def test_interval_contains_the_median_and_coverage_reaches_the_level(xs: list[float]) -> None:
    ci = median_ci(xs)
    assert ci.n == len(xs) and min(xs) <= ci.median <= max(xs)  # type: ignore[operator]
    if len(xs) >= 6:
        assert ci.low is not None and ci.high is not None and ci.coverage is not None
        assert ci.low <= ci.median <= ci.high
        assert ci.low in xs and ci.high in xs
        assert 0.95 <= ci.coverage <= 1
    else:
        assert not ci.available


@settings(max_examples=examples(200))
@given(_values, st.randoms(use_true_random=False))
def test_invariant_to_order(xs: list[float], rnd: random.Random) -> None:
    ys = xs[:]
    rnd.shuffle(ys)
    assert median_ci(xs) == median_ci(ys)


@settings(max_examples=examples(200))
@given(_values, st.floats(0.5, 100), st.floats(-100, 100))
def test_moves_with_an_increasing_transform(xs: list[float], a: float, b: float) -> None:
    ci, cj = median_ci(xs), median_ci([a * x + b for x in xs])
    assert cj.coverage == ci.coverage
    if ci.available:
        assert cj.low == pytest.approx(a * ci.low + b, abs=1e-6)  # type: ignore[operator]
        assert cj.high == pytest.approx(a * ci.high + b, abs=1e-6)  # type: ignore[operator]


def test_narrowest_interval_reaching_the_level() -> None:
    for n in range(6, 80):
        ci = median_ci([float(i) for i in range(n)])
        j = int(ci.low) + 1  # type: ignore[arg-type]  # values 0..n-1: x(j) = j-1
        assert ci.high == n - j and ci.coverage >= 0.95  # type: ignore[operator]
        # one rank further in would cover less than 95% (or cross the middle)
        tail = sum(math.comb(n, i) for i in range(j + 1))
        assert j + 1 > (n + 1) // 2 or 1 - 2 * tail / 2 ** n < 0.95
