"""A two-namespace network lab for controlled runs: a server and a client joined by a veth pair.

    with Lab(rate_mbit=200, cpu={"server": 0.3}) as lab:
        xfer = Ngtcp2Transfer(size, host=lab.server_addr, placement=lab.placements())

`Lab` creates two network namespaces (`qprof-lab-<id>-server`, `-client`), a
veth pair with one end in each (10.77.N.1/30 server, 10.77.N.2/30 client, MTU
1500; the addresses exist only inside the namespaces, nothing is routed
outside), brings `lo` up in each, optionally shapes both veth ends with
`tc ... tbf`, and gives each role a cgroup (`qprof-lab-<id>/<role>` in the cpu
hierarchy: cgroup v1 cfs quota, or cgroup v2 cpu.max, whichever this machine
has) with an optional CPU quota in cores. A process is placed by entering its
namespace and cgroup between fork and exec (qprof.endpoints.Placement), so a
held process (StoppedProcess) stops at the real program.

Everything is removed on exit, also on exceptions and SIGINT/SIGTERM/SIGHUP:
processes still in the lab are killed, the namespaces (and with them the veth
and its qdiscs) deleted, the cgroups removed. Each lab registers its owner in
/run/qprof-lab/<id>.json before creating anything; `cleanup()` (also run when
a lab starts, and by `python -m qprof.netlab cleanup`) removes what labs whose
owner is gone (SIGKILL, power loss) left behind, and never touches a live lab.

The verdict's proof matrix lives here too (`SCENARIOS`, `run_scenario`): the
bench (bench/verdict_matrix.py) and the test (tests/test_verdict_scenarios.py)
run the same code.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from qprof.collectors.netns import setns
from qprof.endpoints import Placement, Transfer
from qprof.errors import QprofError

PREFIX = "qprof-lab-"
STATE_DIR = Path("/run/qprof-lab")
NETNS_DIR = Path("/run/netns")
ROLES = ("server", "client")
SUBNET = "10.77.{n}.{host}"  # /30: .1 server, .2 client
_ID = re.compile(r"[0-9a-f]{6}")


class LabError(QprofError):
    pass


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """SIGINT/SIGTERM/SIGHUP wait (pending) until the block is done: teardown is not cut in half."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM, signal.SIGHUP})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _run(cmd: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(cmd, capture_output=True, text=True)
    if check and r.returncode != 0:
        raise LabError(f"{' '.join(cmd)} failed (exit {r.returncode}): {r.stderr.strip()}")
    return r


# ---- cgroups -----------------------------------------------------------------

@dataclass(frozen=True)
class CpuCgroups:
    """The cgroup hierarchy with the cpu controller: v1 (cfs quota) or v2 (cpu.max)."""

    version: int
    root: Path

    def set_quota(self, cg: Path, cores: float | None, period_us: int = 100_000) -> None:
        if self.version == 1:
            (cg / "cpu.cfs_period_us").write_text(str(period_us))
            (cg / "cpu.cfs_quota_us").write_text(str(round(cores * period_us)) if cores else "-1")
        else:
            (cg / "cpu.max").write_text(f"{round(cores * period_us)} {period_us}" if cores else f"max {period_us}")

    def prepare_parent(self, parent: Path) -> None:
        """v2: children get cpu.max only when the parents delegate the cpu controller."""
        if self.version == 2:
            for d in (self.root, parent):
                ctl = d / "cgroup.subtree_control"
                if "cpu" not in ctl.read_text().split():
                    ctl.write_text("+cpu")

    def throttling(self, cg: Path) -> dict[str, int]:
        """cpu.stat: periods, throttled periods, throttled time (ns in v1, us in v2 as the kernel gives)."""
        try:
            return {k: int(v) for k, v in (line.split() for line in (cg / "cpu.stat").read_text().splitlines())}
        except (OSError, ValueError):
            return {}


def cpu_cgroups() -> CpuCgroups | None:
    """Find where the cpu controller is: a v1 hierarchy with `cpu`, else a v2 mount offering `cpu`."""
    v2: list[Path] = []
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return None
    for line in mounts:
        parts = line.split()
        if len(parts) < 4:
            continue
        where, fstype, opts = Path(parts[1]), parts[2], parts[3].split(",")
        if fstype == "cgroup" and "cpu" in opts:
            return CpuCgroups(1, where)
        if fstype == "cgroup2":
            v2.append(where)
    for where in v2:
        try:
            if "cpu" in (where / "cgroup.controllers").read_text().split():
                return CpuCgroups(2, where)
        except OSError:
            continue
    return None


def cgroup_pids(cg: Path) -> list[int]:
    pids: set[int] = set()
    for d in [cg, *(p for p in cg.rglob("*") if p.is_dir())] if cg.is_dir() else []:
        try:
            pids.update(int(x) for x in (d / "cgroup.procs").read_text().split())
        except (OSError, ValueError):
            continue
    return sorted(pids)


# ---- ownership and leftovers -------------------------------------------------

def _starttime(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


@contextlib.contextmanager
def _registry_lock() -> Iterator[None]:
    STATE_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
    with open(STATE_DIR / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _owner_alive(lab_id: str) -> bool:
    try:
        state = json.loads((STATE_DIR / f"{lab_id}.json").read_text())
    except (OSError, ValueError):
        return False
    return _starttime(int(state["pid"])) == state.get("starttime")


def _netns_pids(name: str) -> list[int]:
    r = _run(["ip", "netns", "pids", name], check=False)
    return [int(x) for x in r.stdout.split() if x.isdigit()]


def _kill(pids: list[int], grace: float = 3.0) -> None:
    """SIGTERM, then SIGKILL what is left; reap those that are our children."""
    me = os.getpid()
    pids = [p for p in pids if p != me]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, sig)
        deadline = time.monotonic() + (grace if sig == signal.SIGTERM else 5.0)
        while pids and time.monotonic() < deadline:
            for p in list(pids):
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(p, os.WNOHANG)
                if _starttime(p) is None or _state(p) == "Z":
                    pids.remove(p)
            time.sleep(0.02)
        if not pids:
            return


def _state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def _rmdir_tree(cg: Path, timeout: float = 5.0) -> None:
    if not cg.is_dir():
        return
    dirs = sorted((p for p in cg.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True) + [cg]
    deadline = time.monotonic() + timeout
    for d in dirs:
        while True:
            try:
                d.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError as e:  # EBUSY while an exiting task is still being released
                if time.monotonic() > deadline:
                    raise LabError(f"cannot remove cgroup {d}: {e}") from None
                time.sleep(0.05)


def _lab_resources() -> dict[str, dict[str, list[Any]]]:
    """Every lab's namespaces, cgroups and root-namespace veth ends on this host, by lab id."""
    found: dict[str, dict[str, list[Any]]] = {}

    def entry(lab_id: str) -> dict[str, list[Any]]:
        return found.setdefault(lab_id, {"netns": [], "cgroups": [], "links": [], "state": []})

    names = NETNS_DIR.iterdir() if NETNS_DIR.is_dir() else []
    for p in names:
        m = re.fullmatch(re.escape(PREFIX) + r"([0-9a-f]{6})-(server|client)", p.name)
        if m:
            entry(m[1])["netns"].append(p.name)
    cgs = cpu_cgroups()
    if cgs is not None and cgs.root.is_dir():
        for p in cgs.root.iterdir():
            m = re.fullmatch(re.escape(PREFIX) + r"([0-9a-f]{6})", p.name)
            if m and p.is_dir():
                entry(m[1])["cgroups"].append(p)
    for line in _run(["ip", "-o", "link", "show"], check=False).stdout.splitlines():
        m = re.match(r"\d+: (ql([0-9a-f]{6})[sc])[@:]", line)
        if m:
            entry(m[2])["links"].append(m[1])
    if STATE_DIR.is_dir():
        for p in STATE_DIR.glob("*.json"):
            if _ID.fullmatch(p.stem):
                entry(p.stem)["state"].append(p)
    return found


def _remove(lab_id: str, res: dict[str, list[Any]]) -> list[str]:
    """Tear down one lab's resources: its processes first, then namespaces, links, cgroups, state."""
    removed: list[str] = []
    pids: set[int] = set()
    for cg in res["cgroups"]:
        pids.update(cgroup_pids(cg))
    for ns in res["netns"]:
        pids.update(_netns_pids(ns))
    if pids:
        _kill(sorted(pids))
        removed.append(f"{len(pids)} process(es)")
    for ns in res["netns"]:
        for link in (f"ql{lab_id}s", f"ql{lab_id}c"):
            _run(["ip", "-n", ns, "link", "del", link], check=False)  # synchronous: takes the peer and qdiscs
        _run(["ip", "netns", "del", ns], check=False)
        removed.append(f"netns {ns}")
    for link in res["links"]:
        _run(["ip", "link", "del", link], check=False)
        removed.append(f"link {link}")
    for cg in res["cgroups"]:
        _rmdir_tree(cg)
        removed.append(f"cgroup {cg}")
    for p in res["state"]:
        with contextlib.suppress(FileNotFoundError):
            p.unlink()
    return removed


def cleanup(include_live: bool = False) -> list[str]:
    """Remove what labs whose owner process is gone left behind (all labs with `include_live`)."""
    removed: list[str] = []
    with _registry_lock():
        for lab_id, res in _lab_resources().items():
            if include_live or not _owner_alive(lab_id):
                removed += _remove(lab_id, res)
    return removed


# ---- the lab -----------------------------------------------------------------

class Lab:
    """Two namespaces joined by a veth pair, with an optional rate limit and per-role CPU quotas."""

    def __init__(self, rate_mbit: float | None = None, cpu: dict[str, float | None] | None = None,
                 mtu: int = 1500, latency_ms: float = 25.0) -> None:
        cpu = dict(cpu or {})
        unknown = set(cpu) - set(ROLES)
        if unknown:
            raise LabError(f"unknown role(s) {sorted(unknown)}: use {ROLES}")
        for role, cores in cpu.items():
            if cores is not None and not 0.01 <= cores <= (os.cpu_count() or 1):
                raise LabError(f"CPU quota {cores} for {role} is out of range: give cores, e.g. 0.3")
        if rate_mbit is not None and not 0 < rate_mbit <= 100_000:
            raise LabError(f"rate {rate_mbit} Mbit/s is out of range")
        self.rate_mbit = rate_mbit
        self.cpu = cpu
        self.mtu = mtu
        self.latency_ms = latency_ms
        self.id = secrets.token_hex(3)
        self.n: int | None = None
        self.cgroups_kind = cpu_cgroups()
        self._procs: list[subprocess.Popen[Any]] = []
        self._old_handlers: dict[int, Any] = {}
        self._created = False

    # names and addresses
    def netns(self, role: str) -> str:
        return f"{PREFIX}{self.id}-{role}"

    def netns_path(self, role: str) -> str:
        return str(NETNS_DIR / self.netns(role))

    def link(self, role: str) -> str:
        return f"ql{self.id}{role[0]}"

    def addr(self, role: str) -> str:
        assert self.n is not None, "the lab is not up"
        return SUBNET.format(n=self.n, host=1 if role == "server" else 2)

    @property
    def server_addr(self) -> str:
        return self.addr("server")

    @property
    def client_addr(self) -> str:
        return self.addr("client")

    @property
    def cgroup_parent(self) -> Path | None:
        return self.cgroups_kind.root / f"{PREFIX}{self.id}" if self.cgroups_kind else None

    def cgroup(self, role: str) -> Path | None:
        parent = self.cgroup_parent
        return parent / role if parent else None

    def placement(self, role: str) -> Placement:
        cg = self.cgroup(role)
        return Placement(netns=self.netns_path(role), cgroups=(str(cg),) if cg else ())

    def placements(self) -> dict[str, Placement]:
        return {r: self.placement(r) for r in ROLES}

    def throttling(self, role: str) -> dict[str, int]:
        cg = self.cgroup(role)
        return self.cgroups_kind.throttling(cg) if cg and self.cgroups_kind else {}

    # running things inside
    def popen(self, role: str, cmd: list[str], **kw: Any) -> subprocess.Popen[Any]:
        """Start `cmd` in `role`'s namespace and cgroup (killed at exit if still running)."""
        p = subprocess.Popen(cmd, preexec_fn=self.placement(role).preexec, **kw)
        self._procs.append(p)
        self.placement(role).check(p.pid)
        return p

    @contextlib.contextmanager
    def entered(self, role: str) -> Iterator[None]:
        """The calling thread inside `role`'s network namespace (sockets made here stay there)."""
        own = os.open(f"/proc/self/task/{threading.get_native_id()}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        target = os.open(self.netns_path(role), os.O_RDONLY | os.O_CLOEXEC)
        try:
            setns(target)
            try:
                yield
            finally:
                setns(own)
        finally:
            os.close(target)
            os.close(own)

    def socket(self, role: str, kind: int = socket.SOCK_DGRAM) -> socket.socket:
        with self.entered(role):
            return socket.socket(socket.AF_INET, kind)

    # life cycle
    def __enter__(self) -> "Lab":
        if os.geteuid() != 0:
            raise LabError("the network lab needs root (network namespaces, tc, cgroups)")
        if any(self.cpu.values()) and self.cgroups_kind is None:
            raise LabError("no cgroup hierarchy with the cpu controller is mounted: cannot cap CPU")
        self._trap_signals()
        try:
            cleanup()
            self._create()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _trap_signals(self) -> None:
        """SIGTERM/SIGHUP end the with-block like Ctrl-C does, so the lab is torn down."""
        if threading.current_thread() is not threading.main_thread():
            return

        def terminate(signum: int, _frame: object) -> None:
            raise SystemExit(128 + signum)

        for s in (signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(s) in (signal.SIG_DFL, None):
                self._old_handlers[s] = signal.signal(s, terminate)

    def _create(self) -> None:
        with _registry_lock():
            while self.id in _lab_resources():  # 3 random bytes: a clash is rare, never silent
                self.id = secrets.token_hex(3)
            used = set()
            for p in STATE_DIR.glob("*.json"):
                with contextlib.suppress(OSError, ValueError, KeyError):
                    used.add(int(json.loads(p.read_text())["n"]))
            root_addrs = _run(["ip", "-4", "-o", "addr", "show"], check=False).stdout
            free = [n for n in range(256) if n not in used and f" 10.77.{n}." not in root_addrs]
            if not free:
                raise LabError("no free 10.77.N.0/30 subnet for a lab (256 labs running?)")
            self.n = free[0]
            state = {"pid": os.getpid(), "starttime": _starttime(os.getpid()), "n": self.n,
                     "netns": [self.netns(r) for r in ROLES]}
            (STATE_DIR / f"{self.id}.json").write_text(json.dumps(state))
            self._created = True
        for role in ROLES:
            _run(["ip", "netns", "add", self.netns(role)])
        _run(["ip", "link", "add", self.link("server"), "netns", self.netns("server"), "mtu", str(self.mtu),
              "type", "veth", "peer", "name", self.link("client"), "netns", self.netns("client"),
              "mtu", str(self.mtu)])
        for role in ROLES:
            ns, dev = self.netns(role), self.link(role)
            _run(["ip", "-n", ns, "link", "set", "lo", "up"])
            _run(["ip", "-n", ns, "addr", "add", f"{self.addr(role)}/30", "dev", dev])
            _run(["ip", "-n", ns, "link", "set", dev, "up"])
            if self.rate_mbit:
                rate_bytes = self.rate_mbit * 1e6 / 8
                burst = max(int(rate_bytes * 0.004), 16 * 1024)  # 4 ms of data, at least a few GSO-sized packets
                _run(["tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "tbf", "rate", f"{self.rate_mbit}mbit",
                      "burst", str(burst), "latency", f"{self.latency_ms:g}ms"])
        if self.cgroups_kind is not None:
            parent = self.cgroup_parent
            assert parent is not None
            parent.mkdir()
            self.cgroups_kind.prepare_parent(parent)
            for role in ROLES:
                cg = parent / role
                cg.mkdir()
                self.cgroups_kind.set_quota(cg, self.cpu.get(role))

    def close(self) -> None:
        """Tear everything down; signals are held off meanwhile so a second Ctrl-C cannot leave half a lab."""
        try:
            with signals_held():  # a signal that came meanwhile is delivered here, to our handlers
                self._teardown()
        finally:
            for s, h in self._old_handlers.items():
                signal.signal(s, h)
            self._old_handlers.clear()

    def _teardown(self) -> None:
        for p in self._procs:
            if p.poll() is None:
                p.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(5)
        self._procs.clear()
        if self._created:
            with _registry_lock():
                res = _lab_resources().get(self.id, {"netns": [], "cgroups": [], "links": [], "state": []})
                _remove(self.id, res)
            self._created = False


# ---- the verdict's proof: scenarios with known answers -----------------------

CAP = 0.3  # cores: a capped side
NEITHER_RATE_MBIT = 200


@dataclass(frozen=True)
class Scenario:
    name: str
    expected: str | None  # the verdict's limited_by; None: reported as measured
    server_cpu: float | None = None
    client_cpu: float | None = None
    rate_mbit: float | None = None
    about: str = ""

    def lab(self) -> Lab:
        return Lab(rate_mbit=self.rate_mbit, cpu={"server": self.server_cpu, "client": self.client_cpu})


SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    Scenario("server-limited", "server-limited", server_cpu=CAP, about=f"server capped at {CAP} of a core"),
    Scenario("client-limited", "client-limited", client_cpu=CAP, about=f"client capped at {CAP} of a core"),
    Scenario("neither", "neither", rate_mbit=NEITHER_RATE_MBIT,
             about=f"both uncapped, link shaped to {NEITHER_RATE_MBIT} Mbit/s (tbf)"),
    Scenario("uncapped", None, about="both uncapped, link unshaped: reported as measured"),
)}

# (size, server address, placement per role) -> a Transfer not started yet
TransferFactory = Callable[[int, str, dict[str, Placement]], Transfer]


def transfer_factory(stack: str) -> TransferFactory:
    """ngtcp2 (Debian's gtlsserver/gtlsclient), or a built test endpoint (tests/ on sys.path: quicgo, quinn...)."""
    if stack == "ngtcp2":
        from qprof.endpoints import Ngtcp2Transfer

        return lambda size, host, placement: Ngtcp2Transfer(size, host=host, placement=placement)
    try:
        from endpoints.build import build  # type: ignore[import-not-found]
        from endpoints.transfer import BulkTransfer  # type: ignore[import-not-found]
    except ImportError:
        raise LabError(f"stack {stack!r} is a test endpoint: put the repository's tests/ on sys.path") from None
    built = build(stack)
    return lambda size, host, placement: BulkTransfer(size, host=host, placement=placement, built=built)


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
    verdict: str | None = None  # normalised limited_by; None when the report has no verdict
    has_verdict: bool = False
    seconds: float | None = None  # client wall time, profiled
    goodput_mbit: float | None = None
    size: int = 0
    run: Path | None = None
    error: str | None = None
    cpu: dict[str, float] = field(default_factory=dict)  # role -> cores (proc CPU / wall)
    throttled: dict[str, float] = field(default_factory=dict)  # role -> share of periods throttled

    @property
    def hit(self) -> bool | None:
        if self.expected is None:
            return None
        return self.error is None and self.verdict == self.expected


@contextlib.contextmanager
def _transfer(scenario: Scenario, factory: TransferFactory, lab: Lab, size: int) -> Iterator[Transfer]:
    """A transfer placed in `lab`; closed (processes, work directory) with signals held off."""
    with signals_held():  # its work directory exists from here on
        xfer = factory(size, lab.server_addr, lab.placements())
    try:
        yield xfer
    finally:
        with signals_held():
            xfer.close()


def _check_client(xfer: Transfer) -> None:
    client = xfer.client
    assert client is not None
    if client.returncode != 0:
        raise LabError(f"{xfer.name} client failed (exit {client.returncode}): {xfer.tail('client.err')}")
    check = getattr(xfer, "check_client", None)
    if check is not None:
        check()


def measure_goodput(scenario: Scenario, factory: TransferFactory, first_size: int = 16 << 20,
                    want_seconds: float = 1.5, timeout: float = 120.0) -> float:
    """Unprofiled goodput (bit/s) of `scenario` for this stack: grows a short transfer until it lasts a while."""
    size = first_size
    for _ in range(4):
        with scenario.lab() as lab, _transfer(scenario, factory, lab, size) as xfer:
            xfer.start_server()
            xfer.start_client_stopped()
            xfer.release_client()
            deadline = time.monotonic() + timeout
            while not xfer.client_done():
                if time.monotonic() > deadline:
                    raise LabError(f"{xfer.name}: calibration transfer of {size} bytes took over {timeout:.0f} s")
                time.sleep(0.01)
            _check_client(xfer)
            assert xfer.released_at is not None and xfer.finished_at is not None
            took = xfer.finished_at - xfer.released_at
        rate = xfer.transferred_bytes() * 8 / took
        if took >= want_seconds * 0.5:
            return rate
        size = int(min(rate / 8 * want_seconds, 8 << 30))
    return rate


def size_for(goodput_bps: float, seconds: float, profiled_slowdown: float = 0.7) -> int:
    """Bytes for a profiled run of about `seconds` (profiling costs the endpoints some goodput)."""
    return max(1 << 20, int(goodput_bps / 8 * seconds * profiled_slowdown))


def report_json(run: Path, timeout: float = 600) -> dict[str, Any]:
    r = subprocess.run([sys.executable, "-m", "qprof.cli", "report", str(run), "--format", "json"],
                       capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise LabError(f"qprof report {run} failed ({r.returncode}): {r.stderr.strip()[-500:]}")
    return json.loads(r.stdout)


def run_scenario(scenario: Scenario, stack: str, factory: TransferFactory, size: int, out: Path,
                 status: Callable[[str], None] = lambda m: None, **attach: Any) -> RunResult:
    """One profiled transfer of `size` bytes in `scenario`'s lab, both ends attached; the report's verdict."""
    from qprof.collectors.session import AttachOptions, AttachSession

    res = RunResult(scenario.name, stack, scenario.expected, size=size)
    try:
        with scenario.lab() as lab, _transfer(scenario, factory, lab, size) as xfer:
            server = xfer.start_server()
            client = xfer.start_client_stopped()
            opts = AttachOptions(pids=[server, client], out=out, roles={server: "server", client: "client"},
                                 **attach)
            before = {r: lab.throttling(r) for r in ROLES}
            res.run = AttachSession(opts, on_ready=xfer.release_client, stop_when=xfer.client_done,
                                    status=status).run()
            after = {r: lab.throttling(r) for r in ROLES}
            meta = json.loads((res.run / "meta.json").read_text())
            if str(meta.get("stop_reason") or "").startswith("interrupted"):
                raise KeyboardInterrupt
            assert xfer.client is not None
            xfer.client.wait(60)
            xfer.client_done()
            _check_client(xfer)
            if xfer.released_at is not None and xfer.finished_at is not None:
                res.seconds = xfer.finished_at - xfer.released_at
                res.goodput_mbit = xfer.transferred_bytes() * 8 / res.seconds / 1e6
            for r in ROLES:
                periods = after[r].get("nr_periods", 0) - before[r].get("nr_periods", 0)
                if periods > 0:
                    res.throttled[r] = (after[r].get("nr_throttled", 0) - before[r].get("nr_throttled", 0)) / periods
        report = report_json(res.run)
        verdict = report.get("verdict")
        res.has_verdict = isinstance(verdict, dict) and "limited_by" in verdict
        res.verdict = normalize_verdict(verdict.get("limited_by")) if res.has_verdict else None
        evidence = verdict.get("evidence", {}) if isinstance(verdict, dict) else {}
        wall = float(meta.get("duration_s") or 0) or None
        for p in report.get("processes", []):
            role = p.get("role")
            cores = (evidence.get(role) or {}).get("process_cpu_cores") if isinstance(evidence, dict) else None
            if cores is not None:
                res.cpu[role] = float(cores)
            elif role in ROLES and wall and p.get("proc_cpu_seconds") is not None:
                res.cpu[role] = p["proc_cpu_seconds"] / wall
    except (QprofError, OSError, subprocess.SubprocessError, ValueError) as e:
        res.error = f"{type(e).__name__}: {e}"
    return res


def main(argv: list[str]) -> int:
    """`python -m qprof.netlab cleanup [--all]`: remove leftovers of labs whose owner is gone (--all: every lab)."""
    if not argv or argv[0] != "cleanup" or len(argv) > 2 or (len(argv) == 2 and argv[1] != "--all"):
        print("usage: python -m qprof.netlab cleanup [--all]", file=sys.stderr)
        return 2
    for line in cleanup(include_live=len(argv) == 2) or ["nothing left over"]:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
