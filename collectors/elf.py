"""What attach records of each object a target maps: build-id, symbol table, frame pointers.

Collection-time facts about the targets' binaries and libraries. They decide
how perf unwinds (frame pointers vs DWARF) and let a report, made elsewhere,
tell which exact objects were profiled and how well they were symbolised.
The file is read by probes.elf, the one ELF reader.
"""

from __future__ import annotations

import os
from functools import lru_cache

from qprof.archive.model import MappedObject
from qprof.cachefiles import CACHE_HOME, read_json, write_json
from qprof.probes.elf import DYNSYM, SYMTAB, UNREADABLE, ElfObject

# What was read of each file, by the file's identity: an attach describes the ~20 objects an endpoint
# maps, the same libraries run after run, and judging their prologues was ~50 ms of every start.
OBJECTS = CACHE_HOME / "objects.json"
_KEEP = 4096  # files remembered; the oldest are forgotten first
_remembered: dict[str, object] | None = None

# push %rbp; mov %rsp,%rbp (optionally after endbr64): what a frame-pointer prologue looks like.
_FP_PROLOGUES = (b"\x55\x48\x89\xe5", b"\xf3\x0f\x1e\xfa\x55\x48\x89\xe5")
_SAMPLE_FUNCS = 300


def _symbol_kind(obj: ElfObject) -> str:
    return {SYMTAB: "symtab", DYNSYM: "dynsym", None: "none"}[obj.fullest()]


def _frame_pointers(obj: ElfObject, is_go: bool) -> bool | None:
    """Judge by prologues of the largest functions: most start `push rbp; mov rbp,rsp` with -fno-omit-frame-pointer."""
    if is_go:
        return True  # Go has kept frame pointers on amd64 since 1.7
    if not obj.x86_64():
        return None
    table = obj.fullest()
    funcs = sorted(((f.address, f.size) for f in obj.functions(table) if f.size >= 16) if table else (),
                   key=lambda f: -f[1])[:_SAMPLE_FUNCS]
    if len(funcs) < 5:
        return None
    with_fp = sum(1 for head in (obj.read(addr, 16) for addr, _ in funcs) if any(p in head for p in _FP_PROLOGUES))
    return with_fp / len(funcs) >= 0.5


def _identity(path: str) -> str | None:
    """A file's identity: device, inode, size, modification and change times (a rewrite changes one)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"


def _read(path: str, readable: str | None) -> MappedObject:
    try:
        with ElfObject.open(readable or path) as obj:
            is_go = obj.has(".go.buildinfo", ".gopclntab")
            return MappedObject(path, obj.build_id(), _symbol_kind(obj), is_go, _frame_pointers(obj, is_go),
                                obj.interpreted())
    except UNREADABLE:
        return MappedObject(path, None, "unreadable", False, None)


def _from_cache(path: str, entry: object) -> MappedObject | None:
    if not (isinstance(entry, list) and len(entry) == 5):
        return None
    build_id, symbols, is_go, fp, dynamic = entry
    if not (isinstance(build_id, (str, type(None))) and symbols in ("symtab", "dynsym", "none")
            and isinstance(is_go, bool) and isinstance(fp, (bool, type(None))) and isinstance(dynamic, bool)):
        return None
    return MappedObject(path, build_id, symbols, is_go, fp, dynamic)


@lru_cache(maxsize=512)
def object_info(path: str, readable: str | None = None) -> MappedObject:
    """Read one object (at `readable` when its path on the host is not the target's file: deleted, or in
    another mount namespace; collectors.mapfiles); an unreadable or non-ELF file is reported as such, never
    raised. A file read before, unchanged since, is answered from OBJECTS."""
    global _remembered
    key = _identity(readable or path)
    if key is None:
        return _read(path, readable)
    if _remembered is None:
        _remembered = read_json(OBJECTS)
    hit = _from_cache(path, _remembered.get(key))
    if hit is not None:
        return hit
    info = _read(path, readable)
    if info.symbols != "unreadable":  # a file being written, or one we may not read yet: asked again
        _remembered.pop(key, None)
        _remembered[key] = [info.build_id, info.symbols, info.go, info.frame_pointers, info.dynamic]
        while len(_remembered) > _KEEP:
            del _remembered[next(iter(_remembered))]
        write_json(OBJECTS, _remembered)
    return info
