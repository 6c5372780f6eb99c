"""Row builders (viewer.rows) and the summary over runs: fast tests on a made-up archive's real report."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qprof.api import ALL_SYMBOLS, report_of
from qprof.attribution.categories import CATEGORIES
from qprof.attribution.stats import median
from qprof.viewer import rows as R
from test_archive import CLIENT, SERVER, _fake_run
from conftest import examples


@pytest.fixture
def report(tmp_path: Path) -> dict:
    return report_of(_fake_run(tmp_path))


def _keys(rows: list[dict], columns: tuple[str, ...]) -> None:
    assert all(tuple(r) == columns for r in rows)


def test_category_rows_add_up_to_the_report(report: dict) -> None:
    rows = R.category_rows(report)
    _keys(rows, R.CATEGORY_COLUMNS)
    assert len(rows) == len(report["processes"]) * len(CATEGORIES)
    for p in report["processes"]:
        mine = [r for r in rows if r["pid"] == p["pid"]]
        assert [r["category"] for r in mine] == list(CATEGORIES)
        assert sum(r["share"] for r in mine) == pytest.approx(1, abs=5e-6)
        assert sum(r["samples"] for r in mine) == p["samples"]
        assert sum(r["cpu_seconds"] for r in mine) == pytest.approx(p["cpu_seconds"], abs=5e-6)
    srv = {r["category"]: r for r in rows if r["pid"] == SERVER}
    assert srv["Packet I/O"]["samples"] == 4 and srv["Packet I/O"]["stack"] == "ngtcp2"
    assert srv["Packet I/O"]["role"] == "server" and srv["Packet I/O"]["run"] == report["run"]["path"]
    assert {r["stack"] for r in rows if r["pid"] == CLIENT} == {None}  # only the common mapping matched


def test_symbol_rows_cover_every_sample(report: dict) -> None:
    rows = R.symbol_rows(report)
    _keys(rows, R.SYMBOL_COLUMNS)
    for p in report["processes"]:
        mine = [r for r in rows if r["pid"] == p["pid"]]
        assert sum(r["samples"] for r in mine) == p["samples"]
        assert sum(r["share"] for r in mine) == pytest.approx(1, abs=1e-5)
    assert ("ip_output", "Packet I/O", 4) in {(r["symbol"], r["category"], r["samples"]) for r in rows}


def test_top_limits_symbols_not_categories(tmp_path: Path) -> None:
    top1 = report_of(_fake_run(tmp_path), top=1)
    assert all(len(v) <= 1 for p in top1["processes"] for v in p["top_symbols"].values())
    assert R.category_rows(top1) == R.category_rows(report_of(tmp_path / "run", top=ALL_SYMBOLS))


def test_no_probes_no_probe_rows(report: dict) -> None:
    assert report["packet_io"] is None and R.probe_rows(report) == []
    assert len(set(R.PROBE_COLUMNS)) == len(R.PROBE_COLUMNS)
    assert {"tx_bytes", "rx_datagrams_per_syscall", "gso_sends", "gso_segments_per_gso_send", "gro_enabled",
            "ack_ratio", "drops"} <= set(R.PROBE_COLUMNS)


def test_verdict_rows_side_then_overall(report: dict) -> None:
    rows = R.verdict_rows(report)
    _keys(rows, R.VERDICT_COLUMNS)
    assert [r["role"] for r in rows] == ["server", "overall"]  # the client has no /proc readings
    assert {r["limited_by"] for r in rows} == {report["verdict"]["limited_by"]}
    assert rows[0]["pid"] == SERVER and rows[1]["pid"] is None


def test_run_and_table_rows(report: dict) -> None:
    meta = R.run_row(report)
    assert tuple(meta) == R.RUN_COLUMNS
    assert meta["samples"] == sum(p["samples"] for p in report["processes"])
    assert meta["unwind"] == "dwarf,fp" and meta["frequency"] == 999 and meta["duration_s"] == 10.0
    rows = R.table_rows(report)
    _keys(rows, R.TABLE_COLUMNS)
    assert [(r["pid"], r["category"], r["share"]) for r in rows] == \
        [(r["pid"], r["category"], r["share"]) for r in R.category_rows(report)]
    assert {r["unwind"] for r in rows if r["pid"] == CLIENT} == {"dwarf"}
    assert {r["verdict"] for r in rows} == {report["verdict"]["limited_by"]}


# ---------------------------------------------------------------- the summary

_row = st.fixed_dictionaries({
    "stack": st.sampled_from(["ngtcp2", "quiche", None]), "role": st.sampled_from(["server", "client", None]),
    "comm": st.sampled_from(["srv", "cli"]), "category": st.sampled_from(CATEGORIES),
    "share": st.floats(0, 1), "cpu_seconds": st.floats(0, 100)})


@settings(max_examples=examples(200))
@given(st.lists(_row, max_size=60), st.randoms(use_true_random=False))
def test_summary_groups_and_is_invariant_to_order(rows: list[dict], rnd: random.Random) -> None:
    summary = R.summary_rows(rows)
    shuffled = rows[:]
    rnd.shuffle(shuffled)
    assert R.summary_rows(shuffled) == summary
    _keys(summary, R.SUMMARY_COLUMNS)
    assert sum(s["n"] for s in summary) == len(rows)
    for s in summary:
        members = [r for r in rows if (r["stack"], r["role"] or r["comm"], r["category"]) ==
                   (s["stack"], s["role"], s["category"])]
        assert len(members) == s["n"]
        assert s["share_median"] == median([m["share"] for m in members])
        if s["n"] >= 6:
            assert s["share_ci_low"] <= s["share_median"] <= s["share_ci_high"]
            assert s["cpu_seconds_ci_low"] <= s["cpu_seconds_median"] <= s["cpu_seconds_ci_high"]
            assert s["ci_coverage"] >= 0.95 and s["ci_note"] is None
        else:
            assert s["share_ci_low"] is None and s["ci_coverage"] is None and "needs n>=6" in s["ci_note"]
