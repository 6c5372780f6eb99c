"""Who limits the run, and why: the server, the client, both, or neither, with the cause named.

Only what qprof measured on the targets decides, never how a test set them up.
Per side, over its own window (two archives from two hosts need no clock sync):

- CPU, from schedstat per thread (ns on a CPU, ns runnable but waiting for
  one) summed over the process, against its capacity: the CPUs its affinity
  and its cpuset both allow, capped by its cgroup quota. `cpu-busy`: on a CPU
  most of what it may use, or one thread on a CPU nearly all the time (most
  QUIC stacks do their work in one thread), or wanting a CPU (on one or
  stalled) all the time. `cpu-starved`: its cgroup throttled, or stalled for a
  CPU (wanting one with none of its threads running) for long, relative to
  the CPU time it got, while the CPUs it may use were busy nearly all the
  time (a side that stalls while they sit idle for longer meets the
  scheduler's latency, a busy neighbour finishing its slice, not a lack of
  CPU: a paced sender keeps its rate through it). Stalls are the CPU pressure "full" (PSI) of a cgroup
  holding only this process, or, for a single thread, its run-queue time. The
  run-queue times of a process's threads are not summed into a stall: threads
  of one process (Go's, tokio's) also wait for each other, which is no limit
  from outside. A multi-threaded process in a shared cgroup has no stall figure.
- `receive-buffer`: datagrams dropped at its sockets for lack of buffer
  (SOCKET_RCVBUFF and kin, counted exactly by the probes) as a share of those
  that arrived, at a side not CPU-limited itself (a CPU-limited receiver's
  drops are its CPU's symptom).
- `link`: a queue on the way out of a side's namespace held back or dropped
  the run's packets (tc qdisc overlimits, drops and requeues per packet).
- When nothing above is found, what the threads did off the CPU (the `waits`
  probes, attribution.waits) names what binds:
  `scheduling`: a multi-threaded side's working threads spent a large share
  of their wall time runnable after a wakeup or waiting for each other while
  the CPUs they may use were busy: they queue for CPUs (a runtime's threads
  and the other endpoint's); binding each endpoint to CPUs of its own raises
  goodput. `handoffs`: the same waits while those CPUs sat idle a good part
  of the time: the threads wait to be woken by one another, and binding them
  to fewer CPUs serialises the handoffs (docs/measurements.md);
  `path/flow-control`: the sender's busiest thread (its pool) waited mostly for the
  network, for its peer's packets (acknowledgements or credit): the path's
  round-trip time and loss through congestion control, or the receiver's
  flow control; the stack's qlog, where it writes one, tells them apart
  (`path`, `flow-control`);
  `application`: the sender's busiest thread waited mostly on a timer or on
  its own input (a paced or idle application; a pacer's timers look alike,
  the qlog tells congestion control's pacing apart as `path`).
  Without the waits probes (older archives, `--probes none`):
  `flow-control/application`, one label for all of these.

When findings of several kinds are met, the one that binds is named and the
others are noted: a queue that filled on the way out means the sender
produced faster than the link carried (`link`, whatever a side's CPU did);
a receiver losing a large share of its datagrams holds a loss-based sender
far below what its CPU allows (`receive-buffer`); then the CPU-limited sides.

Every criterion is a named threshold (THRESHOLDS); each side's findings carry
the value, the threshold and whether it was met, and the report prints them.
Where the stack recorded why its sender waited (qlog, attribution.qlog),
its split of the sender's time is put beside the verdict with whether it agrees.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Iterable

from qprof.attribution.causes import Cause
from qprof.attribution.packetio import PacketIO
from qprof.attribution.qlog import SenderRecord, StackWord, agreement, sender
from qprof.attribution.threads import ThreadView, busiest, window
from qprof.attribution.transfer import MIN_WINDOW_S, Transfer, working
from qprof.attribution.waits import ON_CPU, RUNNABLE, WallClock, WallSplit
from qprof.archive.model import NamespaceQueues, Pressure, ProcReading
from qprof.jsonvalue import JsonObject

THRESHOLDS: dict[str, float] = {
    "thread_on_cpu": 0.90,  # cpu-busy: the busiest thread on a CPU this share of wall time
    "on_cpu_of_capacity": 0.90,  # cpu-busy: the process's on-CPU cores / its capacity
    "demand_of_capacity": 0.90,  # CPU-limited: (on-CPU + stalled) / capacity; or one thread runnable
    "stalled": 0.15,  # cpu-starved: share of wall time it wanted a CPU and none of its threads ran ...
    # ... and that stall / (stall + on-CPU cores) (a single thread: waiting / runnable). Measured 2026-11-26 on
    # every verdict-matrix cell: sides starved by one busy process on their CPUs 0.41-0.64, by a quota
    # 0.85-0.98, sides not starved (uncapped) <= 0.28 on a quiet host; midway, below the busy-host runs' spread
    "stall_ratio": 0.33,
    "cpus_busy": 0.90,  # ... while the CPUs it may use were busy (not idle) this share of the time
    "throttled_periods": 0.25,  # cpu-starved: share of CFS periods in which its cgroup was throttled
    "receive_drop_share": 0.02,  # receive-buffer: dropped at its sockets / (received + dropped)
    "drops_over_starved": 0.10,  # ... binding over a sender starved of CPU only at this share (else its bursts)
    "queue_share": 0.01,  # link: (overlimits + drops + requeues) / packets on its namespace's qdiscs
    # scheduling: its working threads' wall time runnable or waiting for another of its threads (waits probes)
    "scheduling_wait": 0.30,
    # handoffs, not scheduling: the CPUs it may use sat idle this share of the time while its threads waited:
    # they waited to be woken by one another, not for a CPU (binding each process to CPUs of its own lowered
    # goodput), where busy CPUs mean its threads and the host's other work queue for them (binding raised it).
    # Measured 2026-11-27 on the uncapped multi-threaded runs, 10 each, against the same runs pinned: idle
    # quic-go 12-15% (pinning +52%), quinn-mt 8-10% (+21%), s2nquic-mt 20-25% (-21%); midway
    "handoffs_cpus_idle": 0.17,
}
WORKING_ON_CPU = 0.10  # a thread on a CPU at least this share of its window does the side's work


@dataclass(frozen=True)
class CheckGroup:
    """Checks that name a cause together, as _judge combines them: `any` one met, or `all` of them."""

    cause: Cause
    combine: str  # "any" or "all"
    thresholds: tuple[str, ...]


# How a side's findings combine into its cause (the report shows them grouped so). A finding belongs to
# the group of its own cause that lists its threshold: demand_of_capacity counts for cpu-starved when the
# side stalled more than it ran, else for cpu-busy.
CHECK_GROUPS = (
    CheckGroup(Cause.CPU_BUSY, "any", ("thread_on_cpu", "on_cpu_of_capacity", "demand_of_capacity")),
    CheckGroup(Cause.CPU_STARVED, "all", ("stalled", "stall_ratio", "cpus_busy")),
    CheckGroup(Cause.CPU_STARVED, "any", ("throttled_periods", "demand_of_capacity")),
    CheckGroup(Cause.RECEIVE_BUFFER, "any", ("receive_drop_share",)),
    CheckGroup(Cause.LINK, "any", ("queue_share",)),
    CheckGroup(Cause.SCHEDULING, "all", ("scheduling_wait",)),
    CheckGroup(Cause.HANDOFFS, "all", ("scheduling_wait", "handoffs_cpus_idle")),
)
FINDING_PLACES = 4  # decimals a finding's value is reported and judged with
CAUSES = tuple(Cause)
# A side that moved less than this (UDP or TCP payload, the larger direction) over its window is not
# judged: what limits a transfer cannot be read off a process that made none (a busy `yes` is not a
# CPU-limited server). ~200 full datagrams; the lab's smallest transfer (a lossy 50 ms path) is 1 MiB.
MIN_TRAFFIC_BYTES = 256_000
# what the sender's busiest thread waiting mostly on each kind says binds, when no CPU, buffer or queue does
UNBOUND_BY_WAIT = {"network": Cause.PATH_OR_FLOW_CONTROL, "timer": Cause.APPLICATION, "thread": Cause.APPLICATION,
                   "disk": Cause.APPLICATION, "other": Cause.APPLICATION}
# what an application-limited sender waited for, by the kind of wait (the other unbound causes say theirs: About)
APPLICATION_WAITS = {"timer": "a timer: it paces itself or has nothing to send until then (a congestion "
                              "controller's pacer looks the same; the stack's qlog tells them apart)",
                     "thread": "another of its own threads: its own input (the application producing data)",
                     "disk": "the disk: the application reading what it sends"}
# kernel drop reasons (skb_drop_reason) meaning the socket had no room
RECEIVE_BUFFER_REASONS = {"SOCKET_RCVBUFF", "SOCKET_BACKLOG", "PROTO_MEM"}
# x86_64 system calls a thread sits in while it waits for packets
WAIT_SYSCALLS = {"232": "epoll_wait", "281": "epoll_pwait", "441": "epoll_pwait2", "7": "poll",
                 "271": "ppoll", "23": "select", "270": "pselect6", "45": "recvfrom", "47": "recvmsg",
                 "299": "recvmmsg", "426": "io_uring_enter"}
OTHER_SYSCALLS = {"202": "futex", "35": "nanosleep", "230": "clock_nanosleep", "0": "read", "1": "write"}


@dataclass
class Finding:
    """One measured fact against its threshold: what decided (or did not decide) a cause."""

    cause: Cause
    threshold: str  # a key of THRESHOLDS
    value: float
    met: bool
    text: str

    def to_json(self) -> JsonObject:
        return {"cause": self.cause, "threshold": self.threshold, "limit": THRESHOLDS[self.threshold],
                "value": round(self.value, FINDING_PLACES), "met": self.met, "text": self.text}


@dataclass
class SideEvidence:
    role: str
    pid: int
    comm: str
    window_s: float
    window_from: str = ""  # which readings: its transfer's, or all of its
    busiest_tid: int | None = None
    busiest_thread: str | None = None
    busiest_on_cpu: float = 0.0  # share of wall time
    busiest_runqueue: float = 0.0
    busiest_blocked: float = 0.0
    blocked_in: dict[str, float] = field(default_factory=dict)  # syscall -> share of readings while blocked
    threads: int = 0
    process_cpu_cores: float = 0.0
    process_runqueue_cores: float = 0.0  # summed over threads: counts threads waiting for each other too
    stalled: float | None = None  # share of wall time it wanted a CPU and none of its threads ran
    stalled_from: str = ""  # PSI "full" of its own cgroup, or its one thread's run-queue time
    stall_ratio: float | None = None  # stalled / (stalled + on-CPU cores)
    usable_cpus: list[int] = field(default_factory=list)  # allowed by both its affinity and its cpuset
    cpus_busy: float | None = None  # share of the time those CPUs were not idle (/proc/stat)
    capacity_cores: float = 0.0
    capacity_from: str = ""  # what set the capacity: host, affinity, cpuset, quota
    cpus_allowed: list[int] | None = None  # affinity
    cpuset: list[int] | None = None
    quota_cores: float | None = None
    throttled_periods: float | None = None
    throttled_s: float | None = None
    pressure_some: float | None = None  # PSI of its own cgroup: share of time some thread waited for a CPU
    pressure_full: float | None = None  # ... and every runnable thread waited
    host_pressure_some: float | None = None  # the host's (/proc/pressure/cpu)
    busiest_pool: str | None = None  # the pool of threads it belongs to (attribution.threads)
    binds: str | None = None  # which thread or pool binds, when the side is CPU-limited
    cores_peak: float | None = None  # most cores on a CPU in one /proc interval
    runtime: dict[str, float] = field(default_factory=dict)  # the runtime's own work: subcategory -> share
    handoff_cpu_s_per_gb: float | None = None  # CPU moving work between its own threads, per GB moved
    wakeups_per_datagram: float | None = None  # voluntary switches (sleeps ended by a wakeup) per datagram
    cpus: list[int] = field(default_factory=list)  # CPUs the busiest thread was seen on
    numa_nodes: list[int] = field(default_factory=list)  # of those CPUs
    cpu_changes: int = 0  # migrations of the busiest thread seen between readings
    drops: int = 0  # all drops at its ports
    drop_reasons: dict[str, int] = field(default_factory=dict)
    receive_drops: int = 0  # for lack of socket buffer
    received_datagrams: float | None = None
    receive_drop_share: float | None = None
    queue_packets: int | None = None  # on its namespace's qdiscs (not lo) over the run
    queue_events: int | None = None  # overlimits + drops + requeues there
    queue_share: float | None = None
    goodput_gbps: float | None = None
    sends: bool | None = None  # the larger direction it moved was sent: the transfer's sender
    # wall clock (waits probes): its busiest thread's state -> share of its window, and its working threads'
    wall_busiest: dict[str, float] | None = None
    wall_working: dict[str, float] | None = None
    working_threads: int = 0  # threads on a CPU >= WORKING_ON_CPU of their window
    waited_for: str | None = None  # what its busiest thread (its pool, when several) waited for from outside
    scheduling_wait: float | None = None  # working threads' runnable + thread-wait share of their wall time
    round_trip_ms: float | None = None  # the path's round trip its own datagrams' timing shows (attribution.rtt)
    no_traffic: str | None = None  # what it lacked when it moved too little to be judged (then never limiting)
    service: str | None = None  # a followed service judged as one side (service_evidence): its cgroup
    members: list[int] = field(default_factory=list)  # ... and the processes it sums
    set_aside: str | None = None  # why a cause its checks met is not the verdict's (another limit binds)
    cause: Cause | None = None  # what limits this side, or None
    cpu_limited: bool = False
    findings: list[Finding] = field(default_factory=list)

    @property
    def reasons(self) -> list[str]:
        """The findings that decided its cause."""
        return [f.text for f in self.findings if f.met and f.cause == self.cause]

    def groups(self) -> list[tuple[CheckGroup, list[Finding], bool]]:
        """Its findings as the checks combine: each group tested, its findings and whether it was met."""
        out = []
        for g in CHECK_GROUPS:
            # the threads' waits belong to handoffs whatever their label (scheduling unless the CPUs sat
            # idle); relabelled handoffs, they leave the scheduling group empty
            fs = [f for f in self.findings if f.threshold in g.thresholds and
                  (f.cause == g.cause or g.cause == Cause.HANDOFFS and f.threshold == "scheduling_wait")]
            if g.cause == Cause.HANDOFFS and not any(f.threshold == "handoffs_cpus_idle" for f in fs):
                continue  # idle CPUs not measured, or the waits too short to ask
            if fs:
                met = any(f.met for f in fs) if g.combine == "any" else all(f.met for f in fs)
                out.append((g, fs, met))
        return out

    def not_its_cause(self, group: CheckGroup) -> str | None:
        """Why a group its checks met is not its cause (None when it is): a ticked group under a side
        judged otherwise always says why."""
        if group.cause == self.cause:
            return None
        return self.set_aside or group.cause.about.second_to

    def rounded(self) -> SideEvidence:
        """Its figures as every report shows them: 4 places, the blocked-in shares 3."""
        out = replace(self, blocked_in={k: round(v, 3) for k, v in self.blocked_in.items()})
        for f in fields(self):
            if isinstance(v := getattr(self, f.name), float):
                setattr(out, f.name, round(v, FINDING_PLACES))
        return out

    def to_json(self) -> JsonObject:
        d = asdict(self.rounded())
        d["findings"] = [f.to_json() for f in self.findings]
        d["reasons"] = self.reasons
        d["groups"] = [{"cause": g.cause, "combine": g.combine, "thresholds": [f.threshold for f in fs], "met": met,
                        "not_its_cause": self.not_its_cause(g) if met else None} for g, fs, met in self.groups()]
        return d


@dataclass
class Verdict:
    limited_by: str  # server-limited | client-limited | both | neither
    causes: tuple[Cause, ...]  # one, or two when both sides limit for different reasons (sorted)
    summary: str
    sides: list[SideEvidence]
    thresholds: dict[str, float]
    notes: list[str] = field(default_factory=list)
    stack_record: StackWord | None = None  # the stack's own word (qlog) and whether it agrees

    @property
    def cause(self) -> str:
        """The causes as reports show them: two joined by "+"."""
        return "+".join(self.causes)

    @property
    def cpu_limited(self) -> bool:
        """A CPU binds the run (the table's overall cpu_limited)."""
        return any(c.about.cpu for c in self.causes)

    def to_json(self) -> JsonObject:
        return {"limited_by": self.limited_by, "cause": self.cause, "summary": self.summary,
                "evidence": {_evidence_key(s, self.sides): s.to_json() for s in self.sides},
                "thresholds": self.thresholds, "notes": self.notes,
                "stack_record": None if self.stack_record is None else self.stack_record.to_json()}


def _evidence_key(s: SideEvidence, sides: list[SideEvidence]) -> str:
    """Its key in the JSON evidence: the role where one side holds it, else the role and the process (or
    the service) apart."""
    if s.service is not None:
        return f"{s.role} service {s.service}"
    return s.role if sum(o.role == s.role and o.service is None for o in sides) == 1 else f"{s.role} {s.pid}"


def _mode(values: list[Any]) -> Any:
    keyed = Counter(repr(v) for v in values)
    return next(v for v in values if repr(v) == keyed.most_common(1)[0][0]) if values else None


def side_evidence(readings: list[ProcReading], pid: int, role: str, comm: str, host_cpus: int,
                  pio: PacketIO | None, cpu_nodes: dict[int, int] | None = None,
                  qdiscs: dict[str, NamespaceQueues] | None = None, moved: Transfer | None = None,
                  threads: ThreadView | None = None, clock: WallClock | None = None) -> SideEvidence | None:
    """The measured facts of one side over its window, judged (its cause, if it limits).
    `moved`: its transfer (attribution.transfer): its goodput, and the span its window keeps to;
    `threads`: its thread view (pools, the runtime's work, handoffs), which names the pool that binds;
    `clock`: its threads' wall clock (attribution.waits), what it waited for when no CPU binds."""
    rs, ev_from = working(readings, pid, moved)
    if len(rs) < 2:
        return None
    first, last = rs[0], rs[-1]
    wall = last.mono - first.mono
    ev = SideEvidence(role, pid, comm, wall, window_from=ev_from)
    if wall < MIN_WINDOW_S:
        return ev
    _cpu(ev, rs, pid, wall, cpu_nodes)
    _capacity(ev, rs, pid, host_cpus, wall)
    _network(ev, pid, pio, qdiscs or {})
    if moved is not None:
        ev.goodput_gbps = moved.gbps
        ev.sends = None if moved.direction is None else moved.direction == "sent"
    if pio is not None and moved is not None:  # UDP counted (TCP always is): too little is known, not guessed
        n = moved.bytes or 0
        if n < MIN_TRAFFIC_BYTES:
            ev.no_traffic = ("sent and received no UDP datagram and no TCP payload" if not n else
                             f"moved {n / 1e3:,.1f} kB of {moved.protocol} payload, under the "
                             f"{MIN_TRAFFIC_BYTES / 1e3:g} kB a verdict needs")
            return ev  # described, not judged
    if threads is not None:
        _threads(ev, threads)
    if clock is not None:
        monitors = {r.stat.tid for p in threads.pools if not p.works for r in p.threads} if threads else set()
        _wall(ev, clock, monitors)
    _judge(ev)
    if ev.cpu_limited:
        ev.binds = _binds(ev, threads)
    return ev


def _threads(ev: SideEvidence, view: ThreadView) -> None:
    """What the thread view adds: the busiest thread's pool, parallelism, runtime work, handoffs."""
    pool = view.pool_of(ev.busiest_tid) if ev.busiest_tid is not None else None
    ev.busiest_pool = pool.name if pool is not None else None
    ev.cores_peak = view.cores_peak
    ev.runtime = dict(view.runtime)
    ev.handoff_cpu_s_per_gb = view.handoffs.cpu_s_per_gb
    ev.wakeups_per_datagram = view.handoffs.wakeups_per_datagram


def _wall(ev: SideEvidence, wall: WallClock, monitors: set[int]) -> None:
    """What its threads did off the CPU: the busiest thread's split (the one schedstat names, as
    everywhere), and its working threads' together. `monitors`: threads of a runtime's monitor (Go's
    sysmon), never working threads: they run none of the program's work, and their sleeps are their own
    polling (a paced quic-go server's sysmon was its busiest thread, 13% on a CPU; counted as working
    beside an M at 10%, the two read as threads waiting for one another: `handoffs`, CI 2026-11-29)."""
    th = wall.thread(ev.busiest_tid) if ev.busiest_tid is not None else None
    th = th or (wall.threads[0] if wall.threads else None)
    if th is None:
        return
    ev.wall_busiest = {k: th.split.share(k) for k in th.split.seconds}
    pool = wall.pool_of(th.tid)
    ev.waited_for = (pool.split if pool is not None and len(pool.threads) > 1 else th.split).waited_for
    if ev.busiest_pool is None and pool is not None:
        ev.busiest_pool = pool.name
    working = [t.split for t in wall.threads
               if t.split.share(ON_CPU) >= WORKING_ON_CPU and t.tid not in monitors]
    ev.working_threads = len(working)
    if working:
        w = WallSplit.total(working)
        ev.wall_working = {k: w.share(k) for k in w.seconds}
        ev.scheduling_wait = w.share(RUNNABLE) + w.share("thread")


def _binds(ev: SideEvidence, view: ThreadView | None) -> str:
    """Which of a CPU-limited side's threads bind: the busiest when it alone is on a CPU nearly all the
    time, else its threads together (the pool that used the most CPU) against what it may use."""
    thread = f"thread {ev.busiest_thread} ({ev.busiest_tid})" + (f" of {ev.busiest_pool}" if ev.busiest_pool else "")
    if any(f.met and f.threshold == "thread_on_cpu" for f in ev.findings):
        return f"{thread}, on a CPU {ev.busiest_on_cpu:.0%} of the time"
    top = view.pools[0] if view is not None and view.pools else None
    pool = f"{top.name} ({len(top.threads)} thread{'s' if len(top.threads) != 1 else ''})" if top else "its threads"
    if ev.cause == Cause.CPU_STARVED:
        return f"{pool} waiting for CPUs other tasks held ({ev.capacity_from})"
    return f"{pool} together, {ev.process_cpu_cores:.2f} cores of {ev.capacity_cores:.2f} ({ev.capacity_from})"


def _cpu(ev: SideEvidence, rs: list[ProcReading], pid: int, wall: float, cpu_nodes: dict[int, int] | None) -> None:
    """schedstat per thread (first and last reading it appears in), summed over the process; the
    busiest thread is the one with the most on-CPU time (attribution.threads.busiest), as everywhere."""
    w = window(rs, pid)
    for t in w.threads:
        if t.on_cpu_s is None:
            continue
        ev.threads += 1
        ev.process_cpu_cores += t.on_cpu_s / wall
        ev.process_runqueue_cores += (t.run_delay_s or 0.0) / wall
    best = busiest(w)
    if best is None:
        return
    ev.busiest_tid, ev.busiest_thread = best.tid, best.comm
    ev.busiest_on_cpu, ev.busiest_runqueue = (best.on_cpu_s or 0.0) / wall, (best.run_delay_s or 0.0) / wall
    ev.busiest_blocked = max(0.0, 1.0 - ev.busiest_on_cpu - ev.busiest_runqueue)
    found = [next((t for t in r.threads[pid] if t.tid == best.tid), None) for r in rs]
    states = [t for t in found if t is not None]
    blocked = [t.syscall for t in states if t.state in ("S", "D")]
    for sc in blocked:
        name = WAIT_SYSCALLS.get(str(sc)) or OTHER_SYSCALLS.get(str(sc)) or f"syscall {sc}"
        ev.blocked_in[name] = ev.blocked_in.get(name, 0.0) + 1 / len(blocked)
    cpus = [t.cpu for t in states if t.cpu >= 0]
    ev.cpus = sorted(set(cpus))
    ev.numa_nodes = sorted({(cpu_nodes or {}).get(c, 0) for c in ev.cpus})
    ev.cpu_changes = sum(1 for a, b in zip(cpus, cpus[1:]) if a != b)


def _share(a: Pressure | None, b: Pressure | None, wall: float, full: bool = False) -> float | None:
    x, y = (a.full_s, b.full_s) if a and b and full else (a.some_s, b.some_s) if a and b else (None, None)
    return None if x is None or y is None else max(0.0, (y - x) / wall)


def _busy(idle0: dict[int, float], idle1: dict[int, float], cpus: set[int], wall: float) -> float | None:
    """Share of `wall` the CPUs in `cpus` were not idle (idle + iowait seconds from /proc/stat),
    or None when a reading lacks one of them."""
    if not cpus or wall <= 0 or any(c not in idle0 or c not in idle1 for c in cpus):
        return None
    idle = sum(max(0.0, idle1[c] - idle0[c]) for c in cpus)
    return min(1.0, max(0.0, 1.0 - idle / (wall * len(cpus))))


def _capacity(ev: SideEvidence, rs: list[ProcReading], pid: int, host_cpus: int, wall: float) -> None:
    """What the process may use: CPUs allowed by both its affinity and its cpuset, capped by its quota;
    throttling and CPU pressure of its cgroup."""
    # An exiting process leaves its cgroup (v1 moves it to the root; a zombie shows none):
    # judge by the cgroup it lived in for most readings, first to last reading in it.
    cgs = [r.cgroups[pid] for r in rs if pid in r.cgroups]
    if cgs:
        paths = [c.path for c in cgs]
        home = max(set(paths), key=paths.count)
        cgs = [c for c in cgs if c.path == home]
    cg0, cg1 = (cgs[0], cgs[-1]) if cgs else (None, None)
    lims = [r.limits[pid] for r in rs if pid in r.limits]
    ev.cpus_allowed = _mode([lim.cpus_allowed for lim in lims if lim.cpus_allowed])
    ev.cpuset = _mode([lim.cpuset for lim in lims if lim.cpuset])
    usable = set(range(host_cpus))
    ev.capacity_from = f"the host's {host_cpus} CPUs"
    for name, cpus in (("affinity", ev.cpus_allowed), ("cpuset", ev.cpuset)):
        if cpus and set(cpus) & usable != usable:
            usable &= set(cpus)
            ev.capacity_from = f"its {name} (CPU {','.join(map(str, sorted(usable)))})"
    ev.capacity_cores = float(max(1, len(usable)))
    ev.usable_cpus = sorted(usable)
    if cg1 and cg1.quota_cores:
        ev.quota_cores = cg1.quota_cores
        if ev.quota_cores < ev.capacity_cores:
            ev.capacity_cores = ev.quota_cores
            ev.capacity_from = f"its cgroup quota of {ev.quota_cores:.2f} cores"
    if cg0 and cg1:
        periods = cg1.nr_periods - cg0.nr_periods
        if periods > 0:
            ev.throttled_periods = (cg1.nr_throttled - cg0.nr_throttled) / periods
            ev.throttled_s = cg1.throttled_s - cg0.throttled_s
    # a cgroup's pressure speaks for this side only when the side is alone in it
    own = [(r.mono, r.limits[pid].pressure) for r in rs
           if pid in r.limits and r.limits[pid].pressure and r.limits[pid].pressure_procs == 1]
    if len(own) >= 2 and own[-1][0] - own[0][0] >= MIN_WINDOW_S:
        span = own[-1][0] - own[0][0]
        a, b = own[0][1], own[-1][1]
        ev.pressure_some, ev.pressure_full = _share(a, b, span), _share(a, b, span, full=True)
    ev.host_pressure_some = _share(rs[0].pressure, rs[-1].pressure, wall)
    ev.cpus_busy = _busy(rs[0].cpu_idle, rs[-1].cpu_idle, usable, wall)
    # Stalled: wanted a CPU with none of its threads running. PSI "full" of a cgroup holding only this
    # process says it; for one thread it is that thread's run-queue time. Threads of one process also
    # wait for each other, so their summed run-queue time cannot say it.
    if ev.pressure_full is not None:
        ev.stalled, ev.stalled_from = ev.pressure_full, "CPU pressure (PSI full) of its own cgroup"
    elif ev.threads == 1:
        ev.stalled, ev.stalled_from = ev.process_runqueue_cores, "its one thread's run-queue time"
    elif ev.threads > 1:
        ev.stalled = _estimated_stall(rs, pid, usable)
        if ev.stalled is not None:
            ev.stalled_from = (f"estimated from its threads' run-queue time while other tasks used its CPUs: "
                               f"no cgroup of its own for CPU pressure ({ESTIMATE_NOTE})")
    if ev.stalled is not None and ev.stalled + ev.process_cpu_cores > 0:
        ev.stall_ratio = ev.stalled / (ev.stalled + ev.process_cpu_cores)


def service_evidence(members: list[SideEvidence], service: str) -> SideEvidence | None:
    """A side made of many processes (a followed service's workers, attach --cgroup) judged as one, beside
    each of them: 4 workers each on a CPU half the time on a 2-CPU host are each far from a limit, the
    service holds both CPUs. Its CPU is its processes' summed on-CPU cores, its stall their summed stalls
    (each the time that process wanted a CPU and had none), against the CPUs any of them may use; its
    drops and goodput are their sums. Threads' waits for one another, and whether a process was starved,
    stay per process. None when fewer than two of them moved enough traffic to be judged."""
    judged = [m for m in members if m.no_traffic is None and m.window_s >= MIN_WINDOW_S]
    if len(judged) < 2:
        return None
    top = max(judged, key=lambda m: m.busiest_on_cpu)
    ev = SideEvidence(top.role, top.pid, f"service {service} ({len(judged)} processes)",
                      max(m.window_s for m in judged), "each process's own window", service=service,
                      members=[m.pid for m in judged])
    ev.busiest_tid, ev.busiest_thread = top.busiest_tid, top.busiest_thread
    ev.busiest_on_cpu, ev.busiest_runqueue, ev.busiest_blocked = (top.busiest_on_cpu, top.busiest_runqueue,
                                                                  top.busiest_blocked)
    ev.threads = sum(m.threads for m in judged)
    ev.process_cpu_cores = sum(m.process_cpu_cores for m in judged)
    ev.process_runqueue_cores = sum(m.process_runqueue_cores for m in judged)
    ev.usable_cpus = sorted({c for m in judged for c in m.usable_cpus})
    same = {(m.capacity_cores, m.capacity_from) for m in judged}
    if len(same) == 1:  # one cgroup, one cpuset, one quota: what each may use is what all may
        ev.capacity_cores, ev.capacity_from = same.pop()
    else:
        ev.capacity_cores = float(max(1, len(ev.usable_cpus)))
        ev.capacity_from = f"the CPUs its processes may use (CPU {','.join(map(str, ev.usable_cpus))})"
    stalls = [m.stalled for m in judged if m.stalled is not None]
    if len(stalls) == len(judged):
        # in cores (1.00: one process stalled all the time): what it wanted beyond what it got. The
        # stall tests of one process (a share of the time, and of its demand) have no sum: each
        # process is tested for them on its own
        ev.stalled, ev.stalled_from = sum(stalls), "its processes' stalls summed, in cores"
    longest = max(judged, key=lambda m: m.window_s)
    ev.cpus_busy, ev.host_pressure_some = longest.cpus_busy, longest.host_pressure_some
    throttled = [m for m in judged if m.throttled_periods is not None]
    if throttled:
        worst = max(throttled, key=lambda m: m.throttled_periods or 0.0)
        ev.throttled_periods, ev.throttled_s, ev.quota_cores = worst.throttled_periods, worst.throttled_s, worst.quota_cores
    ev.drops = sum(m.drops for m in judged)
    ev.receive_drops = sum(m.receive_drops for m in judged)
    received = [m.received_datagrams for m in judged if m.received_datagrams is not None]
    if received:
        ev.received_datagrams = sum(received)
        total = ev.received_datagrams + ev.receive_drops
        ev.receive_drop_share = ev.receive_drops / total if total > 0 else None
    rates = [m.goodput_gbps for m in judged if m.goodput_gbps is not None]
    ev.goodput_gbps = sum(rates) if rates else None
    ev.sends = any(m.sends for m in judged) if any(m.sends is not None for m in judged) else None
    _judge(ev)
    return ev


ESTIMATE_NOTE = "within 0.1 of PSI for one usable CPU, up to twice it for several, in runs of qprof's tests"


def _estimated_stall(rs: list[ProcReading], pid: int, usable: set[int]) -> float | None:
    """A multi-threaded process's stall when no cgroup of its own gives its CPU pressure: in each
    interval between readings, its threads' run-queue time, at most the time other tasks ran on the
    CPUs it may use (busy time, from /proc/stat, less its own CPU time: its threads cannot have waited
    behind others for longer), spread over as many of those CPUs as it had threads active. Compared
    with PSI "full" of its own cgroup on the same runs: close for one usable CPU, up to twice as high
    for two (threads waiting on both at once count once in PSI); quota throttling shows as idle CPUs
    and is missed (the throttling finding covers it). None without idle-time readings."""
    total = 0.0
    for a, b in zip(rs, rs[1:]):
        dt = b.mono - a.mono
        if dt <= 0 or any(c not in a.cpu_idle or c not in b.cpu_idle for c in usable):
            return None
        before = {t.tid: t for t in a.threads.get(pid, [])}
        waited = ran = 0.0
        active = 0
        for t in b.threads.get(pid, []):
            t0 = before.get(t.tid)
            if t0 is None or t.on_cpu_s is None or t0.on_cpu_s is None:
                continue
            on, rq = t.on_cpu_s - t0.on_cpu_s, (t.run_delay_s or 0.0) - (t0.run_delay_s or 0.0)
            ran += max(on, 0.0)
            waited += max(rq, 0.0)
            active += on + rq > 0
        busy = len(usable) * dt - sum(max(0.0, b.cpu_idle[c] - a.cpu_idle[c]) for c in usable)
        others = max(0.0, busy - ran)
        total += min(dt, min(waited, others) / max(1, min(len(usable), active)))
    span = rs[-1].mono - rs[0].mono
    return total / span if span > 0 else None


def _network(ev: SideEvidence, pid: int, pio: PacketIO | None, qdiscs: dict[str, NamespaceQueues]) -> None:
    """Drops at its ports by reason (exact, from the probes) and its namespace's queues."""
    if pio is not None and pid in pio.processes:
        p = pio.processes[pid]
        ev.drop_reasons = dict(p.drops)
        ev.drops = sum(p.drops.values())
        ev.receive_drops = sum(n for r, n in p.drops.items() if r in RECEIVE_BUFFER_REASONS)
        rx = p.estimates.get("rx.datagrams")
        ev.received_datagrams = rx.value if rx is not None else (float(p.rx.dgrams) if p.rx.dgrams else None)
        if ev.received_datagrams is not None and ev.received_datagrams + ev.receive_drops > 0:
            ev.receive_drop_share = ev.receive_drops / (ev.received_datagrams + ev.receive_drops)
    for ns in qdiscs.values():
        if pid not in ns.pids:
            continue
        first = {q.dev: q for q in ns.first}
        packets = events = 0
        for q in ns.last:
            q0 = first.get(q.dev)
            if q0 is None or q0.kind != q.kind:
                continue
            packets += q.packets - q0.packets
            events += (q.overlimits - q0.overlimits) + (q.drops - q0.drops) + (q.requeues - q0.requeues)
        ev.queue_packets, ev.queue_events = packets, events
        ev.queue_share = events / packets if packets > 0 else None


def _judge(ev: SideEvidence) -> None:
    """Test every criterion (kept as findings with their values) and name the side's cause."""
    th = THRESHOLDS
    cap = ev.capacity_cores or 1.0
    on = ev.process_cpu_cores
    t_on, t_rq = ev.busiest_on_cpu, ev.busiest_runqueue
    name = f"{ev.busiest_thread} ({ev.busiest_tid})"

    def add(cause: Cause, key: str, value: float, text: str) -> bool:
        # decided on the value as the report prints it (4 places): evidence never reads "0.4 >= 0.4, not met"
        value = round(value, FINDING_PLACES)
        met = value >= th[key]
        shown = f"{value:.0%}" == f"{th[key]:.0%}" and value != th[key]
        ev.findings.append(Finding(cause, key, value, met, f"{text}{f' ({value:.2%})' if shown else ''} "
                                                           f"{'>=' if met else '<'} {th[key]:.0%}"))
        return met

    busy = add(Cause.CPU_BUSY, "thread_on_cpu", t_on, f"busiest thread {name} on a CPU {t_on:.0%} of the time")
    busy |= add(Cause.CPU_BUSY, "on_cpu_of_capacity", on / cap,
                f"process on a CPU {on:.2f} cores of {cap:.2f} ({ev.capacity_from}) = {on / cap:.0%}")
    stalled = ev.stalled or 0.0
    full = max((on + stalled) / cap, t_on + t_rq)
    wanted = add(Cause.CPU_STARVED if stalled > on else Cause.CPU_BUSY, "demand_of_capacity", full,
                 f"wanting a CPU: on one or stalled {on + stalled:.2f} of {cap:.2f} cores, busiest thread "
                 f"runnable {t_on + t_rq:.0%} = {full:.0%}")
    starved = False
    if ev.stalled is not None and ev.stall_ratio is not None:  # all three tested: the report shows each
        starved = add(Cause.CPU_STARVED, "stalled", ev.stalled,
                      f"stalled for a CPU {ev.stalled:.0%} of the time ({ev.stalled_from})")
        starved &= add(Cause.CPU_STARVED, "stall_ratio", ev.stall_ratio,
                       f"stalled {ev.stall_ratio:.0%} as long as it ran and stalled together ({ev.stalled:.2f} "
                       f"stalled, {on:.2f} cores on a CPU)")
        if ev.cpus_busy is not None:  # readings before qprof recorded idle time: not known
            starved &= add(Cause.CPU_STARVED, "cpus_busy", ev.cpus_busy,
                           f"the CPUs it may use (CPU {','.join(map(str, ev.usable_cpus))}) busy "
                           f"{ev.cpus_busy:.0%} of the time")
    if ev.throttled_periods is not None:
        starved |= add(Cause.CPU_STARVED, "throttled_periods", ev.throttled_periods,
                       f"cgroup throttled in {ev.throttled_periods:.0%} of CPU periods ({ev.throttled_s or 0:.2f} s)")
    if ev.receive_drop_share is not None:
        add(Cause.RECEIVE_BUFFER, "receive_drop_share", ev.receive_drop_share,
            f"{ev.receive_drops} datagrams dropped at its sockets for lack of buffer, "
            f"{ev.receive_drop_share:.2%} of {(ev.received_datagrams or 0) + ev.receive_drops:.0f}")
    if ev.scheduling_wait is not None and ev.working_threads > 1 and ev.wall_working is not None:
        waiting = add(Cause.SCHEDULING, "scheduling_wait", ev.scheduling_wait,
                      f"its {ev.working_threads} working threads runnable {ev.wall_working[RUNNABLE]:.0%} and "
                      f"waiting for one another {ev.wall_working['thread']:.0%} of their wall time = "
                      f"{ev.scheduling_wait:.0%}")
        waits = ev.findings[-1]
        if waiting and ev.cpus_busy is not None:  # busy CPUs: they queue for them; idle: for each other's wakeups
            idle = 1.0 - ev.cpus_busy
            if add(Cause.HANDOFFS, "handoffs_cpus_idle", idle,
                   f"the CPUs it may use (CPU {','.join(map(str, ev.usable_cpus))}) idle {idle:.0%} of the time"):
                waits.cause = Cause.HANDOFFS  # the threads' waits, then, are for one another's wakeups
    if ev.queue_share is not None:
        add(Cause.LINK, "queue_share", ev.queue_share,
            f"queues in its namespace held back or dropped {ev.queue_events} of {ev.queue_packets} packets "
            f"({ev.queue_share:.2%}: tc overlimits, drops, requeues)")
    if starved or (wanted and stalled > on):
        ev.cause = Cause.CPU_STARVED
    elif busy or wanted:
        ev.cause = Cause.CPU_BUSY
    ev.cpu_limited = ev.cause is not None
    if ev.cause is None and any(f.met and f.cause == Cause.RECEIVE_BUFFER for f in ev.findings):
        ev.cause = Cause.RECEIVE_BUFFER


def _remedy(ev: SideEvidence) -> str | None:
    """What binding a side's threads to fewer CPUs is expected to change, for the causes that turn on it."""
    if ev.cause == Cause.SCHEDULING and len(ev.usable_cpus) > 1:
        return (f"{ev.role}: its threads queue for CPUs other work also holds; binding each endpoint to CPUs of "
                "its own (taskset; Go and tokio size their thread pools by it) is expected to raise goodput")
    if ev.cause == Cause.SCHEDULING:
        return f"{ev.role}: its threads queue for the one CPU it may use: fewer threads, or more CPUs"
    if ev.cause == Cause.HANDOFFS:
        return (f"{ev.role}: its threads wait to be woken by one another while CPUs sit idle; binding it to "
                "fewer CPUs would run those handoffs one after another (expected to lower goodput); fewer "
                "handoffs per packet (a connection's work on one thread) is the lever")
    return None


def _describe(ev: SideEvidence) -> str:
    waits = ", ".join(f"{k} {v:.0%}" for k, v in sorted(ev.blocked_in.items(), key=lambda kv: -kv[1])[:2])
    pool = f" of {ev.busiest_pool}" if ev.busiest_pool else ""
    s = (f"{ev.role} {ev.comm} ({ev.pid}): busiest thread {ev.busiest_tid}{pool} on-CPU {ev.busiest_on_cpu:.0%}, "
         f"run-queue {ev.busiest_runqueue:.0%}, blocked {ev.busiest_blocked:.0%}" + (f" (in {waits})" if waits else "")
         + f"; process {ev.process_cpu_cores:.2f} cores on-CPU"
         + (f" (peak {ev.cores_peak:.2f})" if ev.cores_peak is not None and ev.threads > 1 else "")
         + f" + {ev.process_runqueue_cores:.2f} waiting ({ev.threads} threads) of {ev.capacity_cores:.2f} "
         f"({ev.capacity_from})")
    if ev.pressure_some is not None:
        s += f"; CPU pressure of its own cgroup: some {ev.pressure_some:.0%}, full {ev.pressure_full or 0:.0%}"
    elif ev.stalled is not None and ev.threads > 1:
        s += f"; stalled {ev.stalled:.0%} ({ev.stalled_from})"
    elif ev.stalled is None:
        s += ("; stalls unknown: a multi-threaded process needs a cgroup of its own with CPU pressure (PSI) "
              "for them (its threads also wait for each other)")
    if ev.runtime:
        s += "; runtime's own work " + ", ".join(f"{k.removeprefix('runtime: ')} {v:.1%}"
                                                for k, v in ev.runtime.items())
    if ev.handoff_cpu_s_per_gb is not None:
        s += f"; handoffs between its threads {ev.handoff_cpu_s_per_gb:.2f} CPU s/GB"
    if ev.wakeups_per_datagram is not None:
        s += f", {ev.wakeups_per_datagram:.2f} wakeups per datagram"
    if ev.wall_busiest is not None:
        s += "; busiest thread's wall clock " + ", ".join(f"{k.replace('_', '-')} {v:.0%}" for k, v in
                                                          sorted(ev.wall_busiest.items(), key=lambda kv: -kv[1])
                                                          if v >= 0.005)
    if ev.drops:
        s += "; drops at its ports: " + ", ".join(f"{r} {n}" for r, n in sorted(ev.drop_reasons.items()))
    return s


def _unbound(sides: list[SideEvidence], rec: SenderRecord | None) -> tuple[Cause, str]:
    """(cause, summary) when no side's CPU, buffer or queue binds: what the sender waited for off the CPU
    (its busiest thread's longest wait, from the waits probes), told apart by the stack's qlog where it
    wrote one; `flow-control/application` when no side's waits were measured."""
    none = ("no side is CPU-limited, no datagram was dropped for lack of buffer, no queue on this host "
            "held the packets back")
    measured = [s for s in sides if s.waited_for is not None]
    snd = next((s for s in measured if s.sends), None) or (measured[0] if len(measured) == 1 else None)
    if snd is None or snd.wall_busiest is None:
        return Cause.UNMEASURED_WAITS, (f"{none}: the sender waited with nothing it was allowed to send "
                                            "(the application or flow control; a bottleneck beyond this host "
                                            "looks the same)")
    kind = str(snd.waited_for)
    cause = UNBOUND_BY_WAIT.get(kind, Cause.APPLICATION)
    said = rec.dominant if rec is not None else None
    if cause in (Cause.PATH_OR_FLOW_CONTROL, Cause.APPLICATION) and said in ("congestion_control", "flow_control"):
        # the stack's own word that its window or its credit was full: a congestion controller's pacer
        # sleeps on timers too, and a runtime's threads wait on each other whatever held the sender
        # (quic-go over a 50 ms path: its pool's outside waits under 10% in 1 run of 3, 2026-11-27)
        cause = Cause.PATH if said == "congestion_control" else Cause.FLOW_CONTROL
    split = ", ".join(f"{k.replace('_', '-')} {v:.0%}" for k, v in sorted(snd.wall_busiest.items(), key=lambda kv: -kv[1])
                      if v >= 0.005)
    who = (f"the sender, {snd.role} {snd.comm}'s busiest thread {snd.busiest_thread} ({snd.busiest_tid})"
           + (f" of {snd.busiest_pool}" if snd.busiest_pool and snd.threads > 1 else "") + f": {split}")
    what = APPLICATION_WAITS.get(kind, f"{kind} waits") if cause == Cause.APPLICATION else str(cause.about.waited_for)
    path = ""
    if cause in (Cause.PATH, Cause.PATH_OR_FLOW_CONTROL) and snd.round_trip_ms is not None:
        path = f"; the path's round trip in the {snd.role}'s datagram timing: {snd.round_trip_ms:.1f} ms"
    if rec is not None and (rec.rtt_ms is not None or rec.packets_sent):
        path += (f"; the stack's qlog: RTT {rec.rtt_ms:.1f} ms" if rec.rtt_ms is not None else "; the stack's qlog:") + (
            f", {rec.packets_lost} of {rec.packets_sent} packets lost ({rec.packets_lost / rec.packets_sent:.2%})"
            if rec.packets_sent else "")
    return cause, f"{none}; {who}; {'its pool' if snd.busiest_pool and snd.threads > 1 else 'it'} waited longest for {what}{path}"


def judge(sides: Iterable[SideEvidence], records: list[SenderRecord] | None = None) -> Verdict:
    """Combine the sides' evidence into one of the four verdicts with its cause."""
    sides = list(sides)
    by_role = {s.role: s for s in sides}
    notes = [f"{s.role} {s.comm} ({s.pid}) {s.no_traffic}: not judged" for s in sides if s.no_traffic]
    if sides and all(s.no_traffic for s in sides):
        idle = "; ".join(f"{s.role} {s.comm} ({s.pid}) {s.no_traffic}" for s in sides)
        return Verdict("neither", (Cause.NO_TRAFFIC,), f"no transfer to judge: {idle}", sides, dict(THRESHOLDS),
                       notes + [_describe(s) for s in sides])
    for s in sides:
        if s.window_s < MIN_WINDOW_S:
            notes.append(f"{s.role}: window {s.window_s:.2f} s is too short to judge")
    srv, cli = by_role.get("server"), by_role.get("client")
    if srv is None or cli is None:
        notes.append("only one side was measured: the other side is unknown")
    # Which limit binds, when several sides' findings are met: a queue that filled on the way out
    # means the sender produced faster than the link carried (the link binds, whatever its CPU
    # did); a receiver losing a large share of datagrams for lack of buffer holds any loss-based
    # sender far below what its CPU allows; otherwise the CPU-limited sides.
    # A receiver's few drops do not bind over a sender starved of CPU: a starved sender sends what
    # its CPU share allows, in bursts when it gets a CPU (a throttled server on tokio's multi-thread
    # runtime: 75% stalled, its client dropped 2.4% of datagrams, 2026-11-26); a large share lost
    # (drops_over_starved) holds even a starved sender below its share.
    queued = [f for s in sides for f in s.findings if f.cause == Cause.LINK and f.met]
    buffer = [s for s in sides if s.cause == Cause.RECEIVE_BUFFER]
    cpu = [s for s in sides if s.cpu_limited]
    bursts = [b for b in buffer if round(b.receive_drop_share or 0.0, FINDING_PLACES) < THRESHOLDS["drops_over_starved"]]
    starved_sender = any(s.cause == Cause.CPU_STARVED and any(b.role != s.role for b in bursts) for s in cpu)
    culprits = [] if queued else cpu if starved_sender else buffer or cpu
    if not culprits and not queued:  # no CPU, buffer or queue binds: a runtime whose threads wait for each other?
        for s in sides:
            waited = next((f for f in s.findings if f.threshold == "scheduling_wait" and f.met), None)
            if waited is not None:
                s.cause = waited.cause  # `scheduling`, or `handoffs` where the CPUs sat idle
        culprits = [s for s in sides if s.cause in (Cause.SCHEDULING, Cause.HANDOFFS)]
    for s in sides:
        if s.cause is not None and s not in culprits:
            why = ("packets queued on the way out: the sender outpaced the link" if queued else
                   f"{' and '.join(c.role for c in culprits)} was starved of CPU: a starved sender sends in "
                   "bursts when it gets a CPU, which the receiver's buffer dropped" if starved_sender else
                   f"{' and '.join(c.role for c in culprits)} lost datagrams for lack of buffer")
            notes.append(f"{s.role} was {s.cause} too ({'; '.join(s.reasons)}), but {why}")
            s.set_aside = why
            s.cause, s.cpu_limited, s.binds = None, False, None
    limiting = {s.role for s in culprits}
    limited = {frozenset({"server"}): "server-limited", frozenset({"client"}): "client-limited",
               frozenset({"server", "client"}): "both"}.get(frozenset(limiting), "neither")
    causes: tuple[Cause, ...]
    if culprits:
        causes = tuple(sorted({s.cause for s in culprits if s.cause is not None}))
        # a limited service speaks for its processes: each of them is in the notes
        told = [s for s in culprits
                if s.service is not None or not any(a.service is not None and s.pid in a.members for a in culprits)]
        summary = "; ".join(f"{s.role}{f' service {s.service}' if s.service else ''} is {s.cause}: "
                            f"{'; '.join(s.reasons)}" for s in told)
    elif queued:
        causes = (Cause.LINK,)
        summary = "the link limits: " + "; ".join(f.text for f in queued)
    else:
        unbound, summary = _unbound(sides, sender(records or []))
        causes = (unbound,)
    notes += [r for r in map(_remedy, culprits) if r]
    notes += [_describe(s) for s in sides]
    v = Verdict(limited, causes, summary, sides, dict(THRESHOLDS), notes)
    rec = sender(records or [])
    if rec is not None:
        want, agrees = agreement(causes, sorted(limiting), rec)
        v.stack_record = StackWord(rec, want, agrees, tuple(r.file for r in records or []))
    return v
