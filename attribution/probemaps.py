"""Reading bpftrace maps as the probes print them (JSON, multi-part keys joined by commas)."""

from __future__ import annotations

from typing import Any


def keyed(m: dict[str, Any] | None) -> list[tuple[list[int], int]]:
    """[(key parts as ints, value)] of a counter map; entries that are not integer-keyed are skipped."""
    out: list[tuple[list[int], int]] = []
    if not isinstance(m, dict):  # a damaged snapshot: no counters, rather than an error
        return out
    for k, v in m.items():
        try:
            out.append(([int(x) for x in str(k).split(",")], int(v)))
        except (TypeError, ValueError):
            continue
    return out
