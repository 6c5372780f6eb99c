"""In-place repair of perf.data files that perf 6.1's own tools cannot read back.

perf record always tracks kernel symbol (un)registration (PERF_RECORD_KSYMBOL),
even with --no-bpf-event. When BPF programs load or unload during a capture
(qprof's own bpftrace does, and so may other tools), perf 6.1's `perf script`
sometimes stops with "failed to process type: 17 [Bad address]" and the whole
capture is lost. qprof does not need BPF program symbols: their records are
retyped in place as PERF_RECORD_FINISHED_INIT, a user-space record that perf
script handles as a no-op without parsing it (retyping them as a kernel record
such as THROTTLE failed the same way: perf parses those). Record sizes stay,
so nothing else in the file moves.
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path

from qprof.errors import QprofError

PERF_RECORD_FINISHED_INIT = 82  # a user-space record type perf script processes as a no-op
PERF_RECORD_KSYMBOL = 17
_MAGIC = b"PERFILE2"
_HEADER = struct.Struct("<8sQQ QQ QQ QQ")  # magic, size, attr_size, attrs, data, event_types
_REC = struct.Struct("<IHH")  # type, misc, size


def neutralize_ksymbols(path: Path) -> int:
    """Retype KSYMBOL records as no-op records; return how many were rewritten."""
    with open(path, "r+b") as f:
        head = f.read(_HEADER.size)
        if len(head) < _HEADER.size:
            raise QprofError(f"{path}: truncated perf data header")
        magic, _size, _attr_size, _ao, _asz, data_off, data_size, _eo, _es = _HEADER.unpack(head)
        if magic != _MAGIC:
            raise QprofError(f"{path}: not a perf.data file (or an old/byte-swapped format)")
        if data_size == 0:
            return 0
        with mmap.mmap(f.fileno(), 0) as m:
            end = min(data_off + data_size, len(m))
            pos, n = data_off, 0
            while pos + _REC.size <= end:
                rtype, _misc, rsize = _REC.unpack_from(m, pos)
                if rsize < _REC.size:
                    break  # damaged tail: leave it to perf to report
                if rtype == PERF_RECORD_KSYMBOL:
                    struct.pack_into("<I", m, pos, PERF_RECORD_FINISHED_INIT)
                    n += 1
                pos += rsize
            m.flush()
    return n
