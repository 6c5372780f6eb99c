#!/usr/bin/env python3
"""Mapping coverage on every stack buildable here: the five shares per side, Uncategorized,
DSO-only share, and whether auto-detection picked the stack's own mapping file.

Exits 1 when a side of any stack is over tests/test_stacks.py's Uncategorized bound (5%)
or auto-detection picked another stack's file; a stack not buildable here is named.

Runs one real profiled transfer per stack (ngtcp2 from Debian; the endpoints of
tests/endpoints built into the cache), both ends attached, sampling only (probe
handlers' own cost would blur what the mappings miss), default unwinding.
Run as root from the repository: .venv/bin/python bench/mappings_proof.py [--size 1G]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from endpoints.build import BuildUnavailable, build, registry  # noqa: E402
from endpoints.transfer import profile  # noqa: E402
from test_stacks import MAX_UNCATEGORIZED  # noqa: E402

from qprof.attribution.categories import CATEGORIES, UNCATEGORIZED  # noqa: E402
from qprof.collectors.session import AttachOptions, AttachSession  # noqa: E402
from qprof.endpoints import Ngtcp2Transfer, parse_size  # noqa: E402



def report(run: Path) -> dict:
    out = subprocess.run([sys.executable, "-m", "qprof.cli", "report", str(run), "--format", "json"],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def ngtcp2_run(size: int, out: Path) -> Path:
    with Ngtcp2Transfer(size) as x:
        srv, cli = x.start_server(), x.start_client_stopped()
        return AttachSession(AttachOptions(pids=[srv, cli], out=out, roles={srv: "server", cli: "client"},
                                           probes=()), on_ready=x.release_client, stop_when=x.client_done).run()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="1G", help="bytes per transfer (aioquic uses 1/16: it is slow)")
    ap.add_argument("--stacks", nargs="*", help="subset of: ngtcp2 " + " ".join(sorted(registry())))
    args = ap.parse_args()
    size = parse_size(args.size)
    names = args.stacks or ["ngtcp2", *sorted(registry())]
    tmp = Path(tempfile.mkdtemp(prefix="qprof-proof-"))
    rows, worst = [], 0.0
    for name in names:
        out = tmp / name
        try:
            if name == "ngtcp2":
                run, expected = ngtcp2_run(size, out), "ngtcp2"
            else:
                built = build(name)
                n = size // 16 if name == "aioquic" else size
                run, _ = profile(built, n, out, probes=())
                expected = built.spec.mapping
        except BuildUnavailable as e:
            print(f"{name}: not buildable here: {e}")
            continue
        rep = report(run)
        for p in sorted(rep["processes"], key=lambda p: p["role"] or ""):
            stacks = [m["name"] for m in p["mappings"] if m["kind"] == "stack"]
            shares = p["categories"]
            ok = stacks == [expected]
            rows.append((name, p["role"], shares, p["dso_only_share"], stacks, ok,
                         rep["run"]["unwinding"][str(p["pid"])]["mode"]))
            worst = max(worst, shares[UNCATEGORIZED])
    head = f"{'stack':9s} {'side':6s} " + " ".join(f"{c[:10]:>10s}" for c in CATEGORIES) + \
        f" {'DSO-only':>8s} {'unwind':>6s}  detected"
    print(head)
    print("-" * len(head))
    for name, role, shares, dso_only, stacks, ok, unwind in rows:
        print(f"{name:9s} {role:6s} " + " ".join(f"{shares[c]:10.1%}" for c in CATEGORIES)
              + f" {dso_only:8.1%} {unwind:>6s}  {','.join(stacks)} {'ok' if ok else 'WRONG'}")
    over = [f"{r[0]} {r[1]} {r[2][UNCATEGORIZED]:.1%}" for r in rows if r[2][UNCATEGORIZED] > MAX_UNCATEGORIZED]
    wrong = [f"{r[0]} {r[1]}" for r in rows if not r[5]]
    print(f"\nworst Uncategorized: {worst:.1%} (bound {MAX_UNCATEGORIZED:.0%}); auto-detection right on "
          f"{len(rows) - len(wrong)}/{len(rows)} sides")
    if over or wrong:
        print("FAILED: " + "; ".join([*(f"over the bound: {o}" for o in over),
                                      *(f"wrong stack file: {w}" for w in wrong)]))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
