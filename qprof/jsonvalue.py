"""JSON's two types in qprof: what a JSON text parses into, and what a record hands json.dumps.

`Json` is a value as json.loads gives it (lists and dicts), before its shape is
checked: the probes' output lines, the archive's documents.

A record's `to_json` returns a `JsonObject`, so mypy checks that every value it
puts there is one JSON can hold (numbers, strings, booleans, null, lists and
objects of them), where `Any` would let a set or a record through to fail only
when the report is written. Mappings and sequences of values are accepted as
they are (a record's `dict[str, int]` or tuple of floats need no copying).
"""

from __future__ import annotations

from typing import Mapping, Sequence, TypeAlias, Union

Json = Union[None, bool, int, float, str, list["Json"], dict[str, "Json"]]

JsonValue: TypeAlias = "None | bool | int | float | str | Sequence[JsonValue] | Mapping[str, JsonValue]"
JsonObject: TypeAlias = "dict[str, JsonValue]"  # what a record's to_json returns: one JSON object
