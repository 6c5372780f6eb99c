"""Damaged archives: a real capture, then its files cut, corrupted, given values of the wrong
type or missing fields. `report` (every format) either works or stops with one line naming the problem; never a
traceback. Property-based: hypothesis picks the field and the value."""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import examples, qprof
from qprof.archive import Run
from qprof.cli import print_report
from qprof.errors import QprofError

UDP_LOOP = ("import socket, time\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
            "s.bind(('127.0.0.1', 0))\na = s.getsockname()\nend = time.time() + 20\n"
            "while time.time() < end:\n    s.sendto(b'x' * 1200, a)\n    s.recv(2000)\n")


@pytest.fixture(scope="module")
def capture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One real run (a UDP sender/receiver with the server role, packetio probes), shared."""
    if shutil.which("perf") is None or subprocess.run(["id", "-u"], capture_output=True, text=True).stdout.strip() != "0":
        pytest.skip("needs root and perf for the real capture the fuzzing starts from")
    run = tmp_path_factory.mktemp("fuzz") / "run"
    target = subprocess.Popen([sys.executable, "-c", UDP_LOOP])
    try:
        qprof("attach", "--server", str(target.pid), "-d", "4", "-o", str(run), "-q")
    finally:
        target.kill()
        target.wait()
    return run


def report_ok_or_qprof_error(run: Path, fmt: str) -> None:
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            print_report([run], fmt, [], 5)
    except QprofError as e:
        assert "\n" not in str(e) and str(e)


def _paths(obj: Any, pre: tuple = ()) -> list[tuple]:
    out = [pre]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _paths(v, pre + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj[:3]):
            out += _paths(v, pre + (i,))
    return out


_DELETE = object()  # the field is removed instead of given a value
_values = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=False),
                    st.text(max_size=8), st.just([]), st.just({}), st.just([1, "x"]), st.just({"a": 1}),
                    st.just([{"min": "x"}]), st.just(_DELETE))


@settings(max_examples=examples(200), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_wrong_types_or_missing_fields_anywhere(capture: Path, tmp_path: Path, data: st.DataObject) -> None:
    fname = data.draw(st.sampled_from(["meta.json", "probes.json", "proc.jsonl"]))
    text = (capture / fname).read_text()
    jsonl = fname.endswith(".jsonl")  # proc.jsonl: one of its readings (a JSON document per line)
    docs = [json.loads(line) for line in text.splitlines()] if jsonl else [json.loads(text)]
    i = data.draw(st.integers(0, len(docs) - 1))
    doc = docs[i]
    path = data.draw(st.sampled_from([p for p in _paths(doc) if p]))
    value = data.draw(_values)
    node = doc
    for k in path[:-1]:
        node = node[k]
    if value is _DELETE:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    run = tmp_path / "r"
    shutil.rmtree(run, ignore_errors=True)
    shutil.copytree(capture, run)
    (run / fname).write_text("".join(json.dumps(d) + "\n" for d in docs) if jsonl else json.dumps(doc))
    report_ok_or_qprof_error(run, data.draw(st.sampled_from(["json", "text", "folded"])))


@settings(max_examples=examples(60), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(["meta.json", "probes.json", "proc.jsonl", "probe-packetio.jsonl", "stacks.jsonl.gz",
                             "probe-waits.series.jsonl", "probe-waits.jsonl", "tcp.json"]),
       cut=st.floats(0.0, 1.0), flip=st.booleans())
def test_cut_or_corrupted_files(capture: Path, tmp_path: Path, name: str, cut: float, flip: bool) -> None:
    assert (capture / name).is_file(), f"the capture has no {name}"
    run = tmp_path / "r"
    shutil.rmtree(run, ignore_errors=True)
    shutil.copytree(capture, run)
    data = bytearray((run / name).read_bytes())
    data = data[: int(len(data) * cut)]
    if flip and data:
        data[len(data) // 2] ^= 0x5A
    (run / name).write_bytes(bytes(data))
    if name == "probes.json":  # the raw probe output is then what report reads maps from
        (run / "probe-packetio.jsonl").write_bytes((capture / "probe-packetio.jsonl").read_bytes()[:1000])
    report_ok_or_qprof_error(run, "json")


def one_line(r: subprocess.CompletedProcess[str], *needles: str) -> str:
    assert "Traceback" not in r.stderr
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("qprof: error:")]
    assert r.returncode == 2 and len(errors) == 1, r.stderr
    for n in needles:
        assert n in errors[0], errors[0]
    return errors[0]


def test_cli_one_line_for_each_damage(capture: Path, tmp_path: Path) -> None:
    def fresh(name: str) -> Path:
        run = tmp_path / name
        shutil.copytree(capture, run)
        return run

    r = fresh("meta-cut")
    (r / "meta.json").write_bytes((capture / "meta.json").read_bytes()[:200])
    one_line(qprof("report", str(r), check=False), "meta.json", "unreadable metadata")
    r = fresh("meta-nan")
    doc = json.loads((capture / "meta.json").read_text())
    doc["duration_s"] = float("nan")  # json writes it as NaN, which JSON has not
    (r / "meta.json").write_text(json.dumps(doc))
    one_line(qprof("report", str(r), check=False), "NaN is not valid JSON")
    r = fresh("meta-type")
    meta = json.loads((capture / "meta.json").read_text())
    meta["targets"][0]["pid"] = "12"
    (r / "meta.json").write_text(json.dumps(meta))
    one_line(qprof("report", str(r), check=False), "targets[0].pid must be an integer")
    r = fresh("probes-garbage")
    (r / "probes.json").write_bytes(b"\x00\xffgarbage{")
    one_line(qprof("report", str(r), check=False), "probes.json", "unreadable probe record", "move it aside")
    r = fresh("probes-type")
    probes = json.loads((capture / "probes.json").read_text())
    probes["programs"]["packetio"]["maps"]["@windows"] = "lots"
    (r / "probes.json").write_text(json.dumps(probes))
    one_line(qprof("report", str(r), check=False), "programs['packetio'].maps['@windows']")
    r = fresh("stacks-cut")
    whole = (capture / "stacks.jsonl.gz").read_bytes()
    (r / "stacks.jsonl.gz").write_bytes(whole[: len(whole) // 2])
    assert not Run.open(r).raw_chunks(), "attach removes each chunk of raw data once folded"
    one_line(qprof("report", str(r), check=False), "stacks.jsonl.gz", "damaged stacks file", "record the run again")
    one_line(qprof("report", "--refold", str(r), check=False), "damaged stacks file", "cannot be folded again")
    # 200 bytes of garbage inside a reading in the middle: every figure from the readings could be off
    r = fresh("proc-garbage")
    text = (capture / "proc.jsonl").read_bytes()
    at = text.index(b"\n", len(text) // 2) - 40
    (r / "proc.jsonl").write_bytes(text[:at] + b"\x00garbage" * 25 + text[at:])
    line = text[:at].count(b"\n") + 1
    one_line(qprof("report", str(r), check=False), f"proc.jsonl:{line}: not a /proc reading", f"sed -i {line}d")
    subprocess.run(["sed", "-i", f"{line}d", str(r / "proc.jsonl")], check=True)  # what the advice says
    assert qprof("report", str(r), check=False).returncode == 0
    # a last line cut by a kill is no damage: the readings before it are the run's
    r = fresh("proc-cut")
    (r / "proc.jsonl").write_bytes(text[:-100])
    assert qprof("report", str(r), check=False).returncode == 0


def test_bpftrace_output_cut_mid_line_keeps_the_last_whole_snapshot(capture: Path, tmp_path: Path) -> None:
    """A run killed while the probes printed: maps come from the raw output, whose last line is cut."""
    run = tmp_path / "r"
    shutil.copytree(capture, run)
    probes = json.loads((run / "probes.json").read_text())
    del probes["programs"]["packetio"]["maps"]  # as written before the run ended
    (run / "probes.json").write_text(json.dumps(probes))
    lines = (capture / "probe-packetio.jsonl").read_text().splitlines(keepends=True)
    maps = [i for i, ln in enumerate(lines) if '"@windows"' in ln]
    assert len(maps) >= 2, "the probes printed their windows at least twice in 4 s"
    (run / "probe-packetio.jsonl").write_text("".join(lines[: maps[-1]]) + lines[maps[-1]][: len(lines[maps[-1]]) // 2])
    rep = json.loads(qprof("report", str(run), "--format", "json").stdout)
    assert rep["packet_io"]["processes"][str(rep["processes"][0]["pid"])]["tx"]["messages"] > 0


def test_gzip_stream_cut_at_every_tenth(capture: Path, tmp_path: Path) -> None:
    whole = (capture / "stacks.jsonl.gz").read_bytes()
    with gzip.open(capture / "stacks.jsonl.gz", "rt") as f:
        assert f.readline().strip()
    for i in range(1, 10):
        run = tmp_path / f"cut{i}"
        shutil.copytree(capture, run)
        (run / "stacks.jsonl.gz").write_bytes(whole[: len(whole) * i // 10])
        report_ok_or_qprof_error(run, "json")


@pytest.mark.parametrize("index", [0, 1, -4])
def test_damaged_window_series_name(capture: Path, tmp_path: Path, index: int) -> None:
    """A counter's name lost from the windows' series (an example the fuzzing above found in a CI run:
    the report's headline figures read it by name): the report still comes out, without estimates."""
    run = tmp_path / "run"
    shutil.copytree(capture, run)
    doc = json.loads((run / "probes.json").read_text())
    series = doc["programs"]["packetio"]["maps"]["@windows"]["series"]
    series[index] = ""
    (run / "probes.json").write_text(json.dumps(doc))
    for fmt in ("json", "text"):
        report_ok_or_qprof_error(run, fmt)
