"""Fold a run's perf data into its stacks file (stacks.jsonl.gz).

Two folders give the same records: qprof's native folder (collectors.nativefold), one process per CPU
over a recorder's consecutive files, used when it is built; else `perf script`, as below. Each reads a
file as collectors.perfdata.prepare leaves it: with the build-ids of the mappings qprof stamped (both), and
with KSYMBOL records retyped (perf script only: the folder reads them).

`perf script` (symbol resolution, DWARF unwinding) is the expensive part of
turning a capture into stacks, and it is single-threaded. Each perf data file
is cut into time slices with about as many of the targets' samples each
(collectors.perfdata.prepare, in the pass that repairs the file anyway); one
`perf script --time` per slice runs at once per CPU, and each one's text is
folded as it streams in (collectors.perfscript), in this process, by a select
loop: nothing waits for a whole slice and no sample text is held beyond its
slice's distinct stacks.
Slices are merged in time order, so the records, their order and the parse
statistics are those one `perf script` over the whole file gives (checked by
tests/test_folding.py on real captures).
"""

from __future__ import annotations

import codecs
import fcntl
import io
import os
import selectors
import signal
import subprocess
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from qprof import runfiles
from qprof.collectors import debuginfo, mapfiles, nativefold
from qprof.collectors.perf import script_command
from qprof.collectors.perfdata import prepare
from qprof.collectors.perfscript import ParseStats, StreamFolder
from qprof.archive.stacks import Slot, StackKey, StackRecord, add_counts, records, write_stacks
from qprof.archive.model import SampleGroup
from qprof.errors import QprofError
from qprof.probes.children import die_with_parent

Window = tuple[int | None, int | None]  # (first, last) sample time in ns, both included; None: open
# per pid, the windows in which a group's perf data holds that pid's samples: a target that exec'd
# into an image unwound the other way moved to the other group then (collectors.session); absent: always
PidWindows = dict[int, list[list[int | None]]]
_READ = 1 << 20
_PIPE_SIZE = 1 << 20  # fewer wake-ups than the default 64 KiB pipe


def default_jobs() -> int:
    """The CPUs this process may run on."""
    return max(1, len(os.sched_getaffinity(0)))


def time_slices(cuts: list[int]) -> list[Window]:
    """Windows split at the cut times that cover every integer timestamp exactly once.

    The outer ends stay open, so every sample lands in one slice whatever the cuts;
    without cuts there is one open slice."""
    cuts = sorted(set(cuts))
    starts: list[int | None] = [None] + [c + 1 for c in cuts]
    ends: list[int | None] = [*cuts, None]
    return list(zip(starts, ends))


@dataclass(frozen=True)
class SliceSpec:
    """One `perf script` over one time slice of one perf data file."""

    data: Path
    log: Path
    pids: list[int]
    window: Window = (None, None)


def run_slices(perf: str, specs: list[SliceSpec], jobs: int, nice: int = 0
               ) -> list[tuple[list[StackRecord], ParseStats]]:
    """Run the slices, `jobs` at a time, folding each one's output as it arrives; results in `specs` order.
    `nice`: the perf scripts' niceness (probes.children.BACKGROUND_NICE while the targets run)."""
    pending = deque(enumerate(specs))
    running: dict[int, _Running] = {}
    results: list[tuple[list[StackRecord], ParseStats] | None] = [None] * len(specs)
    sel = selectors.DefaultSelector()
    try:
        while pending or running:
            while pending and len(running) < max(1, jobs):
                i, spec = pending.popleft()
                r = running[i] = _Running(perf, spec, nice)
                sel.register(r.fd, selectors.EVENT_READ, i)
            for key, _ in sel.select():
                r = running[key.data]
                if not r.read():
                    sel.unregister(r.fd)
                    del running[key.data]
                    results[key.data] = r.finish()
    finally:
        for r in running.values():
            r.kill()
        sel.close()
    return [res for res in results if res is not None]


def merge(parts: list[tuple[list[StackRecord], ParseStats]]) -> tuple[list[StackRecord], ParseStats]:
    """Records of consecutive slices as one fold of the whole text: same keys summed, first-occurrence order."""
    acc, stats = accumulate(parts)
    return records(acc), stats


def accumulate(parts: list[tuple[list[StackRecord], ParseStats]]) -> tuple[dict[StackKey, Slot], ParseStats]:
    """merge's sums as the accumulator they are made in (archive.stacks.add_counts), for a caller that adds
    them to its own (collectors.chunks) rather than turn them into records and back."""
    acc: dict[StackKey, Slot] = {}
    stats = ParseStats()
    for part, st in parts:
        for r in part:
            add_counts(acc, (r.pid, r.tid, r.comm, r.frames), r.samples, r.period, r.bins, r.span_ns)
        stats.absorb(st)
    return acc, stats


def _intersect(a: Window, b: list[int | None]) -> Window | None:
    lo = max((x for x in (a[0], b[0]) if x is not None), default=None)
    hi = min((x for x in (a[1], b[1]) if x is not None), default=None)
    return None if lo is not None and hi is not None and lo > hi else (lo, hi)


def file_specs(data: Path, log: Path, pids: list[int], jobs: int, windows: PidWindows | None = None
               ) -> list[SliceSpec]:
    """One perf data file's slices: every pid over every time slice, except a pid with windows (it
    exec'd into an image unwound the other way), which is read only inside them."""
    slices = time_slices(prepare(data, jobs, pids, mapfiles.stamps(data.parent)).cuts)
    windows = windows or {}
    free = [p for p in pids if p not in windows]
    specs = [SliceSpec(data, log, free, w) for w in slices] if free else []
    for p in pids:
        for pw in windows.get(p, []):
            specs += [SliceSpec(data, log, [p], w) for s in slices for w in [_intersect(s, pw)] if w is not None]
    return specs


def run_specs(out: Path, groups: list[SampleGroup], jobs: int) -> list[SliceSpec]:
    """The slices of every perf data file of a run, in time order within a file, files in group order."""
    specs = []
    for g in groups:
        for data in runfiles.chunk_files(out, g.perf_data, include_current=True):
            specs += file_specs(data, out / runfiles.perf_log(g.unwind), list(g.pids), jobs, g.windows)
    return specs


def fold_files(perf: str, data: list[Path], log: Path, pids: list[int], jobs: int | None = None,
               windows: PidWindows | None = None, nice: int = 0, kallsyms: Path | None = None,
               context: Path | None = None) -> tuple[dict[StackKey, Slot], ParseStats]:
    """Fold consecutive perf data files of one recorder (a run's chunks, in order): with the native folder
    one process reads them all (kallsyms and the objects' tables read once); with `perf script`, each
    file in `jobs` time slices at once. `kallsyms`: the attach's snapshot (probes.kallsyms), for the
    folder; None: the host's /proc/kallsyms. `context`: the recorder's file before `data[0]` (None: it
    is the first, or gone); each folder process reads the mappings of the file before its own first, so
    a process that exited at a switch keeps its names wherever the files are cut. `perf script` reads
    each file alone: there, such a process's last samples stay `[unknown]`."""
    jobs = default_jobs() if jobs is None else jobs
    folder = nativefold.chosen()
    if folder is None:
        return accumulate([merge(run_slices(perf, file_specs(d, log, pids, jobs, windows), jobs, nice)) for d in data])
    _stamp(data, pids)
    windows = windows or {}
    free = [p for p in pids if p not in windows]
    calls: list[tuple[list[int], Window]] = [(free, (None, None))] if free else []
    calls += [([p], (w[0], w[1])) for p in pids for w in windows.get(p, [])]
    root = debuginfo.cache_root()
    # all started, then read in order: a folder writes its records once it has read its files
    running: list[nativefold.Running] = []
    parts = split_files(data, min(jobs, max(1, sum(map(file_size, data)) // SPLIT_BYTES)))
    before = [context] + [part[-1] for part in parts[:-1]]
    try:
        for ps, w in calls:
            running += [nativefold.Running(folder, part, ps, root, log, w, nice, kallsyms, ctx)
                        for part, ctx in zip(parts, before)]
        return accumulate([r.collect() for r in running])
    finally:
        for r in running:
            r.kill()


# Bytes of perf data a folder process is given at least before the files are split among several: one
# process folds ~1 GB/s of DWARF samples here, and each more pays ~50 ms of CPU to read kallsyms and the
# objects' tables again. An attach's last pass over its two chunks (69 + 21 MB, ngtcp2): one process
# 0.11-0.12 CPU s in 0.08-0.09 s, two 0.17-0.20 CPU s in 0.10-0.12 s.
SPLIT_BYTES = 512 << 20


def _stamp(data: list[Path], pids: list[int]) -> None:
    """The folder reads KSYMBOL records; build-ids a target's mapping needs are stamped into its files."""
    for d in data:
        stamps = mapfiles.stamps(d.parent)
        if stamps:
            prepare(d, 1, pids, stamps)


def serve_files(server: nativefold.Server, data: list[Path]) -> tuple[dict[StackKey, Slot], ParseStats]:
    """fold_files through a folder kept for the recorder (collectors.chunks): its files given in order.
    QprofError for a file it cannot read, nativefold.FolderGone when it is gone."""
    _stamp(data, server.pids)
    return accumulate([server.fold(d) for d in data])


def split_files(data: list[Path], parts: int) -> list[list[Path]]:
    """Consecutive files in at most `parts` runs of about equal size, in order: one folder process each
    (a chunk holds the mappings of its processes, perf writes them again at every switch, and the file
    before each run gives those of a process that exited then), at the price of reading kallsyms and the
    objects' tables once more per process (~60 ms)."""
    parts = max(1, min(parts, len(data)))
    sizes = [file_size(d) for d in data]
    out: list[list[Path]] = [[] for _ in range(parts)]
    total, acc = sum(sizes) or 1, 0
    for d, n in zip(data, sizes):
        out[min(parts - 1, (2 * acc + n) * parts // (2 * total))].append(d)  # by its middle
        acc += n
    return [o for o in out if o]


def file_size(p: Path) -> int:
    """Its size; 0 when it is gone (a chunk dropped or folded meanwhile)."""
    try:
        return p.stat().st_size
    except OSError:
        return 0


def fold_run(perf: str, out: Path, groups: list[SampleGroup], jobs: int | None = None) -> ParseStats:
    """Symbolise and fold every perf data file of a run into its stacks file.

    `jobs`: folder processes at once (default: one per usable CPU); 1 runs one process per
    recorder (the native folder) or per file (perf script), the plain sequential way."""
    parts = [fold_files(perf, runfiles.chunk_files(out, g.perf_data, include_current=True),
                        out / runfiles.perf_log(g.unwind), list(g.pids), jobs, g.windows) for g in groups]
    recs, stats = merge([(records(acc), st) for acc, st in parts])
    write_stacks(out / runfiles.STACKS, recs)
    return stats


class _Running:
    """A running `perf script` slice and the folder its output streams into."""

    def __init__(self, perf: str, spec: SliceSpec, nice: int = 0) -> None:
        self.spec = spec
        self.stats = ParseStats()
        self.folder = StreamFolder(self.stats)
        # what a text-mode pipe does: UTF-8 with replacement, universal newlines
        self._decoder = io.IncrementalNewlineDecoder(codecs.getincrementaldecoder("utf-8")("replace"),
                                                     translate=True)
        with open(spec.log, "ab") as logf:
            # perf reads the debug files qprof fetched or made from its build-id cache (collectors.debuginfo)
            cmd = script_command(perf, spec.data, spec.pids, spec.window, debuginfo.cache_root())
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=logf,
                                         preexec_fn=die_with_parent(signal.SIGKILL, nice))
        assert self.proc.stdout is not None
        self.fd = self.proc.stdout.fileno()
        try:
            fcntl.fcntl(self.fd, fcntl.F_SETPIPE_SZ, _PIPE_SIZE)
        except OSError:
            pass  # above fs.pipe-max-size for this user: the default size works, with more wake-ups

    def read(self) -> bool:
        """Fold what perf wrote since the last read; False at the end of its output."""
        chunk = os.read(self.fd, _READ)
        self.folder.feed(self._decoder.decode(chunk, final=not chunk))
        return bool(chunk)

    def finish(self) -> tuple[list[StackRecord], ParseStats]:
        assert self.proc.stdout is not None
        self.proc.stdout.close()
        _, status, usage = os.wait4(self.proc.pid, 0)  # its CPU (with any children): what folding cost
        self.proc.returncode = rc = os.waitstatus_to_exitcode(status)
        self.stats.script_cpu_s += usage.ru_utime + usage.ru_stime
        if rc != 0:
            tail = self.spec.log.read_text(errors="replace").strip().splitlines()[-1:] or ["no output"]
            raise QprofError(f"perf script failed on {self.spec.data} (exit {rc}): {tail[0]}")
        return self.folder.finish(), self.stats

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.proc.wait()
