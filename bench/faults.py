"""Fault injection, every case a real run: `sudo .venv/bin/python bench/faults.py [CASE...]`.

Runs each case of lab.faults (qprof killed or interrupted at start-up, collection and
writing; targets exiting; perf and bpftrace missing, too old or crashing; a probe failing
to attach; a full disk; bad output paths; not root) against a real process with the real
perf and bpftrace, and prints one row per case: did qprof survive (clean exit or clean
kill, the expected outcome, no traceback, no hang), what of qprof's was left behind (BPF
programs / perf events / uprobes / processes), and how much data `qprof report` can read.
tests/test_faults.py runs the same cases in CI.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the lab package (not installed)

from lab.faults import CASES, EXPECTED_DATA, CaseSkipped, run_case  # noqa: E402


def main(argv: list[str]) -> int:
    names = argv or list(CASES)
    unknown = [n for n in names if n not in CASES]
    if unknown:
        print(f"unknown case(s) {unknown}; cases: {list(CASES)}", file=sys.stderr)
        return 2
    rows, bad = [], 0
    for name in names:
        t0 = time.monotonic()
        try:
            o = run_case(name)
        except CaseSkipped as e:
            rows.append((name, "skipped", "-", "-", str(e), 0.0))
            continue
        good = o.survived and o.leftovers.total == 0 and o.data in EXPECTED_DATA[name]
        bad += not good
        left = f"{o.leftovers.bpf_programs}/{o.leftovers.perf_events}/{o.leftovers.uprobes}/" \
               f"{len(o.leftovers.processes)}"
        rows.append((name, "yes" if o.survived else "NO", left, o.data, o.detail, time.monotonic() - t0))
        print(f"  done: {name} ({time.monotonic() - t0:.1f} s)", file=sys.stderr)
    w = max(len(r[0]) for r in rows)
    print(f"{'case':{w}s}  survived  leftovers (BPF progs/perf events/uprobes/processes)  data kept")
    for name, survived, left, data, _detail, _t in rows:
        print(f"{name:{w}s}  {survived:8s}  {left:51s}  {data}")
    print()
    for name, _s, _l, _d, detail, t in rows:
        print(f"{name}: {detail} [{t:.1f} s]")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
