"""`qprof mappings`, `mappings check`, `coverage` and `report --stack` through the real command line."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import qprof
from test_archive import _fake_run


pytestmark = pytest.mark.usefixtures("user_config")


def test_mappings_lists_shipped_files() -> None:
    out = qprof("mappings").stdout
    for name in ("common", "crypto", "ngtcp2"):
        assert name in out
    assert "user folder:" in out


def test_mappings_check_ok_and_error(tmp_path: Path) -> None:
    good = tmp_path / "good.toml"
    good.write_text('[mapping]\nname = "mine"\n\n[[rule]]\nsymbol = "^my_"\ncategory = "Crypto"\n')
    assert qprof("mappings", "check", str(good)).stdout.strip() == f"{good}: ok (mine 0, user, 1 rules)"
    bad = tmp_path / "bad.toml"
    bad.write_text('[mapping]\nname = "mine"\n\n[[rule]]\nsymbol = "^my_"\ncategory = "Cryptography"\n')
    r = qprof("mappings", "check", str(bad), check=False)
    assert r.returncode == 2 and r.stderr.startswith(f"qprof: error: {bad}:6: unknown category")


def test_coverage_suggests_rules_for_uncategorized(tmp_path: Path) -> None:
    run = _fake_run(tmp_path)
    out = qprof("coverage", str(run)).stdout
    # the fake client's only frame is its own `main`: Uncategorized, with a rule to start from
    assert "in main [/usr/bin/client]" in out
    assert "symbol = '^main$'" in out and "dso = '/client'" in out


def test_report_forced_stack(tmp_path: Path) -> None:
    run = _fake_run(tmp_path)
    r = qprof("report", str(run), "--stack", "nope", check=False)
    assert r.returncode == 2 and "unknown stack 'nope'" in r.stderr
    import json

    rep = json.loads(qprof("report", str(run), "--format", "json", "--stack", "ngtcp2").stdout)
    for p in rep["processes"]:
        assert any(m["name"] == "ngtcp2" and m["detected_by"] == "--stack" for m in p["mappings"])


def test_report_folded_stacks(tmp_path: Path) -> None:
    """stackcollapse-perf's shape: root (process) first, leaf last, kernel frames `_[k]`, sample counts."""
    run = _fake_run(tmp_path)
    lines = qprof("report", str(run), "--format", "folded").stdout.splitlines()
    counts = dict(line.rsplit(" ", 1) for line in lines)
    send = "gtlsserver;ngtcp2_conn_write_pkt;__libc_sendmsg;__sys_sendmsg_[k];udp_sendmsg_[k];ip_output_[k]"
    assert counts[send] == "4"
    assert sum(int(v) for v in counts.values()) == 14  # every sample of the fake run, once
