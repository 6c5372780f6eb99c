"""Symbols for stripped objects, found where the tools of the field find them, once per build-id.

Distributions ship their libraries stripped to `.dynsym` (exported functions
only): a sample in an internal function is `[unknown]` to perf, and a flame
graph merges an object's functions into one frame. For each object the
targets map, in this order (the first that has function names wins):

1. its own `.symtab`;
2. a separate debug file: by build-id (`/usr/lib/debug/.build-id/ab/cdef.debug`,
   what Debian's -dbgsym packages install) or by `.gnu_debuglink`;
3. MiniDebugInfo (`.gnu_debugdata`, an xz-compressed symbol table, as Fedora ships);
4. a Go binary's own function table (`.gopclntab`, probes.gopclntab): every Go
   function's entry and name, which a stripped Go binary keeps (code outside it, cgo's
   C, named as by the unwind table below);
5. a debuginfod server, when `DEBUGINFOD_URLS` is set: `GET URL/buildid/ID/debuginfo`,
   each request bounded by `DEBUGINFOD_TIMEOUT` (default 5 s) and all of them by
   a budget per run, the file checked (an ELF file with the same build-id) and
   cached; a 404 is remembered for a day;
6. the unwind table (`.eh_frame_hdr`): every function's start, named
   `object+0xSTART` (exported ones by their name), so an object's internal
   functions stay distinct frames and mapping rules can still place them by object.

perf reads 1-3 itself. A file qprof fetched or made (4-6) goes into qprof's own
build-id cache, in perf's layout (`ROOT/.build-id/ab/cdef.../debug`), and
`perf script` is pointed at it (`perf --buildid-dir ROOT`: perf 6.1 ignores the
PERF_BUILDID_DIR variable): perf then names the frames.
A file of names qprof made (from `.gopclntab` or the unwind table) is the
object's headers (`objcopy --only-keep-debug`) with a symbol table added
(`objcopy --add-symbol`, `write_symbols`), binutils being what makes it;
without binutils it is said and skipped. What was used for each object is
recorded (`symbols` in meta.json) and printed by the report.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import struct
import subprocess
import tempfile
import threading
import time
import zlib
from pathlib import Path
from typing import Callable, Sequence

from qprof.archive import schema
from qprof.collectors.procfs import DELETED
from qprof.probes import gopclntab
from qprof.probes.elf import DYNSYM as DYNSYM_SECTION, SYMTAB as SYMTAB_SECTION, UNREADABLE, ElfObject
from qprof.collectors.mapfiles import SAME, ObjectView
from qprof.archive.model import (DEBUG_FILE, DEBUGINFOD, DEBUGLINK, DYNSYM, GOPCLNTAB, MINIDEBUGINFO, NONE, SYMTAB,
                                 UNWIND, ObjectSymbols)

DEBUG_ROOTS = ("/usr/lib/debug",)
DEFAULT_TIMEOUT_S = 5.0  # one debuginfod request (DEBUGINFOD_TIMEOUT overrides, as for elfutils)
FETCH_BUDGET_S = 20.0  # all debuginfod requests of one run together: collection never waits longer
MISS_TTL_S = 24 * 3600  # a build-id a server answered 404 for is not asked again for a day
MAX_DEBUG_BYTES = 1 << 30  # a debug file larger than this is refused (a server answering garbage forever)


def cache_root() -> Path:
    """qprof's build-id cache: QPROF_SYMBOL_CACHE, else ~/.cache/qprof/symbols."""
    env = os.environ.get("QPROF_SYMBOL_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "qprof" / "symbols"


def cached_debug(root: Path, build_id: str) -> Path:
    """Where perf looks for a build-id's debug file in a build-id cache (`perf --buildid-dir root`)."""
    return root / ".build-id" / build_id[:2] / build_id[2:] / "debug"


def _has_functions(obj: ElfObject) -> bool:
    return obj.symbols(SYMTAB_SECTION) > 1


def check_debug_file(path: Path, build_id: str) -> str | None:
    """None when `path` is an ELF file with `build_id` and a symbol table; else why it is refused."""
    try:
        with ElfObject.open(str(path)) as obj:
            got = obj.build_id()
            if got != build_id:
                return f"its build-id is {got or 'missing'}, not {build_id}"
            if not _has_functions(obj):
                return "it has no symbol table"
    except UNREADABLE as e:
        return f"not a readable ELF file ({type(e).__name__})"
    return None


def _debuglink(obj: ElfObject) -> tuple[str, int] | None:
    data = obj.contents(".gnu_debuglink")
    if data is None:
        return None
    name, _, rest = data.partition(b"\0")
    if not name or len(data) < 4:
        return None
    return name.decode("utf-8", "replace"), struct.unpack("<I", data[-4:])[0]


def _by_debuglink(path: str, link: tuple[str, int]) -> Path | None:
    """The debuglink's file where gdb looks: beside the object, in .debug/, under each debug root;
    its CRC32 must match."""
    name, crc = link
    here = Path(path).parent
    for cand in [here / name, here / ".debug" / name] + [Path(r + str(here)) / name for r in DEBUG_ROOTS]:
        try:
            if cand.is_file() and zlib.crc32(cand.read_bytes()) & 0xFFFFFFFF == crc:
                return cand
        except OSError:
            continue
    return None


def eh_frame_starts(obj: ElfObject) -> list[int]:
    """Function start addresses from `.eh_frame_hdr`'s sorted search table (the usual encoding:
    pcrel sdata4 frame pointer, udata4 count, datarel sdata4 table); [] when absent or encoded otherwise."""
    sec = obj.section(".eh_frame_hdr")
    if sec is None:
        return []
    data = sec.data()
    if len(data) < 12 or data[0] != 1 or data[1:4] != b"\x1b\x03\x3b":
        return []
    (count,) = struct.unpack_from("<I", data, 8)
    if 12 + 8 * count > len(data):
        return []
    base = sec["sh_addr"]
    return sorted({base + start for start, _ in struct.iter_unpack("<ii", data[12:12 + 8 * count])})


def _exported(obj: ElfObject) -> dict[int, str]:
    """Exported functions: address -> name (the first name an address has)."""
    out: dict[int, str] = {}
    for f in obj.functions(DYNSYM_SECTION):
        if f.name:
            out.setdefault(f.address, f.name)
    return out


def _text(obj: ElfObject) -> tuple[int, int]:
    text = obj.section(".text")
    if text is None:
        raise OSError("no .text section")
    return int(text["sh_addr"]), int(text["sh_addr"] + text["sh_size"])


def unwind_names(obj: ElfObject, name: str) -> dict[int, str]:
    """The functions of `.text` by start address: those of the unwind table (`name+0xSTART`, the object's file
    name and the start) and the exported ones (by their name)."""
    lo, hi = _text(obj)
    names = {a: n for a, n in _exported(obj).items() if lo <= a < hi}
    return {**{a: f"{name}+{a:#x}" for a in eh_frame_starts(obj) if lo <= a < hi}, **names}


def go_names(obj: ElfObject, name: str) -> tuple[dict[int, str], gopclntab.GoFunctions]:
    """A Go binary's functions by entry: its `.gopclntab`'s, and what the unwind table names outside them
    (cgo's C code); with the table read (its reason when it named nothing: then {})."""
    go = gopclntab.read(obj.elf)
    if not go.functions:
        return {}, go
    names = {a: n for a, n in unwind_names(obj, name).items() if not go.covers(a)}
    return {**names, **dict(go.functions)}, go


def _arg(name: str) -> str:
    """One symbol name in objcopy's @file (libiberty's buildargv: a backslash keeps the next character); `=` ends
    the name in --add-symbol, so it is written `%3D` (no other character is changed)."""
    return "".join("\\" + c if c.isspace() or c in "\\'\"" else c for c in name.replace("=", "%3D"))


def write_symbols(path: str, names: dict[int, str], out: Path) -> int:
    """Write a debug file for `path` whose symbol table names its functions (start address -> name, those in
    `.text`), for perf to read from qprof's build-id cache; returns how many. Raises OSError when binutils
    cannot make it."""
    objcopy = shutil.which("objcopy")
    if objcopy is None:
        raise OSError("objcopy not found (Debian: apt-get install binutils)")
    with ElfObject.open(path) as obj:
        lo, hi = _text(obj)
    syms = sorted((a, n) for a, n in names.items() if lo <= a < hi and n)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        keep = Path(tmp) / "debug"
        args = Path(tmp) / "args"
        args.write_text("".join(f"--add-symbol {_arg(n)}=.text:{a - lo:#x},function,global\n" for a, n in syms),
                        encoding="utf-8")
        for cmd in ([objcopy, "--only-keep-debug", path, str(keep)], [objcopy, f"@{args}", str(keep)]):
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                raise OSError(f"{Path(cmd[0]).name} failed: {(r.stderr or r.stdout).strip().splitlines()[-1:]}")
        keep.replace(out)
    return len(syms)


def unwind_symbols(path: str, out: Path, name: str | None = None) -> str:
    """write_symbols with the unwind table's names (unwind_names, by `name`, the object's file name,
    default `path`'s); says how many. OSError when it names none."""
    with ElfObject.open(path) as obj:
        names = unwind_names(obj, name or Path(path).name)
    if not names:
        raise OSError("no function in .text has an unwind-table entry or an exported name")
    return f"{write_symbols(path, names, out)} functions named by object and start"


def go_symbols(path: str, out: Path, name: str | None = None) -> str:
    """write_symbols with a Go binary's names (go_names); says how many. OSError with the reason when
    its `.gopclntab` names nothing."""
    with ElfObject.open(path) as obj:
        names, go = go_names(obj, name or Path(path).name)
    if not go.functions:
        raise OSError(go.reason)
    write_symbols(path, names, out)
    return f"{len(go.functions):,} Go functions named from .gopclntab ({go.layout} layout)"


class Debuginfod:
    """A debuginfod client: the servers of DEBUGINFOD_URLS, a time budget, a cache and remembered misses."""

    def __init__(self, urls: list[str], root: Path, timeout_s: float, budget_s: float = FETCH_BUDGET_S) -> None:
        self.urls, self.root, self.timeout_s = urls, root, timeout_s
        self.deadline = time.monotonic() + budget_s
        self._misses_path = root / "debuginfod-misses.json"

    @classmethod
    def from_env(cls, root: Path) -> "Debuginfod | None":
        urls = os.environ.get("DEBUGINFOD_URLS", "").split()
        if not urls:
            return None
        try:
            timeout = float(os.environ.get("DEBUGINFOD_TIMEOUT", DEFAULT_TIMEOUT_S))
        except ValueError:
            timeout = DEFAULT_TIMEOUT_S
        return cls(urls, root, max(0.1, min(timeout, FETCH_BUDGET_S)))

    def _misses(self) -> dict[str, float]:
        try:
            got = json.loads(self._misses_path.read_text())
            return {k: float(v) for k, v in got.items()} if isinstance(got, dict) else {}
        except (OSError, ValueError, TypeError):
            return {}

    def _miss(self, build_id: str) -> None:
        misses = {k: v for k, v in self._misses().items() if time.time() - v < MISS_TTL_S}
        misses[build_id] = time.time()
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self._misses_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(misses))
        tmp.replace(self._misses_path)

    def fetch(self, build_id: str) -> tuple[Path | None, str]:
        """The build-id's debug file from the first server that has it (cached), or None, with one line
        saying what happened."""
        dest = cached_debug(self.root, build_id)
        if time.time() - self._misses().get(build_id, 0.0) < MISS_TTL_S:
            return None, "no server had it within the last day"
        said, all_404 = [], True
        for url in self.urls:
            left = self.deadline - time.monotonic()
            if left <= 0:
                said.append("the run's debuginfod time budget is spent")
                all_404 = False
                break
            got, why, is_404 = self._get(url, build_id, dest, min(self.timeout_s, left))
            if got is not None:
                return got, why
            said.append(why)
            all_404 &= is_404
        if all_404 and said:
            self._miss(build_id)
        return None, "; ".join(said)

    def _get(self, url: str, build_id: str, dest: Path, timeout: float) -> tuple[Path | None, str, bool]:
        import urllib.error  # here: urllib.request (http.client, email, ssl) was a tenth of every attach's imports
        import urllib.request

        where = f"{url.rstrip('/')}/buildid/{build_id}/debuginfo"
        t0 = time.monotonic()
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(dir=dest.parent, prefix=".fetch-")
        tmp = Path(tmp_name)
        try:
            with os.fdopen(fd, "wb") as out, urllib.request.urlopen(where, timeout=timeout) as r:
                size = 0
                while True:
                    if time.monotonic() - t0 > timeout:
                        return None, f"{url}: too slow (over {timeout:g} s)", False
                    chunk = r.read(1 << 16)
                    if not chunk:
                        break
                    size += len(chunk)
                    if size > MAX_DEBUG_BYTES:
                        return None, f"{url}: answered more than {MAX_DEBUG_BYTES >> 20} MiB", False
                    out.write(chunk)
            bad = check_debug_file(tmp, build_id)
            if bad is not None:
                return None, f"{url}: refused its answer: {bad}", False
            tmp.replace(dest)
            return dest, f"fetched from {url} in {time.monotonic() - t0:.1f} s", False
        except urllib.error.HTTPError as e:
            return None, f"{url}: HTTP {e.code}", e.code == 404
        except (urllib.error.URLError, OSError, ValueError) as e:
            reason = getattr(e, "reason", e)
            return None, f"{url}: {reason}", False
        finally:
            tmp.unlink(missing_ok=True)


def symbols_for(path: str, root: Path, debuginfod: Debuginfod | None, readable: str | None = None) -> ObjectSymbols:
    """Where `path`'s function names come from (see the module docstring), preparing qprof's build-id
    cache where it provides them. `readable`: where the target's own file is read when its path on the
    host is not it (deleted, another mount namespace: collectors.mapfiles)."""
    if readable is None and path.endswith(DELETED):
        return ObjectSymbols(path, None, NONE, note="deleted, and not read through its process while it lived")
    name = Path(path.removesuffix(DELETED)).name
    try:
        with ElfObject.open(readable or path) as obj:
            build_id = obj.build_id()
            if _has_functions(obj):
                return ObjectSymbols(path, build_id, SYMTAB)
            link = _debuglink(obj)
            mini = obj.has(".gnu_debugdata")
            go = obj.has(*gopclntab.SECTIONS)
            dynsym = obj.has(DYNSYM_SECTION)
    except UNREADABLE as e:
        return ObjectSymbols(path, None, NONE, note=f"unreadable ({type(e).__name__})")
    mine = cached_debug(root, build_id) if build_id else None
    if build_id:
        for r in DEBUG_ROOTS:
            cand = Path(r) / ".build-id" / build_id[:2] / f"{build_id[2:]}.debug"
            if cand.is_file():
                bad = check_debug_file(cand, build_id)
                if bad is None:
                    _forget(mine)  # perf would read qprof's cached file first
                    return ObjectSymbols(path, build_id, DEBUG_FILE, str(cand))
                note = f"{cand} refused: {bad}"
                break
        else:
            note = ""
    else:
        note = "no build-id: no debug file, no debuginfod"
    if link is not None and readable is None:  # a debuglink is looked for beside the object, on the host
        found = _by_debuglink(path, link)
        if found is not None:
            _forget(mine)
            return ObjectSymbols(path, build_id, DEBUGLINK, str(found))
    if mini:
        _forget(mine)
        return ObjectSymbols(path, build_id, MINIDEBUGINFO, path)
    held = _held(mine, build_id)  # what qprof's cache holds for it from an earlier run
    if go and build_id and mine is not None:
        if held is not None and held.how == GOPCLNTAB:
            return ObjectSymbols(path, build_id, GOPCLNTAB, str(mine), _join(note, held.note))
        made = _make(readable or path, name, build_id, mine, GOPCLNTAB, go_symbols)
        if isinstance(made, ObjectSymbols):
            return ObjectSymbols(path, build_id, GOPCLNTAB, made.source, _join(note, made.note))
        note = _join(note, f"gopclntab not used: {made}")
    elif go:
        note = _join(note, "gopclntab not used: without a build-id perf cannot find the names qprof would make")
    if held is not None and held.how == DEBUGINFOD:
        return ObjectSymbols(path, build_id, DEBUGINFOD, held.source, "cached")
    if build_id and mine is not None and debuginfod is not None:
        got, said = debuginfod.fetch(build_id)
        if got is not None:
            _hold(mine, ObjectSymbols(path, build_id, DEBUGINFOD, said.split(" in ")[0].removeprefix("fetched from ")))
            return ObjectSymbols(path, build_id, DEBUGINFOD, str(got), said)
        note = _join(note, f"debuginfod: {said}")
    if held is not None and held.how == UNWIND:
        return ObjectSymbols(path, build_id, UNWIND, str(mine), _join(note, held.note))
    if build_id and mine is not None:
        made = _make(readable or path, name, build_id, mine, UNWIND, unwind_symbols)
        if isinstance(made, ObjectSymbols):
            return ObjectSymbols(path, build_id, UNWIND, made.source, _join(note, made.note))
        note = _join(note, f"unwind table not used: {made}")
    return ObjectSymbols(path, build_id, DYNSYM if dynsym else NONE, note=note)


def _join(*notes: str) -> str:
    return "; ".join(n for n in notes if n)


def _make(path: str, name: str, build_id: str, debug: Path, how: str,
          write: Callable[[str, Path, str], str]) -> ObjectSymbols | str:
    """Name the functions of the object `name` (read at `path`) in qprof's cache (`write`: go_symbols or
    unwind_symbols, saying how many), the file's record held beside it; why not, when it cannot."""
    try:
        said = write(path, debug, name)
    except UNREADABLE as e:
        return str(e)
    made = ObjectSymbols(path, build_id, how, str(debug), said)
    _hold(debug, made)
    return made


def _hold(debug: Path, what: ObjectSymbols) -> None:
    """Say beside a cached debug file where it came from (debuginfod, or made from .gopclntab or the unwind table)."""
    (debug.parent / "qprof-source.json").write_text(json.dumps(schema.encode(what)))


def _held(debug: Path | None, build_id: str | None) -> ObjectSymbols | None:
    """The cached debug file's record, when the file is still good; None otherwise."""
    if debug is None or build_id is None or not debug.is_file() or check_debug_file(debug, build_id) is not None:
        return None
    try:
        doc = schema.loads((debug.parent / "qprof-source.json").read_text())
    except (OSError, ValueError, RecursionError):
        return None
    shape = schema.shape_of(ObjectSymbols)
    return schema.decode(ObjectSymbols, doc) if schema.conforms(doc, shape) else None


def _forget(cached: Path | None) -> None:
    """Drop qprof's own file for a build-id that now has a better source (a debug package installed)."""
    if cached is not None:
        cached.unlink(missing_ok=True)
        (cached.parent / "qprof-source.json").unlink(missing_ok=True)


class Finder:
    """Looks for names of the objects the targets map as they appear (a target held at exec maps its
    libraries only once released), in a thread of its own; `ready` is clear while it works, so a
    folder can wait for the names before it folds."""

    def __init__(self, status: Callable[[str], None] = lambda m: None, root: Path | None = None) -> None:
        self.status, self.root = status, root or cache_root()
        self.ready = threading.Event()
        self.ready.set()
        self.found: list[ObjectSymbols] = []
        self._queue: list[str] = []
        self._seen: set[str] = set()
        self._views: dict[str, ObjectView] = {}  # object -> as its process sees it (collectors.mapfiles)
        self._lock = threading.Lock()
        self._client: Debuginfod | None = Debuginfod.from_env(self.root)  # one time budget for the run

    def add(self, paths: list[str], views: Sequence[ObjectView] = ()) -> None:
        """Objects to name; ones already seen are skipped. `views`: objects as their process sees them
        (collectors.mapfiles): read there when the host's path is not the target's file, their note kept."""
        with self._lock:
            for v in views:
                self._views.setdefault(v.name, v)
            new = [p for p in dict.fromkeys(paths) if p not in self._seen]
            if not new:
                return
            self._seen.update(new)
            self._queue += new
            if not self.ready.is_set():
                return  # the running worker takes them
            self.ready.clear()
        threading.Thread(target=self._work, name="qprof-symbols", daemon=True).start()

    def _work(self) -> None:
        while True:
            with self._lock:
                batch, self._queue = self._queue, []
                if not batch:
                    self.ready.set()
                    return
            for path in batch:
                try:
                    view = self._views.get(path)
                    own = None if view is None or view.host == SAME else view.kept or view.read_from
                    got = symbols_for(path, self.root, self._client, own)
                    if view is not None and view.note:
                        got = dataclasses.replace(got, note=_join(view.note, got.note))
                except Exception as e:  # noqa: BLE001  (names are a bonus: folding goes on without them)
                    got = ObjectSymbols(path, None, NONE, note=f"not looked for ({type(e).__name__}: {e})")
                if got.how == DEBUGINFOD and got.note != "cached":
                    self.status(f"symbols for {Path(path).name}: {got.note}")
                self.found.append(got)
