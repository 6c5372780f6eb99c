"""The shapes of the archive's documents, checked once when a run is opened; typed records decoded.

An archive is data from another machine or an older qprof, possibly cut or edited:
reports must not crash deep in the analysis on a field of the wrong type. Each
document is checked against the shape qprof writes (fields may be absent; when
present they have this type), and a mismatch is one line naming the file and the
field: `meta.json: targets[0].pid must be an integer`. NaN and Infinity, which
Python's json accepts but JSON does not, are refused while parsing (`loads`).

Every document is written from a typed record (meta.json from archive.model.Meta, each line of
proc.jsonl from ProcReading, probes.json from ProbeRecord, tcp.json from TcpRecord) and has its
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

from qprof.archive.model import (INLINE, NEVER_NULL, NULL_IS_ABSENT, ProbeMaps, ProbeRecord, ProcReading, RawMap,
                                 TcpRecord)
from qprof.archive.model import FunctionStarts
from qprof.jsonvalue import Json
from qprof.probes.packetio.maps import Windows

from qprof.errors import QprofError


class Of:
    """A spec node: `check(value, where)` returns a complaint or None."""

    desc = "?"

    def check(self, value: Any, where: str) -> str | None:  # pragma: no cover - interface
        raise NotImplementedError

    def ok(self, value: Any) -> bool:
        """`check` without the complaint: no path strings are built (a report checks thousands of
        readings, nearly all good; the complaint is asked for only when one is not)."""
        return self.check(value, "") is None


class T(Of):
    """A scalar type: int (not bool), float (any finite number), str, bool; or None when `null`."""

    def __init__(self, *types: type | None) -> None:
        self.types = types
        names: dict[type | None, str] = {int: "an integer", float: "a number", str: "a string", bool: "true or false",
                                         None: "null"}
        self.desc = " or ".join(names[t] for t in types)
        # exact types accepted without more: a float (any number) is also one written as an integer
        exact = {type(None) if t is None else t for t in types}
        self._exact = frozenset(exact | ({int} if float in exact else set()))

    def ok(self, value: Any) -> bool:
        """The common case fast (a value of exactly one of the types, as json.loads makes them);
        anything else is asked of `check`, which also takes subclasses."""
        kind = type(value)
        if kind in self._exact:
            return kind is not float or math.isfinite(value)
        return self.check(value, "") is None

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


class Anything(Of):
    desc = "anything"

    def check(self, value: Any, where: str) -> str | None:
        return None

    def ok(self, value: Any) -> bool:
        return True


class List(Of):
    """A JSON list whose items have one shape; `length`: of exactly that many items."""

    def __init__(self, item: Of, length: int | None = None) -> None:
        self.item = item
        self.length = length
        self.desc = "a list" if length is None else f"a list of {length}"

    def check(self, value: Any, where: str) -> str | None:
        if not isinstance(value, list) or (self.length is not None and len(value) != self.length):
            return f"{where} must be {self.desc}"
        if all(map(self.item.ok, value)):
            return None
        for i, v in enumerate(value):
            bad = self.item.check(v, f"{where}[{i}]")
            if bad:
                return bad
        return None


class Obj(Of):
    """A JSON object with known fields (each optional; others allowed)."""

    def __init__(self, fields: dict[str, Of], required: tuple[str, ...] = ()) -> None:
        self.fields = fields
        self.required = required
        self.desc = "an object"

    def ok(self, value: Any) -> bool:
        if not isinstance(value, dict) or any(k not in value for k in self.required):
            return False
        fields = self.fields
        return all(fields[k].ok(v) for k, v in value.items() if k in fields)

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

    def __init__(self, item: Of, numbered: bool = False) -> None:
        self.item = item
        self.numbered = numbered
        self.desc = "an object"

    def ok(self, value: Any) -> bool:
        if not isinstance(value, dict):
            return False
        if self.numbered and not all(isinstance(k, str) and k.isascii() and k.isdigit() for k in value):
            return False
        return all(map(self.item.ok, value.values()))

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
    def __init__(self, *options: Of) -> None:
        self.options = list(options)
        self.desc = " or ".join(o.desc for o in self.options)

    def check(self, value: Any, where: str) -> str | None:
        if self.ok(value):
            return None
        return f"{where} must be {self.desc}"

    def ok(self, value: Any) -> bool:
        return any(o.ok(value) for o in self.options)


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
    lack it: the key may be absent, but when written it holds an X, never null. A field marked
    `null_is_absent` (model.NULL_IS_ABSENT) takes null, which older archives wrote for none: a map's
    null values, or the field's own (it then reads as its default)."""
    if _marked(f, NEVER_NULL) and _is_union(hint):
        rest = [o for o in _args(hint) if o is not type(None)]
        return shape_of(rest[0] if len(rest) == 1 else typing.Union[tuple(rest)])
    if _marked(f, NULL_IS_ABSENT):
        if typing.get_origin(hint) is dict:
            key, value = _args(hint)
            return MapOf(Either(T(None), shape_of(value)), numbered=key is int)
        return Either(T(None), shape_of(hint))
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
    """The JSON shape a record type is written in: a dataclass (or a TypedDict) is an object whose fields
    without a default are required; `X | None` may be null; lists and tuples are lists; `dict[int, X]`
    has decimal-number keys; `tuple[X, X]` is a list of exactly two; `X | Y` either."""
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return _record_shape(hint)
    if typing.is_typeddict(hint):  # a JSON object read as written (a histogram bucket)
        return Obj({k: shape_of(v) for k, v in _hints(hint).items()}, required=tuple(sorted(hint.__required_keys__)))
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


def _as_written(hint: Any) -> bool:
    """Values of this type are plain JSON, read as written: scalars, TypedDicts, and lists, maps and
    unions of them (a program's raw maps)."""
    if hint is Any or hint in _SCALARS or typing.is_typeddict(hint):
        return True
    if _is_union(hint) or typing.get_origin(hint) in (list, dict):
        return all(_as_written(a) for a in _args(hint))
    return False


@functools.lru_cache(maxsize=None)
def _decoder(hint: Any) -> Callable[[Any], Any]:
    """The decoder of one type, made once: proc.jsonl holds a reading every 0.25 s, thousands an hour,
    each read through the same few records."""
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        h = _hints(hint)
        parts = [(f.name, _marked(f, INLINE), _marked(f, NULL_IS_ABSENT), typing.get_origin(h[f.name]) is dict,
                  _decoder(h[f.name])) for f in _fields(hint)]
        cls = hint

        def record(value: Any) -> Any:
            kw = {}
            for name, inline, nulls_absent, is_map, dec in parts:
                if inline:
                    kw[name] = dec(value)
                elif name in value:
                    v = value[name]
                    if nulls_absent and v is None:
                        continue  # the default
                    kw[name] = dec({k: x for k, x in v.items() if x is not None} if nulls_absent and is_map else v)
            return cls(**kw)
        return record
    if hint is Any or hint in (int, str, bool, type(None)) or typing.is_typeddict(hint):
        return _same
    if hint is float:
        return float
    if _is_union(hint):
        opts = [o for o in _args(hint) if o is not type(None)]
        if _as_written(hint):
            return _same  # scalars, or a program's raw maps: as written
        if len(opts) != 1:  # records among the options: the first the value fits
            options = [(shape_of(o), _decoder(o)) for o in opts]

            def either(value: Any) -> Any:
                if value is None:
                    return None
                return next(dec(value) for shape, dec in options if shape.ok(value))
            return either
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


_PLANS: dict[type, tuple[tuple[str, bool, bool], ...]] = {}


def _plan(cls: type) -> tuple[tuple[str, bool, bool], ...]:
    """A record type's fields as encode walks them, (name, inline, never_null), read once per type:
    the collector writes a reading 4 times a second, and asking dataclasses every time was most of it."""
    plan = _PLANS.get(cls)
    if plan is None:
        plan = _PLANS[cls] = tuple((f.name, _marked(f, INLINE), _marked(f, NEVER_NULL))
                                   for f in dataclasses.fields(cls))
    return plan


_JSON_SCALARS = frozenset({int, float, str, bool, type(None)})


def encode(record: object) -> Json:
    """A record as its JSON document (int keys become decimal strings when dumped); a `never_null`
    field left None is left out, as older archives lack it; an `inline` record's fields join its parent's."""
    kind = type(record)
    if kind in _JSON_SCALARS:
        return typing.cast(Json, record)  # one of Json's scalars, by its exact type
    if kind is list or kind is tuple:
        return [encode(v) for v in typing.cast(list[object], record)]
    if dataclasses.is_dataclass(record) and not isinstance(record, type):
        out: dict[str, Json] = {}
        for name, inline, never_null in _plan(kind):
            v = getattr(record, name)
            if inline:
                inner = encode(v)
                assert isinstance(inner, dict)  # a record's document is an object
                out.update(inner)
            elif not (v is None and never_null):
                out[name] = encode(v)
        return out
    if isinstance(record, (list, tuple)):
        return [encode(v) for v in record]
    if isinstance(record, dict):
        return {k: encode(v) for k, v in record.items()}
    if record is None or isinstance(record, (bool, int, float, str)):
        return record
    raise TypeError(f"{type(record).__name__} is not a record, a list or map of them, or a JSON scalar")


PROBES = shape_of(ProbeRecord)
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
    bad = None if shape.ok(doc) else shape.check(doc, "")
    if bad:
        raise QprofError(f"{name}: {bad.lstrip() if not bad.startswith(' must') else 'the document' + bad}; "
                         "the archive is damaged or from an incompatible qprof")


def conforms(doc: Any, shape: Of) -> bool:
    return shape.ok(doc)


_MAP_KINDS = [(shape_of(kind), _decoder(kind)) for kind in (RawMap, Windows)]  # ProbeMaps' values, in its order


def probe_maps(maps: Any) -> ProbeMaps:
    """A program's maps as its loader printed them (probes.mapsout), each decoded as the archive reads
    it; a map without a map's shape is left out. For the collector, which writes them into probes.json,
    and the live view: both go on without such a map, where an archive's reader refuses the document."""
    if not isinstance(maps, dict):
        return {}
    out: ProbeMaps = {}
    for k, v in maps.items():
        for shape, dec in _MAP_KINDS:  # one check per map: the first kind it fits decodes it
            if shape.ok(v):
                out[k] = dec(v)
                break
    return out
