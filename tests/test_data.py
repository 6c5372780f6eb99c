"""qprof.load and `qprof table` on real ngtcp2 transfers: shapes, sums, agreement with the JSON report,
files that read back, and bad input."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest

import qprof
from conftest import capture_ngtcp2, edited_meta, qprof as qprof_cli
from qprof.api import typed_report
from qprof.archive import Run
from qprof.viewer.frames import frame
from qprof.attribution.categories import CATEGORIES
from qprof.errors import QprofError
from qprof.viewer import rows as R
from qprof.collectors.perf import DEFAULT_FREQUENCY
from qprof.probes.registry import DEFAULT_GROUPS
from test_bad_input import one_line_error

pytestmark = [pytest.mark.root, pytest.mark.slow]
PAYLOAD = 1 << 30


@pytest.fixture(scope="module")
def runs(ngtcp2_tools: None, probes_available: None, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Three repetitions of one transfer, server and client attached with roles and the default probes;
    in DIR/rep-NN, so that a table places them (no configuration recorded: `attach`) as one's repetitions."""
    base = tmp_path_factory.mktemp("data")
    return [capture_ngtcp2(base / f"rep-0{i}", PAYLOAD) for i in range(1, 4)]


@pytest.fixture(scope="module")
def reports(runs: list[Path]) -> list[dict]:
    """What `qprof report --format json` prints for each run (the contract the frames must agree with)."""
    return [json.loads(qprof_cli("report", str(r), "--format", "json").stdout) for r in runs]


def test_load_frames_agree_with_the_json_report(runs: list[Path], reports: list[dict]) -> None:
    for run, report in zip(runs, reports):
        d = qprof.load(run)
        procs = {p["pid"]: p for p in report["processes"]}
        assert set(procs) == set(d.categories.pid) and len(procs) == 2
        assert tuple(d.categories.columns) == R.CATEGORY_COLUMNS
        assert len(d.categories) == 2 * len(CATEGORIES)
        for pid, g in d.categories.groupby("pid"):
            p = procs[pid]
            assert list(g.category) == list(CATEGORIES)
            assert g.share.sum() == pytest.approx(1, abs=1e-5)
            assert g.cpu_seconds.sum() == pytest.approx(p["cpu_seconds"], abs=1e-5)
            assert dict(zip(g.category, g.cpu_seconds)) == p["category_cpu_seconds"]
            assert dict(zip(g.category, g.share)) == p["categories"]
            assert g.samples.sum() == p["samples"] > 500
            assert set(g.role) == {p["role"]} and set(g["stack"]) == {"ngtcp2"}
        # every sample of a process is in exactly one symbol row
        sym = d.symbols.groupby("pid").agg(samples=("samples", "sum"), share=("share", "sum"),
                                           cpu=("cpu_seconds", "sum"))
        for pid, p in procs.items():
            assert sym.loc[pid, "samples"] == p["samples"]
            assert sym.loc[pid, "share"] == pytest.approx(1, abs=1e-3)
            assert sym.loc[pid, "cpu"] == pytest.approx(p["cpu_seconds"], rel=1e-3)
            # the report's top symbols are in the frame with the same figures, and none it leaves out is larger
            mine = d.symbols[d.symbols.pid == pid].set_index(["category", "symbol", "dso"])
            for c in CATEGORIES:
                for w in p["top_symbols"][c]:
                    assert tuple(mine.loc[(c, w["symbol"], w["dso"]), ["samples", "share", "cpu_seconds"]]) == \
                        (w["samples"], w["share"], w["cpu_seconds"])
                if p["top_symbols"][c]:
                    assert mine.loc[c].share.max() == p["top_symbols"][c][0]["share"]


def test_load_probes_verdict_and_meta(runs: list[Path], reports: list[dict]) -> None:
    d = qprof.load(runs[0])
    report = reports[0]
    roles = {p["role"]: p["pid"] for p in report["processes"]}
    per_process = d.probes[d.probes.tid.isna()].set_index("role")
    assert set(per_process.index) == {"server", "client"}
    # the payload went from the server to the client once, inside QUIC packets: counted whole, at least
    # the payload; counted in sampling windows, an estimate whose 95% interval reaches it
    for role, col in (("server", "tx_bytes"), ("client", "rx_bytes")):
        row = per_process.loc[role]
        assert row.counted in ("exact", "sampled"), row.counted
        if row.counted == "exact":
            assert row[col] >= PAYLOAD
        else:
            assert row[f"{col}_low"] <= row[col] <= row[f"{col}_high"] and row[f"{col}_high"] >= PAYLOAD, row
    assert per_process.loc["server", "tx_datagrams"] > 0 and per_process.loc["server", "ack_ratio"] > 0
    threads = d.probes[d.probes.tid.notna()]
    for role, pid in roles.items():
        mine = threads[threads.pid == pid]
        for col in ("tx_bytes", "rx_bytes", "tx_datagrams", "rx_syscalls"):
            assert mine[col].sum() == per_process.loc[role, col]
    assert list(d.verdict.role) == ["server", "client", "overall"]
    assert set(d.verdict.limited_by) == {report["verdict"]["limited_by"]}
    ev = d.verdict.set_index("role")
    assert ev.loc["server", "goodput_gbps"] == report["verdict"]["evidence"]["server"]["goodput_gbps"]
    assert len(d.meta) == 1
    meta = d.meta.iloc[0]
    assert meta.samples == sum(p["samples"] for p in report["processes"])
    assert meta.hostname == os.uname().nodename and meta.probes == ",".join(DEFAULT_GROUPS) and meta.frequency == DEFAULT_FREQUENCY
    assert meta.verdict == report["verdict"]["limited_by"] and meta["stack"] == "ngtcp2"
    assert d.report["run"]["path"] == str(runs[0])


def test_table_csv_and_summary(runs: list[Path], tmp_path: Path) -> None:
    out, summary = tmp_path / "t.csv", tmp_path / "s.csv"
    r = qprof_cli("table", *map(str, runs), "--csv", str(out), "--summary-csv", str(summary))
    assert out.name in r.stderr and r.stdout == ""
    t = pd.read_csv(out)
    assert tuple(t.columns) == R.TABLE_COLUMNS and len(t) == 3 * 2 * len(CATEGORIES)
    assert list(dict.fromkeys(t.run)) == [str(r) for r in runs]
    for run in runs:
        cats = qprof.load(run).categories
        mine = t[t.run == str(run)].reset_index(drop=True)
        assert list(mine.share) == pytest.approx(list(cats.share), abs=1e-9)
        assert list(mine.samples) == list(cats.samples)
        assert mine.groupby("pid").share.sum().to_numpy() == pytest.approx(1, abs=1e-5)
    assert set(t.verdict) <= {"server-limited", "client-limited", "both", "neither"}
    # the table carries the report's figure (an estimate when sampled: test_load_probes_verdict_and_meta)
    for run in runs:
        server = qprof.load(run).probes.query("role == 'server' and tid.isna()", engine="python")
        assert set(t[(t.run == str(run)) & (t.role == "server")].tx_bytes) == set(server.tx_bytes)
    s = pd.read_csv(summary)
    assert tuple(s.columns) == R.SUMMARY_COLUMNS and len(s) == 2 * len(CATEGORIES)
    assert (s.n == 3).all() and s.share_ci_low.isna().all() and (s.ci_note == "3 runs; an interval needs 6").all()
    assert (s.runs == 3).all() and (s.goodput_gbps_median > 0).all()
    assert all(sum(int(n) for n in re.findall(r" x(\d+)", v)) == 3 for v in s.verdicts)  # each run's verdict
    for _, row in s.iterrows():
        shares = t[(t.role == row.role) & (t.category == row.category)].share
        assert row.share_median == pytest.approx(shares.median(), abs=1e-9)


def test_table_parquet_round_trip(runs: list[Path], tmp_path: Path) -> None:
    out, summary = tmp_path / "t.parquet", tmp_path / "s.parquet"
    qprof_cli("table", *map(str, runs), "--parquet", str(out), "--summary-parquet", str(summary))
    places = R.place_runs([(str(r), Run.open(r).meta) for r in runs])
    table_rows = [row for r, p in zip(runs, places) for row in R.table_rows(typed_report(r, top=1), p)]
    pd.testing.assert_frame_equal(pd.read_parquet(out), frame([r.cells() for r in table_rows], R.TABLE_COLUMNS))
    pd.testing.assert_frame_equal(pd.read_parquet(summary),
                                  frame([s.cells() for s in R.summary_rows(table_rows)], R.SUMMARY_COLUMNS))


def test_table_on_the_terminal(runs: list[Path]) -> None:
    r = qprof_cli("table", *map(str, runs[:2]))
    out = " ".join(r.stdout.split())  # rich wraps at the terminal's width
    assert runs[0].name in out and runs[1].name in out and "ngtcp2" in out
    assert "summary over runs" in out and "n/a (2 runs; an interval needs 6)" in out


def test_table_bad_input(runs: list[Path], tmp_path: Path) -> None:
    one_line_error(qprof_cli("table", str(tmp_path / "nope"), check=False), "nope is not a run directory")
    one_line_error(qprof_cli("table", str(runs[0]), "--csv", str(tmp_path / "no-dir" / "t.csv"), check=False),
                   "does not exist")
    one_line_error(qprof_cli("table", str(runs[0]), "--parquet", "/proc/qprof-table.parquet", check=False),
                   "cannot write /proc/qprof-table.parquet")
    one_line_error(qprof_cli("table", str(runs[0]), "--csv", str(tmp_path), check=False), "is a directory")
    one_line_error(qprof_cli("table", str(runs[0]), "--csv", "a.csv", "--parquet", "a.parquet", check=False),
                   "both --csv and --parquet")
    one_line_error(qprof_cli("table", str(runs[0]), str(runs[0]), check=False), "given twice")
    cut = tmp_path / "cut"
    shutil.copytree(runs[0], cut, ignore=shutil.ignore_patterns("*.data", "stacks.jsonl.gz"))
    # on the host that recorded it, without raw data: nothing to refold
    one_line_error(qprof_cli("table", str(cut), check=False), "no folded stacks and no perf data to fold",
                   "record the run again")
    assert not (tmp_path / "no-dir").exists() and not list(tmp_path.glob(".*.tmp"))
    with pytest.raises(QprofError, match="no folded stacks"):
        qprof.load(cut)
    # elsewhere (another boot), the raw data may still be where it was recorded
    with edited_meta(cut) as meta:
        assert meta.collector is not None
        meta.collector.boot_id = "another-boot"
    one_line_error(qprof_cli("table", str(cut), check=False), "no folded stacks", "--refold",
                   "on the host that recorded it")
