"""Where the run's sampled functions start in their objects, recorded at the end of the run (functions.json).

pprof and OTLP locations carry their function's start in its object, so a backend that symbolizes by
build-id (as continuous profilers do) can name them again. Reading those starts at report time, from the
files at the paths the run recorded, gave a report made on another machine, or after a binary was
deleted or rebuilt, no address or a wrong one. So they are read here, once, as the objects' names
are (collectors.debuginfo): for each object the folded stacks name, from the symbol table of the file
its names came from (its debug file, or qprof's file of names made from `.gopclntab` or the unwind
table: the `symbols` source in meta.json), else the object's own, read through the target's view
where the host's path is not the target's file (collectors.mapfiles). A file is used only when its
build-id is the one the run recorded for the object. Only the functions the samples name are kept.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterable, Iterator

from qprof import runfiles
from qprof.archive import schema, write_json_atomic
from qprof.archive.model import FunctionStarts, Meta, ObjectFunctions
from qprof.archive.stacks import Frame, read_stacks
from qprof.probes import elf


def stack_frames(stacks: Path) -> Iterator[Frame]:
    """Every frame of a stacks file's records (none when nothing was sampled). The collector passes the
    folder's distinct frames instead: reading back the file it just wrote was ~40 ms of every attach's end."""
    if stacks.is_file():
        for rec in read_stacks(stacks):
            yield from rec.frames


def sampled(frames: Iterable[Frame]) -> dict[str, set[str]]:
    """Object -> the function names `frames` give it (kernel and `[unknown]` left out)."""
    out: dict[str, set[str]] = {}
    for sym, dso in frames:
        if not dso.startswith("[") and not sym.startswith("["):
            out.setdefault(dso, set()).add(sym)
    return out


def starts_of(path: str, build_id: str | None, names: set[str], candidates: list[str]) -> ObjectFunctions:
    """The starts of `names` in the object `path`: each from the first of `candidates` (files that may hold
    its symbol table) whose build-id is `build_id` and whose table has it. A later candidate is opened only
    for names still missing (a name the tables lack, as `memcpy@plt`, still reads them all)."""
    got: dict[str, int] = {}
    source = None
    checked = False
    for c in dict.fromkeys(candidates):
        if len(got) == len(names):
            break
        if elf.build_id(c) != (build_id, None):
            continue
        checked = True
        more = {n: a for n, a in sorted(elf.starts_named(c, names - got.keys()).items()) if a}
        got.update(more)
        source = source or (c if more else None)
    if got:
        return ObjectFunctions(path, build_id, dict(sorted(got.items())), source)
    why = "no file with its build-id could be read" if not checked else "its symbol table names none of them"
    return ObjectFunctions(path, build_id, note=why)


def record(frames: Iterable[Frame], meta: Meta, readable: Callable[[int, str], str | None]) -> FunctionStarts:
    """The starts of every function `frames` (the run's stacks') name, per object; `readable(pid, path)`: where a
    target's own file is read when the host's path is not it (collectors.mapfiles), None where it is."""
    build_ids: dict[str, str | None] = {s.path: s.build_id for s in meta.symbols}
    mapper: dict[str, int] = {}
    for t in meta.targets:
        for o in t.objects:
            build_ids[o.path] = o.build_id
            mapper.setdefault(o.path, t.pid)
    sources = {s.path: s.source for s in meta.symbols if s.source}
    objects = []
    for path, names in sorted(sampled(frames).items()):
        pid = mapper.get(path)
        own = readable(pid, path) if pid is not None else None
        candidates = [c for c in (sources.get(path), own, path) if c]
        objects.append(starts_of(path, build_ids.get(path), names, candidates))
    return FunctionStarts(objects)


def write(out: Path, frames: Iterable[Frame], meta: Meta, readable: Callable[[int, str], str | None]) -> FunctionStarts:
    """Record the run's function starts into its functions.json (after its stacks were folded)."""
    starts = record(frames, meta, readable)
    write_json_atomic(out / runfiles.FUNCTIONS, schema.encode(starts))
    return starts
