"""One number for one thing, on a real transfer: every output prints the same goodput and CPU seconds;
and a run ends with the targets' work (attach --until-idle).

A quic-go download recorded as a user records one (`qprof record --server ... --client ...`, output
redirected to a file), then read back through every output that prints a goodput or a CPU figure:
the text report, `--format json`, the `qprof table` view and its CSV, the timeline, `qprof.load`,
`qprof diff` (the run against itself) and the flame graph's header. They must agree within the
printed rounding, and the goodput must be the bytes qprof counted over the client's own payload
span: the client prints its seconds from dialling to its last byte, which the test takes as that
span (the handshake, a few ms, is inside both).
"""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT, qprof

pytestmark = [pytest.mark.root, pytest.mark.slow]
SIZE = 1 << 30
SPAN_TOLERANCE = 0.03  # goodput against the test's own bytes over span


def _figures(text: str, pattern: str) -> list[float]:
    return [float(x) for x in re.findall(pattern, text)]


def test_every_output_prints_the_same_goodput_and_cpu(kernel_facing: None, endpoint_build, tmp_path: Path) -> None:
    from qprof.endpoints import free_udp_port, make_certificate

    built = endpoint_build("quicgo")
    key, cert = make_certificate(tmp_path)
    addr = f"127.0.0.1:{free_udp_port()}"
    server = " ".join(built.server(addr, cert, key))
    client = " ".join(built.client(addr, SIZE))
    run = tmp_path / "rec1"  # not "run": the table's header starts with that word
    with open(tmp_path / "record.out", "w") as out:  # redirected, as into a file or a CI log
        r = subprocess.run([sys.executable, "-m", "qprof.cli", "record", "-o", str(run), "--server", server,
                            "--client", client], stdout=out, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    recorded = (tmp_path / "record.out").read_text()
    said = (run / "output-client.log").read_text()
    m = re.search(r"bytes=(\d+) seconds=([\d.]+)", said)
    assert m, said
    client_bytes, client_s = int(m[1]), float(m[2])
    assert client_bytes == SIZE

    rep = json.loads(qprof("report", str(run), "--format", "json", "--timeline").stdout)
    procs = {p["role"]: p for p in rep["processes"]}
    text = qprof("report", str(run)).stdout
    table_csv = tmp_path / "t.csv"
    table = qprof("table", str(run)).stdout
    qprof("table", str(run), "--csv", str(table_csv))
    diff = json.loads(qprof("diff", str(run), str(run), "--format", "json").stdout)
    svg = qprof("flamegraph", str(run), "--role", "client", "-o", str(tmp_path / "c.svg")).stdout
    import qprof as api

    loaded = api.load(run)
    print("\n" + recorded)

    # the redirected summary table: one line per row, whatever the width
    rows = [ln for ln in recorded.splitlines() if ln.startswith(run.name)]
    assert len(rows) == 2 and all(len(ln.split()) >= 10 for ln in rows), recorded
    assert "summary over runs" not in recorded, "one run has nothing to summarize over"

    for role, p in procs.items():
        moved = p["transfer"]
        gbps, cpu = moved["gbps"], p["cpu_seconds"]
        shown = {"json": gbps}
        line = next(ln for ln in text.split(f"({role})", 1)[1].splitlines() if "goodput" in ln)
        shown["report"] = _figures(line, r"goodput ([\d.]+) Gbit/s")[0]
        shown["table"] = next(_figures(ln, r"\s([\d.]+)\s+\S+\s*$")[0] for ln in table.splitlines()
                              if ln.startswith(run.name) and f" {role} " in ln)
        with open(table_csv) as f:
            shown["table csv"] = next(float(row["goodput_gbps"]) for row in csv.DictReader(f) if row["role"] == role)
        tl = next(t for t in rep["timeline"]["targets"] if t["role"] == role)
        mean = sum((b - a) * g for a, b, g in tl["goodput_gbps"]) / sum(b - a for a, b, _ in tl["goodput_gbps"])
        shown["timeline (mean over its transfer)"] = mean
        shown["diff"] = next(pr["a"]["goodput_gbps"] for pr in diff["pairs"] if pr["key"] == role)
        verdict = rep["verdict"]["evidence"][role]["goodput_gbps"]
        shown["verdict"] = verdict
        print(f"{role}: goodput " + ", ".join(f"{k} {v:.4f}" for k, v in shown.items()))
        for where, value in shown.items():
            assert value == pytest.approx(gbps, abs=0.0051), (role, where, shown)

        cpus = {"json": cpu, "report": _figures(text.split(f"({role})", 1)[1], r"sampled CPU ([\d.]+) s")[0],
                "table": next(_figures(ln, r"\s([\d.]+)\s+[\d.–]+\s+\S+\s*$")[0] for ln in table.splitlines()
                              if ln.startswith(run.name) and f" {role} " in ln),
                "load": float(loaded.categories[loaded.categories.role == role].cpu_seconds.sum()),
                "diff": next(pr["a"]["cpu_seconds"] for pr in diff["pairs"] if pr["key"] == role)}
        print(f"{role}: CPU s " + ", ".join(f"{k} {v:.4f}" for k, v in cpus.items()))
        for where, value in cpus.items():
            assert value == pytest.approx(cpu, abs=0.0051), (role, where, cpus)

    # the flame graph's header and qprof.load's run goodput: the client's
    assert f"{procs['client']['cpu_seconds']:.2f} CPU s" in (tmp_path / "c.svg").read_text(), svg
    assert float(loaded.meta.goodput_gbps[0]) == pytest.approx(procs["client"]["transfer"]["gbps"], abs=1e-4)

    # the goodput is the bytes counted over the client's own payload span, within the span's error
    moved = procs["client"]["transfer"]
    assert SIZE <= moved["bytes"] <= SIZE * 1.08, "UDP payload: the file and QUIC's headers and tags"
    own = moved["bytes"] * 8 / client_s / 1e9
    print(f"client: {moved['bytes']:,} bytes over qprof's {moved['seconds']:.3f} s = {moved['gbps']:.3f} Gbit/s; "
          f"over its own {client_s:.3f} s = {own:.3f} Gbit/s")
    assert moved["gbps"] == pytest.approx(own, rel=SPAN_TOLERANCE)
    assert moved["span_from"].startswith("its first to last sample")


SENDER = """
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
r = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); r.bind(("127.0.0.1", 0))
print("ready", flush=True); sys.stdin.readline()
end = time.monotonic() + 1.5
while time.monotonic() < end:
    s.sendto(b"x" * 1200, r.getsockname())
time.sleep(120)
"""


def test_attach_stops_when_the_work_has_ended(kernel_facing: None, tmp_path: Path) -> None:
    """A target that sends for 1.5 s and then stays up idle: --until-idle ends the run, says why, and the
    transfer's span is the 1.5 s of sending, not the idle tail."""
    target = subprocess.Popen([sys.executable, "-c", SENDER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert target.stdout is not None and target.stdout.readline().strip() == "ready"
        run = tmp_path / "run"
        att = subprocess.Popen([sys.executable, "-m", "qprof.cli", "attach", str(target.pid), "--until-idle", "1",
                                "-d", "60", "-q", "-o", str(run)], stderr=subprocess.PIPE, text=True, cwd=ROOT)
        deadline = time.monotonic() + 30
        while not (run / "meta.json").exists() or "start_time" not in (run / "meta.json").read_text() \
                or json.loads((run / "meta.json").read_text()).get("start_time") is None:
            assert time.monotonic() < deadline and att.poll() is None
            time.sleep(0.05)
        time.sleep(1.0)  # sampling and probes live
        assert target.stdin is not None
        target.stdin.write("go\n")
        target.stdin.flush()
        started = time.monotonic()
        assert att.wait(60) == 0, att.stderr.read() if att.stderr else ""
        took = time.monotonic() - started
    finally:
        target.kill()
        target.wait()
    meta = json.loads((run / "meta.json").read_text())
    assert meta["stop_reason"].startswith("the targets' work ended: idle for 1 s"), meta["stop_reason"]
    assert 2.5 <= took <= 6.0, f"stopped {took:.1f} s after the work began (1.5 s of work, 1 s idle, readings)"
    rep = json.loads(qprof("report", str(run), "--format", "json").stdout)
    moved = rep["processes"][0]["transfer"]
    print(f"\nstopped {took:.1f} s after the target began; {moved['bytes']:,} bytes over {moved['seconds']:.2f} s")
    assert 1.2 <= moved["seconds"] <= 1.7 and moved["protocol"] == "UDP" and moved["direction"] == "sent"
    assert "(the targets' work ended: idle for 1 s (--until-idle))" in qprof("report", str(run)).stdout
