"""A run's attributed samples as a pprof Profile (gzipped protobuf), for the tools fleets already run.

`go tool pprof`, Grafana Pyroscope and Parca read pprof. Each folded stack of
the run becomes one Sample: its locations leaf first, its value the CPU
nanoseconds its samples stand for (the period sum, as the report weighs
them), and labels carrying qprof's attribution, so a pprof reader can slice
by what qprof decided: `category`, `subcategory`, `role`, `stack` (the
QUIC stack mapping file the process was read with), `comm`, `thread`
(strings) and `pid`, `tid` (numbers). The decisions are the report's own
(attribution.profile.Visitor, in the report's attribution pass), so
`go tool pprof -tagfocus=category=Crypto` shows the report's Crypto time.

Folded stacks keep (symbol, object) per frame, not each sample's address:
every distinct pair is one Function and one Location in the Mapping of its
object, with the build-id the archive recorded. A location's address is its
function's start in the object (the object mapped at 0, its virtual
addresses as they are): from the name qprof gave a stripped object's function
(`libx.so.1+0x5a3c0`, collectors.debuginfo), else as the run recorded it in
functions.json (collectors.functions), so the profile is the same wherever
and whenever it is made (attribution.symbols.FrameAddresses; 0 where none is
known); so a backend that symbolizes by build-id (as continuous profilers do
with debuginfod) can name them again. Mappings say they have functions.

The messages are built from the schema in `_SCHEMA` (google/pprof's
proto/profile.proto, package perftools.profiles, the fields qprof writes) with
the protobuf library's descriptor API: no generated code to keep in step with
the library's version.
"""

from __future__ import annotations

import gzip
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from qprof.attribution.analysis import Analysis
from qprof.attribution.engine import Decision
from qprof.attribution.mapping import stack_name
from qprof.attribution.symbols import FrameAddresses
from qprof.archive.model import Meta
from qprof.archive.stacks import StackRecord
from qprof.viewer.folded import frame_name

_PACKAGE = "perftools.profiles"
NO_STACK = ("[no stack]", "[unknown]")  # a sample perf could not unwind: the report's leaf for it too
_OPTIONAL, _REPEATED = 1, 3
# message -> (field, number, type, repeated); type is a scalar name or a message of this schema
_SCHEMA: dict[str, list[tuple[str, int, str, bool]]] = {
    "Profile": [("sample_type", 1, "ValueType", True), ("sample", 2, "Sample", True),
                ("mapping", 3, "Mapping", True), ("location", 4, "Location", True),
                ("function", 5, "Function", True), ("string_table", 6, "string", True),
                ("drop_frames", 7, "int64", False), ("keep_frames", 8, "int64", False),
                ("time_nanos", 9, "int64", False), ("duration_nanos", 10, "int64", False),
                ("period_type", 11, "ValueType", False), ("period", 12, "int64", False),
                ("comment", 13, "int64", True), ("default_sample_type", 14, "int64", False)],
    "ValueType": [("type", 1, "int64", False), ("unit", 2, "int64", False)],
    "Sample": [("location_id", 1, "uint64", True), ("value", 2, "int64", True), ("label", 3, "Label", True)],
    "Label": [("key", 1, "int64", False), ("str", 2, "int64", False), ("num", 3, "int64", False),
              ("num_unit", 4, "int64", False)],
    "Mapping": [("id", 1, "uint64", False), ("memory_start", 2, "uint64", False),
                ("memory_limit", 3, "uint64", False), ("file_offset", 4, "uint64", False),
                ("filename", 5, "int64", False), ("build_id", 6, "int64", False),
                ("has_functions", 7, "bool", False), ("has_filenames", 8, "bool", False),
                ("has_line_numbers", 9, "bool", False), ("has_inline_frames", 10, "bool", False)],
    "Location": [("id", 1, "uint64", False), ("mapping_id", 2, "uint64", False), ("address", 3, "uint64", False),
                 ("line", 4, "Line", True), ("is_folded", 5, "bool", False)],
    "Line": [("function_id", 1, "uint64", False), ("line", 2, "int64", False)],
    "Function": [("id", 1, "uint64", False), ("name", 2, "int64", False), ("system_name", 3, "int64", False),
                 ("filename", 4, "int64", False), ("start_line", 5, "int64", False)],
}
_SCALARS = {"int64": descriptor_pb2.FieldDescriptorProto.TYPE_INT64,
            "uint64": descriptor_pb2.FieldDescriptorProto.TYPE_UINT64,
            "bool": descriptor_pb2.FieldDescriptorProto.TYPE_BOOL,
            "string": descriptor_pb2.FieldDescriptorProto.TYPE_STRING}


@lru_cache(maxsize=1)
def profile_class() -> Any:
    """The perftools.profiles.Profile message class, built once from _SCHEMA in a pool of its own."""
    fdp = descriptor_pb2.FileDescriptorProto(name="qprof/pprof/profile.proto", package=_PACKAGE, syntax="proto3")
    for name, fields in _SCHEMA.items():
        msg = fdp.message_type.add(name=name)
        for fname, number, ftype, repeated in fields:
            f = msg.field.add(name=fname, number=number, label=_REPEATED if repeated else _OPTIONAL)
            if ftype in _SCALARS:
                f.type = _SCALARS[ftype]
            else:
                f.type = descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE
                f.type_name = f".{_PACKAGE}.{ftype}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{_PACKAGE}.Profile"))


@dataclass
class PprofCollector:
    """An attribution.profile.Visitor keeping each stack record with the report's decision for it."""

    seen: list[tuple[StackRecord, Decision]] = field(default_factory=list)

    def __call__(self, rec: StackRecord, decision: Decision) -> None:
        self.seen.append((rec, decision))


class Strings:
    """A profile's string table: index 0 is the empty string, each string stored once."""

    def __init__(self) -> None:
        self.table: list[str] = [""]
        self.index: dict[str, int] = {"": 0}

    def __call__(self, s: str) -> int:
        i = self.index.get(s)
        if i is None:
            i = self.index[s] = len(self.table)
            self.table.append(s)
        return i


def start_nanos(start_time: str | None) -> int:
    try:
        return int(datetime.fromisoformat(str(start_time)).timestamp() * 1e9)
    except ValueError:
        return 0


def pprof_bytes(analysis: Analysis, seen: PprofCollector, address: FrameAddresses) -> bytes:
    """The gzipped Profile of the records `seen` during `analysis`'s attribution, each location at
    `address` (attribution.symbols: from the archive; what it lacks is said in a comment)."""
    info = analysis.profile.run.meta
    strings = Strings()
    prof = profile_class()()
    prof.sample_type.add(type=strings("cpu"), unit=strings("nanoseconds"))
    prof.period_type.type, prof.period_type.unit = strings("cpu"), strings("nanoseconds")
    freq = info.sampling.frequency or 0
    prof.period = int(1e9 / freq) if freq else 0
    prof.time_nanos = start_nanos(info.start_time)
    prof.duration_nanos = int((info.duration_s or 0) * 1e9)
    build_ids = {o.path: o.build_id or "" for t in info.targets for o in t.objects}
    procs = {p.pid: p for p in analysis.profile.processes}
    stacks = {pid: stack_name(p.mappings) for pid, p in procs.items()}
    files = sorted({m.name for p in procs.values() for m in p.mappings})
    prof.comment.append(strings(f"qprof run {analysis.profile.run.path}; labels: category, subcategory, role, "
                                "stack, comm, thread, pid, tid (qprof's attribution)"))
    prof.comment.append(strings("mapping files: " + (", ".join(files) or "none")))
    mapping_ids: dict[str, int] = {}
    location_ids: dict[tuple[str, str], int] = {}
    scale = analysis.profile.seconds_per_period * 1e9

    def mapping(dso: str) -> int:
        mid = mapping_ids.get(dso)
        if mid is None:
            mid = mapping_ids[dso] = len(mapping_ids) + 1
            prof.mapping.add(id=mid, filename=strings(dso), build_id=strings(build_ids.get(dso, "")),
                             has_functions=True)
        return mid

    for t in info.targets:  # readers take mapping[0] for the main binary
        if t.exe and t.pid in procs:
            mapping(t.exe)

    def location(frame: tuple[str, str]) -> int:
        loc = location_ids.get(frame)
        if loc is not None:
            return loc
        sym, dso = frame
        mid = mapping(dso)
        loc = location_ids[frame] = len(location_ids) + 1
        # unnamed frames by their object, as the folded export names them (no kernel suffix: the
        # mapping says [kernel.kallsyms])
        prof.function.add(id=loc, name=strings(frame_name(sym, dso).removesuffix("_[k]")), system_name=strings(sym))
        prof.location.add(id=loc, mapping_id=mid, address=address(sym, dso)).line.add(function_id=loc)
        return loc

    for rec, d in seen.seen:
        p = procs.get(rec.pid)
        if p is None:
            continue
        frames = rec.frames or (NO_STACK,)
        s = prof.sample.add(location_id=[location(f) for f in frames], value=[round(rec.period * scale)])
        labels = [("category", d.category), ("subcategory", d.subcategory), ("role", p.role),
                  ("stack", stacks.get(rec.pid)), ("comm", p.comm), ("thread", rec.comm)]
        for key, value in labels:
            if value:
                s.label.add(key=strings(key), str=strings(value))
        s.label.add(key=strings("pid"), num=rec.pid)
        s.label.add(key=strings("tid"), num=rec.tid)
    note = address.note()
    if note is not None:
        prof.comment.append(strings(note))
    prof.string_table.extend(strings.table)
    return gzip.compress(prof.SerializeToString(), mtime=0)
