#!/usr/bin/env python3
"""How long analysis takes on a long capture, against perf's own `perf script` time.

Attaches to a real ngtcp2 server and client (repeated 1 GiB downloads on one
connection; two busy processes, 999 Hz, DWARF unwinding) for --seconds (the
issue's figure: 10 minutes, about 1.2 M samples), then times, on the same
archive, each stage in a fresh process:

  perf script      perf script alone on the same data, output discarded: the
                   yardstick (qprof's own command: its fields, --no-inline, the
                   targets' pids, its build-id cache), one after the other over
                   every chunk of the run
  fold             attach's post-processing (collectors.folding): perf script
                   over time slices on every CPU, streamed into the folder
  fold, 1 job      the same with one perf script per file (no slicing)
  report           `qprof report --format json` (reads the folded stacks)
  refold + report  `qprof report --refold --format json`: perf.data to report
                   in one command, the honest total

Repeats are interleaved (every stage once per round, so load from elsewhere hits
them alike) and each stage's time is divided by the same round's `perf script`:
the median of these paired ratios with a distribution-free 95% interval
(attribution.stats; 6 rounds or more), beside the median seconds, CPU seconds
(qprof's own process apart from its children: the Python side of folding) and
peak resident memory of qprof's own process (perf's is mostly its mapping of the
data file). A capture that does not fit the free disk (DWARF: ~17 MB/s) is
shortened to the longest that fits, said so, and the times are extrapolated per
sample.

Run as root: python3 bench/report_time.py [--seconds 600] [--keep DIR | --run DIR] [--repeat 8]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from qprof import archive, runfiles

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the lab package (not installed)
from lab.bytecode import compile_tree  # noqa: E402

DWARF_BYTES_PER_S = 17e6  # perf data written per second with DWARF unwinding on 2 busy CPUs (measured)
ISSUE_SAMPLES = 600 * 2 * 999  # 10 minutes, two processes, 999 Hz
HERE = Path(__file__).resolve()


def capture(run: Path, seconds: float, unwind: str) -> None:
    from qprof.collectors.session import AttachOptions, AttachSession
    from lab.transfers import Ngtcp2Transfer

    with Ngtcp2Transfer(1 << 30, requests=1000) as xfer:
        server = xfer.start_server()
        client = xfer.start_client_stopped()
        opts = AttachOptions(pids=[server, client], out=run, duration=seconds, unwind=unwind, keep_raw=True,
                             roles={server: "server", client: "client"})
        AttachSession(opts, on_ready=xfer.release_client, stop_when=xfer.client_done).run()


def fitting_seconds(wanted: float, where: Path, unwind: str) -> float:
    """The longest capture up to `wanted` whose perf data fits the free disk with a 20% margin."""
    if unwind == "fp":
        return wanted
    free = shutil.disk_usage(where).free
    return min(wanted, free / 1.2 / DWARF_BYTES_PER_S)


def peak_rss_kib() -> int:
    """This process's own peak resident memory (VmHWM: reset at exec, unlike getrusage's maxrss,
    which a child inherits from the parent it was forked from)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def stage(name: str, run: Path) -> None:
    """One stage, in this fresh process; prints its figures as JSON on the last line."""
    import contextlib

    from qprof.collectors import debuginfo
    from qprof.collectors.folding import fold_run
    from qprof.collectors.perf import script_command

    perf = shutil.which("perf") or "perf"
    meta = archive.Run.open(run).meta
    out: dict[str, Any] = {}
    t0 = time.monotonic()
    if name == "script":  # perf's own figures: wait4 gives its peak RSS (mostly its mapping of the data)
        rss = 0
        for g in meta.sampling.groups:
            for data in runfiles.chunk_files(run, g.perf_data, include_current=True):
                p = subprocess.Popen(script_command(perf, data, list(g.pids), buildid_dir=debuginfo.cache_root()),
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                _, status, ru = os.wait4(p.pid, 0)
                p.returncode = os.waitstatus_to_exitcode(status)
                if p.returncode:
                    raise SystemExit(f"perf script failed on {data} ({p.returncode})")
                rss = max(rss, ru.ru_maxrss)
        out["rss_kib"] = rss
    elif name in ("fold", "fold1"):
        out["samples"] = fold_run(perf, run, meta.sampling.groups, jobs=1 if name == "fold1" else None).samples
    elif name in ("report", "refold"):
        from qprof.cli import print_report

        with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull), \
                contextlib.redirect_stderr(devnull):
            print_report([run], "json", [], 10, refold=name == "refold")
    else:
        raise SystemExit(f"unknown stage {name}")
    out["seconds"] = time.monotonic() - t0
    out.setdefault("rss_kib", peak_rss_kib())
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    out["self_cpu_s"] = me.ru_utime + me.ru_stime
    out["cpu_s"] = me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime
    print(json.dumps(out))


def run_stage(name: str, run: Path) -> dict[str, Any]:
    """A stage in a fresh interpreter: wall time with start-up, as a user sees it (the stage reports
    its CPU seconds with its perf processes', which load from elsewhere inflates far less)."""
    t0 = time.monotonic()
    p = subprocess.Popen([sys.executable, str(HERE), "--stage", name, "--run", str(run)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    stdout, stderr = p.communicate()
    wall = time.monotonic() - t0
    if p.returncode != 0:
        raise SystemExit(f"stage {name} failed: {stderr.strip()[-500:]}")
    out = json.loads(stdout.strip().splitlines()[-1])
    out["wall"] = wall
    return out


def main() -> None:
    from qprof.attribution.stats import median_ci

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=600.0, help="capture length (default: the issue's 10 minutes)")
    ap.add_argument("--unwind", default="dwarf", choices=["auto", "fp", "dwarf"])
    ap.add_argument("--keep", type=Path, help="keep the run archive here")
    ap.add_argument("--run", type=Path, help="time an existing run archive instead of capturing one")
    ap.add_argument("--repeat", type=int, default=8, help="interleaved rounds of every stage (6+ for an interval)")
    ap.add_argument("--stage", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.stage:
        stage(args.stage, args.run)
        return
    compile_tree()  # every stage starts a fresh process: as an installed qprof, with its bytecode

    tmp = None if args.run or args.keep else Path(tempfile.mkdtemp(prefix="qprof-bench-"))
    run = args.run or args.keep or tmp / "run"
    try:
        if args.run is None:
            seconds = fitting_seconds(args.seconds, run.parent, args.unwind)
            if seconds < args.seconds:
                print(f"note: {args.seconds:.0f} s of DWARF perf data (~{args.seconds * DWARF_BYTES_PER_S / 1e9:.0f} GB) "
                      f"does not fit the free disk; capturing {seconds:.0f} s and extrapolating per sample")
            print(f"capturing {seconds:.0f} s ...", flush=True)
            capture(run, seconds, args.unwind)
        meta = archive.Run.open(run).meta
        data_bytes = sum(p.stat().st_size for g in meta.sampling.groups
                         for p in runfiles.chunk_files(run, g.perf_data, include_current=True))
        names = ["script", "fold", "fold1", "report", "refold"]
        load = os.getloadavg()
        run_stage("script", run)  # warm the page cache and perf's own caches: every stage starts alike
        results: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
        for rep in range(args.repeat):  # interleaved, so that load from elsewhere hits every stage alike
            for n in names:
                results[n].append(run_stage(n, run))
                print(f"  [{rep + 1}/{args.repeat}] {n}: {results[n][-1]['wall']:.2f} s", file=sys.stderr, flush=True)
        script_cpu = archive.Run.open(run).meta.parse  # the last refold's: perf script's CPU by wait4
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)

    def med(xs: list[float]) -> float:
        return float(median_ci(xs).median or 0.0)

    wall = {n: [r["wall"] for r in rs] for n, rs in results.items()}
    ratio = {n: [w / s for w, s in zip(wall[n], wall["script"])] for n in names}  # paired by round
    rss = {n: max(r["rss_kib"] for r in rs) for n, rs in results.items()}
    cpu = {n: med([r["cpu_s"] for r in rs]) for n, rs in results.items()}
    self_cpu = {n: med([r["self_cpu_s"] for r in rs]) for n, rs in results.items()}
    samples = results["fold"][0]["samples"]
    script_s = med(wall["script"])
    print(f"capture: {meta.duration_s or 0:.1f} s, {samples} target samples, "
          f"unwinding {[g.unwind for g in meta.sampling.groups]}, perf data {data_bytes / 1e9:.2f} GB, "
          f"{os.cpu_count()} CPUs; {args.repeat} interleaved rounds, each stage in a fresh process")
    print(f"load average {load[0]:.2f} before, {os.getloadavg()[0]:.2f} after (other work on the machine)")
    print(f"{'stage':34s} {'median s':>8s} {'x perf script (95% CI)':>24s} {'CPU s':>6s} {'qprof CPU s':>11s} "
          f"{'peak RSS':>9s}")

    def line(label: str, n: str) -> None:
        ci = median_ci(ratio[n])
        interval = f"{ci.low:.2f}-{ci.high:.2f}" if ci.available else "no interval"
        print(f"{label:34s} {med(wall[n]):8.2f} {f'{med(ratio[n]):.2f} ({interval})':>24s} {cpu[n]:6.2f} "
              f"{self_cpu[n]:11.2f} {f'{rss[n] / 1024:.0f} MiB':>9s}")

    line("perf script alone (perf's RSS)", "script")
    line("fold (parallel slices)", "fold")
    line("fold, 1 job", "fold1")
    line("report --format json", "report")
    line("report --refold (one command)", "refold")
    if script_cpu is not None and script_cpu.perf_script_cpu_s is not None:
        print(f"the last refold: perf script used {script_cpu.perf_script_cpu_s:.2f} CPU s (wait4), qprof's own "
              f"process {self_cpu['refold']:.2f} (median)")
    if samples < ISSUE_SAMPLES * 0.9:
        per = ISSUE_SAMPLES / samples
        print(f"extrapolated to {ISSUE_SAMPLES} target samples (x{per:.2f}, linear in samples; report grows "
              f"slower): perf script {script_s * per:.0f} s, refold {med(wall['refold']) * per:.0f} s")
    print(f"report --refold / perf script = {med(ratio['refold']):.2f} (median of {args.repeat} paired rounds)")


if __name__ == "__main__":
    main()
