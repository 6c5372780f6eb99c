"""The run archive's records, typed: what crosses from collection to analysis.

collectors/schema.py checks a document's shape once, when a run is opened; the records here are
built from the checked document (`from_json`) and are what attribution and the viewer read:
Meta and Target (meta.json), ProcReading (each line of proc.jsonl), ProbeRecord (probes.json, with
the packetio group's own typed record, probes.packetio.record.PacketioRecord), and LiveData, the
session's raw view of one second for the live panel. Both sides import them from here, the layer
between them, never from the collectors themselves. Fields absent from older archives get the
defaults readers assume.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from qprof.probes.packetio.record import PacketioRecord


# how an object got its function names, best first (collectors.debuginfo decides)
SYMTAB, DEBUG_FILE, DEBUGLINK, MINIDEBUGINFO, DEBUGINFOD, UNWIND, DYNSYM, NONE = (
    "symtab", "debug file", "debuglink", "minidebuginfo", "debuginfod", "unwind table", "dynsym only", "none")


@dataclass(frozen=True)
class ObjectSymbols:
    """How one object's frames got their names (recorded in meta.json, printed by the report)."""

    path: str
    build_id: str | None
    how: str  # one of the constants above
    source: str | None = None  # the debug file or the server it came from
    note: str = ""  # what happened on the way (fetched in 0.3 s, a server refused, binutils missing...)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "ObjectSymbols":
        return cls(str(d["path"]), d.get("build_id"), str(d.get("how", NONE)), d.get("source"), str(d.get("note", "")))


@dataclass
class LiveData:
    """What the session knows about the targets this second, raw, for a live view (attribution.live)."""

    elapsed_s: float
    duration_s: float | None
    reading: "ProcReading"  # the latest /proc reading of the targets
    maps: dict[str, Any]  # the probe groups' maps as last printed (bpftrace JSON shape)
    softirq_seconds: dict[str, float]  # per CPU since boot (/proc/stat)
    targets: tuple["Target", ...]


# ---- /proc readings (proc.jsonl): one line per interval, checked against schema.PROC_READING -------


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _pid_keyed(obj: Any) -> dict[int, Any]:
    """{"1234": x} -> {1234: x} (the schema checked that the keys are decimal numbers)."""
    return {int(k): v for k, v in obj.items()} if isinstance(obj, dict) else {}


@dataclass(frozen=True)
class ThreadReading:
    """One thread at one reading: cumulative CPU (ticks) and, when schedstat is on, on-CPU and
    run-queue seconds; what it was doing (state, syscall) and on which CPU."""

    tid: int
    comm: str
    utime_s: float
    stime_s: float
    state: str | None = None
    on_cpu_s: float | None = None
    run_delay_s: float | None = None
    syscall: str | None = None
    cpu: int = -1
    voluntary: int | None = None  # context switches so far: it blocked (someone had to wake it) ...
    involuntary: int | None = None  # ... and it was preempted while it could still run

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "ThreadReading":
        cpu = d.get("cpu")
        return cls(int(d["tid"]), str(d["comm"]), float(d["utime_s"]), float(d["stime_s"]), d.get("state"),
                   _num(d.get("on_cpu_s")), _num(d.get("run_delay_s")), d.get("syscall"),
                   cpu if isinstance(cpu, int) else -1, _int(d.get("voluntary")), _int(d.get("involuntary")))


@dataclass(frozen=True)
class CgroupReading:
    """The CPU cgroup a process is in: its quota and cumulative throttling."""

    path: str | None
    nr_periods: float
    nr_throttled: float
    throttled_s: float
    quota_cores: float | None = None
    version: str | None = None

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "CgroupReading":
        return cls(d.get("path"), float(d["nr_periods"]), float(d["nr_throttled"]), float(d["throttled_s"]),
                   _num(d.get("quota_cores")), d.get("version"))


@dataclass(frozen=True)
class Pressure:
    """Cumulative CPU stall seconds (PSI): some task waiting, all tasks waiting."""

    some_s: float | None
    full_s: float | None

    @classmethod
    def from_json(cls, d: Any) -> "Pressure | None":
        return cls(_num(d.get("some_s")), _num(d.get("full_s"))) if isinstance(d, dict) else None


@dataclass(frozen=True)
class Limits:
    """What a process may use: its affinity, its cpuset, its cgroup's CPU pressure and how many
    processes share that cgroup (its pressure speaks for the process only when it is alone)."""

    cpus_allowed: list[int] | None = None
    cpuset: list[int] | None = None
    pressure: Pressure | None = None
    pressure_procs: int | None = None

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Limits":
        return cls(d.get("cpus_allowed"), d.get("cpuset"), Pressure.from_json(d.get("pressure")),
                   d.get("pressure_procs"))


@dataclass(frozen=True)
class ProcReading:
    """One /proc reading of the targets (collectors.procfs.reading, plus the byte totals of
    collectors.traffic), keyed by pid."""

    mono: float  # CLOCK_MONOTONIC seconds, the clock of the samples (stacks.SAMPLE_CLOCK)
    threads: dict[int, list[ThreadReading]]
    t: float | None = None  # wall clock
    cgroups: dict[int, CgroupReading] = field(default_factory=dict)
    limits: dict[int, Limits] = field(default_factory=dict)
    pressure: Pressure | None = None  # the host's
    tcp: dict[int, tuple[float, float]] = field(default_factory=dict)  # pid -> bytes (sent, received) so far
    udp: dict[int, tuple[float, float]] = field(default_factory=dict)
    cpu_idle: dict[int, float] = field(default_factory=dict)  # CPU -> idle + iowait seconds since boot

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "ProcReading":
        """A reading as written to proc.jsonl; `d` conforms to schema.PROC_READING."""
        def moved(obj: Any) -> dict[int, tuple[float, float]]:
            return {pid: (float(v[0]), float(v[1])) for pid, v in _pid_keyed(obj).items() if len(v) == 2}

        return cls(float(d["mono"]),
                   {pid: [ThreadReading.from_json(t) for t in ts] for pid, ts in _pid_keyed(d["threads"]).items()},
                   _num(d.get("t")),
                   {pid: CgroupReading.from_json(c) for pid, c in _pid_keyed(d.get("cgroups")).items() if c},
                   {pid: Limits.from_json(lim) for pid, lim in _pid_keyed(d.get("limits")).items()},
                   Pressure.from_json(d.get("pressure")), moved(d.get("tcp")), moved(d.get("udp")),
                   {cpu: float(v) for cpu, v in _pid_keyed(d.get("cpu_idle")).items()})


# ---- meta.json: what was profiled, how, on what host; checked against schema.META -------------------


def _str(v: Any) -> str | None:
    return v if isinstance(v, str) else None


@dataclass(frozen=True)
class MappedObject:
    """A file mapped executable into a target: its binary or a shared library."""

    path: str
    build_id: str | None = None
    go: bool = False  # a Go binary (its runtime's frames are Go's)

    @classmethod
    def from_json(cls, d: Any) -> "MappedObject":
        if not isinstance(d, dict):  # archives before objects were described: a bare path
            return cls(str(d))
        return cls(str(d["path"]), _str(d.get("build_id")), bool(d.get("go")))


@dataclass(frozen=True)
class Image:
    """A program a target ran after it exec'd, from `since_s` into the run."""

    exe: str | None
    comm: str
    unwind: str | None
    since_s: float


@dataclass(frozen=True)
class Target:
    """One profiled process as the session found it."""

    pid: int
    comm: str = "?"
    role: str | None = None  # "server", "client" or None
    exe: str | None = None
    cmdline: tuple[str, ...] = ()
    objects: tuple[MappedObject, ...] = ()
    unwind: str | None = None
    unwind_reason: str | None = None
    images: tuple[Image, ...] = ()

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Target":
        return cls(int(d["pid"]), str(d.get("comm", "?")), _str(d.get("role")), _str(d.get("exe")),
                   tuple(d.get("cmdline") or ()), tuple(MappedObject.from_json(o) for o in d.get("objects") or ()),
                   _str(d.get("unwind")), _str(d.get("unwind_reason")),
                   tuple(Image(_str(i.get("exe")), str(i.get("comm", "?")), _str(i.get("unwind")),
                               _num(i.get("since_s")) or 0.0) for i in d.get("images") or ()))


@dataclass(frozen=True)
class Sampling:
    """How perf sampled: event, frequency, the clock of sample times and how samples were kept to
    the targets (scope: "system" or "cgroup"; older archives say nothing: system)."""

    event: str = "cpu-clock"
    frequency: int | None = None
    clock: str | None = None  # None: an archive from before samples and readings shared a clock
    scope: str = "system"

    @classmethod
    def from_json(cls, d: Any) -> "Sampling":
        d = d if isinstance(d, dict) else {}
        scope = d.get("scope")  # any shape in damaged archives: the schema does not describe it
        return cls(str(d.get("event", "cpu-clock")), d.get("frequency"), _str(d.get("clock")),
                   str(scope.get("mode", "system")) if isinstance(scope, dict) else "system")


@dataclass(frozen=True)
class Nic:
    name: str
    numa_node: int | None


@dataclass(frozen=True)
class Host:
    kernel: str | None = None
    cpu_model: str | None = None
    cpus: int | None = None
    cpu_nodes: dict[str, int] = field(default_factory=dict)  # CPU (decimal) -> NUMA node
    nics: tuple[Nic, ...] = ()

    @classmethod
    def from_json(cls, d: Any) -> "Host":
        d = d if isinstance(d, dict) else {}
        return cls(_str(d.get("kernel")), _str(d.get("cpu_model")), d.get("cpus"), dict(d.get("cpu_nodes") or {}),
                   tuple(Nic(str(n["name"]), n.get("numa_node")) for n in d.get("nics") or ()))


@dataclass(frozen=True)
class Meta:
    """meta.json as readers use it. The document itself stays in Run.meta (reports pass parts of it
    through, `qprof record` and `--refold` add to it); every reader takes its fields from here."""

    status: str
    incomplete_reason: str | None
    targets: tuple[Target, ...]
    sampling: Sampling
    host: Host
    start_time: str | None = None
    duration_s: float | None = None
    stop_reason: str | None = None
    perf_cpu_s: dict[str, float] = field(default_factory=dict)  # qprof's perf record per unwinding mode
    client_s: float | None = None  # `qprof record`: the client's wall time
    symbols: tuple[ObjectSymbols, ...] = ()  # where each object's function names came from (collectors.debuginfo)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Meta":
        """`d` conforms to schema.META (Run.open checked it)."""
        record = d.get("record")
        client_s = record.get("client_s") if isinstance(record, dict) else None
        return cls(str(d.get("status")), _str(d.get("incomplete_reason")),
                   tuple(Target.from_json(t) for t in d.get("targets") or ()), Sampling.from_json(d.get("sampling")),
                   Host.from_json(d.get("host")), _str(d.get("start_time")), _num(d.get("duration_s")),
                   _str(d.get("stop_reason")),
                   {str(k): float(v) for k, v in (d.get("perf_cpu_s") or {}).items() if v is not None},
                   _num(client_s), tuple(ObjectSymbols.from_json(o) for o in d.get("symbols") or ()))

    def target(self, pid: int) -> Target | None:
        return next((t for t in self.targets if t.pid == pid), None)


# ---- probes.json: the probe groups' programs and maps, socket and queue readings; schema.PROBES -----


@dataclass(frozen=True)
class ProgramRecord:
    """One probe group's program in a run: its maps as last printed (bpftrace's JSON shape, libbpf
    groups print the same) and what running it cost."""

    maps: dict[str, Any]
    output: str | None = None  # its raw output file in the run directory
    exit: int | None = None
    cpu_s: float | None = None  # its loader's CPU time

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "ProgramRecord":
        return cls(dict(d.get("maps") or {}), _str(d.get("output")), d.get("exit"), _num(d.get("cpu_s")))


@dataclass(frozen=True)
class Qdisc:
    """One queueing discipline's counters (tc -s qdisc) at one reading."""

    dev: str | None
    kind: str | None
    packets: int = 0
    drops: int = 0
    overlimits: int = 0
    requeues: int = 0

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Qdisc":
        return cls(_str(d.get("dev")), _str(d.get("kind")),
                   *(int(_num(d.get(k)) or 0) for k in ("packets", "drops", "overlimits", "requeues")))


@dataclass(frozen=True)
class NamespaceQueues:
    """The qdiscs of one network namespace holding targets, at the run's start and end."""

    pids: tuple[int, ...]
    first: tuple[Qdisc, ...]
    last: tuple[Qdisc, ...]

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "NamespaceQueues":
        return cls(tuple(d.get("pids") or ()), tuple(Qdisc.from_json(q) for q in d.get("first") or ()),
                   tuple(Qdisc.from_json(q) for q in d.get("last") or ()))


@dataclass(frozen=True)
class ProbeRecord:
    """probes.json as readers use it: each group's program and maps, the queues, what was unavailable.
    `doc` is the document itself, for the group analyses that read their own parts of it."""

    doc: dict[str, Any]
    groups: tuple[str, ...] = ()
    programs: dict[str, ProgramRecord] = field(default_factory=dict)
    unavailable: tuple[tuple[str, str], ...] = ()  # (probe, why)
    queues: dict[str, NamespaceQueues] = field(default_factory=dict)  # by namespace

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "ProbeRecord":
        """`d` conforms to schema.PROBES (Run.probes checked it)."""
        return cls(d, tuple(d.get("groups") or ()),
                   {name: ProgramRecord.from_json(p) for name, p in (d.get("programs") or {}).items()},
                   tuple((str(u["probe"]), str(u["reason"])) for u in d.get("unavailable") or ()),
                   {ns: NamespaceQueues.from_json(q) for ns, q in (d.get("qdiscs") or {}).items()})

    @classmethod
    def of_maps(cls, maps: dict[str, dict[str, Any]]) -> "ProbeRecord":
        """A record holding only the groups' maps (group -> maps): what a live view has mid-run."""
        return cls.from_json({"programs": {g: {"maps": m} for g, m in maps.items()}})

    def maps(self, group: str) -> dict[str, Any]:
        """A group's maps; {} when it did not run."""
        prog = self.programs.get(group)
        return prog.maps if prog is not None else {}

    def packetio(self) -> PacketioRecord:
        """What the packetio group measured, typed (probes.packetio.record)."""
        return PacketioRecord.from_maps(self.maps("packetio"))
