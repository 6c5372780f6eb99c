"""What the packetio group measured in a run, typed: read from its maps as printed.

Two generations of archives are read: runs whose programs counted every packet
(`@tx_msgs`, `@rx_bytes`... keyed "pid,tid[,port]": exact) and runs counted in
sampling windows (`@windows`, see windows.py). Either way the result is one
`PacketioMaps`; damaged entries are skipped, never fatal (the archive's shape
is checked by archive.schema before this).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

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

    netns: str
    sum: tuple[float, ...]
    counted: tuple[float, ...]
    seen: tuple[int, ...]  # windows in which each series was nonzero
    q: tuple[float, ...]
    since: tuple[float, ...] = ()  # its namespace's kernel counters (AUX) before its first period; (): none


@dataclass(frozen=True)
class Windows:
    series: tuple[str, ...]
    periods: int
    full_periods: int
    span_s: float
    counted_s: float
    expansion: float  # sum of 1/pi over partial windows
    groups: dict[str, GroupWindows]
    mib_totals: dict[str, dict[str, float]]  # netns -> {kernel counter (windows.AUX): its total}
    events: dict[str, int]  # hook runs counted in the windows, any task
    budget: dict[str, float]
    through_mono: float | None = None  # CLOCK_MONOTONIC end of the periods the sums cover (older: None)

    @property
    def exact(self) -> bool:
        return self.periods > 0 and self.full_periods == self.periods

    @staticmethod
    def from_json(obj: Any) -> "Windows | None":
        if not isinstance(obj, dict):
            return None
        series = obj.get("series")
        if not isinstance(series, list) or not all(isinstance(s, str) for s in series):
            return None
        n = len(series)
        groups = {}
        for key, g in (obj.get("groups") or {}).items() if isinstance(obj.get("groups"), dict) else []:
            if not isinstance(g, dict):
                continue
            sums, counted, q = g.get("sum"), g.get("counted"), g.get("q")
            if not (isinstance(sums, list) and isinstance(counted, list) and isinstance(q, list)) or \
                    not all(_num(x) is not None for v in (sums, counted, q) for x in v):
                continue
            if len(sums) != n or len(counted) != n or len(q) != n * (n + 1) // 2:
                continue
            seen = g.get("seen")
            seen_t = tuple(int(x) for x in seen) if isinstance(seen, list) and len(seen) == n and \
                all(_num(x) is not None for x in seen) else tuple([0] * n)
            since = g.get("since")
            since_t = tuple(map(float, since)) if isinstance(since, list) and len(since) == len(AUX) and \
                all(_num(x) is not None for x in since) else ()
            groups[str(key)] = GroupWindows(str(g.get("netns", "")), tuple(map(float, sums)),
                                            tuple(map(float, counted)), seen_t, tuple(map(float, q)), since_t)
        mib = {}
        for ns, t in (obj.get("netns") or {}).items() if isinstance(obj.get("netns"), dict) else []:
            if isinstance(t, dict):
                mib[str(ns)] = {k: float(t[k]) for k in AUX if _num(t.get(k)) is not None}
        events = {str(k): int(v) for k, v in (obj.get("events") or {}).items()
                  if _num(v) is not None} if isinstance(obj.get("events"), dict) else {}
        budget = {str(k): float(v) for k, v in (obj.get("budget") or {}).items()
                  if _num(v) is not None} if isinstance(obj.get("budget"), dict) else {}
        periods, full = obj.get("periods"), obj.get("full_periods")
        if not isinstance(periods, int) or not isinstance(full, int) or not 0 <= full <= periods:
            return None
        return Windows(tuple(series), periods, full, float(_num(obj.get("span_s")) or 0.0),
                       float(_num(obj.get("counted_s")) or 0.0), float(_num(obj.get("expansion")) or 0.0),
                       groups, mib, events, budget, _num(obj.get("through_mono")))


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
    def from_maps(maps: dict[str, Any]) -> "PacketioMaps":
        rec = PacketioMaps(windows=Windows.from_json(maps.get("@windows")))
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
                    rec.hists.setdefault(name, {})[int(pid)] = [b for b in buckets if isinstance(b, dict)]
        return rec
