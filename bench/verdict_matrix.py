"""The verdict's proof: real transfers between two namespaces, one thing made the bottleneck on purpose.

    sudo .venv/bin/python bench/verdict_matrix.py [--runs 10] [--stacks ngtcp2,quicgo]
                                                  [--scenarios server-quota,...] [-o DIR [--keep-wrong]]
                                                  [--results FILE.jsonl]
    .venv/bin/python bench/verdict_matrix.py --table-from FILE.jsonl [FILE.jsonl ...] [--markdown]

Scenarios (lab.scenarios.SCENARIOS, each with the limiting side and the cause
the verdict must name): a side's cgroup capped at 0.3 of a core; a side bound
to one CPU beside a busy process (contention); a side in a one-CPU cpuset
shared with a busy process; the client's socket held at a tiny SO_RCVBUF; the
link shaped with tbf; the server pacing its own writes (application, test
endpoints with that option only); and uncapped runs, reported as measured
with no expected answer, except that `scheduling` (multi-threaded runtimes
uncapped) is checked against `pinned` (the same transfer, each side bound to
a CPU of its own): a `scheduling` verdict must see pinning raise goodput, a
`handoffs` verdict see it lower goodput (paired by run, median ratio). The `-shared` scenarios and `busy-host` start the
sides where a shell leaves them, no cgroup made for them (the contention,
cpuset and quota cases with the busy process in the same cgroup, and both
sides free with a busy process bound to each CPU): the cells the
multi-threaded endpoints (quicgo, quinn-mt, s2nquic-mt) are judged on. The
verdict never sees any of this: it decides from what qprof measured.

Each run: a fresh lab, server and held client placed in their namespaces,
cgroups and CPUs, `qprof attach`'s session on both with the default probes,
the client released once sampling runs, collection stopped when the client
exits, then `qprof report RUN --format json` (with `--qlog` where the stack
wrote qlog) and its `verdict.limited_by` and `verdict.cause`. A run is right
when both match. Transfer sizes are calibrated per scenario and stack (a short
unprofiled transfer) so a profiled run lasts about --seconds. Runs are
interleaved (run 1 of every scenario and stack, then run 2, ...) so a change in
the host's load spreads over all cells.

A long matrix can run in chunks (a stack or a few scenarios at a time, each
under the heavy-run lock): `--results` appends every run as a JSON line, and
`--table-from` prints one table from the chunks' files. `--keep-wrong` keeps
only the archives of wrong and uncapped runs (the evidence to read).

Goal: right in >= 95% of all runs and >= 9 of 10 in each cell. Everything the
labs create is removed on exit, also on Ctrl-C; leftovers of earlier killed
runs are removed at start.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the lab package

from lab.scenarios import (SCENARIOS, RunResult, Scenario, measure_goodput, pinning_predictions,  # noqa: E402
                           run_scenario, size_for, transfer_factory, unsupported)
from qprof.attribution.stats import median_ci  # noqa: E402
from qprof.netlab import cleanup  # noqa: E402

GOAL_OVERALL, GOAL_CELL = 0.95, 0.9
SHORT = {"server-limited": "S", "client-limited": "C", "neither": "N", "both": "B"}


def fmt_run(r: RunResult) -> str:
    if r.error:
        return f"ERROR {r.error}"
    v = f"{r.verdict} ({r.cause})" if r.has_verdict else "no verdict"
    mark = "" if r.hit is None or not r.has_verdict else (" ok" if r.hit else " WRONG")
    cpu = " ".join(f"{role} {r.cpu.get(role, 0):.2f} cores" + (f" (throttled {r.throttled[role]:.0%})"
                                                              if role in r.throttled else "")
                   for role in ("server", "client"))
    word = ""
    if r.stack_word:
        word = f"  stack says {r.stack_word.get('dominant')} ({r.stack_word.get('agrees')})"
    return (f"{v}{mark}  {r.goodput_mbit or 0:7.0f} Mbit/s  {r.seconds or 0:5.1f} s  "
            f"{r.size / 2**20:6.0f} MiB  {cpu}{word}")


def cell_mark(r: RunResult) -> str:
    """One letter per run: the limiting side, lower case when the cause was wrong."""
    if r.error:
        return "E"
    m = SHORT.get(r.verdict or "", "-")
    return m.lower() if r.expected_cause and r.cause != r.expected_cause and r.verdict == r.expected else m


def seen(cell: list[RunResult]) -> str:
    """The verdicts a cell's runs gave, most frequent first: 'server-limited (cpu-starved) x9, ...'."""
    counts = Counter("error" if r.error else f"{r.verdict} ({r.cause})" for r in cell)
    return ", ".join(f"{v} x{n}" for v, n in counts.most_common())


def save(r: RunResult, path: Path) -> None:
    """Append one run to a JSON-lines file (a chunk's results, for --table-from)."""
    d = dataclasses.asdict(r)
    d["run"] = str(r.run) if r.run else None
    with open(path, "a") as f:
        f.write(json.dumps(d) + "\n")


def load(paths: list[Path]) -> list[RunResult]:
    """Runs saved by --results; a line that is not a run is one clear error."""
    fields = {f.name for f in dataclasses.fields(RunResult)}
    out = []
    for path in paths:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            try:
                d = json.loads(line)
                d["run"] = Path(d["run"]) if d.get("run") else None
                out.append(RunResult(**{k: v for k, v in d.items() if k in fields}))
            except (ValueError, TypeError, KeyError) as e:
                raise SystemExit(f"{path}:{n}: not a run saved by --results ({e})") from None
    return out


def table(results: list[RunResult], scenarios: list[Scenario], stacks: list[str], runs: int,
          skipped: dict[tuple[str, str], str]) -> tuple[str, bool]:
    lines = [f"{'scenario':18s} {'stack':7s} {'expected':32s} {'right':>6s}  per run "
             "(S server, C client, N neither, B both; lower case: right side, wrong cause; E error)"
             "  | verdicts seen"]
    total = hits = 0
    goal = True
    for sc in scenarios:
        for st in stacks:
            expect = f"{sc.expected} ({sc.cause})" if sc.expected else "(as measured)"
            if (sc.name, st) in skipped:
                lines.append(f"{sc.name:18s} {st:7s} {expect:32s} {'n/a':>6s}  {skipped[sc.name, st]}")
                continue
            cell = [r for r in results if r.scenario == sc.name and r.stack == st]
            marks = "".join(cell_mark(r) for r in cell)
            if sc.expected is None:
                rate = "-"
            else:
                k = sum(1 for r in cell if r.hit)
                total += len(cell)
                hits += k
                rate = f"{k}/{len(cell)}"
                goal &= len(cell) > 0 and k / len(cell) >= GOAL_CELL
            lines.append(f"{sc.name:18s} {st:7s} {expect:32s} {rate:>6s}  {marks}  | {seen(cell)}")
    pin_lines, pin_right, pin_made = pinning(results, stacks)
    lines += pin_lines
    total, hits = total + pin_made, hits + pin_right
    overall = hits / total if total else 0.0
    goal &= total > 0 and overall >= GOAL_OVERALL
    lines.append(f"overall: {hits}/{total} = {overall:.0%} "
                 f"(goal: >= {GOAL_OVERALL:.0%} overall and >= {GOAL_CELL * 10:.0f}/10 per cell, "
                 f">= 10 runs each: {'MET' if goal and runs >= 10 else 'not met'})")
    return "\n".join(lines), goal


def pinning(results: list[RunResult], stacks: list[str]) -> tuple[list[str], int, int]:
    """The check of the uncapped runs' `scheduling` and `handoffs` verdicts: the same transfer pinned
    (the `pinned` scenario, run i against uncapped run i: interleaved, so paired) must move more after
    `scheduling` and less after `handoffs`. Returns the lines, predictions right and predictions made."""
    lines, right, made = [], 0, 0
    for st in stacks:
        free = [r for r in results if r.scenario == "scheduling" and r.stack == st]
        bound = [r for r in results if r.scenario == "pinned" and r.stack == st]
        ratios = [b.goodput_mbit / f.goodput_mbit for f, b in zip(free, bound) if f.goodput_mbit and b.goodput_mbit]
        if not ratios:
            continue
        ci = median_ci(ratios)
        assert ci.median is not None
        span = f"[{ci.low:.2f}, {ci.high:.2f}]" if ci.available else f"(no interval: {ci.note})"
        said = Counter(w for r in free for w in pinning_predictions(r.cause))
        moved = "raise" if ci.median > 1 else "lower"
        k = said.get(moved, 0)
        right, made = right + k, made + sum(said.values())
        verdicts = ", ".join(f"{n} predict {w}" for w, n in sorted(said.items())) or "no verdict predicts it"
        lines.append(f"pinning {st:10s} pinned/uncapped goodput x{ci.median:.2f} {span}, {len(ratios)} pairs: "
                     f"{moved}s it; {verdicts}: {k}/{sum(said.values())} right")
    return lines, right, made


def markdown(results: list[RunResult], scenarios: list[Scenario], stacks: list[str]) -> str:
    """The table for the README: a row per scenario, right/total and the verdicts seen per stack."""
    lines = ["| scenario | expected | " + " | ".join(stacks) + " |", "|---|---|" + "---|" * len(stacks)]
    for sc in scenarios:
        cells = []
        for st in stacks:
            cell = [r for r in results if r.scenario == sc.name and r.stack == st]
            if not cell:
                cells.append("n/a")
                continue
            rate = f"**{sum(1 for r in cell if r.hit)}/{len(cell)}**: " if sc.expected else f"{len(cell)} runs: "
            cells.append(rate + seen(cell))
        expect = f"{sc.expected} ({sc.cause})" if sc.expected else "none (reported)"
        lines.append(f"| {sc.name} | {expect} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=10, help="runs per scenario and stack (default 10)")
    ap.add_argument("--stacks", default="ngtcp2,quicgo", help="comma-separated: ngtcp2 and lab/endpoints stacks")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS),
                    help="comma-separated of " + ", ".join(SCENARIOS).replace("%", "%%"))
    ap.add_argument("--seconds", type=float, default=6.0, help="target length of a profiled transfer "
                    "(sizes assume profiling costs 30%% of the unprofiled goodput)")
    ap.add_argument("-o", "--out", type=Path, help="keep every run archive (and qlog) under this directory")
    ap.add_argument("--keep-wrong", action="store_true", help="with -o: keep only wrong and uncapped runs")
    ap.add_argument("--results", type=Path, help="append every run to this JSON-lines file")
    ap.add_argument("--table-from", type=Path, nargs="+", metavar="FILE",
                    help="print the table of runs saved with --results (no runs); with --stacks/--scenarios")
    ap.add_argument("--markdown", action="store_true", help="with --table-from: the README's markdown table")
    ap.add_argument("-v", "--verbose", action="store_true", help="print qprof's progress messages")
    args = ap.parse_args(argv)
    stacks = [s for s in args.stacks.split(",") if s]
    unknown = [s for s in args.scenarios.split(",") if s not in SCENARIOS]
    if unknown or args.runs < 1:
        ap.error(f"unknown scenario(s) {unknown}" if unknown else "--runs must be >= 1")
    scenarios = [SCENARIOS[s] for s in args.scenarios.split(",") if s]
    if args.table_from:
        saved = load(args.table_from)
        # the stacks and scenarios the saved runs cover, unless named
        if args.stacks == ap.get_default("stacks"):
            stacks = list(dict.fromkeys(r.stack for r in saved))
        if args.scenarios == ap.get_default("scenarios"):
            ran = {r.scenario for r in saved}
            scenarios = [sc for sc in scenarios if sc.name in ran]
        if args.markdown:
            print(markdown(saved, scenarios, stacks))
            return 0
        counts = Counter((r.scenario, r.stack) for r in saved)
        none = {(sc.name, st): "no runs saved" for sc in scenarios for st in stacks if not counts[sc.name, st]}
        text, goal = table(saved, scenarios, stacks, min(counts.values(), default=0), none)
        print(text)
        return 0 if goal else 1

    for line in cleanup():
        print(f"removed leftover: {line}")
    status = (lambda m: print(f"    {m}", flush=True)) if args.verbose else (lambda m: None)
    keep = args.out is not None
    out_root = args.out or Path(tempfile.mkdtemp(prefix="qprof-verdict-matrix-"))
    out_root.mkdir(parents=True, exist_ok=True)
    results: list[RunResult] = []
    skipped: dict[tuple[str, str], str] = {}
    try:
        factories = {st: transfer_factory(st) for st in stacks}
        sizes: dict[tuple[str, str], int] = {}
        for sc in scenarios:
            for st in stacks:
                why = unsupported(sc, st)
                if why:
                    skipped[sc.name, st] = why
                    print(f"skipped    {sc.name:18s} {st:7s} {why}", flush=True)
                    continue
                bps = measure_goodput(sc, st, factories[st])
                sizes[sc.name, st] = size_for(bps, args.seconds)
                print(f"calibrated {sc.name:18s} {st:7s} {bps / 1e6:7.0f} Mbit/s unprofiled -> "
                      f"{sizes[sc.name, st] / 2**20:.0f} MiB per run", flush=True)
        t0 = time.monotonic()
        for i in range(1, args.runs + 1):
            for sc in scenarios:
                for st in stacks:
                    if (sc.name, st) in skipped:
                        continue
                    run_dir = out_root / f"{sc.name}-{st}-{i:02d}"
                    r = run_scenario(sc, st, factories[st], sizes[sc.name, st], run_dir, status=status)
                    results.append(r)
                    if args.results:
                        save(r, args.results)
                    expect = f"{sc.expected} ({sc.cause})" if sc.expected else "-"
                    print(f"[{i}/{args.runs}] {sc.name:18s} {st:7s} expected {expect:32s} {fmt_run(r)}", flush=True)
                    if not keep or (args.keep_wrong and r.hit):
                        shutil.rmtree(run_dir, ignore_errors=True)
                        shutil.rmtree(run_dir.parent / f"{run_dir.name}-qlog", ignore_errors=True)
        print(f"\n{len(results)} runs in {time.monotonic() - t0:.0f} s\n")
    except KeyboardInterrupt:
        print("\ninterrupted: the table covers the runs done so far", file=sys.stderr)
    finally:
        if not keep:
            shutil.rmtree(out_root, ignore_errors=True)
    text, goal = table(results, scenarios, stacks, args.runs, skipped)
    print(text)
    if keep:
        print(f"run archives in {out_root}")
    return 0 if goal else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
