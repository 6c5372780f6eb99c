"""probes.elf's own unpacking of 64-bit little-endian files against pyelftools' parse of the same files:
the host's libraries and programs, and damaged copies of one (which may only be refused as UNREADABLE)."""

from __future__ import annotations

import glob
import io
import os
import random
import shutil
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile
from elftools.elf.sections import NoteSection, SymbolTableSection
from hypothesis import given, settings
from hypothesis import strategies as st

from qprof.probes.elf import UNREADABLE, ElfObject


def host_objects(n: int) -> list[str]:
    found = sorted(f for pat in ("/usr/lib/x86_64-linux-gnu/*.so*", "/usr/lib/aarch64-linux-gnu/*.so*", "/usr/bin/*",
                                 "/usr/sbin/*")
                   for f in glob.glob(pat) if os.path.isfile(f) and not os.path.islink(f))
    elfs = []
    for f in found:
        try:
            with open(f, "rb") as fh:
                if fh.read(6) == b"\x7fELF\x02\x01":
                    elfs.append(f)
        except OSError:
            continue
    return random.Random(3).sample(elfs, min(n, len(elfs)))


def reference(path: str) -> dict[str, object]:
    """What pyelftools reads of the file, in the reader's terms."""
    with open(path, "rb") as f:
        e = ELFFile(f)
        build_id = next((str(n["n_desc"]) for s in e.iter_sections() if isinstance(s, NoteSection)
                         for n in s.iter_notes() if n["n_type"] == "NT_GNU_BUILD_ID"), None)
        counts = {}
        for t in (".symtab", ".dynsym"):
            s = e.get_section_by_name(t)
            counts[t] = s.num_symbols() if isinstance(s, SymbolTableSection) else 0
        funcs = {}
        for t in (".symtab", ".dynsym"):
            s = e.get_section_by_name(t)
            if isinstance(s, SymbolTableSection) and s.num_symbols():
                funcs[t] = [(sym.name, sym["st_value"], sym["st_size"], sym["st_shndx"] != "SHN_UNDEF")
                            for sym in s.iter_symbols() if sym["st_info"]["type"] == "STT_FUNC" and sym["st_value"]]
        segs = [(p["p_offset"], p["p_filesz"], p["p_vaddr"], p["p_memsz"], p["p_flags"])
                for p in e.iter_segments() if p["p_type"] == "PT_LOAD"]
        interp = any(p["p_type"] == "PT_INTERP" for p in e.iter_segments())
        symtab = e.get_section_by_name(".symtab")
        variables = [(sym.name, e.get_section(sym["st_shndx"]).name, sym["st_value"], sym["st_size"])
                     for sym in (symtab.iter_symbols() if isinstance(symtab, SymbolTableSection) else ())
                     if sym["st_info"]["type"] == "STT_OBJECT" and isinstance(sym["st_shndx"], int)]
        sec = e.get_section_by_name(".gnu_debuglink")
        link = sec.data() if sec is not None and sec["sh_type"] != "SHT_NOBITS" else None
        return {"build_id": build_id, "counts": counts, "funcs": funcs, "segments": segs, "interp": interp,
                "x64": e.get_machine_arch() == "x64", "debuglink": link, "go": e.get_section_by_name(".gopclntab") is not None,
                "variables": variables}


def ours(path: str) -> dict[str, object]:
    with ElfObject.open(path) as o:
        funcs = {t: [(f.name, f.address, f.size, f.defined) for f in o.functions(t)]
                 for t in (".symtab", ".dynsym") if o.symbols(t)}
        return {"build_id": o.build_id(), "counts": {t: o.symbols(t) for t in (".symtab", ".dynsym")}, "funcs": funcs,
                "segments": [(s.offset, s.filesz, s.vaddr, s.memsz, s.flags) for s in o.segments()],
                "interp": o.interpreted(), "x64": o.x86_64(), "debuglink": o.contents(".gnu_debuglink"),
                "go": o.has(".gopclntab"), "variables": list(o.variables())}


def test_host_objects_read_as_pyelftools_reads_them() -> None:
    objects = host_objects(60)
    if len(objects) < 10:
        pytest.skip("fewer than 10 64-bit little-endian ELF files under /usr here")
    for path in objects:
        assert ours(path) == reference(path), path


@pytest.fixture(scope="module")
def sample_bytes() -> bytes:
    path = shutil.which("ls") or "/bin/ls"
    return Path(path).read_bytes()


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_damaged_files_are_refused_or_read(sample_bytes: bytes, data: st.DataObject) -> None:
    """Cut short, or bytes overwritten in its headers: refused as UNREADABLE, never another error."""
    blob = bytearray(sample_bytes[:data.draw(st.integers(0, 8192)) or len(sample_bytes)])
    for _ in range(data.draw(st.integers(0, 8))):
        if blob:
            at = data.draw(st.integers(0, min(len(blob) - 1, 4095)))
            blob[at] = data.draw(st.integers(0, 255))
    try:
        o = ElfObject(io.BytesIO(bytes(blob)))
        o.build_id(), o.fullest(), o.interpreted(), o.segments(), o.contents(".text"), o.x86_64()
        for t in (".symtab", ".dynsym"):
            list(o.functions(t))
        list(o.variables())
    except UNREADABLE:
        pass
