"""A run's attributed samples as an OTLP profiles export request, for an OpenTelemetry Collector.

Where fleets keep profiles now: the OpenTelemetry profiles signal
(`opentelemetry.proto.collector.profiles.v1development`, what the Collector,
Grafana Pyroscope and Elastic ingest). One ResourceProfiles per sampled
process, its resource the process and where it ran (`service.name` its comm,
`process.pid`, `host.name`, `host.arch`, `os.type`, `os.version` the kernel,
and `qprof.run.*`: the archive, its start and status, the process's role and
QUIC stack). Each folded stack is one Sample: its value the CPU nanoseconds
its samples stand for (as pprof's, viewer.pprof), its attributes qprof's
decision (`qprof.category`, `qprof.subcategory`) and who ran it
(`thread.id`, `thread.name`, `qprof.role`, `qprof.stack`). So a backend sums
a category's CPU time exactly as the report does.

Frames are the pprof export's: one Function and Location per (symbol,
object), the location at the function's start in its object, the object's
Mapping carrying its build-id (`process.executable.build_id.gnu`). Every
table of the request's shared dictionary starts with its zero value, as the
protocol asks.
"""

from __future__ import annotations

import hashlib

from opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2 import ExportProfilesServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.profiles.v1development import profiles_pb2 as P

from qprof.attribution.analysis import Analysis
from qprof.attribution.engine import Decision
from qprof.attribution.mapping import stack_name
from qprof.attribution.symbols import FrameAddresses
from qprof.archive.stacks import StackRecord
from qprof.version import __version__
from qprof.viewer.folded import frame_name
from qprof.viewer.pprof import NO_STACK, PprofCollector, Strings, start_nanos

# the attribute keys a backend groups by
CATEGORY, SUBCATEGORY, ROLE, STACK = "qprof.category", "qprof.subcategory", "qprof.role", "qprof.stack"
THREAD_ID, THREAD_NAME = "thread.id", "thread.name"


def _any(value: str | int) -> AnyValue:
    return AnyValue(int_value=value) if isinstance(value, int) else AnyValue(string_value=value)


class _Dictionary:
    """The request's shared tables, each entry stored once, index 0 the zero value."""

    def __init__(self) -> None:
        self.d = P.ProfilesDictionary()
        self.strings = Strings()
        self.d.mapping_table.add()
        self.d.location_table.add()
        self.d.function_table.add()
        self.d.link_table.add()
        self.d.attribute_table.add()
        self.d.stack_table.add()
        self._attrs: dict[tuple[str, str | int], int] = {}
        self._mappings: dict[str, int] = {}
        self._locations: dict[tuple[str, str], int] = {}
        self._stacks: dict[tuple[int, ...], int] = {}

    def attribute(self, key: str, value: str | int) -> int:
        i = self._attrs.get((key, value))
        if i is None:
            i = self._attrs[(key, value)] = len(self.d.attribute_table)
            self.d.attribute_table.add(key_strindex=self.strings(key), value=_any(value))
        return i

    def mapping(self, dso: str, build_id: str | None) -> int:
        i = self._mappings.get(dso)
        if i is None:
            i = self._mappings[dso] = len(self.d.mapping_table)
            attrs = [self.attribute("process.executable.build_id.gnu", build_id)] if build_id else []
            self.d.mapping_table.add(filename_strindex=self.strings(dso), attribute_indices=attrs)
        return i

    def location(self, sym: str, dso: str, build_id: str | None, address: int) -> int:
        i = self._locations.get((sym, dso))
        if i is None:
            i = self._locations[(sym, dso)] = len(self.d.location_table)
            f = len(self.d.function_table)
            self.d.function_table.add(name_strindex=self.strings(frame_name(sym, dso).removesuffix("_[k]")),
                                      system_name_strindex=self.strings(sym))
            self.d.location_table.add(mapping_index=self.mapping(dso, build_id), address=address,
                                      lines=[P.Line(function_index=f)])
        return i

    def stack(self, locations: tuple[int, ...]) -> int:
        i = self._stacks.get(locations)
        if i is None:
            i = self._stacks[locations] = len(self.d.stack_table)
            self.d.stack_table.add(location_indices=locations)
        return i

    def done(self) -> P.ProfilesDictionary:
        self.d.string_table.extend(self.strings.table)
        return self.d


def _kv(key: str, value: str | int | None) -> list[KeyValue]:
    return [] if value is None or value == "" else [KeyValue(key=key, value=_any(value))]


def otlp_request(analysis: Analysis, seen: PprofCollector, address: FrameAddresses) -> ExportProfilesServiceRequest:
    """The export request of the records `seen` during `analysis`'s attribution (one pass, the report's),
    each location at `address` (attribution.symbols: from the archive)."""
    run = analysis.profile.run
    info = run.meta
    host = info.host
    freq = info.sampling.frequency or 0
    scale = analysis.profile.seconds_per_period * 1e9
    build_ids = {o.path: o.build_id for t in info.targets for o in t.objects}
    dic = _Dictionary()
    req = ExportProfilesServiceRequest()
    by_pid: dict[int, list[tuple[StackRecord, Decision]]] = {}
    for rec, d in seen.seen:
        by_pid.setdefault(rec.pid, []).append((rec, d))
    for p in analysis.profile.processes:
        stack = stack_name(p.mappings)
        resource = [*_kv("service.name", p.comm), *_kv("process.pid", p.pid), *_kv("host.name", host.hostname),
                    *_kv("host.arch", host.machine), *_kv("os.type", "linux"), *_kv("os.version", host.kernel),
                    *_kv("qprof.run.path", str(run.path)), *_kv("qprof.run.start_time", info.start_time),
                    *_kv("qprof.run.status", info.status), *_kv(ROLE, p.role), *_kv(STACK, stack)]
        target = info.target(p.pid)
        if target is not None and target.exe:
            resource += _kv("process.executable.path", target.exe)
        prof = P.Profile(sample_type=P.ValueType(type_strindex=dic.strings("cpu"),
                                                 unit_strindex=dic.strings("nanoseconds")),
                         period_type=P.ValueType(type_strindex=dic.strings("cpu"),
                                                 unit_strindex=dic.strings("nanoseconds")),
                         period=int(1e9 / freq) if freq else 0, time_unix_nano=start_nanos(info.start_time),
                         duration_nano=int((info.duration_s or 0) * 1e9),
                         profile_id=hashlib.sha256(f"{run.path}\0{p.pid}".encode()).digest()[:16])
        for rec, d in by_pid.get(p.pid, []):
            frames = rec.frames or (NO_STACK,)
            locs = tuple(dic.location(sym, dso, build_ids.get(dso), address(sym, dso)) for sym, dso in frames)
            attrs = [dic.attribute(CATEGORY, d.category), dic.attribute(THREAD_ID, rec.tid),
                     dic.attribute(THREAD_NAME, rec.comm)]
            attrs += [dic.attribute(k, v) for k, v in ((SUBCATEGORY, d.subcategory), (ROLE, p.role), (STACK, stack))
                      if v]
            prof.samples.add(stack_index=dic.stack(locs), attribute_indices=attrs,
                             values=[round(rec.period * scale)])
        rp = req.resource_profiles.add()
        rp.resource.attributes.extend(resource)
        rp.scope_profiles.add(scope=InstrumentationScope(name="qprof", version=__version__), profiles=[prof])
    req.dictionary.CopyFrom(dic.done())
    return req


def category_nanos(req: ExportProfilesServiceRequest) -> dict[str, int]:
    """CPU nanoseconds per category in a request, summed as a backend would: by the samples' attribute."""
    d = req.dictionary
    out: dict[str, int] = {}
    for rp in req.resource_profiles:
        for sp in rp.scope_profiles:
            for prof in sp.profiles:
                for s in prof.samples:
                    for i in s.attribute_indices:
                        kv = d.attribute_table[i]
                        if d.string_table[kv.key_strindex] == CATEGORY:
                            out[kv.value.string_value] = out.get(kv.value.string_value, 0) + sum(s.values)
    return out
