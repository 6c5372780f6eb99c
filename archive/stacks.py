"""Folded stacks: samples aggregated per (process, thread, stack), stored as gzipped JSON lines.

Folding at collection time keeps the archive small and reports fast, and lets a
report run on a machine without the targets' binaries: symbols are resolved once,
on the host that ran them. Period sums are kept beside counts because
attribution weighs by period (CPU nanoseconds for cpu-clock), not by count.
Sample times survive at a coarse grain: each record keeps its period per time
bin (BIN_S, 100 ms), which is what a timeline of CPU by category
needs; a distinct stack costs one entry per bin it ran in, not per sample.
Each record also keeps the times of its first and last sample (ns, `t`): where a
process's work starts and ends to the sample, what a transfer's span is taken
from (attribution.transfer).

The file may start with one header line, {"qprof_stacks": {...}}, saying which
perf data chunks it already holds (collectors.chunks folds a long run chunk by
chunk and rewrites this file after each): data and bookkeeping are replaced in
one atomic rename, so a run killed at any moment never counts a chunk twice.
"""

from __future__ import annotations

import gzip
import json
import zlib
from itertools import chain
from operator import itemgetter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

from qprof.archive import schema
from qprof.archive.model import NEVER_NULL, Scalar
from qprof.errors import QprofError
from qprof.jsonvalue import Json
from qprof.readlimits import lines, open_gzip_text

# Sample times are kept at this grain for the timeline (attribution.timeline): bin = floor(time / BIN_S),
# time in seconds of SAMPLE_CLOCK, the clock perf records with (collectors.perf, `-k`) and the clock of
# qprof's /proc and socket readings (meta.json sampling.clock).
BIN_S = 0.1
SAMPLE_CLOCK = "monotonic"

KERNEL_DSO = "[kernel.kallsyms]"
UNKNOWN = "[unknown]"

Frame = tuple[str, str]  # (symbol, dso); leaf first in a stack


@dataclass(frozen=True)
class Sample:
    """One perf sample: who ran, how much CPU it stands for, and its stack (leaf first)."""

    pid: int
    tid: int
    comm: str
    period: int
    frames: tuple[Frame, ...]
    bin: int | None = None  # time bin (BIN_S) of the sample; None when perf printed no time
    time_ns: int | None = None  # its time (SAMPLE_CLOCK, ns); None when perf printed no time


@dataclass(frozen=True)
class StackRecord:
    """All samples of one thread that share one stack (frames leaf first)."""

    pid: int
    tid: int
    comm: str
    samples: int
    period: int
    frames: tuple[Frame, ...]
    bins: tuple[tuple[int, int], ...] = ()  # (time bin, period) in time order; () when no times were kept
    span_ns: tuple[int, int] | None = None  # times of its first and last sample (ns); None when not kept


StackKey = tuple[int, int, str, tuple[Frame, ...]]  # pid, tid, comm, frames
Slot = list[Any]  # [samples, period, {time bin: period}, [first ns, last ns] or None]
Span = tuple[int, int] | None


def widen(span: Any, other: Span) -> Any:
    """The span covering both (either may be None): [first, last] as a list, or None."""
    if other is None:
        return span
    if span is None:
        return [other[0], other[1]]
    return [min(span[0], other[0]), max(span[1], other[1])]


def add_counts(acc: dict[Any, Slot], key: Any, samples: int, period: int,
               bins: Iterable[tuple[int, int]] = (), span: Span = None) -> None:
    """Add to a key's [samples, period, bins, span]: every fold (whole run, slices, chunks) sums this way."""
    slot = acc.get(key)
    if slot is None:
        slot = acc[key] = [samples, period, {}, None]
    else:
        slot[0] += samples
        slot[1] += period
    if bins:
        per_bin = slot[2]
        for b, p in bins:
            per_bin[b] = per_bin.get(b, 0) + p
    if span is not None:
        slot[3] = widen(slot[3], span)


def records(acc: dict[StackKey, Slot]) -> list[StackRecord]:
    """The records of an accumulator keyed by StackKey, in first-occurrence order."""
    return [StackRecord(k[0], k[1], k[2], v[0], v[1], k[3], tuple(sorted(v[2].items())),
                        None if v[3] is None else (v[3][0], v[3][1])) for k, v in acc.items()]


def fold(samples: Iterable[Sample]) -> list[StackRecord]:
    """Aggregate samples; memory grows with distinct stacks (and the time bins each ran in), not with samples."""
    acc: dict[StackKey, Slot] = {}
    for s in samples:
        add_counts(acc, (s.pid, s.tid, s.comm, s.frames), 1, s.period, () if s.bin is None else ((s.bin, s.period),),
                   None if s.time_ns is None else (s.time_ns, s.time_ns))
    return records(acc)


HEADER_KEY = "qprof_stacks"
STACKS_GZIP_LEVEL = 1


@dataclass(frozen=True)
class StacksHeader:
    """The first line of a stacks file folded chunk by chunk (collectors.chunks), under HEADER_KEY: the
    chunks it holds (a chunk is never counted twice), the ones lost, what folding met, the bins' grain.
    Fields in the order the line has always been written."""

    folded: list[str] = field(default_factory=list)
    dropped: list[dict[str, Scalar]] = field(default_factory=list)  # chunk, bytes, reason
    unreadable: list[dict[str, Scalar]] = field(default_factory=list)  # chunk, reason
    samples: int = 0
    bad_lines: int = 0
    bad_examples: list[str] = field(default_factory=list)
    script_cpu_s: float | None = field(default=None, metadata=NEVER_NULL)  # older headers: not counted
    bin_grain: int = 1  # time bins per kept bin: 1 is BIN_S


def frames_text(frames: tuple[Frame, ...]) -> str:
    """A stack's frames as its line holds them ([[symbol, object], ...] leaf first)."""
    return json.dumps(frames, separators=(",", ":"))


def bin_pairs_text(bins: Iterable[tuple[int, int]]) -> str:
    """(bin, period) pairs as a line holds them inside its `bins` list, without the brackets: "[b,p],[b,p]"."""
    return ",".join(f"[{b},{p}]" for b, p in bins)


def stack_line(pid: int, tid: int, comm: str, samples: int, period: int, frames: str, bins: str,
               span: Span) -> str:
    """One record's line, newline included: the one place the line is laid out, from its frames and bins
    already as text (frames_text, bin_pairs_text), so that a writer that keeps them (collectors.chunks)
    need not encode them again. parse_record reads it back."""
    line = (f'{{"pid":{pid},"tid":{tid},"comm":{json.dumps(comm)},"samples":{samples},"period":{period},'
            f'"frames":{frames}')
    if bins:
        line += f',"bins":[{bins}]'
    if span is not None:
        line += f',"t":[{span[0]},{span[1]}]'
    return line + "}\n"


def write_stacks(path: Path, records: Iterable[StackRecord], header: StacksHeader | None = None) -> int:
    """Write records to `path` (gzip JSON lines) atomically; return how many were written.

    On any failure (a full disk) the temporary file is removed and `path` is left as it was."""
    return write_stack_lines(path, (stack_line(r.pid, r.tid, r.comm, r.samples, r.period, frames_text(r.frames),
                                               bin_pairs_text(r.bins), r.span_ns) for r in records), header)


def write_stack_lines(path: Path, lines: Iterable[str], header: StacksHeader | None = None) -> int:
    """write_stacks for records already laid out by stack_line."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        return _write(tmp, path, lines, header)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _write(tmp: Path, path: Path, lines: Iterable[str], header: StacksHeader | None) -> int:
    n = 0
    # level 1: a long attach writes the whole table again after every chunk it folds; against level 6 it
    # compresses ~2.6x faster (0.03 s for a 10-minute capture's 9.7 MB) for a file 1.25x larger
    with gzip.open(tmp, "wt", encoding="utf-8", compresslevel=STACKS_GZIP_LEVEL) as f:
        if header is not None:
            f.write(json.dumps({HEADER_KEY: schema.encode(header)}, separators=(",", ":")) + "\n")
        batch: list[str] = []
        for line in lines:  # joined a few hundred at a time: one write per line was a third of the cost
            batch.append(line)
            if len(batch) == 512:
                f.write("".join(batch))
                n += len(batch)
                batch.clear()
        f.write("".join(batch))
        n += len(batch)
    tmp.replace(path)
    return n


class DamagedStacks(QprofError):
    """The stacks file does not read back: the reader that knows the run says what can re-create it."""


def _read_header(path: Path) -> dict[str, Json] | None:
    """The header of a stacks file as written, or None (no file, no header: a run folded in one go);
    `stacks_header` reads it typed."""
    try:
        with open_gzip_text(path) as f:
            obj: Json = json.loads(next(lines(f, path), "null"))
    except FileNotFoundError:
        return None
    except (OSError, EOFError, zlib.error, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DamagedStacks(f"{path}: damaged stacks file ({e})") from None
    if isinstance(obj, dict) and HEADER_KEY in obj:
        header = obj[HEADER_KEY]
        if not isinstance(header, dict):
            raise DamagedStacks(f"{path}:1: damaged stacks header")
        return header
    return None


_HEADER = schema.shape_of(StacksHeader)


def stacks_header(path: Path) -> StacksHeader | None:
    """The header of a stacks file, typed, or None (no file, no header: a run folded in one go); a
    header of another shape is a damaged file."""
    header = _read_header(path)
    if header is None:
        return None
    if not schema.conforms(header, _HEADER):
        raise DamagedStacks(f"{path}:1: damaged stacks header")
    typed: StacksHeader = schema.decode(StacksHeader, header)
    return typed


NO_RAW = ("its raw perf data was removed once folded (`attach --keep-raw` keeps it), so it cannot be folded "
          "again: record the run again")


def foldable_again(path: Path, raw: set[str]) -> bool:
    """Whether folding the raw chunks `raw` from scratch re-creates the stacks file whole: every chunk its
    header lists as folded is still here (a damaged header lists none: any raw data, then)."""
    try:
        head = stacks_header(path)
    except DamagedStacks:
        head = None
    return bool(raw) and all(n in raw for n in (head.folded if head is not None else ()))


def read_stacks(path: Path) -> Iterator[StackRecord]:
    """Stream records back; a damaged file gives a one-line error naming the line."""
    try:
        with open_gzip_text(path) as f:
            for lineno, line in enumerate(lines(f, path), 1):
                if not line.strip():
                    continue
                obj = json.loads(line)
                if lineno == 1 and isinstance(obj, dict) and HEADER_KEY in obj:
                    continue
                yield parse_record(obj, path, lineno)
    except (OSError, EOFError, zlib.error, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DamagedStacks(f"{path}: damaged stacks file ({e})") from None


def _bins(raw: Any) -> tuple[tuple[int, int], ...]:
    """A record's (bin, period) pairs. A long run's records hold millions: pairs of plain integers, as
    written, are checked and converted by C-level maps (a Python loop per pair was half of reading a
    10-minute run's stacks); anything else goes the general way, which converts or refuses."""
    if (type(raw) is list and set(map(type, raw)) <= {list} and set(map(len, raw)) <= {2}
            and set(map(type, chain.from_iterable(raw))) <= {int}):
        return tuple(map(tuple, raw))
    return tuple((int(b[0]), int(b[1])) for b in raw)


def parse_record(obj: object, path: Path, lineno: int) -> StackRecord:
    """A record line, parsed JSON: of a stacks file, or of the native folder's output (its format)."""
    try:
        assert isinstance(obj, dict)
        frames = tuple((str(f[0]), str(f[1])) for f in obj["frames"])
        bins = _bins(obj.get("bins", ()))
        t = obj.get("t")
        span = None if t is None else (int(t[0]), int(t[1]))
        rec = StackRecord(int(obj["pid"]), int(obj["tid"]), str(obj["comm"]),
                          int(obj["samples"]), int(obj["period"]), frames, bins, span)
    except (AssertionError, KeyError, TypeError, ValueError, IndexError, OverflowError):
        raise DamagedStacks(f"{path}:{lineno}: not a stack record") from None
    if rec.samples < 0 or rec.period < 0 or min(map(itemgetter(1), rec.bins), default=0) < 0:
        raise DamagedStacks(f"{path}:{lineno}: negative sample count or period")
    if rec.span_ns is not None and rec.span_ns[0] > rec.span_ns[1]:
        raise DamagedStacks(f"{path}:{lineno}: a record's first sample comes after its last")
    return rec
