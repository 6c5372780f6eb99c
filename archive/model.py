"""The run archive's records, typed: what crosses from collection to analysis.

archive/schema.py checks a document's shape once, when a run is opened; the records here are
built from the checked document and are what attribution and the viewer read: Meta and the records
under it (meta.json: one model, written by the session and read back with schema.decode),
ProcReading (each line of proc.jsonl: one model, built by collectors.procfs), ProbeRecord (probes.json, with
the packetio group's own typed record, probes.packetio.maps.PacketioMaps), and LiveData, the
session's raw view of one second for the live panel. Both sides import them from here, the layer
between them, never from the collectors themselves. Fields absent from older archives get the
defaults readers assume.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator

# The probes' records the archive holds as they are, and the field markers schema.shape_of reads
from qprof.probes.crypto.records import (AesHardware as AesHardware, CryptoCost as CryptoCost,
                                         CryptoFindings as CryptoFindings, CryptoObject as CryptoObject,
                                         CryptoProbe as CryptoProbe, CryptoSite as CryptoSite,
                                         CryptoSlot as CryptoSlot, CryptoTarget as CryptoTarget)
from qprof.probes.fields import INLINE as INLINE, NEVER_NULL as NEVER_NULL, NULL_IS_ABSENT as NULL_IS_ABSENT
from qprof.probes.group import ProgramCost as ProgramCost
from qprof.probes.libbpf import LoaderConfig as LoaderConfig
from qprof.jsonvalue import Json
from qprof.probes.mapsout import HistBucket as HistBucket, MapEntry as MapEntry, RawMap as RawMap
from qprof.probes.packetio.maps import PacketioMaps, ProbeMaps as ProbeMaps, Windows as Windows
from qprof.probes.waits.maps import WaitMaps

# how an object got its function names, best first (collectors.debuginfo decides)
SYMTAB, DEBUG_FILE, DEBUGLINK, MINIDEBUGINFO, DEBUGINFOD, UNWIND, DYNSYM, NONE = (
    "symtab", "debug file", "debuglink", "minidebuginfo", "debuginfod", "unwind table", "dynsym only", "none")
GOPCLNTAB = "gopclntab"  # a Go binary's own function table (probes.gopclntab): ranks after MINIDEBUGINFO


@dataclass(frozen=True)
class ObjectSymbols:
    """How one object's frames got their names (recorded in meta.json, printed by the report)."""

    path: str
    build_id: str | None
    how: str  # one of the constants above
    source: str | None = None  # the debug file or the server it came from
    note: str = ""  # what happened on the way (fetched in 0.3 s, a server refused, binutils missing...)


@dataclass
class LiveData:
    """What the session knows about the targets this second, raw, for a live view (attribution.live)."""

    elapsed_s: float
    duration_s: float | None
    reading: "ProcReading"  # the latest /proc reading of the targets
    maps: dict[str, Json]  # the probe groups' maps as last printed (probes.mapsout), not yet checked
    softirq_seconds: dict[int, float]  # per CPU since boot (/proc/stat)
    targets: tuple["Target", ...]


# ---- /proc readings (proc.jsonl): one line per interval -------------------------------------------
# One model both ways, as meta.json: collectors.procfs builds these records from the live /proc, the
# session adds the byte totals (collectors.traffic) and appends the line (archive.proc_line:
# schema.encode), readers get them back (Run.proc_readings: schema.decode) after the line was checked
# against the shape derived from them (schema.PROC_READING). Fields absent from older archives take
# the defaults below.


@dataclass(frozen=True)
class ThreadReading:
    """One thread at one reading: cumulative CPU (ticks) and, when schedstat is on, on-CPU and
    run-queue seconds; what it was doing (state, syscall) and on which CPU."""

    tid: int
    comm: str
    utime_s: float
    stime_s: float
    state: str | None = field(default=None, metadata=NEVER_NULL)  # R, S, D... (/proc/PID/task/TID/stat)
    on_cpu_s: float | None = None  # schedstat: on a CPU ...
    run_delay_s: float | None = None  # ... and runnable, waiting for one (precise, unlike ticks)
    syscall: str | None = None  # the system call it sits in when blocked (a number), or "running"
    cpu: int = -1  # the CPU it last ran on
    voluntary: int | None = None  # context switches so far: it blocked (someone had to wake it) ...
    involuntary: int | None = None  # ... and it was preempted while it could still run


@dataclass(frozen=True)
class CgroupReading:
    """The CPU cgroup a process is in: its quota and cumulative throttling."""

    nr_periods: float
    nr_throttled: float
    throttled_s: float
    path: str | None = field(default=None, metadata=NEVER_NULL)
    quota_cores: float | None = None
    version: str | None = field(default=None, metadata=NEVER_NULL)  # "v1" (the cpu controller) or "v2"


@dataclass(frozen=True)
class Pressure:
    """Cumulative CPU stall seconds (PSI): some task waiting, all tasks waiting (a kernel may give
    only the first)."""

    some_s: float | None = field(default=None, metadata=NEVER_NULL)
    full_s: float | None = field(default=None, metadata=NEVER_NULL)


@dataclass(frozen=True)
class Limits:
    """What a process may use: its affinity, its cpuset, its cgroup's CPU pressure and how many
    processes share that cgroup (its pressure speaks for the process only when it is alone)."""

    cpus_allowed: list[int] | None = None
    cpuset: list[int] | None = None
    pressure: Pressure | None = None
    pressure_procs: int | None = None


@dataclass(frozen=True)
class Traffic:
    """The bytes each target moved so far (collectors.traffic), per pid: (sent, received)."""

    tcp: dict[int, tuple[float, float]] = field(default_factory=dict)
    udp: dict[int, tuple[float, float]] = field(default_factory=dict)
    # CLOCK_MONOTONIC time the udp totals count up to (None: the reading's `mono`)
    udp_through: float | None = field(default=None, metadata=NEVER_NULL)


@dataclass(frozen=True)
class ProcReading:
    """One /proc reading of the targets (collectors.procfs.reading, plus the byte totals of
    collectors.traffic), keyed by pid."""

    mono: float  # CLOCK_MONOTONIC seconds, the clock of the samples (stacks.SAMPLE_CLOCK)
    threads: dict[int, list[ThreadReading]]
    t: float | None = None  # wall clock
    cgroups: dict[int, CgroupReading] = field(default_factory=dict, metadata=NULL_IS_ABSENT)
    limits: dict[int, Limits] = field(default_factory=dict)
    pressure: Pressure | None = None  # the host's
    cpu_idle: dict[int, float] = field(default_factory=dict)  # CPU -> idle + iowait seconds since boot
    traffic: Traffic = field(default_factory=Traffic, metadata=INLINE)

    # the byte totals as the analysis reads them (attribution.timeline)
    @property
    def tcp(self) -> dict[int, tuple[float, float]]:
        return self.traffic.tcp

    @property
    def udp(self) -> dict[int, tuple[float, float]]:
        return self.traffic.udp

    @property
    def udp_through(self) -> float | None:
        return self.traffic.udp_through


# ---- meta.json: what was profiled, how, on what host ----------------------------------------------
# One model both ways: the session builds these records and writes them (schema.encode), readers get them
# back (schema.decode) after the document was checked against the shape derived from them
# (schema.shape_of(Meta)). Fields absent from older archives take the defaults below.


@dataclass(frozen=True)
class MappedObject:
    """A file mapped executable into a target: its binary or a shared library (collectors.elf)."""

    path: str
    build_id: str | None = None
    symbols: str | None = None  # "symtab" (full), "dynsym" (exported only), "none", or "unreadable"
    go: bool | None = False  # a Go binary (its runtime's frames are Go's)
    frame_pointers: bool | None = None  # None: no function symbols to judge by
    dynamic: bool | None = False  # has a program interpreter: runs shared libraries (glibc) at run time


@dataclass
class Image:
    """A program a target ran after it exec'd, from `since_s` into the run."""

    exe: str | None = None
    comm: str = "?"
    unwind: str | None = None
    since_s: float = 0.0


@dataclass
class Target:
    """One profiled process as the session found it."""

    pid: int
    comm: str = "?"
    role: str | None = None  # "server", "client" or None
    exe: str | None = None
    cmdline: list[str] = field(default_factory=list)
    objects: list[MappedObject] = field(default_factory=list)
    threads: dict[int, str] = field(default_factory=dict)  # tid -> name when it was described
    cgroup: list[str] = field(default_factory=list)  # /proc/PID/cgroup
    unwind: str | None = None
    unwind_reason: str | None = None
    images: list[Image] = field(default_factory=list)  # after an exec: every image, the first one included
    service: str | None = None  # the followed cgroup it was found in (attach --cgroup/--unit); None: by pid
    joined_s: float | None = None  # seconds into the run it appeared in that cgroup; None: there at the start
    # DWARF: its stacks the native folder unwound, and those that went past the stack copy, losing their
    # callers (older archives, frame pointers, perf script: unknown)
    stacks_unwound: int | None = field(default=None, metadata=NEVER_NULL)
    stacks_cut: int | None = field(default=None, metadata=NEVER_NULL)


@dataclass(frozen=True)
class Service:
    """A cgroup the run followed: its path from the cgroup root, its processes' role, the systemd unit
    it was named by."""

    name: str
    role: str | None = None
    unit: str | None = None


@dataclass
class SampleGroup:
    """One perf recorder: the unwinding mode, the pids it holds samples of and its data file. `windows`:
    per pid, the [start, end] sample times (ns, None: open) in which this group holds that pid's samples
    (a target that exec'd into a program wanting the other unwinding mode moved between groups).
    `stack_bytes`: the user stack copied per DWARF sample (older archives: not recorded)."""

    unwind: str
    pids: list[int] = field(default_factory=list)
    perf_data: str = ""
    windows: dict[int, list[list[int | None]]] = field(default_factory=dict)
    stack_bytes: int | None = field(default=None, metadata=NEVER_NULL)


@dataclass
class SamplingScope:
    """How samples were kept to the targets: "cgroup" (perf -G) or "system"; with auto, why it fell back."""

    mode: str = "system"
    requested: str | None = None
    cgroups: list[str] = field(default_factory=list)
    hierarchy: str | None = None
    fallback: str | None = None


@dataclass
class Sampling:
    """How perf sampled: event, frequency, the clock of sample times, its recorders, how samples were
    kept to the targets (older archives say nothing of the scope: system)."""

    event: str = "cpu-clock"
    frequency: int | None = field(default=None, metadata=NEVER_NULL)
    clock: str | None = field(default=None, metadata=NEVER_NULL)  # None: from before samples and readings
    groups: list[SampleGroup] = field(default_factory=list)       # shared a clock (the key is absent)
    chunk_bytes: int | None = field(default=None, metadata=NEVER_NULL)
    keep_raw: bool | None = field(default=False, metadata=NEVER_NULL)
    scope: SamplingScope | None = None

    @property
    def scope_mode(self) -> str:
        return self.scope.mode if self.scope is not None else "system"


@dataclass
class Nic:
    name: str
    numa_node: int | None


@dataclass
class Host:
    hostname: str | None = None  # tells runs recorded on two hosts apart in tables
    kernel: str | None = None
    kernel_build: str | None = None
    machine: str | None = None
    cpu_model: str | None = None
    cpus: int | None = None
    python: str | None = None
    cpu_nodes: dict[int, int] = field(default_factory=dict)  # CPU -> NUMA node
    nics: list[Nic] = field(default_factory=list)


@dataclass
class ProcessIdentity:
    """What tells a process apart from a later one with the same pid: boot and start time."""

    pid: int
    start_ticks: int | None = None
    boot_id: str | None = None


@dataclass
class PressureSource:
    """Where each target's own CPU pressure (PSI) was read, or why it could not be."""

    hierarchy: str | None = None
    unavailable: str | None = None


@dataclass
class ParseSummary:
    """What folding the perf data met: samples, and lines it could not read (with a few examples)."""

    samples: int = 0
    bad_lines: int = 0
    bad_examples: list[str] = field(default_factory=list)
    perf_script_cpu_s: float | None = None  # what the folder used (older archives: not known)
    folder: str | None = None  # what read the perf data: perf script, qprof-perffold (older archives: perf script)


Scalar = str | int | float | bool | None


@dataclass
class ChunkSummary:
    """The perf data chunks of a finished run: how many were folded, which were dropped or unreadable."""

    folded: int = 0
    dropped: list[dict[str, Scalar]] = field(default_factory=list)
    unreadable: list[dict[str, Scalar]] = field(default_factory=list)


@dataclass
class RecordEntry:
    """What `qprof record` ran for this repetition and how its commands ended."""

    repetition: int | None = None
    repetitions: int | None = None
    commands: dict[str, list[str]] = field(default_factory=dict)
    exit: dict[str, int | None] = field(default_factory=dict)
    ready: str | None = None
    ready_after_s: float | None = None
    client_s: float | None = None  # the client's wall time, released to exited
    failures: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Configuration:
    """What a run was made to measure, written when `qprof record` or `qprof study` makes it, so that
    tables pool a run only with the repetitions of the same configuration, wherever its directory
    is later moved. A study's run: its stack's and setting's names, the commands with `{port}` left a
    placeholder (each run has its own port) and the environment the stack and setting set. A `record`
    run: its series' name (the -o directory's) and its commands as run; the environment qprof itself
    was started with is not recorded (it may hold secrets), so a series is named after what differs."""

    setting: str  # the setting's name (a study's), or the `record` series' name
    stack: str | None = None  # the study's name for the stack; None for `record`
    commands: dict[str, list[str]] = field(default_factory=dict)  # role -> argv
    env: dict[str, str] = field(default_factory=dict)  # set on top of qprof's own environment

    @property
    def name(self) -> str:
        """What tables call it: STACK/SETTING for a study's run, the series' name for `record`'s."""
        return f"{self.stack}/{self.setting}" if self.stack else self.setting

    def key(self) -> tuple[Any, ...]:
        """Equal for runs of one configuration, and only for them."""
        return (self.setting, self.stack, tuple((r, tuple(a)) for r, a in sorted(self.commands.items())),
                tuple(sorted(self.env.items())))


FORMAT = "qprof-run"
VERSION = 1
STATUS_COLLECTING = "collecting"
STATUS_COMPLETE = "complete"
STATUS_INCOMPLETE = "incomplete"


@dataclass
class Meta:
    """meta.json: written at the start with status "collecting", rewritten as the run goes and at its end."""

    format: str = FORMAT
    version: Scalar = VERSION
    status: str = STATUS_COLLECTING
    incomplete_reason: str | None = None
    qprof_version: str | None = None
    host: Host = field(default_factory=Host)
    tools: dict[str, str | None] = field(default_factory=dict)
    kernel_features: dict[str, Scalar] = field(default_factory=dict)
    sampling: Sampling = field(default_factory=Sampling)
    targets: list[Target] = field(default_factory=list)
    requested_duration_s: float | None = None
    probes: list[str] = field(default_factory=list)
    collector: ProcessIdentity | None = None  # the qprof that collects: a run "collecting" without it was cut
    pressure: PressureSource | None = None
    symbols: list[ObjectSymbols] = field(default_factory=list)  # where each object's names came from
    start_time: str | None = None
    end_time: str | None = None
    duration_s: float | None = None
    stop_reason: str | None = None
    exited: list[int] = field(default_factory=list)
    perf_exit: dict[str, int | None] = field(default_factory=dict)
    perf_cpu_s: dict[str, float | None] = field(default_factory=dict)  # qprof's perf record per unwinding mode
    qprof_cpu_s: float | None = None  # qprof's own process over the attach, folding and writing included
    # every program qprof ran and reaped meanwhile (perf, the probe loaders, tc, ...); None where targets
    # were its children too (`record`), whose CPU would count here
    helpers_cpu_s: float | None = None
    parse: ParseSummary | None = None
    chunks: ChunkSummary | None = None
    record: RecordEntry | None = None
    configuration: Configuration | None = None  # None: made by `attach`, or by a qprof before it was recorded
    services: list[Service] = field(default_factory=list)  # cgroups followed (attach --cgroup/--unit)

    def target(self, pid: int) -> Target | None:
        return next((t for t in self.targets if t.pid == pid), None)

    @property
    def client_s(self) -> float | None:
        """`qprof record`: the client's wall time."""
        return self.record.client_s if self.record is not None else None


# ---- probes.json: the probe groups' programs and maps, socket and queue readings ---------------------
# One model both ways, as meta.json: collectors.probing fills a ProbeRecord over the run and writes it
# (schema.encode), readers get it back (Run.probes: schema.decode) after the document was checked once
# against the shape derived from it. The one free-form part is a program's raw maps (RawMap): what the
# bpftrace and libbpf loaders print, `@name` maps keyed by strings the program chose ("pid,tid,port"),
# whose meaning is the group's own (probes/<group>/maps.py reads them); the packetio sampler's
# `@windows` is the one printed map with a fixed structure, and is typed (probes.packetio.maps.Windows).
# The records a group hands over (its loader's LoaderConfig, the crypto group's findings) are its own,
# imported above: the collector records them as they are.


@dataclass
class ProgramRecord:
    """One probe group's program in a run: what ran (files in the run directory), its maps as last
    printed (absent until the program stopped: a run cut short reads them from `output`) and what
    running it cost."""

    maps: ProbeMaps | None = field(default=None, metadata=NEVER_NULL)
    output: str | None = field(default=None, metadata=NEVER_NULL)  # its raw output file
    script: str | None = field(default=None, metadata=NEVER_NULL)  # the program: bpftrace script or C source
    mechanism: str | None = field(default=None, metadata=NEVER_NULL)
    object: str | None = field(default=None, metadata=NEVER_NULL)  # libbpf: the compiled object
    config: LoaderConfig | None = field(default=None, metadata=NEVER_NULL)
    series: str | None = field(default=None, metadata=NEVER_NULL)  # waits: probe-waits.series.jsonl
    timing: str | None = field(default=None, metadata=NEVER_NULL)  # packetio: probe-packetio.timing.jsonl
    attach_seconds: float | None = field(default=None, metadata=NEVER_NULL)
    started: float | None = field(default=None, metadata=NEVER_NULL)  # wall clock it attached at
    exit: int | None = None
    log_tail: str | None = None  # its log's end when it failed
    cpu_s: float | None = None  # its loader's CPU time


@dataclass(frozen=True)
class UnavailableProbe:
    """A probe that did not run, or a part of one that could not (`crypto following`, `cost`), and why."""

    probe: str
    reason: str

    def __iter__(self) -> Iterator[str]:
        """Reads as a (probe, reason) pair."""
        return iter((self.probe, self.reason))


@dataclass(frozen=True)
class Qdisc:
    """One queueing discipline's counters (tc -s qdisc) at one reading; a counter tc did not give is
    written null by older qprof and reads as 0."""

    dev: str | None = None
    kind: str | None = None
    handle: str | None = None
    bytes: int = field(default=0, metadata=NULL_IS_ABSENT)
    packets: int = field(default=0, metadata=NULL_IS_ABSENT)
    drops: int = field(default=0, metadata=NULL_IS_ABSENT)
    overlimits: int = field(default=0, metadata=NULL_IS_ABSENT)
    requeues: int = field(default=0, metadata=NULL_IS_ABSENT)
    backlog: int = field(default=0, metadata=NULL_IS_ABSENT)
    qlen: int = field(default=0, metadata=NULL_IS_ABSENT)


@dataclass
class NamespaceQueues:
    """The qdiscs of one network namespace holding targets, when first and last read."""

    pids: tuple[int, ...] = ()
    first: tuple[Qdisc, ...] = ()
    last: tuple[Qdisc, ...] = ()
    first_time: float = 0.0
    last_time: float = 0.0


@dataclass(frozen=True)
class UdpSocket:
    """One UDP socket of the targets, its buffers and drop counter when first and last seen
    (collectors.probing); fields in the order probes.json writes them."""

    fds: list[int] = field(default_factory=list)
    first: dict[str, int | float | None] = field(default_factory=dict)  # drops, rcvbuf, sndbuf, rmem_alloc...
    first_time: float = 0.0
    last: dict[str, int | float | None] = field(default_factory=dict)
    last_time: float = 0.0
    local: str = ""
    peer: str = ""
    pids: list[int] = field(default_factory=list)
    port: int | None = None


@dataclass(frozen=True)
class UdpMib:
    """A network namespace's UDP counters (/proc/net/snmp) and the targets in it."""

    pids: list[int] = field(default_factory=list)
    udp: dict[str, int | float] = field(default_factory=dict)


@dataclass(frozen=True)
class HostSnapshot:
    """The host's softirq time and counts, sysctls and UDP counters at the run's start or end."""

    softirq_seconds: dict[int, float] = field(default_factory=dict)  # per CPU
    softirqs: dict[str, list[int | float]] = field(default_factory=dict)  # per softirq vector, per CPU
    sysctl: dict[str, str | float] = field(default_factory=dict)
    time: float | None = None
    udp_mib: dict[str, UdpMib] = field(default_factory=dict)  # by namespace


@dataclass(frozen=True)
class GroupCost:
    bpf_run_cnt: int | float
    bpf_run_time_ns: int | float


@dataclass(frozen=True)
class ProbeCost:
    """What the BPF programs cost the host (collectors.probing: statistics windows scaled to the probes'
    lifetime); fields in the order probes.json writes them, the report carries it as written."""

    bpf_run_cnt: int | float
    bpf_run_time_ns: int | float
    by_group: dict[str, GroupCost] | None = field(default=None, metadata=NEVER_NULL)
    measured_run_cnt: int | float | None = field(default=None, metadata=NEVER_NULL)
    measured_run_time_ns: int | float | None = field(default=None, metadata=NEVER_NULL)
    method: str | None = field(default=None, metadata=NEVER_NULL)
    probes_s: int | float | None = field(default=None, metadata=NEVER_NULL)
    programs: list[ProgramCost] | None = field(default=None, metadata=NEVER_NULL)
    stats_on_s: int | float | None = field(default=None, metadata=NEVER_NULL)


@dataclass(frozen=True)
class FollowedPid:
    pid: int
    time: float


@dataclass
class Follow:
    """A followed run's targets added while it ran (probes.follow): the file the loaders read, and when."""

    file: str
    added: list[FollowedPid] = field(default_factory=list)


# ---- tcp.json: the targets' TCP sockets and their kernel byte counters (collectors.traffic) -----------


@dataclass(frozen=True)
class TcpCounters:
    """A TCP socket's counters at one reading (tcp_info; collectors.tcpinfo)."""

    payload_sent: int
    bytes_received: int
    bytes_acked: int = 0
    bytes_sent: int = 0
    bytes_retrans: int = 0
    segs_out: int = 0
    segs_in: int = 0


@dataclass(frozen=True)
class TcpSocket:
    """One TCP connection of a target, first and last seen."""

    pid: int
    first: TcpCounters
    last: TcpCounters
    cookie: int = 0
    family: int = 0
    local: str = ""
    peer: str = ""
    first_time: float = 0.0
    last_time: float = 0.0
    closed: bool = False


@dataclass(frozen=True)
class TcpRecord:
    """tcp.json: the targets' connections, what closed without an owner, what went wrong reading them."""

    sockets: list[TcpSocket]
    source: str = ""
    polls: int = 0
    dumps: int = 0
    namespaces: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    lost_destroy_events: int = 0
    unowned_closed: dict[str, int] = field(default_factory=dict)


@dataclass
class ProbeRecord:
    """probes.json: each group's program and maps, what the run's sockets, queues and host counters
    showed, what was unavailable. Written as the run goes (collectors.probing) and read back whole."""

    groups: list[str] = field(default_factory=list)
    programs: dict[str, ProgramRecord] = field(default_factory=dict)
    unavailable: list[UnavailableProbe] = field(default_factory=list)
    qdiscs: dict[str, NamespaceQueues] = field(default_factory=dict)  # by namespace
    sockets: list[UdpSocket] = field(default_factory=list)
    sockets_error: str | None = field(default=None, metadata=NEVER_NULL)
    drop_reason_names: dict[int, str] = field(default_factory=dict)  # the kernel's skb drop reasons
    before: HostSnapshot = field(default_factory=HostSnapshot)
    after: HostSnapshot = field(default_factory=HostSnapshot)
    cost: ProbeCost | None = field(default=None, metadata=NEVER_NULL)  # the BPF programs' run time
    crypto: CryptoFindings | None = field(default=None, metadata=NEVER_NULL)
    bpftrace_version: str | None = field(default=None, metadata=NEVER_NULL)
    follow: Follow | None = field(default=None, metadata=NEVER_NULL)

    @property
    def queues(self) -> dict[str, NamespaceQueues]:
        """The qdiscs by namespace, as the verdict reads them."""
        return self.qdiscs

    @classmethod
    def of_maps(cls, maps: dict[str, ProbeMaps]) -> "ProbeRecord":
        """A record holding only the groups' maps (group -> maps): what a live view has mid-run."""
        return cls(programs={g: ProgramRecord(maps=m) for g, m in maps.items()})

    def maps(self, group: str) -> ProbeMaps:
        """A group's maps; {} when it did not run."""
        prog = self.programs.get(group)
        return prog.maps or {} if prog is not None else {}

    def packetio(self) -> PacketioMaps:
        """What the packetio group measured, typed (probes.packetio.maps)."""
        return PacketioMaps.from_maps(self.maps("packetio"))

    def waits(self) -> WaitMaps:
        """What the waits group measured, typed (probes.waits.maps); empty when it did not run."""
        return WaitMaps.from_maps(self.maps("waits"))


# ---- functions.json: where the sampled functions start in their objects (collectors.functions) -------
# pprof and OTLP locations point at a function's start so a backend can symbolize them again by build-id;
# recorded at the end of the run, from the files the run mapped (build-id checked), so a report made
# elsewhere or after the binaries changed reads them from the archive alone.


@dataclass(frozen=True)
class ObjectFunctions:
    """One object the run's samples name, with where each sampled function of it starts."""

    path: str  # as the frames name it
    build_id: str | None  # the object's, as the run recorded it (None: it has none)
    starts: dict[str, int] = field(default_factory=dict)  # function -> its start (the object's virtual address)
    source: str | None = None  # the file whose symbol table gave them: the object itself, or its debug file
    note: str = ""  # why there are none, when there are none


@dataclass(frozen=True)
class FunctionStarts:
    """functions.json: the objects the run's samples name; a function not in its object's `starts` has none."""

    objects: list[ObjectFunctions] = field(default_factory=list)
