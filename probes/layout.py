"""C layouts and initial data of a compiled BPF object, read from the object itself.

A probe group's structs (its counters, its configuration) are written once, in
its .bpf.c file. Python reads them back from the compiled object: struct member
names, offsets and sizes from the object's BTF section (probes.btf), and
where each global variable sits and what it starts as from the ELF symbol table
and sections (probes.elf). Nothing about a layout is written again in Python,
so a field added in C is decoded without touching the loader.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from functools import cached_property, lru_cache
from pathlib import Path

from qprof.probes.btf import BTF, STRUCT, BTFUnavailable
from qprof.probes.elf import UNREADABLE, ElfObject


class LayoutError(Exception):
    """The object lacks what a loader expects (rebuild it, or the C and the loader disagree)."""


_CODES = {1: "b", 2: "h", 4: "i", 8: "q"}


@dataclass(frozen=True)
class Field:
    name: str
    offset: int  # bytes from the start of the struct
    size: int  # bytes of one element
    count: int  # 1, or the length of a fixed-size array
    signed: bool

    @property
    def code(self) -> str:
        """The field's struct-module format: `count` elements of its size and sign."""
        c = _CODES[self.size]
        return f"{self.count}{c if self.signed else c.upper()}"

    def values(self, buf: bytes, base: int = 0) -> list[int]:
        """Every element of the field, a list whether it is an array or a scalar (one element)."""
        return list(struct.unpack_from("<" + self.code, buf, base + self.offset))

    def decode(self, buf: bytes, base: int = 0) -> int | list[int]:
        values = self.values(buf, base)
        return values if self.count > 1 else values[0]


@dataclass(frozen=True)
class Struct:
    name: str
    size: int
    fields: dict[str, Field]

    def decode(self, buf: bytes, base: int = 0) -> dict[str, int | list[int]]:
        codec = self._codec
        if codec is None:
            return {n: f.decode(buf, base) for n, f in self.fields.items()}
        whole, plan = codec
        flat = whole.unpack_from(buf, base)
        return {n: list(flat[i:i + c]) if c > 1 else flat[i] for n, i, c in plan}

    @cached_property
    def _codec(self) -> tuple[struct.Struct, tuple[tuple[str, int, int], ...]] | None:
        """Every field in one unpack (with pad bytes between them), and where each one's elements start
        in its result: the loaders decode map entries many times a second, and a field at a time was ~1.5
        us each. None for fields that overlap (a union's) or hold a struct: read one at a time."""
        fmt, end, elements, start = "<", 0, 0, {}
        for f in sorted(self.fields.values(), key=lambda f: f.offset):
            if f.offset < end or f.size not in _CODES:  # a nested struct is decoded by its own Struct
                return None
            fmt += (f"{f.offset - end}x" if f.offset > end else "") + f.code
            start[f.name], elements, end = elements, elements + f.count, f.offset + f.size * f.count
        return struct.Struct(fmt), tuple((n, start[n], f.count) for n, f in self.fields.items())

    def field(self, name: str) -> Field:
        try:
            return self.fields[name]
        except KeyError:
            raise LayoutError(f"struct {self.name} has no field {name}") from None


def one(decoded: dict[str, int | list[int]], name: str) -> int:
    """A scalar field of a decoded struct (an array's first element)."""
    v = decoded[name]
    return v if isinstance(v, int) else v[0]


def many(decoded: dict[str, int | list[int]], name: str) -> list[int]:
    """An array field of a decoded struct (a scalar as one element)."""
    v = decoded[name]
    return list(v) if isinstance(v, list) else [v]


@dataclass(frozen=True)
class Variable:
    name: str
    section: str  # .rodata, .bss, .data
    offset: int
    size: int


class ObjectLayout:
    """Structs, global variables and initial section data of one .bpf.o."""

    def __init__(self, types: BTF, variables: dict[str, Variable], sections: dict[str, bytes]) -> None:
        self.btf = types
        self.variables = variables
        self.sections = sections
        self.structs: dict[str, Struct] = {}

    def _struct(self, name: str) -> Struct | None:
        ids = self.btf.ids(STRUCT, name)
        if not ids:
            return None
        fields = {}
        for m in self.btf.members(ids[0]):
            count, t = 1, m.type_id
            arr = self.btf.array(t)
            if arr is not None:
                t, count = arr
            fields[m.name] = Field(m.name, m.bit_offset // 8, self.btf.size(t), count, self.btf.int_signed(t))
        return Struct(name, self.btf.size(ids[0]), fields)

    def struct(self, name: str) -> Struct:
        if name not in self.structs:
            st = self._struct(name)
            if st is None:
                raise LayoutError(f"the object defines no struct {name}")
            self.structs[name] = st
        return self.structs[name]

    def variable(self, name: str) -> Variable:
        try:
            return self.variables[name]
        except KeyError:
            raise LayoutError(f"the object defines no global variable {name}") from None

    def initial(self, name: str, struct_name: str) -> dict[str, int | list[int]]:
        """A global's initial value as the C initialiser set it (from its section's data)."""
        v = self.variable(name)
        data = self.sections.get(v.section, b"")
        return self.struct(struct_name).decode(data.ljust(v.offset + v.size, b"\0"), v.offset)

    def section_with(self, section: str, name: str, struct_name: str, values: dict[str, int | list[int]]) -> bytes:
        """`section`'s initial data with the global `name` (a struct_name) set to `values` (an array
        field's: its first items, the rest zero)."""
        v = self.variable(name)
        if v.section != section:
            raise LayoutError(f"{name} is in {v.section}, not {section}")
        buf = bytearray(self.sections.get(section, b"").ljust(v.offset + v.size, b"\0"))
        st = self.struct(struct_name)
        for key, value in values.items():
            f = st.field(key)
            items = list(value) if isinstance(value, list) else [value]
            if len(items) > f.count:
                raise LayoutError(f"{struct_name}.{key} holds {f.count} values, not {len(items)}")
            items += [0] * (f.count - len(items))
            fmt = "<" + {1: "b", 2: "h", 4: "i", 8: "q"}[f.size]
            fmt = fmt if f.signed else fmt.upper()
            for i, x in enumerate(items):
                struct.pack_into(fmt, buf, v.offset + f.offset + i * f.size, int(x))
        return bytes(buf)


@lru_cache(maxsize=8)
def read(obj: Path) -> ObjectLayout:
    """The layout of a compiled object (cached per path: objects are immutable, named by hash)."""
    variables: dict[str, Variable] = {}
    sections: dict[str, bytes] = {}
    try:
        with ElfObject.open(str(obj)) as elf:
            btf_data = elf.contents(".BTF")
            if btf_data is None:
                raise LayoutError(f"{obj.name} carries no BTF (compile it with clang -g)")
            try:
                types = BTF(btf_data)
            except BTFUnavailable as e:
                raise LayoutError(f"{obj.name}: {e}") from None
            for name in (".rodata", ".data", ".bss"):
                if elf.has(name):
                    sections[name] = b"" if name == ".bss" else (elf.contents(name) or b"")
            for name, section, value, size in elf.variables():
                if section in (".rodata", ".data", ".bss"):
                    variables[name] = Variable(name, section, value, size)
    except UNREADABLE as e:
        if isinstance(e, OSError):
            raise
        raise LayoutError(f"{obj.name} is not a readable ELF object ({e}): rebuild it") from None
    return ObjectLayout(types, variables, sections)
