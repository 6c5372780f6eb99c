"""The bpf(2) system call, for the few commands qprof issues itself rather than through libbpf: turning
the run-time statistics on (collectors.probing) and listing the loaded programs (probes.kallsyms), in
qprof's own process, where loading libbpf.so for one call would cost more than the call."""

from __future__ import annotations

import ctypes
import errno
import os

_NR_BPF = 321  # x86_64
PROG_GET_NEXT_ID = 11
ENABLE_STATS = 32
STATS_RUN_TIME = 0
_LIBC = ctypes.CDLL(None, use_errno=True)  # once: each CDLL() makes new ctypes classes (soak: +1 MiB/h)


def bpf(cmd: int, attr: ctypes.Array[ctypes.c_uint32]) -> int:
    """bpf(cmd, attr): its result (a descriptor, or 0); OSError with the kernel's errno when refused."""
    rc = int(_LIBC.syscall(_NR_BPF, cmd, ctypes.byref(attr), ctypes.sizeof(attr)))
    if rc < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return rc


def program_ids() -> list[int]:
    """Every loaded BPF program's id, in order (one system call each); OSError when refused (no privilege)."""
    attr = (ctypes.c_uint32 * 3)()  # start_id, next_id, open_flags
    ids: list[int] = []
    while True:
        attr[0] = ids[-1] if ids else 0
        try:
            bpf(PROG_GET_NEXT_ID, attr)
        except OSError as e:
            if e.errno == errno.ENOENT:  # past the last one
                return ids
            raise
        ids.append(attr[1])
