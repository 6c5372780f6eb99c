"""A two-namespace network lab for controlled runs: a server and a client joined by a veth pair.

    with Lab(rate_mbit=200, cpu={"server": 0.3}) as lab:
        xfer = Ngtcp2Transfer(size, host=lab.server_addr, placement=lab.placements())

`Lab` creates two network namespaces (`qprof-lab-<id>-server`, `-client`), a
veth pair with one end in each (10.77.N.1/30 server, 10.77.N.2/30 client, MTU
1500; the addresses exist only inside the namespaces, nothing is routed
outside), brings `lo` up in each, optionally shapes both veth ends with
`tc ... tbf`, and gives each role a cgroup (`qprof-lab-<id>/<role>` in the cpu
hierarchy: cgroup v1 cfs quota, or cgroup v2 cpu.max, whichever this machine
has) with an optional CPU quota in cores and CPU weight; optionally a cpuset
cgroup, a CPU affinity, and busy neighbours (`Hog`, each in a cgroup of its
own so N of them weigh as N tasks). Beside a v1 cpu controller each role also
gets a cgroup in the v2 hierarchy, where the kernel keeps per-cgroup CPU
pressure (PSI). A process is placed by entering its namespace and cgroups and
taking its affinity between fork and exec (qprof.endpoints.Placement), so a
held process (StoppedProcess) stops at the real program.

Everything is removed on exit, also on exceptions and SIGINT/SIGTERM/SIGHUP:
processes still in the lab are killed, the namespaces (and with them the veth
and its qdiscs) deleted, the cgroups removed. Each lab registers its owner in
/run/qprof-lab/<id>.json before creating anything; `cleanup()` (also run when
a lab starts, and by `python -m qprof.netlab cleanup`) removes what labs whose
owner is gone (SIGKILL, power loss) left behind, and never touches a live lab.

The verdict's proof matrix lives here too (`SCENARIOS`, `run_scenario`): the
bench (bench/verdict_matrix.py) and the test (tests/test_verdict_scenarios.py)
run the same code. `ReceiveBufferClamp` holds a running receiver's socket
buffer small from outside (pidfd_getfd), for any stack.
"""

from __future__ import annotations

import contextlib
import ctypes
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

    def set_weight(self, cg: Path, factor: float) -> None:
        """CPU weight as a multiple of a nice-0 task's (v1 cpu.shares 1024, v2 cpu.weight 100)."""
        if self.version == 1:
            (cg / "cpu.shares").write_text(str(round(1024 * factor)))
        else:
            (cg / "cpu.weight").write_text(str(min(10_000, max(1, round(100 * factor)))))

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


def _mounts() -> list[tuple[Path, str, list[str]]]:
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return []
    return [(Path(p[1]), p[2], p[3].split(",")) for p in (ln.split() for ln in lines) if len(p) >= 4]


def _controller(name: str) -> tuple[int, Path] | None:
    """(version, mount) of the hierarchy with controller `name`: a v1 mount naming it, else a v2
    mount offering it."""
    mounts = _mounts()
    for where, fstype, opts in mounts:
        if fstype == "cgroup" and name in opts:
            return 1, where
    for where, fstype, _ in mounts:
        try:
            if fstype == "cgroup2" and name in (where / "cgroup.controllers").read_text().split():
                return 2, where
        except OSError:
            continue
    return None


def cpu_cgroups() -> CpuCgroups | None:
    """Where the cpu controller is (cfs quota in v1, cpu.max in v2)."""
    found = _controller("cpu")
    return CpuCgroups(*found) if found else None


@dataclass(frozen=True)
class CpusetCgroups:
    """The cgroup hierarchy with the cpuset controller: v1 (cpuset.cpus, cpuset.mems) or v2 (cpuset.cpus)."""

    version: int
    root: Path

    def prepare_parent(self, parent: Path) -> None:
        if self.version == 1:  # a v1 cpuset takes no task before it has CPUs and memory nodes
            for name in ("cpuset.cpus", "cpuset.mems"):
                (parent / name).write_text((self.root / name).read_text().strip() or "0")
        else:
            for d in (self.root, parent):
                ctl = d / "cgroup.subtree_control"
                if "cpuset" not in ctl.read_text().split():
                    ctl.write_text("+cpuset")

    def set_cpus(self, cg: Path, cpus: tuple[int, ...]) -> None:
        (cg / "cpuset.cpus").write_text(",".join(map(str, cpus)))
        if self.version == 1:
            (cg / "cpuset.mems").write_text((cg.parent / "cpuset.mems").read_text().strip())


def cpuset_cgroups() -> CpusetCgroups | None:
    """Where the cpuset controller is."""
    found = _controller("cpuset")
    return CpusetCgroups(*found) if found else None


def pressure_root() -> Path | None:
    """A v2 hierarchy beside a v1 cpu controller (hybrid mounts): its cgroups still keep per-cgroup
    CPU pressure (PSI), so each role also gets one there. None when the cpu cgroups are v2 already."""
    cpu = cpu_cgroups()
    if cpu is not None and cpu.version == 2:
        return None
    for where, fstype, _ in _mounts():
        if fstype == "cgroup2" and (where / "cpu.pressure").exists():
            return where
    return None


def lab_roots() -> list[Path]:
    """Every hierarchy a lab makes cgroups in."""
    roots = [c.root for c in (cpu_cgroups(), cpuset_cgroups()) if c is not None]
    psi = pressure_root()
    return list(dict.fromkeys(roots + ([psi] if psi else [])))


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
    for root in lab_roots():
        for p in root.iterdir() if root.is_dir() else []:
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

@dataclass(frozen=True)
class Hog:
    """A busy process (a shell loop that never blocks) started with the lab: another tenant competing
    for CPU. `cpus` is its affinity (empty: any CPU); `cpuset_of` puts it in that role's cpuset."""

    cpus: tuple[int, ...] = ()
    cpuset_of: str | None = None


HOG_COMMAND = ["sh", "-c", "while :; do :; done"]


class Lab:
    """Two namespaces joined by a veth pair, with an optional rate limit, per-role CPU quotas,
    affinities (`cpus`), cpusets and CPU weights, and busy neighbours (`hogs`)."""

    def __init__(self, rate_mbit: float | None = None, cpu: dict[str, float | None] | None = None,
                 mtu: int = 1500, latency_ms: float = 25.0, cpus: dict[str, tuple[int, ...]] | None = None,
                 cpusets: dict[str, tuple[int, ...]] | None = None, hogs: tuple[Hog, ...] = (),
                 weights: dict[str, float] | None = None) -> None:
        cpu, cpus, cpusets, weights = dict(cpu or {}), dict(cpus or {}), dict(cpusets or {}), dict(weights or {})
        unknown = (set(cpu) | set(cpus) | set(cpusets) | set(weights)
                   | {h.cpuset_of for h in hogs if h.cpuset_of}) - set(ROLES)
        if unknown:
            raise LabError(f"unknown role(s) {sorted(unknown)}: use {ROLES}")
        for role, cores in cpu.items():
            if cores is not None and not 0.01 <= cores <= (os.cpu_count() or 1):
                raise LabError(f"CPU quota {cores} for {role} is out of range: give cores, e.g. 0.3")
        host = set(range(os.cpu_count() or 1))
        for what, sets in (("cpus", cpus.values()), ("cpuset", cpusets.values()), ("hog cpus", (h.cpus for h in hogs))):
            for c in sets:
                if not set(c) <= host:
                    raise LabError(f"{what} {list(c)} name CPUs this host lacks (it has {sorted(host)})")
        if rate_mbit is not None and not 0 < rate_mbit <= 100_000:
            raise LabError(f"rate {rate_mbit} Mbit/s is out of range")
        if any(w is not None and not 0.01 <= w <= 100 for w in weights.values()):
            raise LabError(f"CPU weights {weights} are out of range: give multiples of a task's, 0.01 to 100")
        self.rate_mbit = rate_mbit
        self.weights = weights
        self.cpu = cpu
        self.cpus = cpus
        self.cpusets = cpusets
        self.hogs = hogs
        self.mtu = mtu
        self.latency_ms = latency_ms
        self.id = secrets.token_hex(3)
        self.n: int | None = None
        self.cgroups_kind = cpu_cgroups()
        self.cpuset_kind = cpuset_cgroups() if cpusets else None
        self.psi_root = pressure_root()
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

    def _lab_cgroups(self, role: str) -> tuple[str, ...]:
        """`role`'s cgroups in every hierarchy the lab uses: cpu, cpuset (when it has one), PSI."""
        found = [self.cgroup(role)]
        if role in self.cpusets and self.cpuset_kind is not None:
            found.append(self.cpuset_kind.root / f"{PREFIX}{self.id}" / role)
        if self.psi_root is not None:
            found.append(self.psi_root / f"{PREFIX}{self.id}" / role)
        return tuple(str(c) for c in found if c is not None)

    def placement(self, role: str) -> Placement:
        return Placement(netns=self.netns_path(role), cgroups=self._lab_cgroups(role),
                         cpus=self.cpus.get(role, ()))

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
        if self.cpusets and self.cpuset_kind is None:
            raise LabError("no cgroup hierarchy with the cpuset controller is mounted: cannot make cpusets")
        self._trap_signals()
        try:
            cleanup()
            self._create()
            self._start_hogs()
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
            if self.weights:  # a weight counts against siblings only: the lab must outweigh the host's load too
                self.cgroups_kind.set_weight(parent, max(self.weights.values()))
            for role in (*ROLES, "hogs"):
                cg = parent / role
                cg.mkdir()
                self.cgroups_kind.set_quota(cg, self.cpu.get(role))
                if self.weights.get(role):
                    self.cgroups_kind.set_weight(cg, self.weights[role])
            self.cgroups_kind.prepare_parent(parent / "hogs")
            for i in range(len(self.hogs)):  # one cgroup each: N hogs weigh as N tasks, not as one group
                (parent / "hogs" / str(i)).mkdir()
        if self.cpuset_kind is not None:
            parent = self.cpuset_kind.root / f"{PREFIX}{self.id}"
            parent.mkdir()
            self.cpuset_kind.prepare_parent(parent)
            for role, cpus in self.cpusets.items():
                (parent / role).mkdir()
                self.cpuset_kind.set_cpus(parent / role, cpus)
        if self.psi_root is not None:
            for role in ROLES:
                (self.psi_root / f"{PREFIX}{self.id}" / role).mkdir(parents=True)

    def _start_hogs(self) -> None:
        """The busy neighbours, in the lab's `hogs` cpu cgroup (so leftovers are found) and, when
        asked, in a role's cpuset; in no network namespace (they never touch the network)."""
        for i, hog in enumerate(self.hogs):
            cgs = [str(self.cgroup_parent / "hogs" / str(i))] if self.cgroup_parent else []
            if hog.cpuset_of is not None:
                cgs += [c for c in self._lab_cgroups(hog.cpuset_of) if self.cpuset_kind
                        and c.startswith(str(self.cpuset_kind.root) + "/")]
            where = Placement(cgroups=tuple(cgs), cpus=hog.cpus)
            p = subprocess.Popen(HOG_COMMAND, preexec_fn=where.preexec, stdin=subprocess.DEVNULL)
            self._procs.append(p)
            where.check(p.pid)

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


# ---- a receiver's socket buffer, set from outside ----------------------------

_SYS_PIDFD_GETFD = 438  # x86_64 and most architectures (asm-generic)


def _udp_inodes(pid: int) -> set[str]:
    found = set()
    for table in ("udp", "udp6"):
        try:
            with open(f"/proc/{pid}/net/{table}", encoding="ascii") as f:
                next(f, None)
                found |= {line.split()[9] for line in f if len(line.split()) > 9}
        except OSError:
            continue
    return found


def udp_socket_fds(pid: int) -> list[int]:
    """The process's file descriptors that are UDP sockets (matched by inode in its namespace)."""
    inodes = _udp_inodes(pid)
    fds = []
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return []
    for name in names:
        try:
            link = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue
        if link.startswith("socket:[") and link[8:-1] in inodes:
            fds.append(int(name))
    return fds


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
Roles = tuple[tuple[str, tuple[int, ...]], ...]  # (role, CPUs) pairs: a frozen dataclass keeps no dicts


@dataclass(frozen=True)
class Scenario:
    """A controlled run with a known answer: how the lab is set up and what the verdict must say.

    The verdict never sees any of this: it decides from what qprof measured. `cause` is the overall
    cause the verdict must name. Sides the scenario does not limit by CPU are `protected`: a high
    CPU weight, so the shared host's other load cannot make them the bottleneck instead."""

    name: str
    expected: str | None  # the verdict's limited_by; None: reported as measured
    cause: str | None = None  # the verdict's overall cause
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
    about: str = ""

    @property
    def needs(self) -> tuple[str, ...]:
        """Endpoint options the scenario cannot do without (qlog is read where a stack writes it)."""
        return ("app_rate_mbit",) if self.app_rate_mbit else ()

    @property
    def cpus_needed(self) -> int:
        """CPUs the host must have: one more than the highest CPU anything is bound to."""
        used = [c for _, cs in self.cpus + self.cpusets for c in cs] + [c for h in self.hogs for c in h.cpus]
        return max(used) + 1 if used else 1

    def lab(self) -> Lab:
        return Lab(rate_mbit=self.rate_mbit, cpu={"server": self.server_cpu, "client": self.client_cpu},
                   cpus=dict(self.cpus), cpusets=dict(self.cpusets), hogs=self.hogs,
                   weights={r: PROTECTED for r in self.protected})


def _starved(role: str, how: str) -> Scenario:
    """`role` shares one CPU with HOGS busy processes, bound there by affinity or a cpuset; the other side
    is protected (and, with affinity, bound to the other CPU)."""
    other, cpu = ("client", 0) if role == "server" else ("server", 1)
    if how == "contention":
        return Scenario(f"{role}-contention", f"{role}-limited", "cpu-starved",
                        cpus=((role, (cpu,)), (other, (1 - cpu,))), hogs=(Hog(cpus=(cpu,)),) * HOGS,
                        protected=(other,),
                        about=f"{role} bound to CPU {cpu} beside {HOGS} busy processes, {other} alone on "
                              f"CPU {1 - cpu}")
    return Scenario(f"{role}-cpuset", f"{role}-limited", "cpu-starved", cpusets=((role, (cpu,)),),
                    hogs=(Hog(cpuset_of=role),) * HOGS, protected=(other,),
                    about=f"{role} in a one-CPU cpuset shared with {HOGS} busy processes, {other} free")


SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    Scenario("server-quota", "server-limited", "cpu-starved", server_cpu=CAP, protected=("client",),
             about=f"server's cgroup capped at {CAP} of a core"),
    Scenario("client-quota", "client-limited", "cpu-starved", client_cpu=CAP, protected=("server",),
             about=f"client's cgroup capped at {CAP} of a core"),
    _starved("server", "contention"),
    _starved("client", "contention"),
    _starved("server", "cpuset"),
    _starved("client", "cpuset"),
    Scenario("receive-buffer", "client-limited", "receive-buffer", client_rcvbuf=TINY_RCVBUF, protected=ROLES,
             about=f"client's socket held at SO_RCVBUF {TINY_RCVBUF} (the kernel doubles it)"),
    Scenario("link", "neither", "link", rate_mbit=LINK_RATE_MBIT, qlog=True, protected=ROLES,
             about=f"the link shaped to {LINK_RATE_MBIT} Mbit/s (tbf)"),
    Scenario("application", "neither", "flow-control/application", app_rate_mbit=APP_RATE_MBIT, qlog=True,
             protected=ROLES, about=f"the server paces its own writes to {APP_RATE_MBIT} Mbit/s, the link free"),
    Scenario("uncapped", None, about="both free, the link unshaped, no weights: reported as measured"),
)}

# (size, server address, placement per role[, environment per role]) -> a Transfer not started yet
TransferFactory = Callable[..., Transfer]


def transfer_factory(stack: str) -> TransferFactory:
    """ngtcp2 (Debian's gtlsserver/gtlsclient), or a built test endpoint (tests/ on sys.path: quicgo, quinn...)."""
    if stack == "ngtcp2":
        from qprof.endpoints import Ngtcp2Transfer

        return lambda size, host, placement, env=None: Ngtcp2Transfer(size, host=host, placement=placement,
                                                                      env=env or {})
    built = _built(stack)
    from endpoints.transfer import BulkTransfer  # type: ignore[import-not-found]

    return lambda size, host, placement, env=None: BulkTransfer(size, host=host, placement=placement,
                                                                env=env or {}, built=built)


def _built(stack: str) -> Any:
    try:
        from endpoints.build import build  # type: ignore[import-not-found]
    except ImportError:
        raise LabError(f"stack {stack!r} is a test endpoint: put the repository's tests/ on sys.path") from None
    return build(stack)


def endpoint_options(stack: str) -> dict[str, str]:
    """The options a stack's endpoints take (option -> environment variable); ngtcp2's take none."""
    return {} if stack == "ngtcp2" else dict(_built(stack).spec.env_options)


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
    expected_cause: str | None = None
    verdict: str | None = None  # normalised limited_by; None when the report has no verdict
    cause: str | None = None  # the verdict's overall cause
    has_verdict: bool = False
    stack_word: dict[str, Any] | None = None  # the stack's own record beside the verdict (qlog), if any
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
    if qlog_dir is not None and "qlog_dir" in opts:
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
        xfer = factory(size, lab.server_addr, lab.placements(), _env(scenario, stack, qlog_dir))
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


def measure_goodput(scenario: Scenario, stack: str, factory: TransferFactory, first_size: int = 16 << 20,
                    want_seconds: float = 1.5, timeout: float = 120.0) -> float:
    """Unprofiled goodput (bit/s) of `scenario` for this stack: grows a short transfer until it lasts a while."""
    size = first_size
    for _ in range(4):
        with scenario.lab() as lab, _transfer(scenario, stack, factory, lab, size) as placed:
            xfer = placed.xfer
            xfer.start_server()
            xfer.start_client_stopped()
            placed.release()
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
                                    status=status).run()
            after = {r: lab.throttling(r) for r in ROLES}
            meta = json.loads((res.run / "meta.json").read_text())
            if str(meta.get("stop_reason") or "").startswith("interrupted"):
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
