"""The kernel's symbols: one snapshot of /proc/kallsyms per attach, and address-to-name lookups in it.

/proc/kallsyms is formatted by the kernel at every read: ~122k lines, ~30 ms of system time here.
An attach used to pay that seven times or more: `perf record` reads it four times as it starts (the
kernel's start and end, its maps), the waits loader once, every folder process once. The collector
now reads it once into a file in the run directory (`snapshot`), and each reader is pointed at the
file: the waits loader and the folder by their options, `perf record` by a private mount namespace
in which the file is bound over /proc/kallsyms (collectors.perf). The file is removed at the end of
the attach: addresses are only valid on this boot (KASLR), and folding after it (`report --refold`)
reads the host's own. A copy is kept in qprof's cache under the symbols' `fingerprint`; the next
attach links it while the fingerprint holds, and reads nothing from /proc/kallsyms.

`KernelSymbols` names kernel addresses without parsing the whole table: the kernel's own text
symbols come first in address order, so a name is found by bisecting the file's bytes; the lines
after them (modules, BPF programs, trampolines: not sorted) are parsed, and they are few.
"""

from __future__ import annotations

import bisect
import hashlib
import os
import re
import shutil
from pathlib import Path

from qprof.cachefiles import CACHE_HOME, write_bytes
from qprof.probes import bpfsys

PROC_KALLSYMS = "/proc/kallsyms"
SNAPSHOT = ".kallsyms"  # in the run directory, while the attach runs
UNKNOWN_FRAME = "[unknown]"
_ZERO = b"0" * 16  # an address hidden by kptr_restrict
_TEXT_TYPES = (b"t", b"T", b"w", b"W")
_BACKTRACK = 256  # lines looked back for a text symbol (data symbols sit among them rarely)
CACHE = CACHE_HOME / "kallsyms"  # the last snapshot, under its fingerprint
_BOOT_ID = "/proc/sys/kernel/random/boot_id"
_MODULES = "/proc/modules"
_KPTR_RESTRICT = "/proc/sys/kernel/kptr_restrict"


def snapshot(directory: Path, cache: Path | None = CACHE) -> Path | None:
    """/proc/kallsyms copied once into `directory` (None when it cannot be read or written: readers
    then use /proc/kallsyms itself, as before). `cache`: where a copy is kept for the next attach while
    the kernel's symbols stay the same (fingerprint); None reads /proc/kallsyms in any case."""
    key = fingerprint() if cache is not None else None
    kept = cache / f"kallsyms-{key}" if cache is not None and key is not None else None
    path = directory / SNAPSHOT  # in the owner-only run directory
    if kept is not None and _from_cache(kept, path):
        return path
    try:
        with open(PROC_KALLSYMS, "rb") as f:
            data = f.read()
    except OSError:
        return None
    if not data or data[:16] == _ZERO:
        return None  # hidden addresses (kptr_restrict): a copy helps no reader
    try:
        path.write_bytes(data)
    except OSError:
        remove(path)  # a part written (a full disk) would misname frames
        return None
    if kept is not None and fingerprint() == key:  # nothing loaded while it was read
        _keep(kept, data)
    return path


def fingerprint() -> str | None:
    """What the kernel's symbols depend on besides its build, taken without reading them: the boot (KASLR
    places the kernel anew at each), the loaded modules and their addresses, the BPF programs loaded (each
    has a JIT image of its own, named bpf_prog_<tag>_<name>; an id is never given twice in a boot) and
    whether addresses are shown. None where any of it cannot be read (no BPF privilege): no cache then.
    ftrace and kprobe trampolines are not in it: a frame in one made after the copy reads [unknown]."""
    try:
        boot, kptr = Path(_BOOT_ID).read_bytes(), Path(_KPTR_RESTRICT).read_bytes()
        modules = Path(_MODULES).read_bytes() if os.path.exists(_MODULES) else b""  # a kernel without modules
        ids = bpfsys.program_ids()
    except OSError:
        return None
    return hashlib.sha256(b"\0".join([boot, modules, kptr, ",".join(map(str, ids)).encode()])).hexdigest()[:24]


def _from_cache(cached: Path, path: Path) -> bool:
    """The run's snapshot made from the cached copy: a hard link where the two share a file system, else a
    copy (the kernel's, no read into qprof)."""
    try:
        os.link(cached, path)
        return True
    except FileNotFoundError:
        return False
    except OSError:
        pass
    try:
        shutil.copyfile(cached, path)
        return True
    except OSError:
        remove(path)
        return False


def _keep(kept: Path, data: bytes) -> None:
    """The copy kept under its fingerprint (qprof.cachefiles: written whole and renamed); the older copies
    go (one boot's kernel, one set of modules and programs at a time is what a host runs)."""
    if not write_bytes(kept, data):
        return
    for old in kept.parent.glob("kallsyms-*"):
        try:
            if old != kept:
                old.unlink(missing_ok=True)
        except OSError:
            pass  # a cache is only a shortcut


def remove(path: Path | None) -> None:
    if path is not None:
        try:
            path.unlink(missing_ok=True)
        except OSError:
            pass


class KernelSymbols:
    """Text symbols of a kallsyms file (a snapshot, or /proc/kallsyms), read at the first lookup.

    Names stay undecoded bytes until looked up; the sorted part is never split into lines: the
    table was parsed whole before (a regex over 5 MB and a sort), 70 ms of the waits loader's start."""

    _TEXT = re.compile(rb"^([0-9a-f]{16}) [tTwW] (\S+)", re.M)

    def __init__(self, path: str | Path = PROC_KALLSYMS) -> None:
        self.path = path
        self._data = b""
        self._core_end = 0  # the kernel's own symbols, in address order, end here
        self._tail_starts: list[bytes] = []  # the rest (modules, BPF...), parsed and sorted
        self._tail_names: list[bytes] = []
        self._read = False

    def _load(self) -> None:
        self._read = True
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except OSError:
            return
        module = data.find(b"\t[")
        core_end = len(data) if module < 0 else data.rfind(b"\n", 0, module) + 1
        if data[:16] == _ZERO:
            return  # addresses hidden (kptr_restrict): nothing can be named
        self._data, self._core_end = data, core_end
        tail = sorted(m for m in self._TEXT.findall(data, core_end) if m[0] != _ZERO)
        self._tail_starts = [a for a, _ in tail]
        self._tail_names = [n for _, n in tail]

    def _core(self, key: bytes) -> tuple[bytes, bytes] | None:
        """The last text symbol of the sorted part starting at or before `key` (its address, name)."""
        data = self._data
        lo, hi = 0, self._core_end
        while lo < hi:  # bisect over lines: lo ends as the start of the first line above key
            mid = (lo + hi) // 2
            start = data.rfind(b"\n", 0, mid) + 1
            if data[start:start + 16] <= key:
                nl = data.find(b"\n", start)
                lo = self._core_end if nl < 0 else nl + 1
            else:
                hi = start
        line, found, names = lo, None, []
        for _ in range(_BACKTRACK):
            if line <= 0:
                break
            start = data.rfind(b"\n", 0, line - 1) + 1
            addr = data[start:start + 16]
            if found is not None and addr != found:
                break  # names at one address are adjacent: all seen
            if data[start + 17:start + 18] in _TEXT_TYPES:
                end = data.find(b"\n", start)
                names.append(data[start + 19:len(data) if end < 0 else end].split(b"\t", 1)[0])
                found = addr
            line = start
        # aliases at one address: the greatest name, as a sorted table's last entry would give
        return (found, max(names)) if found is not None else None

    def name(self, addr: int) -> str:
        if not self._read:
            self._load()
        key = b"%016x" % addr
        best = self._core(key) if self._data else None
        i = bisect.bisect_right(self._tail_starts, key) - 1
        if i >= 0 and (best is None or self._tail_starts[i] > best[0]):
            best = self._tail_starts[i], self._tail_names[i]
        return best[1].decode("ascii", "replace") if best is not None else UNKNOWN_FRAME
