"""The ELF symbol reader: build-ids, symbol tables, frame pointers (pyelftools).

Collection-time facts about the targets' binaries and libraries. They decide
how perf unwinds (frame pointers vs DWARF) and let a report, made elsewhere,
tell which exact objects were profiled and how well they were symbolised.
"""

from __future__ import annotations

import struct
from functools import lru_cache
from typing import Iterator

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile
from elftools.elf.sections import NoteSection, SymbolTableSection

from qprof.archive.model import MappedObject

# push %rbp; mov %rsp,%rbp (optionally after endbr64): what a frame-pointer prologue looks like.
_FP_PROLOGUES = (b"\x55\x48\x89\xe5", b"\xf3\x0f\x1e\xfa\x55\x48\x89\xe5")
_SAMPLE_FUNCS = 300


_SYM64 = struct.Struct("<IBBHQQ")  # Elf64_Sym: name, info, other, shndx, value, size
_STT_FUNC = 2


def _functions(elf: ELFFile) -> Iterator[tuple[int, int]]:
    """(address, size) of the functions in the fullest symbol table. The table is unpacked
    whole with struct: pyelftools' symbol objects took ~2 s of attach start-up for Python."""
    for name in (".symtab", ".dynsym"):
        sec = elf.get_section_by_name(name)
        if isinstance(sec, SymbolTableSection):
            data = sec.data()
            if elf.elfclass != 64 or not elf.little_endian or len(data) % _SYM64.size:
                return
            for _, info, _, _, value, size in _SYM64.iter_unpack(data):
                if info & 0xF == _STT_FUNC and value and size >= 16:
                    yield value, size
            return


def _symbol_kind(elf: ELFFile) -> str:
    for name, kind in ((".symtab", "symtab"), (".dynsym", "dynsym")):
        sec = elf.get_section_by_name(name)
        if isinstance(sec, SymbolTableSection) and sec.num_symbols() > 1:
            return kind
    return "none"


def build_id_of(elf: ELFFile) -> str | None:
    """The GNU build-id note, hex: how perf, debug files and debuginfod name an object."""
    for sec in elf.iter_sections():
        if isinstance(sec, NoteSection):
            for note in sec.iter_notes():
                if note["n_type"] == "NT_GNU_BUILD_ID":
                    return str(note["n_desc"])
    return None


def _read_vaddr(elf: ELFFile, vaddr: int, size: int) -> bytes:
    for seg in elf.iter_segments():
        if seg["p_type"] == "PT_LOAD" and seg["p_vaddr"] <= vaddr < seg["p_vaddr"] + seg["p_filesz"]:
            off = seg["p_offset"] + vaddr - seg["p_vaddr"]
            elf.stream.seek(off)
            return elf.stream.read(size)
    return b""


def _frame_pointers(elf: ELFFile, is_go: bool) -> bool | None:
    """Judge by prologues of the largest functions: most start `push rbp; mov rbp,rsp` with -fno-omit-frame-pointer."""
    if is_go:
        return True  # Go has kept frame pointers on amd64 since 1.7
    if elf.get_machine_arch() != "x64":
        return None
    funcs = sorted(_functions(elf), key=lambda f: -f[1])[:_SAMPLE_FUNCS]
    if len(funcs) < 5:
        return None
    with_fp = sum(1 for addr, _ in funcs if any(p in _read_vaddr(elf, addr, 16) for p in _FP_PROLOGUES))
    return with_fp / len(funcs) >= 0.5


@lru_cache(maxsize=512)
def object_info(path: str, readable: str | None = None) -> MappedObject:
    """Read one object (at `readable` when its path on the host is not the target's file: deleted, or in
    another mount namespace; collectors.mapfiles); an unreadable or non-ELF file is reported as such, never raised."""
    try:
        with open(readable or path, "rb") as f:
            elf = ELFFile(f)
            is_go = elf.get_section_by_name(".go.buildinfo") is not None or \
                elf.get_section_by_name(".gopclntab") is not None
            dynamic = any(seg["p_type"] == "PT_INTERP" for seg in elf.iter_segments())
            return MappedObject(path, build_id_of(elf), _symbol_kind(elf), is_go, _frame_pointers(elf, is_go), dynamic)
    except (OSError, ELFError, ValueError, KeyError):
        return MappedObject(path, None, "unreadable", False, None)
