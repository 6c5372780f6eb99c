"""Who limits the run: the server's CPU, the client's, both, or neither (network, congestion, flow control).

Only what qprof measured on the targets and their cgroups decides, never how
a test set them up. Per side, from /proc (schedstat: ns on a CPU and ns
runnable but waiting) and the cgroup's CPU controller:
- the busiest thread's demand: on-CPU share of wall time plus run-queue share
  (the founding study saw >95% on the limiting side; most stacks are
  single-threaded);
- the whole process's demand against what it may use: the host's CPUs, or its
  cgroup quota (a container capped at 30% of a core is CPU-limited at 30%);
- cgroup throttling: the share of enforcement periods in which it was throttled.
A side is CPU-limited when any of these reaches its threshold. Time blocked in
epoll/poll/recv (waiting for packets), receive drops and goodput are evidence
shown beside the decision. Each side's rates come from its own window, so two
archives from two hosts (no clock sync) can be judged together.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Iterable

from qprof.attribution.packetio import PacketIO

THRESHOLDS = {
    "busiest_thread_demand": 0.90,  # on-CPU + run-queue share of wall time
    "process_demand_of_capacity": 0.90,  # (on-CPU + run-queue) / min(host CPUs, cgroup quota)
    "throttled_periods": 0.25,  # share of CFS periods in which the cgroup was throttled
}
MIN_WINDOW_S = 0.5
# x86_64 system calls a thread sits in while it waits for packets
WAIT_SYSCALLS = {"232": "epoll_wait", "281": "epoll_pwait", "441": "epoll_pwait2", "7": "poll",
                 "271": "ppoll", "23": "select", "270": "pselect6", "45": "recvfrom", "47": "recvmsg",
                 "299": "recvmmsg", "426": "io_uring_enter"}
OTHER_SYSCALLS = {"202": "futex", "35": "nanosleep", "230": "clock_nanosleep", "0": "read", "1": "write"}


@dataclass
class SideEvidence:
    role: str
    pid: int
    comm: str
    window_s: float
    busiest_tid: int | None = None
    busiest_thread: str | None = None
    busiest_on_cpu: float = 0.0  # share of wall time
    busiest_runqueue: float = 0.0
    busiest_blocked: float = 0.0
    blocked_in: dict[str, float] = field(default_factory=dict)  # syscall -> share of readings while blocked
    process_cpu_cores: float = 0.0
    process_runqueue_cores: float = 0.0
    capacity_cores: float = 0.0
    quota_cores: float | None = None
    throttled_periods: float | None = None
    throttled_s: float | None = None
    cpus: list[int] = field(default_factory=list)
    numa_nodes: list[int] = field(default_factory=list)  # of those CPUs
    cpu_changes: int = 0  # migrations of the busiest thread seen between readings
    drops: int = 0
    goodput_gbps: float | None = None
    cpu_limited: bool = False
    reasons: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        for k, v in d.items():
            if isinstance(v, float):
                d[k] = round(v, 4)
        d["blocked_in"] = {k: round(v, 3) for k, v in self.blocked_in.items()}
        return d


@dataclass
class Verdict:
    limited_by: str  # server-limited | client-limited | both | neither
    summary: str
    sides: list[SideEvidence]
    thresholds: dict[str, float]
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"limited_by": self.limited_by, "summary": self.summary,
                "evidence": {s.role: s.to_json() for s in self.sides},
                "thresholds": self.thresholds, "notes": self.notes}


def _window(readings: list[dict[str, Any]], pid: int) -> list[dict[str, Any]]:
    key = str(pid)
    return [r for r in readings if r.get("threads", {}).get(key)]


def side_evidence(readings: list[dict[str, Any]], pid: int, role: str, comm: str, host_cpus: int,
                  pio: PacketIO | None, cpu_nodes: dict[str, int] | None = None,
                  tcp_bytes: tuple[int, int] | None = None) -> SideEvidence | None:
    rs = _window(readings, pid)
    if len(rs) < 2:
        return None
    first, last = rs[0], rs[-1]
    wall = float(last["mono"]) - float(first["mono"])
    ev = SideEvidence(role, pid, comm, wall)
    if wall < MIN_WINDOW_S:
        return ev
    key = str(pid)
    # per thread: first and last reading in which it appears
    seen_first: dict[int, dict[str, Any]] = {}
    seen_last: dict[int, dict[str, Any]] = {}
    for r in rs:
        for t in r["threads"][key]:
            seen_first.setdefault(t["tid"], t)
            seen_last[t["tid"]] = t
    best = None
    for tid, t1 in seen_last.items():
        t0 = seen_first[tid]
        if t1.get("on_cpu_s") is None or t0.get("on_cpu_s") is None:
            continue
        on = (t1["on_cpu_s"] - t0["on_cpu_s"]) / wall
        rq = ((t1.get("run_delay_s") or 0) - (t0.get("run_delay_s") or 0)) / wall
        ev.process_cpu_cores += on
        ev.process_runqueue_cores += rq
        if best is None or on + rq > best[1] + best[2]:
            best = (tid, on, rq, t1["comm"])
    if best is not None:
        ev.busiest_tid, ev.busiest_on_cpu, ev.busiest_runqueue, ev.busiest_thread = best[0], best[1], best[2], best[3]
        ev.busiest_blocked = max(0.0, 1.0 - best[1] - best[2])
        states = [next((t for t in r["threads"][key] if t["tid"] == best[0]), None) for r in rs]
        states = [t for t in states if t is not None]
        blocked = [t.get("syscall") for t in states if t.get("state") in ("S", "D")]
        for sc in blocked:
            name = WAIT_SYSCALLS.get(str(sc)) or OTHER_SYSCALLS.get(str(sc)) or f"syscall {sc}"
            ev.blocked_in[name] = ev.blocked_in.get(name, 0.0) + 1 / len(blocked)
        cpus = [t["cpu"] for t in states if t.get("cpu", -1) >= 0]
        ev.cpus = sorted(set(cpus))
        ev.numa_nodes = sorted({(cpu_nodes or {}).get(str(c), 0) for c in ev.cpus})
        ev.cpu_changes = sum(1 for a, b in zip(cpus, cpus[1:]) if a != b)
    # An exiting process leaves its cgroup (v1 moves it to the root; a zombie shows none):
    # judge by the cgroup it lived in for most readings, first to last reading in it.
    cgs = [r["cgroups"][key] for r in rs if (r.get("cgroups") or {}).get(key)]
    if cgs:
        paths = [c.get("path") for c in cgs]
        home = max(set(paths), key=paths.count)
        cgs = [c for c in cgs if c.get("path") == home]
    cg0, cg1 = (cgs[0], cgs[-1]) if cgs else (None, None)
    ev.capacity_cores = float(host_cpus)
    if cg1 and cg1.get("quota_cores"):
        ev.quota_cores = cg1["quota_cores"]
        ev.capacity_cores = min(ev.capacity_cores, cg1["quota_cores"])
        if cg0:
            periods = cg1["nr_periods"] - cg0["nr_periods"]
            ev.throttled_periods = (cg1["nr_throttled"] - cg0["nr_throttled"]) / periods if periods > 0 else 0.0
            ev.throttled_s = cg1["throttled_s"] - cg0["throttled_s"]
    moved = [max(tcp_bytes)] if tcp_bytes else []  # (sent, received) through TCP sockets
    if pio is not None and pid in pio.processes:
        p = pio.processes[pid]
        ev.drops = sum(p.drops.values())
        moved.append(max(p.rx.bytes, p.tx.bytes))
    if moved and max(moved):
        ev.goodput_gbps = max(moved) * 8 / wall / 1e9
    _judge(ev)
    return ev


def _judge(ev: SideEvidence) -> None:
    th = THRESHOLDS
    busy = ev.busiest_on_cpu + ev.busiest_runqueue
    if busy >= th["busiest_thread_demand"]:
        ev.reasons.append(f"busiest thread {ev.busiest_thread} ({ev.busiest_tid}) on a CPU {ev.busiest_on_cpu:.0%} "
                          f"+ waiting for one {ev.busiest_runqueue:.0%} of the time "
                          f">= {th['busiest_thread_demand']:.0%}")
    demand = ev.process_cpu_cores + ev.process_runqueue_cores
    if ev.capacity_cores and demand / ev.capacity_cores >= th["process_demand_of_capacity"]:
        cap = f"its cgroup quota of {ev.quota_cores:.2f} cores" if ev.quota_cores == ev.capacity_cores \
            else f"{ev.capacity_cores:.0f} CPUs"
        ev.reasons.append(f"process wants {demand:.2f} cores of {cap} "
                          f">= {th['process_demand_of_capacity']:.0%}")
    if ev.throttled_periods is not None and ev.throttled_periods >= th["throttled_periods"]:
        ev.reasons.append(f"cgroup throttled in {ev.throttled_periods:.0%} of CPU periods "
                          f"({ev.throttled_s:.2f} s) >= {th['throttled_periods']:.0%}")
    ev.cpu_limited = bool(ev.reasons)


def _describe(ev: SideEvidence) -> str:
    waits = ", ".join(f"{k} {v:.0%}" for k, v in sorted(ev.blocked_in.items(), key=lambda kv: -kv[1])[:2])
    s = (f"{ev.role} {ev.comm} ({ev.pid}): busiest thread on-CPU {ev.busiest_on_cpu:.0%}, run-queue "
         f"{ev.busiest_runqueue:.0%}, blocked {ev.busiest_blocked:.0%}" + (f" (in {waits})" if waits else "")
         + f"; process {ev.process_cpu_cores:.2f} cores")
    if ev.quota_cores:
        s += f" of a {ev.quota_cores:.2f}-core quota"
    return s


def judge(sides: Iterable[SideEvidence]) -> Verdict:
    """Combine the sides' evidence into one of the four verdicts."""
    sides = list(sides)
    by_role = {s.role: s for s in sides}
    notes = []
    for s in sides:
        if s.window_s < MIN_WINDOW_S:
            notes.append(f"{s.role}: window {s.window_s:.2f} s is too short to judge its CPU")
    srv, cli = by_role.get("server"), by_role.get("client")
    s_lim = bool(srv and srv.cpu_limited)
    c_lim = bool(cli and cli.cpu_limited)
    limited = {(True, False): "server-limited", (False, True): "client-limited",
               (True, True): "both", (False, False): "neither"}[(s_lim, c_lim)]
    if srv is None or cli is None:
        notes.append("only one side was measured: the other side's CPU is unknown")
    if limited == "neither":
        summary = ("no side is CPU-bound: the network, congestion control or flow control limits the run")
    else:
        culprits = [s for s in sides if s.cpu_limited]
        summary = "; ".join(f"{s.role} is CPU-bound: {s.reasons[0]}" for s in culprits)
    drops = [s for s in sides if s.drops]
    if drops:
        notes.append("receive-buffer drops: " + ", ".join(f"{s.role} {s.drops}" for s in drops))
    notes += [_describe(s) for s in sides]
    return Verdict(limited, summary, sides, dict(THRESHOLDS), notes)
