"""`qprof table` over the directories of two settings, through the real command line on made-up archives
(test_archive's, each given the configuration and repetition a study records and a TCP transfer): runs
named by their path, configurations never pooled, goodput and verdicts in every summary, the note for
runs without a configuration and the warning for pooled runs measured differently. The same over real
study runs: tests/test_study.py."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import pytest

from conftest import edited_meta, qprof
from qprof import archive, runfiles
from qprof.archive import schema
from qprof.archive.model import Configuration, RecordEntry, TcpCounters, TcpRecord, TcpSocket
from qprof.attribution.categories import CATEGORIES
from test_archive import SERVER, _fake_run

pytestmark = pytest.mark.usefixtures("user_config")

MB = 1_000_000


def _study_run(tmp_path: Path, where: Path, setting: str | None, rep: int, sent_mb: int) -> Path:
    """A made-up archive at `where` as `qprof study` leaves one: its configuration (ngtcp2 under
    `setting`; None: none recorded, as `attach` leaves) and repetition in meta.json, its server having
    sent `sent_mb` MB over TCP over its 1 s of /proc readings."""
    src = _fake_run(tmp_path / f"made-{setting}-{rep}")
    where.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(src, where)
    with edited_meta(where) as meta:
        meta.record = RecordEntry(rep, 2)
        if setting is not None:
            meta.configuration = Configuration(setting, "ngtcp2", {"server": ["gtlsserver", "{port}"]})
    moved = TcpCounters(sent_mb * MB, 0, sent_mb * MB)
    archive.write_json_atomic(where / runfiles.TCP, schema.encode(TcpRecord([TcpSocket(SERVER, TcpCounters(0, 0),
                                                                                       moved)])))
    return where


@pytest.fixture
def study(tmp_path: Path) -> Path:
    """study/ngtcp2/{gso-on,gso-off}/rep-0{1,2}: GSO on moved twice what GSO off moved."""
    root = tmp_path / "study"
    for setting, mb in (("gso-on", 250), ("gso-off", 125)):
        for rep in (1, 2):
            _study_run(tmp_path, root / "ngtcp2" / setting / f"rep-0{rep}", setting, rep, mb + rep)
    return root


def test_two_settings_are_two_configurations_with_goodput_and_verdicts(study: Path, tmp_path: Path) -> None:
    runs = sorted(map(str, study.glob("ngtcp2/*/rep-*")))
    summary, table = tmp_path / "s.csv", tmp_path / "t.csv"
    r = qprof("table", *runs, "--summary-csv", str(summary))
    lines = r.stdout.splitlines()
    # the runs named by their path under the common root, not a bare rep-01 both settings have
    assert {ln.split()[0] for ln in lines if "server" in ln.split()[:3]} == \
        {"gso-off/rep-01", "gso-off/rep-02", "gso-on/rep-01", "gso-on/rep-02"}
    s = list(csv.DictReader(open(summary)))
    assert len(s) == 2 * 3 * len(CATEGORIES)  # two configurations x (server, client, a child) x categories
    by = {(row["configuration"], row["role"]): row for row in s if row["category"] == "Crypto"}
    on, off = by[("ngtcp2/gso-on", "server")], by[("ngtcp2/gso-off", "server")]
    assert (on["setting"], on["n"], on["runs"], off["setting"], off["n"]) == ("gso-on", "2", "2", "gso-off", "2")
    assert float(on["goodput_gbps_median"]) == pytest.approx(2.012) and \
        float(off["goodput_gbps_median"]) == pytest.approx(1.012)
    assert on["goodput_ci_note"] == on["ci_note"] == "2 runs; an interval needs 6"
    assert on["verdicts"].endswith(" x2") and on["method_differs"] == "" and on["configuration_recorded"] == "True"
    assert r.stderr == f"qprof: csv summary ({len(s)} rows) written to {summary} ({summary.stat().st_size:,} bytes)\n"
    # on the terminal: each configuration's goodput, its missing interval and how many runs one needs
    said = qprof("table", *runs).stdout
    row = next(ln for ln in said.splitlines() if ln.startswith("ngtcp2/gso-on "))
    assert row.split()[1:3] == ["2", "2.01"] and "n/a (2 runs; an interval needs 6)" in row and " x2" in row
    qprof("table", *runs, "--csv", str(table))
    t = list(csv.DictReader(open(table)))
    assert {(Path(x["run"]).parent.name, x["setting"], x["repetition"]) for x in t} == \
        {(c, c, str(i)) for c in ("gso-on", "gso-off") for i in (1, 2)}


def test_runs_without_a_configuration_and_runs_measured_differently_say_so(study: Path, tmp_path: Path) -> None:
    old = _study_run(tmp_path, tmp_path / "old" / "gso-on" / "rep-01", None, 1, 100)
    with edited_meta(study / "ngtcp2" / "gso-off" / "rep-02") as meta:
        meta.sampling.frequency = 4999
    runs = [*map(str, study.glob("ngtcp2/*/rep-*")), str(old)]
    r = qprof("table", *runs)
    out = " ".join(r.stdout.split())
    # the old run, a `gso-on` by its path, is not pooled with the study's ngtcp2/gso-on
    assert "old/gso-on/rep-01" in out and "ngtcp2/gso-on/rep-01" in out
    warning = next(ln for ln in r.stdout.splitlines() if ln.startswith("warning:"))
    assert "sampling rate (999 Hz vs 4999 Hz) in ngtcp2/gso-off (server, client, child): sample counts" \
        in warning
    assert "note: 1 run (gso-on) has no configuration in meta.json" in out
    summary = tmp_path / "s.csv"
    r = qprof("table", *runs, "--summary-csv", str(summary))
    said = r.stderr.splitlines()
    assert said[1].startswith("qprof: warning: runs pooled into one summary row were measured differently")
    assert said[2].startswith("qprof: note: 1 run (gso-on) has no configuration") and len(said) == 3
    confs = {row["configuration"]: row for row in csv.DictReader(open(summary))}
    assert set(confs) == {"ngtcp2/gso-on", "ngtcp2/gso-off", "gso-on"}
    assert confs["gso-on"]["configuration_recorded"] == "False"
