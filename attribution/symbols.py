"""Whether a frame has a function name: what the report's per-object symbol line counts.

perf names a frame `[unknown]` where an object has no symbol covering the address; qprof names a
stripped object's internal functions by the object and the function's start (`libx.so.1+0x5a3c0`,
collectors.debuginfo) when the unwind table is all there is. Both are frames without a function's
own name: the share of samples taken in them says how much the names of an object can be trusted.
"""

from __future__ import annotations

import re
import struct
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Sequence

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection

from qprof.archive.model import ObjectSymbols

UNKNOWN = "[unknown]"
_SYM64 = struct.Struct("<IBBHQQ")  # Elf64_Sym: name, info, other, shndx, value, size
_STT_FUNC = 2
_BY_START = re.compile(r"\+0x[0-9a-f]+$")


def named(symbol: str, dso: str) -> bool:
    """A frame with a function's own name (not `[unknown]`, not `object+0xSTART`)."""
    if symbol == UNKNOWN or not symbol:
        return False
    base = dso.rsplit("/", 1)[-1]
    return not (symbol.startswith(base + "+0x") and _BY_START.search(symbol) is not None)


def by_start(symbol: str) -> int | None:
    """The function's start in its object, for an `object+0xSTART` name; None for any other."""
    m = _BY_START.search(symbol)
    return int(m.group(0)[1:], 16) if m is not None and not symbol.startswith("[") else None


@dataclass(frozen=True)
class ObjectNaming:
    """One object of a process: how its frames got names, and its samples that have none."""

    object: str
    how: str  # collectors.debuginfo: symtab, debug file, debuginfod, unwind table ... ("kernel" for the kernel)
    source: str | None
    note: str
    share: float  # of the process's samples taken in it
    unnamed_share: float  # of the process's samples taken in it in no named function

    def to_json(self) -> dict[str, Any]:
        return {"object": self.object, "how": self.how, "source": self.source, "note": self.note,
                "share": round(self.share, 6), "unnamed_share": round(self.unnamed_share, 6)}


def naming(leaf_objects: Counter[str], unnamed: Counter[str], sources: Sequence[ObjectSymbols],
           least: float = 0.005) -> list[ObjectNaming]:
    """The objects holding at least `least` of a process's samples, largest first, with how they were named."""
    total = sum(leaf_objects.values()) or 1
    by_path = {s.path: s for s in sources}
    out = []
    for dso, per in leaf_objects.most_common():
        if per / total < least:
            break
        src = by_path.get(dso)
        how = "kernel" if dso.startswith("[") and dso != UNKNOWN else src.how if src else "not recorded"
        out.append(ObjectNaming(dso, how, src.source if src else None, src.note if src else "", per / total,
                                unnamed[dso] / total))
    return out


@lru_cache(maxsize=256)
def function_addresses(path: str) -> dict[str, int]:
    """Function name -> start address (the object's vaddr) from its fullest symbol table: where pprof's
    locations point, so a backend can symbolize them again by build-id. {} when unreadable."""
    out: dict[str, int] = {}
    try:
        with open(path, "rb") as f:
            elf = ELFFile(f)
            for name in (".symtab", ".dynsym"):
                sec = elf.get_section_by_name(name)
                if not isinstance(sec, SymbolTableSection) or sec.num_symbols() <= 1:
                    continue
                strtab = elf.get_section(sec["sh_link"]).data()
                data = sec.data()
                if elf.elfclass != 64 or not elf.little_endian or len(data) % _SYM64.size:
                    return {}
                for name_off, info, _, _, value, _ in _SYM64.iter_unpack(data):
                    if info & 0xF == _STT_FUNC and value:
                        end = strtab.find(b"\0", name_off)
                        out.setdefault(strtab[name_off:end].decode("utf-8", "replace"), value)
                return out
    except (OSError, ELFError, ValueError, KeyError):
        return {}
    return out
