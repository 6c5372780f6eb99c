"""Two runs compared: per matched process, how each category's and each symbol's cost changed.

Costs are compared as shares of the process's sampled CPU time (percentage
points) and, where the bytes a process moved are known (its transfer's, as
every output counts them: the payload of the direction that moved more, UDP
from the packet I/O probes, TCP from the kernel's socket counters:
attribution.transfer), as CPU seconds per GB (10^9 bytes): so a QUIC run and a TCP+TLS
run of the same download compare what a byte costs each. Why both, and not CPU seconds alone: two runs rarely last as
long or move as much, so raw seconds mostly measure that; a share says where
the time went, CPU per GB says what a byte costs, so "Packet I/O doubled per
GB while its share rose 20 pp" survives a run that was twice as long.

Processes are matched as the user pairs them (`--pair A_PID:B_PID`), else by
role (server, client) when both runs have roles, by comm name otherwise;
several processes with one key are paired in order of CPU time (the second
named `key #2`). Symbols are leaf symbols (self time),
keyed by category, name and object file name, as the report's top symbols.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from qprof.attribution.analysis import Analysis
from qprof.attribution.categories import CATEGORIES
from qprof.attribution.method import MethodDifference
from qprof.attribution.profile import ProcessProfile, Profile
from qprof.attribution.transfer import Transfer
from qprof.archive.model import Target
from qprof.errors import QprofError
from qprof.jsonvalue import JsonObject

GB = 1e9


def _round6(x: float | None) -> float | None:
    return None if x is None else round(x, 6)


@dataclass(frozen=True)
class Side:
    """One matched process in one run."""

    pid: int
    comm: str
    role: str | None
    cpu_seconds: float
    samples: int
    udp_bytes: int | None  # UDP payload bytes sent + received (packet I/O probes); None: not counted
    tcp_bytes: int | None = None  # TCP payload bytes sent + received (socket counters); None: not counted
    moved: Transfer | None = None  # its transfer: the bytes per GB is taken over, and its goodput

    @property
    def bytes(self) -> int | None:
        """Its transfer's bytes (the direction that moved more), as the report counts them."""
        return self.moved.bytes if self.moved is not None and self.moved.bytes else None

    @property
    def gb(self) -> float | None:
        return self.bytes / GB if self.bytes else None

    def to_json(self) -> JsonObject:
        return {"pid": self.pid, "comm": self.comm, "role": self.role, "cpu_seconds": round(self.cpu_seconds, 6),
                "samples": self.samples, "udp_bytes": self.udp_bytes, "tcp_bytes": self.tcp_bytes,
                "bytes": self.bytes, "goodput_gbps": None if self.moved is None or self.moved.gbps is None
                else round(self.moved.gbps, 4)}


def _per_gb(cpu: float, side: Side) -> float | None:
    gb = side.gb
    return cpu / gb if gb else None


@dataclass(frozen=True)
class Change:
    """A category's or a symbol's cost in run A and run B."""

    category: str
    symbol: str | None  # None: the whole category
    dso: str | None
    share_a: float
    share_b: float
    cpu_a: float
    cpu_b: float
    per_gb_a: float | None
    per_gb_b: float | None

    @property
    def delta_pp(self) -> float:
        return (self.share_b - self.share_a) * 100

    @property
    def delta_per_gb(self) -> float | None:
        return None if self.per_gb_a is None or self.per_gb_b is None else self.per_gb_b - self.per_gb_a

    def to_json(self) -> JsonObject:
        r = _round6
        d: JsonObject = {"category": self.category}
        if self.symbol is not None:
            d.update(symbol=self.symbol, dso=self.dso)
        d.update(share_a=r(self.share_a), share_b=r(self.share_b), delta_pp=r(self.delta_pp),
                 cpu_seconds_a=r(self.cpu_a), cpu_seconds_b=r(self.cpu_b),
                 cpu_seconds_per_gb_a=r(self.per_gb_a), cpu_seconds_per_gb_b=r(self.per_gb_b),
                 delta_cpu_seconds_per_gb=r(self.delta_per_gb))
        return d


@dataclass
class ProcessDiff:
    key: str
    a: Side
    b: Side
    categories: list[Change]
    symbols: list[Change]  # the `top` largest changes in share, largest first

    def to_json(self) -> JsonObject:
        return {"key": self.key, "a": self.a.to_json(), "b": self.b.to_json(),
                "categories": [c.to_json() for c in self.categories],
                "symbols": [s.to_json() for s in self.symbols]}


def method_differences(a: Analysis, b: Analysis, pairs: list["ProcessDiff"]) -> list[MethodDifference]:
    """What the two runs measured differently: the run's sampling and probes, each pair's unwinding
    and mapping files (a wrapper that hid the program once gave one run DWARF and no Go mappings)."""
    ma, mb = a.profile.run.meta, b.profile.run.meta
    out: list[MethodDifference] = []

    def differ(what: str, key: str | None, va: str, vb: str) -> None:
        if va != vb:
            out.append(MethodDifference.of(what, () if key is None else (key,), (va, vb)))

    differ("sampling event", None, ma.sampling.event, mb.sampling.event)
    differ("sampling rate", None, f"{ma.sampling.frequency} Hz", f"{mb.sampling.frequency} Hz")
    differ("probes", None, ", ".join(sorted(ma.probes)) or "none", ", ".join(sorted(mb.probes)) or "none")
    ta, tb = {t.pid: t for t in ma.targets}, {t.pid: t for t in mb.targets}
    procs_a = {p.pid: p for p in a.profile.processes}
    procs_b = {p.pid: p for p in b.profile.processes}
    for pair in pairs:
        xa, xb = ta.get(pair.a.pid), tb.get(pair.b.pid)
        if xa is not None and xb is not None:
            differ("unwinding", pair.key, _unwinding(xa), _unwinding(xb))
        files = [_files(procs[pid]) for procs, pid in ((procs_a, pair.a.pid), (procs_b, pair.b.pid))]
        only_a, only_b = sorted(set(files[0]) - set(files[1])), sorted(set(files[1]) - set(files[0]))
        if only_a or only_b:
            differ("mapping files", pair.key, ", ".join(only_a) or "no other", ", ".join(only_b) or "no other")
    return out


def _unwinding(t: Target) -> str:
    """A target's unwinding modes in the order it ran them (a target that exec'd may have two)."""
    modes = list(dict.fromkeys(i.unwind for i in t.images if i.unwind)) or [t.unwind or "?"]
    return " then ".join(modes)


def _files(p: ProcessProfile) -> list[str]:
    return [f"{m.name} {m.version}".strip() for m in p.mappings]


@dataclass
class RunDiff:
    path_a: str
    path_b: str
    match_by: str  # "pid" (as given), "role" or "comm"
    pairs: list[ProcessDiff]
    only_a: list[str] = field(default_factory=list)
    only_b: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    method: list[MethodDifference] = field(default_factory=list)  # how the runs were measured differently

    def to_json(self) -> JsonObject:
        return {"runs": {"a": self.path_a, "b": self.path_b}, "match_by": self.match_by,
                "categories": list(CATEGORIES), "pairs": [p.to_json() for p in self.pairs],
                "unmatched": {"a": self.only_a, "b": self.only_b}, "notes": self.notes,
                "method_differences": [m.to_json() for m in self.method]}


def keyed(profile: Profile, match_by: str) -> dict[str, ProcessProfile]:
    """Each sampled process under its match key: role (or comm where it has none) or comm."""
    groups: dict[str, list[ProcessProfile]] = defaultdict(list)
    for p in profile.processes:
        groups[(p.role if match_by == "role" else None) or p.comm].append(p)
    out: dict[str, ProcessProfile] = {}
    for key, procs in groups.items():
        for i, p in enumerate(sorted(procs, key=lambda p: (-p.breakdown.period, p.pid))):
            out[key if i == 0 else f"{key} #{i + 1}"] = p
    return out


def _side(a: Analysis, p: ProcessProfile) -> Side:
    udp, tcp = a.bytes_moved(p.pid)
    return Side(p.pid, p.comm, p.role, a.profile.cpu_seconds(p.breakdown.period), p.breakdown.samples,
                udp or None, tcp or None, a.transfers.get(p.pid))


def _symbols(p: ProcessProfile) -> Counter[tuple[str, str, str]]:
    """Period per (category, symbol, object file name); the object's full path is kept apart."""
    out: Counter[tuple[str, str, str]] = Counter()
    for (cat, sym, dso), per in p.breakdown.symbols.items():
        out[(cat, sym, Path(dso).name)] += per
    return out


def _full_dso(*procs: ProcessProfile) -> dict[tuple[str, str, str], str]:
    return {(cat, sym, Path(dso).name): dso for p in procs for (cat, sym, dso) in p.breakdown.symbols}


def diff_process(key: str, a: Analysis, pa: ProcessProfile, b: Analysis, pb: ProcessProfile,
                 top: int) -> ProcessDiff:
    sa, sb = _side(a, pa), _side(b, pb)
    ta, tb = pa.breakdown.period or 1, pb.breakdown.period or 1

    def change(cat: str, sym: str | None, dso: str | None, per_a: int, per_b: int) -> Change:
        ca, cb = a.profile.cpu_seconds(per_a), b.profile.cpu_seconds(per_b)
        return Change(cat, sym, dso, per_a / ta, per_b / tb, ca, cb, _per_gb(ca, sa), _per_gb(cb, sb))

    cats = [change(c, None, None, pa.breakdown.categories[c], pb.breakdown.categories[c]) for c in CATEGORIES]
    syma, symb = _symbols(pa), _symbols(pb)
    dsos = _full_dso(pb, pa)
    syms = [change(k[0], k[1], dsos[k], syma[k], symb[k]) for k in set(syma) | set(symb)]
    order = {c: i for i, c in enumerate(CATEGORIES)}  # ties: the report's category order, then name
    syms.sort(key=lambda c: (-round(abs(c.delta_pp), 9), order.get(c.category, len(order)), c.symbol or ""))
    return ProcessDiff(key, sa, sb, cats, syms[:top])


def _listing(procs: dict[str, ProcessProfile]) -> str:
    return ", ".join(f"{k} (pid {p.pid} {p.comm})" for k, p in procs.items()) or "no sampled process"


def by_pid(profile: Profile, pids: list[int], path: str) -> dict[str, ProcessProfile]:
    """`pids`' processes under their pid as key; a pid without samples is refused with what there is."""
    procs = {p.pid: p for p in profile.processes}
    missing = [pid for pid in pids if pid not in procs]
    if missing:
        raise QprofError(f"--pair: no samples of pid {missing[0]} in {path} (its processes: "
                         f"{_listing({str(p.pid): p for p in profile.processes})}); give pids from `qprof report`")
    return {str(pid): procs[pid] for pid in pids}


def diff_runs(a: Analysis, b: Analysis, top: int = 10, pairs: list[tuple[int, int]] | None = None) -> RunDiff:
    """Match the two runs' processes and compare each pair (`top` symbols each): the `pairs` of pids
    given (A's, B's), else by role when both runs have roles (a one-process run recorded with a role
    pairs with a two-process run's same role), else by comm name. Raises QprofError when nothing matches."""
    path_a, path_b = str(a.profile.run.path), str(b.profile.run.path)
    if pairs:
        pa = by_pid(a.profile, [x for x, _ in pairs], path_a)
        pb = by_pid(b.profile, [y for _, y in pairs], path_b)
        chosen = [(f"{pa[str(x)].comm} {x} : {pb[str(y)].comm} {y}", pa[str(x)], pb[str(y)]) for x, y in pairs]
        return _diffed(a, b, top, "pid", [diff_process(k, a, x, b, y, top) for k, x, y in chosen], [], [])
    has_roles = all(any(p.role for p in x.profile.processes) for x in (a, b))
    match_by = "role" if has_roles else "comm"
    ka, kb = keyed(a.profile, match_by), keyed(b.profile, match_by)
    common = [k for k in ka if k in kb]
    if not common:
        how = "by role (server/client)" if has_roles else \
            "by comm name (give the runs roles: attach --server/--client, record --role)"
        raise QprofError(f"nothing to compare: {path_a} has {_listing(ka)}; {path_b} has {_listing(kb)}; "
                         f"diff pairs processes {how}, or as you say with --pair A_PID:B_PID")
    return _diffed(a, b, top, match_by, [diff_process(k, a, ka[k], b, kb[k], top) for k in common],
                   [k for k in ka if k not in kb], [k for k in kb if k not in ka])


def _diffed(a: Analysis, b: Analysis, top: int, match_by: str, pairs: list[ProcessDiff], only_a: list[str],
            only_b: list[str]) -> RunDiff:
    path_a, path_b = str(a.profile.run.path), str(b.profile.run.path)
    d = RunDiff(path_a, path_b, match_by, pairs, only_a, only_b, method=method_differences(a, b, pairs))
    for run, side in ((path_a, "a"), (path_b, "b")):
        unknown = [p.key for p in pairs if getattr(p, side).bytes is None]
        if unknown:
            d.notes.append(f"no byte counts for {', '.join(unknown)} in {run} (no UDP bytes from the packet I/O "
                           "probes, no TCP bytes from its sockets): CPU seconds per GB not shown for them")
    if d.only_a:
        d.notes.append(f"only in {path_a}: {', '.join(d.only_a)}")
    if d.only_b:
        d.notes.append(f"only in {path_b}: {', '.join(d.only_b)}")
    return d
