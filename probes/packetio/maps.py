"""What the packetio group measured in a run, typed: read from its maps as printed.

Two generations of archives are read: runs whose programs counted every packet
(`@tx_msgs`, `@rx_bytes`... keyed "pid,tid[,port]": exact) and runs counted in
sampling windows (`@windows`, see windows.py). Either way the result is one
`PacketioMaps`; damaged entries are skipped, never fatal (the archive's shape
is checked by archive.schema before this, which decodes `@windows` into `Windows`; the
other maps are the programs' raw counts, keyed by the text the program chose).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from qprof.probes.mapsout import RawMap
from qprof.probes.packetio.estimate import GroupSample
from qprof.probes.packetio.windows import AUX

# Counters of struct counts in packetio.bpf.c by direction (a counter's name says it; the
# kernel's UDP counters a direction's messages are part of: one each).
AUX_OF_DIRECTION = {"tx": "mib_out", "rx": "mib_in"}


def kernel_counters_for(name: str) -> tuple[tuple[str, ...], ...]:
    """The kernel counters a counter's total may be scaled to: tiers, the best kind first.

    Received anything and sent messages (sends, skbs) are each one UDP datagram of their direction's
    counter, counted in the same syscall: that counter alone. Sent bytes and datagrams (GSO
    segments) follow the namespace's IP OutOctets, counted in the same syscall too: the per-packet
    programs slow the endpoints while they count, so a window sees smaller GSO batches than the run
    as a whole (bench and CI archives: UDP InDatagrams/OutDatagrams 6-20% lower inside the windows
    than outside them), which moves a sender's bytes per OutDatagram but not its bytes per octet.
    Archives without OutOctets fall back to whichever UDP counter follows the count most closely."""
    d = name[:2]
    if d not in AUX_OF_DIRECTION:
        return ()
    if d == "tx" and name.endswith(("_bytes", "_dgrams")):
        return (("ip_out_octets",), ("mib_out", "mib_in"))
    return ((AUX_OF_DIRECTION[d],),)


# The exact maps of archives written before sampling windows: map name -> counter name
_LEGACY = {"@tx_bytes": "tx_bytes", "@tx_errors": "tx_errors", "@tx_gso_sockopt_msgs": "tx_gso_sockopt_msgs",
           "@rx_bytes": "rx_bytes", "@rx_empty": "rx_empty", "@rx_gro_socket_msgs": "rx_gro_socket_msgs",
           "@tx_skbs": "tx_skbs", "@tx_gso_skbs": "tx_gso_skbs", "@tx_dgrams": "tx_dgrams",
           "@rx_gro_skbs": "rx_gro_skbs", "@rx_gro_dgrams": "rx_gro_dgrams",
           "@tx_msgs": "tx_msgs", "@rx_msgs": "rx_msgs"}


def _ints(key: Any) -> list[int] | None:
    try:
        return [int(x) for x in str(key).split(",")]
    except ValueError:
        return None


def _num(v: Any) -> float | None:
    """A finite number, else None: a damaged archive's infinities and NaNs are dropped like its strings."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    f = float(v)
    return f if math.isfinite(f) else None


@dataclass(frozen=True)
class GroupWindows:
    """One group's (a process's, or "pid,tid" a thread's) window sums: see windows.GroupStats."""

    sum: tuple[float, ...]
    counted: tuple[float, ...]
    q: tuple[float, ...]
    netns: str = ""
    seen: tuple[int, ...] = ()  # windows in which each series was nonzero
    since: tuple[float, ...] = ()  # its namespace's kernel counters (AUX) before its first period; (): none

    def fits(self, n: int) -> bool:
        """Its sums are of the `n` series (the covariances too)."""
        return len(self.sum) == n and len(self.counted) == n and len(self.q) == n * (n + 1) // 2


@dataclass(frozen=True)
class NetnsTotals:
    """A namespace's kernel counters (windows.AUX) over the run, and the targets in it."""

    pids: tuple[int, ...] = ()
    mib_in: float | None = None
    mib_out: float | None = None
    ip_out_octets: float | None = None


@dataclass(frozen=True)
class Windows:
    """The sampler's window statistics (windows.py), printed as the map "@windows"; its fields are
    the printed names (archive.schema derives its shape and decoder from them)."""

    series: tuple[str, ...]
    periods: int
    full_periods: int
    groups: dict[str, GroupWindows]
    span_s: float = 0.0
    counted_s: float = 0.0
    expansion: float = 0.0  # sum of 1/pi over partial windows
    netns: dict[str, NetnsTotals] = field(default_factory=dict)
    events: dict[str, int] = field(default_factory=dict)  # hook runs counted in the windows, any task
    budget: dict[str, float] = field(default_factory=dict)
    final: bool = False
    through_mono: float | None = None  # CLOCK_MONOTONIC end of the periods the sums cover (older: None)
    timing: dict[str, int] = field(default_factory=dict)  # the messages' timing file: bins lost, write errors

    @property
    def exact(self) -> bool:
        return self.periods > 0 and self.full_periods == self.periods

    @property
    def mib_totals(self) -> dict[str, dict[str, float]]:
        """netns -> {kernel counter (windows.AUX): its total}."""
        return {ns: {k: v for k in AUX if (v := getattr(t, k)) is not None} for ns, t in self.netns.items()}

    def sample(self, key: str) -> GroupSample | None:
        """A group's sums as the estimator takes them, scaled to its namespace's kernel counters over the
        same periods (a group first seen later: over its own)."""
        g = self.groups.get(key)
        if g is None:
            return None
        aux_of = {n: AUX_OF_DIRECTION[n[:2]] for n in self.series if n[:2] in AUX_OF_DIRECTION}
        totals = self.mib_totals.get(g.netns, {})
        if g.since:
            totals = {name: total - g.since[AUX.index(name)] for name, total in totals.items() if name in AUX}
        return GroupSample(self.series, g.sum, g.counted, g.seen, g.q, self.periods, self.full_periods, aux_of,
                           totals, self.expansion, {n: kernel_counters_for(n) for n in aux_of})

    def usable(self) -> "Windows | None":
        """These windows with the groups whose sums fit the series (a damaged archive's others left out),
        each with a count of nonzero windows per series; None when the periods do not add up."""
        if not 0 <= self.full_periods <= self.periods:
            return None
        n = len(self.series)
        groups = {k: GroupWindows(g.sum, g.counted, g.q, g.netns, g.seen if len(g.seen) == n else (0,) * n,
                                  g.since if len(g.since) == len(AUX) else ())
                  for k, g in self.groups.items() if g.fits(n)}
        return replace(self, groups=groups)


# A program's maps by name ("@tx_msgs", "@windows") as the archive holds them: raw maps, and the
# sampler's `@windows` typed (the one printed map with a fixed structure)
ProbeMaps = dict[str, RawMap | Windows]


@dataclass
class PacketioMaps:
    """The packetio group's measurements of one run."""

    windows: Windows | None = None  # sampled runs
    exact_counts: dict[tuple[int, int], dict[str, int]] = field(default_factory=dict)  # older runs: (pid, tid)
    ports: dict[int, set[int]] = field(default_factory=dict)  # pid -> local ports its sockets used
    udp_drops: dict[tuple[int, int], int] = field(default_factory=dict)  # (reason, port) -> datagrams
    queue_fail: dict[tuple[int, int], int] = field(default_factory=dict)  # (rc, port) -> datagrams
    hists: dict[str, dict[int, list[dict[str, int]]]] = field(default_factory=dict)  # name -> pid -> buckets

    @staticmethod
    def from_maps(maps: ProbeMaps) -> "PacketioMaps":
        windows = maps.get("@windows")
        rec = PacketioMaps(windows=windows.usable() if isinstance(windows, Windows) else None)
        for name, counter in _LEGACY.items():
            m = maps.get(name)
            for key, value in (m.items() if isinstance(m, dict) else []):
                parts, v = _ints(key), _num(value)
                if parts is None or len(parts) < 2 or v is None:
                    continue
                slot = rec.exact_counts.setdefault((parts[0], parts[1]), {})
                slot[counter] = slot.get(counter, 0) + int(v)
                if len(parts) >= 3 and parts[2]:
                    rec.ports.setdefault(parts[0], set()).add(parts[2])
        for target, name in ((rec.udp_drops, "@udp_drops"), (rec.queue_fail, "@udp_queue_fail"),
                             (None, "@ports")):
            m = maps.get(name)
            for key, value in (m.items() if isinstance(m, dict) else []):
                parts, v = _ints(key), _num(value)
                if parts is None or len(parts) != 2 or v is None:
                    continue
                if target is None:
                    rec.ports.setdefault(parts[0], set()).add(parts[1])
                else:
                    target[(parts[0], parts[1])] = target.get((parts[0], parts[1]), 0) + int(v)
        for name in ("@tx_gso_segs", "@tx_gso_size", "@rx_gro_segs"):
            m = maps.get(name)
            for pid, buckets in (m.items() if isinstance(m, dict) else []):
                if str(pid).isdigit() and isinstance(buckets, list):
                    rec.hists.setdefault(name, {})[int(pid)] = [
                        {k: v for k, v in b.items() if isinstance(v, int)} for b in buckets if isinstance(b, dict)]
        return rec
