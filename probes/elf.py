"""The one reader of ELF files' symbol tables, build-ids, sections and loadable segments.

Attach judges an object's unwinding by its functions' prologues (collectors.elf), names a stripped
object's functions (collectors.debuginfo), finds crypto entry points (probes.crypto.symbols) and records
where the sampled functions start (collectors.functions); a report of an older archive names wait stacks
and pprof addresses from the files at their recorded paths (attribution). All of them read the same few
things, so they read them here, the same way: which table is the object's fullest, which entries are
functions, the build-id note, the PT_LOAD segments. It sits in the probes layer, the lowest that needs it
(probes/ may import only probes/); pyelftools does the parsing, except for symbol tables, which are
unpacked whole with struct (pyelftools' symbol objects took ~2 s of attach start-up for a large binary).
"""

from __future__ import annotations

import contextlib
import re
import struct
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterator

from elftools.common.exceptions import ELFError
from elftools.elf.dynamic import DynamicSection
from elftools.elf.elffile import ELFFile
from elftools.elf.sections import NoteSection, Section, SymbolTableSection

SYMTAB, DYNSYM = ".symtab", ".dynsym"
# what reading a damaged, truncated or foreign file raises: callers catch these and say the file is unreadable
UNREADABLE = (OSError, ELFError, ValueError, KeyError, struct.error)
PF_X = 1  # an executable segment
_SYM64 = struct.Struct("<IBBHQQ")  # Elf64_Sym: name, info, other, shndx, value, size
_STT_FUNC = 2
_STRING_TAGS = {"DT_NEEDED": "needed", "DT_RUNPATH": "runpath", "DT_RPATH": "rpath"}  # -> pyelftools' attribute


@dataclass(frozen=True)
class Function:
    """One function symbol with an address."""

    name: str
    address: int  # the object's virtual address
    size: int
    defined: bool  # in a section of this object; an undefined one's address is its PLT entry (an executable's)


@dataclass(frozen=True)
class Segment:
    """One PT_LOAD segment: where its bytes are in the file and where they are mapped."""

    offset: int
    filesz: int
    vaddr: int
    memsz: int
    flags: int

    @property
    def executable(self) -> bool:
        return bool(self.flags & PF_X)


class ElfObject:
    """An ELF file opened for reading; `elf` is pyelftools' view for what is read elsewhere (Go's
    `.gopclntab`, probes.gopclntab; a library's DT_NEEDED)."""

    def __init__(self, elf: ELFFile) -> None:
        self.elf = elf
        self._segments: list[Segment] | None = None  # read once: pyelftools parses every segment anew

    @classmethod
    @contextlib.contextmanager
    def open(cls, path: str) -> Iterator["ElfObject"]:
        """The file at `path` while the block runs; raises one of UNREADABLE when it is not an ELF file."""
        with open(path, "rb") as f:
            yield cls(ELFFile(f))

    def section(self, name: str) -> Section | None:
        sec: Section | None = self.elf.get_section_by_name(name)
        return sec

    def has(self, *names: str) -> bool:
        """Whether any of the sections `names` is there."""
        return any(self.elf.get_section_by_name(n) is not None for n in names)

    def contents(self, name: str) -> bytes | None:
        """A section's bytes; None when it is absent or has none in the file (SHT_NOBITS: a debug file's .text)."""
        sec = self.section(name)
        if sec is None or sec["sh_type"] == "SHT_NOBITS":
            return None
        data: bytes = sec.data()
        return data

    def build_id(self) -> str | None:
        """The GNU build-id note, hex: how perf, debug files and debuginfod name an object."""
        for sec in self.elf.iter_sections():
            if isinstance(sec, NoteSection):
                for note in sec.iter_notes():
                    if note["n_type"] == "NT_GNU_BUILD_ID":
                        return str(note["n_desc"])
        return None

    def symbols(self, table: str) -> int:
        """How many entries `table` has (0 when absent; a table of one holds only the null symbol)."""
        sec = self.section(table)
        return int(sec.num_symbols()) if isinstance(sec, SymbolTableSection) else 0

    def fullest(self) -> str | None:
        """The table naming the most functions: `.symtab` (every function), else `.dynsym` (exported ones)."""
        return next((t for t in (SYMTAB, DYNSYM) if self.symbols(t) > 1), None)

    def functions(self, table: str, interest: re.Pattern[str] | None = None) -> Iterator[Function]:
        """The function symbols of `table` with an address, in table order; with `interest`, only those whose
        name it finds (searched in the name's ASCII: a cheap filter before the name is decoded)."""
        sec = self.section(table)
        if not isinstance(sec, SymbolTableSection):
            return
        strtab = self.elf.get_section(sec["sh_link"]).data()
        if self.elf.elfclass == 64 and self.elf.little_endian:
            data = sec.data()
            entries: Iterator[tuple[int, int, int, int, int]] = (
                (n, info, shndx, value, size) for n, info, _, shndx, value, size in _SYM64.iter_unpack(data))
        else:
            entries = ((s["st_name"], _STT_FUNC if s["st_info"]["type"] == "STT_FUNC" else 0,
                        0 if s["st_shndx"] == "SHN_UNDEF" else 1, s["st_value"], s["st_size"])
                       for s in sec.iter_symbols())
        for n, info, shndx, value, size in entries:
            if info & 0xF != _STT_FUNC or not value:
                continue
            raw = strtab[n:strtab.find(b"\0", n)]
            if interest is not None and not interest.search(raw.decode("ascii", "replace")):
                continue
            yield Function(raw.decode("utf-8", "replace"), value, size, shndx != 0)

    def segments(self) -> list[Segment]:
        """The PT_LOAD segments, in file order."""
        if self._segments is None:
            self._segments = [Segment(int(s["p_offset"]), int(s["p_filesz"]), int(s["p_vaddr"]), int(s["p_memsz"]),
                                      int(s["p_flags"])) for s in self.elf.iter_segments() if s["p_type"] == "PT_LOAD"]
        return self._segments

    def interpreted(self) -> bool:
        """Whether it names a program interpreter (PT_INTERP): a dynamically linked executable."""
        return any(s["p_type"] == "PT_INTERP" for s in self.elf.iter_segments())

    def needed(self) -> tuple[list[str], list[str]]:
        """(DT_NEEDED, the directories of DT_RUNPATH or DT_RPATH as written: `$ORIGIN` unexpanded)."""
        needed: list[str] = []
        paths: list[str] = []
        for sec in self.elf.iter_sections():
            if isinstance(sec, DynamicSection):
                for tag in sec.iter_tags():
                    kind = tag.entry.d_tag
                    if kind in _STRING_TAGS:
                        value = str(getattr(tag, _STRING_TAGS[kind]))  # pyelftools sets it per kind of tag
                        if kind == "DT_NEEDED":
                            needed.append(value)
                        else:
                            paths += [d for d in value.split(":") if d]
        return needed, paths

    def read(self, vaddr: int, size: int) -> bytes:
        """`size` bytes of the file from where a virtual address is ("" outside every segment's file bytes)."""
        for seg in self.segments():
            if seg.vaddr <= vaddr < seg.vaddr + seg.filesz:
                self.elf.stream.seek(seg.offset + vaddr - seg.vaddr)
                data: bytes = self.elf.stream.read(size)
                return data
        return b""


def build_id(path: str) -> tuple[str | None, str | None]:
    """(build-id, None) of the ELF file at `path`, or (None, why it cannot be read)."""
    try:
        with ElfObject.open(path) as obj:
            return obj.build_id(), None
    except UNREADABLE as e:
        return None, getattr(e, "strerror", None) or type(e).__name__


@lru_cache(maxsize=256)
def function_starts(path: str) -> dict[str, int]:
    """Function name -> start address (the object's vaddr), from the fullest symbol table, the first
    address of a name winning; {} when unreadable."""
    out: dict[str, int] = {}
    try:
        with ElfObject.open(path) as obj:
            table = obj.fullest()
            for f in obj.functions(table) if table else ():
                out.setdefault(f.name, f.address)
    except UNREADABLE:
        return {}
    return out
