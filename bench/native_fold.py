#!/usr/bin/env python3
"""The native folder (collectors/perffold) against `perf script`: its speed and its agreement.

For every perf data chunk of a run archive (one made by bench/report_time.py --keep, or by
`qprof attach --keep-raw`):

  speed      `perf script` with qprof's exact command (collectors.perf.script_command: its fields,
             --no-inline, the targets' pids, qprof's build-id cache; output discarded) against
             `qprof-perffold` on the same chunk (output discarded), interleaved rounds (every chunk,
             both tools, the order of the two alternating), each tool's wall time; the speed-up is
             perf script's time over the folder's in the same round: the median of these paired
             ratios with a distribution-free 95% interval (attribution.stats; 6 rounds or more), per
             chunk and for the whole run (the sums of a round), and the whole run folded by one
             folder invocation per perf recorder (its chunks given together: kallsyms and the
             objects' tables read once), as a refold would call it
  agreement  perf script's text folded by qprof's own reader (collectors.perfscript) against the
             folder's records: samples per pid/tid, the share of samples whose whole stack
             (every frame's symbol and object) is identical, the leaf (symbol, object) shares (the
             largest difference in percentage points and the ten largest), and what the differing
             stacks look like (where the two first part: a frame, or one stack ending before the other)
  report     the issue's criterion: a copy of the archive whose stacks.jsonl.gz holds the folder's
             records (archive.stacks.write_stacks, the writer folding uses; same header), and
             `qprof report --format json` on it and on the original: each process's category shares
             within 0.5 pp, and the same top symbols per category

Run as root: python3 bench/native_fold.py --run DIR [--repeat 8] [--folder PATH] [--keep-copy DIR]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterable

from qprof import archive, runfiles
from qprof.archive.stacks import StackKey, StackRecord, add_counts, records, stacks_header, write_stacks
from qprof.collectors import nativefold
from qprof.collectors.perfscript import ParseStats

HERE = Path(__file__).resolve()
PP_LIMIT = 0.5  # the limit on a category share's difference, percentage points
TOP = 5  # top symbols compared per category


def folder_command(folder: Path, data: Path | list[Path], pids: list[int], root: Path) -> list[str]:
    return nativefold.command(folder, data if isinstance(data, list) else [data], pids, root)


def read_folder(text: str) -> tuple[list[StackRecord], dict[str, Any]]:
    """The folder's output: its records (collectors.nativefold.read_output) and its statistics line."""
    recs: list[StackRecord] = []
    lines = text.encode().splitlines()
    nativefold.read_output(lines, "folder output", recs, ParseStats())
    return recs, json.loads(lines[-1])[nativefold.STATS_KEY] if lines else {}


def merged(parts: Iterable[list[StackRecord]]) -> list[StackRecord]:
    """Records of consecutive chunks as one fold (collectors.folding.merge's way)."""
    acc: dict[StackKey, list[Any]] = {}
    for part in parts:
        for r in part:
            add_counts(acc, (r.pid, r.tid, r.comm, r.frames), r.samples, r.period, r.bins, r.span_ns)
    return records(acc)


def timed(cmd: list[str]) -> float:
    t0 = time.monotonic()
    p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if p.returncode:
        raise SystemExit(f"{cmd[0]} failed ({p.returncode}): {' '.join(cmd)}")
    return time.monotonic() - t0


def compare(a: list[StackRecord], b: list[StackRecord]) -> dict[str, Any]:
    """perf script's records `a` against the folder's `b`."""
    def stacks(rs: list[StackRecord]) -> collections.Counter[tuple[Any, ...]]:
        c: collections.Counter[tuple[Any, ...]] = collections.Counter()
        for r in rs:
            c[(r.pid, r.tid, r.comm, r.frames)] += r.samples
        return c

    ca, cb = stacks(a), stacks(b)
    na, nb = sum(ca.values()), sum(cb.values())
    per_thread_a: collections.Counter[tuple[int, int]] = collections.Counter()
    per_thread_b: collections.Counter[tuple[int, int]] = collections.Counter()
    for k, v in ca.items():
        per_thread_a[k[:2]] += v
    for k, v in cb.items():
        per_thread_b[k[:2]] += v
    same = sum(min(v, cb.get(k, 0)) for k, v in ca.items())
    leaf_a: collections.Counter[Any] = collections.Counter()
    leaf_b: collections.Counter[Any] = collections.Counter()
    for k, v in ca.items():
        leaf_a[k[3][0] if k[3] else None] += v
    for k, v in cb.items():
        leaf_b[k[3][0] if k[3] else None] += v
    diffs = sorted(((100 * (leaf_b[k] / max(nb, 1) - leaf_a[k] / max(na, 1)), k) for k in set(leaf_a) | set(leaf_b)),
                   key=lambda x: -abs(x[0]))
    # where differing stacks part: the first frame that differs, or one ending before the other
    parts: collections.Counter[str] = collections.Counter()
    only_a = ca - cb
    only_b = cb - ca
    for k, v in only_a.items():
        fa = k[3]
        near = max((kb for kb in only_b if kb[:3] == k[:3] and kb[3][:1] == fa[:1]),
                   key=lambda kb: _common(fa, kb[3]), default=None)
        if near is None:
            parts["no folder stack with the same thread and leaf"] += v
            continue
        fb = near[3]
        i = _common(fa, fb)
        if i == len(fa):
            parts[f"folder goes on after {fa[-1][0]} ({_short(fa[-1][1])})"] += v
        elif i == len(fb):
            parts[f"perf goes on after {fb[-1][0]} ({_short(fb[-1][1])}) with {fa[i][0]}"] += v
        else:
            parts[f"after {fa[i - 1][0] if i else '(leaf)'}: perf {fa[i][0]} / folder {fb[i][0]}"] += v
    return {"samples": (na, nb), "threads": (dict(per_thread_a), dict(per_thread_b)),
            "identical": same / na if na else 1.0, "leaf_max_pp": abs(diffs[0][0]) if diffs else 0.0,
            "leaf_top": diffs[:10], "parts": parts.most_common(8)}


def _common(a: tuple[Any, ...], b: tuple[Any, ...]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _short(dso: str) -> str:
    return dso.rsplit("/", 1)[-1]


def report(run: Path) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-c", "import sys; from qprof.cli import main; sys.argv[0] = 'qprof'; main()",
                          "report", "--format", "json", str(run)],
                         capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"qprof report failed on {run}: {out.stderr.strip()[-400:]}")
    return json.loads(out.stdout)


def copy_with(run: Path, dest: Path, recs: list[StackRecord]) -> None:
    """A copy of the archive without its perf data, its stacks file holding `recs`."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    for p in run.iterdir():
        if p.is_file() and not p.name.startswith("perf-") and p.name != runfiles.STACKS:
            shutil.copy2(p, dest / p.name)
    write_stacks(dest / runfiles.STACKS, recs, stacks_header(run / runfiles.STACKS))


def categories(rep: dict[str, Any]) -> dict[int, tuple[str, dict[str, float], dict[str, list[str]]]]:
    out = {}
    for p in rep.get("processes", []):
        tops = {c: [s[0] if isinstance(s, (list, tuple)) else s.get("symbol", str(s)) for s in syms[:TOP]]
                for c, syms in (p.get("top_symbols") or {}).items()}
        out[p["pid"]] = (p.get("role") or p["comm"], p.get("categories") or {}, tops)
    return out


def main() -> None:
    from qprof.attribution.stats import median_ci
    from qprof.collectors import debuginfo
    from qprof.collectors.perf import script_command
    from qprof.collectors.perfscript import ParseStats, StreamFolder

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", type=Path, required=True, help="a run archive that kept its perf data")
    ap.add_argument("--repeat", type=int, default=8, help="interleaved timing rounds (6+ for an interval)")
    ap.add_argument("--folder", type=Path, help="the qprof-perffold binary (default: the one make setup built)")
    ap.add_argument("--keep-copy", type=Path, help="keep the archive copy with the folder's stacks here")
    args = ap.parse_args()
    args.folder = args.folder or nativefold.built()
    if args.folder is None:
        raise SystemExit("qprof's native folder is not built: run make setup (or python -m qprof.collectors.nativefold)")

    perf = shutil.which("perf") or "perf"
    root = debuginfo.cache_root()
    meta = archive.Run.open(args.run).meta
    chunks = [(data, list(g.pids)) for g in meta.sampling.groups
              for data in runfiles.chunk_files(args.run, g.perf_data, include_current=True)]
    if not chunks:
        raise SystemExit(f"{args.run}: no perf data kept")
    if any(g.windows for g in meta.sampling.groups):
        print("note: a target moved between unwinding groups; both tools read every chunk for all its group's pids")

    # agreement, chunk by chunk
    mine_all, theirs_all, stats_all = [], [], []
    print(f"run {args.run}: {len(chunks)} chunks, "
          f"{sum(d.stat().st_size for d, _ in chunks) / 1e6:.0f} MB, unwinding {[g.unwind for g in meta.sampling.groups]}")
    for data, pids in chunks:
        text = subprocess.run(script_command(perf, data, pids, buildid_dir=root), capture_output=True,
                              text=True, errors="replace").stdout
        st = ParseStats()
        folder = StreamFolder(st)
        folder.feed(text)
        theirs = folder.finish()
        out = subprocess.run(folder_command(args.folder, data, pids, root), capture_output=True, text=True)
        if out.returncode:
            raise SystemExit(f"qprof-perffold failed on {data}: {out.stderr.strip()[-400:]}")
        mine, stats = read_folder(out.stdout)
        theirs_all.append(theirs)
        mine_all.append(mine)
        stats_all.append(stats)
        c = compare(theirs, mine)
        print(f"\n{data.name}: samples perf {c['samples'][0]} folder {c['samples'][1]} (perf's unreadable lines "
              f"{st.bad_lines}); identical stacks {100 * c['identical']:.2f}%; leaf share max diff "
              f"{c['leaf_max_pp']:.3f} pp; folder: {stats['truncated']} of {stats['user_stacks']} user stacks "
              f"ended by the stack copy, errors {stats['errors']}")
    groups = [([d for d, _ in chunks if d.name.startswith(g.perf_data)], list(g.pids)) for g in meta.sampling.groups]
    groups = [(files, pids) for files, pids in groups if files]
    once = []
    for files, pids in groups:
        out = subprocess.run(folder_command(args.folder, files, pids, root), capture_output=True, text=True)
        if out.returncode:
            raise SystemExit(f"qprof-perffold failed on {files}: {out.stderr.strip()[-400:]}")
        once.append(read_folder(out.stdout)[0])
    c1 = compare(merged(theirs_all), merged(once))
    print(f"\nthe whole run in one folder invocation per perf recorder: identical stacks {100 * c1['identical']:.2f}%, "
          f"leaf share max diff {c1['leaf_max_pp']:.3f} pp")
    c = compare(merged(theirs_all), merged(mine_all))
    print(f"\nwhole run (chunk by chunk): samples perf {c['samples'][0]}, folder {c['samples'][1]}")
    ta, tb = c["threads"]
    for k in sorted(set(ta) | set(tb)):
        print(f"  pid/tid {k[0]}/{k[1]}: perf {ta.get(k, 0)}, folder {tb.get(k, 0)}")
    print(f"  identical stacks: {100 * c['identical']:.2f}% of perf's samples")
    print(f"  leaf (symbol, object) shares: max |diff| {c['leaf_max_pp']:.3f} pp; largest (folder - perf):")
    for d, k in c["leaf_top"]:
        if abs(d) > 0:
            print(f"    {d:+.3f} pp  {k[0]} ({_short(k[1])})" if k else f"    {d:+.3f} pp  (empty stack)")
    print("  where the differing stacks part (perf's samples):")
    for what, n in c["parts"]:
        print(f"    {n:6d}  {what}")

    # the report on the folder's stacks against the original
    tmp = Path(tempfile.mkdtemp(prefix="qprof-nativefold-"))
    copy = args.keep_copy or tmp / "run"
    try:
        copy_with(args.run, copy, merged(mine_all))
        orig, native = categories(report(args.run)), categories(report(copy))
    finally:
        if args.keep_copy is None:
            shutil.rmtree(tmp, ignore_errors=True)
    print("\nqprof report --format json, original (perf script) vs the folder's stacks:")
    ok = True
    for pid in sorted(orig):
        role, cats_o, tops_o = orig[pid]
        _, cats_n, tops_n = native.get(pid, (role, {}, {}))
        worst = max((abs(100 * (cats_n.get(k, 0.0) - v)) for k, v in cats_o.items()), default=0.0)
        same_tops = all(tops_o.get(k) == tops_n.get(k) for k in tops_o)
        ok &= worst <= PP_LIMIT and same_tops
        print(f"  {role} (pid {pid}): max category diff {worst:.3f} pp; top {TOP} symbols per category "
              f"{'the same' if same_tops else 'DIFFER'}")
        for k, v in cats_o.items():
            print(f"    {k:18s} {100 * v:6.2f}%  folder {100 * cats_n.get(k, 0.0):6.2f}%")
        for k in tops_o:
            if tops_o.get(k) != tops_n.get(k):
                print(f"    {k}: perf {tops_o.get(k)}\n    {' ' * len(k)}  folder {tops_n.get(k)}")
    print(f"  criterion (each category within {PP_LIMIT} pp, same top symbols): {'met' if ok else 'NOT met'}")

    # speed: interleaved rounds
    load = os.getloadavg()
    for data, pids in chunks:  # warm the page cache for both
        timed(script_command(perf, data, pids, buildid_dir=root))
        timed(folder_command(args.folder, data, pids, root))
    t_script: dict[str, list[float]] = collections.defaultdict(list)
    t_fold: dict[str, list[float]] = collections.defaultdict(list)
    t_once: list[float] = []
    for rep in range(args.repeat):
        for i, (data, pids) in enumerate(chunks):
            order = [0, 1] if (rep + i) % 2 == 0 else [1, 0]
            for which in order:
                if which == 0:
                    t_script[data.name].append(timed(script_command(perf, data, pids, buildid_dir=root)))
                else:
                    t_fold[data.name].append(timed(folder_command(args.folder, data, pids, root)))
        once_s = 0.0
        for files, pids in groups:  # the run's chunks in one invocation: kallsyms and objects read once
            once_s += timed(folder_command(args.folder, files, pids, root))
        t_once.append(once_s)
        print(f"  [{rep + 1}/{args.repeat}] perf script {sum(v[-1] for v in t_script.values()):.3f} s, "
              f"folder {sum(v[-1] for v in t_fold.values()):.3f} s", file=sys.stderr, flush=True)
    print(f"\nspeed, {args.repeat} interleaved rounds (load average {load[0]:.2f} before, "
          f"{os.getloadavg()[0]:.2f} after; {os.cpu_count()} CPUs):")
    print(f"  {'chunk':34s} {'samples':>8s} {'perf script s':>13s} {'folder s':>9s} {'speed-up (95% CI)':>22s}")

    def line(label: str, samples: int, s: list[float], f: list[float]) -> None:
        ratios = [a / b for a, b in zip(s, f)]
        ci = median_ci(ratios)
        interval = f"{ci.low:.2f}-{ci.high:.2f}" if ci.available else "no interval"
        print(f"  {label:34s} {samples:8d} {median_ci(s).median or 0:13.3f} {median_ci(f).median or 0:9.3f} "
              f"{f'{ci.median:.2f} ({interval})':>22s}")

    for (data, _), st in zip(chunks, stats_all):
        line(data.name, st["samples"], t_script[data.name], t_fold[data.name])
    tot_s = [sum(v[r] for v in t_script.values()) for r in range(args.repeat)]
    tot_f = [sum(v[r] for v in t_fold.values()) for r in range(args.repeat)]
    line("whole run (sum per round)", sum(st["samples"] for st in stats_all), tot_s, tot_f)
    line("whole run, one folder call", sum(st["samples"] for st in stats_all), tot_s, t_once)


if __name__ == "__main__":
    main()
