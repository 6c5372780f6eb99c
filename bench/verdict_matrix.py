"""The verdict's proof: real transfers between two namespaces, one side made the bottleneck on purpose.

    sudo .venv/bin/python bench/verdict_matrix.py [--runs 10] [--stacks ngtcp2,quicgo]
                                                  [--scenarios server-limited,client-limited,neither,uncapped]

Scenarios (qprof.netlab.SCENARIOS): the server's cgroup capped at 0.3 of a
core, the client's capped the same, neither (both uncapped, the veth shaped to
200 Mbit/s with tbf), and uncapped (reported as measured, no expected answer).
Each run: a fresh lab, server and held client placed in their namespaces and
cgroups, `qprof attach`'s session on both with the default probes, the client
released once sampling runs, collection stopped when the client exits, then
`qprof report RUN --format json` and its `verdict.limited_by`. Transfer sizes
are calibrated per scenario and stack (a short unprofiled transfer) so a
profiled run lasts about --seconds. Runs are interleaved (run 1 of every
scenario and stack, then run 2, ...) so a change in the host's load spreads
over all cells.

Goal (issue 5): the verdict is right in >= 95% of all runs and >= 9 of 10 in
each scenario. Everything the labs create is removed on exit, also on
Ctrl-C; leftovers of earlier killed runs are removed at start.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from qprof.netlab import (SCENARIOS, RunResult, Scenario, cleanup, measure_goodput,  # noqa: E402
                          run_scenario, size_for, transfer_factory)

GOAL_OVERALL, GOAL_CELL = 0.95, 0.9


def fmt_run(r: RunResult) -> str:
    if r.error:
        return f"ERROR {r.error}"
    v = r.verdict if r.has_verdict else "no verdict yet"
    mark = "" if r.hit is None or not r.has_verdict else (" ok" if r.hit else " WRONG")
    cpu = " ".join(f"{role} {r.cpu.get(role, 0):.2f} cores" + (f" (throttled {r.throttled[role]:.0%})"
                                                              if role in r.throttled else "")
                   for role in ("server", "client"))
    return (f"{v}{mark}  {r.goodput_mbit or 0:7.0f} Mbit/s  {r.seconds or 0:5.1f} s  "
            f"{r.size / 2**20:6.0f} MiB  {cpu}")


def table(results: list[RunResult], scenarios: list[Scenario], stacks: list[str], runs: int) -> tuple[str, bool]:
    short = {"server-limited": "S", "client-limited": "C", "neither": "N", "both": "B"}
    lines = [f"{'scenario':15s} {'stack':8s} {'expected':15s} {'hits':>7s}  per-run verdicts "
             "(S server, C client, N neither, B both, - none, E error)"]
    total = hits = 0
    goal = True
    any_verdict = any(r.has_verdict for r in results)
    for sc in scenarios:
        for st in stacks:
            cell = [r for r in results if r.scenario == sc.name and r.stack == st]
            marks = "".join("E" if r.error else short.get(r.verdict or "", "-") for r in cell)
            if sc.expected is None:
                rate = "-"
            else:
                k = sum(1 for r in cell if r.hit)
                total += len(cell)
                hits += k
                rate = f"{k}/{len(cell)}"
                goal &= len(cell) > 0 and k / len(cell) >= GOAL_CELL
            lines.append(f"{sc.name:15s} {st:8s} {sc.expected or '(as measured)':15s} {rate:>7s}  {marks}")
    overall = hits / total if total else 0.0
    goal &= total > 0 and overall >= GOAL_OVERALL
    lines.append(f"overall: {hits}/{total} = {overall:.0%} "
                 f"(goal: >= {GOAL_OVERALL:.0%} overall and >= {GOAL_CELL * 10:.0f}/10 per scenario, "
                 f">= 10 runs each: {'MET' if goal and runs >= 10 else 'not met'})")
    if results and not any_verdict:
        lines.append("no verdict yet: the reports have no verdict.limited_by (hits count as misses)")
    return "\n".join(lines), goal


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=10, help="runs per scenario and stack (default 10)")
    ap.add_argument("--stacks", default="ngtcp2,quicgo", help="comma-separated: ngtcp2 and tests/endpoints stacks")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS), help=f"comma-separated of {', '.join(SCENARIOS)}")
    ap.add_argument("--seconds", type=float, default=8.0, help="target length of a profiled transfer "
                    "(sizes assume profiling costs 30%% of the unprofiled goodput; runs land at ~5-10 s)")
    ap.add_argument("-o", "--out", type=Path, help="keep every run archive under this directory")
    ap.add_argument("-v", "--verbose", action="store_true", help="print qprof's progress messages")
    args = ap.parse_args(argv)
    stacks = [s for s in args.stacks.split(",") if s]
    unknown = [s for s in args.scenarios.split(",") if s not in SCENARIOS]
    if unknown or args.runs < 1:
        ap.error(f"unknown scenario(s) {unknown}" if unknown else "--runs must be >= 1")
    scenarios = [SCENARIOS[s] for s in args.scenarios.split(",") if s]

    for line in cleanup():
        print(f"removed leftover: {line}")
    status = (lambda m: print(f"    {m}", flush=True)) if args.verbose else (lambda m: None)
    keep = args.out is not None
    out_root = args.out or Path(tempfile.mkdtemp(prefix="qprof-verdict-matrix-"))
    out_root.mkdir(parents=True, exist_ok=True)
    results: list[RunResult] = []
    try:
        factories = {st: transfer_factory(st) for st in stacks}
        sizes: dict[tuple[str, str], int] = {}
        for sc in scenarios:
            for st in stacks:
                bps = measure_goodput(sc, factories[st])
                sizes[sc.name, st] = size_for(bps, args.seconds)
                print(f"calibrated {sc.name:15s} {st:8s} {bps / 1e6:7.0f} Mbit/s unprofiled -> "
                      f"{sizes[sc.name, st] / 2**20:.0f} MiB per run", flush=True)
        t0 = time.monotonic()
        for i in range(1, args.runs + 1):
            for sc in scenarios:
                for st in stacks:
                    run_dir = out_root / f"{sc.name}-{st}-{i:02d}"
                    r = run_scenario(sc, st, factories[st], sizes[sc.name, st], run_dir, status=status)
                    results.append(r)
                    print(f"[{i}/{args.runs}] {sc.name:15s} {st:8s} expected {sc.expected or '-':15s} "
                          f"{fmt_run(r)}", flush=True)
                    if not keep:
                        shutil.rmtree(run_dir, ignore_errors=True)
        print(f"\n{len(results)} runs in {time.monotonic() - t0:.0f} s\n")
    except KeyboardInterrupt:
        print("\ninterrupted: the table covers the runs done so far", file=sys.stderr)
    finally:
        if not keep:
            shutil.rmtree(out_root, ignore_errors=True)
    text, goal = table(results, scenarios, stacks, args.runs)
    print(text)
    if keep:
        print(f"run archives in {out_root}")
    return 0 if goal else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
