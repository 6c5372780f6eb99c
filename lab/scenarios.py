"""The verdict's proof: scenarios with known answers, run in the network lab (qprof.netlab).

Each `Scenario` sets up a `Lab` (CPU quotas, affinities, cpusets, busy neighbours, a shaped link,
a receiver held to a tiny socket buffer) so that one side, or neither, limits the transfer, and
says what the verdict must answer. The bench (bench/verdict_matrix.py) and the test
(tests/test_verdict_scenarios.py) run the same code. `ReceiveBufferClamp` holds a running
receiver's socket buffer small from outside (pidfd_getfd), for any stack. The endpoints are
Debian's ngtcp2 pair or a stack built from lab/endpoints.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from lab.endpoints.build import build
from lab.endpoints.transfer import BulkTransfer
from lab.transfers import Ngtcp2Transfer, Transfer
from qprof.attribution.causes import Cause
from qprof.archive import Run
from qprof.errors import QprofError
from lab import path
from qprof.netlab import ROLES, Hog, Lab, LabError, signals_held
from qprof.probes.sockets import socket_fds, udp_ports


# ---- a receiver's socket buffer, set from outside ----------------------------

_SYS_PIDFD_GETFD = 438  # x86_64 and most architectures (asm-generic)


def udp_socket_fds(pid: int) -> list[int]:
    """The process's file descriptors that are UDP sockets (matched by inode in its namespace)."""
    udp, fds = udp_ports(pid), socket_fds(pid)
    return sorted(fd for inode in udp for fd in fds.get(inode, []))


class ReceiveBufferClamp:
    """Keep a running process's UDP sockets at SO_RCVBUF `size` (the kernel doubles it), whatever the
    program sets itself: a copy of each socket is taken with pidfd_getfd(2) and set every `interval`
    until `stop()` (programs that raise their buffer at start, like quic-go, are set back). The lab's
    way of making a receiver with a tiny buffer without an option in every stack."""

    def __init__(self, pid: int, size: int, interval: float = 0.02) -> None:
        self.pid, self.size, self.interval = pid, size, interval
        self.sets = 0  # setsockopt calls that changed a buffer
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rcvbuf-clamp", daemon=True)
        self._libc = ctypes.CDLL(None, use_errno=True)

    def start(self) -> "ReceiveBufferClamp":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        try:
            pidfd = os.pidfd_open(self.pid)
        except OSError:
            return
        try:
            while not self._stop.is_set():
                for fd in udp_socket_fds(self.pid):
                    self._clamp(pidfd, fd)
                self._stop.wait(self.interval)
        finally:
            os.close(pidfd)

    def _clamp(self, pidfd: int, fd: int) -> None:
        mine = self._libc.syscall(_SYS_PIDFD_GETFD, pidfd, fd, 0)
        if mine < 0:
            return
        try:
            sk = socket.socket(fileno=mine)
        except OSError:
            os.close(mine)
            return
        with sk, contextlib.suppress(OSError):  # closing our copy leaves the program's socket open
            if sk.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) != 2 * self.size:
                sk.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.size)
                self.sets += 1


# ---- the verdict's proof: scenarios with known answers -----------------------

CAP = 0.3  # cores: a capped side
HOGS = 1  # busy processes beside a starved side, on its one CPU
PROTECTED = 8.0  # CPU weight (x a task's) of a side that must not be CPU-limited: the host's other load
                 # cannot starve it. The verdict never reads weights.
LINK_RATE_MBIT = 200  # the shaped link of "link"
APP_RATE_MBIT = 100  # what the application-limited sender allows itself
TINY_RCVBUF = 4096  # bytes asked of SO_RCVBUF (the kernel doubles it): a few datagrams
# the path cells' receiver buffer (SO_RCVBUF; the kernel doubles it): without loss on the path a sender's window
# grows until the default 208 KiB overflows in its bursts (2026-11-27: 50 ms, 0% loss, 4% of datagrams dropped),
# and the founding study's 16x larger buffers stop that: the path alone binds
TUNED_RCVBUF = 2 << 20
SMALL_WINDOW = 256 << 10  # the receiver's flow-control windows of "flow-control": far under the path's BDP
Roles = tuple[tuple[str, tuple[int, ...]], ...]  # (role, CPUs) pairs: a frozen dataclass keeps no dicts


@dataclass(frozen=True)
class Scenario:
    """A controlled run with a known answer: how the lab is set up and what the verdict must say.

    The verdict never sees any of this: it decides from what qprof measured. `cause` is the overall
    cause the verdict must name. Sides the scenario does not limit by CPU are `protected`: a high
    CPU weight, so the shared host's other load cannot make them the bottleneck instead."""

    name: str
    expected: str | None  # the verdict's limited_by; None: reported as measured
    cause: Cause | None = None  # the verdict's overall cause
    server_cpu: float | None = None
    client_cpu: float | None = None
    rate_mbit: float | None = None
    cpus: Roles = ()  # affinity per role
    cpusets: Roles = ()  # cpuset cgroup per role
    hogs: tuple[Hog, ...] = ()
    protected: tuple[str, ...] = ()
    client_rcvbuf: int | None = None  # the receiver's SO_RCVBUF, held there from outside
    app_rate_mbit: float | None = None  # the server paces its own writes (endpoint option)
    qlog: bool = False  # the endpoints write qlog (endpoint option), read beside the verdict
    own_cgroups: bool = True  # False: the sides where a shell leaves them, no cgroup made for them
    delay_ms: float = 0.0  # the path's one-way delay (the lab's forwarder, lab.path)
    loss: float = 0.0  # ... and the share of the data direction's frames it drops
    client_window: int | None = None  # the receiver's flow-control windows, bytes (endpoint option)
    about: str = ""

    @property
    def needs(self) -> tuple[str, ...]:
        """Endpoint options the scenario cannot do without (qlog is read where a stack writes it)."""
        return (("app_rate_mbit",) if self.app_rate_mbit else ()) + (("client_window",) if self.client_window else ())

    @property
    def cpus_needed(self) -> int:
        """CPUs the host must have: one more than the highest CPU anything is bound to."""
        used = [c for _, cs in self.cpus + self.cpusets for c in cs] + [c for h in self.hogs for c in h.cpus]
        return max(used) + 1 if used else 1

    def lab(self) -> Lab:
        return Lab(rate_mbit=self.rate_mbit, cpu={"server": self.server_cpu, "client": self.client_cpu},
                   cpus=dict(self.cpus), cpusets=dict(self.cpusets), hogs=self.hogs,
                   weights={r: PROTECTED for r in self.protected}, own_cgroups=self.own_cgroups,
                   delay_ms=self.delay_ms, loss=self.loss,
                   forwarder=path.command if self.delay_ms or self.loss else None)


def _path(rtt_ms: int, loss: float, stack_note: str = "") -> Scenario:
    """A wide-area path: `rtt_ms` round trip, `loss` of the data direction dropped; nothing else limits."""
    # without loss a sender's window grows until something drops: the path's queue or the receiver's buffer,
    # whichever overflows first (2026-11-27, 50 ms: the receiver, 3.2% of datagrams, even at 4 MiB): as measured
    expected, cause = ("neither", Cause.PATH) if loss else (None, None)
    return Scenario(f"path-{rtt_ms}ms-{loss:.1%}".replace(".0%", "%"), expected, cause, delay_ms=rtt_ms / 2,
                    loss=loss, qlog=True, protected=ROLES, client_rcvbuf=TUNED_RCVBUF,
                    about=f"a path of {rtt_ms} ms round trip dropping {loss:.1%} of the data direction's frames, "
                          f"the receiver's buffer {TUNED_RCVBUF >> 20} MiB{stack_note}")


def _starved(role: str, how: str) -> Scenario:
    """`role` shares one CPU with HOGS busy processes, bound there by affinity or a cpuset; the other side
    is protected (and, with affinity, bound to the other CPU)."""
    other, cpu = ("client", 0) if role == "server" else ("server", 1)
    if how == "contention":
        return Scenario(f"{role}-contention", f"{role}-limited", Cause.CPU_STARVED,
                        cpus=((role, (cpu,)), (other, (1 - cpu,))), hogs=(Hog(cpus=(cpu,)),) * HOGS,
                        protected=(other,),
                        about=f"{role} bound to CPU {cpu} beside {HOGS} busy processes, {other} alone on "
                              f"CPU {1 - cpu}")
    return Scenario(f"{role}-cpuset", f"{role}-limited", Cause.CPU_STARVED, cpusets=((role, (cpu,)),),
                    hogs=(Hog(cpuset_of=role),) * HOGS, protected=(other,),
                    about=f"{role} in a one-CPU cpuset shared with {HOGS} busy processes, {other} free")


def _shared(role: str, how: str) -> Scenario:
    """`role` starved as in _starved, but every process where a shell leaves it: no cgroup of its own,
    no weight protecting the other side (bound to the other CPU instead, or free beside a quota)."""
    other, cpu = ("client", 0) if role == "server" else ("server", 1)
    apart = ((other, (1 - cpu,)),)
    if how == "contention":
        return Scenario(f"{role}-contention-shared", f"{role}-limited", Cause.CPU_STARVED,
                        cpus=((role, (cpu,)), *apart), hogs=(Hog(cpus=(cpu,)),) * HOGS, own_cgroups=False,
                        about=f"{role} bound to CPU {cpu} beside {HOGS} busy processes, {other} on CPU {1 - cpu}; "
                              "all in the shell's cgroup")
    if how == "cpuset":
        return Scenario(f"{role}-cpuset-shared", f"{role}-limited", Cause.CPU_STARVED, cpusets=((role, (cpu,)),),
                        cpus=apart, hogs=(Hog(cpuset_of=role),) * HOGS, own_cgroups=False,
                        about=f"{role} in a one-CPU cpuset shared with {HOGS} busy processes, {other} on CPU "
                              f"{1 - cpu}; no cgroup of their own otherwise")
    return Scenario(f"{role}-quota-shared", f"{role}-limited", Cause.CPU_STARVED,
                    server_cpu=CAP if role == "server" else None, client_cpu=CAP if role == "client" else None,
                    hogs=(Hog(quota_of=role),) * HOGS, own_cgroups=False,
                    about=f"{role} in a service's cgroup capped at {CAP} of a core, shared with {HOGS} busy "
                          f"processes; {other} in the shell's cgroup")


SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    Scenario("server-quota", "server-limited", Cause.CPU_STARVED, server_cpu=CAP, protected=("client",),
             about=f"server's cgroup capped at {CAP} of a core"),
    Scenario("client-quota", "client-limited", Cause.CPU_STARVED, client_cpu=CAP, protected=("server",),
             about=f"client's cgroup capped at {CAP} of a core"),
    _starved("server", "contention"),
    _starved("client", "contention"),
    _starved("server", "cpuset"),
    _starved("client", "cpuset"),
    Scenario("receive-buffer", "client-limited", Cause.RECEIVE_BUFFER, client_rcvbuf=TINY_RCVBUF, protected=ROLES,
             about=f"client's socket held at SO_RCVBUF {TINY_RCVBUF} (the kernel doubles it)"),
    Scenario("link", "neither", Cause.LINK, rate_mbit=LINK_RATE_MBIT, qlog=True, protected=ROLES,
             about=f"the link shaped to {LINK_RATE_MBIT} Mbit/s (tbf)"),
    Scenario("application", "neither", Cause.APPLICATION, app_rate_mbit=APP_RATE_MBIT, qlog=True,
             protected=ROLES, about=f"the server paces its own writes to {APP_RATE_MBIT} Mbit/s, the link free"),
    Scenario("uncapped", None, about="both free, the link unshaped, no weights: reported as measured"),
    *(_path(rtt, loss) for rtt in (10, 50) for loss in (0.0, 0.005, 0.02)),
    Scenario("flow-control", "neither", Cause.FLOW_CONTROL, delay_ms=15, client_window=SMALL_WINDOW, qlog=True,
             protected=ROLES, about=f"the receiver's windows held at {SMALL_WINDOW >> 10} KiB over a 30 ms path"),
    Scenario("scheduling", None, own_cgroups=False,
             about="both free where a shell leaves them, the link unshaped: a multi-threaded runtime's threads "
                   "waiting for each other (checked by pinning: bench/verdict_matrix.py)"),
    Scenario("pinned", None, cpus=(("server", (0,)), ("client", (1,))), own_cgroups=False,
             about="scheduling's transfer with each side bound to a CPU of its own (taskset): what pinning changes"),
    *(_shared(role, how) for how in ("contention", "cpuset", "quota") for role in ROLES),
    Scenario("busy-host", "both", Cause.CPU_STARVED, hogs=tuple(Hog(cpus=(c,)) for c in range(2)), own_cgroups=False,
             about="both free, a busy process bound to each of the host's 2 CPUs; all in the shell's cgroup"),
)}
# what the uncapped (`scheduling` scenario) run's cause predicts pinning (the `pinned` scenario) does to goodput
PINNING_PREDICTS = {c.value: c.about.pinning for c in Cause if c.about.pinning is not None}


def pinning_predictions(cause: str | None) -> list[str]:
    """What a verdict's cause (two joined by "+" when the sides differ) predicts of pinning, per part."""
    return [PINNING_PREDICTS[c] for c in str(cause).split("+") if c in PINNING_PREDICTS]


# Cells with the sides where a shell leaves them: what multi-threaded endpoints are judged on
SHARED = tuple(name for name, sc in SCENARIOS.items() if not sc.own_cgroups)

# (size, server address, placement per role[, environment per role]) -> a Transfer not started yet
TransferFactory = Callable[..., Transfer]


def transfer_factory(stack: str) -> TransferFactory:
    """ngtcp2 (Debian's gtlsserver/gtlsclient), or a stack built from lab/endpoints (quicgo, quinn...)."""
    if stack == "ngtcp2":
        return lambda size, host, placement, env=None, qlog_dir=None, client_window=None: Ngtcp2Transfer(
            size, host=host, placement=placement, env=env or {}, qlog_dir=qlog_dir, client_window=client_window)
    built = build(stack)
    return lambda size, host, placement, env=None, qlog_dir=None, client_window=None: BulkTransfer(
        size, host=host, placement=placement, env=env or {}, built=built)


NGTCP2_OPTIONS = ("qlog_dir", "client_window")  # Debian's ngtcp2 pair takes these as flags (lab.transfers)


def endpoint_options(stack: str) -> dict[str, str]:
    """The options a stack's endpoints take (option -> environment variable; ngtcp2's are flags)."""
    return dict.fromkeys(NGTCP2_OPTIONS, "") if stack == "ngtcp2" else dict(build(stack).spec.env_options)


def unsupported(scenario: Scenario, stack: str) -> str | None:
    """Why `scenario` cannot run on `stack` here (an option its endpoints lack, too few CPUs), or None."""
    if scenario.cpus_needed > (os.cpu_count() or 1):
        return f"needs {scenario.cpus_needed} CPUs, this host has {os.cpu_count()}"
    missing = [o for o in scenario.needs if o not in endpoint_options(stack)]
    return f"{stack}'s endpoints have no {', '.join(missing)} option" if missing else None


def normalize_verdict(word: str | None) -> str | None:
    """'server', 'server-limited', 'Server_Limited' -> 'server-limited'; 'neither', 'both' as they are."""
    if word is None:
        return None
    w = str(word).strip().lower().replace("_", "-").replace(" ", "-")
    base = w.removesuffix("-limited")
    return f"{base}-limited" if base in ("server", "client") else base


@dataclass
class RunResult:
    scenario: str
    stack: str
    expected: str | None
    expected_cause: Cause | None = None
    verdict: str | None = None  # normalised limited_by; None when the report has no verdict
    cause: str | None = None  # the verdict's overall cause
    has_verdict: bool = False
    stack_word: dict[str, Any] | None = None  # the stack's own record beside the verdict (qlog), if any
    round_trip_ms: dict[str, float] = field(default_factory=dict)  # role -> RTT its datagrams' timing shows
    seconds: float | None = None  # client wall time, profiled
    goodput_mbit: float | None = None
    size: int = 0
    run: Path | None = None
    error: str | None = None
    cpu: dict[str, float] = field(default_factory=dict)  # role -> cores (proc CPU / wall)
    throttled: dict[str, float] = field(default_factory=dict)  # role -> share of periods throttled
    clamp_sets: int | None = None  # times the receiver's buffer had to be set back (receive-buffer)

    @property
    def hit(self) -> bool | None:
        """Right when both the limiting side and the overall cause are the expected ones."""
        if self.expected is None:
            return None
        return (self.error is None and self.verdict == self.expected
                and (self.expected_cause is None or self.cause == self.expected_cause))


class _Placed:
    """A scenario's transfer: the endpoints' options from the scenario, the receiver's buffer held
    once the client runs. `release()` lets the held client go."""

    def __init__(self, scenario: Scenario, xfer: Transfer) -> None:
        self.scenario, self.xfer = scenario, xfer
        self.clamp: ReceiveBufferClamp | None = None

    def release(self) -> None:
        self.xfer.release_client()
        if self.scenario.client_rcvbuf:
            self.clamp = ReceiveBufferClamp(int(self.xfer.client.pid), self.scenario.client_rcvbuf).start()

    def close(self) -> None:
        if self.clamp is not None:
            self.clamp.stop()


def _env(scenario: Scenario, stack: str, qlog_dir: Path | None) -> dict[str, dict[str, str]]:
    opts = endpoint_options(stack) if scenario.needs or qlog_dir else {}
    env: dict[str, dict[str, str]] = {"server": {}, "client": {}}
    if scenario.app_rate_mbit:
        env["server"][opts["app_rate_mbit"]] = f"{scenario.app_rate_mbit:g}"
    if qlog_dir is not None and opts.get("qlog_dir"):
        for role in ROLES:
            env[role][opts["qlog_dir"]] = str(qlog_dir)
    return env


@contextlib.contextmanager
def _transfer(scenario: Scenario, stack: str, factory: TransferFactory, lab: Lab, size: int,
              qlog_dir: Path | None = None) -> Iterator[_Placed]:
    """A transfer placed in `lab`; closed (processes, work directory) with signals held off."""
    reason = unsupported(scenario, stack)
    if reason:
        raise LabError(f"scenario {scenario.name}: {reason}")
    with signals_held():  # its work directory exists from here on
        flags = {"qlog_dir": qlog_dir, "client_window": scenario.client_window} if stack == "ngtcp2" else {}
        xfer = factory(size, lab.server_addr, lab.placements(), _env(scenario, stack, qlog_dir), **flags)
    placed = _Placed(scenario, xfer)
    try:
        yield placed
    finally:
        with signals_held():
            placed.close()
            xfer.close()


def _check_client(xfer: Transfer) -> None:
    client = xfer.client
    assert client is not None
    if client.returncode != 0:
        raise LabError(f"{xfer.name} client failed (exit {client.returncode}): {xfer.tail('client.err')}")
    check = getattr(xfer, "check_client", None)
    if check is not None:
        check()


def unprofiled_transfer(scenario: Scenario, stack: str, factory: TransferFactory, size: int,
                        timeout: float = 120.0) -> tuple[float, float]:
    """One transfer of `size` bytes in `scenario`'s lab with nothing attached: (goodput in bit/s, seconds)."""
    with scenario.lab() as lab, _transfer(scenario, stack, factory, lab, size) as placed:
        xfer = placed.xfer
        xfer.start_server()
        xfer.start_client_stopped()
        placed.release()
        deadline = time.monotonic() + timeout
        while not xfer.client_done():
            if time.monotonic() > deadline:
                raise LabError(f"{xfer.name}: an unprofiled transfer of {size} bytes took over {timeout:.0f} s")
            time.sleep(0.01)
        _check_client(xfer)
        assert xfer.released_at is not None and xfer.finished_at is not None
        took = xfer.finished_at - xfer.released_at
    return xfer.transferred_bytes() * 8 / took, took


def measure_goodput(scenario: Scenario, stack: str, factory: TransferFactory, first_size: int = 16 << 20,
                    want_seconds: float = 1.5, timeout: float = 120.0) -> float:
    """Unprofiled goodput (bit/s) of `scenario` for this stack: grows a short transfer until it lasts a while,
    then the median of three at that size. One transfer beside busy neighbours can be several times slower than
    the next (CI: a server-cpuset run sized from one took 0.5 s where 3.5 s was meant)."""
    size = first_size
    for _ in range(4):
        rate, took = unprofiled_transfer(scenario, stack, factory, size, timeout)
        if took >= want_seconds * 0.5:
            break
        size = int(min(rate / 8 * want_seconds, 8 << 30))
    else:
        return rate
    rates = [rate] + [unprofiled_transfer(scenario, stack, factory, size, timeout)[0] for _ in range(2)]
    return statistics.median(rates)


def size_for(goodput_bps: float, seconds: float, profiled_slowdown: float = 0.7) -> int:
    """Bytes for a profiled run of about `seconds` (profiling costs the endpoints some goodput)."""
    return max(1 << 20, int(goodput_bps / 8 * seconds * profiled_slowdown))


def report_json(run: Path, qlog_dir: Path | None = None, timeout: float = 600) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "qprof.cli", "report", str(run), "--format", "json"]
    if qlog_dir is not None and qlog_dir.is_dir():
        cmd += ["--qlog", str(qlog_dir)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise LabError(f"qprof report {run} failed ({r.returncode}): {r.stderr.strip()[-500:]}")
    return json.loads(r.stdout)


def run_scenario(scenario: Scenario, stack: str, factory: TransferFactory, size: int, out: Path,
                 status: Callable[[str], None] = lambda m: None, **attach: Any) -> RunResult:
    """One profiled transfer of `size` bytes in `scenario`'s lab, both ends attached; the report's verdict.
    Endpoints that write qlog write it to OUT-qlog, read by the report beside the verdict."""
    from qprof.collectors.session import AttachOptions, AttachSession

    res = RunResult(scenario.name, stack, scenario.expected, scenario.cause, size=size)
    qlog_dir = out.parent / f"{out.name}-qlog" if scenario.qlog else None
    try:
        with scenario.lab() as lab, _transfer(scenario, stack, factory, lab, size, qlog_dir) as placed:
            xfer = placed.xfer
            server = xfer.start_server()
            client = xfer.start_client_stopped()
            opts = AttachOptions(pids=[server, client], out=out, roles={server: "server", client: "client"},
                                 **attach)
            before = {r: lab.throttling(r) for r in ROLES}
            res.run = AttachSession(opts, on_ready=placed.release, stop_when=xfer.client_done,
                                    stop_when_exits=[client], status=status).run()
            after = {r: lab.throttling(r) for r in ROLES}
            meta = Run.open(res.run).meta
            if (meta.stop_reason or "").startswith("interrupted"):
                raise KeyboardInterrupt
            assert xfer.client is not None
            xfer.client.wait(60)
            xfer.client_done()
            _check_client(xfer)
            if placed.clamp is not None:
                res.clamp_sets = placed.clamp.sets
            if xfer.released_at is not None and xfer.finished_at is not None:
                res.seconds = xfer.finished_at - xfer.released_at
                res.goodput_mbit = xfer.transferred_bytes() * 8 / res.seconds / 1e6
            for r in ROLES:
                periods = after[r].get("nr_periods", 0) - before[r].get("nr_periods", 0)
                if periods > 0:
                    res.throttled[r] = (after[r].get("nr_throttled", 0) - before[r].get("nr_throttled", 0)) / periods
        report = report_json(res.run, qlog_dir)
        verdict = report.get("verdict")
        res.has_verdict = isinstance(verdict, dict) and "limited_by" in verdict
        if isinstance(verdict, dict):
            res.verdict = normalize_verdict(verdict.get("limited_by")) if res.has_verdict else None
            res.cause = verdict.get("cause")
            res.stack_word = verdict.get("stack_record")
        evidence = verdict.get("evidence", {}) if isinstance(verdict, dict) else {}
        wall = meta.duration_s or None
        for p in report.get("processes", []):
            role = p.get("role")
            if role in ROLES and isinstance(p.get("round_trip"), dict):
                res.round_trip_ms[role] = float(p["round_trip"]["ms"])
            cores = (evidence.get(role) or {}).get("process_cpu_cores") if isinstance(evidence, dict) else None
            if cores is not None:
                res.cpu[role] = float(cores)
            elif role in ROLES and wall and p.get("proc_cpu_seconds") is not None:
                res.cpu[role] = p["proc_cpu_seconds"] / wall
    except (QprofError, OSError, subprocess.SubprocessError, ValueError) as e:
        res.error = f"{type(e).__name__}: {e}"
    return res
