"""Where a multi-threaded stack's extra cores go: quic-go against single-threaded stacks, free and pinned.

    sudo .venv/bin/python bench/kit_compare.py [--stacks quicgo,ngtcp2] [--runs 5] [--size 1G] [--seed 1]
                                               [--markdown] [-o DIR]

A KIT/TU Darmstadt throughput study saw quic-go use up to ~400% CPU for less
goodput than single-threaded stacks (which never pass 100%), and found that
pinning to cores changes throughput. This bench asks the same of this host:
each stack moves the same bytes over loopback, both ends attached with qprof's
default options, with the endpoints as users start them (no cgroup made for
them) either free or pinned (taskset: server on CPU 0, client on CPU 1). Runs
are interleaved in a random order fixed by --seed. Per configuration, medians
over the runs of: goodput (bytes over the client's run, from release to exit,
as the transfer itself measures it); per side, cores on a CPU (mean and peak
per /proc interval, from the report's thread view), CPU seconds per GB moved,
and where that CPU went: the categories, the runtime's own work (Go's
scheduler and GC, tokio), and handoffs between the process's own threads
(futex, switches, reschedule IPIs) in CPU s per GB.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the lab package

from lab.scenarios import transfer_factory  # noqa: E402
from qprof.collectors.session import AttachOptions, AttachSession  # noqa: E402
from qprof.endpoints import Placement  # noqa: E402
from qprof.units import parse_size  # noqa: E402

BINDINGS = {"free": {}, "pinned": {"server": (0,), "client": (1,)}}
CATEGORIES = ("Packet I/O", "Crypto", "Connection Mgmt", "I/O", "Uncategorized")


@dataclass
class Result:
    stack: str
    binding: str
    gbps: float
    sides: dict[str, dict[str, Any]] = field(default_factory=dict)


def one_run(stack: str, binding: str, size: int, out: Path) -> Result:
    """One profiled transfer; the figures read from `qprof report --format json`."""
    factory = transfer_factory(stack)
    placement = {role: Placement(cpus=cpus) for role, cpus in BINDINGS[binding].items()}
    with factory(size, "127.0.0.1", placement) as xfer:
        server = xfer.start_server()
        client = xfer.start_client_stopped()
        opts = AttachOptions(pids=[server, client], out=out, roles={server: "server", client: "client"})
        run = AttachSession(opts, on_ready=xfer.release_client, stop_when=xfer.client_done).run()
        xfer.client.wait(60)
        xfer.client_done()
        gbps = xfer.goodput_gbps()
        if gbps is None:
            raise SystemExit(f"{stack} client failed: {xfer.tail('client.err')}")
    rep = json.loads(subprocess.run([sys.executable, "-m", "qprof.cli", "report", str(run), "--format", "json"],
                                    capture_output=True, text=True, check=True).stdout)
    res = Result(stack, binding, gbps)
    for p in rep["processes"]:
        view = p.get("thread_view") or {}
        hand = view.get("handoffs") or {}
        gb = size / 1e9
        subs = p["subcategories"]["Uncategorized"]
        res.sides[p["role"]] = {
            "cores_mean": view.get("cores_mean"), "cores_peak": view.get("cores_peak"),
            "threads": sum(pool["threads"] for pool in view.get("pools", [])),
            "cpu_s_per_gb": p["cpu_seconds"] / gb,
            **{c: p["categories"][c] for c in CATEGORIES},
            "runtime": sum(v for k, v in subs.items() if k.startswith("runtime: ")),
            "gc": sum(v for k, v in subs.items() if k.endswith(" gc")),
            "handoff_s_per_gb": sum((hand.get("cpu_s") or {}).values()) / gb,
            "wakeups_per_datagram": hand.get("wakeups_per_datagram"),
        }
    return res


def median(xs: list[Any]) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def fmt(x: float | None, spec: str) -> str:
    return "–" if x is None else format(x, spec)


def table(results: list[Result], markdown: bool) -> str:
    cols = ["stack", "binding", "runs", "Gbit/s", "side", "threads", "cores mean", "cores peak", "CPU s/GB",
            "Packet I/O", "Crypto", "Conn", "runtime (GC)", "handoffs s/GB", "wakeups/dgram"]
    rows = []
    for key in dict.fromkeys((r.stack, r.binding) for r in results):
        rs = [r for r in results if (r.stack, r.binding) == key]
        for side in ("server", "client"):
            def m(k: str) -> float | None:
                return median([r.sides.get(side, {}).get(k) for r in rs])
            rows.append([key[0], key[1], str(len(rs)), fmt(median([r.gbps for r in rs]), ".2f"), side,
                         fmt(m("threads"), ".0f"), fmt(m("cores_mean"), ".2f"), fmt(m("cores_peak"), ".2f"),
                         fmt(m("cpu_s_per_gb"), ".2f"), fmt(m("Packet I/O"), ".1%"), fmt(m("Crypto"), ".1%"),
                         fmt(m("Connection Mgmt"), ".1%"), f"{fmt(m('runtime'), '.1%')} ({fmt(m('gc'), '.1%')})",
                         fmt(m("handoff_s_per_gb"), ".2f"), fmt(m("wakeups_per_datagram"), ".2f")])
    if markdown:
        return "\n".join(["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
                         + ["| " + " | ".join(r) + " |" for r in rows])
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(cols)]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(r, widths)) for r in [cols] + rows)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="bench/kit_compare.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--stacks", default="quicgo,ngtcp2", help="comma-separated: ngtcp2 and lab/endpoints stacks")
    ap.add_argument("--runs", type=int, default=5, help="runs per stack and binding (default 5)")
    ap.add_argument("--size", default="1G", help="bytes per transfer (default 1G)")
    ap.add_argument("--seed", type=int, default=1, help="seed of the interleaved order")
    ap.add_argument("--markdown", action="store_true", help="print the table as markdown")
    ap.add_argument("-o", "--out", type=Path, help="keep the run archives here")
    args = ap.parse_args(argv)
    size = parse_size(args.size)
    plan = [(s, b) for s in args.stacks.split(",") for b in BINDINGS] * args.runs
    random.Random(args.seed).shuffle(plan)
    out = args.out or Path(tempfile.mkdtemp(prefix="qprof-kit-"))
    results = []
    for i, (stack, binding) in enumerate(plan, 1):
        r = one_run(stack, binding, size, out / f"{stack}-{binding}-{i:02d}")
        print(f"[{i}/{len(plan)}] {stack:8s} {binding:6s} {r.gbps:.2f} Gbit/s  " + "  ".join(
            f"{side} {s['cores_mean'] or 0:.2f} cores, {s['cpu_s_per_gb']:.2f} CPU s/GB" for side, s in r.sides.items()),
            flush=True)
        results.append(r)
    print()
    print(table(results, args.markdown))
    print(f"\narchives: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
