"""A two-namespace network lab for controlled runs: a server and a client joined by a veth pair.

    with Lab(rate_mbit=200, cpu={"server": 0.3}) as lab:
        server = subprocess.Popen(cmd, preexec_fn=lab.placement("server").preexec)

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

`qprof demo` runs its transfer in a plain `Lab()`; the quotas, cpusets and busy
neighbours are what the verdict's proof scenarios (lab/scenarios.py) set up.

A path with delay and loss (`delay_ms`, one way, each direction; `loss`, the
fraction of frames dropped from server to client, both ways with `loss_both`;
`seed`): this kernel has no netem, so a third namespace (`...-path`) sits
between the two, joined to each by a veth pair (server `ql<id>s` <-> `ql<id>a`
in the path, path `ql<id>b` <-> `ql<id>c` client), and a forwarder there
bridges `a` and `b` frame by frame: held for the delay, dropped at random with
a seeded generator, or dropped when the direction's queue (`path_queue_bytes`,
default 1 Gbit/s x the delay + 2 MiB) is full, counted apart. Server and
client keep their addresses and their one /30: the path is a wire (L2), it
forwards ARP and everything else. The forwarder is a program of the repository
(lab/path: forwarder.c, built and cached there), not of this package: the lab
is given its command maker (`Lab(delay_ms=15, forwarder=lab.path.command)`).
It runs in the path namespace, in no cgroup of the lab (it stands for a
network, not a tenant), SCHED_FIFO `path_fifo` when the kernel allows (which
needs the real-time bandwidth of the creator's cpu cgroup), and writes its
counters as JSON lines: `path_stats()` now, `path_history()` each second,
`path_final` once the lab closed; per direction frames forwarded, random drops,
queue-full drops, how late frames left, and its own CPU seconds.
Segmentation offloads are off on the endpoints' veths (ethtool: tso and
tx-udp-segmentation; GSO stays on, so the stacks still hand the kernel large
packets, cut to MTU-sized frames at their device as a NIC without those
offloads does), GRO and offloads off on the path's, so every frame the path
holds or drops is one MTU-sized frame. A rate limit (`rate_mbit`) stays where
it is without a path: tbf on each endpoint's veth egress, so the bottleneck
queue sits at the sender and the delay after it, like a bottleneck link
followed by a long line. Without delay and loss nothing of this exists.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from qprof.collectors.netns import setns
from qprof.endpoints import Placement
from qprof.errors import QprofError
from qprof.probes.features import mount_table

PREFIX = "qprof-lab-"
STATE_DIR = Path("/run/qprof-lab")
NETNS_DIR = Path("/run/netns")
ROLES = ("server", "client")
PATH = "path"  # the namespace between them when the lab has a path with delay or loss
# the veth ends of each namespace, by the letter after ql<id>: the path's `a` faces the server, `b` the client
LINK_ENDS = {"server": "s", "client": "c", PATH: "ab"}
PATH_QUEUE_MBIT = 1000  # the path's queue per direction holds this rate x the delay, plus PATH_QUEUE_SLACK
PATH_QUEUE_SLACK = 2 << 20  # bytes: what the forwarder reads in one pass (1024 frames) fits beside a full delay
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


def _controller(name: str) -> tuple[int, Path] | None:
    """(version, mount) of the hierarchy with controller `name`: a v1 mount naming it, else a v2
    mount offering it."""
    mounts = mount_table()
    for m in mounts:
        if m.fstype == "cgroup" and name in m.options:
            return 1, m.where
    for m in mounts:
        try:
            if m.fstype == "cgroup2" and name in (m.where / "cgroup.controllers").read_text().split():
                return 2, m.where
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
    for m in mount_table():
        if m.fstype == "cgroup2" and (m.where / "cpu.pressure").exists():
            return m.where
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
    recorded: object = state.get("starttime")  # the owner's start time as the registry wrote it
    return _starttime(int(state["pid"])) == recorded


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
        m = re.fullmatch(re.escape(PREFIX) + r"([0-9a-f]{6})-(server|client|path)", p.name)
        if m:
            entry(m[1])["netns"].append(p.name)
    for root in lab_roots():
        for p in root.iterdir() if root.is_dir() else []:
            m = re.fullmatch(re.escape(PREFIX) + r"([0-9a-f]{6})", p.name)
            if m and p.is_dir():
                entry(m[1])["cgroups"].append(p)
    for line in _run(["ip", "-o", "link", "show"], check=False).stdout.splitlines():
        m = re.match(r"\d+: (ql([0-9a-f]{6})[scab])[@:]", line)
        if m:
            entry(m[2])["links"].append(m[1])
    if STATE_DIR.is_dir():
        for p in STATE_DIR.glob("*.json"):
            if _ID.fullmatch(p.stem):
                entry(p.stem)["state"].append(p)
        for p in STATE_DIR.glob("*.path.jsonl"):  # a path forwarder's counters
            if _ID.fullmatch(p.name.split(".")[0]):
                entry(p.name.split(".")[0])["state"].append(p)
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
        for end in LINK_ENDS.get(ns.rsplit("-", 1)[1], ""):
            # synchronous: takes the peer and the qdiscs
            _run(["ip", "-n", ns, "link", "del", f"ql{lab_id}{end}"], check=False)
        _run(["ip", "netns", "del", ns], check=False)
        removed.append(f"netns {ns}")
    for link in res["links"]:
        _run(["ip", "link", "del", link], check=False)
        removed.append(f"link {link}")
    for cg in res["cgroups"]:
        _rmdir_tree(cg)
        removed.append(f"cgroup {cg}")
    for p in sorted(res["state"], key=lambda p: p.suffix == ".json"):  # the owner's record last
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
    for CPU. `cpus` is its affinity (empty: any CPU); `cpuset_of` puts it in that role's cpuset,
    `quota_of` in that role's capped cpu cgroup (sharing its quota, as a service's other process)."""

    cpus: tuple[int, ...] = ()
    cpuset_of: str | None = None
    quota_of: str | None = None


HOG_COMMAND = ["sh", "-c", "while :; do :; done"]


@dataclass(frozen=True)
class PathSpec:
    """What a lab asks of its path's forwarder; a forwarder command maker turns it into a command line
    (lab.path.command). `server_side` and `client_side` are the path namespace's interfaces."""

    server_side: str
    client_side: str
    delay_ms: float
    loss_server_to_client: float
    loss_client_to_server: float
    seed: int
    queue_bytes: int  # per direction
    interval_ms: int  # counters written this often (0: on request and at exit only)
    fifo: int  # SCHED_FIFO priority (0: as started)


Forwarder = Callable[[PathSpec], list[str]]
# the forwarder's directions (a faces the server) -> the names the lab gives them
PATH_DIRECTIONS = {"a_to_b": "server_to_client", "b_to_a": "client_to_server"}


class Lab:
    """Two namespaces joined by a veth pair, with an optional rate limit, per-role CPU quotas,
    affinities (`cpus`), cpusets and CPU weights, and busy neighbours (`hogs`).

    `own_cgroups=False` starts the processes where a user starts them from a shell: no cgroup of
    their own. They stay in the creator's cpu cgroup (a role with a quota and the hogs sharing it
    get one capped cgroup together, as a service does) and share one cgroup in the v2 hierarchy
    (`qprof-lab-<id>/shell`, no controller enabled: it only keeps track of them), so no side has a
    CPU pressure of its own unless qprof makes one.

    `delay_ms` (one way, each direction) and `loss` (server to client; both ways with `loss_both`)
    put a path namespace with a forwarder between the two (the module's docstring): `forwarder` makes
    its command line (lab.path.command), `seed` its random losses, `path_queue_bytes` its queue per
    direction (default PATH_QUEUE_MBIT x the delay + PATH_QUEUE_SLACK), `path_fifo` its SCHED_FIFO
    priority (0: none)."""

    def __init__(self, rate_mbit: float | None = None, cpu: dict[str, float | None] | None = None,
                 mtu: int = 1500, latency_ms: float = 25.0, cpus: dict[str, tuple[int, ...]] | None = None,
                 cpusets: dict[str, tuple[int, ...]] | None = None, hogs: tuple[Hog, ...] = (),
                 weights: dict[str, float] | None = None, own_cgroups: bool = True,
                 delay_ms: float = 0.0, loss: float = 0.0, loss_both: bool = False, seed: int = 1,
                 path_queue_bytes: int | None = None, path_fifo: int = 10,
                 forwarder: Forwarder | None = None) -> None:
        cpu, cpus, cpusets, weights = dict(cpu or {}), dict(cpus or {}), dict(cpusets or {}), dict(weights or {})
        unknown = (set(cpu) | set(cpus) | set(cpusets) | set(weights)
                   | {h.cpuset_of for h in hogs if h.cpuset_of} | {h.quota_of for h in hogs if h.quota_of}) - set(ROLES)
        if unknown:
            raise LabError(f"unknown role(s) {sorted(unknown)}: use {ROLES}")
        if not own_cgroups and weights:
            raise LabError("CPU weights need a cgroup per role: drop them or keep own_cgroups")
        if any(h.quota_of and not cpu.get(h.quota_of) for h in hogs):
            raise LabError("a hog shares a role's quota that is not set: give that role a CPU quota")
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
        if not 0 <= delay_ms <= 60_000:
            raise LabError(f"delay {delay_ms} ms is out of range: give 0 to 60000 ms, one way")
        if not 0 <= loss <= 1:
            raise LabError(f"loss {loss} is out of range: give the fraction of frames dropped, 0 to 1")
        if not 0 <= seed < 2**53:
            raise LabError(f"seed {seed} is out of range: give 0 to 2**53 - 1")
        if not 0 <= path_fifo <= 99:
            raise LabError(f"SCHED_FIFO priority {path_fifo} is out of range: give 1 to 99, or 0 for none")
        if path_queue_bytes is not None and not 65_536 <= path_queue_bytes <= 1 << 34:
            raise LabError(f"path queue of {path_queue_bytes} bytes is out of range: give 64 KiB to 16 GiB")
        self.delay_ms = float(delay_ms)
        self.loss = float(loss)
        self.loss_both = loss_both
        self.seed = seed
        self.path_fifo = path_fifo
        self.path_queue_bytes = (path_queue_bytes
                                 or math.ceil(PATH_QUEUE_MBIT * 1e6 / 8 * delay_ms / 1e3) + PATH_QUEUE_SLACK)
        if self.has_path and forwarder is None:
            raise LabError("delay and loss need the path's forwarder: pass forwarder=lab.path.command "
                           "(the repository's lab/path builds it)")
        self.forwarder = forwarder
        self.path_final: dict[str, Any] | None = None  # the forwarder's last counters, once the lab closed
        self._forwarder: subprocess.Popen[bytes] | None = None
        self.rate_mbit = rate_mbit
        self.weights = weights
        self.cpu = cpu
        self.cpus = cpus
        self.cpusets = cpusets
        self.hogs = hogs
        self.own_cgroups = own_cgroups
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

    @property
    def has_path(self) -> bool:
        """Whether a path namespace with a forwarder sits between server and client."""
        return self.delay_ms > 0 or self.loss > 0

    @property
    def loss_client_to_server(self) -> float:
        return self.loss if self.loss_both else 0.0

    # names and addresses
    def netns(self, role: str) -> str:
        """The namespace of `role` ("server", "client", or "path" when the lab has one)."""
        return f"{PREFIX}{self.id}-{role}"

    def netns_path(self, role: str) -> str:
        return str(NETNS_DIR / self.netns(role))

    def link(self, role: str) -> str:
        return f"ql{self.id}{role[0]}"

    def path_link(self, role: str) -> str:
        """The path namespace's interface facing `role`."""
        return f"ql{self.id}{'a' if role == 'server' else 'b'}"

    def _namespaces(self) -> list[str]:
        return [*ROLES, PATH] if self.has_path else list(ROLES)

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
        """`role`'s cpu cgroup: its own, or without own cgroups the capped one it shares with its hogs,
        the shared one when the cpu controller is v2, or None (it stays in the creator's)."""
        parent = self.cgroup_parent
        if parent is None:
            return None
        return parent / role if self.own_cgroups or self.cpu.get(role) else self._shared_cpu()

    def _shared_cpu(self) -> Path | None:
        """Without own cgroups, on a v2 cpu controller: the cgroup the uncapped processes share (the
        lab's processes must be in some v2 cgroup of its own to be found); on v1 none."""
        parent = self.cgroup_parent
        if self.own_cgroups or parent is None or self.cgroups_kind is None or self.cgroups_kind.version != 2:
            return None
        return parent / "shell"

    def _shell(self) -> Path | None:
        """Without own cgroups: the v2 cgroup every process of the lab shares (tracking only)."""
        return self.psi_root / f"{PREFIX}{self.id}" / "shell" if self.psi_root is not None else None

    def _lab_cgroups(self, role: str) -> tuple[str, ...]:
        """`role`'s cgroups in every hierarchy the lab uses: cpu, cpuset (when it has one), PSI."""
        found = [self.cgroup(role)]
        if role in self.cpusets and self.cpuset_kind is not None:
            found.append(self.cpuset_kind.root / f"{PREFIX}{self.id}" / role)
        if self.psi_root is not None:
            found.append(self.psi_root / f"{PREFIX}{self.id}" / role if self.own_cgroups else self._shell())
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
        if self.has_path and shutil.which("ethtool") is None:
            raise LabError("ethtool is missing: a path with delay or loss needs it to keep frames MTU-sized "
                           "(apt-get install ethtool; make test installs it)")
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
                     "netns": [self.netns(r) for r in self._namespaces()]}
            (STATE_DIR / f"{self.id}.json").write_text(json.dumps(state))
            self._created = True
        for role in self._namespaces():
            _run(["ip", "netns", "add", self.netns(role)])
        if self.has_path:
            self._create_path_links()
        else:
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
            shared = self._shared_cpu()
            if shared is not None:
                shared.mkdir()
            for role in ROLES:
                cg = self.cgroup(role)
                if cg is None or cg == shared:
                    continue
                cg.mkdir()
                self.cgroups_kind.set_quota(cg, self.cpu.get(role))
                if self.weights.get(role):
                    self.cgroups_kind.set_weight(cg, self.weights[role])
            if self.own_cgroups:
                (parent / "hogs").mkdir()
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
            for role in ROLES if self.own_cgroups else ("shell",):
                (self.psi_root / f"{PREFIX}{self.id}" / role).mkdir(parents=True)
        if self.has_path:
            self._start_forwarder()

    # the path
    def _create_path_links(self) -> None:
        """The path namespace (no IPv6: it originates nothing) joined to each side by a veth pair; its
        ends up, promiscuous, without GRO or offloads; the sides' ends without segmentation offloads."""
        path = self.netns(PATH)
        with self.entered(PATH):
            for scope in ("all", "default"):
                conf = Path(f"/proc/sys/net/ipv6/conf/{scope}/disable_ipv6")
                if conf.exists():
                    conf.write_text("1")
        for role in ROLES:
            _run(["ip", "link", "add", self.link(role), "netns", self.netns(role), "mtu", str(self.mtu),
                  "type", "veth", "peer", "name", self.path_link(role), "netns", path, "mtu", str(self.mtu)])
            self._ethtool(role, self.link(role), "tso", "off", "tx-udp-segmentation", "off")
            end = self.path_link(role)
            self._ethtool(PATH, end, "gro", "off", "gso", "off", "tso", "off", "tx-udp-segmentation", "off")
            _run(["ip", "-n", path, "link", "set", end, "promisc", "on", "up"])

    def _ethtool(self, ns: str, dev: str, *features: str) -> None:
        r = subprocess.run(["ethtool", "-K", dev, *features], capture_output=True, text=True,
                           preexec_fn=Placement(netns=self.netns_path(ns)).preexec)
        if r.returncode != 0:
            raise LabError(f"ethtool -K {dev} {' '.join(features)} failed (exit {r.returncode}): "
                           f"{(r.stderr or r.stdout).strip()}")

    def path_spec(self) -> PathSpec:
        return PathSpec(server_side=self.path_link("server"), client_side=self.path_link("client"),
                        delay_ms=self.delay_ms, loss_server_to_client=self.loss,
                        loss_client_to_server=self.loss_client_to_server, seed=self.seed,
                        queue_bytes=self.path_queue_bytes, interval_ms=1000, fifo=self.path_fifo)

    @property
    def _path_counters(self) -> Path:
        return STATE_DIR / f"{self.id}.path.jsonl"

    def _path_read(self, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
        """The forwarder's counters lines from byte `offset` on (whole lines only: the last may be half
        written; a line cut by `offset` is skipped), and the offset after the last whole one."""
        try:
            with open(self._path_counters, "rb") as f:
                f.seek(offset)
                data = f.read()
        except FileNotFoundError:
            return [], offset
        end = data.rfind(b"\n") + 1
        records = []
        for line in data[:end].split(b"\n"):
            with contextlib.suppress(ValueError):
                records.append(_path_record(json.loads(line)))
        return records, offset + end

    def _start_forwarder(self) -> None:
        """Start the forwarder in the path namespace and wait until its sockets are bound."""
        assert self.forwarder is not None
        argv = self.forwarder(self.path_spec())
        with open(self._path_counters, "wb") as out:
            p = self._forwarder = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.PIPE,
                                                   preexec_fn=Placement(netns=self.netns_path(PATH)).preexec)
        deadline = time.monotonic() + 10
        while not self._path_read()[0]:
            if p.poll() is not None:
                err = p.stderr.read().decode(errors="replace").strip() if p.stderr else ""
                raise LabError(f"the path forwarder did not start ({' '.join(argv)}): exit {p.returncode}: {err}")
            if time.monotonic() > deadline:
                raise LabError(f"the path forwarder did not start within 10 s ({' '.join(argv)})")
            time.sleep(0.005)

    @property
    def forwarder_pid(self) -> int | None:
        return self._forwarder.pid if self._forwarder is not None else None

    def path_stats(self, timeout: float = 5.0) -> dict[str, Any]:
        """The forwarder's counters now (it is asked for them: SIGUSR1): per direction
        (`server_to_client`, `client_to_server`) frames received, forwarded, bytes, random_drops,
        queue_drops, send_errors, socket_drops, ..., and its own cpu_seconds since it started."""
        if self._forwarder is None or self._forwarder.poll() is not None:
            raise LabError("this lab has no running path forwarder (no delay or loss asked, or it is closed)")
        offset = self._path_counters.stat().st_size
        self._forwarder.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + timeout
        while True:
            new = [r for r in self._path_read(offset)[0] if r.get("event") == "stats"]
            if new:
                return new[-1]
            if time.monotonic() > deadline:
                raise LabError(f"the path forwarder (pid {self._forwarder.pid}) did not answer within {timeout} s")
            time.sleep(0.002)

    def path_history(self) -> list[dict[str, Any]]:
        """Every counters line the forwarder wrote so far: at start, each second, on request, at exit."""
        return self._path_read()[0]

    def _stop_forwarder(self) -> None:
        """SIGTERM: the forwarder writes its final counters (kept in `path_final`) and exits."""
        p, self._forwarder = self._forwarder, None
        if p is None:
            return
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        if p.stderr is not None:
            p.stderr.close()
        with contextlib.suppress(FileNotFoundError):
            tail = max(0, self._path_counters.stat().st_size - (64 << 10))
            final = [r for r in self._path_read(tail)[0] if r.get("event") == "exit"]
            self.path_final = final[-1] if final else None

    def _start_hogs(self) -> None:
        """The busy neighbours, in the lab's `hogs` cpu cgroup (without own cgroups: beside the roles, in
        the shared v2 cgroup), so leftovers are found, and when asked in a role's cpuset or capped cpu
        cgroup; in no network namespace (they never touch the network)."""
        for i, hog in enumerate(self.hogs):
            if self.own_cgroups:
                cgs = [str(self.cgroup_parent / "hogs" / str(i))] if self.cgroup_parent else []
            else:  # beside the roles: in the shared cgroup, or in the capped one of the role it shares
                cpu = self.cgroup(hog.quota_of) if hog.quota_of else self._shared_cpu()
                cgs = [str(c) for c in (cpu, self._shell()) if c is not None]
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
        self._stop_forwarder()
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


def _path_record(raw: dict[str, Any]) -> dict[str, Any]:
    """A forwarder's counters line with its directions named after the lab's sides."""
    return {PATH_DIRECTIONS.get(k, k): v for k, v in raw.items()}


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
