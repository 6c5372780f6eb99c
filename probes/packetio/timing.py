"""The packetio group's message timing: per target, messages sent and received per 0.13 ms bin.

The programs add each UDP message a target sends or receives to a ring of bins in their .bss
(packetio.bpf.c `tim`, bins of 2^shift ns of CLOCK_MONOTONIC, the ring 1.07 s long), but only in
windows of at least MIN_WINDOW_S: whole periods (the hook rate within the windows' budget), and the
sampled windows of a run whose rate is low but whose budget is small (targets that use little CPU,
such as senders a path holds back). The short windows of a fast transfer, which no round trip fits,
pay no clock read. The loader drains the complete bins every period (Drainer) into a file of its own
beside its stream (probe-packetio.timing.jsonl, named through qprof.runfiles), append-only, each line
written whole in one write: a run cut short keeps every line written before the cut. What the bins
are for: attribution/rtt.py reads a path's round-trip time in them.

The file, JSON lines:
  {"shift": 17, "pids": [P, ...]}    first: bins of 2^shift ns; the targets
  {"on": B}                          bins from B on are counted (B: a bin number, ns >> shift)
  {"pid": P, "t": B, "n": N,         bins B .. B+N-1 of target P: "s" sent, "r" received, each as
   "s": [gap, count, ...], "r": [...]}  pairs: bins skipped since the last counted one, then its count
  {"off": B}                         counting stopped before bin B

Between an "on" and the next "off" (or the file's end) a bin a target has no line for counted
nothing: it is a zero, not a gap. TimingFile reads the file back into stretches of consecutive bins,
skipping and counting damaged lines.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from qprof import runfiles
from qprof.probes.lines import LineFile
from qprof.readlimits import appended_lines

SUFFIX = "timing.jsonl"
MIN_WINDOW_S = 0.02  # shorter windows hold no round trip worth the clock read per message


def file_name() -> str:
    """The timing file in the run directory: probe-packetio.timing.jsonl."""
    return runfiles.probe_file("packetio", SUFFIX)


def _pairs(counts: Sequence[int]) -> list[int]:
    out: list[int] = []
    gap = 0
    for c in counts:
        if c:
            out += (gap, c)
            gap = 0
        else:
            gap += 1
    return out


def _unpairs(pairs: Sequence[int], n: int) -> list[int]:
    counts = [0] * n
    i = -1
    for k in range(0, len(pairs) - 1, 2):
        i += pairs[k] + 1
        if not 0 <= i < n or pairs[k] < 0:
            raise ValueError("a bin outside its line")
        counts[i] = int(pairs[k + 1])
    return counts


class Drainer:
    """The loader's side: takes complete bins out of the programs' ring and writes them.

    `take(t, d, i, j)` reads and zeroes ring slots i..j-1 of target t, direction d (0 sent, 1
    received); a bin is complete once the clock has left it."""

    def __init__(self, path: Path, pids: Sequence[int], shift: int, bins: int,
                 take: Callable[[int, int, int, int], list[int]]) -> None:
        self.path, self.pids, self.shift, self.bins = path, list(pids), shift, bins
        self._take = take
        self._file = LineFile(path)
        self.next_bin: int | None = None  # the first bin not drained yet while counting; None: not counting
        self.lost_bins = 0  # bins the ring overwrote before a drain (a loader held off the CPU > 1 s)

    @property
    def write_errors(self) -> int:
        return self._file.write_errors

    def open(self) -> None:
        self._file.open()
        self._file.write({"shift": self.shift, "pids": self.pids})

    def start(self, now_ns: int) -> None:
        """Counting starts (the programs' flag was just set): bins from the current one on."""
        if self.next_bin is None:
            self.next_bin = now_ns >> self.shift
            self._file.write({"on": self.next_bin})

    def drain(self, now_ns: int, last: bool = False) -> None:
        """Write and zero the bins the clock has left (`last`: the current one too, counting stopped)."""
        if self.next_bin is None:
            return
        upto = (now_ns >> self.shift) + (1 if last else 0)
        first = self.next_bin
        if upto - first > self.bins:  # the ring went round: the oldest were overwritten
            self.lost_bins += upto - self.bins - first
            first = upto - self.bins
        if upto <= first:
            return
        i, j = first % self.bins, (upto - 1) % self.bins + 1  # the ring's slots, maybe wrapping
        for t, pid in enumerate(self.pids):
            if not pid:
                continue  # a row no target holds (following: an index not handed out)
            rows = [self._take(t, d, i, j) if i < j else self._take(t, d, i, self.bins) + self._take(t, d, 0, j)
                    for d in (0, 1)]
            if any(rows[0]) or any(rows[1]):
                self._file.write({"pid": pid, "t": first, "n": upto - first, "s": _pairs(rows[0]), "r": _pairs(rows[1])})
        self.next_bin = upto

    def stop(self, now_ns: int) -> None:
        """Counting stopped (the flag was just cleared): the rest, the current bin included."""
        if self.next_bin is None:
            return
        self.drain(now_ns, last=True)
        self._file.write({"off": self.next_bin})
        self.next_bin = None

    def close(self) -> None:
        self._file.close()


@dataclass(frozen=True)
class Stretch:
    """Messages sent and received per bin over a span of consecutive counted bins."""

    start_bin: int
    send: Sequence[int]
    recv: Sequence[int]


@dataclass
class TimingFile:
    """The file read back: per process, its stretches of consecutive counted bins."""

    shift: int
    pids: list[int]
    stretches: dict[int, list[Stretch]] = field(default_factory=dict)
    damaged_lines: int = 0

    @property
    def bin_s(self) -> float:
        return (1 << self.shift) / 1e9

    @classmethod
    def read(cls, path: Path) -> TimingFile | None:
        """None when the run has no timing file (older runs, `--probes none`) or no usable header."""
        lines = appended_lines(path)
        if lines is None:
            return None
        try:
            head: Any = json.loads(lines[0]) if lines else {}
            shift, pids = int(head["shift"]), [int(p) for p in head["pids"]]
        except (ValueError, TypeError, KeyError, IndexError, UnicodeDecodeError):
            return None
        out = cls(shift, pids)
        # per pid, the stretch being built: start bin, sent, received (dense)
        building: dict[int, tuple[int, list[int], list[int]]] = {}
        on: int | None = None

        def close(end: int | None) -> None:
            for pid, (start, s, r) in building.items():
                if end is not None and end > start + len(s):  # counted zeros up to the stop
                    s += [0] * (end - start - len(s))
                    r += [0] * (end - start - len(r))
                out.stretches.setdefault(pid, []).append(Stretch(start, s, r))
            building.clear()

        for line in lines[1:]:
            try:
                obj = json.loads(line)
                if "on" in obj:
                    close(None)
                    on = int(obj["on"])
                elif "off" in obj:
                    close(int(obj["off"]))
                    on = None
                else:
                    pid, t, n = int(obj["pid"]), int(obj["t"]), int(obj["n"])
                    if n <= 0 or on is None or t < on:
                        raise ValueError("a line outside its counting")
                    s, r = _unpairs(obj["s"], n), _unpairs(obj["r"], n)
                    start, bs, br = building.setdefault(pid, (on, [], []))
                    if t < start + len(bs):
                        raise ValueError("bins out of order")
                    gap = t - start - len(bs)
                    bs += [0] * gap + s
                    br += [0] * gap + r
            except (ValueError, TypeError, KeyError, AttributeError, UnicodeDecodeError):
                out.damaged_lines += 1
        close(None)
        return out
