"""The machine-readable report: one JSON object (the contract later tools rely on).

Every entry of `processes` has pid, comm, cpu_seconds and `categories`, a map
from each of the five categories to its share of the process's sampled CPU
time; the shares sum to 1.
"""

from __future__ import annotations

from typing import Any

from qprof.attribution.categories import CATEGORIES, OTHER_BPF, PROBE_COST, UNCATEGORIZED, is_named_other
from qprof.attribution.analysis import Analysis, verdict_of
from qprof.attribution.profile import PROBE_SHARE_LIMIT, Breakdown, Profile
from qprof.attribution.symbols import naming
from qprof.attribution.timeline import Timeline
from qprof.archive import schema


def _r(x: float) -> float:
    return round(x, 6)


def breakdown_dict(b: Breakdown, profile: Profile, top: int) -> dict[str, Any]:
    total = b.period or 1
    subs: dict[str, dict[str, float]] = {c: {} for c in CATEGORIES}
    for (cat, sub), per in sorted(b.subcategories.items(), key=lambda kv: -kv[1]):
        subs[cat][sub] = _r(per / total)
    symbols: dict[str, list[dict[str, Any]]] = {c: [] for c in CATEGORIES}
    for (cat, sym, dso), per in b.symbols.most_common():
        if len(symbols[cat]) < top:
            symbols[cat].append({"symbol": sym, "dso": dso, "share": _r(per / total),
                                 "cpu_seconds": _r(profile.cpu_seconds(per)),
                                 "samples": b.symbol_samples[(cat, sym, dso)],
                                 "placed_by": [{"rule": r, "share": x} for r, x in b.placed((cat, sym, dso))]})
    return {
        "cpu_seconds": _r(profile.cpu_seconds(b.period)),
        "samples": b.samples,
        "categories": {c: _r(s) for c, s in b.shares().items()},
        "category_cpu_seconds": {c: _r(profile.cpu_seconds(b.categories[c])) for c in CATEGORIES},
        "category_samples": {c: b.category_samples[c] for c in CATEGORIES},
        "subcategories": subs,
        "top_symbols": symbols,
    }


def unplaced_share(process: dict[str, Any], probes_apart: bool = False) -> float:
    """A report process's Uncategorized share that qprof could not place: without what it names as the
    program's own code or its language runtime (and, with `probes_apart`, without eBPF programs' frames)."""
    subs = process["subcategories"][UNCATEGORIZED]
    named = sum(v for s, v in subs.items() if is_named_other(s) or (probes_apart and s in (PROBE_COST, OTHER_BPF)))
    return float(process["categories"][UNCATEGORIZED]) - float(named)


def to_dict(analysis: Analysis, top: int = 10, timeline: Timeline | None = None) -> dict[str, Any]:
    profile = analysis.profile
    info = profile.run.meta
    procs = []
    for p in profile.processes:
        d: dict[str, Any] = {"pid": p.pid, "comm": p.comm, "role": p.role}
        d.update(breakdown_dict(p.breakdown, profile, top))
        d["proc_cpu_seconds"] = None if p.proc_cpu_seconds is None else _r(p.proc_cpu_seconds)
        d["cpu_note"] = p.cpu_note
        d["dso_only_share"] = _r(p.decided_by_dso_only / (p.breakdown.period or 1))
        d["dso_only_shares"] = {c: _r(p.dso_only[c] / (p.breakdown.period or 1)) for c in CATEGORIES}
        d["probe_share"] = _r(p.probe_share)
        d["probe_share_over_limit"] = p.probe_share > PROBE_SHARE_LIMIT
        d["other_bpf_share"] = _r(p.other_bpf_share)
        d["mmsg_seen"] = sorted(p.mmsg_seen)
        d["interrupt_skid"] = p.skid
        d["mappings"] = p.mappings
        d["application"] = p.application
        d["threads"] = [{"tid": t.tid, "comm": t.comm, **breakdown_dict(t.breakdown, profile, min(top, 3))}
                        for t in sorted(p.threads.values(), key=lambda t: -t.breakdown.period)]
        view = analysis.threads.get(p.pid)
        d["thread_view"] = None if view is None else view.to_json(profile.seconds_per_period)
        moved = analysis.transfers.get(p.pid)
        d["transfer"] = None if moved is None else moved.to_json()
        wall = analysis.wall.get(p.pid)
        d["wall_clock"] = None if wall is None else wall.to_json()
        rt = analysis.round_trips.get(p.pid)
        d["round_trip"] = None if rt is None else rt.to_json()
        d["unnamed_share"] = _r(sum(p.unnamed.values()) / (p.breakdown.period or 1))
        d["symbols"] = [o.to_json() for o in naming(p.leaf_objects, p.unnamed, info.symbols)]
        procs.append(d)
    return {
        "run": {
            "path": str(profile.run.path),
            "status": info.status,
            "incomplete_reason": info.incomplete_reason,
            "start_time": info.start_time,
            "duration_s": info.duration_s,
            "stop_reason": info.stop_reason,
            # as recorded: the report carries these parts of meta.json over unchanged
            "sampling": schema.encode(info.sampling),
            "host": schema.encode(info.host),
            "tools": info.tools,
            "probes": info.probes,
            "unwinding": {str(t.pid): {"mode": t.unwind, "reason": t.unwind_reason} for t in info.targets},
        },
        "categories": list(CATEGORIES),
        "processes": procs,
        "targets_without_samples": profile.empty_targets,
        "services": [{"name": v.service.name, "role": v.service.role, "unit": v.service.unit,
                      "processes": [{"pid": m.pid, "comm": m.comm, "joined_s": m.joined_s, "exited": m.exited,
                                     "samples": m.breakdown.samples,
                                     "cpu_seconds": _r(profile.cpu_seconds(m.breakdown.period)),
                                     "categories": {c: _r(x) for c, x in m.breakdown.shares().items()}}
                                    for m in v.members],
                      "sum": breakdown_dict(v.total, profile, top)} for v in analysis.services],
        "packet_io": None if analysis.packet_io is None else analysis.packet_io.to_json(),
        "tcp": None if analysis.tcp is None else analysis.tcp.to_json(),
        "recommendations": [r.to_json() for r in analysis.recommendations],
        "verdict": None if analysis.verdict is None else analysis.verdict.to_json(),
        "crypto": None if analysis.crypto is None else analysis.crypto.to_json(),
        "observer_cpu_s": {k: _r(v) for k, v in analysis.observer_cpu_s.items()},
        "observer_share_of_targets": None if (share := analysis.observer_share[1]) is None else _r(share),
        **({"timeline": timeline.to_json()} if timeline is not None else {}),
    }


def merged_dict(analyses: list[Analysis], top: int = 10,
                timelines: list[Timeline | None] | None = None) -> dict[str, Any]:
    """Several runs (e.g. server and client recorded on two hosts): every run, all processes, one verdict."""
    runs = [to_dict(a, top, tl) for a, tl in zip(analyses, timelines or [None] * len(analyses))]
    v = verdict_of(analyses)
    return {"runs": runs, "categories": list(CATEGORIES),
            "processes": [p for r in runs for p in r["processes"]],
            "verdict": None if v is None else v.to_json()}
