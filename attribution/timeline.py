"""A run over time: each target's CPU by category per 100 ms, and the bytes it moved.

Totals hide the phases of a transfer: handshake, slow start, loss episodes,
steady state. The folded stacks keep each record's CPU time per time bin
(archive.stacks, BIN_S), and the report's own attribution pass
adds it up per process and category (TimelineBuilder is a
profile.Visitor), so a bin's categories are the report's. Bytes come from
the running totals in the /proc readings (collectors.traffic): TCP exact,
from the kernel's socket counters every 0.25 s; UDP estimated from the
probes' sampling windows, whose totals change once a second. Rates are taken
between successive changes of a total, so a UDP rate is a one-second average,
kept to the process's transfer (its first to last packet sample): a transfer
shorter than a second is one average over its own span, not over the run.

Samples (perf -k monotonic) and readings share CLOCK_MONOTONIC: time 0 is the
start of the bin holding the run's first /proc reading. A run recorded before, or refolded without that
clock, has no common clock: its CPU starts at its first sample and no rates
are drawn (`aligned` is false).

The wall clock over time (`wall`): with the waits probes' series (probes.waits.series, on
CLOCK_MONOTONIC too, cut at the same 100 ms edges), each target's threads' seconds per state
(on a CPU, runnable, waiting for the network, a timer, another thread, the disk, other) per
bin, summed over its threads: a bin's states add up to its threads' time in it (bin_s per thread
alive all of it). Runs without the series (older archives, no waits group) or without the common
clock have none, and their outputs are as they were.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Callable

from qprof.attribution.categories import CATEGORIES
from qprof.attribution.engine import Decision
from qprof.attribution.profile import Profile
from qprof.attribution.transfer import Transfer
from qprof.archive.model import ProcReading
from qprof.archive.stacks import BIN_S, SAMPLE_CLOCK, StackRecord, StacksHeader, stacks_header
from qprof.jsonvalue import JsonObject
from qprof.probes.waits.maps import STATES
from qprof.probes.waits.series import BIN_NS as SERIES_BIN_NS, WaitSeries

# The probes cut the wall clock series at the timeline's bin edges: one constant on each side of the
# layers (the probes may not import the archive), checked here.
if round(BIN_S * 1e9) != SERIES_BIN_NS:
    raise RuntimeError(f"the waits series' bin ({SERIES_BIN_NS} ns) is not the timeline's ({BIN_S} s): "
                       "probes/waits/series.py and archive/stacks.py must agree")


# an interval of bytes cut to the transfer's span shorter than this joins its neighbour (_within)
FRAGMENT_S = 0.25
# the probes' running UDP totals change once a second: their rates are averages between two prints
UDP_LABEL = "UDP (probes' estimate; averages over their sampling periods, about 1 s, within its transfer)"


class TimelineBuilder:
    """Visitor: CPU period per process, time bin and category, for the records `keep` accepts."""

    def __init__(self, keep: Callable[[StackRecord], bool] = lambda rec: True) -> None:
        self.keep = keep
        self.cpu: dict[int, dict[int, Counter[str]]] = defaultdict(lambda: defaultdict(Counter))

    def __call__(self, rec: StackRecord, decision: Decision) -> None:
        if rec.bins and self.keep(rec):
            per_bin = self.cpu[rec.pid]
            for b, period in rec.bins:
                per_bin[b][decision.category] += period


@dataclass(frozen=True)
class Rate:
    """Bytes per second between two readings whose totals differ."""

    start_s: float
    end_s: float
    sent_gbps: float
    received_gbps: float


@dataclass
class TargetTimeline:
    pid: int
    comm: str
    role: str | None
    cpu: list[dict[str, float]]  # per bin from time 0: CPU cores by category (CPU seconds / BIN_S)
    rates: list[Rate] = field(default_factory=list)
    traffic: str = ""  # what the rates count: "TCP", "UDP (...)", both, or "" for none
    # per bin from time 0: its threads' seconds per state (STATES; states with none left out), from the
    # waits probes' series; None when the run has none
    wall: list[dict[str, float]] | None = None

    def wall_shares(self, lo: int, hi: int) -> dict[str, float] | None:
        """Each state's share of the threads' time over bins [lo, hi); None without a series or time."""
        if self.wall is None:
            return None
        secs = {s: sum(b.get(s, 0.0) for b in self.wall[lo:hi]) for s in STATES}
        total = sum(secs.values())
        return {s: v / total for s, v in secs.items()} if total > 0 else None

    @property
    def goodput(self) -> list[tuple[float, float, float]]:
        """(start s, end s, Gbit/s) of the direction that moved more: what the target was there for."""
        sent = sum(r.sent_gbps * (r.end_s - r.start_s) for r in self.rates)
        received = sum(r.received_gbps * (r.end_s - r.start_s) for r in self.rates)
        return [(r.start_s, r.end_s, r.sent_gbps if sent > received else r.received_gbps) for r in self.rates]

    def to_json(self) -> JsonObject:
        return {"pid": self.pid, "comm": self.comm, "role": self.role, "traffic": self.traffic,
                "cpu_cores": {c: [round(b.get(c, 0.0), 4) for b in self.cpu] for c in CATEGORIES},
                "rates": [{"start_s": round(r.start_s, 3), "end_s": round(r.end_s, 3),
                           "sent_gbps": round(r.sent_gbps, 4), "received_gbps": round(r.received_gbps, 4)}
                          for r in self.rates],
                "goodput_gbps": [[round(a, 3), round(b, 3), round(g, 4)] for a, b, g in self.goodput],
                **({"wall_s": {s: [round(b.get(s, 0.0), 6) for b in self.wall] for s in STATES}}
                   if self.wall is not None else {})}


@dataclass
class Timeline:
    bin_s: float
    aligned: bool  # samples and byte readings on one clock (see the module docstring)
    targets: list[TargetTimeline]

    @property
    def bins(self) -> int:
        return max((len(t.cpu) for t in self.targets), default=0)

    def to_json(self) -> JsonObject:
        return {"bin_s": self.bin_s, "aligned": self.aligned, "bins": self.bins,
                "targets": [t.to_json() for t in self.targets]}


def _rates(readings: list[ProcReading], pid: int, origin: float, span_s: tuple[float, float] | None = None,
           moved_total: Transfer | None = None) -> tuple[list[Rate], str]:
    """Rates between successive changes of the target's running byte totals (TCP + UDP). Totals are
    zero at the run's first reading, so the first change (UDP's first print comes ~1 s in) has a rate.
    With the process's transfer span (attribution.transfer: first to last packet sample), each rate is
    kept to it, its bytes over the part inside: the handshake and idle time before the first packet
    and after the last are no part of a one-second average. With its transfer's UDP total (the probes'
    final estimate, scaled to the kernel's counters: attribution.packetio), the running totals' shape is
    kept and their sum made that total, so the timeline and the report count the same bytes."""
    kinds: set[str] = set()
    points: list[tuple[float, float, float]] = []
    for r in readings:
        sent = received = 0.0
        seen = False
        for kind, totals in (("tcp", r.tcp), ("udp", r.udp)):
            v = totals.get(pid)
            if v is not None:
                sent, received, seen = sent + v[0], received + v[1], True
                if v[0] or v[1]:
                    kinds.add(kind)
        # UDP totals count up to the probes' last whole period, up to ~1.5 s before the reading: their
        # bytes are placed there (a rate between readings would put a second's bytes in the interval
        # after, and the one cut at the transfer's end would read three times too fast)
        at = r.udp_through if r.udp_through is not None and pid in r.udp and not r.tcp.get(pid) else r.mono
        if seen or not points:  # the totals count from the run's start: nothing moved before the first
            points.append((at - origin, sent, received))
    moved: list[list[float]] = []  # [start, end, bytes sent, bytes received] between changes of a total
    prev = points[0] if points else None
    for p in points[1:]:
        assert prev is not None
        if (p[1], p[2]) != (prev[1], prev[2]) and p[0] > prev[0]:
            moved.append([prev[0], p[0], p[1] - prev[1], p[2] - prev[2]])
            prev = p
    if span_s is not None:
        moved = _within(moved, span_s[0] - origin, span_s[1] - origin)
    if moved_total is not None and moved_total.protocol == "UDP" and moved_total.bytes and "tcp" not in kinds:
        col = 2 if moved_total.direction == "sent" else 3
        counted = sum(m[col] for m in moved)
        factor = moved_total.bytes / counted if counted > 0 else 1.0
        moved = [[a, b, s * factor, r * factor] for a, b, s, r in moved]
    rates = [Rate(a, b, s * 8 / (b - a) / 1e9, r * 8 / (b - a) / 1e9) for a, b, s, r in moved]
    label = " + ".join(x for x in ("TCP" if "tcp" in kinds else "", UDP_LABEL if "udp" in kinds else "") if x)
    return rates, label


def _within(moved: list[list[float]], lo: float, hi: float) -> list[list[float]]:
    """Intervals of bytes kept to [lo, hi]: cut at its ends; bytes of an interval wholly outside go to
    the nearest one inside (the probes print their totals up to a second late: a transfer's last bytes
    can show in a print after its last packet). The last one ends at hi: the final totals, read at the
    stop, count every byte up to it even when dated earlier (a stop in the wait for the next sampling
    window dates them at the last period's end, probes.packetio.sampler._commit)."""
    if hi <= lo or not moved:
        return moved
    kept: list[list[float]] = []
    before = [0.0, 0.0]
    for a, b, sent, received in moved:
        if b <= lo:
            before = [before[0] + sent, before[1] + received]
        elif a >= hi and kept:
            kept[-1][2] += sent
            kept[-1][3] += received
        else:
            kept.append([max(a, lo), min(b, hi) if a < hi else hi, sent + before[0], received + before[1]])
            before = [0.0, 0.0]
    if not kept:  # everything printed before the span began (cannot be) or none inside: one interval
        total = [sum(m[2] for m in moved), sum(m[3] for m in moved)]
        return [[lo, hi, *total]]
    kept = [m for m in kept if m[1] > m[0]] or [[lo, hi, sum(m[2] for m in kept), sum(m[3] for m in kept)]]
    kept[-1][1] = hi  # else the span's tail held no bytes and the rates over the rest read too fast
    # a piece the span's end cut short of an interval printed after it holds that whole interval's bytes,
    # counted before the print (the probes print up to a period late): alone, 16 ms "at" 84 Gbit/s in a
    # 3 Gbit/s transfer (2026-11-27). It joins the interval before it; likewise a short first piece.
    if len(kept) > 1 and kept[-1][1] - kept[-1][0] < FRAGMENT_S:
        last = kept.pop()
        kept[-1] = [kept[-1][0], last[1], kept[-1][2] + last[2], kept[-1][3] + last[3]]
    if len(kept) > 1 and kept[0][1] - kept[0][0] < FRAGMENT_S:
        first = kept.pop(0)
        kept[0] = [first[0], kept[0][1], kept[0][2] + first[2], kept[0][3] + first[3]]
    return kept


def _wall(series: WaitSeries, pid: int, first: int, last: int, bin_s: float) -> list[dict[str, float]] | None:
    """A process's seconds per state per timeline bin, first to last (a merged bin sums its parts)."""
    if pid not in series.bins:
        return None
    per = series.over(pid, round(bin_s * 1e9))
    return [{s: v / 1e9 for s, v in per.get(b, {}).items() if v} for b in range(first, last + 1)]


def build(profile: Profile, builder: TimelineBuilder, readings: list[ProcReading],
          pids: list[int] | None = None, transfers: dict[int, Transfer] | None = None) -> Timeline:
    """The timeline of the sampled processes (or of `pids`) from what `builder` saw during `profile`'s pass;
    `transfers`: the processes' transfers (the report's bytes, which the rates add up to)."""
    aligned = profile.run.meta.sampling.clock == SAMPLE_CLOCK and bool(readings)
    # a long run's bins were merged while folding (collectors.chunks.MAX_BIN_ENTRIES): each kept bin
    # starts at a multiple of the grain
    grain = max(1, (stacks_header(profile.run.stacks_path) or StacksHeader()).bin_grain)
    bin_s = BIN_S * grain
    all_bins = [b // grain for per in builder.cpu.values() for b in per]
    # time 0 is the start of the bin holding the first /proc reading (aligned), or the first sample's
    first = int(readings[0].mono / BIN_S) // grain if aligned else min(all_bins, default=0)
    origin = first * bin_s
    last = max(all_bins, default=first)
    if aligned:
        last = max(last, int(readings[-1].mono / BIN_S) // grain)
    scale = profile.seconds_per_period / bin_s  # period per bin -> cores
    series = profile.run.wait_series() if aligned else None  # read once for every target
    targets = []
    for p in profile.processes:
        if pids is not None and p.pid not in pids:
            continue
        per_bin: dict[int, Counter[str]] = defaultdict(Counter)
        for b, cats in builder.cpu.get(p.pid, {}).items():
            per_bin[b // grain].update(cats)
        cpu = [{c: v * scale for c, v in per_bin.get(b, {}).items()} for b in range(first, last + 1)]
        span = (p.packet_span_ns[0] / 1e9, p.packet_span_ns[1] / 1e9) if p.packet_span_ns else None
        rates, kinds = _rates(readings, p.pid, origin, span, (transfers or {}).get(p.pid)) if aligned else ([], "")
        wall = _wall(series, p.pid, first, last, bin_s) if series is not None else None
        targets.append(TargetTimeline(p.pid, p.comm, p.role, cpu, rates, kinds, wall))
    return Timeline(bin_s, aligned, targets)
