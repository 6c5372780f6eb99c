"""A process's threads, grouped the way its runtime runs them, with what /proc and the samples say of each.

Why pools: a multi-threaded runtime moves its work between OS threads
(goroutines between Go's Ms, tasks between tokio's workers by stealing), so one
thread's figures describe a share of a pool, not a part of the program. Threads
are grouped by the frames their stacks run through (`[[pool]]` tables of the
mapping files: attribution.pools), else by name (`quic_worker3` joins
`quic_worker1` as `quic_worker*`).

Per thread, over the readings the process is judged over (attribution.transfer.working:
its transfer's, as the verdict's): CPU and run-queue time from schedstat (precise, not ticks),
voluntary switches (it blocked: someone had to wake it) and involuntary ones
(preempted while it could run), from /proc status; its categories from the
samples. Per process: its parallelism (cores used per reading interval, mean
and peak), the runtime's own work (the "runtime: ..." and "thread handoff"
subcategories) and the handoffs between its threads (attribution.handoff) per
GB moved and per datagram. "Busiest" is one thing everywhere in a report: the
thread with the most on-CPU time in schedstat over the window (`busiest`).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable

from qprof.attribution.categories import HANDOFF, RUNTIME, UNCATEGORIZED
from qprof.attribution.handoff import KINDS
from qprof.attribution.profile import Breakdown, ProcessProfile, ThreadProfile
from qprof.archive.model import ProcReading, ThreadReading
from qprof.jsonvalue import JsonObject

_NUMBERED = re.compile(r"^(.*?)[-_#.:]?\d+$")  # a name with a trailing number: one of a numbered set


@dataclass(frozen=True)
class ThreadStat:
    """One thread over a window, from /proc (None where this kernel or archive lacks the figure)."""

    tid: int
    comm: str
    on_cpu_s: float | None
    run_delay_s: float | None
    voluntary: int | None
    involuntary: int | None
    cpus: tuple[int, ...] = ()  # CPUs it was seen on at the readings


@dataclass(frozen=True)
class Window:
    """The readings in which a process appears: its span, and each thread's change over it."""

    seconds: float
    threads: tuple[ThreadStat, ...]
    cores: tuple[float, ...]  # cores on a CPU in each interval between two readings

    @property
    def cores_mean(self) -> float | None:
        total = [t.on_cpu_s for t in self.threads if t.on_cpu_s is not None]
        return sum(total) / self.seconds if total and self.seconds > 0 else None

    @property
    def cores_peak(self) -> float | None:
        return max(self.cores) if self.cores else None


def _delta(a: float | int | None, b: float | int | None) -> Any:
    return None if a is None or b is None else max(b - a, 0)


def window(readings: list[ProcReading], pid: int) -> Window:
    """`pid`'s threads over the readings it appears in (first and last reading of each thread)."""
    rs = [r for r in readings if r.threads.get(pid)]
    if len(rs) < 2:
        return Window(0.0, (), ())
    first: dict[int, ThreadReading] = {}
    last: dict[int, ThreadReading] = {}
    cpus: dict[int, set[int]] = {}
    for r in rs:
        for t in r.threads[pid]:
            first.setdefault(t.tid, t)
            last[t.tid] = t
            if t.cpu >= 0:
                cpus.setdefault(t.tid, set()).add(t.cpu)
    stats = tuple(ThreadStat(tid, t1.comm, _delta(first[tid].on_cpu_s, t1.on_cpu_s),
                             _delta(first[tid].run_delay_s, t1.run_delay_s),
                             _delta(first[tid].voluntary, t1.voluntary), _delta(first[tid].involuntary, t1.involuntary),
                             tuple(sorted(cpus.get(tid, ()))))
                  for tid, t1 in last.items())
    cores = []
    for a, b in zip(rs, rs[1:]):
        dt = b.mono - a.mono
        before = {t.tid: t.on_cpu_s for t in a.threads[pid] if t.on_cpu_s is not None}
        used = [t.on_cpu_s - before[t.tid] for t in b.threads[pid] if t.on_cpu_s is not None and t.tid in before]
        if dt > 0 and used:
            cores.append(max(sum(used), 0.0) / dt)
    return Window(rs[-1].mono - rs[0].mono, stats, tuple(cores))


def busiest(w: Window) -> ThreadStat | None:
    """The thread with the most on-CPU time over the window (ties: the lower tid)."""
    known = [t for t in w.threads if t.on_cpu_s is not None]
    return min(known, key=lambda t: (-(t.on_cpu_s or 0.0), t.tid)) if known else None


@dataclass
class ThreadRow:
    stat: ThreadStat
    pool: str
    breakdown: Breakdown  # its samples (empty when none fell in it)


@dataclass
class Pool:
    """Threads that run the same work interchangeably, summed."""

    name: str
    note: str
    threads: list[ThreadRow]
    breakdown: Breakdown = field(default_factory=Breakdown)
    works: bool = True  # false: a runtime's monitor, which runs none of the program's work (mapping.Pool.works)

    def _sum(self, attr: str) -> float | None:
        return _sum_known(getattr(t.stat, attr) for t in self.threads)

    @property
    def on_cpu_s(self) -> float | None:
        return self._sum("on_cpu_s")

    @property
    def run_delay_s(self) -> float | None:
        return self._sum("run_delay_s")

    @property
    def voluntary(self) -> int | None:
        n = self._sum("voluntary")
        return None if n is None else int(n)

    @property
    def involuntary(self) -> int | None:
        n = self._sum("involuntary")
        return None if n is None else int(n)


@dataclass
class Handoffs:
    """What moving work between its own threads cost a process."""

    cpu_s: dict[str, float]  # handoff kind -> CPU seconds, from the samples
    share: float  # of its sampled CPU time
    voluntary: int | None  # switches over the window: sleeps, each ended by a wakeup
    involuntary: int | None
    gb_moved: float | None  # payload bytes it sent or received (the larger), in GB
    datagrams: float | None  # datagrams it sent and received

    @property
    def cpu_s_per_gb(self) -> float | None:
        return sum(self.cpu_s.values()) / self.gb_moved if self.gb_moved else None

    @property
    def wakeups_per_datagram(self) -> float | None:
        return self.voluntary / self.datagrams if self.voluntary is not None and self.datagrams else None


@dataclass
class ThreadView:
    pid: int
    window_s: float
    threads: list[ThreadRow]  # by on-CPU time, busiest first
    pools: list[Pool]  # by on-CPU time
    runtime: dict[str, float]  # the runtime's own named work and handoffs: subcategory -> share of its CPU
    handoffs: Handoffs
    cores_mean: float | None
    cores_peak: float | None

    @property
    def busiest(self) -> ThreadRow | None:
        return self.threads[0] if self.threads and self.threads[0].stat.on_cpu_s is not None else None

    def pool_of(self, tid: int) -> Pool | None:
        return next((p for p in self.pools if any(t.stat.tid == tid for t in p.threads)), None)

    def to_json(self, seconds_per_period: float) -> JsonObject:
        def r(x: float | None, n: int = 4) -> float | None:
            return None if x is None else round(x, n)

        def thread(t: ThreadRow) -> JsonObject:
            s = t.stat
            return {"tid": s.tid, "comm": s.comm, "pool": t.pool, "on_cpu_s": r(s.on_cpu_s),
                    "run_delay_s": r(s.run_delay_s), "voluntary_switches": s.voluntary,
                    "involuntary_switches": s.involuntary, "cpus": list(s.cpus),
                    "sampled_cpu_s": r(t.breakdown.period * seconds_per_period),
                    "categories": {c: r(v) for c, v in t.breakdown.shares().items()} if t.breakdown.period else None}

        h = self.handoffs
        b = self.busiest
        return {"window_s": r(self.window_s, 3), "busiest_tid": b.stat.tid if b else None,
                "cores_mean": r(self.cores_mean), "cores_peak": r(self.cores_peak),
                "pools": [{"name": p.name, "note": p.note, "threads": len(p.threads), "tids": [t.stat.tid for t in p.threads],
                           "on_cpu_s": r(p.on_cpu_s), "run_delay_s": r(p.run_delay_s),
                           "voluntary_switches": p.voluntary, "involuntary_switches": p.involuntary,
                           "categories": {c: r(v) for c, v in p.breakdown.shares().items()} if p.breakdown.period else None}
                          for p in self.pools],
                "threads": [thread(t) for t in self.threads],
                "runtime": {k: r(v, 6) for k, v in self.runtime.items()},
                "handoffs": {"cpu_s": {k: r(v) for k, v in h.cpu_s.items()}, "share": r(h.share, 6),
                             "cpu_s_per_gb": r(h.cpu_s_per_gb), "voluntary_switches": h.voluntary,
                             "involuntary_switches": h.involuntary,
                             "wakeups_per_datagram": r(h.wakeups_per_datagram)}}


def _name_pool(comm: str, same_stem: Counter[str]) -> str:
    """A thread no [[pool]] names: its name, or `stem*` when several share a numbered name."""
    m = _NUMBERED.match(comm)
    return f"{m.group(1)}*" if m and m.group(1) and same_stem[m.group(1)] > 1 else comm


def thread_view(readings: list[ProcReading], pid: int, proc: ProcessProfile | None, seconds_per_period: float,
                bytes_moved: int | None = None, datagrams: float | None = None) -> ThreadView:
    """The thread view of `pid`: /proc figures per thread over its window, samples per thread and pool.
    `bytes_moved`: payload it sent or received (the larger); `datagrams`: sent plus received."""
    w = window(readings, pid)
    sampled: dict[int, ThreadProfile] = dict(proc.threads) if proc is not None else {}
    stats = {t.tid: t for t in w.threads}
    for tid, th in sampled.items():  # a thread seen only in the samples (born and gone between readings)
        stats.setdefault(tid, ThreadStat(tid, th.comm, None, None, None, None))
    stems = Counter(m.group(1) for t in stats.values() if (m := _NUMBERED.match(t.comm)) and m.group(1))
    rows = []
    for tid, st in stats.items():
        seen = sampled.get(tid)
        pool = seen.pools.most_common(1)[0][0] if seen is not None and seen.pools else _name_pool(st.comm, stems)
        rows.append(ThreadRow(st, pool, seen.breakdown if seen is not None else Breakdown()))
    rows.sort(key=lambda t: (-(t.stat.on_cpu_s if t.stat.on_cpu_s is not None else -1.0),
                             -t.breakdown.period, t.stat.tid))
    notes = proc.pool_notes if proc is not None else {}
    monitors = proc.monitor_pools if proc is not None else frozenset()
    pools: dict[str, Pool] = {}
    for row in rows:
        p = pools.setdefault(row.pool, Pool(row.pool, notes.get(row.pool, ""), [], works=row.pool not in monitors))
        p.threads.append(row)
        p.breakdown.merge(row.breakdown)
    b = proc.breakdown if proc is not None else Breakdown()
    total = b.period or 1
    runtime = {sub: per / total for (cat, sub), per in b.subcategories.most_common()
               if cat == UNCATEGORIZED and (sub.startswith(RUNTIME) or sub == HANDOFF)}
    hand = proc.handoffs if proc is not None else Counter()
    handoffs = Handoffs({k: hand[k] * seconds_per_period for k in KINDS if hand[k]}, sum(hand.values()) / total,
                        _count(t.voluntary for t in w.threads), _count(t.involuntary for t in w.threads),
                        bytes_moved / 1e9 if bytes_moved else None, datagrams)
    ordered = sorted(pools.values(), key=lambda p: -(p.on_cpu_s or 0.0))
    return ThreadView(pid, w.seconds, rows, ordered, runtime, handoffs, w.cores_mean, w.cores_peak)


def _count(values: Iterable[int | None]) -> int | None:
    """The sum of the counts that are known; None when none is."""
    vals = [v for v in values if v is not None]
    return sum(vals) if vals else None


def _sum_known(values: Iterable[float | None]) -> float | None:
    """The sum of the figures that are known; None when none is."""
    vals = [v for v in values if v is not None]
    return sum(vals) if vals else None
