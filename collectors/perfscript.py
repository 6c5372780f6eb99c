"""Parse `perf script` text into samples, streaming, one sample at a time.

qprof runs `perf script` with a fixed field list (see PERF_SCRIPT_FIELDS) so the
format is known; the parser still tolerates what real captures contain:
`[unknown]` symbols and DSOs, deleted mappings (`(/path (deleted))`), symbol
names with spaces and parentheses (demangled C++), comm names with spaces,
kernel-only and user-only stacks, and samples without any frame. Lines it
cannot read are counted, never fatal: one odd frame must not lose a capture.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Iterable, Iterator

from qprof.archive.stacks import KERNEL_DSO, UNKNOWN, Frame, Sample

# Fields requested from `perf script -F`; the header regex below matches them.
PERF_SCRIPT_FIELDS = "comm,pid,tid,time,period,ip,sym,dso"
# x86-64 (and arm64) kernel text lives in the upper canonical half; the top
# 4 KiB are perf's callchain context markers (e.g. ffffffffffffffff ends a
# truncated DWARF user stack), not kernel addresses.
_KERNEL_SPACE_START = 0xFFFF800000000000
_PERF_CONTEXT_MARKERS = 0xFFFFFFFFFFFFF000

# "<comm> <pid>/<tid> [<time>:] <period>" with comm possibly containing spaces; an
# optional "<event>:" tail is accepted for captures made with more fields.
_HEADER = re.compile(
    r"^\s*(?P<comm>.*?)\s+(?P<pid>-?\d+)/(?P<tid>-?\d+)\s+(?:(?P<time>\d+\.\d+):\s+)?(?P<period>\d+)(?:\s+\S+:)?\s*$"
)
_SYMOFF = re.compile(r"\+0x[0-9a-fA-F]+$")
# ELF symbol versions perf sometimes prints (cfree@GLIBC_2.2.5, clock_gettime@@GLIBC_2.17):
# mapping rules match the plain name. `@plt` stubs are lower case and stay.
_SYMVER = re.compile(r"@@?[A-Z][A-Z0-9_]*_[0-9][0-9.]*$")

def time_bin(stamp: str) -> int | None:
    """perf's "SECONDS.FRACTION" (a trailing ":" allowed) -> its BIN_S bin (tenths of a second), without
    float rounding."""
    whole, dot, frac = stamp.rstrip(":").partition(".")
    if not (dot and whole.isdigit() and whole.isascii() and frac[:1].isdigit() and frac[:1].isascii()):
        return None
    return int(whole) * 10 + int(frac[0])


def time_ns(stamp: str) -> int | None:
    """perf's "SECONDS.FRACTION" (a trailing ":" allowed) -> nanoseconds, without float rounding."""
    whole, dot, frac = stamp.rstrip(":").partition(".")
    if not (dot and whole.isdigit() and whole.isascii() and frac.isdigit() and frac.isascii()):
        return None
    return int(whole) * 1_000_000_000 + int(frac[:9].ljust(9, "0"))


@dataclass
class ParseStats:
    """What the parser met; reported so that silently dropped data is visible."""

    samples: int = 0
    bad_lines: int = 0
    bad_examples: list[str] = field(default_factory=list)
    script_cpu_s: float = 0.0  # CPU seconds the `perf script` runs that wrote these lines used

    def absorb(self, other: "ParseStats") -> None:
        """Add another part's statistics (a slice, a chunk), keeping the first five bad lines."""
        self.samples += other.samples
        self.bad_lines += other.bad_lines
        self.script_cpu_s += other.script_cpu_s
        self.bad_examples.extend(other.bad_examples[:max(0, 5 - len(self.bad_examples))])

    def bad(self, line: str) -> None:
        self.bad_lines += 1
        if len(self.bad_examples) < 5:
            self.bad_examples.append(line[:200])


def split_symbol_dso(rest: str) -> Frame:
    """Split "<symbol> (<dso>)" where both may contain parentheses.

    The DSO is the balanced parenthesised group that ends the line, so
    `foo(int) (/lib/x.so (deleted))` gives ("foo(int)", "/lib/x.so (deleted)").
    """
    if not rest.endswith(")"):
        return (_strip_symoff(rest, UNKNOWN) or UNKNOWN, UNKNOWN)
    # Fast path: the usual "(path)" with no parentheses inside.
    i = rest.rfind("(")
    if rest.find(")", i) == len(rest) - 1:
        if i == 0 or rest[i - 1] == " ":
            dso = rest[i + 1 : -1].strip() or UNKNOWN
            return (_strip_symoff(rest[:i].rstrip(), dso) or UNKNOWN, dso)
    depth = 0
    for i in range(len(rest) - 1, -1, -1):
        ch = rest[i]
        if ch == ")":
            depth += 1
        elif ch == "(":
            depth -= 1
            if depth == 0:
                # "(dso)" alone: perf had an address but no symbol.
                dso = rest[i + 1 : -1].strip() or UNKNOWN
                return (_strip_symoff(rest[:i].rstrip(), dso) or UNKNOWN, dso)
    return (_strip_symoff(rest, UNKNOWN), UNKNOWN)


def _strip_symoff(sym: str, dso: str) -> str:
    """The symbol without an offset perf may append, and without an ELF symbol version. A name qprof
    gave a stripped object's function (`libx.so.1+0x5a3c0`: its object and start, collectors.debuginfo)
    is a name, not an offset: it stays."""
    if "+0x" in sym and not sym.startswith(dso.rsplit("/", 1)[-1] + "+0x"):
        sym = _SYMOFF.sub("", sym)
    return _SYMVER.sub("", sym) if "@" in sym else sym


def parse_frame(line: str) -> Frame | None:
    """Parse one stack line; None when it is not a frame line."""
    parts = line.split(None, 1)
    if len(parts) != 2 or not line[:1].isspace():
        return None
    ip, rest = parts
    try:
        kernel_ip = _KERNEL_SPACE_START <= int(ip, 16) < _PERF_CONTEXT_MARKERS
    except ValueError:
        return None
    sym, dso = split_symbol_dso(rest.rstrip())
    if dso == UNKNOWN and kernel_ip:
        dso = KERNEL_DSO
    return (sym, dso)


def parse_header(line: str) -> tuple[str, int, int, int, int | None] | None:
    """Parse a sample's first line into (comm, pid, tid, period, time bin or None)."""
    got = _parse_header(line)
    return None if got is None else got[:5]


def _parse_header(line: str) -> tuple[str, int, int, int, int | None, int | None] | None:
    """parse_header and the sample's time in ns (or None)."""
    m = _HEADER.match(line)
    if m is None:
        return None
    stamp = m.group("time")
    return (m.group("comm").strip(), int(m.group("pid")), int(m.group("tid")), int(m.group("period")),
            time_bin(stamp) if stamp else None, time_ns(stamp) if stamp else None)


class LineParser:
    """The sample reader's state machine, one line at a time (a line without its newline).

    A header line starts a sample, tab-indented frame lines extend it, a blank
    line (or the next header, or the end) finishes it. `parse_samples` drives it
    over a whole stream; the block folder (collectors.streamfold) drives it over
    the rare samples its fast path does not take, so both read text the same way.
    """

    __slots__ = ("stats", "_header", "_frames")

    def __init__(self, stats: ParseStats | None = None) -> None:
        self.stats = stats if stats is not None else ParseStats()
        self._header: tuple[str, int, int, int, int | None, int | None] | None = None
        self._frames: list[Frame] = []

    def _take(self) -> Sample | None:
        header = self._header
        if header is None:
            return None
        self.stats.samples += 1
        sample = Sample(header[1], header[2], header[0], header[3], tuple(self._frames), header[4], header[5])
        self._header, self._frames = None, []
        return sample

    def line(self, line: str) -> Sample | None:
        """Consume one line; return the sample it completes, if any."""
        if not line.strip():
            sample = self._take()
            self._header, self._frames = None, []
            return sample
        # Frames are tab-indented; headers start with the (right-aligned) comm.
        parsed = None if line[0] == "\t" else _parse_header(line)
        if parsed is None:
            frame = parse_frame(line)
            if frame is None or self._header is None:
                self.stats.bad(line)
            else:
                self._frames.append(frame)
            return None
        sample = self._take()  # previous sample had no blank line after it
        self._header, self._frames = parsed, []
        return sample

    def end(self) -> Sample | None:
        """The end of the text: the sample still open, if any."""
        return self._take()


def parse_samples(lines: Iterable[str], stats: ParseStats | None = None) -> Iterator[Sample]:
    """Yield samples from perf script lines; unreadable lines are counted in `stats`."""
    parser = LineParser(stats)
    for raw in lines:
        sample = parser.line(raw.rstrip("\n"))
        if sample is not None:
            yield sample
    sample = parser.end()
    if sample is not None:
        yield sample
