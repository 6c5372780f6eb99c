"""One pass over a perf.data file before `perf script`: an in-place repair, and where to cut it.

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

The cut times let folding run one `perf script --time` per slice in parallel
(collectors.folding). They are quantiles of the targets' sample times, so
each slice unwinds about as many samples (cutting at equal distances into the
data did not do: a short capture is mostly the records perf synthesizes for
every process at the start, and other processes' samples weigh nothing in
`perf script --pid`). The header's own
first/last sample times (HEADER_SAMPLE_TIME) are no help: perf record fills
them in a pass that the same KSYMBOL records cut short (a 600 s capture showed
a 3 s window).
"""

from __future__ import annotations

import mmap
import os
import struct
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping

from qprof.collectors import mapfiles
from qprof.collectors.mapfiles import PERF_RECORD_MMAP2
from qprof.errors import QprofError

PERF_RECORD_SAMPLE = 9
PERF_RECORD_KSYMBOL = 17
PERF_RECORD_FINISHED_INIT = 82  # a user-space record type perf script processes as a no-op
_MAGIC = b"PERFILE2"
_HEADER = struct.Struct("<8sQQ QQ QQ QQ")  # magic, size, attr_size, attrs, data, event_types
_REC = struct.Struct("<IHH")  # type, misc, size
_U64 = struct.Struct("<Q")
_PID_TID_TIME = struct.Struct("<IIQ")
_WINDOW = 64 << 20  # bytes of the file mapped at once while scanning records
# perf_event_attr.sample_type bits that come before `time` in a sample record, and TIME itself
SAMPLE_IP, SAMPLE_TID, SAMPLE_TIME, SAMPLE_IDENTIFIER = 1 << 0, 1 << 1, 1 << 2, 1 << 16
_SAMPLE_TYPE_OFFSET = 24  # in perf_event_attr: type u32, size u32, config u64, period u64, sample_type u64


@dataclass
class Prepared:
    """What the pass found: KSYMBOL records retyped, and sample times to cut the file at (ascending)."""

    ksymbols: int = 0
    cuts: list[int] = field(default_factory=list)
    samples: int = 0  # sample records of the given pids (all pids when none were given)
    stamped: int = 0  # mappings given their build-id


def _pid_offset(head: tuple[int, ...], raw: bytes) -> int | None:
    """Offset of (pid, tid, time) in a sample record when every event of the file has that same layout."""
    _magic, _size, attr_size, attrs_off, attrs_size, *_ = head
    if attr_size < _SAMPLE_TYPE_OFFSET + 8 or attrs_size < attr_size:
        return None
    types = {_U64.unpack_from(raw, attrs_off + i * attr_size + _SAMPLE_TYPE_OFFSET)[0]
             for i in range(attrs_size // attr_size) if attrs_off + (i + 1) * attr_size <= len(raw)}
    if len(types) != 1:
        return None
    (st,) = types
    if not (st & SAMPLE_TID and st & SAMPLE_TIME):
        return None
    return _REC.size + 8 * sum(1 for bit in (SAMPLE_IDENTIFIER, SAMPLE_IP) if st & bit)


class _Quantiles:
    """Times of every stride-th sample, thinned to at most `keep`: evenly spaced over the samples, in bounded memory."""

    def __init__(self, keep: int = 8192) -> None:
        self.keep, self.stride, self.times = keep, 1, array("Q")

    def add(self, n: int, t: int) -> None:
        if n % self.stride == 0:
            self.times.append(t)
            if len(self.times) >= self.keep:
                self.times = self.times[::2]
                self.stride *= 2

    def cuts(self, parts: int) -> list[int]:
        ts = sorted(self.times)
        out: list[int] = []
        for k in range(1, parts):
            t = ts[len(ts) * k // parts] if ts else None
            if t is not None and (not out or t > out[-1]):
                out.append(t)
        return out


def prepare(path: Path, parts: int = 1, pids: Iterable[int] | None = None,
            build_ids: Mapping[tuple[int, str], bytes] | None = None) -> Prepared:
    """Retype KSYMBOL records as no-op records, stamp the mappings of `build_ids` (by pid and file name)
    with their build-id (collectors.mapfiles: files perf cannot read at their path), and find parts-1
    cut times, in one pass over the records.

    The cuts are sample times at k/parts of the samples of `pids` (of all samples without pids),
    so that each slice unwinds about as many of the targets' samples as the next."""
    out = Prepared()
    wanted = frozenset(pids) if pids is not None else None
    with open(path, "r+b") as f:
        start = f.read(_HEADER.size)
        if len(start) < _HEADER.size:
            raise QprofError(f"{path}: truncated perf data header")
        head = _HEADER.unpack(start)
        magic, _size, _attr_size, attrs_off, attrs_size, data_off, data_size, _eo, _es = head
        if magic != _MAGIC:
            raise QprofError(f"{path}: not a perf.data file (or an old/byte-swapped format)")
        if data_size == 0:
            return out
        f.seek(0)
        at = _pid_offset(head, f.read(attrs_off + attrs_size)) if parts > 1 else None
        quantiles = _Quantiles()
        file_end = os.fstat(f.fileno()).st_size
        end = min(data_off + data_size, file_end)
        pos = data_off
        unpack, who = _REC.unpack_from, _PID_TID_TIME.unpack_from
        ksymbol, sample = PERF_RECORD_KSYMBOL, PERF_RECORD_SAMPLE
        # a window of the file at a time: a long capture is gigabytes, and mapping it whole
        # would make every page of it count in qprof's resident memory
        while pos + _REC.size <= end:
            base = pos - pos % mmap.ALLOCATIONGRANULARITY
            # base is the page of pos: records starting in the first _WINDOW + 1 pages are read here (at
            # least one), and one more page maps the fields of the last of them
            page = mmap.ALLOCATIONGRANULARITY
            with mmap.mmap(f.fileno(), min(_WINDOW + 2 * page, file_end - base), offset=base) as m:
                off, lim = pos - base, min(end - base, _WINDOW + page)
                while off + _REC.size <= lim:
                    rtype, _misc, rsize = unpack(m, off)
                    if rsize < _REC.size:  # damaged tail: leave it to perf to report
                        lim = off
                        end = base + off
                        break
                    if rtype == ksymbol:
                        struct.pack_into("<I", m, off, PERF_RECORD_FINISHED_INIT)
                        out.ksymbols += 1
                    elif rtype == PERF_RECORD_MMAP2 and build_ids and mapfiles.stamp_mmap2(m, off, rsize, build_ids):
                        out.stamped += 1
                    elif rtype == sample and at is not None and at + 16 <= rsize and off + at + 16 <= len(m):
                        pid, _tid, t = who(m, off + at)
                        if wanted is None or pid in wanted:
                            out.samples += 1
                            quantiles.add(out.samples, t)
                    off += rsize
                pos = base + off
                m.flush()
    out.cuts = quantiles.cuts(parts)
    return out


def neutralize_ksymbols(path: Path) -> int:
    """Retype KSYMBOL records as no-op records; return how many were rewritten."""
    return prepare(path).ksymbols
