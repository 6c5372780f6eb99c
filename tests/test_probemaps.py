"""Raw bpftrace maps read into typed values (attribution.probemaps): counters, values, histograms.
A damaged map or entry is skipped, never fatal."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from qprof.attribution.probemaps import Bucket, Histogram, counters, histograms, values

_json = st.recursive(st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=6),
                     lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
                     max_leaves=10)


def test_counters_values_and_histograms_as_printed() -> None:
    maps = {"@calls": {"7,8,2": 5, "7,x,2": 1}, "@syscall_calls": {"7,sys_exit_sendto": 3, "7,bad": "x"},
            "@syscall_ns": {"7,sys_exit_sendto": [{"min": 0, "max": 1, "count": 1}, {"min": 2, "max": 3, "count": 3}]}}
    assert counters(maps, "@calls") == [([7, 8, 2], 5)] and counters(maps, "@none") == []
    assert values(maps, "@syscall_calls") == {"7,sys_exit_sendto": 3.0}
    h = histograms(maps, "@syscall_ns")["7,sys_exit_sendto"]
    assert h.buckets == (Bucket(0, 1, 1), Bucket(2, 3, 3)) and h.median == 2.5 and h.quantile(0.2) == 0.5
    assert Histogram.of([{"min": 4, "count": 2}]).median == 4 and Histogram.of(None).median is None


@given(st.dictionaries(st.sampled_from(["@a", "@b"]), _json, max_size=2), st.floats(0, 1))
def test_any_printed_value_reads_or_is_skipped(maps: dict[str, Any], q: float) -> None:
    for key, n in counters(maps, "@a"):
        assert all(isinstance(k, int) for k in key) and isinstance(n, int)
    assert all(isinstance(v, float) for v in values(maps, "@a").values())
    for h in histograms(maps, "@b").values():
        x = h.quantile(q)
        assert x is None or any(min(b.low, b.high) <= x <= max(b.low, b.high) for b in h.buckets) or q == 0


@pytest.mark.parametrize("printed", [[{"count": 0}], [], "x", [{"min": None, "max": "1", "count": True}]])
def test_an_empty_or_damaged_histogram_has_no_quantile(printed: object) -> None:
    assert Histogram.of(printed).median is None
