#!/usr/bin/env python3
"""How much qprof slows a real transfer and what it costs: paired, interleaved A/B runs.

Workload: a --size (default 1 GiB) download over loopback, a fresh server and
client per run: ngtcp2 by default (payload on tmpfs, large client windows; its
client receives one datagram per recvmsg, without GRO or recvmmsg: the most
expensive case for per-packet probes), or a test endpoint (--stack). The client
is held right after exec and released when qprof is sampling (in the baseline
arm, at once). Metric: client wall time from release to exit (exit seen through
a pidfd, as the session now sees it too).

Configurations (qprof's in-process attach, AttachSession, with default options):
  default-both     perf + the default probes on server and client (as users attach)
  default-server   the same on the server only
  default-client   the same on the client only
  sampling-both    perf only (probes none) on both: what sampling alone costs
  system-both      default-both with --scope system (perf samples every CPU on wall-clock ticks)
  <group>-both     perf + one probe group alone (packetio, waits, softirq, syscalls, crypto), when asked
                   for with --configs

A pair = one baseline run (nothing attached) and one run of the configuration,
in random order within the pair; configurations are interleaved round-robin, so
slow drift and other tenants' load fall on both arms alike. Per configuration:
median wall time, the median of the per-pair ratios config/baseline with a
distribution-free 95% confidence interval (order statistics), and per arm the
CPU seconds per GiB of every process involved, medians over the runs: server
and client (/proc, read at the client's exit), qprof itself (this process's own
CPU while attached) and its helpers (perf record, the probe loader, perf script:
children's CPU less the endpoints'), of which the probe loader alone (as the
archive records it); and "during": what this process and its helpers used
between the client's release and its exit, as a share of one CPU (start-up
and folding happen outside that span: this is the CPU that competes with the
endpoints). With --probe-share each attached side's share of samples
in eBPF probe frames is computed from the archive (the report's figure).
Drops: runs whose client dropped datagrams at its receive buffer (the client
drops ~0.1% at the default 208 KiB; slow runs go with drops).

Run as root:  .venv/bin/python bench/probe_overhead.py --pairs 20
Archives go to a temporary directory, removed at the end (also on Ctrl-C).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import resource
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the lab package (not installed)

from lab.bytecode import compile_tree  # noqa: E402
from lab.transfers import Ngtcp2Transfer, Transfer  # noqa: E402
from qprof import runfiles  # noqa: E402
from qprof import archive
from qprof.collectors.procfs import descendants
from qprof.archive.model import STATUS_COMPLETE
from qprof.collectors.session import AttachOptions, AttachSession
from qprof.units import parse_size
from qprof.errors import QprofError
from qprof.probes.children import cpu_seconds
from qprof.probes.sockets import udp_ports
from qprof.probes.registry import DEFAULT_GROUPS, GROUPS

BASELINE = "baseline"
SOCKET_RCVBUFF = "SOCKET_RCVBUFF"


# ---------------------------------------------------------------- configurations

# An attach function runs one collection around a transfer (server and client pids given): it must
# call `release()` once it is ready, return when the client has exited (or on its own timeout), and
# return what it learnt (archive facts) as a dict.
AttachFn = Callable[[Transfer, int, int, Callable[[], None], Path, float], dict[str, Any]]
ROLES = {"both": ("server", "client"), "server": ("server",), "client": ("client",)}


@dataclass(frozen=True)
class Config:
    name: str
    attach: AttachFn | None  # None: baseline
    describe: str
    groups: tuple[str, ...] = ()


def qprof_attach(probes: tuple[str, ...], sides: str = "both", scope: str = "auto") -> AttachFn:
    """qprof's in-process attach on these sides with these probe groups and sampling scope, default
    options otherwise."""
    def attach(xfer: Transfer, server: int, client: int, release: Callable[[], None], out: Path,
               timeout: float) -> dict[str, Any]:
        roles = {pid: role for pid, role in ((server, "server"), (client, "client")) if role in ROLES[sides]}
        opts = AttachOptions(pids=list(roles), out=out, probes=probes, duration=timeout, roles=roles, scope=scope)
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        with interrupt_guard():
            run = AttachSession(opts, on_ready=release, stop_when=xfer.client_done, stop_when_exits=[client]).run()
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        info = read_archive(run, probes)
        info["self_cpu"] = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
        info["run"] = run
        return info
    return attach


@contextmanager
def interrupt_guard() -> Iterator[None]:
    """Raise KeyboardInterrupt after the block if SIGINT/SIGTERM arrived in it.

    AttachSession handles both signals itself (the first one ends collection) and
    forgets one that arrives after collection ended (while folding); the signal
    wakeup fd sees every signal that has a Python handler, whatever the handler does."""
    r, w = os.pipe()
    os.set_blocking(r, False)
    os.set_blocking(w, False)
    old = signal.set_wakeup_fd(w)
    try:
        yield
    finally:
        signal.set_wakeup_fd(old)
        try:
            got = os.read(r, 4096)
        except BlockingIOError:
            got = b""
        os.close(r)
        os.close(w)
    if any(b in (signal.SIGINT, signal.SIGTERM) for b in got):
        raise KeyboardInterrupt


def configurations() -> list[Config]:
    """Every configuration --configs can name; DEFAULT_CONFIGS run when none is named."""
    configs = [Config(f"default-{sides}", qprof_attach(DEFAULT_GROUPS, sides),
                      f"perf + {','.join(DEFAULT_GROUPS)} on {sides}", tuple(DEFAULT_GROUPS))
               for sides in ("both", "server", "client")]
    configs.append(Config("sampling-both", qprof_attach((), "both"), "perf only on both"))
    rest = tuple(g for g in DEFAULT_GROUPS if g != "waits")  # the default attach without wall-clock tracing
    configs.append(Config("nowaits-both", qprof_attach(rest, "both"), f"perf + {','.join(rest)} on both", rest))
    configs.append(Config("system-both", qprof_attach(DEFAULT_GROUPS, "both", "system"),
                          "perf (--scope system) + default probes on both", tuple(DEFAULT_GROUPS)))
    for g in GROUPS:  # each group alone, the default ones too: which of them costs what
        configs.append(Config(f"{g}-both", qprof_attach((g,), "both"), f"perf + {g} alone on both", (g,)))
    return configs


DEFAULT_CONFIGS = ("default-both", "default-server", "default-client", "sampling-both")


# ---------------------------------------------------------------- one run

@dataclass
class RunResult:
    config: str
    pair: int
    position: int  # 0: first of its pair, 1: second
    wall_s: float | None = None
    error: str | None = None
    drops: int | None = None
    drops_source: str = ""
    sock_drops: int | None = None  # polled per-socket counter (lower bound)
    snmp_drops: int | None = None
    client_port: int | None = None
    session_s: float | None = None
    bpf_ns: int | None = None
    programs: dict[str, int] = field(default_factory=dict)  # BPF program name -> run_time_ns
    load1: float | None = None
    cpu: dict[str, float] = field(default_factory=dict)  # process -> CPU seconds (server, client, qprof...)
    probe_share: dict[str, float] = field(default_factory=dict)  # role -> share of its samples in probe frames

    @property
    def ok(self) -> bool:
        return self.error is None and self.wall_s is not None


# this process; perf record and perf script; the probe loader, and the short-lived helpers qprof ran
# and reaped meanwhile (ss, nsenter, tc, bpftool: their CPU is only in this process's children times)
OBSERVERS = ("qprof", "perf", "other")


def observer_cpu(exclude: set[int]) -> dict[str, float]:
    """CPU seconds used so far by this process (every thread: qprof's in-process session) and by
    every live process descended from it (perf, the probe loader), the endpoints in `exclude` and
    their descendants left out, by OBSERVERS kind. Read at the client's release and at its exit,
    the difference is what observing took while the transfer ran: the CPU that competes with the
    endpoints, unlike start-up and folding, which happen before and after. Children reaped in
    between count as "other": the endpoints are reaped only after the exit's reading."""
    me = os.getpid()
    endpoints = {d for pid in exclude for d in descendants(pid)}
    t = os.times()
    out = {"qprof": t.user + t.system, "perf": 0.0, "other": t.children_user + t.children_system}
    for pid in descendants(me):
        if pid == me or pid in endpoints:
            continue
        try:
            with open(f"/proc/{pid}/comm", encoding="ascii", errors="replace") as f:
                kind = "perf" if f.read().startswith("perf") else "other"
        except OSError:
            continue
        out[kind] += cpu_seconds(pid) or 0.0
    return out


def rcvbuf_errors() -> int:
    """Udp RcvbufErrors (+ Udp6) of this network namespace."""
    total = 0
    with open("/proc/net/snmp", encoding="ascii") as f:
        rows = [ln.split() for ln in f if ln.startswith("Udp:")]
    if len(rows) == 2:
        total += int(dict(zip(rows[0][1:], rows[1][1:])).get("RcvbufErrors", 0))
    try:
        with open("/proc/net/snmp6", encoding="ascii") as f:
            for ln in f:
                k, _, v = ln.partition(" ")
                if k == "Udp6RcvbufErrors":
                    total += int(v)
    except OSError:
        pass
    return total


def _udp_rows() -> list[list[str]]:
    rows: list[list[str]] = []
    for table in ("/proc/net/udp", "/proc/net/udp6"):
        try:
            with open(table, encoding="ascii") as f:
                next(f, None)
                rows += [ln.split() for ln in f]
        except OSError:
            continue
    return [r for r in rows if len(r) > 12]


def socket_drops(inode: str) -> int | None:
    """The `drops` column of one UDP socket in /proc/net/udp{,6} (None once it is closed)."""
    for r in _udp_rows():
        if r[9] == inode:
            return int(r[12])
    return None


def udp_socket_of(pid: int) -> tuple[int, str] | None:
    """(local port, inode) of the process's first UDP socket."""
    found = udp_ports(pid)
    inode = next(iter(found), None)
    return (found[inode], inode) if inode is not None else None


class ExitWatcher:
    """Exact exit time of a child through a pidfd (readable at exit, before anyone reaps it).

    While the child runs it also finds the child's UDP socket (its port matches
    probes.json drops to the client) and reads that socket's drop counter every
    SOCKET_POLL s: a per-socket count, unlike the namespace-wide MIB, that misses
    at most the drops of the last SOCKET_POLL s. Same observer in every arm."""

    SOCKET_POLL = 0.1

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.fd = os.pidfd_open(pid)
        self.exited_at: float | None = None
        self.cpu_at_exit: float | None = None  # the client's CPU seconds, read before anyone reaps it
        self.server_pid: int | None = None
        self.server_cpu_at_exit: float | None = None
        self.port: int | None = None
        self.sock_drops: int | None = None
        self.snmp_after: int | None = None
        self.observer_at_release: dict[str, float] | None = None  # observer_cpu() at the release
        self.observer_at_exit: dict[str, float] | None = None
        self.released = threading.Event()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        self.released.wait()
        inode: str | None = None
        while not select.select([self.fd], [], [], self.SOCKET_POLL if inode else 0.01)[0]:
            if inode is None:
                found = udp_socket_of(self.pid)
                if found:
                    self.port, inode = found
            else:
                d = socket_drops(inode)
                if d is not None:
                    self.sock_drops = d
        self.exited_at = time.monotonic()
        self.cpu_at_exit = cpu_seconds(self.pid)
        self.observer_at_exit = observer_cpu({self.pid, self.server_pid or 0})
        if self.server_pid is not None:
            self.server_cpu_at_exit = cpu_seconds(self.server_pid)
        self.snmp_after = rcvbuf_errors()
        self._done.set()

    def wait(self, timeout: float) -> bool:
        return self._done.wait(timeout)

    def close(self) -> None:
        self.released.set()
        self._done.wait(2.0)  # the client is gone by now: let the thread finish before its fd closes
        if self._done.is_set():
            os.close(self.fd)


def read_archive(run: Path, probes: tuple[str, ...]) -> dict[str, Any]:
    """What a probe-overhead run needs from qprof's archive; raise when the run did not measure."""
    meta = archive.Run.open(run).meta
    info: dict[str, Any] = {"session_s": meta.duration_s, "stop_reason": meta.stop_reason}
    if (meta.stop_reason or "").startswith("interrupted"):
        raise KeyboardInterrupt
    if meta.status != STATUS_COMPLETE:
        raise QprofError(f"archive incomplete: {meta.incomplete_reason}")
    try:
        pj = json.loads((run / runfiles.PROBES).read_text(encoding="utf-8"))
    except FileNotFoundError:
        pj = None
    if probes:
        if pj is None:
            raise QprofError("no probes.json: probes did not run")
        lost = [u for u in pj.get("unavailable", []) if u.get("probe") in (*probes, "all")]
        if lost:
            raise QprofError("probes unavailable, nothing would be measured: " +
                             "; ".join(f"{u['probe']}: {u['reason']}" for u in lost))
        cost = pj.get("cost") or {}
        info["loader_cpu"] = sum(float(p.get("cpu_s") or 0) for p in (pj.get("programs") or {}).values())
        info["bpf_ns"] = int(cost.get("bpf_run_time_ns") or 0)
        info["programs"] = {p.get("name") or str(p.get("id")): int(p.get("run_time_ns") or 0)
                            for p in cost.get("programs", [])}
        udp_drops: dict[str, int] = {}
        # bpftrace may omit an empty map: a loaded kfree_skb program means "watched, none seen"
        have = any(name.startswith("kfree_skb") for name in info["programs"])
        for prog in (pj.get("programs") or {}).values():
            m = (prog.get("maps") or {})
            have = have or "@udp_drops" in m
            udp_drops.update(m.get("@udp_drops") or {})
        if have:
            info["udp_drops"] = udp_drops
            info["drop_reason_names"] = pj.get("drop_reason_names") or {}
    return info


def drops_to_port(info: dict[str, Any], port: int) -> int:
    """Receive-buffer drops to `port` in a bpftrace @udp_drops map keyed "reason,port"."""
    names = info.get("drop_reason_names", {})
    total = 0
    for key, n in info["udp_drops"].items():
        reason, _, p = key.partition(",")
        if p.strip().isdigit() and int(p) == port and names.get(reason.strip(), SOCKET_RCVBUFF) == SOCKET_RCVBUFF:
            total += int(n)
    return total


def load1() -> float | None:
    try:
        with open("/proc/loadavg", encoding="ascii") as f:
            return float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


MakeTransfer = Callable[[int, Path | None], Transfer]  # (size, tmpfs dir or None) -> a transfer not started


def transfer_maker(stack: str) -> MakeTransfer:
    """ngtcp2 from Debian (payload on tmpfs), or a test endpoint built from the registries (lab/endpoints)."""
    if stack == "ngtcp2":
        return lambda size, shm: Ngtcp2Transfer(size) if shm is None else \
            Ngtcp2Transfer(size, workdir=Path(tempfile.mkdtemp(prefix="xfer-", dir=shm)))
    from lab.scenarios import transfer_factory

    factory = transfer_factory(stack)
    return lambda size, shm: factory(size, "127.0.0.1", {})


def probe_shares(run: Path) -> dict[str, float]:
    """Each attached side's share of samples in eBPF probe frames, as `qprof report` computes it."""
    r = subprocess.run([sys.executable, "-m", "qprof.cli", "report", str(run), "--format", "json"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        return {}
    return {p["role"] or str(p["pid"]): p["probe_share"] for p in json.loads(r.stdout)["processes"]}


def run_once(config: Config, pair: int, position: int, size: int, workroot: Path,
             timeout: float, shmroot: Path | None = None,
             make: MakeTransfer = transfer_maker("ngtcp2"), probe_share: bool = False) -> RunResult:
    """One transfer under `config`; failures are recorded, Ctrl-C propagates.
    The run's archive goes under `workroot`, the payload under `shmroot` (tmpfs)."""
    res = RunResult(config.name, pair, position, load1=load1())
    rundir = Path(tempfile.mkdtemp(prefix=f"{config.name}-", dir=workroot))
    watcher: ExitWatcher | None = None
    children0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    server_final: float | None = None
    try:
        xfer = make(size, shmroot)
        with xfer:
            server = xfer.start_server()
            client = xfer.start_client_stopped()
            watcher = ExitWatcher(client)
            watcher.server_pid = server
            snmp_before: list[int] = []

            def release() -> None:
                snmp_before.append(rcvbuf_errors())
                watcher.observer_at_release = observer_cpu({server, client})
                watcher.released.set()
                xfer.release_client()

            info: dict[str, Any] = {}
            if config.attach is None:
                release()
                watcher.wait(timeout)
            else:
                info = config.attach(xfer, server, client, release, rundir / "run", timeout)
                watcher.wait(5.0 if xfer.client_done() else 0.0)
            if watcher.exited_at is None or xfer.released_at is None:
                res.error = f"client did not finish within {timeout:g} s"
                return res
            rc = xfer.client.wait() if xfer.client is not None else None
            if rc:
                res.error = f"client exit {rc}"
                return res
            res.wall_s = watcher.exited_at - xfer.released_at
            res.client_port = watcher.port
            res.sock_drops = watcher.sock_drops
            if snmp_before and watcher.snmp_after is not None:
                res.snmp_drops = watcher.snmp_after - snmp_before[0]
            res.session_s = info.get("session_s")
            res.bpf_ns = info.get("bpf_ns")
            res.programs = info.get("programs", {})
            if "udp_drops" in info and watcher.port is not None:
                res.drops, res.drops_source = drops_to_port(info, watcher.port), "probes"
            elif res.sock_drops is not None:
                res.drops, res.drops_source = res.sock_drops, "socket"
            else:
                res.drops, res.drops_source = res.snmp_drops, "snmp"
            if probe_share and "run" in info:
                res.probe_share = probe_shares(info["run"])
            res.cpu = {k: v for k, v in (("server", watcher.server_cpu_at_exit), ("client", watcher.cpu_at_exit),
                                         ("qprof", info.get("self_cpu")), ("loader", info.get("loader_cpu")))
                       if v is not None}
            if watcher.observer_at_release is not None and watcher.observer_at_exit is not None:
                for k in OBSERVERS:
                    res.cpu[f"during_{k}"] = watcher.observer_at_exit[k] - watcher.observer_at_release[k]
            server_final = cpu_seconds(server)
        children1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        spent = (children1.ru_utime - children0.ru_utime) + (children1.ru_stime - children0.ru_stime)
        if "client" in res.cpu and server_final is not None:
            res.cpu["helpers"] = max(0.0, spent - res.cpu["client"] - server_final)
        return res
    except QprofError as e:
        res.error = str(e)
        return res
    finally:
        if watcher is not None:
            watcher.close()
        shutil.rmtree(rundir, ignore_errors=True)


# ---------------------------------------------------------------- statistics

def median_ci(values: list[float], conf: float = 0.95) -> tuple[float, float, float] | None:
    """Distribution-free CI of a median: order statistics x(k)..x(n+1-k) with the largest k
    such that P(Binomial(n, 1/2) <= k-1) <= (1-conf)/2. Returns (low, high, exact coverage)."""
    x = sorted(values)
    n = len(x)
    tail = (1 - conf) / 2
    k, cdf = 0, 0.0
    while True:
        p_next = cdf + math.comb(n, k) / 2 ** n  # P(B <= k)
        if p_next > tail:
            break
        cdf, k = p_next, k + 1
    if k == 0:
        return None  # n too small (< 6 for 95%)
    return x[k - 1], x[n - k], 1 - 2 * cdf


def ci_rank(n: int, conf: float = 0.95) -> int:
    tail, k, cdf = (1 - conf) / 2, 0, 0.0
    while cdf + math.comb(n, k) / 2 ** n <= tail:
        cdf += math.comb(n, k) / 2 ** n
        k += 1
    return k


@dataclass
class Pair:
    config: str
    index: int
    base: RunResult
    conf: RunResult

    @property
    def ratio(self) -> float:
        assert self.base.wall_s and self.conf.wall_s
        return self.conf.wall_s / self.base.wall_s


def fmt_pct(r: float) -> str:
    return f"{(r - 1) * 100:+.1f}"


def summarize(configs: list[Config], pairs: list[Pair], failures: int, seed: int, size: int,
              loads: tuple[float | None, float | None], interrupted: bool, stack: str = "ngtcp2") -> str:
    out: list[str] = []
    gib = size / (1 << 30)
    what = "ngtcp2 (gtlsserver -> gtlsclient)" if stack == "ngtcp2" else f"{stack} (test endpoints)"
    out.append(f"probe overhead: {gib:g} GiB {what} loopback download, qprof attached with "
               f"default options to the sides each configuration names; metric = client wall time, release -> exit")
    out.append(f"pairs interleaved round-robin, order random within each pair (seed {seed}); "
               f"failed runs redone: {failures}" + ("; INTERRUPTED: partial results" if interrupted else ""))
    head = (f"{'config':<10} {'pairs':>5} {'base s':>7} {'conf s':>7} {'ratio':>6}  {'95% CI':<15} "
            f"{'overhead %':<19} {'drop runs b/c':>13}  {'ratio w/o drops':>15}")
    out.append(head)
    out.append("-" * len(head))
    cost_lines: list[str] = []
    for cfg in configs:
        ps = [p for p in pairs if p.config == cfg.name]
        if not ps:
            continue
        ratios = [p.ratio for p in ps]
        r = statistics.median(ratios)
        ci = median_ci(ratios)
        ci_s = f"[{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "n too small"
        ov = f"{fmt_pct(r)} [{fmt_pct(ci[0])}, {fmt_pct(ci[1])}]" if ci else fmt_pct(r)
        bd = sum(1 for p in ps if (p.base.drops or 0) > 0)
        cd = sum(1 for p in ps if (p.conf.drops or 0) > 0)
        clean = [p.ratio for p in ps if not p.base.drops and not p.conf.drops]
        clean_s = f"{statistics.median(clean):.3f} ({len(clean)})" if clean else "- (0)"
        out.append(f"{cfg.name:<10} {len(ps):>5} {statistics.median(p.base.wall_s for p in ps):>7.3f} "
                   f"{statistics.median(p.conf.wall_s for p in ps):>7.3f} {r:>6.3f}  {ci_s:<15} {ov:<19} "
                   f"{f'{bd}/{len(ps)} {cd}/{len(ps)}':>13}  {clean_s:>15}")
        costs = [p.conf for p in ps if p.conf.bpf_ns is not None and p.conf.session_s]
        if costs and any(c.programs for c in costs):
            share = statistics.median(c.bpf_ns / (c.session_s * 1e9) for c in costs)
            per_wall = statistics.median(c.bpf_ns / (c.wall_s * 1e9) for c in costs)
            ms = statistics.median(c.bpf_ns / 1e6 for c in costs)
            progs: dict[str, list[int]] = {}
            for c in costs:
                for name, ns in c.programs.items():
                    progs.setdefault(name, []).append(ns)
            tot = sum(statistics.median(v) for v in progs.values()) or 1
            top = sorted(((statistics.median(v), k) for k, v in progs.items()), reverse=True)
            cost_lines.append(
                f"  {cfg.name}: BPF run time {ms:.0f} ms per run = {share * 100:.1f}% of one CPU over the "
                f"session ({per_wall * 100:.1f}% of client wall time); by program: " +
                ", ".join(f"{k} {v / tot * 100:.0f}%" for v, k in top if v / tot >= 0.02))
    out.append("")
    out += cpu_table(configs, pairs, size)
    n = max((sum(1 for p in pairs if p.config == c.name) for c in configs), default=0)
    k = ci_rank(n) if n else 0
    if k:
        cov = median_ci([float(i) for i in range(n)])
        out.append(f"95% CI: order statistics x({k})..x({n + 1 - k}) of the {n} sorted per-pair ratios "
                   f"(exact binomial, distribution-free; coverage {cov[2] * 100:.1f}%); ratio = config/baseline, "
                   f"overhead = (ratio-1)*100")
    out.append("drop runs b/c: runs whose client dropped datagrams (baseline/config arm); "
               "'ratio w/o drops': median ratio over pairs where neither run dropped (count)")
    if cost_lines:
        out.append("qprof's own probe cost (probes.json cost.bpf_run_time_ns / session duration; BPF program "
                   "time only, not the tracepoint dispatch around it):")
        out += cost_lines
    runs = [r for p in pairs for r in (p.base, p.conf)]
    src = {k: sum(1 for r in runs if r.drops_source == k) for k in ("probes", "socket", "snmp")}
    checked = [r for r in runs if r.drops_source == "probes" and r.sock_drops is not None]
    agree = sum(1 for r in checked if (r.drops > 0) == (r.sock_drops > 0))
    polluted = sum(1 for r in runs if r.snmp_drops and not r.drops)
    out.append(f"drop counts from: probes.json {src['probes']} runs, client socket counter {src['socket']}, "
               f"netns MIB {src['snmp']}; socket counter agreed with probes.json (drops or not) in "
               f"{agree}/{len(checked)} runs; netns RcvbufErrors rose without client drops in {polluted} runs "
               f"(other tenants)")
    ls = [r.load1 for r in runs if r.load1 is not None]
    span = f"{min(ls):.1f}-{max(ls):.1f} over the runs" if ls else "unknown"
    out.append(f"noise: {os.cpu_count()} CPUs, possibly shared with other tenants (cargo builds, tests); 1-min "
               f"load average {loads[0]} at start, {loads[1]} at end, {span}; pairing and interleaving put "
               f"that noise on both arms alike")
    return "\n".join(out)


CPU_COLUMNS = ("server", "client", "qprof", "helpers", "loader")


def cpu_table(configs: list[Config], pairs: list[Pair], size: int) -> list[str]:
    """CPU seconds per GiB, medians over each configuration's runs, both arms; probe frames per side."""
    gib = size / (1 << 30)
    out = ["CPU s per GiB (medians; qprof = this process while attached, helpers = perf record, probe loader, "
           "perf script; loader = the probe loader alone) and samples in probe frames per attached side:",
           "  during = what this process and its descendants other than the endpoints used from the client's "
           "release to its exit, as a share of one CPU over that time (competes with the endpoints): "
           "all, and qprof (this process) / perf / other (the probe loader)",
           f"{'config':<16} {'arm':<5} " + " ".join(f"{c:>8}" for c in CPU_COLUMNS)
           + f" {'during':>7} {'qprof/perf/other':>18}  probe frames"]
    for cfg in configs:
        ps = [p for p in pairs if p.config == cfg.name]
        if not ps:
            continue
        for arm, runs in (("base", [p.base for p in ps]), ("conf", [p.conf for p in ps])):
            cells = []
            for col in CPU_COLUMNS:
                vals = [r.cpu[col] / gib for r in runs if col in r.cpu]
                cells.append(f"{statistics.median(vals):8.3f}" if vals else f"{'-':>8}")
            timed = [r for r in runs if "during_qprof" in r.cpu and r.wall_s]
            if timed:
                share = {k: statistics.median(r.cpu[f"during_{k}"] / r.wall_s for r in timed) for k in OBSERVERS}
                total = statistics.median(sum(r.cpu[f"during_{k}"] for k in OBSERVERS) / r.wall_s for r in timed)
                cells.append(f"{total:7.1%} " + f"{'/'.join(f'{share[k]:.1%}' for k in OBSERVERS):>18}")
            else:
                cells.append(f"{'-':>7} {'-':>18}")
            shares = {role: [r.probe_share[role] for r in runs if role in r.probe_share]
                      for role in ("server", "client")}
            sh = ", ".join(f"{role} {statistics.median(v):.2%} (max {max(v):.2%})" for role, v in shares.items() if v)
            out.append(f"{cfg.name:<16} {arm:<5} " + " ".join(cells) + f"  {sh}")
    return out


def raw_block(pairs: list[Pair]) -> str:
    out = ["raw runs (wall s, * = ran first in its pair; d = client drops from p=probes.json, s=socket counter, "
           "n=netns MIB; bpf = BPF run time ms; load = 1-min load average at each run's start):"]
    for p in sorted(pairs, key=lambda p: (p.config, p.index)):
        def one(r: RunResult) -> str:
            d = f"d={r.drops}{r.drops_source[:1]}"
            return f"{r.wall_s:.3f}{'*' if r.position == 0 else ' '} {d:<8}"
        bpf = f"bpf={p.conf.bpf_ns / 1e6:.0f}" if p.conf.bpf_ns is not None else ""
        out.append(f"{p.config:<9} {p.index:>3}  base {one(p.base)} conf {one(p.conf)} ratio {p.ratio:.3f} "
                   f"{bpf:<8} load {p.base.load1}/{p.conf.load1}")
    return "\n".join(out)


# ---------------------------------------------------------------- main

def probe_scripts(configs: list[Config]) -> dict[str, str]:
    """Short hashes of the probe groups' folders the configurations run (the tree may change under a
    long run)."""
    root = Path(__file__).resolve().parent.parent / "probes"
    out = {}
    for g in sorted({g for c in configs for g in c.groups}):
        h = hashlib.sha256()
        for f in sorted((root / g).glob("*")):
            if f.is_file() and f.suffix in (".c", ".py", ".bt"):
                h.update(f.name.encode() + f.read_bytes())
        out[g] = h.hexdigest()[:10]
    return out


def tree_version() -> str:
    here = Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "-C", str(here), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (head or "unknown") + (" + uncommitted changes" if dirty else "")


def _raise_interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def run_benchmark(configs: list[Config], npairs: int, size: int, seed: int, timeout: float,
                  warmup: int, workroot: Path, shmroot: Path | None,
                  log: Callable[[str], None], make: MakeTransfer,
                  probe_share: bool = True, versus: Config | None = None) -> tuple[list[Pair], int, bool]:
    """`versus`: the configuration every pair's first arm runs (nothing attached when None): a cost of
    one part alone is the default attach paired against the same attach without it."""
    rng = random.Random(seed)
    baseline = Config(BASELINE, versus.attach if versus else None, versus.describe if versus else "nothing attached",
                      versus.groups if versus else ())
    pairs: list[Pair] = []
    failures = 0
    try:
        for i in range(warmup):
            for cfg in (baseline, next((c for c in configs if c.name == "default-both"), configs[-1])):
                r = run_once(cfg, -1, 0, size, workroot, timeout, shmroot, make)
                log(f"warm-up {cfg.name}: {r.wall_s and round(r.wall_s, 3)} {r.error or ''}")
        for i in range(npairs):
            for cfg in configs:
                for attempt in range(3):
                    order = [baseline, cfg]
                    rng.shuffle(order)
                    runs = {c.name: run_once(c, i, pos, size, workroot, timeout, shmroot, make, probe_share)
                            for pos, c in enumerate(order)}
                    b, c = runs[BASELINE], runs[cfg.name]
                    if b.ok and c.ok:
                        pairs.append(Pair(cfg.name, i, b, c))
                        log(f"pair {i + 1}/{npairs} {cfg.name:<9} base {b.wall_s:.3f} (d={b.drops}) "
                            f"conf {c.wall_s:.3f} (d={c.drops}) ratio {c.wall_s / b.wall_s:.3f}")
                        break
                    failures += 1
                    log(f"pair {i + 1} {cfg.name}: failed ({b.error or ''} {c.error or ''}), redoing")
                else:
                    raise QprofError(f"{cfg.name}: 3 failed attempts in a row; last: {b.error or c.error}")
    except KeyboardInterrupt:
        return pairs, failures, True
    return pairs, failures, False


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=20, help="pairs per configuration (default 20)")
    ap.add_argument("--size", default="1G", help="download size (default 1G)")
    ap.add_argument("--stack", default="ngtcp2",
                    help="ngtcp2 (Debian's) or a test endpoint: quicgo, quinn, quiche, s2nquic (built on first use)")
    ap.add_argument("--configs", help=f"comma list of configurations to run (default: {','.join(DEFAULT_CONFIGS)})")
    ap.add_argument("--seed", type=int, default=1, help="seed of the within-pair order (default 1)")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds before a run counts as failed")
    ap.add_argument("--warmup", type=int, default=1, help="discarded warm-up rounds (default 1)")
    ap.add_argument("-q", "--quiet", action="store_true", help="no per-pair progress on stderr")
    ap.add_argument("--versus", help="a configuration for the pairs' other arm instead of nothing attached "
                                      "(e.g. --configs default-both --versus nowaits-both: the waits probes' cost)")
    ap.add_argument("--no-probe-share", action="store_true",
                    help="skip the report of every run (probe frames per side; ~2 s a run)")
    args = ap.parse_args(argv)
    compile_tree()  # the loaders start as an installed qprof's do, with their bytecode
    if os.geteuid() != 0:
        print("probe_overhead: run as root (perf and bpftrace on another process)", file=sys.stderr)
        return 2
    if args.pairs < 1:
        ap.error("--pairs must be >= 1")
    size = parse_size(args.size)
    configs = configurations()
    if not args.configs:
        configs = [c for c in configs if c.name in DEFAULT_CONFIGS]
    else:
        wanted = [c.strip() for c in args.configs.split(",") if c.strip()]
        unknown = set(wanted) - {c.name for c in configs}
        if unknown:
            ap.error(f"unknown configuration(s) {', '.join(sorted(unknown))}: "
                     f"choose from {', '.join(c.name for c in configs)}")
        configs = [c for c in configs if c.name in wanted]
    versus = next((c for c in configurations() if c.name == args.versus), None)
    if args.versus and versus is None:
        ap.error(f"unknown --versus configuration {args.versus}")

    def log(msg: str) -> None:
        if not args.quiet:
            print(msg, file=sys.stderr, flush=True)

    old_term = signal.signal(signal.SIGTERM, _raise_interrupt)
    workroot = Path(tempfile.mkdtemp(prefix="qprof-overhead-"))
    shm = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    shmroot = Path(tempfile.mkdtemp(prefix="qprof-overhead-", dir=shm)) if shm else None
    load_start = load1()
    scripts, tree = probe_scripts(configs), tree_version()
    try:
        log(f"configurations: {', '.join(f'{c.name} ({c.describe})' for c in configs)}; "
            f"{args.pairs} pairs each; archives in {workroot} (removed at the end)")
        pairs, failures, interrupted = run_benchmark(configs, args.pairs, size, args.seed, args.timeout,
                                                     args.warmup, workroot, shmroot, log,
                                                     transfer_maker(args.stack), not args.no_probe_share, versus)
    except QprofError as e:
        print(f"probe_overhead: {e}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(workroot, ignore_errors=True)
        if shmroot is not None:
            shutil.rmtree(shmroot, ignore_errors=True)
        signal.signal(signal.SIGTERM, old_term)
    if not pairs:
        print("probe_overhead: interrupted before any pair completed" if interrupted else
              "probe_overhead: no pair completed", file=sys.stderr)
    else:
        if versus is not None:
            print(f"the pairs' other arm (\"baseline\" below) is {versus.name}: {versus.describe}")
        print(summarize(configs, pairs, failures, args.seed, size, (load_start, load1()), interrupted, args.stack))
        changed = probe_scripts(configs) != scripts
        print(f"qprof tree {tree}; probe scripts " + ", ".join(f"{k} {v}" for k, v in scripts.items()) +
              ("; WARNING: a probe script CHANGED during the run" if changed else "; unchanged during the run"))
        print()
        print(raw_block(pairs))
    return 130 if interrupted else 0


if __name__ == "__main__":
    sys.exit(main())
