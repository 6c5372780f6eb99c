#!/usr/bin/env python3
"""How long analysis takes on a long capture, against perf's own `perf script` time.

Attaches to a real ngtcp2 server and client (repeated 1 GiB downloads on one
connection; two busy processes, 999 Hz, DWARF unwinding) for --seconds (the
issue's figure: 10 minutes, about 1.2 M samples), then times, on the same
archive, each stage in a fresh process:

  perf script      perf script alone on the same data, output discarded: the
                   yardstick (qprof's own command: its fields, --no-inline, the
                   targets' pids)
  fold             attach's post-processing (collectors.folding): perf script
                   over time slices on every CPU, streamed into the block folder
  fold, 1 job      the same with one perf script per file (no slicing)
  fold, previous   before the block folder and slicing: one perf script, the
                   line parser, fold (skip with --no-previous: the slowest)
  report           `qprof report --format json` (reads the folded stacks)
  refold + report  `qprof report --refold --format json`: perf.data to report
                   in one command, the honest total

and prints wall times (best of --repeat interleaved runs: the machine may be
shared), the ratios to perf script, samples, and peak resident memory of
qprof's own process (perf's is mostly its mapping of the data file).
A capture that does not fit the free disk (DWARF: ~17 MB/s) is shortened to the
longest that fits, said so, and the times are extrapolated per sample.

Run as root: python3 bench/report_time.py [--seconds 600] [--keep DIR | --run DIR]
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

from qprof import archive

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the lab package (not installed)

DWARF_BYTES_PER_S = 17e6  # perf data written per second with DWARF unwinding on 2 busy CPUs (measured)
ISSUE_SAMPLES = 600 * 2 * 999  # 10 minutes, two processes, 999 Hz
HERE = Path(__file__).resolve()


def capture(run: Path, seconds: float, unwind: str) -> None:
    from qprof.collectors.session import AttachOptions, AttachSession
    from lab.transfers import Ngtcp2Transfer

    with Ngtcp2Transfer(1 << 30, requests=1000) as xfer:
        server = xfer.start_server()
        client = xfer.start_client_stopped()
        opts = AttachOptions(pids=[server, client], out=run, duration=seconds, unwind=unwind,
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

    from qprof.collectors.folding import fold_run
    from qprof.collectors.perf import script_command
    from qprof.collectors.perfscript import ParseStats, parse_samples
    from qprof.archive.stacks import fold

    perf = shutil.which("perf") or "perf"
    meta = archive.Run.open(run).meta
    out: dict[str, Any] = {}
    t0 = time.monotonic()
    if name == "script":  # perf's own figures: wait4 gives its peak RSS (mostly its mapping of the data)
        rss = 0
        for g in meta.sampling.groups:
            p = subprocess.Popen(script_command(perf, run / g.perf_data, g.pids), stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
            _, status, ru = os.wait4(p.pid, 0)
            p.returncode = os.waitstatus_to_exitcode(status)
            if p.returncode:
                raise SystemExit(f"perf script failed ({p.returncode})")
            rss = max(rss, ru.ru_maxrss)
        out["rss_kib"] = rss
    elif name == "previous":
        stats = ParseStats()
        for g in meta.sampling.groups:
            with subprocess.Popen(script_command(perf, run / g.perf_data, g.pids), stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, text=True, errors="replace", bufsize=1 << 20) as p:
                fold(parse_samples(p.stdout, stats))  # type: ignore[arg-type]
        out["samples"] = stats.samples
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
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=600.0, help="capture length (default: the issue's 10 minutes)")
    ap.add_argument("--unwind", default="dwarf", choices=["auto", "fp", "dwarf"])
    ap.add_argument("--keep", type=Path, help="keep the run archive here")
    ap.add_argument("--run", type=Path, help="time an existing run archive instead of capturing one")
    ap.add_argument("--no-previous", action="store_true", help="skip timing the previous fold implementation")
    ap.add_argument("--repeat", type=int, default=3, help="interleaved repeats of every stage; the best counts")
    ap.add_argument("--stage", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.stage:
        stage(args.stage, args.run)
        return

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
        data_bytes = sum((run / g.perf_data).stat().st_size for g in meta.sampling.groups)
        names = ["script", "fold", "fold1"] + ([] if args.no_previous else ["previous"]) + ["report", "refold"]
        load = os.getloadavg()
        run_stage("script", run)  # warm the page cache and perf's own caches: every stage starts alike
        results: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
        for rep in range(args.repeat):  # interleaved, so that load from elsewhere hits every stage alike
            for n in names:
                results[n].append(run_stage(n, run))
                print(f"  [{rep + 1}/{args.repeat}] {n}: {results[n][-1]['wall']:.2f} s", file=sys.stderr, flush=True)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)

    from qprof.cli import main as cli

    best = {n: min(r["wall"] for r in rs) for n, rs in results.items()}  # the least disturbed of the repeats
    rss = {n: max(r["rss_kib"] for r in rs) for n, rs in results.items()}
    cpu = {n: min(r["cpu_s"] for r in rs) for n, rs in results.items()}
    samples = results["fold"][0]["samples"]
    script_s = best["script"]
    print(f"capture: {meta.get('duration_s') or 0:.1f} s, {samples} target samples, "
          f"unwinding {[g.unwind for g in meta.sampling.groups]}, perf data {data_bytes / 1e9:.2f} GB, "
          f"{os.cpu_count()} CPUs; best of {args.repeat} interleaved repeats, each in a fresh process")
    print(f"load average {load[0]:.2f} before, {os.getloadavg()[0]:.2f} after (other work on the machine)")
    print(f"{'stage':36s} {'seconds':>8s} {'x perf script':>13s} {'CPU s':>7s} {'peak RSS':>10s}")

    def line(label: str, s: float, n: str | None, rss_kib: int | None = None) -> None:
        cpu_s = f"{cpu[n]:.2f}" if n else ""
        print(f"{label:36s} {s:8.2f} {s / script_s:13.2f} {cpu_s:>7s} "
              f"{f'{rss_kib / 1024:.0f} MiB' if rss_kib else '':>10s}")

    line("perf script alone (perf's own RSS)", script_s, "script", rss["script"])
    line("fold (parallel slices; qprof's RSS)", best["fold"], "fold", rss["fold"])
    line("fold, 1 job", best["fold1"], "fold1", rss["fold1"])
    if "previous" in best:
        line("fold, previous implementation", best["previous"], "previous", rss["previous"])
    line("report --format json", best["report"], "report", rss["report"])
    line("fold + report", best["fold"] + best["report"], None)
    line("report --refold (one command)", best["refold"], "refold", rss["refold"])
    if "flamegraph" not in cli.commands:
        print("qprof flamegraph is not in this branch: timed report only")
    if samples < ISSUE_SAMPLES * 0.9:
        per = ISSUE_SAMPLES / samples
        print(f"extrapolated to {ISSUE_SAMPLES} target samples (x{per:.2f}, linear in samples; report grows "
              f"slower): perf script {script_s * per:.0f} s, fold {best['fold'] * per:.0f} s, "
              f"fold + report {(best['fold'] + best['report']) * per:.0f} s")
    print(f"ratio (fold + report) / perf script = {(best['fold'] + best['report']) / script_s:.2f}; "
          f"report --refold / perf script = {best['refold'] / script_s:.2f}")


if __name__ == "__main__":
    main()
