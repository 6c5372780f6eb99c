"""Direct reads of perf.data files: the sample time window, and an in-place repair.

The time window of the samples (perf record's HEADER_SAMPLE_TIME feature) lets
folding cut a capture into time slices that `perf script --time` processes in
parallel (collectors.folding).

The repair is for files that perf 6.1's own tools cannot read back.

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
import os
import struct
from pathlib import Path

from qprof.errors import QprofError

PERF_RECORD_FINISHED_INIT = 82  # a user-space record type perf script processes as a no-op
PERF_RECORD_KSYMBOL = 17
_MAGIC = b"PERFILE2"
_HEADER = struct.Struct("<8sQQ QQ QQ QQ")  # magic, size, attr_size, attrs, data, event_types
_REC = struct.Struct("<IHH")  # type, misc, size
_FEATURES = struct.Struct("<32s")  # adds_features: a 256-bit map after the header above
_SECTION = struct.Struct("<QQ")  # offset, size
_WINDOW = 64 << 20  # bytes of the file mapped at once while scanning records
HEADER_SAMPLE_TIME = 21  # feature bit: u64 time of the first sample, u64 time of the last (ns)


def sample_time_range(path: Path) -> tuple[int, int] | None:
    """(first, last) sample timestamps in ns from the file's header; None when perf did not record them
    (an old perf, or a file perf could not finish)."""
    try:
        with open(path, "rb") as f:
            head = f.read(_HEADER.size + _FEATURES.size)
            if len(head) < _HEADER.size + _FEATURES.size:
                return None
            magic, _size, _attr_size, _ao, _asz, data_off, data_size, _eo, _es = _HEADER.unpack_from(head)
            bits = int.from_bytes(_FEATURES.unpack_from(head, _HEADER.size)[0], "little")
            if magic != _MAGIC or not (bits >> HEADER_SAMPLE_TIME) & 1:
                return None
            index = bin(bits & ((1 << HEADER_SAMPLE_TIME) - 1)).count("1")  # sections follow in bit order
            f.seek(data_off + data_size + index * _SECTION.size)
            sec = f.read(_SECTION.size)
            if len(sec) < _SECTION.size:
                return None
            offset, size = _SECTION.unpack(sec)
            if size < 16:
                return None
            f.seek(offset)
            raw = f.read(16)
    except OSError:
        return None
    if len(raw) < 16:
        return None
    first, last = struct.unpack("<QQ", raw)
    return (first, last) if 0 < first <= last else None


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
        file_end = os.fstat(f.fileno()).st_size
        end = min(data_off + data_size, file_end)
        pos, n = data_off, 0
        # a window of the file at a time: a long capture is gigabytes, and mapping it whole
        # would make every page of it count in qprof's resident memory
        while pos + _REC.size <= end:
            base = pos - pos % mmap.ALLOCATIONGRANULARITY
            with mmap.mmap(f.fileno(), min(_WINDOW, file_end - base), offset=base) as m:
                limit = min(end, base + len(m))
                while pos + _REC.size <= limit:
                    rtype, _misc, rsize = _REC.unpack_from(m, pos - base)
                    if rsize < _REC.size:  # damaged tail: leave it to perf to report
                        end = pos
                        break
                    if rtype == PERF_RECORD_KSYMBOL:
                        struct.pack_into("<I", m, pos - base, PERF_RECORD_FINISHED_INIT)
                        n += 1
                    pos += rsize
                m.flush()
    return n
