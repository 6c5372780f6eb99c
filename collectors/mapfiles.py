"""The targets' mapped files as the targets see them, even when the files are gone.

A binary deleted or replaced after its process started (a package upgraded under a running server, a
deploy swapping the file) and a file that exists only in the target's mount namespace (a container)
cannot be read at the path /proc/PID/maps names: the host has nothing there, or another file. perf
reads objects by that path once the target has exited, so their frames were `[unknown]`, or worse,
named from the host's different file. While the target lives, the kernel keeps each mapped file
readable through /proc/PID/map_files/START-END (root; deleted files and other namespaces alike),
and its files through /proc/PID/root/PATH.

So, at attach and for each object when first seen (`MappedFiles.see`), every executable mapping is
read through the target's own view and checked by build-id against the host's file at the same path.
Where the host's file is not the same one, a copy of the target's file goes into qprof's build-id
cache (`ROOT/.build-id/ab/cdef.../elf`, perf's layout; collectors.debuginfo keeps its debug files
beside it), and the run directory records each such mapping's build-id (runfiles.MAPPED_FILES).
perf itself only knows an object by the build-id its records carry: the records perf synthesizes
for processes already running carry none, so before `perf script` reads a perf data file, the
mappings of these objects are stamped with their build-id in place (`stamp_mmap2`, called from
collectors.perfdata's pass). perf then reads the cached copy and refuses the host's file at the
same path (its build-id differs).
"""

from __future__ import annotations

import json
import mmap
import os
import shutil
import struct
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Mapping

from qprof import runfiles
from qprof.collectors import procfs
from qprof.collectors.procfs import MappedFile
from qprof.probes import elf

# where the host's file at the mapped path stands against the file the target maps
SAME = "same"  # the same build-id (or, without build-ids, the same inode): perf reads it at its path
ABSENT = "absent"  # nothing there on the host: deleted, or only in the target's mount namespace
DIFFERENT = "different"  # another file: never used
UNREAD = "unread"  # the target's own file could not be read (it exited; map_files needs root)

PERF_RECORD_MMAP2 = 10
MISC_MMAP_BUILD_ID = 1 << 14  # PERF_RECORD_MISC_MMAP_BUILD_ID: the record carries a build-id, not an inode
_MMAP2_ID = 40  # offset of the maj/min/ino/ino_generation union (24 bytes) in a MMAP2 record
_MMAP2_NAME = 72  # offset of the file name
_BUILD_ID_MAX = 20


@dataclass(frozen=True)
class ObjectView:
    """One file a target maps, read through the target's own view."""

    pid: int
    name: str  # as /proc/PID/maps and perf name it (" (deleted)" kept)
    build_id: str | None
    host: str  # SAME, ABSENT, DIFFERENT or UNREAD
    read_from: str | None  # where its contents were read (map_files, the target's root, or the host path)
    kept: str | None = None  # the copy in qprof's build-id cache perf reads instead of the path
    note: str = ""  # one line: what is wrong, when something is

    @property
    def path(self) -> str:
        return self.name.removesuffix(procfs.DELETED)


def _same_inode(a: str, b: str) -> bool:
    try:
        sa, sb = os.stat(a), os.stat(b)
    except OSError:
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def view_of(pid: int, m: MappedFile) -> ObjectView:
    """Read `m` as process `pid` maps it and judge the host's file at its path; never raises."""
    candidates = [m.map_files(pid)] + ([] if m.deleted else [f"/proc/{pid}/root{m.path}"])
    read_from: str | None = None
    build_id: str | None = None
    why: str | None = "not read"
    for cand in candidates:
        build_id, why = elf.build_id(cand)
        if why is None:
            read_from = cand
            break
    if read_from is None:
        return ObjectView(pid, m.name, None, UNREAD, None,
                          note=f"{m.name}: not readable through the process ({why}): perf reads it by path")
    if m.deleted:
        return ObjectView(pid, m.name, build_id, ABSENT, read_from,
                          note="" if build_id else f"{m.name}: deleted and without a build-id: perf cannot be pointed at it")
    host_id, host_why = elf.build_id(m.path)
    if host_why is not None:
        return ObjectView(pid, m.name, build_id, ABSENT, read_from,
                          note="" if build_id else f"{m.name}: only the process sees it and it has no build-id")
    if build_id is not None and host_id == build_id:
        return ObjectView(pid, m.name, build_id, SAME, m.path)
    if build_id is None and host_id is None and _same_inode(read_from, m.path):
        return ObjectView(pid, m.name, None, SAME, m.path)
    return ObjectView(pid, m.name, build_id, DIFFERENT, read_from,
                      note=f"the host's {m.path} is another file (build-id {host_id or 'none'}, the process maps "
                           f"{build_id or 'one without a build-id'}): not used")


def cached_elf(root: Path, build_id: str) -> Path:
    """Where perf looks for a build-id's object itself in a build-id cache (`perf --buildid-dir root`)."""
    return root / ".build-id" / build_id[:2] / build_id[2:] / "elf"


def keep(view: ObjectView, root: Path) -> ObjectView:
    """`view` with a copy of its file in the build-id cache, when perf cannot read it at its path; the
    copy is checked by build-id (a file replaced under map_files between two reads is refused)."""
    if view.host == SAME or view.read_from is None or view.build_id is None:
        return view
    dest = cached_elf(root, view.build_id)
    if dest.is_file() and elf.build_id(str(dest))[0] == view.build_id:
        return ObjectView(**{**asdict(view), "kept": str(dest)})
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f".elf-{os.getpid()}")
        shutil.copyfile(view.read_from, tmp)
        got = elf.build_id(str(tmp))[0]
        if got != view.build_id:
            tmp.unlink(missing_ok=True)
            return ObjectView(**{**asdict(view), "note": f"{view.name}: changed while it was copied (build-id {got})"})
        tmp.replace(dest)
    except OSError as e:
        return ObjectView(**{**asdict(view), "note": f"{view.name}: not copied for perf ({e.strerror or e})"})
    return ObjectView(**{**asdict(view), "kept": str(dest)})


class MappedFiles:
    """The targets' mapped files as they see them, over one run: `see(pid)` at attach and whenever new
    objects may have been mapped; what perf needs is written to the run directory at once."""

    def __init__(self, out: Path, root: Path, status: Callable[[str], None] = lambda m: None) -> None:
        self.out, self.root, self.status = out, root, status
        self.views: dict[tuple[int, str], ObjectView] = {}

    def see(self, pid: int) -> list[ObjectView]:
        """The process's mappings not seen before, each read and judged (and kept for perf when needed)."""
        new = [keep(view_of(pid, m), self.root) for m in procfs.mapped_files(pid)
               if (pid, m.name) not in self.views]
        for v in new:
            self.views[(pid, v.name)] = v
            if v.note:
                self.status(v.note)
        if any(v.kept for v in new):
            self._write()
        return new

    def readable(self, pid: int, name: str) -> str | None:
        """Where to read the object `name` of `pid`: its own file, whichever view serves it."""
        v = self.views.get((pid, name))
        return v.kept or v.read_from if v is not None else None

    def of(self, pid: int, names: list[str]) -> list[ObjectView]:
        """The views of `names` mapped by `pid` (those seen)."""
        return [v for n in names if (v := self.views.get((pid, n))) is not None]

    def notes(self) -> list[str]:
        return [v.note for v in self.views.values() if v.note]

    def _write(self) -> None:
        path = self.out / runfiles.MAPPED_FILES
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps([asdict(v) for v in self.views.values() if v.kept], indent=1))
        tmp.replace(path)


def stamps(run: Path) -> dict[tuple[int, str], bytes]:
    """The build-ids to stamp into a run's perf data, by (pid, name as perf records it); {} when the
    run kept no file for perf or its record is unreadable."""
    try:
        doc = json.loads((run / runfiles.MAPPED_FILES).read_text())
    except (OSError, ValueError):
        return {}
    out: dict[tuple[int, str], bytes] = {}
    for v in doc if isinstance(doc, list) else []:
        try:
            bid = bytes.fromhex(v["build_id"])
            if 0 < len(bid) <= _BUILD_ID_MAX:
                out[(int(v["pid"]), str(v["name"]))] = bid
        except (KeyError, TypeError, ValueError):
            continue
    return out


def stamp_mmap2(buf: bytearray | memoryview | mmap.mmap, off: int, size: int,
                ids: Mapping[tuple[int, str], bytes]) -> bool:
    """Give one PERF_RECORD_MMAP2 record at `off` the build-id of its (pid, file name) in place, as the
    kernel does for `perf record --buildid-mmap`: the inode fields are the build-id's (same size), and
    the header says so. False when it has one already or is not one of `ids`."""
    if size < _MMAP2_NAME + 1 or off + size > len(buf):
        return False
    misc = struct.unpack_from("<H", buf, off + 4)[0]
    if misc & MISC_MMAP_BUILD_ID:
        return False
    pid = struct.unpack_from("<I", buf, off + 8)[0]
    name = bytes(buf[off + _MMAP2_NAME:off + size]).split(b"\0", 1)[0].decode("utf-8", "replace")
    bid = ids.get((pid, name))
    if bid is None:
        return False
    struct.pack_into("<BBH20s", buf, off + _MMAP2_ID, len(bid), 0, 0, bid.ljust(_BUILD_ID_MAX, b"\0"))
    struct.pack_into("<H", buf, off + 4, misc | MISC_MMAP_BUILD_ID)
    return True


@dataclass(frozen=True)
class JitMap:
    """A target's perf map file (JIT or Python -X perf symbols): where it was found, or why not."""

    pid: int
    source: str | None
    note: str = ""


def keep_jit_maps(out: Path, pids: list[int]) -> list[JitMap]:
    """Copy each target's perf map into the archive as perf-maps/perf-PID.map (PID as the host sees it),
    again whenever it has grown: call it while the targets live (a private /tmp goes with them).
    A JIT names the file with its pid in its own pid namespace (NSpid) and writes it in its own /tmp:
    both are read through /proc/PID/root; the host's /tmp/perf-PID.map serves when that cannot be read."""
    got: list[JitMap] = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status", encoding="utf-8", errors="replace") as f:
                nspid = procfs.ns_pid(f.read())
        except OSError:
            nspid = None
        cands = ([f"/proc/{pid}/root/tmp/perf-{nspid}.map"] if nspid is not None else []) + [f"/tmp/perf-{pid}.map"]
        src = next((c for c in cands if os.path.isfile(c)), None)
        if src is None:
            got.append(JitMap(pid, None, "" if nspid is not None else f"pid {pid}: gone before its perf map was looked for"))
            continue
        dest = out / runfiles.PERF_MAPS / f"perf-{pid}.map"
        try:
            if not dest.is_file() or dest.stat().st_size != os.stat(src).st_size:  # a JIT only appends
                dest.parent.mkdir(exist_ok=True)
                shutil.copyfile(src, dest)
            got.append(JitMap(pid, src))
        except OSError as e:
            got.append(JitMap(pid, None, f"pid {pid}: its perf map {src} not copied ({e.strerror or e})"))
    return got
