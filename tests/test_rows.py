"""Row builders (viewer.rows), where runs stand among a table's runs, and the summary over runs: fast tests
on a made-up archive's real report and on made-up rows."""

from __future__ import annotations

import io
import json
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qprof.api import ALL_SYMBOLS, typed_report
from qprof.archive import Run
from qprof.archive.model import Configuration, Meta, RecordEntry
from qprof.attribution.categories import CATEGORIES, UNCATEGORIZED
from qprof.attribution.stats import median, median_ci, min_n
from qprof.viewer import rows as R
from qprof.viewer.console import text_console
from qprof.errors import QprofError
from qprof.viewer.json_report import to_dict, unplaced_share
from qprof.viewer.report import Report
from qprof.viewer.table import render_summary
from test_archive import CLIENT, SERVER, _fake_run
from conftest import examples


@pytest.fixture
def report(tmp_path: Path) -> Report:
    return typed_report(_fake_run(tmp_path))


def _keys(rows: list[dict], columns: tuple[str, ...]) -> None:
    assert all(tuple(r) == columns for r in rows)


def test_category_rows_add_up_to_the_report(report: Report) -> None:
    doc = to_dict(report)
    rows = R.category_rows(report)
    _keys(rows, R.CATEGORY_COLUMNS)
    assert len(rows) == len(doc["processes"]) * len(CATEGORIES)
    for p in doc["processes"]:
        mine = [r for r in rows if r["pid"] == p["pid"]]
        assert [r["category"] for r in mine] == list(CATEGORIES)
        # the same figures as the JSON report, to the last digit: both render the one typed report
        assert [(r["share"], r["cpu_seconds"]) for r in mine] == \
            [(p["categories"][c], p["category_cpu_seconds"][c]) for c in CATEGORIES]
        assert sum(r["share"] for r in mine) == pytest.approx(1, abs=5e-6)
        assert sum(r["samples"] for r in mine) == p["samples"]
        assert sum(r["cpu_seconds"] for r in mine) == pytest.approx(p["cpu_seconds"], abs=5e-6)
    srv = {r["category"]: r for r in rows if r["pid"] == SERVER}
    assert srv["Packet I/O"]["samples"] == 4 and srv["Packet I/O"]["stack"] == "ngtcp2"
    assert srv["Packet I/O"]["role"] == "server" and srv["Packet I/O"]["run"] == doc["run"]["path"]
    assert {r["stack"] for r in rows if r["pid"] == CLIENT} == {None}  # only the common mapping matched


def test_symbol_rows_cover_every_sample(report: Report) -> None:
    doc = to_dict(report)
    rows = R.symbol_rows(report)
    _keys(rows, R.SYMBOL_COLUMNS)
    for p in doc["processes"]:
        mine = [r for r in rows if r["pid"] == p["pid"]]
        assert sum(r["samples"] for r in mine) == p["samples"]
        assert sum(r["share"] for r in mine) == pytest.approx(1, abs=1e-5)
    assert ("ip_output", "Packet I/O", 4) in {(r["symbol"], r["category"], r["samples"]) for r in rows}


def test_top_limits_symbols_not_categories(tmp_path: Path) -> None:
    top1 = typed_report(_fake_run(tmp_path), top=1)
    assert all(len(v) <= 1 for p in to_dict(top1)["processes"] for v in p["top_symbols"].values())
    assert R.category_rows(top1) == R.category_rows(typed_report(tmp_path / "run", top=ALL_SYMBOLS))


def test_no_probes_no_probe_rows(report: Report) -> None:
    doc = to_dict(report)
    assert doc["packet_io"] is None and R.probe_rows(report) == []
    assert len(set(R.PROBE_COLUMNS)) == len(R.PROBE_COLUMNS)
    assert {"tx_bytes", "rx_datagrams_per_syscall", "gso_sends", "gso_segments_per_gso_send", "gro_enabled",
            "ack_ratio", "drops"} <= set(R.PROBE_COLUMNS)


def test_verdict_rows_side_then_overall(report: Report) -> None:
    doc = to_dict(report)
    rows = R.verdict_rows(report)
    _keys(rows, R.VERDICT_COLUMNS)
    assert [r["role"] for r in rows] == ["server", "overall"]  # the client has no /proc readings
    assert {r["limited_by"] for r in rows} == {doc["verdict"]["limited_by"]}
    assert rows[0]["pid"] == SERVER and rows[1]["pid"] is None


def test_run_and_table_rows(report: Report) -> None:
    doc = to_dict(report)
    meta = R.run_row(report)
    assert tuple(meta) == R.RUN_COLUMNS
    assert meta["samples"] == sum(p["samples"] for p in doc["processes"])
    assert meta["unwind"] == "dwarf,fp" and meta["frequency"] == 999 and meta["duration_s"] == 10.0
    (place,) = R.place_runs([(doc["run"]["path"], Run.open(doc["run"]["path"]).meta)])
    rows = [r.cells() for r in R.table_rows(report, place)]
    _keys(rows, R.TABLE_COLUMNS)
    assert [(r["pid"], r["category"], r["share"]) for r in rows] == \
        [(r["pid"], r["category"], r["share"]) for r in R.category_rows(report)]
    assert {r["unwind"] for r in rows if r["pid"] == CLIENT} == {"dwarf"}
    assert {r["verdict"] for r in rows} == {doc["verdict"]["limited_by"]}
    assert {r["cause"] for r in rows} == {doc["verdict"]["cause"]} and {r["scope"] for r in rows} == {"system"}
    assert {r["mappings"] for r in rows if r["pid"] == SERVER} == {", ".join(
        f"{m['name']} {m['version']}" for m in next(p for p in doc["processes"] if p["pid"] == SERVER)["mappings"])}
    # made by `attach` (no configuration recorded): placed by its directory's name, and it says so
    assert {(r["configuration"], r["setting"], r["repetition"], r["configuration_recorded"]) for r in rows} == \
        {("run", "run", None, False)}


# ---------------------------------------------------------------- where runs stand


def _meta(conf: Configuration | None = None, rep: int | None = None) -> Meta:
    return Meta(configuration=conf, record=RecordEntry(rep, 2) if rep is not None else None)


GSO_ON = Configuration("gso-on", "ngtcp2", {"server": ["srv", "{port}"]}, {})
GSO_OFF = Configuration("gso-off", "ngtcp2", {"server": ["srv", "--max-gso-dgrams=1", "{port}"]}, {})


def test_runs_are_placed_by_their_recorded_configuration_not_their_path() -> None:
    places = R.place_runs([
        ("/s/ngtcp2/gso-on/rep-01", _meta(GSO_ON, 1)), ("/s/ngtcp2/gso-off/rep-01", _meta(GSO_OFF, 1)),
        ("/moved/anywhere", _meta(GSO_ON, 2)),  # moved and renamed: still gso-on's second repetition
        ("/s/ngtcp2/gso-off/rep-02", _meta(GSO_OFF, 2))])
    assert [(p.configuration, p.setting, p.repetition, p.recorded) for p in places] == [
        ("ngtcp2/gso-on", "gso-on", 1, True), ("ngtcp2/gso-off", "gso-off", 1, True),
        ("ngtcp2/gso-on", "gso-on", 2, True), ("ngtcp2/gso-off", "gso-off", 2, True)]


def test_two_configurations_of_one_name_are_told_apart() -> None:
    """Two `record` series both named `runs` (-o a/runs, -o b/runs) ran different commands: two
    configurations, named by their directories, never one."""
    a = Configuration("runs", commands={"server": ["srv"]})
    b = Configuration("runs", commands={"server": ["srv", "--max-gso-dgrams=1"]})
    places = R.place_runs([(f"/x/{d}/runs/rep-0{i}", _meta(c, i)) for d, c in (("a", a), ("b", b)) for i in (1, 2)])
    assert [p.configuration for p in places] == ["runs (a/runs)"] * 2 + ["runs (b/runs)"] * 2
    assert {p.setting for p in places} == {"runs"}
    # the same commands under one name: one configuration, wherever the series were written
    same = R.place_runs([("/x/a/runs/rep-01", _meta(a, 1)), ("/y/runs/rep-01", _meta(a, 1))])
    assert {p.configuration for p in same} == {"runs"}


def test_runs_without_a_configuration_are_placed_as_their_path_says() -> None:
    places = R.place_runs([("/old/gso-on/rep-01", _meta(rep=1)), ("/old/gso-on/rep-02", Meta()),
                           ("/old/single", Meta()), ("/new/gso-on/rep-01", _meta(GSO_ON, 1))])
    assert [(p.configuration, p.setting, p.repetition, p.recorded) for p in places] == [
        ("gso-on", "gso-on", 1, False), ("gso-on", "gso-on", 2, False), ("single", "single", None, False),
        ("ngtcp2/gso-on", "gso-on", 1, True)]


def test_run_names_are_relative_to_the_common_root() -> None:
    runs = ["study/ngtcp2/gso-on/rep-01", "study/ngtcp2/gso-off/rep-01"]
    assert R.run_names(runs) == {runs[0]: "gso-on/rep-01", runs[1]: "gso-off/rep-01"}
    assert R.run_names(["/a/run"]) == {"/a/run": "run"}
    assert R.run_names(["/a/rep-01", "/a/rep-02"]) == {"/a/rep-01": "rep-01", "/a/rep-02": "rep-02"}


def test_unplaced_share_of_a_report_process_read_back(report: Report) -> None:
    """unplaced_share reads a JSON report's process (as written, or read back from a file); anything
    else is one line naming what is missing."""
    for p in json.loads(json.dumps(to_dict(report)))["processes"]:
        assert 0.0 <= unplaced_share(p) <= p["categories"][UNCATEGORIZED] + 1e-9
    for bad in ({"categories": {}, "subcategories": {}}, {"categories": [1], "subcategories": "x"},
                {"categories": {UNCATEGORIZED: "x"}, "subcategories": {UNCATEGORIZED: {}}}):
        with pytest.raises(QprofError, match="^not a report's process"):
            unplaced_share(bad)


# ---------------------------------------------------------------- the summary

def _table_row(run: str, conf: str, role: str, category: str, share: float, goodput: float | None = None,
               verdict: str | None = "client-limited", **method: object) -> R.TableRow:
    row: dict[str, object] = dict.fromkeys(R.TABLE_COLUMNS)
    row.update(run=run, configuration=conf, setting=conf, pid=hash((run, role)) % 1000, comm=role, role=role,
               stack="ngtcp2", category=category, share=share, cpu_seconds=share, goodput_gbps=goodput,
               verdict=verdict, cause="cpu-busy" if verdict not in (None, "neither") else None,
               configuration_recorded=True,
               event="cpu-clock", frequency=999, scope="cgroup", probes="packetio", unwind="fp", mappings="ngtcp2 1")
    row.update(method)
    return _record(row)


def _record(row: dict) -> R.TableRow:
    """A table row as table_rows makes it, from its cells (those not given empty)."""
    return R.TableRow(**{**dict.fromkeys(R.TABLE_COLUMNS), **row})


def _summary(rows: list[R.TableRow]) -> list[dict]:
    return [s.cells() for s in R.summary_rows(rows)]


def test_two_configurations_never_pool() -> None:
    """GSO on and off, two runs each: two configurations in the summary, each over its own two runs,
    with its own goodput and verdicts."""
    rows = [_table_row(f"/s/{c}/rep-0{i}", c, side, "Crypto", share, goodput)
            for c, share, goodput in (("gso-on", 0.2, 2.0), ("gso-off", 0.4, 1.0)) for i in (1, 2)
            for side in ("server", "client")]
    summary = _summary(rows)
    assert [(s["configuration"], s["role"], s["n"], s["share_median"], s["goodput_gbps_median"]) for s in summary] == [
        ("gso-off", "client", 2, 0.4, 1.0), ("gso-off", "server", 2, 0.4, 1.0),
        ("gso-on", "client", 2, 0.2, 2.0), ("gso-on", "server", 2, 0.2, 2.0)]
    assert {s["runs"] for s in summary} == {2} and {s["verdicts"] for s in summary} == {"client-limited (cpu-busy) x2"}
    assert {s["ci_note"] for s in summary} == {s["goodput_ci_note"] for s in summary} == \
        {"2 runs; an interval needs 6"}
    assert R.summary_notices(rows) == []


def test_goodput_interval_and_verdicts_seen() -> None:
    """Seven runs: the goodput's interval (from the client's figure of each run), the verdicts counted."""
    rows = [r for i in range(7) for r in (
        _table_row(f"/r/rep-0{i}", "c", "client", "Crypto", 0.1, 1.0 + i / 10, "client-limited" if i else "neither"),
        _table_row(f"/r/rep-0{i}", "c", "server", "Crypto", 0.1, 9.0, "client-limited" if i else "neither"))]
    (s, _) = _summary(rows)
    want = median_ci([1.0 + i / 10 for i in range(7)])
    assert (s["goodput_gbps_median"], s["goodput_gbps_ci_low"], s["goodput_gbps_ci_high"]) == \
        (want.median, want.low, want.high) and s["goodput_ci_note"] is None
    assert s["verdicts"] == "client-limited (cpu-busy) x6, neither x1"
    assert R.ci_note(median_ci([])) == "no run measured it" and R.ci_note(median_ci([1.0])) == \
        f"1 run; an interval needs {min_n()}"
    assert R.ci_note(median_ci([1.0, 2.0]), runs=4) == f"2 of 4 runs measured it; an interval needs {min_n()}"


def test_pooled_runs_measured_differently_are_one_warning() -> None:
    rows = [_table_row("/a/rep-01", "a", "server", "Crypto", 0.2),
            _table_row("/a/rep-02", "a", "server", "Crypto", 0.3, unwind="dwarf", probes=None),
            _table_row("/a/rep-02", "a", "client", "Crypto", 0.3, probes=None),
            _table_row("/a/rep-01", "a", "client", "Crypto", 0.3),
            # another configuration measured otherwise is not pooled with these: no warning for it
            _table_row("/b/rep-01", "b", "server", "Crypto", 0.3, frequency=4999)]
    (warning,) = R.summary_notices(rows)
    assert warning.warning and "\n" not in warning.text
    assert "unwinding (dwarf vs fp) in a (ngtcp2 server): callers differ" in warning.text
    assert "probes (none vs packetio) in a (ngtcp2 server, ngtcp2 client): the probes' own CPU" in warning.text
    assert "sampling rate" not in warning.text and " b " not in warning.text
    by = {(s["configuration"], s["role"]): s["method_differs"] for s in _summary(rows)}
    assert by == {("a", "client"): "probes: none vs packetio",
                  ("a", "server"): "probes: none vs packetio; unwinding: dwarf vs fp", ("b", "server"): None}


def test_a_summary_says_how_many_runs_an_interval_needs() -> None:
    rows = [_table_row(f"/s/gso-on/rep-0{i}", "gso-on", "client", c, 0.2, 1.5) for i in (1, 2) for c in CATEGORIES]
    buf = io.StringIO()
    render_summary(R.summary_rows(rows), R.summary_notices(rows), text_console(file=buf))
    out = buf.getvalue()
    assert "n/a (2 runs; an interval needs 6)" in out and "client-limited (cpu-busy) x2" in out
    assert "gso-on  " in out and "1.50" in out


_row = st.fixed_dictionaries({
    "configuration": st.sampled_from(["gso-on", "gso-off"]), "run": st.sampled_from(["r1", "r2", "r3"]),
    "pid": st.sampled_from([1, 2]), "stack": st.sampled_from(["ngtcp2", "quiche", None]),
    "role": st.sampled_from(["server", "client", None]), "comm": st.sampled_from(["srv", "cli"]),
    "category": st.sampled_from(CATEGORIES), "share": st.floats(0, 1), "cpu_seconds": st.floats(0, 100),
    "goodput_gbps": st.none() | st.floats(0, 10), "verdict": st.sampled_from(["client-limited", None]),
    "cause": st.none(), **{c: st.sampled_from(["x", "y"]) for c in ("event", "frequency", "scope", "probes",
                                                                    "unwind", "mappings", "setting")},
    "configuration_recorded": st.booleans()})


_CONFIGURATION_LEVEL = ("setting", "configuration_recorded")
_RUN_LEVEL = ("configuration", "verdict", "cause", "event", "frequency", "scope", "probes")
_PROCESS_LEVEL = ("stack", "role", "comm", "goodput_gbps", "unwind", "mappings")


def _consistent(rows: list[dict]) -> list[dict]:
    """As a table's rows are (viewer.rows.place_runs, table_rows): a configuration's setting and
    recording the same on each of its runs, a run's figures on each of its rows, a process's on each
    of its."""
    confs: dict = {}
    runs: dict = {}
    procs: dict = {}
    for r in rows:
        r.update(runs.setdefault(r["run"], {k: r[k] for k in _RUN_LEVEL}))
        r.update(confs.setdefault(r["configuration"], {k: r[k] for k in _CONFIGURATION_LEVEL}))
        r.update(procs.setdefault((r["run"], r["pid"]), {k: r[k] for k in _PROCESS_LEVEL}))
    return rows


@settings(max_examples=examples(200))
@given(st.lists(_row, max_size=60).map(_consistent), st.randoms(use_true_random=False))
def test_summary_groups_and_is_invariant_to_order(rows: list[dict], rnd: random.Random) -> None:
    records = [_record(r) for r in rows]
    summary = _summary(records)
    rnd.shuffle(records)
    assert _summary(records) == summary
    _keys(summary, R.SUMMARY_COLUMNS)
    assert sum(s["n"] for s in summary) == len(rows)
    for s in summary:
        members = [r for r in rows if (r["configuration"], r["stack"], r["role"] or r["comm"], r["category"]) ==
                   (s["configuration"], s["stack"], s["role"], s["category"])]
        assert len(members) == s["n"]
        assert s["share_median"] == median([m["share"] for m in members])
        assert s["runs"] == len({r["run"] for r in rows if r["configuration"] == s["configuration"]})
        if s["n"] >= 6:
            assert s["share_ci_low"] <= s["share_median"] <= s["share_ci_high"]
            assert s["cpu_seconds_ci_low"] <= s["cpu_seconds_median"] <= s["cpu_seconds_ci_high"]
            assert s["ci_coverage"] >= 0.95 and s["ci_note"] is None
        else:
            assert s["share_ci_low"] is None and s["ci_coverage"] is None
            assert s["ci_note"] == f"{s['n']} run{'s' if s['n'] != 1 else ''}; an interval needs 6"
