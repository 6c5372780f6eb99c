"""The waits group's wall clock over time: per process, its threads' time per state in each 100 ms bin.

The maps (maps.py) hold each thread's totals over the whole run; the loader also writes, at every
bin edge, what each process's threads spent per state since the previous edge, to a file of its
own beside its maps' stream (probe-waits.series.jsonl, named through qprof.runfiles): an
append-only series that compaction never touches (probes.children compacts only the stream whose
last value wins), each line written whole and at once, so a run cut short keeps every bin written
before the cut.

The file, JSON lines:
  {"bin_ns": 100000000, "start_ns": N, "states": [...]}   first: the bin width, the loader's start
                                                          (CLOCK_MONOTONIC), the states (maps.STATES)
  {"t": T, "d": {"pid,state": ns}}                        one bin: T its start (CLOCK_MONOTONIC, a
                                                          multiple of bin_ns: the timeline's bins,
                                                          archive.stacks' BIN_S), per process and
                                                          state the ns its threads spent in it in
                                                          the bin (states with none are left out)
  {"t": T, "n": K, "d": {...}}                            a line the loader wrote late: K bins from
                                                          T, its time spread evenly over them

Bins are cut at their edges as the loader reads the threads: each thread's open interval is closed
at the edge. Intervals that closed between the edge and the read (the loader's wake-up latency,
well under a millisecond when it gets a CPU at once, more on a loaded host) are whole in the
totals: a thread's part of a bin is kept to the bin's length and the excess, split like the
thread's states in the bin, goes to the next one. So a bin's time is exact (its threads' time
alive in it) and its split exact but for that excess. The first bin starts at the loader's start,
the last ends at its stop. A thread whose state the probes have not seen yet (no scheduler event
since the start) is placed by /proc's state, as the maps place it; when its first event tells
otherwise, the bin's split is corrected (its total stays the elapsed time). A blocked thread's
open wait is shown by the kind its system call gave it (the maps' open interval too); the kind
its wake-up tells (a recvfrom ended by its timeout: timer) is known at its end, and counts from
that bin on: the bins before keep the provisional kind, so a kind's total over the series can
differ from the maps' by such waits.

Binner is the loader's side (pure: it is handed the threads' cumulative totals); WaitSeries reads
the file back, skipping and counting damaged lines (a line cut by a kill, a hand-edited one).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, NotRequired, Sequence, TypedDict

from qprof import runfiles
from qprof.probes.waits.maps import STATES, count
from qprof.readlimits import appended_lines

# The bin: the timeline's (archive.stacks.BIN_S, 100 ms), which the probes layer may not import;
# attribution.timeline checks the two agree.
BIN_NS = 100_000_000
SUFFIX = "series.jsonl"
MAX_SPREAD = 600  # bins one line may cover (a minute): more is not a file the loader wrote
MIN_BIN_NS, MAX_BIN_NS = 1_000_000, 60_000_000_000  # a header's bin width outside these: damaged, the default kept


class SeriesHeader(TypedDict):
    """The file's first line (see above)."""

    bin_ns: int
    start_ns: int
    states: list[str]


class BinLine(TypedDict):
    """One bin's line, or a late line's (`n` bins)."""

    t: int
    n: NotRequired[int]
    d: dict[str, int]


def file_name() -> str:
    """The series' file in the run directory: probe-waits.series.jsonl."""
    return runfiles.probe_file("waits", SUFFIX)


class Binner:
    """Per process, its threads' time per state between successive cuts, from the threads'
    cumulative totals (the loader's side).

    `cut(at_ns, living, exited)` is handed every thread the map holds, each with its cumulative ns
    per state (STATES order) with the open interval closed at `at_ns`, and the final totals of
    the threads that exited (a thread gone from the map is looked up there). A thread's share of
    the cut is its totals' increase since its previous cut (a new thread's: its totals)."""

    def __init__(self, start_ns: int, bin_ns: int = BIN_NS) -> None:
        self.bin_ns = bin_ns
        self.start_ns = start_ns
        self.cut_ns = start_ns  # where the last cut ended
        self._prev: dict[int, tuple[int, list[int]]] = {}  # tid -> (pid, its totals at the last cut)

    def header(self) -> SeriesHeader:
        return {"bin_ns": self.bin_ns, "start_ns": self.start_ns, "states": list(STATES)}

    def edge_before(self, now_ns: int) -> int:
        """The last bin edge at or before `now_ns`."""
        return now_ns // self.bin_ns * self.bin_ns

    def next_edge(self, now_ns: int) -> int:
        """The first bin edge after `now_ns`."""
        return self.edge_before(now_ns) + self.bin_ns

    @staticmethod
    def _add(into: list[int], now: Sequence[int], before: Sequence[int] | None, span: int | None) -> list[int]:
        """Add a thread's part of the cut to its process's; returns what it withholds per state (see cut)."""
        delta = [v - (before[i] if before is not None else 0) for i, v in enumerate(now)]
        total = sum(delta)
        if min(delta) < 0:
            # a state's total fell: time /proc placed (an unseen thread's) went to another state at
            # its first event. The states that grew share the thread's time in the cut.
            grown = sum(d for d in delta if d > 0)
            delta = [d * total // grown if d > 0 and total > 0 else 0 for d in delta]
            total = sum(delta)
        withheld = [0] * len(delta)
        if span is not None and total > span:
            # more than the cut's span: intervals that closed after the edge, before the loader read the
            # map. Each state gives back its share of the excess, which the next cut counts.
            kept = [d * span // total for d in delta]
            kept[delta.index(max(delta))] += span - sum(kept)  # the rounding's few ns: the span exactly
            withheld = [d - k for d, k in zip(delta, kept)]
            delta = kept
        for i, d in enumerate(delta):
            into[i] += d
        return withheld

    def cut(self, at_ns: int, living: Iterable[tuple[int, int, Sequence[int]]],
            exited: Mapping[tuple[int, int], Sequence[int]]) -> BinLine | None:
        """The line for [last cut, at_ns); None when `at_ns` is not past the last cut.

        A thread's totals close its open interval at the edge, but intervals that closed between the
        edge and the read are in them whole: a thread's part is kept to the cut's span (what a thread
        alive all of it spent), the rest withheld for the next cut, so bins keep their length and no
        time is lost."""
        if at_ns <= self.cut_ns:
            return None
        span = at_ns - self.cut_ns
        per: dict[int, list[int]] = {}
        seen = set()
        for pid, tid, totals in living:
            seen.add(tid)
            prev = self._prev.get(tid)
            before = prev[1] if prev is not None and prev[0] == pid else None  # else a tid used again
            withheld = self._add(per.setdefault(pid, [0] * len(STATES)), totals, before, span)
            self._prev[tid] = (pid, [v - w for v, w in zip(totals, withheld)])
        for tid in [t for t in self._prev if t not in seen]:
            pid, before = self._prev.pop(tid)
            last = exited.get((pid, tid))
            if last is not None:  # it exited since the last cut and left the map: its last part, whole
                self._add(per.setdefault(pid, [0] * len(STATES)), last, before, None)
        t = self.cut_ns // self.bin_ns * self.bin_ns
        n = -(-(at_ns - t) // self.bin_ns)
        self.cut_ns = at_ns
        d = {f"{pid},{STATES[i]}": v for pid, vs in sorted(per.items()) for i, v in enumerate(vs) if v}
        return {"t": t, "n": n, "d": d} if n > 1 else {"t": t, "d": d}


@dataclass(frozen=True)
class WaitSeries:
    """What the series file holds: per process, per bin, ns per state (its threads summed)."""

    bin_ns: int = BIN_NS
    start_ns: int | None = None
    bins: dict[int, dict[int, dict[str, int]]] = field(default_factory=dict)  # pid -> bin (t // bin_ns) -> state -> ns
    lines: int = 0  # bin lines read
    damaged: int = 0  # lines skipped: unparsable (a line cut by a kill) or not shaped like a bin

    @property
    def pids(self) -> list[int]:
        return sorted(self.bins)

    def process(self, pid: int) -> dict[str, int]:
        """A process's time per state over the whole series."""
        out = dict.fromkeys(STATES, 0)
        for per in self.bins.get(pid, {}).values():
            for s, v in per.items():
                out[s] += v
        return out

    def over(self, pid: int, width_ns: int) -> dict[int, dict[str, float]]:
        """A process's bins as bins of `width_ns` (index: start // width_ns), each of its bins' time
        split by overlap (a multiple of bin_ns merges whole bins: a long run's merged timeline)."""
        out: dict[int, dict[str, float]] = {}
        if width_ns <= 0:
            return out
        for b, per in self.bins.get(pid, {}).items():
            start, end = b * self.bin_ns, (b + 1) * self.bin_ns
            k = start // width_ns
            while k * width_ns < end:
                lap = min(end, (k + 1) * width_ns) - max(start, k * width_ns)
                if lap > 0:
                    into = out.setdefault(k, {})
                    for s, v in per.items():
                        into[s] = into.get(s, 0.0) + v * lap / self.bin_ns
                k += 1
        return out

    @staticmethod
    def parse(text: Iterable[str | bytes]) -> "WaitSeries":
        bin_ns, start_ns = BIN_NS, None
        bins: dict[int, dict[int, dict[str, int]]] = {}
        n_lines = damaged = 0
        first = True
        for raw in text:
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
                damaged += 1
                first = False
                continue
            if first and isinstance(obj, dict) and "bin_ns" in obj:
                first = False
                width, start = count(obj.get("bin_ns")), count(obj.get("start_ns"))
                if width is not None and MIN_BIN_NS <= width <= MAX_BIN_NS:
                    bin_ns = width
                else:
                    damaged += 1
                start_ns = start
                continue
            first = False
            parsed = _bin_line(obj)
            if parsed is None:
                damaged += 1
                continue
            t, n, entries = parsed
            n_lines += 1
            b0 = t // bin_ns
            for (pid, state), v in entries.items():
                per_bin = bins.setdefault(pid, {})
                for i in range(n):  # a late line's time spread evenly over its bins
                    share = v * (i + 1) // n - v * i // n
                    if share:
                        cell = per_bin.setdefault(b0 + i, {})
                        cell[state] = cell.get(state, 0) + share
        return WaitSeries(bin_ns, start_ns, bins, n_lines, damaged)

    @staticmethod
    def read(path: Path) -> "WaitSeries | None":
        """The series in `path`; None when the run has none (an older qprof, or no waits group)."""
        text = appended_lines(path)
        return None if text is None else WaitSeries.parse(text)


def _bin_line(obj: Any) -> tuple[int, int, dict[tuple[int, str], int]] | None:
    """(start ns, bins covered, {(pid, state): ns}) of a bin line; None when it is not one."""
    if not isinstance(obj, dict) or not isinstance(obj.get("d"), dict):
        return None
    t = obj.get("t")
    if isinstance(t, bool) or not isinstance(t, int) or t < 0:
        return None
    n = obj.get("n", 1)
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_SPREAD:
        return None
    entries: dict[tuple[int, str], int] = {}
    for key, value in obj["d"].items():
        pid_s, _, state = str(key).partition(",")
        v = count(value)
        if state not in STATES or v is None:
            return None
        try:
            pid = int(pid_s)
        except ValueError:
            return None
        if pid < 0:
            return None
        entries[(pid, state)] = entries.get((pid, state), 0) + v
    return t, n, entries
