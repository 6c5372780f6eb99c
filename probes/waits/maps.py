"""What the waits group measured in a run, typed: read from its maps as printed (probes/waits/loader.py).

The maps, each printed whole every second and a last time at the stop:
  "@wait_ns":     {"pid,tid,state": ns}    every thread's wall-clock time per state (STATES), its
                                           open interval closed at the print
  "@wait_n":      {"pid,tid,state": n}     intervals per state (the open one included)
  "@wait_unknown": {"pid,tid": ns}         threads with no scheduler event since the start: their
                                           time placed by /proc's state (R: on_cpu, else other)
  "@wait_comm":   {"pid,tid,comm": 1}      each thread's name (in the key: map values are numbers)
  "@wait_span":   {"start_ns", "end_ns"}   CLOCK_MONOTONIC: the loader's start and the print
  "@wait_config": {"stack_interval_ms"}
  "@wait_stacks": {"pid;kind;user frames root-first;kernel frames": ns}  sampled wait stacks, each
                                           weighted by 1/its sampling probability (an estimate: scale
                                           a kind's stacks to that kind's exact total)
  "@wait_stats":  {"stacks", "stack_errors", "late_wakings", "stack_keys_full", "forks", "loader_cpu_s"}

Damaged entries are skipped, never fatal (the archive's shape is checked by archive.schema before this).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from qprof.probes.mapsout import raw_map

if TYPE_CHECKING:
    from qprof.probes.packetio.maps import ProbeMaps

# What a thread's wall-clock time is spent in: on a CPU, runnable (waiting for one), or blocked
# waiting for the network, a timer, another thread of its process, the disk, or something else.
# The one place these names live: waits.bpf.c's enum wait_state is checked against it at load.
STATES = ("on_cpu", "runnable", "network", "timer", "thread", "disk", "other")
BLOCKED = STATES[2:]


def count(v: Any) -> int | None:
    """A finite, non-negative number as an int, else None (strings, NaN, negatives: damaged)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return int(v) if v >= 0 else None


def _ids(key: Any, n: int) -> list[int] | None:
    """The first `n` comma-separated integers of a key."""
    parts = str(key).split(",")
    if len(parts) < n:
        return None
    try:
        return [int(p) for p in parts[:n]]
    except ValueError:
        return None


@dataclass(frozen=True)
class ThreadWaits:
    """One thread's wall-clock time over the probes' span, per state of STATES."""

    pid: int
    tid: int
    ns: dict[str, int]  # state -> ns
    counts: dict[str, int]  # state -> intervals
    unknown_ns: int = 0  # of its time, what no event told (placed by /proc's state at the print)
    comm: str = ""  # its name, as /proc last showed it ("" when never read)

    @property
    def total_ns(self) -> int:
        return sum(self.ns.values())

    @property
    def blocked_ns(self) -> int:
        return sum(self.ns.get(s, 0) for s in BLOCKED)

    def share(self, state: str) -> float:
        """The share of its time in `state` (0 when it has none)."""
        total = self.total_ns
        return self.ns.get(state, 0) / total if total else 0.0


@dataclass(frozen=True)
class WaitMaps:
    """The waits group's measurements of one run (empty when the group did not run)."""

    span_ns: tuple[int, int] | None = None  # (start, end), CLOCK_MONOTONIC
    threads: dict[int, ThreadWaits] = field(default_factory=dict)  # by tid
    stacks: dict[tuple[int, str], dict[str, int]] = field(default_factory=dict)  # (pid, kind) -> {frames: ns}
    stack_interval_ms: float | None = None
    stats: dict[str, float] = field(default_factory=dict)

    @property
    def duration_ns(self) -> int:
        return self.span_ns[1] - self.span_ns[0] if self.span_ns else 0

    def process(self, pid: int) -> dict[str, int]:
        """A process's time per state, summed over its threads."""
        out = dict.fromkeys(STATES, 0)
        for t in self.threads.values():
            if t.pid == pid:
                for s, v in t.ns.items():
                    out[s] += v
        return out

    @staticmethod
    def from_maps(maps: ProbeMaps) -> "WaitMaps":
        if not isinstance(maps, dict):
            return WaitMaps()
        ns: dict[tuple[int, int], dict[str, int]] = {}
        counts: dict[tuple[int, int], dict[str, int]] = {}
        for name, into in (("@wait_ns", ns), ("@wait_n", counts)):
            for key, value in raw_map(maps, name).items():
                ids, v = _ids(key, 2), count(value)
                state = str(key).split(",")[2] if str(key).count(",") == 2 else None
                if ids is None or v is None or state not in STATES:
                    continue
                into.setdefault((ids[0], ids[1]), {})[state] = v
        unknown: dict[tuple[int, int], int] = {}
        for key, value in raw_map(maps, "@wait_unknown").items():
            ids, v = _ids(key, 2), count(value)
            if ids is not None and v is not None and str(key).count(",") == 1:
                unknown[(ids[0], ids[1])] = v
        comms: dict[tuple[int, int], str] = {}
        for key in raw_map(maps, "@wait_comm"):
            parts = str(key).split(",", 2)
            ids = _ids(key, 2)
            if ids is not None and len(parts) == 3:
                comms[(ids[0], ids[1])] = parts[2]
        threads = {}
        for (pid, tid), per in ns.items():
            threads[tid] = ThreadWaits(pid, tid, {s: per.get(s, 0) for s in STATES},
                                       {s: counts.get((pid, tid), {}).get(s, 0) for s in STATES},
                                       unknown.get((pid, tid), 0), comms.get((pid, tid), ""))
        stacks: dict[tuple[int, str], dict[str, int]] = {}
        for key, value in raw_map(maps, "@wait_stacks").items():
            parts, v = str(key).split(";"), count(value)
            if len(parts) < 2 or v is None or parts[1] not in BLOCKED:
                continue
            try:
                pid = int(parts[0])
            except ValueError:
                continue
            frames = ";".join(parts[2:])
            per_kind = stacks.setdefault((pid, parts[1]), {})
            per_kind[frames] = per_kind.get(frames, 0) + v
        span = None
        m = raw_map(maps, "@wait_span")
        start, end = count(m.get("start_ns")), count(m.get("end_ns"))
        if start is not None and end is not None and end >= start:
            span = (start, end)
        interval = None
        ms = raw_map(maps, "@wait_config").get("stack_interval_ms")
        if isinstance(ms, (int, float)) and not isinstance(ms, bool) and math.isfinite(ms) and ms > 0:
            interval = float(ms)
        stats: dict[str, float] = {}
        for key, value in raw_map(maps, "@wait_stats").items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                stats[str(key)] = float(value)
        return WaitMaps(span, threads, stacks, interval, stats)
