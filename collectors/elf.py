"""What attach records of each object a target maps: build-id, symbol table, frame pointers.

Collection-time facts about the targets' binaries and libraries. They decide
how perf unwinds (frame pointers vs DWARF) and let a report, made elsewhere,
tell which exact objects were profiled and how well they were symbolised.
The file is read by probes.elf, the one ELF reader.
"""

from __future__ import annotations

from functools import lru_cache

from qprof.archive.model import MappedObject
from qprof.cachefiles import CACHE_HOME, read_json, write_json
from qprof.probes.elf import DYNSYM, SYMTAB, UNREADABLE, ElfObject

# Frame pointers judged, by build-id: an attach describes the ~20 objects an endpoint maps, the same
# libraries run after run, and judging their prologues was ~45 ms of every start. (By build-id, not by the
# file's inode and times: a file rebuilt at the same path can get the same inode, size and, to the
# clock's tick, the same times.)
JUDGED = CACHE_HOME / "frame-pointers.json"
_KEEP = 4096  # objects remembered; the oldest are forgotten first
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


def _judged(obj: ElfObject, is_go: bool, build_id: str | None, kind: str) -> bool | None:
    """_frame_pointers, remembered in JUDGED for an object with a build-id (with its symbol table's kind:
    a stripped copy shares the build-id and is judged by other functions)."""
    global _remembered
    if is_go or build_id is None:
        return _frame_pointers(obj, is_go)
    key = f"{build_id}:{kind}"
    if _remembered is None:
        _remembered = read_json(JUDGED)
    hit = _remembered.get(key, "absent")
    if hit is None or isinstance(hit, bool):
        return hit
    fp = _frame_pointers(obj, is_go)
    _remembered.pop(key, None)
    _remembered[key] = fp
    while len(_remembered) > _KEEP:
        del _remembered[next(iter(_remembered))]
    write_json(JUDGED, _remembered)
    return fp


@lru_cache(maxsize=512)
def object_info(path: str, readable: str | None = None) -> MappedObject:
    """Read one object (at `readable` when its path on the host is not the target's file: deleted, or in
    another mount namespace; collectors.mapfiles); an unreadable or non-ELF file is reported as such, never raised."""
    try:
        with ElfObject.open(readable or path) as obj:
            is_go = obj.has(".go.buildinfo", ".gopclntab")
            build_id, kind = obj.build_id(), _symbol_kind(obj)
            return MappedObject(path, build_id, kind, is_go, _judged(obj, is_go, build_id, kind), obj.interpreted())
    except UNREADABLE:
        return MappedObject(path, None, "unreadable", False, None)
