"""Everything a report shows, computed once from a run archive: the shared entry for viewers and the API."""

from __future__ import annotations

from dataclasses import dataclass, field

from qprof.attribution.cryptocalls import Crypto, analyse as analyse_crypto
from qprof.attribution.mapping import MappingSet
from qprof.attribution.packetio import PacketIO, analyse
from qprof.attribution.profile import Profile, Visitor, attribute
from qprof.attribution.recommend import Recommendation, recommend
from qprof.attribution.rtt import RoundTrip, round_trips
from qprof.attribution.services import ServiceView, services
from qprof.attribution.tcp import TcpIO, analyse as analyse_tcp
from qprof.attribution.threads import ThreadView, thread_view
from qprof.attribution.transfer import Transfer, transfer, working
from qprof.attribution.qlog import SenderRecord
from qprof.attribution.verdict import SideEvidence, Verdict, judge, service_evidence, side_evidence
from qprof.attribution.waits import WallClock, wall_clock
from qprof.archive import Run
from qprof.archive.model import Meta, ProbeRecord


@dataclass
class Analysis:
    profile: Profile
    packet_io: PacketIO | None
    recommendations: list[Recommendation]
    crypto: Crypto | None = None  # the opt-in crypto probes (attribution.cryptocalls)
    sides: list[SideEvidence] = field(default_factory=list)  # targets with a server/client role
    observer_cpu_s: dict[str, float] = field(default_factory=dict)  # what qprof ran: CPU seconds each
    tcp: TcpIO | None = None  # TCP bytes from the kernel's socket counters (attribution.tcp)
    stack_records: list[SenderRecord] = field(default_factory=list)  # the stack's own qlog, beside the verdict
    threads: dict[int, ThreadView] = field(default_factory=dict)  # per target: pools, parallelism, handoffs
    transfers: dict[int, Transfer] = field(default_factory=dict)  # per process: its goodput, computed once
    wall: dict[int, WallClock] = field(default_factory=dict)  # per target: its threads' wall clock (waits probes)
    round_trips: dict[int, RoundTrip] = field(default_factory=dict)  # per target: the path's RTT its datagrams echo
    services: list[ServiceView] = field(default_factory=list)  # followed cgroups: each worker and their sum

    def bytes_moved(self, pid: int) -> tuple[int | None, int | None]:
        """(UDP, TCP) payload bytes a process sent + received; None where not counted."""
        pio = self.packet_io.processes.get(pid) if self.packet_io is not None else None
        udp = (pio.tx.bytes + pio.rx.bytes) if pio is not None else None
        tcp = self.tcp.processes[pid].moved if self.tcp is not None and pid in self.tcp.processes else None
        return udp, tcp

    @property
    def verdict(self) -> Verdict | None:
        return verdict_of([self])

    @property
    def targets_cpu_s(self) -> float:
        """The targets' CPU seconds from /proc (0 when not known)."""
        return sum(p.proc_cpu_seconds or 0.0 for p in self.profile.processes)

    @property
    def observer_share(self) -> tuple[float, float | None]:
        """(CPU seconds qprof ran beside the targets, that as a share of the targets' CPU seconds from
        /proc; None when theirs is not known)."""
        spent, targets = sum(self.observer_cpu_s.values()), self.targets_cpu_s
        return spent, (spent / targets if targets > 0 else None)


def verdict_of(analyses: list[Analysis]) -> Verdict | None:
    """One verdict over one run, or over runs recorded on different hosts (one side each)."""
    sides = [s for a in analyses for s in a.sides]
    records = [r for a in analyses for r in a.stack_records]
    return judge(sides, records) if sides else None


def analyse_run(run: Run, mappings: MappingSet, stack: str | None = None, visit: Visitor | None = None) -> Analysis:
    """`stack` forces one stack mapping file instead of auto-detection (`--stack`); `visit` sees every
    stack record with its decision during attribution (attribution.profile.Visitor)."""
    readings = list(run.proc_readings())
    profile = attribute(run, mappings, stack, readings, visit)
    info = run.meta
    pids = [t.pid for t in info.targets]
    probes = run.probes() or ProbeRecord()
    pio = analyse(probes, pids)
    comms = {t.pid: t.comm for t in info.targets}
    recs = recommend(pio, comms, {p.pid: p.mmsg_seen for p in profile.processes}) if pio is not None else []
    crypto = analyse_crypto(probes, pids, pio)
    tcp = analyse_tcp(run.tcp(), pids)
    host_cpus = info.host.cpus or 1
    procs = {p.pid: p for p in profile.processes}
    pids_seen = [t.pid for t in info.targets] + [p.pid for p in profile.processes if p.pid not in comms]
    transfers = {pid: transfer(pid, pio, tcp, procs[pid].packet_span_ns if pid in procs else None, readings)
                 for pid in pids_seen}
    threads = {t.pid: thread_view(working(readings, t.pid, transfers[t.pid])[0], t.pid, procs.get(t.pid),
                                  profile.seconds_per_period, transfers[t.pid].bytes, _datagrams(pio, t.pid))
               for t in info.targets}
    waits = probes.waits()
    wall = {t.pid: w for t in info.targets if (w := wall_clock(waits, t.pid, threads[t.pid])) is not None}
    rtts = round_trips(run.message_timing(), pids)
    sides = [ev for t in info.targets if t.role in ("server", "client")
             for ev in [side_evidence(readings, t.pid, t.role, t.comm, host_cpus, pio, info.host.cpu_nodes,
                                      probes.queues, transfers[t.pid], threads[t.pid], wall.get(t.pid))]
             if ev is not None]
    for ev in sides:
        ev.round_trip_ms = rtts[ev.pid].ms if ev.pid in rtts else None
    views = services(info, profile)
    for view in views:  # a service of many processes is also judged as one side
        mine = {m.pid for m in view.members}
        whole = service_evidence([ev for ev in sides if ev.pid in mine], view.service.name)
        if whole is not None:
            sides.append(whole)
    return Analysis(profile, pio, recs, crypto, sides, observer_cpu(info, probes), tcp, threads=threads,
                    transfers=transfers, wall=wall, round_trips=rtts, services=views)


def _datagrams(pio: PacketIO | None, pid: int) -> float | None:
    """Datagrams a process sent and received (None without probes)."""
    p = pio.processes.get(pid) if pio is not None else None
    return (p.tx.dgrams + p.rx.dgrams) or None if p is not None else None


def observer_cpu(info: Meta, probes: ProbeRecord) -> dict[str, float]:
    """CPU seconds qprof used while observing, everything it ran: its own process (readings,
    the live panel, folding's Python, writing), perf record, the folder (native or `perf script`), the probe
    loaders. The cost of the run that is not in the targets' samples (the probes' programs are:
    they run in the targets' context)."""
    out = {}
    if info.qprof_cpu_s is not None:
        out["qprof"] = info.qprof_cpu_s
    if info.parse is not None and info.parse.perf_script_cpu_s is not None:
        out[f"{info.parse.folder or 'perf script'} (folding)"] = info.parse.perf_script_cpu_s
    out.update({f"perf record ({mode})": s for mode, s in info.perf_cpu_s.items() if s is not None})
    out.update({f"probes {name}": p.cpu_s for name, p in probes.programs.items() if p.cpu_s is not None})
    if info.helpers_cpu_s is not None:  # the short ones: version checks, tc, bpftool, the cgroup helper
        named = sum(v for k, v in out.items() if k != "qprof")
        out["other helper programs"] = round(max(0.0, info.helpers_cpu_s - named), 3)
    return out
