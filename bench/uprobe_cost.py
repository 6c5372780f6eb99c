#!/usr/bin/env python3
"""What one uprobe hit costs the probed thread on this machine (the figure behind
qprof.probes.crypto.UPROBE_HIT_NS).

A tiny C loop calls a non-inlined 8-argument function N times and measures its
own thread CPU time per call (CLOCK_THREAD_CPUTIME_ID: the uprobe trap and the
BPF program run in the caller's context, so they are charged to it, and other
users' load on a shared host does not inflate the figure as wall time would).
Three variants, each run --trials times, medians printed:
  none    no probe
  count   uprobe with qprof's per-hit action: @calls[pid, tid, K] = count()
  bytes   the same plus @bytes[pid, tid, K] = sum(sarg1) (a stack argument read)
The kernel's BPF run time (BPF_ENABLE_STATS) splits each hit into program time
and the rest (breakpoint trap, uprobe dispatch, return to user space).
Run as root: python3 bench/uprobe_cost.py [--calls 300000] [--trials 5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from qprof.collectors.probing import enable_bpf_stats, program_stats
from qprof.collectors.procfs import descendants
from qprof.probes.bpftrace import BpftraceProcess
from qprof.probes.leftovers import owned_prog_ids

LOOP_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
__attribute__((noinline, used)) long qprof_probe_target(long a, long b, long c, long d,
                                                         long e, long f, long g, long h) {
    __asm__ volatile("");
    return a + b + c + d + e + f + g + h;
}
static long long cpu_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}
int main(int argc, char **argv) {
    long n = atol(argv[1]), s = 0;
    long long t0 = cpu_ns();
    for (long i = 0; i < n; i++)
        s += qprof_probe_target(1, 2, 3, 4, 5, 6, 7, 1200 + (i & 1));
    long long t1 = cpu_ns();
    printf("%.1f %ld\n", (double)(t1 - t0) / n, s);
    return 0;
}
"""

ACTIONS = {
    "count": "@calls[pid, tid, 1] = count();",
    "bytes": "@calls[pid, tid, 1] = count(); @bytes[pid, tid, 1] = sum(sarg1);",
}


def loop(binary: Path, calls: int) -> float:
    out = subprocess.run([str(binary), str(calls)], capture_output=True, text=True, check=True).stdout
    return float(out.split()[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=300_000)
    ap.add_argument("--trials", type=int, default=5)
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("uprobe_cost: run as root (uprobes)")
    bpftrace = shutil.which("bpftrace")
    cc = shutil.which("cc") or shutil.which("gcc")
    if bpftrace is None or cc is None:
        sys.exit("uprobe_cost: needs bpftrace and a C compiler")
    tmp = Path(tempfile.mkdtemp(prefix="qprof-uprobe-cost-"))
    src, binary = tmp / "loop.c", tmp / "loop"
    src.write_text(LOOP_C)
    subprocess.run([cc, "-O2", "-o", str(binary), str(src)], check=True)
    base = statistics.median(loop(binary, args.calls) for _ in range(args.trials))
    print(f"no probe: {base:.1f} ns/call (thread CPU), median of {args.trials}")
    stats_fd, why = enable_bpf_stats()
    if why:
        print(f"note: {why}: BPF program time not separated")
    try:
        for name, action in ACTIONS.items():
            prog = tmp / f"{name}.bt"
            prog.write_text(f"uprobe:{binary}:qprof_probe_target {{ {action} }}\n")
            bp = BpftraceProcess(name, prog, tmp / f"{name}.jsonl", tmp / f"{name}.log")
            bp.start(bpftrace)
            try:
                per_call = statistics.median(loop(binary, args.calls) for _ in range(args.trials))
                progs = program_stats(owned_prog_ids(set(descendants(bp.proc.pid)))) if stats_fd is not None else []
            finally:
                bp.stop()
            hits = sum(int(p.run_cnt or 0) for p in progs)
            bpf_ns = sum(int(p.run_time_ns or 0) for p in progs) / hits if hits else None
            extra = per_call - base
            print(f"{name:6s}: {per_call:.1f} ns/call -> {extra:.0f} ns per uprobe hit"
                  + (f" (BPF program {bpf_ns:.0f} ns, trap and dispatch {extra - bpf_ns:.0f} ns)"
                     if bpf_ns is not None else ""))
    finally:
        if stats_fd is not None:
            os.close(stats_fd)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
