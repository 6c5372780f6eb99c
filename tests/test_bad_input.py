"""Bad input and failing facilities: one clear line, non-zero exit, no traceback, nothing lost."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import as_nobody, qprof
from qprof import archive
from qprof.archive import Run
from qprof.archive.model import STATUS_COMPLETE, Meta


def one_line_error(r: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("qprof: error: "), r.stderr
    assert "Traceback" not in r.stderr
    for n in needles:
        assert n in lines[0], lines[0]


def test_no_such_pid(kernel_facing: None, tmp_path: Path) -> None:
    r = qprof("attach", "4194303", "-d", "1", "-o", str(tmp_path / "r"), check=False)
    one_line_error(r, "no process with pid 4194303")
    assert not (tmp_path / "r").exists(), "nothing is created for a bad pid"


@pytest.mark.parametrize("args,needle", [
    (["0"], "not a valid pid"),
    (["--", "-5"], "not a valid pid"),
    (["99999999999999999999"], "not a valid pid"),
    (["abc"], "'abc' is not a valid integer"),
    (["--server", "x1"], "'x1' is not a valid integer"),
    (["--bogus", "1"], "No such option"),
    (["-d", "-5", "1"], "--duration"),
    (["-d", "1e12", "1"], "--duration"),
    (["-d", "nan", "1"], "--duration"),
    (["-d", "inf", "1"], "--duration"),
    (["-d", "0", "1"], "--duration"),
    (["-F", "0", "1"], "--frequency"),
    (["-F", "99999999999999999999", "1"], "--frequency"),
    (["--raw-budget", "inf", "1"], "is not a size"),
    (["--chunk-size", "-1M", "1"], "out of range"),
    (["--chunk-size", "1K", "1"], "--chunk-size"),
    (["--probes", "packetio,evil", "1"], "unknown probe group evil"),
])
def test_bad_arguments(tmp_path: Path, args: list[str], needle: str) -> None:
    sep = args.index("--") if "--" in args else len(args)  # options go before a `--`
    one_line_error(qprof("attach", *args[:sep], "-o", str(tmp_path / "r"), *args[sep:], check=False), needle)
    assert not (tmp_path / "r").exists()


def test_report_usage_errors(tmp_path: Path) -> None:
    one_line_error(qprof("report", check=False), "Missing argument")
    one_line_error(qprof("report", str(tmp_path), "--top", "0", check=False), "--top")
    one_line_error(qprof("nosuch", check=False), "No such command")


def test_output_path_problems(kernel_facing: None, tmp_path: Path) -> None:
    busy = subprocess.Popen(["sleep", "30"])
    try:
        (tmp_path / "full").mkdir()
        (tmp_path / "full" / "x").write_text("x")
        one_line_error(qprof("attach", str(busy.pid), "-d", "1", "-o", str(tmp_path / "full"), check=False),
                       "not empty")
        (tmp_path / "file").write_text("x")
        one_line_error(qprof("attach", str(busy.pid), "-d", "1", "-o", str(tmp_path / "file"), check=False),
                       "not a directory")
        (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
        one_line_error(qprof("attach", str(busy.pid), "-d", "1", "-o", str(tmp_path / "link"), check=False),
                       "symbolic link")
    finally:
        busy.kill()
        busy.wait()


def test_target_exits_during_attach_keeps_the_run(kernel_facing: None, tmp_path: Path) -> None:
    busy = subprocess.Popen([sys.executable, "-c",
                             "import time\nend=time.time()+4\nwhile time.time()<end: pass"])
    run = tmp_path / "r"
    t0 = time.monotonic()
    r = qprof("attach", str(busy.pid), "-d", "30", "-o", str(run), check=False)
    busy.wait()
    assert r.returncode == 0, r.stderr
    assert time.monotonic() - t0 < 20, "attach ends when its only target exits"
    meta = Run.open(run).meta
    assert meta.status == "complete" and meta.stop_reason == "every target exited"
    assert meta.exited == [busy.pid]
    report = json.loads(qprof("report", str(run), "--format", "json").stdout)
    (p,) = report["processes"]
    assert p["pid"] == busy.pid and p["samples"] > 300


def test_not_root(kernel_facing: None, tmp_path: Path) -> None:
    tmp_path.chmod(0o777)
    r = as_nobody(["attach", str(os.getpid()), "-d", "1", "-o", str(tmp_path / "r")], tmp_path)
    one_line_error(r, "not root", "CAP_PERFMON")


def test_perf_missing(kernel_facing: None, tmp_path: Path) -> None:
    busy = subprocess.Popen(["sleep", "30"])
    try:
        env = {**os.environ, "PATH": str(tmp_path)}  # an empty directory: no perf on PATH
        r = qprof("attach", str(busy.pid), "-d", "1", "-o", str(tmp_path / "r"), check=False, env=env)
        one_line_error(r, "perf not found", "linux-perf")
    finally:
        busy.kill()
        busy.wait()


def test_report_on_bad_archives(tmp_path: Path) -> None:
    one_line_error(qprof("report", str(tmp_path / "nope"), check=False), "not a run directory")
    (tmp_path / "empty").mkdir()
    one_line_error(qprof("report", str(tmp_path / "empty"), check=False), "no meta.json")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "meta.json").write_text("{not json")
    one_line_error(qprof("report", str(bad), check=False), "unreadable metadata")


def test_report_with_broken_mapping(tmp_path: Path) -> None:
    m = tmp_path / "m.toml"
    m.write_text('[mapping]\nname = "x"\n\n[[rule]]\nsymbol = "(unclosed"\ncategory = "Crypto"\n')
    run = tmp_path / "run"
    run.mkdir()
    archive.write_meta(run, Meta())
    from qprof.archive.stacks import write_stacks

    write_stacks(run / "stacks.jsonl.gz", [])
    one_line_error(qprof("report", str(run), "--mapping", str(m), check=False), f"{m}:5:", "regular expression")


def _run_with_symbol(tmp_path: Path, symbol: str) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    archive.write_meta(run, Meta(status=STATUS_COMPLETE))
    from qprof.archive.stacks import Sample, fold, write_stacks

    write_stacks(run / "stacks.jsonl.gz", fold([Sample(7, 7, "x", 1000, ((symbol, "/usr/bin/x"),))]))
    return run


def test_catastrophic_mapping_pattern_refused_with_file_line(tmp_path: Path) -> None:
    m = tmp_path / "m.toml"
    m.write_text('[mapping]\nname = "x"\n\n[[rule]]\nsymbol = \'(a+)+$\'\ncategory = "Crypto"\n')
    run = _run_with_symbol(tmp_path, "a" * 5000 + "!")
    one_line_error(qprof("report", str(run), "--mapping", str(m), check=False), f"{m}:5:", "nested repeats")
    one_line_error(qprof("mappings", "check", str(m), check=False), f"{m}:5:")


def test_catastrophic_pattern_that_loads_stops_in_bounded_time(tmp_path: Path) -> None:
    m = tmp_path / "m.toml"
    m.write_text('[mapping]\nname = "x"\n\n[[rule]]\nsymbol = \'(a|aa)+$\'\ncategory = "Crypto"\n')
    run = _run_with_symbol(tmp_path, "a" * 80 + "!")
    t0 = time.monotonic()
    r = qprof("report", str(run), "--mapping", str(m), check=False, timeout=60)
    assert time.monotonic() - t0 < 30
    one_line_error(r, f"{m}:5:", "catastrophic backtracking")


def test_mapping_file_is_data_not_code(tmp_path: Path) -> None:
    """Strings that would run if anything evaluated them are only patterns and names."""
    canary = tmp_path / "canary"
    m = tmp_path / "m.toml"
    m.write_text('[mapping]\nname = "x"\ndescription = "__import__(\'os\').system(\'touch %s\')"\n'
                 '[[rule]]\nsymbol = "__import__\\\\(.os.\\\\)"\nsubcategory = "$(touch %s)"\n'
                 'category = "Crypto"\n' % (canary, canary))
    run = _run_with_symbol(tmp_path, "__import__('os')")
    rep = json.loads(qprof("report", str(run), "--mapping", str(m), "--format", "json").stdout)
    assert rep["processes"][0]["categories"]["Crypto"] == 1.0
    assert not canary.exists()
