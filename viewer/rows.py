"""Flat rows (one dict per row, fixed columns) from the typed report: what DataFrames and tables are made of.

Why from the report (viewer.report) and not from the analysis objects: the
report is the one place numbers are rounded, so `qprof.load`, `qprof table`,
`qprof report` and its JSON show the same figures for the same run. Pure
functions of the report (and, for a table, of each run's recorded
configuration: place_runs): no pandas here (viewer.frames makes DataFrames of
them), so they are cheap to test.

Every builder returns rows whose keys are exactly its *_COLUMNS tuple, in that
order; a value the run does not have (no probes, no roles) is None.
"""

from __future__ import annotations

import os
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, fields
from enum import StrEnum
from pathlib import Path
from typing import Any, Iterable, Sequence

from qprof.archive.model import Meta
from qprof.attribution.categories import CATEGORIES
from qprof.attribution.method import MethodDifference
from qprof.attribution.packetio import Direction, Gro, Gso, ProcessPacketIO
from qprof.attribution.stats import METHOD, MedianCI, median_ci, min_n
from qprof.attribution.verdict import SideEvidence, Verdict
from qprof.viewer.report import Report, the_goodput

Cell = str | int | float | bool | None  # one value of a row: what a CSV file and a DataFrame hold
Row = dict[str, Cell]  # a row of a table (CSV, DataFrame) as its columns name its cells
_REP = re.compile(r"rep-(\d+)")

CATEGORY_COLUMNS = ("run", "pid", "comm", "role", "stack", "category", "share", "cpu_seconds", "samples")
SYMBOL_COLUMNS = ("run", "pid", "comm", "role", "category", "symbol", "dso", "samples", "share", "cpu_seconds")
_DIRECTION_KEYS = tuple(ProcessPacketIO(0).tx.to_json())
_GSO_KEYS = tuple(f.name for f in fields(Gso))
_GRO_KEYS = tuple(f.name for f in fields(Gro))


_ESTIMATED = ("tx.datagrams", "tx.bytes", "rx.datagrams", "rx.bytes")  # estimates with intervals


def _estimate_columns(p: ProcessPacketIO) -> Row:
    out: Row = {}
    for k in _ESTIMATED:
        e = p.estimates.get(k)
        low, high = (e.interval() if e is not None else None) or (None, None)
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
_EVIDENCE_FIELDS = tuple(f.name for f in fields(SideEvidence) if f.name != "findings")
_EVIDENCE = _EVIDENCE_FIELDS + ("reasons",)
VERDICT_COLUMNS = ("run", "limited_by", *_EVIDENCE, "summary", "notes")
RUN_COLUMNS = ("run", "status", "start_time", "duration_s", "stop_reason", "hostname", "cpus", "cpu_model",
               "kernel", "event", "frequency", "unwind", "probes", "stack", "perf", "samples", "cpu_seconds",
               "goodput_gbps", "verdict")
def _shape(row: Row, columns: tuple[str, ...]) -> Row:
    return {c: row.get(c) for c in columns}


def _joined(items: Iterable[Any], sep: str = ",") -> str | None:
    text = sep.join(str(i) for i in items)
    return text or None


def category_rows(report: Report) -> list[Row]:
    """One row per process x category: share of its sampled CPU time, CPU seconds, samples."""
    return [_shape({"run": report.run.path, "pid": p.pid, "comm": p.comm, "role": p.role, "stack": p.stack,
                    "category": c, "share": p.figures.categories[c], "cpu_seconds": p.figures.category_cpu_seconds[c],
                    "samples": p.figures.category_samples[c]}, CATEGORY_COLUMNS)
            for p in report.processes for c in CATEGORIES]


def symbol_rows(report: Report) -> list[Row]:
    """One row per process x category x leaf symbol (self time), as many as the report lists."""
    return [_shape({"run": report.run.path, "pid": p.pid, "comm": p.comm, "role": p.role, "category": c,
                    "symbol": s.symbol, "dso": s.dso, "samples": s.samples, "share": s.share,
                    "cpu_seconds": s.cpu_seconds}, SYMBOL_COLUMNS)
            for p in report.processes for c in CATEGORIES for s in p.figures.top_symbols[c]]


def _direction_columns(tx: Direction, rx: Direction) -> Row:
    return {**{f"tx_{k}": v for k, v in tx.to_json().items()}, **{f"rx_{k}": v for k, v in rx.to_json().items()}}


def probe_rows(report: Report) -> list[Row]:
    """Probe counters per process (tid None) and per thread: packets, bytes and calls each way,
    GSO/GRO, ACK ratio, drops at its ports; per process whether the counts are exact or sampled and the
    sampled ones' 95% intervals. No rows when the run had no probes."""
    if report.packet_io is None:
        return []
    who = {p.pid: p for p in report.processes}
    rows = []
    for pid, p in sorted(report.packet_io.processes.items()):
        seen = who.get(pid)
        base: Row = {"run": report.run.path, "pid": pid, "comm": seen.comm if seen else None,
                "role": seen.role if seen else None}
        rows.append(_shape({**base, "tid": None, **_direction_columns(p.tx, p.rx),
                            **{_offload_column("gso", k): v for k, v in p.gso.to_json().items()},
                            **{_offload_column("gro", k): v for k, v in p.gro.to_json().items()},
                            "ack_ratio": p.ack_ratio, "drops": sum(p.drops.values()),
                            "drop_reasons": _joined(f"{r}={n}" for r, n in sorted(p.drops.items())),
                            "ports": _joined(sorted(p.ports)), "counted": "exact" if p.exact else "sampled",
                            **_estimate_columns(p)}, PROBE_COLUMNS))
        for tid, (tx, rx) in sorted(p.threads.items()):
            rows.append(_shape({**base, "tid": tid, **_direction_columns(tx, rx)}, PROBE_COLUMNS))
    return rows


def _flat(value: Any) -> Any:
    if isinstance(value, StrEnum):
        return str(value)
    if isinstance(value, dict):
        return _joined((f"{k}={v}" for k, v in value.items()), ";")
    if isinstance(value, list):
        return _joined(value, "; " if any(isinstance(v, str) for v in value) else ",")
    return value


def _judged(v: Verdict) -> list[SideEvidence]:
    """The verdict's sides, one per role (the JSON report keys its evidence by role)."""
    return list({s.role: s for s in v.sides}.values())


def verdict_rows(report: Report) -> list[Row]:
    """One row per judged side (role) with its evidence as the report shows it, then one row with role
    "overall"; none without roles."""
    v = report.verdict
    if v is None:
        return []
    common = {"run": report.run.path, "limited_by": v.limited_by, "summary": v.summary,
              "notes": _joined(v.notes, " | ")}
    rows = []
    for side in _judged(v):
        shown = side.rounded()
        evidence = {name: _flat(getattr(shown, name)) for name in _EVIDENCE_FIELDS}
        rows.append(_shape({**common, **evidence, "reasons": _flat(shown.reasons)}, VERDICT_COLUMNS))
    rows.append(_shape({**common, "role": "overall", "cause": v.cause, "cpu_limited": v.cpu_limited},
                       VERDICT_COLUMNS))
    return rows


def run_row(report: Report) -> Row:
    """The run's metadata: when, how long, where, how it was sampled, what it ran, how fast, the verdict."""
    r, procs = report.run, report.processes
    return _shape({
        "run": r.path, "status": r.status, "start_time": r.start_time, "duration_s": r.duration_s,
        "stop_reason": r.stop_reason, "hostname": r.host.hostname, "cpus": r.host.cpus,
        "cpu_model": r.host.cpu_model, "kernel": r.host.kernel, "event": r.sampling.event,
        "frequency": r.sampling.frequency,
        "unwind": _joined(sorted({u.mode for u in r.unwinding.values() if u.mode})),
        "probes": _joined(r.probes), "stack": _joined(sorted({s for p in procs if (s := p.stack)}), "+"),
        "perf": r.tools.get("perf"),
        "samples": sum(p.figures.samples for p in procs),
        "cpu_seconds": round(sum(p.figures.cpu_seconds for p in procs), 6),
        "goodput_gbps": report.goodput_gbps,
        "verdict": report.verdict.limited_by if report.verdict is not None else None,
    }, RUN_COLUMNS)


# ---- where each run stands among the runs of a table ----------------------------------------------


def configuration(run: str) -> str:
    """The configuration a run without a recorded one belongs to (made by `attach` or an older qprof):
    its directory's name, or its parent's for DIR/rep-NN (what `record --repeat` and `qprof study`
    write), so the runs of one configuration are its repetitions."""
    p = Path(run)
    return p.parent.name if _REP.fullmatch(p.name) and p.parent.name else p.name


def _series_dir(run: str) -> str:
    """The directory of a run's series: DIR for DIR/rep-NN, the run itself otherwise."""
    p = Path(os.path.abspath(run))
    return str(p.parent if _REP.fullmatch(p.name) else p)


def _common_root(runs: Sequence[str]) -> str:
    """The deepest directory holding every run."""
    return os.path.commonpath([os.path.dirname(os.path.abspath(r)) for r in runs]) if runs else ""


def run_names(runs: Sequence[str]) -> dict[str, str]:
    """Each run's name in a table: its path relative to the common root of the runs given
    (`gso-off/rep-01`, not a bare `rep-01` that two configurations share)."""
    root = _common_root(runs)
    return {r: os.path.relpath(os.path.abspath(r), root) for r in runs}


@dataclass(frozen=True)
class TableRun:
    """A run's place among the runs of a table: the configuration it repeats and its repetition, as
    its meta.json records them (archive.model.Configuration). A run without one (made by `attach` or
    an older qprof) is placed as the path suggests (`configuration`), and `recorded` says so."""

    path: str  # as given, the report's run path
    configuration: str  # its name, one per configuration among the table's runs
    setting: str
    repetition: int | None
    recorded: bool


def place_runs(runs: Sequence[tuple[str, Meta]]) -> list[TableRun]:
    """The runs (path, meta) placed: runs pool only with runs of an equal recorded configuration (or,
    without one, of the same directory name). Two configurations with one name (a series named
    alike in two places, one study's setting against another's) are told apart by their series'
    directory, relative to the common root."""
    keyed: list[tuple[str, tuple[str, Any], str, str, int | None]] = []  # path, key, name, setting, repetition
    for path, meta in runs:
        c, rep = meta.configuration, (meta.record.repetition if meta.record is not None else None)
        if c is not None:
            keyed.append((path, ("recorded", c.key()), c.name, c.setting, rep))
        else:
            name = configuration(path)
            m = _REP.fullmatch(Path(path).name)
            keyed.append((path, ("path", name), name, name, int(m.group(1)) if m else rep))
    first: dict[Any, tuple[str, str]] = {}  # key -> (name, its first run)
    for path, key, name, _, _ in keyed:
        first.setdefault(key, (name, path))
    alike = Counter(name for name, _ in first.values())
    root = _common_root([p for p, *_ in keyed])
    labels = {key: name if alike[name] == 1 else f"{name} ({os.path.relpath(_series_dir(path), root)})"
              for key, (name, path) in first.items()}
    still, taken = Counter(labels.values()), Counter[str]()
    for key, label in labels.items():  # still alike (one directory, two configurations): numbered
        if still[label] > 1:
            taken[label] += 1
            labels[key] = f"{label} #{taken[label]}"
    return [TableRun(path, labels[key], setting, rep, key[0] == "recorded") for path, key, _, setting, rep in keyed]


@dataclass(frozen=True)
class TableRow:
    """One row of `qprof table`: a run x process x category, with the run's place among the table's runs
    (`configuration`, `setting`, `repetition`: TableRun) and its metadata beside; `event`, `frequency`,
    `scope`, `probes`, `mappings`, `unwind`: how it was measured, what pooled runs must share. Its
    fields are the table's columns, in order (TABLE_COLUMNS)."""

    run: str
    configuration: str
    setting: str
    repetition: int | None
    start_time: str | None
    duration_s: float | None
    hostname: str | None
    event: str
    frequency: int | None
    scope: str
    probes: str | None
    verdict: str | None
    cause: str | None
    pid: int
    comm: str
    role: str | None
    stack: str | None
    mappings: str | None
    unwind: str | None
    category: str
    share: float
    cpu_seconds: float
    samples: int
    tx_bytes: int | None
    rx_bytes: int | None
    goodput_gbps: float | None
    cpu_limited: bool | None
    configuration_recorded: bool

    def cells(self) -> Row:
        return {f.name: getattr(self, f.name) for f in fields(self)}


TABLE_COLUMNS = tuple(f.name for f in fields(TableRow))


def table_rows(report: Report, run: TableRun) -> list[TableRow]:
    """`qprof table`'s rows for one run: one per process x category, with the run's place among the
    table's runs (`run`: place_runs) and its metadata beside."""
    r = report.run
    pio = report.packet_io.processes if report.packet_io is not None else {}
    verdict = report.verdict
    limited = {ev.pid: ev.cpu_limited for ev in _judged(verdict)} if verdict is not None else {}
    rows = []
    for p in report.processes:
        io, unwinding = pio.get(p.pid), r.unwinding.get(p.pid)
        for c in CATEGORIES:
            rows.append(TableRow(
                r.path, run.configuration, run.setting, run.repetition, r.start_time, r.duration_s, r.host.hostname,
                r.sampling.event, r.sampling.frequency, r.sampling.scope_mode, _joined(r.probes),
                verdict.limited_by if verdict is not None else None, verdict.cause if verdict is not None else None,
                p.pid, p.comm, p.role, p.stack, _joined((f"{m.name} {m.version}" for m in p.mappings), ", "),
                unwinding.mode if unwinding is not None else None, c, p.figures.categories[c],
                p.figures.category_cpu_seconds[c], p.figures.category_samples[c],
                io.tx.bytes if io is not None else None, io.rx.bytes if io is not None else None,
                p.goodput_gbps, limited.get(p.pid), run.recorded))
    return rows


# ---- the summary over runs ----------------------------------------------------------------------------


def side_label(conf: str, stack: str | None, side: str) -> str:
    """A configuration's side: `ngtcp2/gso-on · server`, the stack named when the configuration is not."""
    name = conf if not stack or stack in conf else f"{stack} {conf}"
    return f"{name} · {side}"


def ci_note(ci: MedianCI, runs: int | None = None) -> str | None:
    """Why a median has no interval: the runs it has (of `runs`, when fewer measured it) and the runs
    one needs (attribution.stats.min_n)."""
    if ci.available:
        return None
    if ci.n == 0:
        return "no run measured it"
    had = f"{ci.n} of {runs} runs measured it" if runs is not None and ci.n < runs else \
        f"{ci.n} run{'s' if ci.n != 1 else ''}"
    return f"{had}; an interval needs {min_n()}"


@dataclass(frozen=True)
class ConfigurationSummary:
    """One configuration over its runs: how many, their goodput's median with its 95% interval, and
    the verdicts they gave (what the study asked: which is faster, and what limits it)."""

    configuration: str
    runs: int
    goodput: MedianCI  # Gbit/s: each run's (viewer.report.the_goodput)
    verdicts: tuple[tuple[str, int], ...]  # (verdict (cause), runs), most frequent first

    @property
    def verdicts_seen(self) -> str:
        return ", ".join(f"{v} x{n}" for v, n in self.verdicts)


def _verdict(row: TableRow) -> str:
    if row.verdict is None:
        return "no verdict (no roles)"
    return f"{row.verdict} ({row.cause})" if row.cause else row.verdict


def configuration_summaries(rows: Sequence[TableRow]) -> dict[str, ConfigurationSummary]:
    """Each configuration of the table's rows over its runs, in the order the configurations appear."""
    procs: dict[str, dict[str, dict[int, TableRow]]] = {}  # configuration -> run -> pid -> a row
    for r in rows:
        procs.setdefault(r.configuration, {}).setdefault(r.run, {}).setdefault(r.pid, r)
    out = {}
    for conf, runs in procs.items():
        goodputs = [g for ps in runs.values() if (g := the_goodput((p.role, p.goodput_gbps) for p in ps.values()
                                                                    if p.goodput_gbps is not None)) is not None]
        seen = Counter(_verdict(next(iter(ps.values()))) for ps in runs.values())
        out[conf] = ConfigurationSummary(conf, len(runs), median_ci(goodputs),
                                         tuple(sorted(seen.items(), key=lambda kv: (-kv[1], kv[0]))))
    return out


# How a run was measured, which runs pooled into one median must share: (column, its name in
# attribution.method, a value's unit).
_METHOD = (("event", "sampling event", ""), ("frequency", "sampling rate", " Hz"), ("scope", "sampling scope", ""),
           ("probes", "probes", ""), ("unwind", "unwinding", ""), ("mappings", "mapping files", ""))


Side = tuple[str, str | None, str]  # configuration, stack, role (or comm)


def _side_key(r: TableRow) -> Side:
    """What a summary pools over: a configuration's side (a process without a role by its comm, so a
    server and a client never pool)."""
    return (r.configuration, r.stack, r.role or r.comm)


def _natural(value: str) -> tuple[int, float, str]:
    """Numbers in numeric order (999 before 4999), then words."""
    try:
        return (0, float(value.split()[0]), value)
    except (ValueError, IndexError):
        return (1, 0.0, value)


def method_differences(rows: Sequence[TableRow]) -> list[MethodDifference]:
    """Every respect in which runs pooled into one side of a configuration were measured differently."""
    sides: dict[Side, list[TableRow]] = defaultdict(list)
    for r in rows:
        sides[_side_key(r)].append(r)
    out = []
    for side, members in sides.items():
        cells = [m.cells() for m in members]
        for column, what, unit in _METHOD:
            values = sorted({"none" if c[column] is None else str(c[column]) for c in cells}, key=_natural)
            if len(values) > 1:
                out.append(MethodDifference.of(what, tuple(None if x is None else str(x) for x in side),
                                               tuple(v if v == "none" else v + unit for v in values)))
    return out


@dataclass(frozen=True)
class Notice:
    """A line under a summary (and on stderr when the summary goes to a file)."""

    text: str
    warning: bool = False  # loud: the summary pools what should not be pooled


def summary_notices(rows: Sequence[TableRow]) -> list[Notice]:
    """What the reader of a summary must know besides its figures: runs pooled though measured
    differently (one warning line naming what differs, where, and what it moves), and runs whose
    configuration was not recorded, grouped by their directory's name."""
    out = []
    by_what: dict[tuple[str, str], tuple[set[str], dict[str, list[str]]]] = {}
    for d in method_differences(rows):
        values, where = by_what.setdefault((d.what, d.affects), (set(), {}))
        values.update(d.values)
        conf, stack, side = (str(x or "") for x in d.where)  # a summary's side: never None but the stack
        where.setdefault(conf, []).append(side if not stack or stack in conf else f"{stack} {side}")
    if by_what:
        parts = []
        for (what, affects), (values, where) in by_what.items():
            places = ", ".join(f"{conf} ({', '.join(sides)})" for conf, sides in where.items())
            parts.append(f"{what} ({' vs '.join(sorted(values, key=_natural))}) in {places}: {affects}")
        out.append(Notice("runs pooled into one summary row were measured differently, record them alike or "
                          "give them apart | " + " | ".join(parts), warning=True))
    inferred = {r.run: r.configuration for r in rows if not r.configuration_recorded}
    if inferred:
        one = len(inferred) == 1
        out.append(Notice(f"{len(inferred)} run{'' if one else 's'} ({', '.join(sorted(set(inferred.values())))}) "
                          f"{'has' if one else 'have'} no configuration in meta.json (made by `attach` or an "
                          "older qprof): grouped by their directory's name (DIR for DIR/rep-NN)"))
    return out


@dataclass(frozen=True)
class SummaryRow:
    """One row of the summary over runs: a configuration x side x category, its median share and CPU
    seconds with their 95% intervals; `runs` to `verdicts` are the configuration's, on each of its
    rows. Its fields are the summary's columns, in order (SUMMARY_COLUMNS)."""

    configuration: str
    setting: str
    stack: str | None
    role: str  # the side: its role, or its comm
    category: str
    n: int
    share_median: float | None
    share_ci_low: float | None
    share_ci_high: float | None
    cpu_seconds_median: float | None
    cpu_seconds_ci_low: float | None
    cpu_seconds_ci_high: float | None
    ci_coverage: float | None
    ci_note: str | None
    runs: int
    goodput_gbps_median: float | None
    goodput_gbps_ci_low: float | None
    goodput_gbps_ci_high: float | None
    goodput_ci_note: str | None
    verdicts: str
    method_differs: str | None
    configuration_recorded: bool

    def cells(self) -> Row:
        return {f.name: getattr(self, f.name) for f in fields(self)}


SUMMARY_COLUMNS = tuple(f.name for f in fields(SummaryRow))


def summary_rows(rows: Sequence[TableRow]) -> list[SummaryRow]:
    """Per configuration x side x category over the table's rows (the repetitions): median share and
    CPU seconds with a 95% distribution-free interval (attribution.stats); beside them the
    configuration's runs, goodput (median and interval) and verdicts, and what its pooled runs did
    not share in method. Runs of two configurations never pool (place_runs)."""
    groups: dict[tuple[str, str | None, str, str], list[TableRow]] = defaultdict(list)
    for r in rows:
        groups[(*_side_key(r), r.category)].append(r)
    confs = configuration_summaries(rows)
    differs: dict[tuple[str | None, ...], list[MethodDifference]] = defaultdict(list)
    for d in method_differences(rows):
        differs[d.where].append(d)
    out = []
    for (conf, stack, role, cat), members in sorted(groups.items(), key=lambda kv: (
            str(kv[0][0]), str(kv[0][1]), str(kv[0][2]), CATEGORIES.index(kv[0][3]))):
        share = median_ci([m.share for m in members])
        cpu = median_ci([m.cpu_seconds for m in members])
        c = confs[conf]
        out.append(SummaryRow(
            conf, members[0].setting, stack, role, cat, share.n, share.median, share.low, share.high, cpu.median,
            cpu.low, cpu.high, share.coverage, ci_note(share), c.runs, c.goodput.median, c.goodput.low,
            c.goodput.high, ci_note(c.goodput, c.runs), c.verdicts_seen,
            _joined((f"{d.what}: {' vs '.join(d.values)}"
                     for d in differs[tuple(None if x is None else str(x) for x in (conf, stack, role))]), "; "),
            members[0].configuration_recorded))
    return out


SUMMARY_METHOD = f"95% CI: {METHOD}"
