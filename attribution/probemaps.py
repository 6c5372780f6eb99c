"""Reading bpftrace maps as the probes print them (JSON, multi-part keys joined by commas)."""

from __future__ import annotations


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
