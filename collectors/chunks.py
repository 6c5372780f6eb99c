"""Fold perf data chunk by chunk while sampling goes on: bounded disk and memory for long runs.

Why: DWARF unwinding copies 8 KiB of user stack per sample, about 6.5 MB/s of
perf data on two busy CPUs at the default 499 Hz (24 GB an hour). So perf record runs with
`--switch-output=SIZE`: when its file reaches SIZE, perf finishes it (header
written) and renames it perf-<mode>.data.<timestamp>, then starts a new one; a
timestamped file is therefore complete. A background thread folds each finished
chunk with the same path as a whole run (collectors.folding: the native folder, kept running for the
recorder's next chunks, or `perf script` in time slices) into one table of distinct stacks, rewrites stacks.jsonl.gz
with a header naming the chunks it holds (one atomic rename: a chunk is never
counted twice), then deletes the chunk unless raw data is kept (--keep-raw). The
last pass (after perf stopped; `report --refold`) folds every chunk left and
writes the file once, then deletes those chunks: each write is the whole table,
so writing it after each chunk made a long run's refold cost grow with the
square of its chunks.

The file is written again once SAVE_S has passed or the chunks folded since its
last write fill half the raw budget with those waiting: each write is the whole
table. What stays on disk: the chunk perf is writing (<= SIZE), chunks waiting to be
folded and chunks folded since the last write (together <= the raw budget: past it
those folded are written first, then the oldest waiting chunk is dropped and
recorded as lost, never silently), the newest folded chunk (the next one's
context), and the folded stacks, which grow with distinct stacks, not with time.
Memory: the table of distinct stacks.

If qprof dies, perf (SIGINT on qprof's death) still finishes its last chunk;
stacks.jsonl.gz holds every chunk folded so far, `report` reads it and names
the chunks not folded, and `report --refold` folds them.
"""

from __future__ import annotations

import ctypes
import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from qprof import archive
from qprof.collectors import debuginfo, nativefold
from qprof.collectors.folding import file_size, fold_files, serve_files
from qprof.collectors.perfscript import ParseStats
from qprof.archive.model import ChunkSummary, ParseSummary, SampleGroup, Scalar
from qprof.archive.stacks import (NO_RAW, DamagedStacks, Frame, Slot, StackKey, StackRecord, StacksHeader, add_counts,
                                  bin_pairs_text, foldable_again, frames_text, read_stacks, stack_line, stacks_header,
                                  write_stack_lines)
from qprof import runfiles
from qprof.errors import QprofError
from qprof.probes.children import BACKGROUND_NICE

CHUNK_BYTES = 64 * 1024 * 1024  # perf --switch-output size: ~10 s of DWARF samples on two busy CPUs at 499 Hz
DEFAULT_RAW_BUDGET = 256 * 1024 * 1024  # finished chunks waiting to be folded, at most
POLL_S = 0.5  # how often the folding thread looks for finished chunks
# the stacks file is written again after a chunk is folded while sampling goes on once this long has passed
# since the last write, or once the chunks folded since then and those waiting fill half the raw budget
# (a chunk is deleted only after the file that counts it is written, so they stay on disk meanwhile): each
# write is the whole table, ~30 ms of qprof's CPU per 64 MiB chunk on an ngtcp2 transfer
SAVE_S = 30.0
# (stack, time bin) pairs kept for the timeline: a hot stack has one in every 100 ms bin, so a long run's
# count grows with time; past this many, bins double in length (the header's bin_grain), which bounds
# the memory (~100 bytes a pair) and the stacks file whatever the run's length
MAX_BIN_ENTRIES = 500_000


# a stack's time bins past this many are sealed (Sealed), all but its latest
SEAL_AT = 16


@dataclass
class Sealed:
    """A stack's older time bins as the text its line holds ("[b,p],[b,p]...", archive.stacks.bin_pairs_text),
    in bin order, every one below `upto`. Why: in a long run the bins are most of the table, the table is
    written again after every chunk, and a bin older than a stack's latest never changes once its chunk is
    folded (a recorder's chunks come in time order): sealed, each bin is encoded once, not at every save,
    and takes ~12 bytes of text against ~100 as a dict entry."""

    text: str = ""
    count: int = 0
    upto: int = 0


@dataclass
class FoldState:
    """Distinct stacks folded so far and the chunks they came from (the stacks file's header)."""

    acc: dict[StackKey, Slot] = field(default_factory=dict)  # one slot per distinct stack: its recent bins
    sealed: dict[StackKey, Sealed] = field(default_factory=dict)  # its older bins, where it has them
    frames: dict[Frame, Frame] = field(default_factory=dict)  # one object per distinct frame
    folded: list[str] = field(default_factory=list)
    dropped: list[dict[str, Scalar]] = field(default_factory=list)
    unreadable: list[dict[str, Scalar]] = field(default_factory=list)
    stats: ParseStats = field(default_factory=ParseStats)
    bin_grain: int = 1  # time bins per kept bin (archive.stacks): 1 is BIN_S
    # each distinct stack's frames as its line holds them: encoded once, not at every save
    frames_text: dict[tuple[Frame, ...], str] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path) -> "FoldState":
        """Resume from a stacks file (its records and header)."""
        st = cls()
        head = stacks_header(path) or StacksHeader()
        st.bin_grain = max(1, head.bin_grain)
        for r in read_stacks(path) if path.is_file() else ():
            st.add(r.pid, r.tid, r.comm, r.frames, r.samples, r.period, r.bins, r.span_ns)
        st.folded = list(head.folded)
        st.dropped = list(head.dropped)
        st.unreadable = list(head.unreadable)
        st.stats = ParseStats(head.samples, head.bad_lines, head.bad_examples[:5], max(0.0, head.script_cpu_s or 0.0))
        return st

    def add(self, pid: int, tid: int, comm: str, frames: tuple[Frame, ...], samples: int, period: int,
            bins: tuple[tuple[int, int], ...] = (), span: tuple[int, int] | None = None) -> None:
        key = (pid, tid, comm, self.shared(frames))
        if bins:
            self._unseal_below(key, min(b for b, _ in bins))
        add_counts(self.acc, key, samples, period, bins, span)

    def shared(self, frames: tuple[Frame, ...]) -> tuple[Frame, ...]:
        """The stack built from shared frame objects: thousands of distinct stacks repeat the same
        few hundred (symbol, object) pairs, and a long run's memory is these stacks."""
        return tuple(self.frames.setdefault(f, f) for f in frames)

    def merge(self, chunk: dict[StackKey, Slot]) -> None:
        """Add a chunk's sums (its slots are taken over: the caller made them for this)."""
        g = self.bin_grain
        for k, slot in chunk.items():
            n, period, bins = slot[:3]
            span = slot[3] if len(slot) > 3 else None
            if k not in self.acc:
                k = (k[0], k[1], k[2], self.shared(k[3]))
                if g == 1:  # a new stack: its slot is taken as it is (the chunk's, made for this merge)
                    self.acc[k] = [n, period, bins, None if span is None else [span[0], span[1]]]
                    continue
            pairs = ((b - b % g, p) for b, p in bins.items()) if g > 1 else bins.items()
            if bins:
                self._unseal_below(k, min(bins) - min(bins) % g)
            add_counts(self.acc, k, n, period, pairs, None if span is None else (span[0], span[1]))
        while self.bin_entries() > MAX_BIN_ENTRIES:
            self.coarsen()

    def bin_entries(self) -> int:
        """(stack, time bin) pairs held, sealed or not."""
        return sum(len(slot[2]) for slot in self.acc.values()) + sum(s.count for s in self.sealed.values())

    def coarsen(self) -> None:
        """Double the bins' length: each kept bin starts at a multiple of the grain (in BIN_S). A stack's
        sealed bins are coarsened with it and sealed again at once: unsealing every stack first held the
        whole table's bins as numbers (the hour's soak: qprof's memory 76 -> 117 MiB, not given back)."""
        g = self.bin_grain = self.bin_grain * 2
        for k, slot in self.acc.items():
            if k in self.sealed:
                self._unseal(k)
            merged: dict[int, int] = {}
            for b, p in slot[2].items():
                merged[b - b % g] = merged.get(b - b % g, 0) + p
            slot[2] = merged
            self._seal(k, slot)

    def seal(self) -> None:
        """Seal every stack's bins but its latest where it holds more than SEAL_AT."""
        for k, slot in self.acc.items():
            self._seal(k, slot)

    def _seal(self, k: StackKey, slot: Slot) -> None:
        bins: dict[int, int] = slot[2]
        if len(bins) <= SEAL_AT:
            return
        pairs = sorted(bins.items())
        last = pairs.pop()
        s = self.sealed.get(k)
        if s is None:
            s = self.sealed[k] = Sealed()
        text = bin_pairs_text(pairs)
        s.text = f"{s.text},{text}" if s.text else text
        s.count += len(pairs)
        s.upto = last[0]
        slot[2] = {last[0]: last[1]}

    def _unseal_below(self, key: StackKey, lowest: int) -> None:
        """Before a bin is added: one older than the stack's sealed ones (not in time order) puts them
        back into numbers."""
        sealed = self.sealed.get(key)
        if sealed is not None and lowest < sealed.upto:
            self._unseal(key)

    def _unseal(self, key: StackKey) -> None:
        s = self.sealed.pop(key)
        per_bin: dict[int, int] = self.acc[key][2]
        for b, p in json.loads(f"[{s.text}]"):
            per_bin[b] = per_bin.get(b, 0) + p

    def _bins(self, key: StackKey, slot: Slot) -> tuple[tuple[int, int], ...]:
        s = self.sealed.get(key)
        recent = sorted(slot[2].items())
        if s is None:
            return tuple(recent)
        return tuple((b, p) for b, p in json.loads(f"[{s.text}]")) + tuple(recent)

    def records(self) -> list[StackRecord]:
        """The table's records, in first-occurrence order, as reading the stacks file back gives them."""
        return [StackRecord(k[0], k[1], k[2], v[0], v[1], k[3], self._bins(k, v),
                            None if v[3] is None else (v[3][0], v[3][1])) for k, v in self.acc.items()]

    def header(self) -> StacksHeader:
        return StacksHeader(self.folded, self.dropped, self.unreadable, self.stats.samples, self.stats.bad_lines,
                            self.stats.bad_examples, round(self.stats.script_cpu_s, 3), self.bin_grain)

    def save(self, path: Path, seal: bool = True) -> None:
        """Write the stacks file, each line laid out from the text kept; `seal`: the bins sealed first (a
        write that others will follow)."""
        if seal:
            self.seal()
        write_stack_lines(path, map(self._line, self.acc.items()), self.header())

    def _line(self, item: tuple[StackKey, Slot]) -> str:
        (pid, tid, comm, frames), slot = item
        text = self.frames_text.get(frames)
        if text is None:
            text = self.frames_text[frames] = frames_text(frames)
        recent = bin_pairs_text(sorted(slot[2].items()))
        s = self.sealed.get(item[0])
        bins = recent if s is None else f"{s.text},{recent}" if recent else s.text
        span = slot[3]
        return stack_line(pid, tid, comm, slot[0], slot[1], text, bins, None if span is None else (span[0], span[1]))


class ChunkFolder:
    """Folds a run's finished perf chunks in a background thread, and the rest at the end."""

    def __init__(self, perf: str, out: Path, groups: list[SampleGroup], *, keep_raw: bool = False,
                 raw_budget: int = DEFAULT_RAW_BUDGET, state: FoldState | None = None,
                 status: Callable[[str], None] | None = None, kallsyms: Path | None = None) -> None:
        self.perf, self.out, self.groups = perf, out, groups
        self.kallsyms = kallsyms  # the attach's snapshot of the kernel's symbols (probes.kallsyms)
        self.keep_raw, self.raw_budget = keep_raw, raw_budget
        self.state = state or FoldState()
        self.status = status or (lambda msg: None)
        # set while the targets' objects have their names where perf finds them (collectors.debuginfo):
        # no chunk is folded before, so chunks name the same frames the same way
        self.symbols_ready = threading.Event()
        self.symbols_ready.set()
        # with followed cgroups (collectors.service): the wall time the session last looked for new
        # members; a chunk perf finished after it may hold a pid not yet in its group's
        self.targets_seen: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # the records of the stacks file this folder last wrote, kept when asked (a refold's report reads them):
        # an attach rewrites the file after every chunk, and holding its last records between writes took
        # tens of MB once the time bins reached their cap (the hour's soak)
        self.keep_written = False
        self.written: list[StackRecord] | None = None
        self.error: BaseException | None = None
        # a native folder kept for each recorder (by its perf data name) once its first chunk is folded
        # while sampling goes on: the next chunks are folded by it, not each by a new process
        self._servers: dict[str, nativefold.Server] = {}
        self._unsaved: list[Path] = []  # chunks folded since the stacks file was last written (SAVE_S)
        self._saved_at = time.monotonic()

    # -- the background pass
    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="qprof-fold", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        try:
            while not self._stop.wait(POLL_S):
                self.fold_pass(final=False)
        except BaseException as e:  # reported by finish(); collection goes on without folding
            self.error = e

    def _halt(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def abort(self) -> None:
        """Stop folding after the chunk in progress; what was saved stays, the rest stays raw."""
        self._halt()
        for server in self._servers.values():
            server.kill()
        self._servers.clear()

    def finish(self) -> ParseStats:
        """After perf stopped: fold every chunk left, in this thread; the parse statistics."""
        self._halt()
        if self.error is not None:
            raise _as_qprof_error(self.error, self.out)
        self._stop.clear()
        try:
            self.fold_pass(final=True)
        except OSError as e:
            raise _as_qprof_error(e, self.out) from None
        return self.state.stats

    # -- one pass over the finished chunks
    def fold_pass(self, final: bool) -> None:
        if not final and not self.symbols_ready.is_set():
            return
        self.symbols_ready.wait()
        waiting = [(p, g) for g in self.groups
                   for p in runfiles.chunk_files(self.out, g.perf_data, include_current=final)
                   if p.name not in self.state.folded and (final or self._pids_known(p))]
        if final:
            # the last pass: each group's chunks in one fold, in time order (the native folder reads
            # kallsyms and the objects' tables once), written once: each write is the whole table, so a
            # long run's refold paid it per chunk
            done: list[Path] = []
            for group in self.groups:
                paths = [p for p, g in waiting if g is group and p.exists()]
                if paths:
                    self._fold_chunks(paths, group, True)
                    done += paths
            for name in list(self._servers):
                self._end_server(name)
            self._write_folded(final=True, more=done)
            return
        waiting.sort(key=lambda pg: pg[0].name)
        self._enforce_budget(waiting)
        for i, (path, group) in enumerate(waiting):
            if path.exists():
                self._fold_chunks([path], group, self._behind(waiting[i:]), keep_folder=True)
                self._unsaved.append(path)
                if self._save_due(waiting[i + 1:]):
                    self._write_folded(final=False)

    def _write_folded(self, final: bool, more: list[Path] | None = None) -> None:
        """_saved for every chunk folded since the last write (and `more`, the last pass's)."""
        self._saved(self._unsaved + (more or []), final)
        self._unsaved = []

    def _save_due(self, waiting: list[tuple[Path, SampleGroup]]) -> bool:
        """Whether the stacks file is to be written now (SAVE_S)."""
        on_disk = sum(map(file_size, self._unsaved)) + sum(file_size(p) for p, _ in waiting)
        return on_disk > self.raw_budget // 2 or time.monotonic() - self._saved_at >= SAVE_S

    def _pids_known(self, chunk: Path) -> bool:
        """Whether every target in the chunk is in its group's pids (folding keeps only those): the
        session looked for new members of the followed cgroups after perf finished writing it."""
        if self.targets_seen is None:
            return True
        try:
            return chunk.stat().st_mtime < self.targets_seen
        except OSError:
            return True  # dropped meanwhile: the pass skips it

    def _enforce_budget(self, waiting: list[tuple[Path, SampleGroup]]) -> None:
        sizes = {p: file_size(p) for p, _ in waiting}
        total = sum(sizes.values())
        if self._unsaved and total + sum(map(file_size, self._unsaved)) > self.raw_budget:
            self._write_folded(final=False)  # folded chunks go before any waiting one is lost
        while total > self.raw_budget and len(waiting) > 1:
            path, _ = waiting.pop(0)
            total -= sizes[path]
            path.unlink(missing_ok=True)
            self.state.dropped.append({"chunk": path.name, "bytes": sizes[path],
                                       "reason": "folding fell behind sampling: raw budget exceeded"})
            self.status(f"warning: dropped {path.name} ({sizes[path] >> 20} MiB unfolded): folding is "
                        "slower than sampling; lower -F or use --unwind fp")
            self._save(final=False)

    def _behind(self, waiting: list[tuple[Path, SampleGroup]]) -> bool:
        """Folding must keep up now: the chunks waiting fill half the raw budget (past all of it
        the oldest are dropped)."""
        return sum(file_size(p) for p, _ in waiting) > self.raw_budget // 2

    def _fold_chunks(self, paths: list[Path], group: SampleGroup, urgent: bool, keep_folder: bool = False) -> None:
        """`urgent`: at the targets' priority, on every CPU once sampling is over. Otherwise, while
        sampling goes on, at the lowest priority on one CPU: it takes the CPU the targets leave, not
        theirs (at the same priority it is scheduled against them). Chunks folded together that fail
        are folded again one by one, so that a damaged one is named and the others count. `keep_folder`: a
        pass while sampling goes on, which starts the recorder's kept folder (_fold) if it has none."""
        try:  # merged only once the chunks are read: a failure counts nothing
            chunk, stats = self._fold(paths, group, urgent, keep_folder)
        except QprofError as e:  # a damaged chunk (perf crashed while writing it): named, not counted
            if len(paths) > 1:
                for path in paths:
                    self._fold_chunks([path], group, urgent, keep_folder)
                return
            self.state.unreadable.append({"chunk": paths[0].name, "reason": str(e)})
            self.status(f"warning: {paths[0].name}: {e}")
            chunk, stats = {}, ParseStats()
        st = self.state
        st.merge(chunk)
        st.stats.absorb(stats)
        st.folded += [p.name for p in paths]
        _return_free_memory()

    def _fold(self, paths: list[Path], group: SampleGroup, urgent: bool, keep_folder: bool
              ) -> tuple[dict[StackKey, Slot], ParseStats]:
        """The chunks' sums: by the recorder's kept folder where it has one (`keep_folder`: started if not),
        else by fold_files. A kept folder that is gone is replaced by fold_files."""
        background = threading.current_thread() is not threading.main_thread()
        server = self._server(group, paths[0], start=keep_folder)
        if server is not None:
            server.renice(0 if urgent else BACKGROUND_NICE)
            try:
                return serve_files(server, paths)
            except nativefold.FolderGone as e:
                self._end_server(group.perf_data)
                self.status(f"warning: {e}; its chunks are folded one process each from now on")
        return fold_files(self.perf, paths, self.out / runfiles.perf_log(group.unwind), list(group.pids),
                          1 if background else None, group.windows, 0 if urgent else BACKGROUND_NICE,
                          self.kallsyms, self._before(paths[0], group))

    def _server(self, group: SampleGroup, first: Path, start: bool) -> nativefold.Server | None:
        """The recorder's kept folder (`start`: made if it has none), for its pids now; None where it
        cannot have one: `perf script` folds, a target has exec windows (folded per window), or it has
        none and none is to be made."""
        folder = nativefold.chosen()
        server = self._servers.get(group.perf_data)
        if server is not None and (folder is None or group.windows or server.pids != list(group.pids)):
            self._end_server(group.perf_data)  # a followed service's new member: a folder for the new pids
            server = None
        if server is None and start and folder is not None and not group.windows:
            server = self._servers[group.perf_data] = nativefold.Server(
                folder, list(group.pids), debuginfo.cache_root(), self.out / runfiles.perf_log(group.unwind),
                BACKGROUND_NICE, self.kallsyms, self._before(first, group))
        return server

    def _end_server(self, name: str) -> None:
        """Close a kept folder; its CPU no file's statistics gave is counted."""
        server = self._servers.pop(name, None)
        if server is not None:
            self.state.stats.script_cpu_s += server.close()

    def _before(self, first: Path, group: SampleGroup) -> Path | None:
        """The group's newest chunk on disk before `first`: the mappings of a process that exited while
        perf wrote `first`'s are there (collectors.folding.fold_files `context`)."""
        chunks = runfiles.chunk_files(self.out, group.perf_data, include_current=False)
        older = [p for p in chunks if p.name < first.name]
        return older[-1] if older else None

    def _saved(self, chunks: list[Path], final: bool) -> None:
        """Write the stacks file that holds these folded chunks, then delete the raw data of every folded
        chunk (unless kept) but each group's newest, which names the next chunk's exited processes
        (`_before`) until the last pass: a chunk is gone only once the file that counts it is on disk,
        so a kill at any moment loses none and counts none twice."""
        if chunks:
            self._save(final)
        if self.keep_raw or not (chunks or final):
            return
        folded = set(self.state.folded)
        for group in self.groups:
            on_disk = runfiles.chunk_files(self.out, group.perf_data, include_current=final)
            done = [p for p in on_disk if p.name in folded]
            for path in done if final else done[:-1]:
                path.unlink(missing_ok=True)

    def _save(self, final: bool) -> None:
        # the last write seals nothing: no write follows it to spare
        self.state.save(self.out / runfiles.STACKS, seal=not final)
        self._saved_at = time.monotonic()
        self.written = self.state.records() if self.keep_written else None


_malloc_trim: Callable[[int], int] | None  # glibc's malloc_trim(pad): 1 when memory went back to the system
try:
    _malloc_trim = ctypes.CDLL(None).malloc_trim  # glibc
except (AttributeError, OSError):  # another libc: nothing to do
    _malloc_trim = None


def _return_free_memory() -> None:
    """Folding a chunk allocates tens of MB of short-lived strings in the folding thread's malloc
    arena; glibc keeps freed arena memory, so qprof's RSS crept up chunk after chunk (soak).
    malloc_trim hands it back: RSS then follows what is live (the distinct stacks)."""
    if _malloc_trim is not None:
        _malloc_trim(0)


def _as_qprof_error(e: BaseException, out: Path) -> BaseException:
    if isinstance(e, OSError):
        return QprofError(f"writing folded stacks in {out}: {e.strerror or e}; the perf data is kept: "
                          f"free space and run `qprof report --refold {out}`")
    return e


def parse_summary(stats: ParseStats) -> ParseSummary:
    """What meta.json says about folding: samples and the lines perf script wrote that were not read."""
    return ParseSummary(stats.samples, stats.bad_lines, list(stats.bad_examples), round(stats.script_cpu_s, 3),
                        stats.folder)


def summary(state: FoldState) -> ChunkSummary:
    """What meta.json says about the chunks of a finished run."""
    return ChunkSummary(len(state.folded), list(state.dropped), list(state.unreadable))


def refold(perf: str, out: Path, groups: list[SampleGroup], status: Callable[[str], None] | None = None
           ) -> tuple[ParseStats, list[StackRecord] | None]:
    """`report --refold`: fold what is raw. From scratch when every folded chunk is still on
    disk (a --keep-raw run, or a run folded in one piece); on top of the stacks file otherwise,
    adding only the chunks it does not hold (a run cut short). Raw data is kept. With the statistics, the
    records written (None: nothing was left to fold), so that a report need not read them back."""
    stacks = out / runfiles.STACKS
    raw = set(archive.raw_chunks(out, groups))
    try:  # from scratch when that re-creates the file whole: it replaces a damaged one too
        state = FoldState() if foldable_again(stacks, raw) else FoldState.load(stacks)
    except DamagedStacks as e:
        raise QprofError(f"{e}; {NO_RAW}") from None
    folder = ChunkFolder(perf, out, groups, keep_raw=True, state=state, status=status)
    folder.keep_written = True
    archive.release_space(out)  # left by a run that was killed
    stats = folder.finish()
    return stats, folder.written
