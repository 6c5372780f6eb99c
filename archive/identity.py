"""Which process wrote a run, and whether it still runs: the one live /proc question the archive asks.

A run's meta.json says "collecting" until its collector rewrites it at the end; a reader must tell a
collector still at work from one that was killed (the run is then incomplete), and a pid reused
after a reboot or by a later process from the collector itself. A process is told apart by its boot
and its start time (`ProcessIdentity`). The collectors record identities with the same functions
(collectors.procfs reads everything else of /proc), so the two sides compare like with like.
"""

from __future__ import annotations

import os

from qprof.archive.model import ProcessIdentity

PID_MAX_LIMIT = 4 * 1024 * 1024  # the kernel's ceiling for pid_max on 64-bit
READ_SIZE = 65536


def read_proc(path: str, one_record: bool = False) -> str | None:
    """A /proc (or /sys) file's text; None when it cannot be read (the process is gone, no such file).
    Read with bare read(2)s: the collector reads ~4 files per target thread 4 times a second, and a
    text-mode open() (its buffer and decoder objects) cost more than the kernel's formatting.

    `one_record`: the file is a single seq_file record (a task's stat, schedstat, status, syscall), which
    one read(2) returns whole: the second read, only to be told the end, was a third of the reads' cost.
    A file of many records (maps, kallsyms, /proc/stat) comes a page of records per read, so any other
    file is read to the end."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    parts = []
    try:
        while chunk := os.read(fd, READ_SIZE):
            parts.append(chunk)
            if one_record and len(chunk) < READ_SIZE:
                break
    except OSError:
        return None
    finally:
        os.close(fd)
    return b"".join(parts).decode("utf-8", "replace")


def stat_fields(stat: str) -> tuple[str, list[str]]:
    """Split /proc/*/stat into (comm, fields from state on); comm may hold ')' and spaces."""
    lpar, rpar = stat.find("("), stat.rfind(")")
    return stat[lpar + 1 : rpar], stat[rpar + 2 :].split()


def is_zombie(pid: int) -> bool:
    stat = read_proc(f"/proc/{pid}/stat")
    return stat is not None and stat_fields(stat)[1][0] == "Z"


def is_alive(pid: int) -> bool:
    """The process runs (a zombie has exited; a process we may not signal still runs)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not is_zombie(pid)


def boot_id() -> str:
    return (read_proc("/proc/sys/kernel/random/boot_id") or "").strip()


def process_identity(pid: int) -> ProcessIdentity:
    """What tells this process apart from a later one with the same pid: boot and start time."""
    stat = read_proc(f"/proc/{pid}/stat")
    start = int(stat_fields(stat)[1][19]) if stat else None
    return ProcessIdentity(pid, start, boot_id())


def identity_alive(ident: ProcessIdentity) -> bool:
    """Is the process `process_identity` described still running (same boot, same start)?"""
    pid = ident.pid
    if ident.boot_id != boot_id() or not 0 < pid <= PID_MAX_LIMIT or not is_alive(pid):
        return False
    return process_identity(pid).start_ticks == ident.start_ticks
