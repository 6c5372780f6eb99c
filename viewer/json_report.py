"""The machine-readable report: one JSON object (the contract later tools rely on), written from the
typed report (viewer.report), whose figures every other output shows too.

Every entry of `processes` has pid, comm, cpu_seconds and `categories`, a map
from each of the five categories to its share of the process's sampled CPU
time; the shares sum to 1.
"""

from __future__ import annotations

from typing import Mapping

from qprof.attribution.analysis import Analysis, verdict_of
from qprof.attribution.categories import CATEGORIES, OTHER_BPF, PROBE_COST, UNCATEGORIZED, is_named_other
from qprof.attribution.timeline import Timeline
from qprof.archive import schema
from qprof.errors import QprofError
from qprof.jsonvalue import JsonObject, JsonValue
from qprof.viewer.report import Figures, ProcessReport, Report, report_of


def figures_dict(f: Figures) -> JsonObject:
    return {
        "cpu_seconds": f.cpu_seconds,
        "samples": f.samples,
        "categories": dict(f.categories),
        "category_cpu_seconds": dict(f.category_cpu_seconds),
        "category_samples": dict(f.category_samples),
        "subcategories": {c: dict(subs) for c, subs in f.subcategories.items()},
        "top_symbols": {c: [{"symbol": s.symbol, "dso": s.dso, "share": s.share, "cpu_seconds": s.cpu_seconds,
                             "samples": s.samples, "placed_by": [{"rule": r, "share": x} for r, x in s.placed_by]}
                            for s in symbols] for c, symbols in f.top_symbols.items()},
    }


def _at(doc: JsonValue, key: str) -> JsonValue:
    """A JSON object's member; None where there is no object or no such member."""
    return doc.get(key) if isinstance(doc, Mapping) else None


def unplaced_share(process: Mapping[str, JsonValue], probes_apart: bool = False) -> float:
    """A report process's Uncategorized share that qprof could not place: without what it names as the
    program's own code or its language runtime (and, with `probes_apart`, without eBPF programs' frames).
    `process`: an entry of a JSON report's `processes`, as written or read back from a file."""
    mine, share = _at(_at(process, "subcategories"), UNCATEGORIZED), _at(_at(process, "categories"), UNCATEGORIZED)
    if not isinstance(mine, Mapping) or not isinstance(share, (int, float)):
        raise QprofError("not a report's process: its categories and subcategories lack Uncategorized")
    named = sum(float(v) for s, v in mine.items() if isinstance(v, (int, float))
                and (is_named_other(s) or (probes_apart and s in (PROBE_COST, OTHER_BPF))))
    return float(share) - named


def process_dict(p: ProcessReport) -> JsonObject:
    return {
        "pid": p.pid, "comm": p.comm, "role": p.role, **figures_dict(p.figures),
        "proc_cpu_seconds": p.proc_cpu_seconds,
        "cpu_note": p.cpu_note,
        "dso_only_share": p.dso_only_share,
        "dso_only_shares": dict(p.dso_only_shares),
        "probe_share": p.probe_share,
        "probe_share_over_limit": p.probe_share_over_limit,
        "other_bpf_share": p.other_bpf_share,
        "mmsg_seen": list(p.mmsg_seen),
        "interrupt_skid": p.interrupt_skid.to_json(),
        "mappings": [m.to_json() for m in p.mappings],
        "application": p.application,
        "threads": [{"tid": t.tid, "comm": t.comm, **figures_dict(t.figures)} for t in p.threads],
        "thread_view": None if p.thread_view is None else p.thread_view.to_json(p.seconds_per_period),
        "transfer": None if p.transfer is None else p.transfer.to_json(),
        "wall_clock": None if p.wall_clock is None else p.wall_clock.to_json(),
        "round_trip": None if p.round_trip is None else p.round_trip.to_json(),
        "unnamed_share": p.unnamed_share,
        "symbols": [o.to_json() for o in p.symbols],
    }


def to_dict(report: Report) -> JsonObject:
    """The report as the JSON document `qprof report --format json` writes."""
    run = report.run
    return {
        "run": {
            "path": run.path,
            "status": run.status,
            "incomplete_reason": run.incomplete_reason,
            "start_time": run.start_time,
            "duration_s": run.duration_s,
            "stop_reason": run.stop_reason,
            # as recorded: the report carries these parts of meta.json over unchanged
            "sampling": schema.encode(run.sampling),
            "host": schema.encode(run.host),
            "tools": dict(run.tools),
            "probes": list(run.probes),
            "unwinding": {str(pid): {"mode": u.mode, "reason": u.reason} for pid, u in run.unwinding.items()},
        },
        "categories": list(CATEGORIES),
        "processes": [process_dict(p) for p in report.processes],
        "targets_without_samples": [e.to_json() for e in report.targets_without_samples],
        "services": [{"name": v.name, "role": v.role, "unit": v.unit,
                      "processes": [{"pid": m.pid, "comm": m.comm, "joined_s": m.joined_s, "exited": m.exited,
                                     "samples": m.samples, "cpu_seconds": m.cpu_seconds,
                                     "categories": dict(m.categories)} for m in v.members],
                      "sum": figures_dict(v.total)} for v in report.services],
        "packet_io": None if report.packet_io is None else report.packet_io.to_json(),
        "tcp": None if report.tcp is None else report.tcp.to_json(),
        "recommendations": [r.to_json() for r in report.recommendations],
        "verdict": None if report.verdict is None else report.verdict.to_json(),
        "crypto": None if report.crypto is None else report.crypto.to_json(),
        "observer_cpu_s": dict(report.observer_cpu_s),
        "observer_share_of_targets": report.observer_share_of_targets,
        **({"timeline": report.timeline.to_json()} if report.timeline is not None else {}),
    }


def merged_dict(analyses: list[Analysis], top: int = 10,
                timelines: list[Timeline | None] | None = None) -> JsonObject:
    """Several runs (e.g. server and client recorded on two hosts): every run, all processes, one verdict."""
    reports = [report_of(a, top, tl) for a, tl in zip(analyses, timelines or [None] * len(analyses))]
    v = verdict_of(analyses)
    return {"runs": [to_dict(r) for r in reports], "categories": list(CATEGORIES),
            "processes": [process_dict(p) for r in reports for p in r.processes],
            "verdict": None if v is None else v.to_json()}
