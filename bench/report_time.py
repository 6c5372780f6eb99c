#!/usr/bin/env python3
"""How long analysis takes on a long capture, against perf's own `perf script` time.

Attaches to a real ngtcp2 server and client (repeated 1 GiB downloads on one
connection) for --seconds, then times, on the same archive:
  fold    attach's post-processing: perf script + parse + fold (done once per run)
  report  `qprof report --format json` (what users re-run)
  script  `perf script` alone on the same data, output discarded (the yardstick)
Run as root: python3 bench/report_time.py --seconds 60
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from qprof.collectors import archive
from qprof.collectors.perfscript import PERF_SCRIPT_FIELDS
from qprof.collectors.session import AttachOptions, AttachSession
from qprof.endpoints import Ngtcp2Transfer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--unwind", default="auto", choices=["auto", "fp", "dwarf"])
    ap.add_argument("--keep", type=Path, help="keep the run archive here")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="qprof-bench-"))
    run = args.keep or tmp / "run"
    marks: dict[str, float] = {}

    def status(msg: str) -> None:
        if msg.startswith("stopping ("):
            marks["stop"] = time.monotonic()
        if msg.startswith("resolving symbols"):
            marks["fold"] = time.monotonic()

    try:
        with Ngtcp2Transfer(1 << 30, requests=1000) as xfer:
            server = xfer.start_server()
            client = xfer.start_client_stopped()
            opts = AttachOptions(pids=[server, client], out=run, duration=args.seconds, unwind=args.unwind,
                                 roles={server: "server", client: "client"})
            AttachSession(opts, on_ready=xfer.release_client, stop_when=xfer.client_done, status=status).run()
            done = time.monotonic()
        meta = archive.Run.open(run).meta
        samples = meta["parse"]["samples"]
        fold_s = done - marks["fold"]
        t0 = time.monotonic()
        subprocess.run([sys.executable, "-m", "qprof.cli", "report", str(run), "--format", "json"],
                       check=True, stdout=subprocess.DEVNULL)
        report_s = time.monotonic() - t0
        perf = shutil.which("perf") or "perf"
        script_s = 0.0
        for g in meta["sampling"]["groups"]:
            t0 = time.monotonic()
            subprocess.run([perf, "script", "-i", str(run / g["perf_data"]), "-F", PERF_SCRIPT_FIELDS,
                            "--no-inline"], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            script_s += time.monotonic() - t0
        size = sum(f.stat().st_size for f in run.iterdir())
        print(f"capture: {meta['duration_s']:.1f} s, {samples} target samples, "
              f"unwinding {[g['unwind'] for g in meta['sampling']['groups']]}, archive {size / 1e6:.0f} MB")
        print(f"fold (perf script + parse + fold, once per run): {fold_s:.2f} s = {fold_s / script_s:.2f}x perf script")
        print(f"report (qprof report --format json):             {report_s:.2f} s = {report_s / script_s:.2f}x perf script")
        print(f"perf script alone:                               {script_s:.2f} s")
    finally:
        if args.keep is None:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
