"""The crypto group's cost model and its one-line summary: pure logic, on the maps a run prints."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from qprof.archive.model import ProbeMaps
from qprof.probes.crypto import program
from qprof.probes.crypto.records import CryptoSlot
from qprof.probes.group import ProgramCost

SLOTS = [CryptoSlot(0, "seal", object="/usr/bin/server", address="0x4a10")]


def _maps(calls: int, host: int, reentries: int | None = None) -> ProbeMaps:
    maps: ProbeMaps = {"@calls": {"1,1,0": calls}, "@host_calls": {"0": host}}
    if reentries is not None:
        maps["@reentries"] = {"1": reentries}
    return maps


def test_no_bpf_statistics_still_prices_the_host_hits() -> None:
    """A short run closes before a statistics window opens: the host-wide hits are then priced at the
    trap cost alone, like the targets' (a CI run crashed here when a Go target re-entered 24 times)."""
    c = program.cost(SLOTS, _maps(60_000, 60_030), programs=[])
    assert c.bpf_run_time_ns is None
    assert c.host_estimated_ns == 60_030 * program.UPROBE_TRAP_NS
    assert "host-wide" in program.cost_text(c)


def test_go_reentries_are_traps_in_the_target_not_other_processes() -> None:
    c = program.cost(SLOTS, _maps(60_000, 60_024, reentries=24), programs=[])
    assert c.target_estimated_ns == 60_024 * program.UPROBE_TRAP_NS
    text = program.cost_text(c)
    assert "60,000 uprobe hits + 24 Go re-entries" in text
    assert "other processes" not in text


def test_measured_bpf_time_is_added_per_hit() -> None:
    progs = [ProgramCost(type="kprobe", run_cnt=1000, run_time_ns=150_000)]
    c = program.cost(SLOTS, _maps(10_000, 10_000), progs)
    assert c.bpf_ns_per_hit == 150.0
    assert c.target_estimated_ns == round(10_000 * (program.UPROBE_TRAP_NS + 150.0))


@settings(max_examples=200, deadline=None)
@given(calls=st.integers(0, 10**7), extra=st.integers(0, 10**6), reentries=st.integers(0, 10**4),
       stats=st.one_of(st.none(), st.tuples(st.integers(0, 10**6), st.integers(0, 10**9))),
       damaged=st.sampled_from([None, "x", -1, 2.5]))
def test_any_counts_give_a_summary(calls: int, extra: int, reentries: int,
                                   stats: tuple[int, int] | None, damaged: Any) -> None:
    """Whatever the maps hold (damaged values included), the cost is priced and told in one line."""
    maps = _maps(calls, calls + reentries + extra, reentries)
    calls = maps["@calls"]
    assert isinstance(calls, dict)
    calls["9,9,0"] = damaged
    progs = [] if stats is None else [ProgramCost(type="kprobe", run_cnt=stats[0], run_time_ns=stats[1])]
    c = program.cost(SLOTS, maps, progs)
    text = program.cost_text(c)
    assert "\n" not in text and text.startswith("crypto probes cost the targets")
    assert c.host_estimated_ns is not None and c.target_estimated_ns is not None
    assert c.host_estimated_ns >= c.target_estimated_ns
    assert ("other processes" in text) == (extra > 0)
