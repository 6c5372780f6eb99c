"""Aggregate a run's stacks into per-process and per-thread category breakdowns.

Weights are sample periods (CPU nanoseconds with cpu-clock), so a sample taken
after a long gap counts for the time it stands for. Mappings are chosen per
process from what it runs (its objects and symbols), so two endpoints with
different stacks in one run are each read with their own files.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from qprof.attribution import handoff, symbols
from qprof.attribution.application import application_rule
from qprof.attribution.categories import CATEGORIES, HANDOFF, OTHER_BPF, PACKET_IO, PROBE_COST
from qprof.attribution.engine import Classifier, Decision
from qprof.attribution.mapping import MappingSet, MappingUse
from qprof.attribution.pools import PoolMatcher
from qprof.attribution.skid import SkidSplitter, SkidSummary
from qprof.archive import Run
from qprof.archive.model import ProcReading, Sampling
from qprof.archive.stacks import StackRecord
from qprof.jsonvalue import JsonObject

# Called with every stack record and the engine's decision for it, in the same pass that aggregates:
# how views that need more than the totals (flame graphs) see exactly what the report counted.
Visitor = Callable[[StackRecord, Decision], None]

NS_EVENTS = ("cpu-clock", "task-clock")
# the share of probe frames past which the report warns
PROBE_SHARE_LIMIT = 0.02
# Batching system calls, as their kernel entry points show in samples: evidence that a process uses
# sendmmsg/recvmmsg even when the opt-in syscall probes (which count calls) are off.
_MMSG_ENTRIES = {"sendmmsg": {"__x64_sys_sendmmsg", "__sys_sendmmsg", "__do_sys_sendmmsg"},
                 "recvmmsg": {"__x64_sys_recvmmsg", "__sys_recvmmsg", "do_recvmmsg", "__do_sys_recvmmsg"}}


@dataclass
class Breakdown:
    """Period per category, subcategory and leaf symbol for one process or thread."""

    period: int = 0
    samples: int = 0
    categories: Counter[str] = field(default_factory=Counter)
    subcategories: Counter[tuple[str, str]] = field(default_factory=Counter)
    symbols: Counter[tuple[str, str, str]] = field(default_factory=Counter)  # (category, symbol, dso)
    # sample counts beside the periods: how much evidence a share rests on
    category_samples: Counter[str] = field(default_factory=Counter)
    symbol_samples: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    # per leaf symbol key, period per rule that placed it ("mapping file:line"), where the caller says
    placed_by: defaultdict[tuple[str, str, str], Counter[str]] = field(default_factory=lambda: defaultdict(Counter))

    def add(self, category: str, sub: str | None, leaf: tuple[str, str], samples: int, period: int,
            placed: str | None = None) -> None:
        self.period += period
        self.samples += samples
        self.categories[category] += period
        self.category_samples[category] += samples
        if sub:
            self.subcategories[(category, sub)] += period
        self.symbols[(category, leaf[0], leaf[1])] += period
        self.symbol_samples[(category, leaf[0], leaf[1])] += samples
        if placed is not None:
            self.placed_by[(category, leaf[0], leaf[1])][placed] += period

    def merge(self, other: "Breakdown") -> None:
        """Add another breakdown's counts (a pool's threads into the pool)."""
        self.period += other.period
        self.samples += other.samples
        self.categories.update(other.categories)
        self.subcategories.update(other.subcategories)
        self.symbols.update(other.symbols)
        self.category_samples.update(other.category_samples)
        self.symbol_samples.update(other.symbol_samples)
        for key, rules in other.placed_by.items():
            self.placed_by[key].update(rules)

    def placed(self, key: tuple[str, str, str]) -> list[tuple[str, float]]:
        """What placed a leaf symbol's time in its category, most first: each rule (mapping file:line)
        with its share of that symbol's time (a caller's `within` rule can place one leaf two ways)."""
        rules = self.placed_by.get(key, Counter())
        total = sum(rules.values()) or 1
        return [(rule, round(per / total, 4)) for rule, per in sorted(rules.items(), key=lambda rp: (-rp[1], rp[0]))]

    def shares(self) -> dict[str, float]:
        if self.period == 0:
            return {c: 0.0 for c in CATEGORIES}
        return {c: self.categories[c] / self.period for c in CATEGORIES}


@dataclass
class ThreadProfile:
    tid: int
    comm: str
    breakdown: Breakdown = field(default_factory=Breakdown)
    pools: Counter[str] = field(default_factory=Counter)  # period per pool its samples ran in (attribution.pools)


@dataclass
class ProcessProfile:
    pid: int
    comm: str
    role: str | None
    breakdown: Breakdown = field(default_factory=Breakdown)
    threads: dict[int, ThreadProfile] = field(default_factory=dict)
    mappings: list[MappingUse] = field(default_factory=list)
    dso_only: Counter[str] = field(default_factory=Counter)  # period per category decided by rules naming only an object
    mmsg_seen: set[str] = field(default_factory=set)  # "sendmmsg"/"recvmmsg" kernel entry points in its stacks
    proc_cpu_seconds: float | None = None  # from /proc between its first and last reading, a cross-check
    proc_span_s: float | None = None  # how far apart those readings are
    cpu_note: str | None = None  # why sampled CPU falls short of /proc's, when it does beyond chance
    skid: SkidSummary = field(default_factory=SkidSummary)  # interrupt skid per vector
    application: str | None = None  # what names the process's own code (attribution.application)
    handoffs: Counter[str] = field(default_factory=Counter)  # period per handoff kind (attribution.handoff)
    pool_notes: dict[str, str] = field(default_factory=dict)  # pool name -> its mapping's note
    monitor_pools: frozenset[str] = frozenset()  # pools whose threads run none of its work (mapping.Pool.works)
    leaf_objects: Counter[str] = field(default_factory=Counter)  # period per object its samples were taken in
    unnamed: Counter[str] = field(default_factory=Counter)  # ... of which in no named function (attribution.symbols)
    sample_span_ns: tuple[int, int] | None = None  # its first and last sample (archives with sample times)
    packet_span_ns: tuple[int, int] | None = None  # ... in a send or receive path: its transfer (attribution.transfer)

    @property
    def decided_by_dso_only(self) -> int:
        """Period placed by object name alone (stripped libraries: their functions have no names)."""
        return sum(self.dso_only.values())

    @property
    def probe_share(self) -> float:
        """Share of its sampled CPU time spent in eBPF probes (tracepoint and uprobe programs, the
        kinds qprof attaches): what observing it cost it, and so how far every other share is off."""
        return self._share(PROBE_COST)

    @property
    def other_bpf_share(self) -> float:
        """Share spent in eBPF programs qprof cannot have attached (kprobes, trampolines): a cost the
        target pays with or without qprof, which a user should know is there. Counted in whatever
        category placed it (the send path's Packet I/O for a program on udp_send_skb: engine), so
        summed over all of them."""
        return self._share(OTHER_BPF)

    def _share(self, sub: str) -> float:
        """Share of its samples under subcategory `sub`, whichever category holds them (probe frames
        are Uncategorized only; other eBPF programs go where a caller places them)."""
        b = self.breakdown
        return sum(b.subcategories[(c, sub)] for c in CATEGORIES) / b.period if b.period else 0.0


@dataclass(frozen=True)
class EmptyTarget:
    """A target that was not sampled once (idle, or exited before sampling began)."""

    pid: int
    comm: str

    def to_json(self) -> JsonObject:
        return {"pid": self.pid, "comm": self.comm}


@dataclass
class Profile:
    run: Run
    processes: list[ProcessProfile]
    seconds_per_period: float  # multiply a period sum to get CPU seconds
    empty_targets: list["EmptyTarget"]  # targets with no samples
    classifiers: dict[int, Classifier] = field(default_factory=dict)  # per pid: what decided its samples

    def cpu_seconds(self, period: int) -> float:
        return period * self.seconds_per_period


# Packet I/O that moves no payload: waiting for packets, and switching threads while waiting
_WAITING = {"poll", "scheduler", HANDOFF}


def _widen(span: tuple[int, int] | None, other: tuple[int, int]) -> tuple[int, int]:
    return other if span is None else (min(span[0], other[0]), max(span[1], other[1]))


def _seconds_per_period(sampling: Sampling) -> float:
    if sampling.event in NS_EVENTS:
        return 1e-9
    # other events count something else per period (cycles...): fall back to 1/frequency per sample
    return 0.0


def cpu_shortfall_note(sampled_s: float, samples: int, proc_s: float | None, scope: str) -> str | None:
    """A note when the samples account for less CPU than /proc measured beyond sampling error.

    The /proc window lies inside the sampling window, so chance alone (a count of n samples is
    off by about sqrt(n)) explains a shortfall up to 3/sqrt(n); a larger one is samples missing.
    System-wide cpu-clock sampling misses work that starts when a process wakes on a timer: the
    sampling timer's interrupt wakes it, or sampling resumes on a CPU leaving idle, so the sample
    lands just before the burst (measured here: -42% on a loop of 50 us runs between 50 us
    sleeps; the ngtcp2 server of the demo's transfer -19% to +3%, 6 of 13 runs short beyond
    chance). Sampling a cgroup follows the target's own CPU time instead."""
    if proc_s is None or proc_s <= 0 or samples <= 0 or sampled_s >= proc_s * (1 - 3 / samples ** 0.5):
        return None
    note = (f"samples account for {sampled_s:.2f} s of the {proc_s:.2f} s /proc measured "
            f"({sampled_s / proc_s - 1:+.0%}, beyond the {3 / samples ** 0.5:.0%} sampling error): samples were missed")
    if scope == "system":
        note += ("; system-wide sampling misses work that starts when a process wakes on a timer: "
                 "`--scope cgroup` samples each target's own CPU time")
    return note


def _proc_cpu(readings: list[ProcReading], pid: int) -> tuple[float | None, float | None]:
    """(CPU seconds between the process's first and last reading, how far apart they are)."""
    first: dict[int, float] = {}
    last: dict[int, float] = {}
    seen = [r.mono for r in readings if r.threads.get(pid)]
    for r in readings:
        for t in r.threads.get(pid, []):
            cpu = t.utime_s + t.stime_s
            first.setdefault(t.tid, cpu)
            last[t.tid] = cpu
    if not last:
        return None, None
    return sum(last[t] - first[t] for t in last), seen[-1] - seen[0]


def _placed(d: Decision) -> str:
    """The rule that decided, as its mapping file's name and line; no rule: Uncategorized by default."""
    if d.rule is None:
        return "no rule (uncategorized)"
    return Path(d.rule.source).name


def attribute(run: Run, mappings: MappingSet, stack: str | None = None,
              readings: list[ProcReading] | None = None, visit: Visitor | None = None) -> Profile:
    """Classify every folded stack of the run and aggregate per process and thread.

    `readings`: the run's /proc readings when the caller has them already.
    `visit`: called with each stack record and its decision (see Visitor)."""
    if readings is None:
        readings = list(run.proc_readings())
    info = run.meta
    targets = {t.pid: t for t in info.targets}
    # Pass 1: what each process runs, to pick its mapping files.
    dsos: dict[int, set[str]] = defaultdict(set)
    syms: dict[int, set[str]] = defaultdict(set)
    for pid, t in targets.items():
        dsos[pid].update(o.path for o in t.objects)
    for rec in run.stacks():
        for sym, dso in rec.frames:
            dsos[rec.pid].add(dso)
            syms[rec.pid].add(sym)
    classifiers: dict[tuple[str, ...], Classifier] = {}
    procs: dict[int, ProcessProfile] = {}
    per_pid_classifier: dict[int, Classifier] = {}
    per_pid_pools: dict[int, PoolMatcher] = {}
    for pid in sorted(set(dsos) | set(targets)):
        target = targets.get(pid)
        go_binary = next((o.path for o in (target.objects if target else ()) if o.go), None)
        chosen = mappings.for_process(dsos[pid], syms[pid], stack, go_binary)
        files = [f for f, _ in chosen]
        app = application_rule(target, (f.name for f in files), syms[pid])
        key = (*(f.path for f in files), app.source if app else "")
        clf = classifiers.get(key) or classifiers.setdefault(key, Classifier(files, [app] if app else []))
        per_pid_classifier[pid] = clf
        pools = [pool for f in files for pool in f.pools]
        per_pid_pools[pid] = PoolMatcher(pools)
        procs[pid] = ProcessProfile(pid, target.comm if target else "?", target.role if target else None,
                                    mappings=[f.use(why) for f, why in chosen],
                                    mmsg_seen={name for name, entry in _MMSG_ENTRIES.items() if entry & syms[pid]},
                                    application=app.source if app else None,
                                    pool_notes={pool.name: pool.note for pool in pools},
                                    monitor_pools=frozenset(pool.name for pool in pools if not pool.works))
    # Pass 2: classify and aggregate; interrupt skid waits for every sample of what interrupts ran.
    skid = SkidSplitter()

    def add(rec: StackRecord, d: Decision) -> None:
        proc = procs[rec.pid]
        if visit is not None:
            visit(rec, d)
        leaf = rec.frames[0] if rec.frames else ("[no stack]", "[unknown]")
        proc.breakdown.add(d.category, d.subcategory, leaf, rec.samples, rec.period, _placed(d))
        th = proc.threads.get(rec.tid) or proc.threads.setdefault(rec.tid, ThreadProfile(rec.tid, rec.comm))
        th.comm = rec.comm
        th.breakdown.add(d.category, d.subcategory, leaf, rec.samples, rec.period)
        pool = per_pid_pools[rec.pid].match(rec.frames)
        if pool is not None:
            th.pools[pool] += rec.period
        kind = handoff.kind(rec.frames)
        if kind is not None:
            proc.handoffs[kind] += rec.period
        proc.leaf_objects[leaf[1]] += rec.period
        if not symbols.named(*leaf):
            proc.unnamed[leaf[1]] += rec.period
        if rec.span_ns is not None:
            proc.sample_span_ns = _widen(proc.sample_span_ns, rec.span_ns)
            if d.category == PACKET_IO and d.subcategory not in _WAITING:
                proc.packet_span_ns = _widen(proc.packet_span_ns, rec.span_ns)
        if d.rule is not None and d.rule.symbol is None and d.rule.within is None and d.rule.dso is not None:
            proc.dso_only[d.category] += rec.period

    for rec in run.stacks():
        proc = procs[rec.pid]
        if proc.comm == "?":
            proc.comm = rec.comm
        clf = per_pid_classifier[rec.pid]
        d = clf.classify(rec.frames)
        if not skid.offer(clf, rec, d):
            add(rec, d)
    for rec, d in skid.resolve():
        add(rec, d)
    for p in procs.values():
        p.skid = skid.summary(p.pid, p.breakdown.period)
    spp = _seconds_per_period(info.sampling)
    freq = info.sampling.frequency or 1
    sampled, empty = [], []
    for p in procs.values():
        if p.breakdown.samples == 0:
            if p.pid in targets:
                empty.append(EmptyTarget(p.pid, p.comm))
            continue
        p.proc_cpu_seconds, p.proc_span_s = _proc_cpu(readings, p.pid)
        sampled.append(p)
    for p in sampled:
        if spp:
            p.cpu_note = cpu_shortfall_note(p.breakdown.period * spp, p.breakdown.samples, p.proc_cpu_seconds,
                                            info.sampling.scope_mode)
    if spp == 0.0:  # non-time event: approximate CPU time by samples / frequency
        total_p = sum(p.breakdown.period for p in sampled) or 1
        total_s = sum(p.breakdown.samples for p in sampled)
        spp = total_s / freq / total_p
    return Profile(run, sampled, spp, empty, per_pid_classifier)
