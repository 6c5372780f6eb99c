"""Soak: does a long attach keep qprof's memory flat and its archive bounded?

`sudo .venv/bin/python bench/soak.py [--seconds 180] [--unwind dwarf] [--out DIR]`

Real endpoints: an ngtcp2 gtlsserver (Debian's ngtcp2-server) serving a 64 MiB file from
tmpfs. With `--ends both` (the default) one gtlsclient downloads it again and again on one
connection for the whole soak and `qprof attach --server PID --client PID` samples both (two
busy endpoints); with `--ends server`, gtlsclient downloads run back to back and only the
server is attached. DWARF unwinding by default (the costly case, ~8 KiB of stack per sample),
the default probes. At the end it prints the footprint over the whole attach: the CPU of
`qprof attach` and everything it ran (wait4) against the attached endpoints' CPU (/proc).
Every few seconds the script reads the resident memory of qprof and each helper process
(perf record, the probe loaders, the folder) and the archive's size per file, then fits a
line through the readings after a warm-up and prints the slopes and their extrapolation to
one hour.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the lab package (not installed)

from lab.bytecode import compile_tree  # noqa: E402
from lab.transfers import Ngtcp2Transfer  # noqa: E402
from qprof.probes.children import cpu_seconds  # noqa: E402

QPROF = [sys.executable, "-m", "qprof.cli"]
WARMUP_S = 30.0


def tree(root: int) -> list[int]:
    """root and every descendant (children of the children ...), from /proc/*/stat."""
    parent: dict[int, int] = {}
    for p in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{p}/stat").read_text()
            parent[int(p)] = int(stat[stat.rfind(")") + 2:].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += [c for c, pp in parent.items() if pp == pid]
    return out


def rss_bytes(pid: int) -> tuple[int, str]:
    """(resident bytes, label): perf record and the transient perf script told apart."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return 0, "?"
    if comm == "perf" and len(argv) > 1:
        comm = f"perf {argv[1].decode(errors='replace')}"
    elif comm.startswith("python"):
        loader = next((a.decode(errors="replace").split(".")[2] for a in argv if a.startswith(b"qprof.probes.")), None)
        comm = f"probes {loader}" if loader else "qprof (python)"
    elif comm.startswith("qprof-perffold"):
        comm = "qprof-perffold"
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024, comm
    return 0, comm


def archive_files(run: Path) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for p in run.iterdir() if run.is_dir() else []:
        try:
            st = p.lstat()
        except OSError:
            continue
        key = "perf-*.data* (raw)" if p.name.startswith("perf-") and ".data" in p.name else p.name
        sizes[key] = sizes.get(key, 0) + st.st_blocks * 512
    return sizes


def slope(xs: list[float], ys: list[float]) -> float:
    n = len(xs)
    if n < 2:
        return 0.0
    mx, my = sum(xs) / n, sum(ys) / n
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else 0.0


def targets_cpu_s(pids: list[int]) -> float:
    """The endpoints' CPU seconds so far (/proc; a process gone counts 0: read them while they live)."""
    return sum(cpu_seconds(p) or 0.0 for p in pids)


def clients(xfer: Ngtcp2Transfer, stop: threading.Event, done: list[int]) -> None:
    while not stop.is_set():
        r = subprocess.run(xfer.client_command(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
        done.append(r.returncode)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=180)
    ap.add_argument("--unwind", default="dwarf")
    ap.add_argument("--interval", type=float, default=5.0)
    ap.add_argument("--out", type=Path, default=None, help="keep the run archive here")
    ap.add_argument("--ends", choices=["both", "server"], default="both",
                    help="both: one long client, both ends attached; server: clients back to back, the server attached")
    args = ap.parse_args()
    compile_tree()  # qprof and its loaders start as an installed qprof does, with their bytecode
    if os.geteuid() != 0:
        print("soak: needs root (perf, bpftrace)", file=sys.stderr)
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="qprof-soak-"))
    run = args.out or workdir / "run"
    stop = threading.Event()
    done: list[int] = []
    readings: list[tuple[float, int, dict[str, int], dict[str, int]]] = []
    # both ends: 64 MiB requests on one connection, more than the soak can fetch (~10 a second here)
    with Ngtcp2Transfer(64 << 20, requests=int(args.seconds * 20) + 100 if args.ends == "both" else 1) as xfer:
        server = xfer.start_server()
        ends = ["--server", str(server)]
        targets = [server]
        if args.ends == "both":
            client = xfer.start_client_stopped()
            xfer.release_client()
            ends += ["--client", str(client)]
            targets.append(client)
            loop = None
        else:
            loop = threading.Thread(target=clients, args=(xfer, stop, done), daemon=True)
            loop.start()
        targets0 = targets_cpu_s(targets)
        att = subprocess.Popen([*QPROF, "attach", *ends, "-d", str(args.seconds),
                                "--unwind", args.unwind, "-o", str(run), "-q"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        t0 = time.monotonic()
        targets_s = 0.0
        while True:  # reaped here, with its rusage (its helpers' CPU included): Popen.poll would lose it
            pid, status, ru = os.wait4(att.pid, os.WNOHANG)
            if pid:
                att.returncode = os.waitstatus_to_exitcode(status)
                break
            time.sleep(args.interval)
            per: dict[str, int] = {}
            for member in tree(att.pid):
                rss, comm = rss_bytes(member)
                per[comm] = per.get(comm, 0) + rss
            readings.append((time.monotonic() - t0, sum(per.values()), per, archive_files(run)))
            targets_s = max(targets_s, targets_cpu_s(targets) - targets0)
            r = readings[-1]
            print(f"t={r[0]:6.1f}s  qprof+helpers RSS {r[1] / 2**20:7.1f} MiB  "
                  f"({', '.join(f'{k} {v / 2**20:.0f}' for k, v in sorted(per.items()))})  "
                  f"archive {sum(r[3].values()) / 2**20:7.1f} MiB", flush=True)
        stop.set()
        err = att.stderr.read() if att.stderr else ""
        targets_s = max(targets_s, targets_cpu_s(targets) - targets0)
        if loop is not None:
            loop.join(120)
    observer_s = ru.ru_utime + ru.ru_stime
    print(f"\nattach exit {att.returncode} {err.strip()[-300:]}; " + (
        f"{len(done)} client downloads of 64 MiB ({sum(1 for d in done if d == 0)} ok)" if args.ends == "server"
        else "one client on one connection"))
    print(f"footprint over the attach: {observer_s:.2f} CPU s of qprof and its helpers for the targets' "
          f"{targets_s:.2f} = {100 * observer_s / targets_s:.2f}%" if targets_s > 0 else "targets used no CPU")
    from qprof.archive.stacks import StacksHeader, stacks_header

    head = stacks_header(run / "stacks.jsonl.gz") or StacksHeader()
    folded = len(head.folded)
    print(f"perf data produced: {folded} chunks of 64 MiB folded ({head.samples} samples), "
          f"~{folded * 64 / args.seconds:.1f} MiB/s; dropped unfolded: {len(head.dropped)}")
    final = archive_files(run)
    print("archive at the end: " + ", ".join(f"{k} {v / 2**20:.2f} MiB" for k, v in sorted(final.items())))
    steady = [r for r in readings if r[0] >= WARMUP_S and r[1] > 0]
    if len(steady) < 3:
        print("too few readings after the warm-up: run longer")
        return 1
    xs = [r[0] for r in steady]
    rss_slope = slope(xs, [r[1] for r in steady])
    collecting = [r for r in steady if r[3]]
    keys = sorted({k for r in collecting for k in r[3]})
    print(f"\nafter a {WARMUP_S:.0f} s warm-up, {len(steady)} readings over {xs[-1] - xs[0]:.0f} s:")
    print(f"  RSS, all of qprof's processes: {steady[-1][1] / 2**20:.1f} MiB now, max "
          f"{max(r[1] for r in steady) / 2**20:.1f}, slope {rss_slope / 1024:+.2f} KiB/s -> "
          f"{(steady[-1][1] + rss_slope * (3600 - xs[-1])) / 2**20:.1f} MiB at 1 h")
    lasting = 0.0
    for comm in sorted({c for r in steady for c in r[2]}):
        vals = [r[2].get(comm, 0) for r in steady]
        if comm in ("perf script", "qprof-perffold"):  # one per chunk fold, gone once done: its peak, not a trend
            print(f"    {comm:14s} transient, one per chunk: peak {max(vals) / 2**20:.1f} MiB")
            continue
        s = slope(xs, vals)
        lasting += s
        print(f"    {comm:14s} {vals[-1] / 2**20:7.1f} MiB, slope {s / 1024:+.2f} KiB/s -> "
              f"{(vals[-1] + s * (3600 - xs[-1])) / 2**20:.1f} MiB at 1 h")
    print(f"  RSS of the lasting processes: slope {lasting / 1024:+.2f} KiB/s "
          f"(+{lasting * 3600 / 2**20:.1f} MiB over an hour)")
    folded = [sum(v for k, v in r[3].items() if not k.startswith("perf-*")) for r in collecting]
    a_slope = slope([r[0] for r in collecting], folded)
    print(f"  archive without raw perf data: {folded[-1] / 2**20:.2f} MiB now, slope {a_slope / 1024:+.2f} KiB/s "
          f"-> {(folded[-1] + a_slope * (3600 - collecting[-1][0])) / 2**20:.1f} MiB at 1 h; raw perf data "
          f"peaked at {max(r[3].get('perf-*.data* (raw)', 0) for r in collecting) / 2**20:.1f} MiB")
    for k in keys:
        if k.startswith("perf-*"):
            peak = max(r[3].get(k, 0) for r in collecting)
            print(f"    {k:24s} peak {peak / 2**20:8.2f} MiB: a sawtooth bounded by the chunk perf writes "
                  "(64 MiB) plus chunks waiting to be folded (raw budget 256 MiB), not a trend")
            continue
        s = slope([r[0] for r in collecting], [r[3].get(k, 0) for r in collecting])
        print(f"    {k:24s} {collecting[-1][3].get(k, 0) / 2**20:8.2f} MiB, slope {s / 1024:+.3f} KiB/s -> "
              f"{(collecting[-1][3].get(k, 0) + s * (3600 - collecting[-1][0])) / 2**20:8.2f} MiB at 1 h")
    if args.out is None:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0 if att.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
