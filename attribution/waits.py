"""Where each thread's wall-clock time went: on a CPU (by category), runnable, or waiting, and for what.

On-CPU samples explain the time a thread ran; when no CPU is full, what binds a
transfer is in the time its threads did not run. The `waits` probe group
(probes/waits) follows every context switch of the targets' threads and keeps,
per thread and exactly, the nanoseconds it was on a CPU, runnable (woken or
preempted, waiting for a CPU), and blocked, by what ended the wait: the
network (woken from packet receive), a timer (pacing, loss-recovery and poll
timeouts, sleeps), another thread of its process (futex, condition variable,
eventfd: handoffs in a runtime), disk, or other. Stacks are sampled at the
block, so a kind's seconds are split over its call paths by the sampled
shares, scaled to the exact total.

The on-CPU part is split over the five categories by the thread's own samples;
a thread with no sample keeps its on-CPU time as one unsplit part. A pool's
split is the sum of its threads' (attribution.threads' pools), the process's
the sum of all. Shares are of the summed window: for a pool of eight mostly
idle threads, "waiting" is the idle threads' time, which is why the verdict
reads the thread or pool that did the work, never the process's shares.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from qprof.attribution.categories import CATEGORIES
from qprof.attribution.profile import Breakdown
from qprof.attribution.threads import ThreadView
from qprof.jsonvalue import JsonObject
from qprof.probes.waits.maps import STATES as STATES, WaitMaps

ON_CPU, RUNNABLE = "on_cpu", "runnable"
WAIT_KINDS: tuple[str, ...] = tuple(s for s in STATES if s not in (ON_CPU, RUNNABLE))
LABELS = {ON_CPU: "on a CPU", RUNNABLE: "runnable (waiting for a CPU)", "network": "waiting: network",
          "timer": "waiting: timer", "thread": "waiting: another thread", "disk": "waiting: disk",
          "other": "waiting: other"}
# The split of a thread must add up to its window within this share: what the probe dropped (a
# thread's state unknown from its start) shows as a gap.
CLOSURE = 0.02
EXTERNAL_WAITS = 0.10  # waits on anything but its own threads: this share of them names what it waited for


@dataclass(frozen=True)
class WallSplit:
    """Seconds per state over a window; the on-CPU part also per category (from the samples)."""

    window_s: float
    seconds: dict[str, float]  # every state of STATES
    on_cpu_categories: dict[str, float] = field(default_factory=dict)  # category -> seconds; {} when unsampled
    unknown_s: float = 0.0  # time whose state the probe could not see (counted in `other` or on_cpu)

    def share(self, state: str) -> float:
        return self.seconds.get(state, 0.0) / self.window_s if self.window_s > 0 else 0.0

    @property
    def waited_for(self) -> str | None:
        """What it waited for from outside: waits on another of its own threads are a runtime's handoffs
        (Go's Ms park on a futex until the thread that polls the network wakes them), so the longest of
        the other kinds names it, unless they are under EXTERNAL_WAITS of its waits (then its own input:
        another thread). None when it never blocked."""
        waits = {k: self.seconds[k] for k in WAIT_KINDS}
        total = sum(waits.values())
        if total <= 0:
            return None
        outside = {k: v for k, v in waits.items() if k != "thread"}
        if sum(outside.values()) >= EXTERNAL_WAITS * total:
            return max(outside, key=lambda k: outside[k])
        return "thread"

    @staticmethod
    def total(splits: list["WallSplit"]) -> "WallSplit":
        cats: dict[str, float] = {}
        for s in splits:
            for c, v in s.on_cpu_categories.items():
                cats[c] = cats.get(c, 0.0) + v
        return WallSplit(sum(s.window_s for s in splits),
                         {k: sum(s.seconds[k] for s in splits) for k in STATES}, cats,
                         sum(s.unknown_s for s in splits))

    def to_json(self) -> JsonObject:
        def r(x: float) -> float:
            return round(x, 6)
        return {"window_s": r(self.window_s), "seconds": {k: r(v) for k, v in self.seconds.items()},
                "shares": {k: r(self.share(k)) for k in STATES},
                "on_cpu_categories": {c: r(v) for c, v in self.on_cpu_categories.items()},
                "unknown_s": r(self.unknown_s)}


@dataclass(frozen=True)
class ThreadWall:
    tid: int
    comm: str
    pool: str
    split: WallSplit


@dataclass(frozen=True)
class PoolWall:
    name: str
    threads: tuple[ThreadWall, ...]
    split: WallSplit


@dataclass(frozen=True)
class WallClock:
    """One process's wall-clock accounting over the probe's span."""

    pid: int
    span_s: float
    threads: tuple[ThreadWall, ...]  # by on-CPU time, the most first
    pools: tuple[PoolWall, ...]  # likewise
    total: WallSplit
    stacks: dict[str, dict[str, float]]  # kind -> folded call path -> seconds (scaled to the kind's exact total)
    stack_interval_ms: float | None = None

    def thread(self, tid: int) -> ThreadWall | None:
        return next((t for t in self.threads if t.tid == tid), None)

    def pool_of(self, tid: int) -> PoolWall | None:
        return next((p for p in self.pools if any(t.tid == tid for t in p.threads)), None)

    @property
    def closure(self) -> float:
        """The largest gap between a thread's states and its window, as a share of the window."""
        gaps = [abs(sum(t.split.seconds.values()) - t.split.window_s) / t.split.window_s
                for t in self.threads if t.split.window_s > 0]
        return max(gaps, default=0.0)

    def to_json(self) -> JsonObject:
        return {"span_s": round(self.span_s, 6), "states": list(STATES),
                "total": self.total.to_json(),
                "pools": [{"name": p.name, "tids": [t.tid for t in p.threads], **p.split.to_json()}
                          for p in self.pools],
                "threads": [{"tid": t.tid, "comm": t.comm, "pool": t.pool, **t.split.to_json()}
                            for t in self.threads],
                "stacks": {k: {s: round(v, 6) for s, v in sorted(st.items(), key=lambda kv: -kv[1])}
                           for k, st in self.stacks.items()},
                "stack_interval_ms": self.stack_interval_ms}


def _on_cpu_categories(on_cpu_s: float, b: Breakdown | None) -> dict[str, float]:
    if b is None or not b.period:
        return {}
    shares = b.shares()
    return {c: on_cpu_s * shares[c] for c in CATEGORIES}


def wall_clock(waits: WaitMaps, pid: int, view: ThreadView | None) -> WallClock | None:
    """`pid`'s accounting from the probe's maps, its threads grouped into the thread view's pools (and
    their samples splitting the on-CPU part); None when the probe followed none of its threads."""
    mine = [t for t in waits.threads.values() if t.pid == pid]
    if not mine:
        return None
    rows = {r.stat.tid: r for r in view.threads} if view is not None else {}
    threads = []
    for t in mine:
        secs = {k: t.ns.get(k, 0) / 1e9 for k in STATES}
        window = sum(secs.values())
        if window <= 0:
            continue
        row = rows.get(t.tid)
        split = WallSplit(window, secs, _on_cpu_categories(secs[ON_CPU], row.breakdown if row else None),
                          t.unknown_ns / 1e9)
        threads.append(ThreadWall(t.tid, t.comm or (row.stat.comm if row else str(t.tid)),
                                  row.pool if row else (t.comm or str(t.tid)), split))
    if not threads:
        return None
    threads.sort(key=lambda t: (-t.split.seconds[ON_CPU], t.tid))
    by_pool: dict[str, list[ThreadWall]] = {}
    for th in threads:
        by_pool.setdefault(th.pool, []).append(th)
    pools = sorted((PoolWall(name, tuple(ts), WallSplit.total([t.split for t in ts])) for name, ts in by_pool.items()),
                   key=lambda p: -p.split.seconds[ON_CPU])
    total = WallSplit.total([t.split for t in threads])
    stacks: dict[str, dict[str, float]] = {}
    for (spid, kind), paths in waits.stacks.items():
        sampled = sum(paths.values())
        if spid != pid or kind not in WAIT_KINDS or sampled <= 0:
            continue
        scale = total.seconds[kind] / sampled  # sampled ns -> the kind's exact seconds
        stacks[kind] = {path: ns * scale for path, ns in paths.items()}
    span = (waits.span_ns[1] - waits.span_ns[0]) / 1e9 if waits.span_ns else max(t.split.window_s for t in threads)
    return WallClock(pid, span, tuple(threads), tuple(pools), total, stacks, waits.stack_interval_ms)
