"""`qprof record`: the ready conditions and options (pure), and real recordings: an ngtcp2 pair
repeated, one process alone, and every way a command can fail (one line each, archives kept)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import QPROF, ROOT, build_c, qprof
from qprof.endpoints import launches, make_certificate, make_payload
from qprof.errors import QprofError
from qprof.ready import Ready, ReadyCheck, parse_ready, port_bound, serving
from qprof.archive.model import Configuration
from qprof.benchmark import Command, RecordOptions, commands_of, parse_command


# -- pure: options and conditions

@pytest.mark.parametrize("text, want", [
    ("auto", Ready()), ("udp:4433", Ready("udp", port=4433)), ("TCP:443", Ready("tcp", port=443)),
    ("line:^ACCEPT", Ready("line", pattern="^ACCEPT")), ("delay:0.5", Ready("delay", delay_s=0.5)),
])
def test_ready_conditions_parse(text: str, want: Ready) -> None:
    assert parse_ready(text) == want


@pytest.mark.parametrize("text, words", [
    ("udp:0", "not a port"), ("tcp:http", "not a port"), ("line:(", "not a regular expression"),
    ("delay:-1", "give a delay"), ("delay:99", "give a delay"), ("port:80", "is not a condition"),
    ("auto:1", "is not a condition"), ("line:", "is not a condition"),
])
def test_bad_ready_conditions_are_one_line(text: str, words: str) -> None:
    with pytest.raises(QprofError, match=words) as e:
        parse_ready(text)
    assert "\n" not in str(e.value)


def test_commands_and_archive_names() -> None:
    assert parse_command("server", "srv -d 'a dir' 4433").argv == ("srv", "-d", "a dir", "4433")
    with pytest.raises(QprofError, match="quotes"):
        parse_command("client", "cli 'open")
    with pytest.raises(QprofError, match="together"):
        commands_of("srv", None, ())
    with pytest.raises(QprofError, match="not both"):
        commands_of("srv", "cli", ("x",))
    pair = commands_of("srv 1", "cli 2", ())
    assert [c.role for c in pair] == ["server", "client"]
    assert RecordOptions(pair, Path("d")).run_dir(1) == Path("d")
    many = RecordOptions(pair, Path("d"), repeat=12)
    assert [many.run_dir(i) for i in (1, 12)] == [Path("d/rep-01"), Path("d/rep-12")]
    # what each repetition records it measures: the series (named after -o), its commands
    assert many.configuration == Configuration("d", commands={"server": ["srv", "1"], "client": ["cli", "2"]})
    with pytest.raises(QprofError, match="--repeat"):
        RecordOptions(pair, Path("d"), repeat=0)
    with pytest.raises(QprofError, match="together"):
        RecordOptions([Command("client", ("x",))], Path("d"))


def test_ready_checks_see_real_sockets_and_lines(tmp_path: Path) -> None:
    """A real process binding a UDP port, listening on TCP, and printing a line: each condition is
    false before and true after, read from /proc alone."""
    out = tmp_path / "out.log"
    script = ("import socket, sys, time\n"
              "u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind(('127.0.0.1', 0))\n"
              "t = socket.socket(); t.bind(('127.0.0.1', 0)); time.sleep(0.3); t.listen()\n"
              "print('ports', u.getsockname()[1], t.getsockname()[1], flush=True); time.sleep(30)\n")
    with open(out, "wb") as f:
        p = subprocess.Popen([sys.executable, "-c", script], stdout=f)
    try:
        t0 = time.monotonic()
        line = ReadyCheck(Ready("line", pattern=r"^ports \d+"), p.pid, out, t0)
        assert not serving(p.pid) or line.met(t0)  # the UDP socket alone may be there already
        while not line.met(time.monotonic()):
            assert time.monotonic() - t0 < 20 and p.poll() is None
            time.sleep(0.02)
        udp, tcp = (int(x) for x in out.read_text().split()[1:3])
        assert port_bound("udp", udp, p.pid) and port_bound("tcp", tcp, p.pid)
        assert not port_bound("tcp", udp, p.pid) or udp == tcp
        assert serving(p.pid)
        with socket.socket() as free:
            free.bind(("127.0.0.1", 0))  # bound, not listening: not a TCP port that is ready
            assert not port_bound("tcp", free.getsockname()[1], p.pid)
        delay = ReadyCheck(Ready("delay", delay_s=0.5, timeout_s=1.0), p.pid, out, t0)
        assert delay.met(t0 + 0.5) and not delay.met(t0 + 0.4) and delay.timed_out(t0 + 1.1)
    finally:
        p.kill()
        p.wait()


# -- real recordings

@pytest.fixture
def ngtcp2_files(tmp_path: Path) -> tuple[Path, Path, Path]:
    d = tmp_path / "srv"
    d.mkdir()
    make_payload(d, 32 << 20)
    key, cert = make_certificate(d)
    return d, key, cert


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.root
@pytest.mark.slow
def test_record_ngtcp2_pair_repeated(ngtcp2_tools: None, probes_available: None, ngtcp2_files: tuple[Path, Path, Path],
                                     tmp_path: Path, user_config: Path) -> None:
    """Two repetitions of a real ngtcp2 download: one archive each, both targets attached from exec with
    their roles, the client released only once the server's port was bound, the whole file received, and
    the table summary printed."""
    d, key, cert = ngtcp2_files
    port = _free_udp_port()
    out = tmp_path / "rec"
    server = f"gtlsserver -q --no-quic-dump --no-http-dump -d {d} 127.0.0.1 {port} {key} {cert}"
    client = (f"gtlsclient -q --no-quic-dump --no-http-dump --exit-on-all-streams-close 127.0.0.1 {port} "
              f"https://127.0.0.1:{port}/payload")
    r = qprof("record", "-q", "-n", "2", "-o", str(out), "--ready", f"udp:{port}", "--server", server,
              "--client", client)
    runs = [out / "rep-01", out / "rep-02"]
    assert r.stdout.splitlines()[:2] == [str(p) for p in runs]
    assert "summary over runs" in r.stdout and "ngtcp2" in r.stdout
    for i, run in enumerate(runs, 1):
        meta = json.loads((run / "meta.json").read_text())
        rec = meta["record"]
        assert meta["configuration"] == {"setting": "rec", "stack": None, "commands": rec["commands"], "env": {}}
        assert (rec["repetition"], rec["repetitions"]) == (i, 2)
        assert meta["status"] == "complete" and meta["stop_reason"] == "the client exited"
        assert rec["exit"]["client"] == 0 and rec["failures"] == [] and rec["ready"] == f"UDP port {port} bound"
        assert rec["ready_after_s"] is not None and rec["client_s"] > 0
        assert {t["role"]: t["comm"] for t in meta["targets"]} == {"server": "gtlsserver", "client": "gtlsclient"}
        assert (run / "output-server.log").is_file() and (run / "output-client.log").is_file()
        report = json.loads(qprof("report", str(run), "--format", "json").stdout)
        client_io = report["packet_io"]["processes"][str(rec_pid(meta, "client"))]
        # the probes saw the client from its first packet: it received the file and more (headers, tags)
        received = client_io["estimates"]["rx.bytes"]
        high = received["interval"][1] if received["interval"] else None
        assert high is None or high >= 32 << 20, received


def rec_pid(meta: dict, role: str) -> int:
    return next(int(t["pid"]) for t in meta["targets"] if t["role"] == role)


@pytest.mark.root
def test_record_one_process(kernel_facing: None, tmp_path: Path, user_config: Path) -> None:
    """`qprof record -- CMD`: held from exec, released once sampling runs, stopped when it exits."""
    out = tmp_path / "one"
    spin = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.5: pass\n"
    r = qprof("record", "-q", "--probes", "none", "-o", str(out), "--", sys.executable, "-c", spin)
    assert r.stdout.splitlines()[0] == str(out)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["stop_reason"] in ("every target exited", "the command exited")
    assert meta["record"]["exit"] == {"command": 0}
    report = json.loads(qprof("report", str(out), "--format", "json").stdout)
    (proc,) = report["processes"]
    # held from exec: the whole 0.5 s of CPU is in the samples (1 ms each; tolerance: start-up and exit)
    assert 0.45 <= proc["cpu_seconds"] <= 1.5, proc["cpu_seconds"]


@pytest.mark.root
@pytest.mark.parametrize("args, line, kept", [
    (["--server", "qprof-no-such-program 1", "--client", "true"],
     "server `qprof-no-such-program 1` could not start: No such file or directory", False),
    (["--server", "sh -c 'echo boom; exit 3'", "--client", "true"],
     "server `sh -c 'echo boom; exit 3'` exited before it was ready (exit 3): boom", False),
    (["--ready-timeout", "1", "--server", "sleep 20", "--client", "true"],
     "server `sleep 20` was not ready after 1 s (waited for a listening TCP or bound UDP socket", False),
    (["--ready", "delay:0.2", "--server", "sleep 20", "--client", "sh -c 'echo bad >&2; exit 4'"],
     "client `sh -c 'echo bad >&2; exit 4'` exited with status 4: bad", True),
])
def test_failing_commands_are_one_line_and_keep_earlier_archives(kernel_facing: None, tmp_path: Path,
                                                                 args: list[str], line: str, kept: bool) -> None:
    """A failing repetition is one line naming the command; archives written before it stay as they were;
    a repetition whose client never ran leaves no directory."""
    out = tmp_path / "rec"
    r = qprof("record", "-q", "--probes", "none", "-n", "3", "-o", str(out), *args, check=False)
    assert r.returncode == 2
    errors = r.stderr.strip().splitlines()
    assert errors[0].startswith(f"qprof: error: repetition 1: {line}"), r.stderr
    assert errors[-1].startswith("qprof: record failed at repetition 1 of 3") and len(errors) == 2, r.stderr
    assert (out / "rep-01").is_dir() == kept and not (out / "rep-02").exists()
    if kept:
        meta = json.loads((out / "rep-01" / "meta.json").read_text())
        assert meta["record"]["failures"] == [line]


@pytest.mark.root
def test_a_later_failure_keeps_the_archives_before_it(kernel_facing: None, tmp_path: Path) -> None:
    flag = tmp_path / "started-once"
    server = f"sh -c 'if [ -e {flag} ]; then echo again; exit 5; fi; touch {flag}; exec sleep 20'"
    out = tmp_path / "rec"
    r = qprof("record", "-q", "--probes", "none", "-n", "3", "-o", str(out), "--ready", "delay:0.2",
              "--server", server, "--client", "sleep 0.3", check=False)
    assert r.returncode == 2 and r.stdout.splitlines()[0] == str(out / "rep-01")
    assert "repetition 2: server" in r.stderr and "exited before it was ready (exit 5): again" in r.stderr
    assert f"archives kept: {out / 'rep-01'}" in r.stderr
    meta = json.loads((out / "rep-01" / "meta.json").read_text())
    assert meta["status"] == "complete" and meta["record"]["exit"]["client"] == 0
    assert not (out / "rep-02").exists()
    qprof("report", str(out / "rep-01"))


@pytest.mark.parametrize("argv, how", [
    (["taskset", "-c", "0", "prog", "-p", "443"], "exec"),  # the program's own -p is not taskset's
    (["taskset", "-p", "123"], None), (["taskset", "-ap", "1", "123"], None),
    (["env", "A=1", "prog"], "exec"), (["env", "A=1"], None), (["env", "-i", "-u", "X", "prog"], "exec"),
    (["ip", "netns", "exec", "ns1", "prog"], "exec"), (["ip", "netns", "list"], None),
    (["nice", "-n", "5", "prog"], "exec"), (["numactl", "--physcpubind=0", "prog"], "exec"),
    (["numactl", "--show"], None),
    (["bash", "-c", "prog a b"], "exec"), (["dash", "-c", "prog a b"], "child"),
    (["dash", "-c", "exec prog a"], "exec"), (["bash", "-c", "a; b"], None), (["dash", "-c", "a | b"], None),
    (["gtlsserver", "-q"], None),
])
def test_wrappers_are_told_from_programs(argv: list[str], how: str | None) -> None:
    """What `record` follows to the program's exec: wrappers that exec their command, a shell that runs
    one command in a child; never a wrapper acting on another pid or printing, nor a real script."""
    assert launches(f"/usr/bin/{argv[0]}", argv) == how


def test_the_observer_line_counts_everything_attach_ran(kernel_facing: None, tmp_path: Path) -> None:
    """What the report says qprof ran beside the targets is what the kernel charged to `qprof attach`
    and every program it reaped (its rusage, as /usr/bin/time reads it), less what it did after its
    last reading: writing meta.json and exiting."""
    spin = build_c(ROOT / "tests" / "workloads" / "spin.c", "spin", ["-static", "-nostdlib", "-O0"])
    target = subprocess.Popen([str(spin), "3"])
    try:
        run = tmp_path / "run"
        attach = subprocess.Popen([*QPROF, "attach", "-q", "--duration", "2", "-o", str(run), str(target.pid)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        _, status, usage = os.wait4(attach.pid, 0)
        attach.returncode = os.waitstatus_to_exitcode(status)
        assert attach.returncode == 0, attach.stderr.read() if attach.stderr else ""
    finally:
        target.kill()
        target.wait()
    kernel = usage.ru_utime + usage.ru_stime + 0.0
    report = json.loads(qprof("report", str(run), "--format", "json").stdout)
    said = report["observer_cpu_s"]
    total = sum(said.values())
    print(f"\nqprof attach and its children: {kernel:.2f} CPU s; the report: {total:.2f} ({said})")
    assert {"qprof", "qprof-perffold (folding)", "other helper programs"} <= set(said)
    assert report["observer_share_of_targets"] > 0, "the share beside the figures, as the terminal prints it"
    # after the last count: the final meta.json, the interpreter's exit (~0.05 s here)
    assert 0.85 * kernel - 0.05 <= total <= kernel + 0.01, (total, kernel)
