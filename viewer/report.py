"""The report as every output shows it: one typed result, derived from the analysis, with its figures rounded once.

Why: the terminal, the JSON report, `qprof table` (text, CSV, chart) and
`qprof.load` must print the same figure for the same thing. The shares and CPU
seconds are rounded here, when the report is made from the analysis
(`report_of`); what the attribution already rounds where it is computed (a
transfer's goodput, a verdict's evidence, the packet counts) is kept as its
typed record. Every output renders this: viewer.json_report writes it as JSON,
viewer.rows flattens it into rows, viewer.terminal prints its figures.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Iterable, Mapping

from qprof.attribution.analysis import Analysis
from qprof.attribution.categories import CATEGORIES
from qprof.attribution.cryptocalls import Crypto
from qprof.attribution.mapping import MappingUse, stack_name
from qprof.attribution.packetio import PacketIO
from qprof.attribution.profile import PROBE_SHARE_LIMIT, Breakdown, EmptyTarget, ProcessProfile, Profile
from qprof.attribution.recommend import Recommendation
from qprof.attribution.rtt import RoundTrip
from qprof.attribution.skid import SkidSummary
from qprof.attribution.symbols import ObjectNaming, naming
from qprof.attribution.tcp import TcpIO
from qprof.attribution.threads import ThreadView
from qprof.attribution.timeline import Timeline
from qprof.attribution.transfer import Transfer
from qprof.attribution.verdict import Verdict
from qprof.attribution.waits import WallClock
from qprof.archive.model import Host, Sampling

PLACES = 6  # decimals of every share and CPU second in the report
GOODPUT_PLACES = 4  # decimals of a goodput in Gbit/s (as attribution.transfer's record writes it)


def rounded(x: float) -> float:
    return round(x, PLACES)


@dataclass(frozen=True)
class Symbol:
    """A leaf symbol's self time in one category."""

    symbol: str
    dso: str
    share: float
    cpu_seconds: float
    samples: int
    placed_by: tuple[tuple[str, float], ...]  # (mapping rule file:line, its share of the symbol's samples)


@dataclass(frozen=True)
class Figures:
    """A breakdown (a process, a thread, a service's sum) as every output shows it."""

    cpu_seconds: float
    samples: int
    categories: Mapping[str, float]  # share of its sampled CPU time, each of CATEGORIES
    category_cpu_seconds: Mapping[str, float]
    category_samples: Mapping[str, int]
    subcategories: Mapping[str, Mapping[str, float]]  # category -> subcategory -> share, largest first
    top_symbols: Mapping[str, tuple[Symbol, ...]]  # category -> its top symbols, largest first

    @classmethod
    def of(cls, b: Breakdown, profile: Profile, top: int) -> Figures:
        total = b.period or 1
        subs: dict[str, dict[str, float]] = {c: {} for c in CATEGORIES}
        for (cat, sub), per in sorted(b.subcategories.items(), key=lambda kv: -kv[1]):
            subs[cat][sub] = rounded(per / total)
        symbols: dict[str, list[Symbol]] = {c: [] for c in CATEGORIES}
        for (cat, sym, dso), per in b.symbols.most_common():
            if len(symbols[cat]) < top:
                symbols[cat].append(Symbol(sym, dso, rounded(per / total), rounded(profile.cpu_seconds(per)),
                                           b.symbol_samples[(cat, sym, dso)], tuple(b.placed((cat, sym, dso)))))
        return cls(rounded(profile.cpu_seconds(b.period)), b.samples,
                   {c: rounded(s) for c, s in b.shares().items()},
                   {c: rounded(profile.cpu_seconds(b.categories[c])) for c in CATEGORIES},
                   {c: b.category_samples[c] for c in CATEGORIES}, subs,
                   {c: tuple(s) for c, s in symbols.items()})


@dataclass(frozen=True)
class ThreadReport:
    tid: int
    comm: str
    figures: Figures


@dataclass(frozen=True)
class ProcessReport:
    """A process's figures, its cross-checks and what the analysis found of it (typed records)."""

    pid: int
    comm: str
    role: str | None
    figures: Figures
    proc_cpu_seconds: float | None
    cpu_note: str | None
    dso_only_share: float  # placed by object name alone
    dso_only_shares: Mapping[str, float]
    probe_share: float
    other_bpf_share: float
    mmsg_seen: tuple[str, ...]
    interrupt_skid: SkidSummary
    mappings: tuple[MappingUse, ...]  # the mapping files it was read with (attribution.profile)
    application: str | None
    threads: tuple[ThreadReport, ...]  # busiest first
    thread_view: ThreadView | None
    seconds_per_period: float  # for the thread view's CPU seconds
    transfer: Transfer | None
    wall_clock: WallClock | None
    round_trip: RoundTrip | None
    unnamed_share: float  # in no named function
    symbols: tuple[ObjectNaming, ...]  # how its objects' functions were named

    @property
    def probe_share_over_limit(self) -> bool:
        return self.probe_share > PROBE_SHARE_LIMIT

    @property
    def stack(self) -> str | None:
        """The QUIC stack(s) whose mapping file it was read with (auto-detected or --stack)."""
        return stack_name(self.mappings)

    @property
    def goodput_gbps(self) -> float | None:
        """Its goodput as its transfer's record shows it."""
        gbps = self.transfer.gbps if self.transfer is not None else None
        return None if gbps is None else round(gbps, GOODPUT_PLACES)


@dataclass(frozen=True)
class MemberReport:
    """A followed service's process."""

    pid: int
    comm: str
    joined_s: float | None
    exited: bool
    samples: int
    cpu_seconds: float
    categories: Mapping[str, float]


@dataclass(frozen=True)
class ServiceReport:
    name: str
    role: str | None
    unit: str | None
    members: tuple[MemberReport, ...]
    total: Figures


@dataclass(frozen=True)
class Unwinding:
    mode: str | None
    reason: str | None


@dataclass(frozen=True)
class RunInfo:
    """What the archive's meta.json says of the run, carried over unchanged."""

    path: str
    status: str
    incomplete_reason: str | None
    start_time: str | None
    duration_s: float | None
    stop_reason: str | None
    sampling: Sampling
    host: Host
    tools: Mapping[str, str | None]
    probes: tuple[str, ...]
    unwinding: Mapping[int, Unwinding]  # per target pid


@dataclass(frozen=True)
class Report:
    """One run's report: what `qprof report` prints, `--format json` writes and the rows flatten."""

    run: RunInfo
    processes: tuple[ProcessReport, ...]
    targets_without_samples: tuple[EmptyTarget, ...]
    services: tuple[ServiceReport, ...]
    packet_io: PacketIO | None
    tcp: TcpIO | None
    recommendations: tuple[Recommendation, ...]
    crypto: Crypto | None
    observer_cpu_s: Mapping[str, float]
    observer_share_of_targets: float | None
    timeline: Timeline | None
    analysis: Analysis  # what it was made from: the terminal's tables show more than the report's figures

    @functools.cached_property
    def verdict(self) -> Verdict | None:
        """This run's verdict, judged when an output asks for it (the terminal judges the runs it was given
        together: attribution.analysis.verdict_of)."""
        return self.analysis.verdict

    @property
    def goodput_gbps(self) -> float | None:
        """The run's goodput (the_goodput)."""
        return the_goodput((p.role, g) for p in self.processes if (g := p.goodput_gbps) is not None)


def the_goodput(sides: Iterable[tuple[str | None, float]]) -> float | None:
    """A run's goodput from its processes' (role, goodput): its client's (the receiving end of a
    download; the largest, if several), else the largest process's. The one rule for the report's
    runs and the table's."""
    sides = list(sides)
    client = [g for role, g in sides if role == "client"]
    return max(client or [g for _, g in sides], default=None)


def _process(p: ProcessProfile, analysis: Analysis, top: int) -> ProcessReport:
    profile = analysis.profile
    total = p.breakdown.period or 1
    return ProcessReport(
        p.pid, p.comm, p.role, Figures.of(p.breakdown, profile, top),
        None if p.proc_cpu_seconds is None else rounded(p.proc_cpu_seconds), p.cpu_note,
        rounded(p.decided_by_dso_only / total), {c: rounded(p.dso_only[c] / total) for c in CATEGORIES},
        rounded(p.probe_share), rounded(p.other_bpf_share), tuple(sorted(p.mmsg_seen)), p.skid, tuple(p.mappings),
        p.application,
        tuple(ThreadReport(t.tid, t.comm, Figures.of(t.breakdown, profile, min(top, 3)))
              for t in sorted(p.threads.values(), key=lambda t: -t.breakdown.period)),
        analysis.threads.get(p.pid), profile.seconds_per_period, analysis.transfers.get(p.pid),
        analysis.wall.get(p.pid), analysis.round_trips.get(p.pid), rounded(sum(p.unnamed.values()) / total),
        tuple(naming(p.leaf_objects, p.unnamed, profile.run.meta.symbols)))


def report_of(analysis: Analysis, top: int = 10, timeline: Timeline | None = None) -> Report:
    """The report of one analysed run: `top` symbols per category (3 per thread at most), with its
    timeline when one was built."""
    profile = analysis.profile
    info = profile.run.meta
    run = RunInfo(str(profile.run.path), info.status, info.incomplete_reason, info.start_time, info.duration_s,
                  info.stop_reason, info.sampling, info.host, info.tools, tuple(info.probes),
                  {t.pid: Unwinding(t.unwind, t.unwind_reason) for t in info.targets})
    services = tuple(
        ServiceReport(v.service.name, v.service.role, v.service.unit,
                      tuple(MemberReport(m.pid, m.comm, m.joined_s, m.exited, m.breakdown.samples,
                                         rounded(profile.cpu_seconds(m.breakdown.period)),
                                         {c: rounded(x) for c, x in m.breakdown.shares().items()})
                            for m in v.members),
                      Figures.of(v.total, profile, top)) for v in analysis.services)
    share = analysis.observer_share[1]
    return Report(run, tuple(_process(p, analysis, top) for p in profile.processes),
                  tuple(profile.empty_targets), services, analysis.packet_io, analysis.tcp,
                  tuple(analysis.recommendations), analysis.crypto,
                  {k: rounded(v) for k, v in analysis.observer_cpu_s.items()},
                  None if share is None else rounded(share), timeline, analysis)
