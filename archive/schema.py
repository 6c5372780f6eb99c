"""The shapes of the archive's documents, checked once when a run is opened; typed records decoded.

An archive is data from another machine or an older qprof, possibly cut or edited:
reports must not crash deep in the analysis on a field of the wrong type. Each
document is checked against the shape qprof writes (fields may be absent; when
present they have this type), and a mismatch is one line naming the file and the
field: `meta.json: targets[0].pid must be an integer`. NaN and Infinity, which
Python's json accepts but JSON does not, are refused while parsing (`loads`).

A document written from a typed record (meta.json from archive.model.Meta, each line of
proc.jsonl from ProcReading, tcp.json from TcpRecord) has its
shape derived from the record's type hints (`shape_of`) and is read back by the same
hints (`decode`): the record is the one description of the document.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import types
import typing
from typing import Any, Callable

from qprof.archive.model import (INLINE, NEVER_NULL, NULL_IS_ABSENT, CryptoFindings, HostSnapshot, ProcReading,
                                 TcpRecord, UdpSocket)
from qprof.archive.model import FunctionStarts

from qprof.errors import QprofError


class Of:
    """A spec node: `check(value, where)` returns a complaint or None."""

    desc = "?"

    def check(self, value: Any, where: str) -> str | None:  # pragma: no cover - interface
        raise NotImplementedError


class T(Of):
    """A scalar type: int (not bool), float (any finite number), str, bool; or None when `null`."""

    def __init__(self, *types: type | None) -> None:
        self.types = types
        names: dict[type | None, str] = {int: "an integer", float: "a number", str: "a string", bool: "true or false",
                                         None: "null"}
        self.desc = " or ".join(names[t] for t in types)

    def check(self, value: Any, where: str) -> str | None:
        for t in self.types:
            if t is None and value is None:
                return None
            if t is bool and isinstance(value, bool):
                return None
            if t is int and isinstance(value, int) and not isinstance(value, bool):
                return None
            if t is float and isinstance(value, (int, float)) and not isinstance(value, bool) and \
                    math.isfinite(value):
                return None
            if t is str and isinstance(value, str):
                return None
        return f"{where} must be {self.desc}"


ANY = T(int, float, str, bool, None)


class Anything(Of):
    desc = "anything"

    def check(self, value: Any, where: str) -> str | None:
        return None


class List(Of):
    """A JSON list whose items have one shape; `length`: of exactly that many items."""

    def __init__(self, item: Any, length: int | None = None) -> None:
        self.item = spec(item)
        self.length = length
        self.desc = "a list" if length is None else f"a list of {length}"

    def check(self, value: Any, where: str) -> str | None:
        if not isinstance(value, list) or (self.length is not None and len(value) != self.length):
            return f"{where} must be {self.desc}"
        for i, v in enumerate(value):
            bad = self.item.check(v, f"{where}[{i}]")
            if bad:
                return bad
        return None


class Obj(Of):
    """A JSON object with known fields (each optional; others allowed)."""

    def __init__(self, fields: dict[str, Any], required: tuple[str, ...] = ()) -> None:
        self.fields = {k: spec(v) for k, v in fields.items()}
        self.required = required
        self.desc = "an object"

    def check(self, value: Any, where: str) -> str | None:
        if not isinstance(value, dict):
            return f"{where} must be an object"
        for k in self.required:
            if k not in value:
                return f"{where} lacks `{k}`"
        for k, s in self.fields.items():
            if k in value:
                bad = s.check(value[k], f"{where}.{k}" if where else k)
                if bad:
                    return bad
        return None


class MapOf(Of):
    """A JSON object with free keys whose values all have one shape; `numbered`: the keys are
    decimal numbers (CPUs, pids, thread ids), which readers turn into ints."""

    def __init__(self, item: Any, numbered: bool = False) -> None:
        self.item = spec(item)
        self.numbered = numbered
        self.desc = "an object"

    def check(self, value: Any, where: str) -> str | None:
        if not isinstance(value, dict):
            return f"{where} must be an object"
        for k, v in value.items():
            if self.numbered and not (isinstance(k, str) and k.isascii() and k.isdigit()):
                return f"{where} keys must be decimal numbers, not {k!r}"
            bad = self.item.check(v, f"{where}[{k!r}]")
            if bad:
                return bad
        return None


class Either(Of):
    def __init__(self, *options: Any) -> None:
        self.options = [spec(o) for o in options]
        self.desc = " or ".join(o.desc for o in self.options)

    def check(self, value: Any, where: str) -> str | None:
        if any(o.check(value, where) is None for o in self.options):
            return None
        return f"{where} must be {self.desc}"


def spec(s: Any) -> Of:
    if isinstance(s, Of):
        return s
    if isinstance(s, dict):
        return Obj(s)
    if isinstance(s, list):
        return List(s[0])
    if s is Any:
        return Anything()
    return T(s)


# ---- shapes and decoding derived from a typed record's hints ---------------------------------------

_SCALARS = (int, float, str, bool, type(None))


def _args(hint: Any) -> tuple[Any, ...]:
    return typing.get_args(hint)


def _is_union(hint: Any) -> bool:
    return typing.get_origin(hint) in (typing.Union, types.UnionType)


@functools.lru_cache(maxsize=None)
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _fields(cls: type) -> list[dataclasses.Field[Any]]:
    return [f for f in dataclasses.fields(cls) if f.init]


def _marked(f: dataclasses.Field[Any], marker: dict[str, bool]) -> bool:
    """The field carries one of the model's markers (NEVER_NULL, NULL_IS_ABSENT, INLINE)."""
    return all(f.metadata.get(k) == v for k, v in marker.items())


def _field_shape(f: dataclasses.Field[Any], hint: Any) -> Of:
    """A field marked `never_null` (model.NEVER_NULL) is `X | None` only so that older archives may
    lack it: the key may be absent, but when written it holds an X, never null. A map marked
    `null_is_absent` (model.NULL_IS_ABSENT) takes null values, which older archives wrote for none."""
    if _marked(f, NEVER_NULL) and _is_union(hint):
        rest = [o for o in _args(hint) if o is not type(None)]
        return shape_of(rest[0] if len(rest) == 1 else typing.Union[tuple(rest)])
    if _marked(f, NULL_IS_ABSENT):
        key, value = _args(hint)
        return MapOf(Either(T(None), shape_of(value)), numbered=key is int)
    return shape_of(hint)


def _record_shape(cls: type) -> Obj:
    h = _hints(cls)
    fields: dict[str, Of] = {}
    required: list[str] = []
    for f in _fields(cls):
        if _marked(f, INLINE):
            inner = _record_shape(h[f.name])
            fields.update(inner.fields)
            required += inner.required
            continue
        fields[f.name] = _field_shape(f, h[f.name])
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            required.append(f.name)
    return Obj(fields, required=tuple(required))


@functools.lru_cache(maxsize=None)
def shape_of(hint: Any) -> Of:
    """The JSON shape a record type is written in: a dataclass is an object whose fields without a
    default are required; `X | None` may be null; lists and tuples are lists; `dict[int, X]` has
    decimal-number keys; `tuple[X, X]` is a list of exactly two."""
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return _record_shape(hint)
    if hint is Any:
        return Anything()
    if _is_union(hint):
        opts = _args(hint)
        if all(o in _SCALARS for o in opts):
            return T(*(None if o is type(None) else o for o in opts))
        return Either(*(T(None) if o is type(None) else shape_of(o) for o in opts))
    origin = typing.get_origin(hint)
    if origin is tuple and _args(hint)[-1] is not Ellipsis:
        return List(shape_of(_args(hint)[0]), length=len(_args(hint)))
    if origin in (list, tuple):
        return List(shape_of(_args(hint)[0]))
    if origin is dict:
        key, value = _args(hint)
        return MapOf(shape_of(value), numbered=key is int)
    if hint in _SCALARS:
        return T(None if hint is type(None) else hint)
    raise TypeError(f"no JSON shape for {hint!r}")


def decode(hint: Any, value: Any) -> Any:
    """`value`, a document already checked against `shape_of(hint)`, as the typed record. Fields the
    document lacks (an older archive) take the record's defaults; fields it does not know are left."""
    return _decoder(hint)(value)


def _same(value: Any) -> Any:
    return value


@functools.lru_cache(maxsize=None)
def _decoder(hint: Any) -> Callable[[Any], Any]:
    """The decoder of one type, made once: proc.jsonl holds a reading every 0.25 s, thousands an hour,
    each read through the same few records."""
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        h = _hints(hint)
        parts = [(f.name, _marked(f, INLINE), _marked(f, NULL_IS_ABSENT), _decoder(h[f.name])) for f in _fields(hint)]
        cls = hint

        def record(value: Any) -> Any:
            kw = {}
            for name, inline, nulls_absent, dec in parts:
                if inline:
                    kw[name] = dec(value)
                elif name in value:
                    v = value[name]
                    kw[name] = dec({k: x for k, x in v.items() if x is not None} if nulls_absent else v)
            return cls(**kw)
        return record
    if hint is Any or hint in (int, str, bool, type(None)):
        return _same
    if hint is float:
        return float
    if _is_union(hint):
        opts = [o for o in _args(hint) if o is not type(None)]
        if len(opts) != 1:
            return _same  # a union of scalars: as written
        inner = _decoder(opts[0])
        return lambda value: None if value is None else inner(value)
    origin = typing.get_origin(hint)
    if origin in (list, tuple):
        item = _decoder(_args(hint)[0])
        if origin is list:
            return lambda value: [item(v) for v in value]
        return lambda value: tuple(item(v) for v in value)
    if origin is dict:
        key, value_hint = _args(hint)
        item = _decoder(value_hint)
        if key is int:
            return lambda value: {int(k): item(v) for k, v in value.items()}
        return lambda value: {k: item(v) for k, v in value.items()}
    raise TypeError(f"cannot decode {hint!r}")


def encode(record: Any) -> Any:
    """A record as its JSON document (int keys become decimal strings when dumped); a `never_null`
    field left None is left out, as older archives lack it; an `inline` record's fields join its parent's."""
    if dataclasses.is_dataclass(record) and not isinstance(record, type):
        out: dict[str, Any] = {}
        for f in dataclasses.fields(record):
            v = getattr(record, f.name)
            if _marked(f, INLINE):
                out.update(encode(v))
            elif not (v is None and _marked(f, NEVER_NULL)):
                out[f.name] = encode(v)
        return out
    if isinstance(record, (list, tuple)):
        return [encode(v) for v in record]
    if isinstance(record, dict):
        return {k: encode(v) for k, v in record.items()}
    return record


INT, NUM, STR, BOOL = T(int), T(float), T(str), T(bool)
OPT_INT, OPT_NUM, OPT_STR = T(int, None), T(float, None), T(str, None)

_HIST = [{"min": OPT_NUM, "max": OPT_NUM, "count": NUM}]
_MAP = MapOf(Either(NUM, _HIST, MapOf(Either(NUM, _HIST))))
# the packetio sampler's window statistics (probes/packetio/windows.py), printed as "@windows"
_WINDOWS = Obj({"series": [STR], "periods": INT, "full_periods": INT, "span_s": NUM, "counted_s": NUM,
                "expansion": NUM,
                "groups": MapOf(Obj({"netns": STR, "sum": [NUM], "counted": [NUM], "seen": [INT], "q": [NUM],
                                     "since": [NUM]},
                                    required=("sum", "counted", "q"))),
                "netns": MapOf({"pids": [INT], "mib_in": NUM, "mib_out": NUM, "ip_out_octets": NUM}), "final": BOOL,
                "events": MapOf(NUM), "budget": MapOf(NUM)},
               required=("series", "periods", "full_periods", "groups"))
_QDISC = Obj({"dev": OPT_STR, "kind": OPT_STR, "handle": OPT_STR, "bytes": OPT_NUM, "packets": OPT_NUM,
              "drops": OPT_NUM, "overlimits": OPT_NUM, "requeues": OPT_NUM, "backlog": OPT_NUM, "qlen": OPT_NUM})
PROBES = Obj({
    "groups": [STR], "unavailable": [Obj({"probe": STR, "reason": STR}, required=("probe", "reason"))],
    "bpftrace_version": OPT_STR,
    "programs": MapOf({"maps": MapOf(Either(_MAP, _WINDOWS)), "output": STR, "script": STR, "exit": OPT_INT,
                       "log_tail": OPT_STR, "attach_seconds": OPT_NUM, "started": OPT_NUM, "cpu_s": OPT_NUM,
                       "series": STR}),
    "before": shape_of(HostSnapshot), "after": shape_of(HostSnapshot),
    "cost": Obj({"bpf_run_cnt": NUM, "bpf_run_time_ns": NUM, "measured_run_cnt": NUM,
                 "measured_run_time_ns": NUM, "probes_s": NUM, "stats_on_s": NUM, "method": STR,
                 "programs": [{"id": OPT_INT, "name": OPT_STR, "type": OPT_STR, "run_cnt": OPT_NUM,
                               "run_time_ns": OPT_NUM}],
                 "by_group": MapOf({"bpf_run_cnt": NUM, "bpf_run_time_ns": NUM})},
                required=("bpf_run_cnt", "bpf_run_time_ns")),
    "drop_reason_names": shape_of(dict[int, str]), "sockets_error": OPT_STR,
    "sockets": shape_of(list[UdpSocket]),
    "crypto": shape_of(CryptoFindings),
    "qdiscs": MapOf(Obj({"pids": [INT], "first": [_QDISC], "last": [_QDISC], "first_time": NUM, "last_time": NUM})),
})

TCP = shape_of(TcpRecord)
PROC_READING = shape_of(ProcReading)  # a line of proc.jsonl
FUNCTIONS = shape_of(FunctionStarts)  # functions.json


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def loads(text: str | bytes) -> Any:
    """json.loads without NaN/Infinity (ValueError like any other malformed JSON); bytes are UTF-8."""
    return json.loads(text, parse_constant=_no_constant)


def validate(doc: Any, shape: Of, name: str) -> None:
    """Raise one line naming `name` and the first field that has the wrong shape."""
    bad = shape.check(doc, "")
    if bad:
        raise QprofError(f"{name}: {bad.lstrip() if not bad.startswith(' must') else 'the document' + bad}; "
                         "the archive is damaged or from an incompatible qprof")


def conforms(doc: Any, shape: Of) -> bool:
    return shape.check(doc, "") is None


def probe_maps(maps: Any) -> dict[str, Any]:
    """The maps of one probe snapshot that have a map's shape; for readers that go on without
    the others (the live view), where an archive's reader refuses the whole document."""
    if not isinstance(maps, dict):
        return {}
    return {k: v for k, v in maps.items() if isinstance(k, str) and
            (_MAP.check(v, "") is None or (k == "@windows" and _WINDOWS.check(v, "") is None))}
