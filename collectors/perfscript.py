"""Turn `perf script` text into folded stacks: qprof's one reader of perf's samples.

qprof runs `perf script` with a fixed field list (see PERF_SCRIPT_FIELDS) so the
format is known; the reader still tolerates what real captures contain:
`[unknown]` symbols and DSOs, deleted mappings (`(/path (deleted))`), symbol
names with spaces and parentheses (demangled C++), comm names with spaces,
kernel-only and user-only stacks, and samples without any frame. Lines it
cannot read are counted, never fatal: one odd frame must not lose a capture.

The grammar, a line at a time: a blank (or whitespace-only) line ends a sample;
a line that is not tab-led and reads as a header (`parse_header`) starts one;
any other line is a frame of the open sample (`parse_frame`), or, when it is not
a frame or no sample is open, an unreadable line (counted in ParseStats).

Why the reader works on whole samples: parsing perf script's text line by line
in Python cost 1.4 us a line (about 17 lines a DWARF sample), more than perf
script took to write it. Most samples repeat a stack seen before, down to the
instruction addresses, so StreamFolder cuts the text at blank lines and counts
each distinct (header without time and period, frame lines) text: only its
first occurrence is parsed, a look-up per frame line met before (DWARF stacks
often differ only in the leaf's address; each distinct line is classified
once). A piece of text that is not
one sample of that shape (two headers without a blank line between them, a
whitespace-only separator, a header with an event name after the period, lines
before any header, a sample longer than `max_block`) is read with the grammar
above a line at a time, by the same line classification: both ways give one
result, tests/test_perfscript.py checks it against a plain line reader.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Iterable, NamedTuple

from qprof.archive.stacks import BIN_S, KERNEL_DSO, UNKNOWN, Frame, StackRecord, add_counts, records, widen

# Fields requested from `perf script -F`; the header regex below matches them.
PERF_SCRIPT_FIELDS = "comm,pid,tid,time,period,ip,sym,dso"
# x86-64 (and arm64) kernel text lives in the upper canonical half; the top
# 4 KiB are perf's callchain context markers (e.g. ffffffffffffffff ends a
# truncated DWARF user stack), not kernel addresses.
_KERNEL_SPACE_START = 0xFFFF800000000000
_PERF_CONTEXT_MARKERS = 0xFFFFFFFFFFFFF000
BIN_NS = round(BIN_S * 1e9)  # a time bin in ns: a sample's bin is its time // BIN_NS

# "<comm> <pid>/<tid> [<time>:] <period>" with comm possibly containing spaces; an
# optional "<event>:" tail is accepted for captures made with more fields.
_HEADER = re.compile(
    r"^\s*(?P<comm>.*?)\s+(?P<pid>-?\d+)/(?P<tid>-?\d+)\s+(?:(?P<time>\d+\.\d+):\s+)?(?P<period>\d+)(?:\s+\S+:)?\s*$"
)
_SYMOFF = re.compile(r"\+0x[0-9a-fA-F]+$")
# ELF symbol versions perf sometimes prints (cfree@GLIBC_2.2.5, clock_gettime@@GLIBC_2.17):
# mapping rules match the plain name. `@plt` stubs are lower case and stay.
_SYMVER = re.compile(r"@@?[A-Z][A-Z0-9_]*_[0-9][0-9.]*$")


class Header(NamedTuple):
    """A sample's first line: who ran and how much CPU the sample stands for."""

    comm: str
    pid: int
    tid: int
    period: int
    time_ns: int | None  # None when perf printed no time (or one qprof cannot read exactly)


def time_ns(stamp: str) -> int | None:
    """perf's "SECONDS.FRACTION" -> nanoseconds, without float rounding; None for anything else."""
    whole, dot, frac = stamp.partition(".")
    if not (dot and whole.isdigit() and whole.isascii() and frac.isdigit() and frac.isascii()):
        return None
    return int(whole) * 1_000_000_000 + int(frac[:9].ljust(9, "0"))


@dataclass
class StackNeed:
    """One process's DWARF stacks as the native folder unwound them (perffold's `stack_need`): `needed`
    maps the bytes of its stack copy a finished stack's unwinding read (rounded up to 256) to how many
    stacks read that much; `truncated` stacks read past the copy's end (their callers are `[unknown]`);
    `copied` is the largest copy seen. What a smaller copy would cut, and how often the copy falls short."""

    copied: int = 0
    truncated: int = 0
    needed: dict[int, int] = field(default_factory=dict)

    @property
    def stacks(self) -> int:
        return self.truncated + sum(self.needed.values())

    @property
    def deepest(self) -> int:
        return max((b for b, n in self.needed.items() if n), default=0)

    @classmethod
    def parse(cls, obj: dict[str, Any]) -> StackNeed:
        """One process's entry of the folder's `stack_need` statistics."""
        return cls(int(obj["copied"]), int(obj["truncated"]), {int(b): int(c) for b, c in obj["needed"]})

    def absorb(self, other: StackNeed) -> None:
        self.copied = max(self.copied, other.copied)
        self.truncated += other.truncated
        for b, n in other.needed.items():
            self.needed[b] = self.needed.get(b, 0) + n


@dataclass
class ParseStats:
    """What the reader met; reported so that silently dropped data is visible."""

    samples: int = 0
    bad_lines: int = 0
    bad_examples: list[str] = field(default_factory=list)
    script_cpu_s: float = 0.0  # CPU seconds the folder used: the `perf script` runs, or the native folder
    folder: str = "perf script"  # what read the perf data (collectors.nativefold.NAME: the native folder)
    stack_need: dict[int, StackNeed] = field(default_factory=dict)  # per pid; the native folder's only

    def absorb(self, other: "ParseStats") -> None:
        """Add another part's statistics (a slice, a chunk), keeping the first five bad lines."""
        self.samples += other.samples
        self.bad_lines += other.bad_lines
        self.script_cpu_s += other.script_cpu_s
        if other.samples:
            self.folder = other.folder
        self.bad_examples.extend(other.bad_examples[:max(0, 5 - len(self.bad_examples))])
        for pid, need in other.stack_need.items():
            self.stack_need.setdefault(pid, StackNeed()).absorb(need)

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


def parse_header(line: str) -> Header | None:
    """Parse a sample's first line; None when it is not a header."""
    m = _HEADER.match(line)
    if m is None:
        return None
    stamp = m.group("time")
    return Header(m.group("comm").strip(), int(m.group("pid")), int(m.group("tid")), int(m.group("period")),
                  time_ns(stamp) if stamp else None)


def fold_text(text: str, stats: ParseStats | None = None) -> list[StackRecord]:
    """A whole text's folded records (tests, small inputs): what feeding it in pieces gives."""
    folder = StreamFolder(stats)
    folder.feed(text)
    return folder.finish()


class _Blank:
    """The class of a line that ends a sample (empty or whitespace only)."""


_BLANK = _Blank()
Slot = list[Any]  # [samples, period, unreadable lines to count again per sample, {time bin: period}, [first ns, last ns] or None]


class StreamFolder:
    """Feed perf script text in pieces of any size (`feed`), then `finish` for the folded records.

    The result is that of reading the text a line at a time with the grammar in the module's
    docstring and folding the samples (archive.stacks.add_counts): same records in the same
    (first-occurrence) order, same statistics, wherever the text is cut into pieces.

    Memory is bounded: the distinct texts are folded and forgotten every `max_texts` distinct
    texts (and the frame lines met, past 4 x max_texts of them), so what is held is the folded
    stacks (they grow with distinct stacks, not with samples) plus a bounded number of sample
    texts. A sample text
    longer than `max_block` characters (perf script writes none; garbage without blank lines
    could) is read a line at a time as it arrives.
    """

    def __init__(self, stats: ParseStats | None = None, max_texts: int = 16384, max_block: int = 1 << 20) -> None:
        self.stats = stats if stats is not None else ParseStats()
        self.max_texts = max_texts
        self.max_block = max_block
        self._carry = ""  # text after the last blank line seen (or, reading a line at a time, after the last line)
        # the sample open while reading a line at a time: its header and frames so far
        self._open: tuple[Header, list[Frame]] | None = None
        # (head, frame text) -> Slot + [its fold key] for texts the fast path counts; samples read a line
        # at a time are kept under their fold key, in the same dict, so that first-occurrence order
        # survives. The head is the header without its time and period.
        self._texts: dict[object, Slot] = {}
        self._heads: dict[str, tuple[str, int, int] | None] = {}  # head -> (comm, pid, tid), None: not a header
        self._frames: dict[str, Frame] = {}  # a frame line met before -> its frame
        self._folded: dict[tuple[int, int, str, tuple[Frame, ...]], list[Any]] = {}
        self._fast = 0  # samples counted by the fast path since the last flush

    # -- input
    def feed(self, chunk: str) -> None:
        text = self._carry + chunk if self._carry else chunk
        self._carry = ""
        if self._open is not None:  # an over-long sample: its lines up to the blank line that ends it
            end = text.find("\n\n")
            if end < 0:
                self._lines_of(text)
                return
            self._read(text[:end].split("\n"))
            self._close()
            text = text[end + 2:]
        end = text.rfind("\n\n")
        if end < 0:
            if len(text) > self.max_block:
                self._lines_of(text)
            else:
                self._carry = text
            return
        self._blocks(text[:end])
        self._carry = text[end + 2:]
        if len(self._carry) > self.max_block:
            self.feed("")

    def finish(self) -> list[StackRecord]:
        """End of the text: fold what is left and return the records in first-occurrence order."""
        if self._open is not None:
            self._read(self._carry.split("\n"))
            self._close()
        elif self._carry:
            self._blocks(self._carry)
        self._carry = ""
        self._flush()
        return records(self._folded)

    def _lines_of(self, text: str) -> None:
        """Read the whole lines of `text` a line at a time (the sample they are in stays open); keep the rest."""
        nl = text.rfind("\n")
        if nl >= 0:
            self._read(text[:nl].split("\n"))
        self._carry = text[nl + 1:]

    # -- the fast path: one dictionary look-up per sample that repeats a known text
    def _blocks(self, text: str) -> None:
        texts = self._texts
        bad = self.stats.bad
        fast = 0
        for block in text.split("\n\n"):
            if not block:
                continue
            block = block.strip("\n")
            first, _, body = block.partition("\n")
            head, sep, period = first.rstrip().rpartition(" ")
            head = head.rstrip()
            ns = None
            if head[-1:] == ":":
                # "comm pid/tid  TIME:" -> "comm pid/tid" and the time in ns
                before, _, stamp = head.rpartition(" ")
                ns = time_ns(stamp[:-1])
                if ns is not None:
                    head = before.rstrip()
            slot = texts.get((head, body))
            if slot is not None and period.isdigit() and period.isascii():
                n = int(period)
                slot[0] += 1
                slot[1] += n
                if ns is not None:
                    per_bin = slot[3]
                    when = ns // BIN_NS
                    per_bin[when] = per_bin.get(when, 0) + n
                    span = slot[4]
                    if span is None:
                        slot[4] = [ns, ns]
                    elif ns < span[0]:
                        span[0] = ns
                    elif ns > span[1]:
                        span[1] = ns
                fast += 1
                if slot[2]:
                    for line in slot[2]:
                        bad(line)
                continue
            fast += self._first_sight(block, head, sep, period, body, ns)
        self._fast += fast

    def _first_sight(self, block: str, head: str, sep: str, period: str, body: str, ns: int | None) -> int:
        """A text not seen since the last flush: parse it once, or read the block a line at a time
        when it is not one sample of the usual shape."""
        if not block:
            return 0
        heads = self._heads
        if head in heads:
            who = heads[head]
        else:  # the header's fields other than the period depend on the text before the period only
            parsed = parse_header(head + " 0") if sep == " " and not head.startswith("\t") else None
            who = heads[head] = None if parsed is None else (parsed.comm, parsed.pid, parsed.tid)
        if who is None or not (period.isdigit() and period.isascii()):
            return self._by_line(block)
        parts = body.split("\n") if body else []
        unreadable: tuple[str, ...] = ()
        try:  # every line a frame met before: one look-up each (DWARF stacks differ at the leaf's address)
            frames = tuple([self._frames[line] for line in parts])
        except KeyError:  # a line not met before: classified once
            known = self._frames
            found: list[Frame] = []
            bad: list[str] = []
            for line in parts:
                frame = known.get(line)
                if frame is None:
                    kind = self._line(line)
                    if kind is None:
                        bad.append(line)
                        continue
                    if isinstance(kind, (_Blank, Header)):
                        return self._by_line(block)
                    frame = kind
                found.append(frame)
            frames, unreadable = tuple(found), tuple(bad)
        for line in unreadable:
            self.stats.bad(line)
        n = int(period)
        comm, pid, tid = who
        self._texts[(head, body)] = [1, n, unreadable, {} if ns is None else {ns // BIN_NS: n},
                                     None if ns is None else [ns, ns], (pid, tid, comm, frames)]
        if len(self._texts) >= self.max_texts:
            self._fast += 1
            self._flush()
            return 0
        return 1

    def _by_line(self, block: str) -> int:
        """A block that is not one sample of the usual shape: the grammar a line at a time."""
        self._read(block.split("\n"))
        self._close()
        return 0

    def _line(self, line: str) -> "Frame | Header | _Blank | None":
        """A line's class in the grammar: a frame, a header, a blank line, or None (unreadable)."""
        frame = self._frames.get(line)
        if frame is not None:
            return frame
        if not line.strip():
            return _BLANK
        if line[0] != "\t":
            header = parse_header(line)
            if header is not None:
                return header
        frame = parse_frame(line)
        if frame is not None:
            self._frames[line] = frame
        return frame

    # -- a line at a time, and the fold
    def _read(self, lines: Iterable[str]) -> None:
        """The grammar, a line at a time; the sample open at the end stays open."""
        for line in lines:
            kind = self._line(line)
            if isinstance(kind, _Blank):
                self._close()
            elif isinstance(kind, Header):
                self._close()
                self._open = (kind, [])
            elif kind is None or self._open is None:
                self.stats.bad(line)
            else:
                self._open[1].append(kind)

    def _close(self) -> None:
        """Count the open sample, if any."""
        if self._open is None:
            return
        h, frames = self._open
        self._open = None
        self.stats.samples += 1
        key = (h.pid, h.tid, h.comm, tuple(frames))
        slot = self._texts.get(key)
        if slot is None:
            slot = self._texts[key] = [1, h.period, (), {}, None]
        else:
            slot[0] += 1
            slot[1] += h.period
        if h.time_ns is not None:
            when = h.time_ns // BIN_NS
            slot[3][when] = slot[3].get(when, 0) + h.period
            slot[4] = widen(slot[4], (h.time_ns, h.time_ns))

    def _flush(self) -> None:
        """Fold the distinct texts into records and forget them (bounded memory)."""
        folded = self._folded
        for key, slot in self._texts.items():
            n, period, _bad, bins, span = slot[:5]
            add_counts(folded, slot[5] if len(slot) > 5 else key, n, period, bins.items(),
                       None if span is None else (span[0], span[1]))
        self.stats.samples += self._fast
        self._fast = 0
        self._texts.clear()
        self._heads.clear()
        if len(self._frames) > 4 * self.max_texts:
            self._frames.clear()
