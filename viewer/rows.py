"""Flat rows (one dict per row, fixed columns) from the JSON report: what DataFrames and tables are made of.

Why from the JSON report (viewer.json_report.to_dict) and not from the
analysis objects: the report is the one place numbers are computed and
rounded, so `qprof.load`, `qprof table` and `qprof report --format json` show
the same figures for the same run. Pure functions of dicts: no pandas here
(viewer.frames makes DataFrames of them), so they are cheap to test.

Every builder returns rows whose keys are exactly its *_COLUMNS tuple, in that
order; a value the run does not have (no probes, no roles) is None.
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path
from dataclasses import fields
from typing import Any, Iterable

from qprof.attribution.categories import CATEGORIES
from qprof.attribution.packetio import ProcessPacketIO
from qprof.attribution.stats import METHOD, median_ci
from qprof.attribution.verdict import SideEvidence

Row = dict[str, Any]
_REP = re.compile(r"rep-\d+")

CATEGORY_COLUMNS = ("run", "pid", "comm", "role", "stack", "category", "share", "cpu_seconds", "samples")
SYMBOL_COLUMNS = ("run", "pid", "comm", "role", "category", "symbol", "dso", "samples", "share", "cpu_seconds")
_DIRECTION_KEYS = tuple(ProcessPacketIO(0).tx.to_json())
_GSO_KEYS = tuple(ProcessPacketIO(0).gso)
_GRO_KEYS = tuple(ProcessPacketIO(0).gro)


_ESTIMATED = ("tx.datagrams", "tx.bytes", "rx.datagrams", "rx.bytes")  # report keys of estimates with intervals


def _estimate_columns(estimates: dict[str, Any]) -> Row:
    out: Row = {}
    for k in _ESTIMATED:
        low, high = (estimates.get(k) or {}).get("interval") or (None, None)
        out[f"{k.replace('.', '_')}_low"], out[f"{k.replace('.', '_')}_high"] = low, high
    return out


def _offload_column(group: str, key: str) -> str:
    return key if key.startswith(group) else f"{group}_{key}"


PROBE_COLUMNS = ("run", "pid", "comm", "role", "tid",
                 *(f"{d}_{k}" for d in ("tx", "rx") for k in _DIRECTION_KEYS),
                 *(_offload_column("gso", k) for k in _GSO_KEYS), *(_offload_column("gro", k) for k in _GRO_KEYS),
                 "ack_ratio", "drops", "drop_reasons", "ports",
                 # how the per-process counts were taken, and the 95% intervals of sampled ones
                 "counted", *(f"{k.replace('.', '_')}_{end}" for k in _ESTIMATED for end in ("low", "high")))
# per side: its facts and cause, the findings that decided it as `reasons` (every finding is in the JSON)
_EVIDENCE = tuple(f.name for f in fields(SideEvidence) if f.name != "findings") + ("reasons",)
VERDICT_COLUMNS = ("run", "limited_by", *_EVIDENCE, "summary", "notes")
RUN_COLUMNS = ("run", "status", "start_time", "duration_s", "stop_reason", "hostname", "cpus", "cpu_model",
               "kernel", "event", "frequency", "unwind", "probes", "stack", "perf", "samples", "cpu_seconds",
               "goodput_gbps", "verdict")
TABLE_COLUMNS = ("run", "start_time", "duration_s", "hostname", "frequency", "probes", "verdict",
                 "pid", "comm", "role", "stack", "unwind", "category", "share", "cpu_seconds", "samples",
                 "tx_bytes", "rx_bytes", "goodput_gbps", "cpu_limited")
SUMMARY_COLUMNS = ("configuration", "stack", "role", "category", "n", "share_median", "share_ci_low", "share_ci_high",
                   "cpu_seconds_median", "cpu_seconds_ci_low", "cpu_seconds_ci_high", "ci_coverage", "ci_note")


def _shape(row: Row, columns: tuple[str, ...]) -> Row:
    return {c: row.get(c) for c in columns}


def _joined(items: Iterable[Any], sep: str = ",") -> str | None:
    text = sep.join(str(i) for i in items)
    return text or None


def process_stack(process: dict[str, Any]) -> str | None:
    """The QUIC stack(s) whose mapping file the process was read with (auto-detected or --stack)."""
    return _joined((m["name"] for m in process.get("mappings", []) if m.get("kind") == "stack"), "+")


def _run_path(report: dict[str, Any]) -> str:
    return str(report["run"]["path"])


def category_rows(report: dict[str, Any]) -> list[Row]:
    """One row per process x category: share of its sampled CPU time, CPU seconds, samples."""
    run = _run_path(report)
    return [_shape({"run": run, "pid": p["pid"], "comm": p["comm"], "role": p["role"], "stack": process_stack(p),
                    "category": c, "share": p["categories"][c], "cpu_seconds": p["category_cpu_seconds"][c],
                    "samples": p["category_samples"][c]}, CATEGORY_COLUMNS)
            for p in report["processes"] for c in CATEGORIES]


def symbol_rows(report: dict[str, Any]) -> list[Row]:
    """One row per process x category x leaf symbol (self time), as many as the report lists."""
    run = _run_path(report)
    return [_shape({"run": run, "pid": p["pid"], "comm": p["comm"], "role": p["role"], "category": c, **s},
                   SYMBOL_COLUMNS)
            for p in report["processes"] for c in CATEGORIES for s in p["top_symbols"][c]]


def _direction_columns(tx: dict[str, Any], rx: dict[str, Any]) -> Row:
    return {**{f"tx_{k}": v for k, v in tx.items()}, **{f"rx_{k}": v for k, v in rx.items()}}


def probe_rows(report: dict[str, Any]) -> list[Row]:
    """Probe counters per process (tid None) and per thread: packets, bytes and calls each way,
    GSO/GRO, ACK ratio, drops at its ports; per process whether the counts are exact or sampled and the
    sampled ones' 95% intervals. No rows when the run had no probes."""
    pio = report.get("packet_io")
    if not pio:
        return []
    run = _run_path(report)
    who = {p["pid"]: p for p in report["processes"]}
    rows = []
    for pid_s, p in pio["processes"].items():
        pid = int(pid_s)
        base = {"run": run, "pid": pid, "comm": who.get(pid, {}).get("comm"), "role": who.get(pid, {}).get("role")}
        rows.append(_shape({**base, "tid": None, **_direction_columns(p["tx"], p["rx"]),
                            **{_offload_column("gso", k): v for k, v in p["gso"].items()},
                            **{_offload_column("gro", k): v for k, v in p["gro"].items()},
                            "ack_ratio": p["ack_ratio"], "drops": sum(p["drops"].values()),
                            "drop_reasons": _joined(f"{r}={n}" for r, n in sorted(p["drops"].items())),
                            "ports": _joined(p["ports"]), "counted": p.get("counted"),
                            **_estimate_columns(p.get("estimates") or {})}, PROBE_COLUMNS))
        for tid, t in p["threads"].items():
            rows.append(_shape({**base, "tid": int(tid), **_direction_columns(t["tx"], t["rx"])}, PROBE_COLUMNS))
    return rows


def _flat(value: Any) -> Any:
    if isinstance(value, dict):
        return _joined((f"{k}={v}" for k, v in value.items()), ";")
    if isinstance(value, list):
        return _joined(value, "; " if any(isinstance(v, str) for v in value) else ",")
    return value


def verdict_rows(report: dict[str, Any]) -> list[Row]:
    """One row per judged side (role) with its evidence, then one row with role "overall"; none without roles."""
    v = report.get("verdict")
    if not v:
        return []
    run = _run_path(report)
    common = {"run": run, "limited_by": v["limited_by"], "summary": v["summary"], "notes": _joined(v["notes"], " | ")}
    rows = [_shape({**common, **{k: _flat(x) for k, x in ev.items()}}, VERDICT_COLUMNS) for ev in v["evidence"].values()]
    rows.append(_shape({**common, "role": "overall", "cause": v.get("cause"),
                        "cpu_limited": str(v.get("cause", "")).startswith("cpu")}, VERDICT_COLUMNS))
    return rows


def _goodputs(report: dict[str, Any]) -> dict[int, float]:
    """Each process's goodput, as the report computed it once (its `transfer`: attribution.transfer)."""
    return {p["pid"]: p["transfer"]["gbps"] for p in report["processes"]
            if (p.get("transfer") or {}).get("gbps") is not None}


def run_goodput(report: dict[str, Any]) -> float | None:
    """The run's goodput: its client's (the receiving end of a download), else the largest process's."""
    goodputs = _goodputs(report)
    client = [goodputs[p["pid"]] for p in report["processes"] if p.get("role") == "client" and p["pid"] in goodputs]
    return client[0] if client else max(goodputs.values(), default=None)


def run_row(report: dict[str, Any]) -> Row:
    """The run's metadata: when, how long, where, how it was sampled, what it ran, how fast, the verdict."""
    r = report["run"]
    host, sampling = r.get("host") or {}, r.get("sampling") or {}
    procs = report["processes"]
    return _shape({
        "run": _run_path(report), "status": r.get("status"), "start_time": r.get("start_time"),
        "duration_s": r.get("duration_s"), "stop_reason": r.get("stop_reason"), "hostname": host.get("hostname"),
        "cpus": host.get("cpus"), "cpu_model": host.get("cpu_model"), "kernel": host.get("kernel"),
        "event": sampling.get("event"), "frequency": sampling.get("frequency"),
        "unwind": _joined(sorted({u.get("mode") for u in (r.get("unwinding") or {}).values() if u.get("mode")})),
        "probes": _joined(r.get("probes") or []), "stack": _joined(sorted({s for p in procs
                                                                            if (s := process_stack(p))}), "+"),
        "perf": (r.get("tools") or {}).get("perf"),
        "samples": sum(p["samples"] for p in procs), "cpu_seconds": round(sum(p["cpu_seconds"] for p in procs), 6),
        "goodput_gbps": run_goodput(report),
        "verdict": (report.get("verdict") or {}).get("limited_by"),
    }, RUN_COLUMNS)


def table_rows(report: dict[str, Any]) -> list[Row]:
    """`qprof table`'s rows for one run: one per process x category, with the run's metadata beside."""
    meta = run_row(report)
    unwinding = report["run"].get("unwinding") or {}
    pio = (report.get("packet_io") or {}).get("processes") or {}
    goodputs = _goodputs(report)
    limited = {ev["pid"]: ev["cpu_limited"] for ev in ((report.get("verdict") or {}).get("evidence") or {}).values()}
    rows = []
    for c in category_rows(report):
        io = pio.get(str(c["pid"]))
        rows.append(_shape({**meta, **c, "unwind": (unwinding.get(str(c["pid"])) or {}).get("mode"),
                            "tx_bytes": io["tx"]["bytes"] if io else None, "rx_bytes": io["rx"]["bytes"] if io else None,
                            "goodput_gbps": goodputs.get(c["pid"]), "cpu_limited": limited.get(c["pid"])},
                           TABLE_COLUMNS))
    return rows


def configuration(run: str) -> str:
    """The configuration a run belongs to: its directory's name, or its parent's for DIR/rep-NN (what
    `record --repeat` and `qprof study` write), so the runs of one configuration are its repetitions."""
    p = Path(run)
    return p.parent.name if _REP.fullmatch(p.name) and p.parent.name else p.name


def summary_rows(rows: list[Row], by_configuration: bool = False) -> list[Row]:
    """Per (stack, role, category) over the table's rows (the repetitions): median share and CPU
    seconds with a 95% distribution-free interval (attribution.stats). A process without a role is
    grouped by its comm instead, so a server and a client never pool. `by_configuration`: per
    configuration too (a study's settings never pool)."""
    groups: dict[tuple[Any, Any, Any, str], list[Row]] = defaultdict(list)
    for r in rows:
        conf = configuration(r["run"]) if by_configuration else None
        groups[(conf, r["stack"], r["role"] or r["comm"], r["category"])].append(r)
    out = []
    for (conf, stack, role, cat), members in sorted(groups.items(), key=lambda kv: (
            str(kv[0][0]), str(kv[0][1]), str(kv[0][2]), CATEGORIES.index(kv[0][3]))):
        share = median_ci([m["share"] for m in members if m["share"] is not None])
        cpu = median_ci([m["cpu_seconds"] for m in members if m["cpu_seconds"] is not None])
        out.append(_shape({"configuration": conf, "stack": stack, "role": role, "category": cat, "n": share.n,
                           "share_median": share.median, "share_ci_low": share.low, "share_ci_high": share.high,
                           "cpu_seconds_median": cpu.median, "cpu_seconds_ci_low": cpu.low,
                           "cpu_seconds_ci_high": cpu.high, "ci_coverage": share.coverage,
                           "ci_note": share.note}, SUMMARY_COLUMNS))
    return out


SUMMARY_METHOD = f"95% CI: {METHOD}"
