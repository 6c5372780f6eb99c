#!/usr/bin/env python3
"""What qprof costs beside the targets over a whole attach, as a user runs it.

A transfer over loopback (ngtcp2's Debian pair by default, or a stack built from
lab/endpoints with --stack), both ends attached by the command line with default
options and `--until-idle 1`, as the README shows. The client is held right after
exec and released when attach says it is sampling. Measured from outside qprof:

  observer   CPU seconds of the `qprof attach` process and every process it ran and
             waited for (perf record, perf script, the probe loaders, helpers),
             from wait4: start-up, sampling, folding, writing, all of it
  targets    CPU seconds of the server (/proc, from before the release to the end)
             and of the client (this process's children's rusage, less qprof's)
  footprint  observer / targets
  wait       seconds from attach's decision to stop (its "stopping" line) to its exit:
             stopping the probes and perf, the last fold, writing the archive
  idle lag   seconds from the client's exit to that decision, less --until-idle's
             second: how late the end of the work is seen
  line       the report's own observer line (observer_cpu_s): the per-component
             figures, and how much of the outside measure it misses

With two or more --arm NAME=PYTHON (interpreters whose `-m qprof.cli` are two
trees), every round runs each arm once, the order rotated from round to round
(A B, B A, ...: a run right after another runs on a host still settling from it,
so no arm may always come second), so drift and other tenants' load fall on all
alike; each arm's tree is compiled to bytecode first (lab.bytecode); each arm's footprint is
compared with the first arm's by the median of the per-round ratios with a
distribution-free 95% interval (attribution.stats).

Run as root:  python3 bench/footprint.py [--stack quicgo] [--size 4G] [--rounds 5]
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
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parent.parent))  # the lab package (not installed)

from lab.bytecode import compile_tree  # noqa: E402
from lab.scenarios import transfer_factory  # noqa: E402
from qprof.attribution.stats import median_ci  # noqa: E402
from qprof.units import parse_size  # noqa: E402

IDLE_S = 1.0
TICK = os.sysconf("SC_CLK_TCK")


@dataclass
class Measure:
    """One attached transfer."""

    arm: str
    observer_s: float
    targets_s: float
    wait_s: float
    idle_lag_s: float
    goodput_gbps: float | None
    line: dict[str, float] = field(default_factory=dict)
    after: list[tuple[float, str]] = field(default_factory=list)  # attach's status lines after the exit, timed

    @property
    def footprint(self) -> float:
        return self.observer_s / self.targets_s


def cpu_s(pid: int) -> float:
    """utime + stime of a live process, from /proc/PID/stat."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rfind(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def ru_s(ru: resource.struct_rusage) -> float:
    return ru.ru_utime + ru.ru_stime


def attach_once(arm: str, python: str, stack: str, size: int, workroot: Path, timeout: float,
                keep: Path | None = None) -> Measure:
    """One transfer attached by `python -m qprof.cli attach`; the archive is moved to `keep`, else removed."""
    run = workroot / f"run-{arm}-{time.monotonic_ns()}"
    with transfer_factory(stack)(size, "127.0.0.1", {}) as xfer:
        server = xfer.start_server()
        client = xfer.start_client_stopped()
        server0 = cpu_s(server)
        children0 = ru_s(resource.getrusage(resource.RUSAGE_CHILDREN))
        att = subprocess.Popen([python, "-m", "qprof.cli", "attach", "--server", str(server), "--client",
                                str(client), "--until-idle", str(IDLE_S), "-o", str(run)],
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               text=True, cwd=workroot)
        sampling = threading.Event()
        err: list[str] = []
        timed: list[tuple[float, str]] = []

        def drain() -> None:
            assert att.stderr is not None
            for line in att.stderr:
                err.append(line)
                timed.append((time.monotonic(), line.strip()))
                if "sampling at" in line:
                    sampling.set()

        reader = threading.Thread(target=drain, daemon=True)
        reader.start()
        if not sampling.wait(timeout) :
            att.kill()
            raise RuntimeError(f"attach did not start sampling: {''.join(err[-3:])}")
        xfer.release_client()
        deadline = time.monotonic() + timeout
        while not xfer.client_done():
            if time.monotonic() > deadline:
                att.kill()
                raise RuntimeError("the transfer did not end")
            time.sleep(0.005)
        exited = time.monotonic()
        _, status, ru = os.wait4(att.pid, 0)
        attach_end = time.monotonic()
        att.returncode = os.waitstatus_to_exitcode(status)
        reader.join(5)
        server_s = cpu_s(server) - server0
        observer = ru_s(ru)
        client_s = ru_s(resource.getrusage(resource.RUSAGE_CHILDREN)) - children0 - observer
        if att.returncode != 0:
            raise RuntimeError(f"attach exited {att.returncode}: {''.join(err[-3:])}")
        goodput = xfer.goodput_gbps()
    rep = subprocess.run([python, "-m", "qprof.cli", "report", "--format", "json", str(run)],
                         capture_output=True, text=True, cwd=workroot)
    line = json.loads(rep.stdout).get("observer_cpu_s", {}) if rep.returncode == 0 else {}
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        shutil.move(str(run), str(keep / run.name))
    shutil.rmtree(run, ignore_errors=True)
    after = [(t - exited, text) for t, text in timed if t >= exited] + [(attach_end - exited, "(attach exited)")]
    stopping = next((t for t, text in timed if "stopping (" in text), attach_end)
    return Measure(arm, observer, server_s + client_s, attach_end - stopping, stopping - exited - IDLE_S, goodput,
                   line, after)


def describe(ms: list[Measure]) -> str:
    foot = median_ci([m.footprint for m in ms])
    wait = median_ci([m.wait_s for m in ms])
    lag = median_ci([m.idle_lag_s for m in ms])
    obs = median_ci([m.observer_s for m in ms])
    tgt = median_ci([m.targets_s for m in ms])
    line = median_ci([sum(m.line.values()) for m in ms])
    out = [f"  footprint {100 * (foot.median or 0):.1f}% (runs {', '.join(f'{100 * m.footprint:.1f}' for m in ms)}); "
           f"observer {obs.median:.2f} CPU s for the targets' {tgt.median:.2f}; "
           f"wait {wait.median:.2f} s (idle lag {lag.median:.2f} s); goodput "
           + ", ".join(f"{m.goodput_gbps:.2f}" if m.goodput_gbps else "-" for m in ms) + " Gbit/s",
           f"  the report's line: {line.median:.2f} CPU s (misses {(obs.median or 0) - (line.median or 0):.2f}): "
           + ", ".join(f"{k} {median_ci([m.line.get(k, 0.0) for m in ms]).median:.2f}"
                       for k in sorted({k for m in ms for k in m.line}))]
    return "\n".join(out)


def interval(values: list[float]) -> str:
    ci = median_ci(values)
    if not ci.available:
        return f"{ci.median:.3f} ({ci.note})"
    return f"{ci.median:.3f} [{ci.low:.3f}, {ci.high:.3f}]"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--stack", default="ngtcp2", help="ngtcp2 (Debian's pair) or a lab endpoint (quicgo, quinn...)")
    ap.add_argument("--size", default="4G", help="bytes transferred per run (e.g. 4G; quic-go: 24G is ~60 s here)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--arm", action="append", default=[], metavar="NAME=PYTHON",
                    help="an interpreter whose `-m qprof.cli` is one tree; default: this one")
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--keep", type=Path, help="keep the run archives in this directory")
    ap.add_argument("--after", action="store_true", help="print attach's status lines after the client's exit, timed")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("footprint: needs root (perf and the probes attach to other processes); run it with sudo", file=sys.stderr)
        return 2
    arms = dict(a.split("=", 1) for a in args.arm) or {"qprof": sys.executable}
    size = parse_size(args.size)
    results: dict[str, list[Measure]] = {a: [] for a in arms}
    workroot = Path(tempfile.mkdtemp(prefix="qprof-footprint-"))
    for python in arms.values():
        compile_tree(python)
    load0 = os.getloadavg()[0]
    try:
        for r in range(args.rounds):
            order = list(arms)[r % len(arms):] + list(arms)[:r % len(arms)]
            for arm in order:
                m = attach_once(arm, arms[arm], args.stack, size, workroot, args.timeout, args.keep)
                results[arm].append(m)
                print(f"[{r + 1}/{args.rounds}] {arm}: footprint {100 * m.footprint:.2f}% "
                      f"({m.observer_s:.2f} / {m.targets_s:.2f} CPU s), wait {m.wait_s:.2f} s (idle lag {m.idle_lag_s:.2f}), "
                      f"line {sum(m.line.values()):.2f}", flush=True)
                if args.after:
                    print("\n".join(f"    +{t:.2f} s {text}" for t, text in m.after), flush=True)
    except KeyboardInterrupt:
        print("interrupted: the rounds so far", file=sys.stderr)
    finally:
        shutil.rmtree(workroot, ignore_errors=True)
    print(f"\n{args.stack}, {args.size} per run, both ends attached by `qprof attach --until-idle {IDLE_S:g}` "
          f"(default options); load average {load0:.2f} before, {os.getloadavg()[0]:.2f} after")
    first = next(iter(arms))
    for arm, ms in results.items():
        if not ms:
            continue
        print(f"{arm}:\n{describe(ms)}")
        if arm != first and results[first]:
            n = min(len(ms), len(results[first]))
            print(f"  footprint / {first}'s, paired by round: "
                  f"{interval([ms[i].footprint / results[first][i].footprint for i in range(n)])}; "
                  f"wait / {first}'s: "
                  f"{interval([ms[i].wait_s / results[first][i].wait_s for i in range(n) if results[first][i].wait_s > 0])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
