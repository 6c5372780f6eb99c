"""Fold `perf script` text into stacks without reading every sample line by line.

Why: parsing perf script's text line by line in Python cost 1.4 us a line
(about 17 lines a DWARF sample), more than perf script took to write it, so
attach's fold step was the slowest part of a run's analysis. Most samples
repeat a stack seen before, down to the instruction addresses: this folder
cuts the text into samples at blank lines, and counts each distinct
(header without period, frame lines) text once per occurrence; only the first
occurrence of a text is parsed, and only from the leaf down to a tail of
frame lines seen before (each distinct frame line is parsed once). The result is
exactly what `fold(parse_samples(text))` gives: same records, same order
(first occurrence), same parse statistics; samples of unusual shape go through
the same line parser (collectors.perfscript.LineParser).

Memory is bounded: the distinct texts are folded and forgotten every
`max_texts` distinct texts (or 8 x max_texts cached tails), so what is held is
the folded stacks (they grow with distinct stacks, not with samples) plus a
bounded number of sample texts.
A sample text longer than `max_block` characters (perf script writes none;
garbage without blank lines could) is read line by line as it arrives.
"""

from __future__ import annotations

from qprof.collectors.perfscript import LineParser, ParseStats, parse_frame, parse_header, time_ns
from qprof.archive.stacks import BIN_S, Frame, Sample, StackRecord, add_counts, records, widen

BIN_NS = round(BIN_S * 1e9)  # a time bin in ns: bin = ns // BIN_NS, as perfscript.time_bin reads it
FoldKey = tuple[int, int, str, tuple[Frame, ...]]  # (pid, tid, comm, frames): what `stacks.fold` groups by
_MISSING = object()
_INVALID = object()  # cached for lines only the line parser may read


class StreamFolder:
    """Feed perf script text in chunks of any size (`feed`), then `finish` for the folded records."""

    def __init__(self, stats: ParseStats | None = None, max_texts: int = 16384, max_block: int = 1 << 20) -> None:
        self.stats = stats if stats is not None else ParseStats()
        self.max_texts = max_texts
        self.max_block = max_block
        self._carry = ""  # text after the last blank line seen: an unfinished sample
        self._spill: LineParser | None = None  # set while an over-long sample is read line by line
        # (head, frame text) -> [samples, period, bad lines, {time bin: period}, [first ns, last ns] or None];
        # samples the fast path
        # did not take are kept under their fold key, in the same dict so that first-occurrence order
        # survives. The head is the header without its time and period.
        self._texts: dict[object, list] = {}
        self._heads: dict[str, tuple[str, int, int] | None] = {}
        self._bodies: dict[str, tuple[tuple[Frame, ...], tuple[str, ...]] | None] = {}
        self._lines: dict[str, object] = {}  # frame line -> Frame, None (unreadable) or _INVALID
        self._folded: dict[FoldKey, list] = {}
        self._fast = 0  # samples counted by the fast path since the last flush

    # -- input
    def feed(self, chunk: str) -> None:
        text = self._carry + chunk if self._carry else chunk
        self._carry = ""
        if self._spill is not None:
            text = self._spill_lines(text)
            if self._spill is not None:
                return
        end = text.rfind("\n\n")
        if end < 0:
            if len(text) > self.max_block:
                self._spill = LineParser(self.stats)
                rest = self._spill_lines(text)
                if self._spill is None:
                    self.feed(rest)
                return
            self._carry = text
            return
        self._blocks(text[:end])
        self._carry = text[end + 2:]
        if len(self._carry) > self.max_block:
            self.feed("")

    def finish(self) -> list[StackRecord]:
        """End of the text: fold what is left and return the records in first-occurrence order."""
        if self._spill is not None:
            if self._carry:
                self._add_sample(self._spill.line(self._carry))
            self._add_sample(self._spill.end())
            self._spill = None
        elif self._carry:
            self._blocks(self._carry)
        self._carry = ""
        self._flush()
        return records(self._folded)

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
            when = ns = None
            if head.rstrip().endswith(":"):  # "comm pid/tid  TIME:" -> "comm pid/tid", the time's bin and ns
                before, _, stamp = head.rstrip().rpartition(" ")
                ns = time_ns(stamp)
                when = None if ns is None else ns // BIN_NS
                if when is not None:
                    head = before.rstrip()
            slot = texts.get((head, body))
            if slot is not None and period.isdigit() and period.isascii():
                n = int(period)
                slot[0] += 1
                slot[1] += n
                if when is not None:
                    slot[3][when] = slot[3].get(when, 0) + n
                if ns is not None:
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
            fast += self._first_sight(block, head, sep, period, body, when, ns)
        self._fast += fast

    def _first_sight(self, block: str, head: str, sep: str, period: str, body: str, when: int | None,
                     ns: int | None) -> int:
        """A text not seen since the last flush: parse it, or read the whole sample with the line parser."""
        if not block:
            return 0
        who = self._heads.get(head, _MISSING)
        if who is _MISSING:
            # the header's fields other than the period depend on the text before the period only
            parsed = parse_header(head + " 0") if sep == " " and not head.startswith("\t") else None
            who = self._heads[head] = None if parsed is None else parsed[:3]
        frames = self._parse_body(body)
        if who is None or frames is None or not (period.isdigit() and period.isascii()):
            parser = LineParser(self.stats)
            for line in block.split("\n"):
                self._add_sample(parser.line(line))
            self._add_sample(parser.end())
            return 0
        for line in frames[1]:
            self.stats.bad(line)
        self._texts[(head, body)] = [1, int(period), frames[1], {} if when is None else {when: int(period)},
                                     None if ns is None else [ns, ns]]
        if len(self._texts) >= self.max_texts or len(self._bodies) >= 8 * self.max_texts:
            self._fast += 1
            self._flush()
            return 0
        return 1

    def _parse_body(self, body: str) -> tuple[tuple[Frame, ...], tuple[str, ...]] | None:
        """Frame lines -> (frames, unreadable lines); None when the text is not all frame lines.

        Stacks that differ only near the leaf share their callers' text: the body is
        parsed line by line from the top only until a known tail (a cached suffix), so
        a new stack costs a few look-ups, not one per frame."""
        bodies, lines = self._bodies, self._lines
        if not body:
            bodies[body] = ((), ())
            return bodies[body]
        heads: list[tuple[str, str]] = []  # (line, text from the line on), leaf first
        text = body
        got = bodies.get(text, _MISSING)
        while got is _MISSING:
            line, nl, rest = text.partition("\n")
            heads.append((line, text))
            if not nl:
                got = ((), ())
                break
            text = rest
            got = bodies.get(text, _MISSING)
        for line, text in reversed(heads):
            if got is not None:
                frame = lines.get(line, _MISSING)
                if frame is _MISSING:
                    # a blank line or a header inside: the line parser decides
                    frame = lines[line] = parse_frame(line) if line[:1] == "\t" and line.strip() else _INVALID
                if frame is _INVALID:
                    got = None
                elif frame is None:
                    got = (got[0], (line, *got[1]))
                else:
                    got = ((frame, *got[0]), got[1])  # type: ignore[misc]
            bodies[text] = got
        return got  # type: ignore[return-value]

    # -- the slow path and the fold
    def _add_sample(self, s: Sample | None) -> None:
        if s is None:
            return
        key = (s.pid, s.tid, s.comm, s.frames)
        slot = self._texts.get(key)
        if slot is None:
            slot = self._texts[key] = [1, s.period, (), {}, None]
        else:
            slot[0] += 1
            slot[1] += s.period
        if s.bin is not None:
            slot[3][s.bin] = slot[3].get(s.bin, 0) + s.period
        if s.time_ns is not None:
            slot[4] = widen(slot[4], (s.time_ns, s.time_ns))

    def _flush(self) -> None:
        """Fold the distinct texts into records and forget them (bounded memory)."""
        folded = self._folded
        for key, (n, period, _bad, bins, span) in self._texts.items():
            if len(key) == 2:  # (head, body): the fast path's text
                comm_pid_tid = self._heads[key[0]]
                frames = self._bodies[key[1]]
                assert comm_pid_tid is not None and frames is not None
                comm, pid, tid = comm_pid_tid
                key = (pid, tid, comm, frames[0])
            add_counts(folded, key, n, period, bins.items(), None if span is None else (span[0], span[1]))
        self.stats.samples += self._fast
        self._fast = 0
        self._texts.clear()
        self._heads.clear()
        self._bodies.clear()
        if len(self._lines) > 4 * self.max_texts:
            self._lines.clear()

    def _spill_lines(self, text: str) -> str:
        """Read an over-long sample line by line; return the text after the blank line that ends it."""
        assert self._spill is not None
        pos = 0
        while True:
            nl = text.find("\n", pos)
            if nl < 0:
                self._carry = text[pos:]
                return ""
            line = text[pos:nl]
            pos = nl + 1
            self._add_sample(self._spill.line(line))
            if not line.strip():
                self._spill = None
                return text[pos:]
