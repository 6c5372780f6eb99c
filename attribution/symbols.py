"""Whether a frame has a function name: what the report's per-object symbol line counts.

perf names a frame `[unknown]` where an object has no symbol covering the address; qprof names a
stripped object's internal functions by the object and the function's start (`libx.so.1+0x5a3c0`,
collectors.debuginfo) when the unwind table is all there is. Both are frames without a function's
own name: the share of samples taken in them says how much the names of an object can be trusted.
A frame's address (its function's start, for pprof and OTLP) comes from the archive: FrameAddresses.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from qprof.archive.model import ObjectSymbols
from qprof.errors import QprofError
from qprof.jsonvalue import JsonObject
from qprof.probes.elf import build_id, function_starts

if TYPE_CHECKING:
    from qprof.archive import Run

UNKNOWN = "[unknown]"
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

    def to_json(self) -> JsonObject:
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


class FrameAddresses:
    """A frame's address for backends that symbolize by build-id: its function's start in its object.

    From the name qprof gave a stripped object's function (`libx.so.1+0x5a3c0`), else from the run's
    functions.json (collectors.functions: recorded at the end of the run from the files it mapped), so a
    report made anywhere gives the addresses the run had. An archive without that file (an older qprof,
    a run cut before its end) is read as before, from the symbol table of the object's debug file or of
    the object at the path the run recorded, but only from a file whose build-id is the one recorded for
    the object: on another machine, or after the binary was rebuilt, that path holds another file. 0 where
    none is known; `note()` says in one line what could not be read and why."""

    def __init__(self, run: Run) -> None:
        self._notes: list[str] = []
        self._recorded: dict[str, dict[str, int]] | None = None
        self._unchecked: dict[str, str] = {}  # an older archive's object -> why its files were not read
        self._files: dict[str, tuple[str, ...]] = {}  # an older archive's object -> its files with its build-id
        try:
            starts = run.function_starts()
        except QprofError as e:
            starts = None
            self._notes.append(f"{e}; pprof addresses read from the run's objects where their build-id matches")
        if starts is not None:
            self._recorded = {o.path: o.starts for o in starts.objects}
        meta = run.meta
        self._sources = {s.path: s.source for s in meta.symbols if s.source}
        self._build_ids = {s.path: s.build_id for s in meta.symbols}
        self._build_ids.update({o.path: o.build_id for t in meta.targets for o in t.objects})

    def __call__(self, sym: str, dso: str) -> int:
        start = by_start(sym)
        if start is not None:
            return start
        if dso.startswith("["):
            return 0
        if self._recorded is not None:
            return self._recorded.get(dso, {}).get(sym, 0)
        for path in self._checked(dso):
            got = function_starts(path).get(sym)
            if got:
                return got
        return 0

    def _checked(self, dso: str) -> tuple[str, ...]:
        """The files of an older archive's object whose build-id is the one the run recorded for it."""
        ok = self._files.get(dso)
        if ok is None:
            want = self._build_ids.get(dso)
            read = {p: build_id(p) for p in dict.fromkeys((self._sources.get(dso), dso)) if p}
            ok = self._files[dso] = tuple(p for p, (got, _) in read.items() if want is not None and got == want)
            if not ok:
                self._unchecked[dso] = "no build-id recorded" if want is None else \
                    "not the file the run mapped" if any(why is None for _, why in read.values()) else "not there"
        return ok

    def note(self) -> str | None:
        """One line on what the addresses lack, or None."""
        lines = list(self._notes)
        if self._unchecked:
            objs = sorted(self._unchecked.items())
            said = ", ".join(f"{Path(o).name} ({why})" for o, why in objs[:3]) + \
                (f" and {len(objs) - 3} more" if len(objs) > 3 else "")
            lines.append(f"addresses 0 in {len(objs)} object(s) whose file, at the path the run recorded, cannot be "
                         f"checked by build-id: {said}")
        return "; ".join(lines) or None
