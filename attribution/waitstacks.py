"""The wait stacks' user frames named at report time, and where a wait blocked in a few words.

The waits loader (probes/waits/loader.py) writes a wait's user frames as
`[object+0xOFFSET]`: the mapped file's name and the address's offset in that
file, since the probes layer may not read ELF files. Here each is named as the
on-CPU report names a frame: the function's name from the object's fullest
symbol table, or the names collectors.debuginfo gave a stripped object's
functions (a Go binary's from its `.gopclntab`, others' `object+0xSTART` from
their unwind table: the debug file it made, recorded as the object's `symbols`
source in meta.json). The object is found among the
files the run recorded (meta.json: the targets' mapped objects and images,
`symbols`) by its name, its build-id checked against the recorded one; the file
offset becomes an address through the object's loadable segments. A frame
keeps its raw form when it cannot be named for certain: an object no longer
there or rebuilt since the run, or one with only its exported functions
(`.dynsym`: an address past an exported function may be in an internal one).
An offset outside the object's code is `[unknown]`, as perf names it: not a return
address but what a frame-pointer walk read through code built without them.
Return addresses are looked up one byte back (the call, not what follows it).

`where(path)` is the terminal's short form of a wait's call path: the system
call it blocked in (the kernel's entry, `__x64_sys_epoll_wait_[k]` -> `epoll_wait`)
and the innermost user frame that is not merely that call's C library wrapper.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

from qprof.archive.model import DEBUG_FILE, DEBUGINFOD, DEBUGLINK, GOPCLNTAB, UNWIND, Meta, ObjectSymbols
from qprof.attribution.symbols import UNKNOWN
from qprof.probes.elf import SYMTAB, UNREADABLE, ElfObject, function_starts

if TYPE_CHECKING:
    from qprof.archive import Run

KERNEL = "_[k]"
NO_STACK = "[no stack]"
# sources holding every function of an object (the others: exported ones only, or nothing readable here)
_FULL = (DEBUG_FILE, DEBUGLINK, DEBUGINFOD, GOPCLNTAB, UNWIND)
_RAW = re.compile(r"\[(?P<obj>.+)\+0x(?P<off>[0-9a-f]+)\]")
# a system call's entry in the kernel, per architecture (compat: 32-bit calls on a 64-bit kernel)
_SYSCALL = re.compile(r"(?:__(?:x64|x32|ia32|arm64|riscv|s390x|powerpc|loongarch)_)?(?:compat_)?sys_(\w+)")
# what calls a system call's implementation, when its entry (above) was inlined: the next frame is the call
_DISPATCH = frozenset(("do_syscall_64", "x64_sys_call", "x32_sys_call", "ia32_sys_call", "do_int80_syscall_32",
                       "__do_fast_syscall_32", "invoke_syscall", "el0_svc_common", "do_el0_svc"))
_IMPL = re.compile(r"(?:__do_sys_|__se_sys_|ksys_|kernel_|do_sys_)(\w+)")
_SCHEDULER = re.compile(r".*schedule.*|_*cond_resched|finish_task_switch.*|context_switch")
_WRAPPER_PREFIX = re.compile(r"^_*(?:GI_+)?(?:libc_)?")
LONGEST = 48  # characters of a user frame's name in `where`
_Candidate = tuple[str, ObjectSymbols | None, str | None]  # a file that may be a frame's object: path, symbols, build-id


@dataclass(frozen=True)
class _Table:
    """One object's executable segments (file offset, size, address) and its functions by start address."""

    segments: tuple[tuple[int, int, int], ...]
    starts: tuple[int, ...]
    names: tuple[str, ...]

    def name(self, offset: int) -> str | None:
        """The function at a file offset; UNKNOWN outside the code (a frame-pointer walk through code built
        without them reads data as return addresses); None before the first function."""
        for p_offset, size, vaddr in self.segments:
            if p_offset <= offset < p_offset + size:
                i = bisect_right(self.starts, offset - p_offset + vaddr) - 1
                return self.names[i] if i >= 0 else None
        return UNKNOWN


def _alias(names: list[str]) -> str:
    """One name for the aliases of an address (glibc: `__libc_recvfrom`, `__recvfrom`, `recvfrom`): without
    a symbol version, the fewest leading underscores, then the longest (as perf breaks its last ties)."""
    bare = {n.split("@", 1)[0] or n for n in names}
    return min(bare, key=lambda n: (n.startswith("__GI_"), len(n) - len(n.lstrip("_")), -len(n), n))


@lru_cache(maxsize=256)
def _table(path: str, how: str | None, source: str | None, build_id: str | None) -> _Table | None:
    """`path`'s naming table, or None when its functions cannot all be named for certain (see the module)."""
    try:
        with ElfObject.open(path) as obj:
            if build_id is not None and obj.build_id() != build_id:
                return None  # not the file the run mapped
            segments = tuple((s.offset, s.filesz, s.vaddr) for s in obj.segments() if s.executable)
            own = obj.symbols(SYMTAB) > 1
    except UNREADABLE:
        return None
    starts = function_starts(source) if source and how in _FULL else {}
    if not starts and own:
        starts = function_starts(path)
    if not starts or not segments:
        return None
    by_start: dict[int, list[str]] = {}
    for name, start in starts.items():
        by_start.setdefault(start, []).append(name)
    ordered = sorted(by_start)
    return _Table(segments, tuple(ordered), tuple(_alias(by_start[a]) for a in ordered))


class Namer:
    """Names `[object+0xOFFSET]` frames with the objects one run recorded. With `pid`, an object name its
    target recorded is looked up among that target's files only (another process may map another build)."""

    def __init__(self, meta: Meta, pid: int | None = None) -> None:
        symbols = {s.path: s for s in meta.symbols}
        own: dict[str, str | None] = {}  # path -> build-id
        others: dict[str, str | None] = {}
        for t in meta.targets:
            into = own if t.pid == pid else others
            for o in t.objects:
                into.setdefault(o.path, o.build_id)
            for p in [t.exe, *(i.exe for i in t.images)]:
                if p:
                    into.setdefault(p, None)
        for s in meta.symbols:
            others.setdefault(s.path, s.build_id)
        self._own, self._others = self._by_name(own, symbols), self._by_name(others, symbols)
        self._frames: dict[str, str] = {}

    @staticmethod
    def _by_name(paths: dict[str, str | None], symbols: dict[str, ObjectSymbols]) -> dict[str, list[_Candidate]]:
        out: dict[str, list[_Candidate]] = {}
        for path, build_id in paths.items():
            sym = symbols.get(path)
            base = path.rsplit("/", 1)[-1].replace(";", ":")  # as the loader writes it
            out.setdefault(base, []).append((path, sym, build_id or (sym.build_id if sym else None)))
        return out

    def frame(self, frame: str) -> str:
        """A user frame's name; the frame as written when it cannot be named (kernel frames unchanged)."""
        got = self._frames.get(frame)
        if got is None:
            got = self._frames[frame] = self._name(frame)
        return got

    def _name(self, frame: str) -> str:
        m = _RAW.fullmatch(frame)
        if m is None:
            return frame
        offset = max(int(m.group("off"), 16) - 1, 0)  # a return address: the call is the byte before
        obj = m.group("obj")
        for path, sym, build_id in self._own.get(obj) or self._others.get(obj, []):
            table = _table(path, sym.how if sym else None, sym.source if sym else None, build_id)
            if table is not None:
                return table.name(offset) or frame
        return frame

    def path(self, path: str) -> str:
        """A folded path with its user frames named."""
        return ";".join(f if f.endswith(KERNEL) else self.frame(f) for f in path.split(";"))


def named(stacks: dict[str, dict[str, float]], run: "Run", pid: int | None = None) -> dict[str, dict[str, float]]:
    """WallClock.stacks (kind -> folded path -> seconds) with the user frames named; paths that become
    equal are merged. `pid`: the process the stacks are of (its own objects win a name both could own)."""
    namer = Namer(run.meta, pid)
    out: dict[str, dict[str, float]] = {}
    for kind, paths in stacks.items():
        merged = out.setdefault(kind, {})
        for path, seconds in paths.items():
            p = namer.path(path)
            merged[p] = merged.get(p, 0.0) + seconds
    return out


def syscall_of(kernel: list[str]) -> str | None:
    """The system call a kernel call path (root first, `_[k]` removed) entered by, None when none: its entry
    (`__x64_sys_NAME`), else the frame the syscall dispatcher called (`kernel_wait4` -> wait4)."""
    for name in kernel:
        m = _SYSCALL.fullmatch(name)
        if m is not None:
            return m.group(1)
    last = max((i for i, k in enumerate(kernel) if k in _DISPATCH), default=None)
    if last is None or last + 1 >= len(kernel) or _SCHEDULER.fullmatch(kernel[last + 1]):
        return None
    m = _IMPL.fullmatch(kernel[last + 1])
    return m.group(1) if m is not None else kernel[last + 1]


def _wraps(frame: str, call: str) -> bool:
    """Is a user frame only the C library's wrapper of `call` (`__libc_recvfrom` for recvfrom, `pread` for
    pread64, `__futex_abstimed_wait_common` for futex, `nanosleep` for clock_nanosleep)?"""
    core = _WRAPPER_PREFIX.sub("", frame.split("@", 1)[0])
    base, bare = call.rstrip("0123456789"), core.rstrip("0123456789")
    return core == call or bare == base or (len(core) >= 4 and (
        core.startswith(call + "_") or core.startswith(base + "_") or call.endswith(core)))


def _short(name: str) -> str:
    return name if len(name) <= LONGEST else name[:LONGEST - 3] + "..."


def where(path: str) -> str:
    """Where a wait blocked, for the terminal: `epoll_wait <- main` (the system call, then the innermost user
    frame that is not its wrapper), the call or the frame alone when the other is missing; without a system
    call, the innermost kernel frame that is not the scheduler's (`page fault` for a fault)."""
    frames = [f for f in path.split(";") if f]
    kernel = [f.removesuffix(KERNEL) for f in frames if f.endswith(KERNEL)]
    user = [f for f in frames if not f.endswith(KERNEL) and f != UNKNOWN]
    call = syscall_of(kernel)
    if call is None and any("page_fault" in k for k in kernel):
        call = "page fault"
    elif call is None:
        call = next((k for k in reversed(kernel) if not _SCHEDULER.fullmatch(k)), None)
    frame = next((f for f in reversed(user) if call is None or not _wraps(f, call)), None)
    if call is not None and frame is not None:
        return f"{call} <- {_short(frame)}"
    return call or (_short(frame) if frame is not None else NO_STACK)
