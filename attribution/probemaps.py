"""Reading bpftrace maps as the probes print them (JSON, multi-part keys joined by commas).

The one place attribution turns a group's raw maps (archive.model.RawMap: keys the program's own
text, values as the loader printed them) into typed values: counters keyed by integers, values
keyed by text, histograms. A damaged entry is skipped, never fatal.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping


def keyed(m: object) -> list[tuple[list[int], int]]:
    """[(key parts as ints, value)] of a counter map (a raw map: its keys the program's text, "pid,tid,slot");
    entries that are not integer-keyed are skipped, and anything that is not a map gives none."""
    out: list[tuple[list[int], int]] = []
    if not isinstance(m, dict):  # a damaged snapshot: no counters, rather than an error
        return out
    for k, v in m.items():
        try:
            out.append(([int(x) for x in str(k).split(",")], int(v)))
        except (TypeError, ValueError):
            continue
    return out


def counters(maps: Mapping[str, object], name: str) -> list[tuple[list[int], int]]:
    """The integer-keyed counters of map `name` (keyed); none when the program printed no such map."""
    return keyed(maps.get(name))


def _number(v: object) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def values(maps: Mapping[str, object], name: str) -> dict[str, float]:
    """Map `name`'s numeric values by their key's text ("pid,probe"); entries of another kind skipped."""
    m = maps.get(name)
    if not isinstance(m, dict):
        return {}
    return {str(k): n for k, v in m.items() if (n := _number(v)) is not None}


@dataclass(frozen=True)
class Bucket:
    """One bucket of a bpftrace hist/lhist: values from `low` to `high`, and how many fell there."""

    low: float
    high: float
    count: float


@dataclass(frozen=True)
class Histogram:
    buckets: tuple[Bucket, ...] = ()

    @classmethod
    def of(cls, printed: object) -> "Histogram":
        """A histogram as bpftrace prints it: a list of {min, max, count} (a bucket without `min` starts
        at 0, one without `max` is its `min`, one without `count` holds none); other items are skipped."""
        out = []
        for b in printed if isinstance(printed, list) else []:
            if isinstance(b, dict):
                low = _number(b.get("min")) or 0.0
                high = _number(b.get("max"))
                out.append(Bucket(low, low if high is None else high, _number(b.get("count")) or 0.0))
        return cls(tuple(out))

    def quantile(self, q: float) -> float | None:
        """The midpoint of the bucket holding quantile `q`; None when the histogram holds nothing."""
        total = sum(b.count for b in self.buckets)
        if total == 0:
            return None
        acc = 0.0
        for b in self.buckets:
            acc += b.count
            if acc >= q * total:
                return (b.low + b.high) / 2
        return None

    @property
    def median(self) -> float | None:
        return self.quantile(0.5)


def histograms(maps: Mapping[str, object], name: str) -> dict[str, Histogram]:
    """Map `name`'s histograms by their key's text; {} when the program printed no such map."""
    m = maps.get(name)
    return {str(k): Histogram.of(v) for k, v in m.items()} if isinstance(m, dict) else {}
