"""The one reader of ELF files' symbol tables, build-ids, sections and loadable segments.

Attach judges an object's unwinding by its functions' prologues (collectors.elf), names a stripped
object's functions (collectors.debuginfo), finds crypto entry points (probes.crypto.symbols) and records
where the sampled functions start (collectors.functions); a report of an older archive names wait stacks
and pprof addresses from the files at their recorded paths (attribution). All of them read the same few
things, so they read them here, the same way: which table is the object's fullest, which entries are
functions, the build-id note, the PT_LOAD segments. It sits in the probes layer, the lowest that needs it
(probes/ may import only probes/). A 64-bit little-endian file (x86_64, arm64) has its headers,
notes and symbol tables unpacked with struct here: pyelftools' parsing of them was ~0.1 CPU s of every
attach (twenty objects described at start, their function starts at the end), and its symbol objects
~2 s for a large binary. pyelftools reads the rest (other classes, compressed sections, Go's
`.gopclntab`, DT_NEEDED), opened only when asked.
"""

from __future__ import annotations

import contextlib
import re
import struct
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, BinaryIO, Iterable, Iterator

from elftools.common.exceptions import ELFError

if TYPE_CHECKING:  # the rest of pyelftools is imported where it reads (~40 ms, most attaches never do)
    from elftools.elf.elffile import ELFFile
    from elftools.elf.sections import Section

SYMTAB, DYNSYM = ".symtab", ".dynsym"
# what reading a damaged, truncated or foreign file raises: callers catch these and say the file is unreadable
UNREADABLE = (OSError, ELFError, ValueError, KeyError, struct.error)
PF_X = 1  # an executable segment
_SYM64 = struct.Struct("<IBBHQQ")  # Elf64_Sym: name, info, other, shndx, value, size
_STT_FUNC, _STT_OBJECT = 2, 1
_SHN_LORESERVE = 0xFF00  # section indexes from here on are special (SHN_ABS, SHN_COMMON...)
_EHDR64 = struct.Struct("<16sHHIQQQIHHHHHH")  # Elf64_Ehdr
_SHDR64 = struct.Struct("<IIQQQQIIQQ")  # Elf64_Shdr: name, type, flags, addr, offset, size, link, info, align, entsize
_PHDR64 = struct.Struct("<IIQQQQQQ")  # Elf64_Phdr: type, flags, offset, vaddr, paddr, filesz, memsz, align
_SHT_SYMTAB, _SHT_NOTE, _SHT_NOBITS, _SHT_DYNSYM = 2, 7, 8, 11
_SHF_COMPRESSED = 0x800
_PT_LOAD, _PT_INTERP = 1, 3
_NT_GNU_BUILD_ID = 3
_EM_X86_64 = 62
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


@dataclass(frozen=True)
class _Shdr:
    name: str
    type: int
    flags: int
    offset: int
    size: int
    link: int
    entsize: int


class ElfObject:
    """An ELF file opened for reading; `elf` is pyelftools' view for what is read elsewhere (Go's
    `.gopclntab`, probes.gopclntab; a library's DT_NEEDED), made at its first use."""

    def __init__(self, stream: BinaryIO) -> None:
        self.stream = stream
        self._elf: ELFFile | None = None
        self._segments: list[Segment] | None = None  # read once: pyelftools parses every segment anew
        self._shdrs: list[_Shdr] | None = None  # a 64-bit little-endian file's sections, unpacked here
        self._by_name: dict[str, int] = {}
        self._machine = 0
        self._interp = False
        head = stream.read(_EHDR64.size)
        if head[:4] != b"\x7fELF":
            raise ELFError("not an ELF file (no ELF magic)")
        if len(head) == _EHDR64.size and head[4] == 2 and head[5] == 1:  # ELFCLASS64, ELFDATA2LSB
            self._read_headers(head)
        else:
            self._elf = _pyelftools(stream)

    def _read_headers(self, head: bytes) -> None:
        (_, _, machine, _, _, phoff, shoff, _, _, phentsize, phnum, shentsize, shnum,
         shstrndx) = _EHDR64.unpack(head)
        self._machine = machine
        raw: list[tuple[int, int, int, int, int, int, int, int, int, int]] = []
        if shoff and shentsize == _SHDR64.size:
            first = _SHDR64.unpack(self._at(shoff, _SHDR64.size))
            shnum = shnum or first[5]  # SHN_UNDEF: the count is in section 0's size
            shstrndx = first[6] if shstrndx == 0xFFFF else shstrndx  # SHN_XINDEX: in section 0's link
            table = self._at(shoff, shnum * _SHDR64.size)
            raw = list(_SHDR64.iter_unpack(table[:len(table) - len(table) % _SHDR64.size]))
        names = b""
        if 0 < shstrndx < len(raw):
            st = raw[shstrndx]
            names = self._at(st[4], st[5]) if st[1] != _SHT_NOBITS else b""
        shdrs = []
        for r in raw:
            end = names.find(b"\0", r[0])
            name = names[r[0]:end if end >= 0 else len(names)].decode("utf-8", "replace") if r[0] < len(names) else ""
            shdrs.append(_Shdr(name, r[1], r[2], r[4], r[5], r[6], r[9]))
        self._shdrs = shdrs
        self._by_name = {s.name: i for i, s in enumerate(shdrs)}  # the last of a name, as pyelftools
        segs: list[Segment] = []
        if phoff and phentsize == _PHDR64.size:
            table = self._at(phoff, phnum * _PHDR64.size)
            for p_type, flags, offset, vaddr, _, filesz, memsz, _ in _PHDR64.iter_unpack(
                    table[:len(table) - len(table) % _PHDR64.size]):
                if p_type == _PT_LOAD:
                    segs.append(Segment(offset, filesz, vaddr, memsz, flags))
                self._interp |= p_type == _PT_INTERP
        self._segments = segs

    def _at(self, offset: int, size: int) -> bytes:
        self.stream.seek(offset)
        data = self.stream.read(size)
        if len(data) != size:
            raise ELFError(f"truncated: {size} bytes wanted at offset {offset}, {len(data)} there")
        return data

    @property
    def elf(self) -> ELFFile:
        if self._elf is None:
            self._elf = _pyelftools(self.stream)
        return self._elf

    @classmethod
    @contextlib.contextmanager
    def open(cls, path: str) -> Iterator["ElfObject"]:
        """The file at `path` while the block runs; raises one of UNREADABLE when it is not an ELF file."""
        with open(path, "rb") as f:
            yield cls(f)

    def x86_64(self) -> bool:
        return self._machine == _EM_X86_64 if self._shdrs is not None else self.elf.get_machine_arch() == "x64"

    def section(self, name: str) -> Section | None:
        """pyelftools' view of a section (for what this module does not read itself)."""
        sec: Section | None = self.elf.get_section_by_name(name)
        return sec

    def _shdr(self, name: str) -> _Shdr | None:
        assert self._shdrs is not None
        i = self._by_name.get(name)
        return None if i is None else self._shdrs[i]

    def has(self, *names: str) -> bool:
        """Whether any of the sections `names` is there."""
        if self._shdrs is not None:
            return any(n in self._by_name for n in names)
        return any(self.elf.get_section_by_name(n) is not None for n in names)

    def contents(self, name: str) -> bytes | None:
        """A section's bytes; None when it is absent or has none in the file (SHT_NOBITS: a debug file's .text)."""
        if self._shdrs is not None:
            sh = self._shdr(name)
            if sh is None or sh.type == _SHT_NOBITS:
                return None
            if not sh.flags & _SHF_COMPRESSED:
                return self._at(sh.offset, sh.size)
        sec = self.section(name)
        if sec is None or sec["sh_type"] == "SHT_NOBITS":
            return None
        data: bytes = sec.data()
        return data

    def build_id(self) -> str | None:
        """The GNU build-id note, hex: how perf, debug files and debuginfod name an object."""
        if self._shdrs is not None:
            for sh in self._shdrs:
                if sh.type == _SHT_NOTE:
                    found = _gnu_build_id(self._at(sh.offset, sh.size))
                    if found is not None:
                        return found
            return None
        from elftools.elf.sections import NoteSection

        for sec in self.elf.iter_sections():
            if isinstance(sec, NoteSection):
                for note in sec.iter_notes():
                    if note["n_type"] == "NT_GNU_BUILD_ID":
                        return str(note["n_desc"])
        return None

    def symbols(self, table: str) -> int:
        """How many entries `table` has (0 when absent; a table of one holds only the null symbol)."""
        if self._shdrs is not None:
            sh = self._shdr(table)
            if sh is None or sh.type not in (_SHT_SYMTAB, _SHT_DYNSYM) or not sh.entsize:
                return 0
            return sh.size // sh.entsize
        from elftools.elf.sections import SymbolTableSection

        sec = self.section(table)
        return int(sec.num_symbols()) if isinstance(sec, SymbolTableSection) else 0

    def fullest(self) -> str | None:
        """The table naming the most functions: `.symtab` (every function), else `.dynsym` (exported ones)."""
        return next((t for t in (SYMTAB, DYNSYM) if self.symbols(t) > 1), None)

    def functions(self, table: str, interest: re.Pattern[str] | None = None) -> Iterator[Function]:
        """The function symbols of `table` with an address, in table order; with `interest`, only those whose
        name it finds (searched in the name's ASCII: a cheap filter before the name is decoded)."""
        entries: Iterator[tuple[int, int, int, int, int]]
        if self._shdrs is not None:
            strtab, unpacked = self._entries(table)
            entries = ((n, info, shndx, value, size) for n, info, _, shndx, value, size in unpacked)
        else:
            from elftools.elf.sections import SymbolTableSection

            sec = self.section(table)
            if not isinstance(sec, SymbolTableSection):
                return
            strtab = self.elf.get_section(sec["sh_link"]).data()
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

    def variables(self) -> Iterator[tuple[str, str, int, int]]:
        """(name, section, value, size) of `.symtab`'s data objects defined in a section, in table order:
        where a compiled BPF object's global variables sit (probes.layout)."""
        if self._shdrs is None:
            from elftools.elf.sections import SymbolTableSection

            sec = self.section(SYMTAB)
            for s in sec.iter_symbols() if isinstance(sec, SymbolTableSection) else ():
                if s["st_info"]["type"] == "STT_OBJECT" and isinstance(s["st_shndx"], int):
                    yield s.name, self.elf.get_section(s["st_shndx"]).name, s["st_value"], s["st_size"]
            return
        strtab, entries = self._entries(SYMTAB)
        for n, info, _, shndx, value, size in entries:
            if info & 0xF == _STT_OBJECT and 0 < shndx < min(len(self._shdrs), _SHN_LORESERVE):
                yield (strtab[n:strtab.find(b"\0", n)].decode("utf-8", "replace"), self._shdrs[shndx].name,
                       value, size)

    def raw_functions(self, table: str) -> Iterator[tuple[bytes, int]]:
        """(raw name, address) of `table`'s function symbols with an address, in table order: `functions`
        without decoding names or making records, for whole-table lookups."""
        if self._shdrs is None:  # another class or byte order: pyelftools' view
            for f in self.functions(table):
                yield f.name.encode("utf-8", "surrogateescape"), f.address
            return
        strtab, entries = self._entries(table)
        for n, info, _, _, value, _ in entries:
            if info & 0xF == _STT_FUNC and value:
                yield strtab[n:strtab.find(b"\0", n)], value

    def _entries(self, table: str) -> tuple[bytes, Iterator[tuple[int, int, int, int, int, int]]]:
        """A symbol table's string table and its entries unpacked (Elf64_Sym's fields); none when it is not one."""
        found = self._table(table)
        if found is None:
            return b"", iter(())
        strtab, data = found
        return strtab, _SYM64.iter_unpack(data)

    def _table(self, table: str) -> tuple[bytes, bytes] | None:
        """A symbol table's (string table, whole entries), unpacked here; None when it is not one."""
        assert self._shdrs is not None
        sh = self._shdr(table)
        if sh is None or sh.type not in (_SHT_SYMTAB, _SHT_DYNSYM) or not 0 < sh.link < len(self._shdrs):
            return None
        link = self._shdrs[sh.link]
        return self._at(link.offset, link.size), self._at(sh.offset, sh.size - sh.size % _SYM64.size)

    def segments(self) -> list[Segment]:
        """The PT_LOAD segments, in file order."""
        if self._segments is None:
            self._segments = [Segment(int(s["p_offset"]), int(s["p_filesz"]), int(s["p_vaddr"]), int(s["p_memsz"]),
                                      int(s["p_flags"])) for s in self.elf.iter_segments() if s["p_type"] == "PT_LOAD"]
        return self._segments

    def interpreted(self) -> bool:
        """Whether it names a program interpreter (PT_INTERP): a dynamically linked executable."""
        if self._shdrs is not None:
            return self._interp
        return any(s["p_type"] == "PT_INTERP" for s in self.elf.iter_segments())

    def needed(self) -> tuple[list[str], list[str]]:
        """(DT_NEEDED, the directories of DT_RUNPATH or DT_RPATH as written: `$ORIGIN` unexpanded)."""
        from elftools.elf.dynamic import DynamicSection

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
                self.stream.seek(seg.offset + vaddr - seg.vaddr)
                return self.stream.read(size)
        return b""


def _pyelftools(stream: BinaryIO) -> "ELFFile":
    from elftools.elf.elffile import ELFFile

    return ELFFile(stream)


def _gnu_build_id(notes: bytes) -> str | None:
    """The NT_GNU_BUILD_ID in a note section's bytes (name and description each padded to 4 bytes)."""
    off = 0
    while off + 12 <= len(notes):
        namesz, descsz, kind = struct.unpack_from("<III", notes, off)
        name_at = off + 12
        desc_at = name_at + (namesz + 3) // 4 * 4
        if desc_at + descsz > len(notes):
            return None
        if kind == _NT_GNU_BUILD_ID and notes[name_at:name_at + namesz].rstrip(b"\0") == b"GNU":
            return notes[desc_at:desc_at + descsz].hex()
        off = desc_at + (descsz + 3) // 4 * 4
    return None


def build_id(path: str) -> tuple[str | None, str | None]:
    """(build-id, None) of the ELF file at `path`, or (None, why it cannot be read)."""
    try:
        with ElfObject.open(path) as obj:
            return obj.build_id(), None
    except UNREADABLE as e:
        return None, getattr(e, "strerror", None) or type(e).__name__


@lru_cache(maxsize=256)
def _raw_starts(path: str) -> dict[bytes, int]:
    """Raw name -> first address, from the fullest table, names undecoded: an object's tens of
    thousands of functions, of which a run's stacks name a few hundred."""
    out: dict[bytes, int] = {}
    try:
        with ElfObject.open(path) as obj:
            table = obj.fullest()
            for name, address in obj.raw_functions(table) if table else ():
                out.setdefault(name, address)
    except UNREADABLE:
        return {}
    return out


def forget_starts() -> None:
    """Forget the tables read: a file was replaced at a path already read (tables are kept by path)."""
    _raw_starts.cache_clear()
    function_starts.cache_clear()


@lru_cache(maxsize=256)
def function_starts(path: str) -> dict[str, int]:
    """Function name -> start address (the object's vaddr), from the fullest symbol table, the first
    address of a name winning; {} when unreadable."""
    out: dict[str, int] = {}
    for raw, address in _raw_starts(path).items():
        out.setdefault(raw.decode("utf-8", "replace"), address)
    return out


def starts_named(path: str, names: Iterable[str]) -> dict[str, int]:
    """function_starts' entries for these names only (a name the table lacks is left out)."""
    raw = _raw_starts(path)
    found = {n: raw.get(n.encode("utf-8", "surrogateescape")) for n in names}
    return {n: a for n, a in found.items() if a is not None}
