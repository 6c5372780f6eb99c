#!/usr/bin/env python3
"""Do the packetio probes' 95% intervals hold the truth 95% of the time?

Workload: tests/workloads/udp_stream.c, a UDP stream over loopback whose sender
and receiver print their own exact counts (datagrams, bytes, calls). Both are
attached with the default probes (qprof's in-process attach, the sender held
until the probes are live). Each run draws one of the cases below; for each
figure the run reports as an estimate, the truth is checked against the
interval. Prints, per case and figure, how many intervals held the truth, the
median relative error and the median relative half-width, and how many runs
were counted whole (exact: they must match exactly).

Run as root:  .venv/bin/python bench/sampling_coverage.py --runs 20
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from qprof.collectors.session import AttachOptions, AttachSession  # noqa: E402
from qprof.endpoints import StoppedProcess  # noqa: E402

WORKLOAD = ROOT / "tests" / "workloads" / "udp_stream.c"


@dataclass(frozen=True)
class Case:
    name: str
    seconds: float
    segs: int  # datagrams per send (GSO when > 1)
    gro: bool


CASES = (Case("gso8-plain-recv", 2.0, 8, False), Case("no-gso-plain-recv", 2.0, 1, False),
         Case("gso8-gro", 2.0, 8, True), Case("short-gso8", 0.3, 8, False),
         # long enough for the periods to reach their full length (windows.PERIOD_S from 10 s on)
         Case("long-gso8", 15.0, 8, False))


def build(out: Path) -> Path:
    exe = out / "udp_stream"
    subprocess.run([shutil.which("cc") or "gcc", "-O2", "-o", str(exe), str(WORKLOAD)], check=True)
    return exe


def one_run(exe: Path, case: Case, out: Path) -> dict[str, tuple[float, dict | None]]:
    """{figure: (truth, estimate json)} for one run of `case`."""
    sink = subprocess.Popen([str(exe), "sink", *(["gro"] if case.gro else [])], stdout=subprocess.PIPE, text=True)
    assert sink.stdout is not None
    port = int(sink.stdout.readline())
    sender = StoppedProcess([str(exe), "send", str(port), str(case.seconds), "1200", str(case.segs)],
                            stdout=subprocess.PIPE, text=True)
    AttachSession(AttachOptions(pids=[sink.pid, sender.pid], out=out, frequency=99), on_ready=sender.release,
                  stop_when=lambda: sink.poll() is not None and sender.poll() is not None).run()
    tx = [int(x) for x in sender.stdout.read().split()]  # type: ignore[union-attr]
    rx = [int(x) for x in sink.stdout.read().split()]
    sender.wait()
    sink.wait()
    r = subprocess.run([sys.executable, "-m", "qprof.cli", "report", str(out), "--format", "json"],
                       capture_output=True, text=True, check=True)
    pio = json.loads(r.stdout)["packet_io"]["processes"]
    snd, rcv = pio[str(sender.pid)]["estimates"], pio[str(sink.pid)]["estimates"]
    return {"tx.datagrams": (tx[0], snd.get("tx.datagrams")), "tx.bytes": (tx[1], snd.get("tx.bytes")),
            "tx.messages": (tx[2], snd.get("tx.messages")),
            "gso.segments_per_gso_send": (case.segs, snd.get("gso.segments_per_gso_send")) if case.segs > 1
            else (0, None),
            "rx.datagrams": (rx[0], rcv.get("rx.datagrams")), "rx.bytes": (rx[1], rcv.get("rx.bytes")),
            "rx.messages": (rx[2], rcv.get("rx.messages"))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=20, help="runs per case (default 20)")
    ap.add_argument("--cases", default=",".join(c.name for c in CASES))
    args = ap.parse_args()
    cases = [c for c in CASES if c.name in args.cases.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="qprof-coverage-"))
    try:
        exe = build(tmp)
        results: dict[tuple[str, str], list[tuple[float, dict]]] = {}
        for i in range(args.runs):
            for case in cases:
                out = tmp / f"{case.name}-{i}"
                for fig, (truth, est) in one_run(exe, case, out).items():
                    if est is not None:
                        results.setdefault((case.name, fig), []).append((truth, est))
                shutil.rmtree(out, ignore_errors=True)
            print(f"run {i + 1}/{args.runs} done", file=sys.stderr)
        print(f"{'case':20s} {'figure':28s} {'held':>7s} {'exact':>6s} {'med err':>8s} {'med ±':>7s}")
        for (case, fig), rows in sorted(results.items()):
            held = sum(1 for t, e in rows if e["exact"] and e["value"] == t or not e["exact"] and e["interval"]
                       and e["interval"][0] <= t <= e["interval"][1])
            exact = sum(1 for _, e in rows if e["exact"])
            errs = [abs(e["value"] - t) / t for t, e in rows if t]
            halves = [(e["interval"][1] - e["interval"][0]) / 2 / e["value"] for _, e in rows
                      if e["interval"] and e["value"]]
            print(f"{case:20s} {fig:28s} {held:>3d}/{len(rows):<3d} {exact:>6d} {statistics.median(errs):8.2%} "
                  f"{statistics.median(halves) if halves else 0:7.2%}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
