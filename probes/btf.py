"""Type facts from BTF: the running kernel's (/sys/kernel/btf/vmlinux) and a compiled program's.

Probe programs must fit the running kernel: tracepoint arguments and enum values
(e.g. skb_drop_reason numbers) differ across kernel versions. Reading them
from BTF, not from a table in qprof, keeps them right on kernels qprof has
never seen.

The BTF format is read directly (a header, a type section of fixed-size
records, a string section; linux/btf.h): one pass records where each type
starts, and only the types asked about are decoded. That takes ~0.2 s for a
6 MB kernel BTF, where bpftool's text dump and its parse took ~1.5 s of every
`qprof attach`'s start-up.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable, TypeVar, cast

from qprof.cachefiles import CACHE_HOME, read_json, write_json

VMLINUX_BTF = "/sys/kernel/btf/vmlinux"
# Answers about the running kernel's BTF, one file per BTF digest (see `remembered`)
FACTS_DIR = CACHE_HOME / "btf"
Answer = TypeVar("Answer")
_MAGIC = 0xEB9F
# kind -> bytes that follow the 12-byte common record: fixed, and per vlen item
_TAIL = {1: (4, 0), 2: (0, 0), 3: (12, 0), 4: (0, 12), 5: (0, 12), 6: (0, 8), 7: (0, 0), 8: (0, 0), 9: (0, 0),
         10: (0, 0), 11: (0, 0), 12: (0, 0), 13: (0, 8), 14: (4, 0), 15: (0, 12), 16: (0, 0), 17: (4, 0),
         18: (0, 0), 19: (0, 12)}
INT, PTR, ARRAY, STRUCT, UNION, ENUM, FWD, TYPEDEF = 1, 2, 3, 4, 5, 6, 7, 8
FUNC_PROTO, ENUM64 = 13, 19
_MODIFIERS = {TYPEDEF, 9, 10, 11, 18}  # typedef, volatile, const, restrict, type tag


class BTFUnavailable(Exception):
    pass


@dataclass(frozen=True)
class Member:
    name: str
    type_id: int
    bit_offset: int


class BTF:
    """One BTF blob: types by id and by name, decoded on demand."""

    def __init__(self, data: bytes) -> None:
        if len(data) < 24:
            raise BTFUnavailable("BTF data is too short")
        magic, _version, _flags, hdr_len = struct.unpack_from("<HBBI", data, 0)
        if magic != _MAGIC:
            raise BTFUnavailable("not BTF data (bad magic)")
        type_off, type_len, str_off, str_len = struct.unpack_from("<IIII", data, 8)
        self._data = data
        self._types_start = hdr_len + type_off
        self._strings = data[hdr_len + str_off: hdr_len + str_off + str_len]
        self._offsets = [0]  # type id -> byte offset of its record (id 0 is void)
        self._by_name: dict[tuple[int, str], list[int]] = {}
        self.enum_ids: list[int] = []
        pos, end = self._types_start, self._types_start + type_len
        unpack = struct.Struct("<III").unpack_from
        while pos < end:
            name_off, info, _ = unpack(data, pos)
            kind, vlen = (info >> 24) & 0x1F, info & 0xFFFF
            if kind not in _TAIL:
                raise BTFUnavailable(f"BTF kind {kind} is unknown to qprof (a newer BTF format)")
            self._offsets.append(pos)
            if kind in (ENUM, ENUM64):
                self.enum_ids.append(len(self._offsets) - 1)
            if name_off:
                self._by_name.setdefault((kind, self._name(name_off)), []).append(len(self._offsets) - 1)
            fixed, per = _TAIL[kind]
            pos += 12 + fixed + per * vlen

    def _name(self, off: int) -> str:
        end = self._strings.index(b"\0", off)
        return self._strings[off:end].decode("utf-8", "replace")

    def _record(self, type_id: int) -> tuple[int, int, int, int, int]:
        """(kind, vlen, kind_flag, size_or_type, offset of the data after the common record)."""
        pos = self._offsets[type_id]
        _, info, size_or_type = struct.unpack_from("<III", self._data, pos)
        return (info >> 24) & 0x1F, info & 0xFFFF, info >> 31, size_or_type, pos + 12

    def referenced(self, type_id: int) -> int:
        """The type a typedef, pointer or qualifier refers to."""
        return self._record(type_id)[3]

    def kind(self, type_id: int) -> int:
        return self._record(type_id)[0]

    def name(self, type_id: int) -> str:
        return self._name(struct.unpack_from("<I", self._data, self._offsets[type_id])[0])

    def ids(self, kind: int, name: str) -> list[int]:
        return self._by_name.get((kind, name), [])

    def resolve(self, type_id: int) -> int:
        """Through typedefs and qualifiers to the type itself."""
        seen = 0
        while type_id and self.kind(type_id) in _MODIFIERS and seen < 32:
            type_id, seen = self._record(type_id)[3], seen + 1
        return type_id

    def size(self, type_id: int) -> int:
        type_id = self.resolve(type_id)
        if not type_id:
            return 0
        kind, _, _, size_or_type, data = self._record(type_id)
        if kind == ARRAY:
            elem, _, nelems = struct.unpack_from("<III", self._data, data)
            return int(nelems) * self.size(elem)
        if kind == PTR:
            return 8
        return size_or_type if kind in (INT, STRUCT, UNION, ENUM, ENUM64, 16) else 0

    def array(self, type_id: int) -> tuple[int, int] | None:
        """(element type, length) of an array type."""
        type_id = self.resolve(type_id)
        kind, _, _, _, data = self._record(type_id)
        if kind != ARRAY:
            return None
        elem, _, nelems = struct.unpack_from("<III", self._data, data)
        return elem, nelems

    def int_signed(self, type_id: int) -> bool:
        kind, _, _, _, data = self._record(self.resolve(type_id))
        return kind == INT and bool((struct.unpack_from("<I", self._data, data)[0] >> 24) & 1)

    def members(self, type_id: int) -> list[Member]:
        kind, vlen, kind_flag, _, data = self._record(type_id)
        if kind not in (STRUCT, UNION):
            return []
        out = []
        for i in range(vlen):
            name_off, t, off = struct.unpack_from("<III", self._data, data + 12 * i)
            out.append(Member(self._name(name_off), t, off & 0xFFFFFF if kind_flag else off))
        return out

    def enumerators(self, type_id: int) -> dict[str, int]:
        """Name -> value; kind_flag says whether the enum is signed."""
        kind, vlen, signed, _, data = self._record(type_id)
        out = {}
        for i in range(vlen):
            if kind == ENUM:
                name_off, val = struct.unpack_from("<Ii" if signed else "<II", self._data, data + 8 * i)
            elif kind == ENUM64:
                name_off, lo, hi = struct.unpack_from("<IIi" if signed else "<III", self._data, data + 12 * i)
                val = (hi << 32) | lo
            else:
                return {}
            out[self._name(name_off)] = val
        return out

    def params(self, type_id: int) -> int | None:
        """Parameter count of a function prototype (through pointers and typedefs)."""
        for _ in range(8):
            kind, vlen, _, ref, _ = self._record(type_id)
            if kind == FUNC_PROTO:
                return vlen
            if kind not in _MODIFIERS and kind != PTR:
                return None
            type_id = ref
        return None


def _unavailable(e: OSError) -> BTFUnavailable:
    return BTFUnavailable(f"no kernel BTF at {VMLINUX_BTF} ({e.strerror}; needs CONFIG_DEBUG_INFO_BTF)")


@lru_cache(maxsize=1)
def kernel() -> BTF:
    try:
        with open(VMLINUX_BTF, "rb") as f:
            return BTF(f.read())
    except OSError as e:
        raise _unavailable(e) from None


@lru_cache(maxsize=1)
def digest() -> str:
    """SHA-256 of the running kernel's BTF: what every answer about it depends on (~5 ms)."""
    h = hashlib.sha256()
    try:
        with open(VMLINUX_BTF, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    except OSError as e:
        raise _unavailable(e) from None
    return h.hexdigest()


def _answers_file() -> Path:
    return FACTS_DIR / f"{digest()[:32]}.json"


@lru_cache(maxsize=1)
def _answers() -> dict[str, object]:
    return read_json(_answers_file())


def remembered(question: str, learn: Callable[[], Answer]) -> Answer:
    """The answer to a question about the running kernel's BTF, kept on disk under the BTF's digest.

    Every attach asked the same few questions (enum values, tracepoint shapes), and each process that
    asked read and indexed the whole BTF (6 MB, ~0.1 CPU s: a tenth of what qprof cost beside the
    targets of a short benchmark, bench/footprint.py). A new kernel has another digest, so it is
    asked anew; a damaged or unwritable file only costs the parse. The answer must come back from
    JSON as it went in (int, bool, None, dict of str to int)."""
    answers = _answers()
    if question in answers:
        return cast(Answer, answers[question])  # written below from learn()'s answer to this question
    answer = answers[question] = learn()
    write_json(_answers_file(), answers)
    return answer


def enum(name: str) -> dict[str, int]:
    """Enumerator -> value, e.g. enum('skb_drop_reason')['SKB_DROP_REASON_SOCKET_RCVBUFF']."""
    return remembered(f"enum {name}", lambda: _enum(name))


def _enum(name: str) -> dict[str, int]:
    b = kernel()
    for kind in (ENUM, ENUM64):
        for i in b.ids(kind, name):
            return b.enumerators(i)
    return {}


def enumerator(name: str) -> int | None:
    """Value of one enumerator, whichever enum (named or anonymous) declares it."""
    return remembered(f"enumerator {name}", lambda: _enumerator(name))


def _enumerator(name: str) -> int | None:
    b = kernel()
    for i in b.enum_ids:
        value = b.enumerators(i).get(name)
        if value is not None:
            return value
    return None


def tracepoint_exists(event: str) -> bool:
    """Every tracepoint has a `btf_trace_<event>` typedef in BTF."""
    return remembered(f"tracepoint {event}", lambda: bool(kernel().ids(TYPEDEF, f"btf_trace_{event}")))


def tracepoint_arity(event: str) -> int | None:
    """How many arguments the BTF tracepoint `event` passes its programs (they change across
    kernels: kfree_skb gained the receiving socket in 6.12); None when the kernel lacks it."""
    return remembered(f"tracepoint arity {event}", lambda: _tracepoint_arity(event))


def _tracepoint_arity(event: str) -> int | None:
    b = kernel()
    for i in b.ids(TYPEDEF, f"btf_trace_{event}"):
        n = b.params(b.referenced(i))
        if n is not None:
            return n - 1  # the first parameter is the probe's private data
    return None
