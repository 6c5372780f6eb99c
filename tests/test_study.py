"""`qprof study`: the study file's checks and the seeded, interleaved plan (pure), and a real 2 x 2 x 2 study
(ngtcp2 and quic-go, GSO on and off, two repetitions) stopped twice, by Ctrl-C and by a crash, and resumed:
finished runs kept untouched, the unfinished one moved aside, every run complete at the end."""

from __future__ import annotations

import csv
import json
import os
import re
import shlex
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st

from conftest import QPROF, qprof
from qprof import study as S
from qprof.errors import QprofError

BASIC = """seed = 7
repetitions = 3
[vars]
dir = "/srv"
[record]
ready = "udp:{port}"
[stacks.a]
server = "srv {server_args} -d {dir} 127.0.0.1 {port}"
client = "cli {client_args} 127.0.0.1 {port}"
[stacks.b]
server = "srvb {port}"
client = "clib {port}"
env = { B = "1" }
[settings.on]
[settings.off]
env = { X = "1" }
[settings.off.a]
server_args = "--no-gso"
"""


def _study(tmp_path: Path, text: str) -> S.Study:
    p = tmp_path / "s.toml"
    p.write_text(text)
    return S.load(p)


def test_plan_is_seeded_interleaved_and_complete(tmp_path: Path) -> None:
    s = _study(tmp_path, BASIC)
    runs = S.plan(s)
    assert len(runs) == 2 * 2 * 3 and [r.order for r in runs] == list(range(1, 13))
    assert sorted((r.stack, r.setting, r.rep) for r in runs) == sorted(
        (a, b, i) for a in ("a", "b") for b in ("on", "off") for i in (1, 2, 3))
    assert S.plan(_study(tmp_path, BASIC)) == runs, "the same seed, the same order"
    assert S.plan(_study(tmp_path, BASIC.replace("seed = 7", "seed = 8"))) != runs
    cells = [(r.stack, r.setting) for r in runs]
    assert cells != sorted(cells), "interleaved, not in blocks"
    assert runs[0].directory(Path("/o"), 3) == Path(f"/o/{runs[0].stack}/{runs[0].setting}/rep-0{runs[0].rep}")


def test_commands_take_the_setting_for_their_stack(tmp_path: Path) -> None:
    s = _study(tmp_path, BASIC)
    cmds, ready = S._commands(s, S.PlannedRun(1, "a", "off", 1), 4433)
    assert cmds[0].argv == ("srv", "--no-gso", "-d", "/srv", "127.0.0.1", "4433")
    assert cmds[1].argv == ("cli", "127.0.0.1", "4433") and dict(cmds[0].env) == {"X": "1"}
    assert ready.port == 4433
    cmds, _ = S._commands(s, S.PlannedRun(1, "b", "on", 1), 5000)
    assert cmds[0].argv == ("srvb", "5000") and dict(cmds[1].env) == {"B": "1"}


def test_configuration_is_what_a_run_measures_not_its_port(tmp_path: Path) -> None:
    """What each run's meta.json records: the stack's and setting's names, the commands as run but for the
    port (each run has its own), the environment; two repetitions record the same, two settings not."""
    s = _study(tmp_path, BASIC)
    c = S.configuration(s, S.PlannedRun(1, "a", "off", 1))
    assert (c.name, c.stack, c.setting, c.env) == ("a/off", "a", "off", {"X": "1"})
    assert c.commands == {"server": ["srv", "--no-gso", "-d", "/srv", "127.0.0.1", "{port}"],
                          "client": ["cli", "127.0.0.1", "{port}"]}
    assert S.configuration(s, S.PlannedRun(7, "a", "off", 3)) == c
    assert S.configuration(s, S.PlannedRun(1, "a", "on", 1)).key() != c.key()
    assert S.configuration(s, S.PlannedRun(1, "b", "off", 1)).env == {"B": "1", "X": "1"}


@pytest.mark.parametrize("edit, words", [
    (lambda t: t.replace("seed = 7", "seed = 'x'"), "seed: must be an integer"),
    (lambda t: t.replace("repetitions = 3", "repetitions = 0"), "repetitions: must be an integer from 1"),
    (lambda t: "colour = 1\n" + t, "colour: unknown key"),
    (lambda t: t + "colour = 1\n", "settings.off.a: unknown key 'colour'"),
    (lambda t: t.replace('server = "srvb {port}"\n', ""), "stacks.b.server: missing"),
    (lambda t: t.replace("srvb {port}", "srvb {prot}"), "unknown placeholder {prot}"),
    (lambda t: t.replace("[stacks.b]", "[stacks.'b c']"), "becomes a directory"),
    (lambda t: t.replace('server_args = "--no-gso"', "server_args = 3"), "settings.off.a.server_args: must be"),
    (lambda t: t.replace('env = { X = "1" }', "env = 5"), "settings.off.env: must be a table"),
    (lambda t: t.replace('[settings.on]', "[settings.on]\nnice = 1"), "unknown key 'nice'"),
    (lambda t: t.replace('ready = "udp:{port}"', 'ready = "udp:{port}"\nrate = 2'), "record.rate: unknown option"),
    (lambda t: t.replace('dir = "/srv"', 'port = "1"'), "vars.port: is set by qprof"),
    (lambda t: t.replace("[stacks.a]", "[stackz.a]"), "stackz: unknown key"),
    (lambda t: "x = [", "not a TOML file"),
])
def test_bad_study_files_are_one_line(tmp_path: Path, edit: Any, words: str) -> None:
    with pytest.raises(QprofError, match=words) as e:
        _study(tmp_path, edit(BASIC))
    assert "\n" not in str(e.value) and str(tmp_path / "s.toml") in str(e.value)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200))
def test_any_text_is_a_study_or_one_line(tmp_path_factory: pytest.TempPathFactory, text: str) -> None:
    p = tmp_path_factory.mktemp("fuzz") / "s.toml"
    p.write_text(text, encoding="utf-8", errors="surrogatepass") if "\ud800" not in text else p.write_bytes(b"\xff")
    try:
        S.load(p)
    except QprofError as e:
        assert "\n" not in str(e)


def test_a_changed_study_file_refuses_to_resume(tmp_path: Path) -> None:
    s = _study(tmp_path, BASIC)
    out = tmp_path / "out"
    S._start_or_resume(s, out, S.plan(s))
    plan = json.loads((out / S.PLAN).read_text())
    assert [o["dir"] for o in plan["order"]][:1] == [str(S.plan(s)[0].directory(out, 3).relative_to(out))]
    S._start_or_resume(s, out, S.plan(s))  # the same study resumes
    changed = _study(tmp_path, BASIC.replace("seed = 7", "seed = 9"))
    with pytest.raises(QprofError, match="study file changed since"):
        S._start_or_resume(changed, out, S.plan(changed))


def _finished(out: Path) -> list[Path]:
    return sorted(d for d in out.glob("*/*/rep-*") if S.finished(d))


def _wait_for(proc: subprocess.Popen[str], out: Path, n: int) -> None:
    deadline = time.monotonic() + 240
    while len(_finished(out)) < n:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the study made no progress"
        time.sleep(0.2)


def _started(out: Path, n: int) -> bool:
    """The (n+1)th run's archive is being written (its meta.json exists, not finished yet)."""
    return sum(1 for m in out.glob("*/*/rep-*/meta.json")) > n


@pytest.mark.root
@pytest.mark.slow
def test_real_study_interrupted_crashed_and_resumed(ngtcp2_tools: None, probes_available: None,
                                                     endpoint_build: Any, tmp_path: Path) -> None:
    from qprof.endpoints import make_certificate, make_payload

    srv = tmp_path / "srv"
    srv.mkdir()
    make_payload(srv, 32 << 20)
    key, cert = make_certificate(srv)
    q = endpoint_build("quicgo")
    qs = shlex.join(q.server("127.0.0.1:PORT", cert, key)).replace("PORT", "{port}")
    qc = shlex.join(q.client("127.0.0.1:PORT", 64 << 20)).replace("PORT", "{port}")
    study = tmp_path / "study.toml"
    study.write_text(f"""seed = 3
repetitions = 2
[vars]
payload = "{srv}"
key = "{key}"
cert = "{cert}"
[record]
ready = "udp:{{port}}"
[stacks.ngtcp2]
server = "gtlsserver -q --no-quic-dump --no-http-dump {{server_args}} -d {{payload}} 127.0.0.1 {{port}} {{key}} {{cert}}"
client = "gtlsclient -q --no-quic-dump --no-http-dump --exit-on-all-streams-close 127.0.0.1 {{port}} https://127.0.0.1:{{port}}/payload"
[stacks.quicgo]
server = {json.dumps(qs)}
client = {json.dumps(qc)}
[settings.gso-on]
[settings.gso-off.ngtcp2]
server_args = "--max-gso-dgrams=1"
[settings.gso-off.quicgo]
env = {{ QUIC_GO_DISABLE_GSO = "true" }}
""")
    out = tmp_path / "out"
    cmd = [*QPROF, "study", str(study), "-o", str(out), "-q"]
    # 1. Ctrl-C once two runs are finished: the run under way stops, the study says how to resume
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    _wait_for(p, out, 2)
    while not _started(out, len(_finished(out))):
        time.sleep(0.05)
    os.killpg(p.pid, signal.SIGINT)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 2 and "resume with: qprof study" in err, err
    first = {d: (d / "meta.json").stat().st_mtime_ns for d in _finished(out)}
    assert len(first) >= 2
    # 2. a crash (SIGKILL) in a later run: the targets die with qprof, the run is left unfinished
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    _wait_for(p, out, len(first) + 1)
    while not _started(out, len(_finished(out))):
        time.sleep(0.05)
    os.killpg(p.pid, signal.SIGKILL)
    p.communicate(timeout=60)
    second = {d: (d / "meta.json").stat().st_mtime_ns for d in _finished(out)}
    unfinished = [d for d in out.glob("*/*/rep-*") if d not in second]
    # 3. resumed to the end: what was finished is untouched, what was cut is kept aside and run again
    r = qprof("study", str(study), "-o", str(out), "-q")
    assert f"{len(second)} finished run(s) kept" in r.stderr
    done = _finished(out)
    assert len(done) == 8
    assert all((d / "meta.json").stat().st_mtime_ns == t for d, t in second.items())
    aside = list((out / S.PARTIAL).iterdir())
    assert len(aside) >= len(unfinished) >= 1
    assert all((a / "meta.json").exists() for a in aside), "what a cut run collected is kept"
    plan = json.loads((out / S.PLAN).read_text())
    assert sorted(o["dir"] for o in plan["order"]) == sorted(str(d.relative_to(out)) for d in done)
    table = list(csv.DictReader(open(out / "table.csv")))
    assert len(table) == 8 * 2 * 5  # runs x sides x categories
    for row in table:  # the study's cell and repetition in columns of their own, as each run recorded them
        stack, setting, rep = Path(row["run"]).relative_to(out).parts
        assert (row["configuration"], row["setting"], row["repetition"]) == (f"{stack}/{setting}", setting,
                                                                            str(int(rep.removeprefix("rep-"))))
    chart = (out / "chart.svg").read_text()
    assert chart.count('class="label"') == 2 * 8 + 4  # 4 cells x 2 sides in both panels, 4 cells' goodput
    assert chart.count('class="goodput"') == 4
    summary = list(csv.DictReader(open(out / "summary.csv")))
    assert {r["configuration"] for r in summary} == {f"{a}/{b}" for a in ("ngtcp2", "quicgo")
                                                     for b in ("gso-on", "gso-off")}
    assert all(float(r["goodput_gbps_median"]) > 0 and r["runs"] == "2" for r in summary)
    assert all(sum(int(n) for n in re.findall(r" x(\d+)", r["verdicts"])) == 2 for r in summary)  # each run's
    assert {r["goodput_ci_note"] for r in summary} == {"2 runs; an interval needs 6"}
    said = " ".join(r.stdout.split())
    assert "verdicts seen" in said and "ngtcp2/gso-off" in said and "n/a (2 runs; an interval needs 6)" in said
    for d in done:
        meta = json.loads((d / "meta.json").read_text())
        env = meta["record"]["commands"]
        assert ("--max-gso-dgrams=1" in env["server"]) == (d.parent.name == "gso-off" and d.parts[-3] == "ngtcp2")
        conf = meta["configuration"]
        assert (conf["stack"], conf["setting"]) == (d.parts[-3], d.parent.name)
        assert any("{port}" in word for word in conf["commands"]["client"])  # its own port left out
        assert d.name == f"rep-0{meta['record']['repetition']}" and meta["record"]["repetitions"] == 2
        assert conf["env"] == ({"QUIC_GO_DISABLE_GSO": "true"} if d.parts[-3:-1] == ("quicgo", "gso-off") else {})
    print(f"\nstudy: {len(first)} runs finished before Ctrl-C, {len(second)} before the crash, "
          f"{len(unfinished)} cut and kept aside, 8 of 8 at the end")
