"""One attach session: sample the targets until told to stop, then write the run archive.

Order of events, each leaving the archive readable if qprof dies right there:
 1. check privileges, perf and the pids; create the run directory; write
    meta.json with status "collecting" (targets, host, tools, unwinding plan)
 2. start one `perf record` per unwinding mode, enabled through its control FIFO
 3. poll: /proc readings every interval; stop on duration, on every target
    having exited, on Ctrl-C/SIGTERM, or when the caller's condition says so.
    A target that exec'd (a wrapper such as `env`, `taskset` or a shell script
    becoming the real program) is described again, and when its new image wants
    the other unwinding mode its samples are read from then on from a recorder
    in that mode (started if needed): follow_exec
 4. perf writes its data in chunks, folded into stacks.jsonl.gz in the
    background while sampling goes on (collectors.chunks); at the end, stop
    perf (SIGINT: it finishes its last chunk), fold what is left on every CPU
    (collectors.folding), rewrite meta.json as "complete" (or "incomplete"
    with the reason: unfolded chunks stay, `qprof report --refold` adds them)
"""

from __future__ import annotations

import os
import resource
import select
import signal
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Sequence

from qprof import runfiles
from qprof.version import __version__
from qprof import archive
from qprof.archive.identity import is_alive, process_identity
from qprof.collectors import chunks, debuginfo, elf, functions, mapfiles, nativefold, netstat, procfs, sysinfo
from qprof.collectors.perf import DEFAULT_FREQUENCY, DWARF_STACK_BYTES, UNWIND_MODES, PerfRecorder
from qprof.collectors.perfscript import ParseStats
from qprof.collectors.perfcgroup import SampleCgroups, cleanup_leftovers
from qprof.collectors.probing import ProbeCollector
from qprof.collectors.service import Followed, v2_hierarchy
from qprof.archive.model import (STATUS_COLLECTING, STATUS_COMPLETE, STATUS_INCOMPLETE, Image,
                                     LiveData, MappedObject, Meta, PressureSource, ProcReading,
                                     SampleGroup, Sampling, SamplingScope, Service, Target)
from qprof.archive.stacks import SAMPLE_CLOCK
from qprof.collectors.traffic import TrafficRecorder
from qprof.jsonvalue import Json
from qprof.probes import kallsyms
from qprof.probes.registry import DEFAULT_GROUPS
from qprof.errors import QprofError
from qprof.probes.features import (find_hierarchy, kernel_features, pressure_hierarchy, require_perf,
                                   require_sampling_privileges, tool_version)

# The collector sleeps until its next work (a reading, a probe statistics window's edge, the live panel),
# woken at once by a target's or perf's exit (pidfds) or a stop signal. Where a stop condition can only be
# asked (a caller's stop_when, a followed service, a target without pidfd) it asks every POLL_TICK.
# (Waking 20 times a second for the asking was ~0.12 ms of qprof's CPU each, ~2.5 ms a second.)
POLL_TICK = 0.05
MAPS_REREAD_S = 2.0  # s: the longest a target's maps go unread while its size stands still (_new_objects)
SOCKET_INTERVAL = 1.0  # s between socket-table readings (sock_diag dumps, ~0.2 ms each)
DEFAULT_EVENT = "cpu-clock"  # period is in ns: sums are CPU time on every host, VM or not
# A signal repeated within this is one stop delivered twice: `timeout` sends its two copies
# microseconds apart, while a person's second Ctrl-C comes after reading qprof's "stopping"
# line, well over a visual reaction time (~0.2 s) later.
REPEAT_WINDOW_S = 0.5


@dataclass
class AttachOptions:
    pids: list[int]
    out: Path
    duration: float | None = None
    frequency: int = DEFAULT_FREQUENCY
    unwind: str = "auto"  # auto | fp | dwarf
    event: str = DEFAULT_EVENT
    proc_interval: float = 0.25  # s between /proc readings (an exited target keeps its last one)
    roles: dict[int, str] = field(default_factory=dict)
    probes: tuple[str, ...] = DEFAULT_GROUPS  # eBPF probe groups beside sampling (probes.registry)
    scope: str = "auto"  # auto | system | cgroup: how perf's samples are kept to the targets (SCOPES)
    keep_raw: bool = False  # keep every perf data chunk after folding it (collectors.chunks)
    raw_budget: int = chunks.DEFAULT_RAW_BUDGET  # bytes of unfolded chunks before the oldest is dropped
    chunk_bytes: int = chunks.CHUNK_BYTES  # perf data file size at which perf starts a new chunk
    until_idle: float | None = None  # stop once every target that worked has been idle this long (IdleWatch)
    services: list[Service] = field(default_factory=list)  # cgroups followed (--cgroup/--unit: collectors.service)


# cgroup: filtered in the kernel, each target sampled on its own CPU time (collectors.perfcgroup);
# system: every CPU sampled on wall-clock ticks, the targets' samples kept when folding, which
# misplaces work that starts when a target wakes; auto: cgroup when one can be set up, else system
SCOPES = ("auto", "system", "cgroup")


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def choose_unwind(requested: str, exe: MappedObject | None) -> tuple[str, str]:
    """Frame pointers when every frame will have them (cheap, exact); DWARF otherwise.

    A binary built with frame pointers still runs distribution libraries built
    without (glibc's malloc and memcpy, libcrypto): samples there lose their
    callers with frame-pointer unwinding, so a dynamically linked binary gets
    DWARF. Go keeps frame pointers in all its code and rarely leaves it.
    """
    if requested in UNWIND_MODES:
        return requested, "requested with --unwind"
    if requested != "auto":
        raise QprofError(f"unknown unwinding mode {requested!r}: use auto, fp or dwarf")
    if exe is None:
        return "dwarf", "binary unreadable: DWARF unwinding is the safe choice"
    name = Path(exe.path).name
    if exe.go:
        return "fp", f"{name} is a Go binary: Go keeps frame pointers"
    if exe.frame_pointers and not exe.dynamic:
        return "fp", f"{name} is static and keeps frame pointers"
    if exe.frame_pointers:
        return "dwarf", (f"{name} keeps frame pointers but loads shared libraries (glibc, crypto) that "
                         "may not: DWARF unwinding recovers their callers")
    return "dwarf", (f"{name} has no frame pointers ({exe.symbols} symbols): DWARF unwinding "
                     "recovers callers that frame-pointer stacks lose")


def _stack_bytes(mode: str) -> int | None:
    return DWARF_STACK_BYTES if mode == "dwarf" else None


def validate_options(opts: AttachOptions) -> None:
    if not opts.pids and not opts.services:
        raise QprofError("no target: give at least one pid (qprof attach PID...) or a service (--cgroup, --unit)")
    if len(set(opts.pids)) != len(opts.pids):
        raise QprofError("a pid is given twice: list each target once")
    if opts.duration is not None and not (0 < opts.duration <= 7 * 24 * 3600):
        raise QprofError(f"--duration {opts.duration:g} is out of range: give seconds > 0 (at most a week)")
    if opts.scope not in SCOPES:
        raise QprofError(f"unknown sampling scope {opts.scope!r}: use {', '.join(SCOPES)}")
    if not 1 << 20 <= opts.chunk_bytes <= 1 << 40:
        raise QprofError("--chunk-size is out of range: give 1M or more")
    if opts.until_idle is not None and not 0 < opts.until_idle <= 24 * 3600:
        raise QprofError(f"--until-idle {opts.until_idle:g} is out of range: give seconds > 0 (at most a day)")
    if not 1 <= opts.frequency <= 100_000:
        raise QprofError(f"--frequency {opts.frequency} is out of range: give 1..100000 Hz (the default is {DEFAULT_FREQUENCY})")


class AttachSession:
    """Collect one run; `run()` returns the archive path whatever ended the collection."""

    def __init__(self, opts: AttachOptions, *, on_ready: Callable[[], None] | None = None,
                 stop_when: Callable[[], bool | str | None] | None = None,
                 stop_when_exits: Sequence[int] = (),
                 status: Callable[[str], None] | None = None,
                 on_tick: Callable[[LiveData], None] | None = None) -> None:
        """`on_ready` runs once sampling and probes are live (release held targets there); `stop_when`
        ends the run when true (a string is the stop reason): asked every POLL_TICK, or, where it
        changes only when one of the processes `stop_when_exits` exits (a benchmark's client), at
        their exit and the collector's other wake-ups; `on_tick` gets the targets' raw live data about
        once a second while sampling."""
        self.opts = opts
        self.on_tick = on_tick
        self.on_ready = on_ready
        self.stop_when = stop_when
        self.stop_when_exits = list(stop_when_exits)
        self.status = status or (lambda msg: None)
        self.recorders: list[PerfRecorder] = []
        self._kallsyms: Path | None = None  # the snapshot of /proc/kallsyms while the attach runs
        self.probes: ProbeCollector | None = None
        self.traffic: TrafficRecorder | None = None
        self._probe_maps: dict[str, Json] = {}  # the probes' maps as last printed (read once a second)
        self.cgroups: SampleCgroups | None = None
        self.pressure_cgroups: SampleCgroups | None = None  # for PSI, where sampling made none in cgroup v2
        self.symbols = debuginfo.Finder(self.status)  # where each object's function names come from
        self.mapped: mapfiles.MappedFiles | None = None  # the targets' files as they see them (made with the run directory)
        self._mapped_later: dict[int, list[str]] = {}  # per target: objects mapped after it was described
        self._vm_seen: dict[int, tuple[int, float]] = {}  # per target: its size and the time its maps were read
        self.folder: chunks.ChunkFolder | None = None
        self.meta: Meta | None = None  # None until the run directory holds a meta.json
        self._stop_reason: str | None = None
        self._interrupts = 0
        self._last_signal, self._last_signal_at = 0, 0.0
        self._wake_r = self._wake_w = -1  # the collection's sleep is cut short by a byte here (_on_signal)
        self._collecting = True
        self._tearing_down = False
        self._own_cpu0 = _OWN_CPU_COUNTED  # qprof's process since it began (or since the last session ended)
        self._children_cpu0 = _children_cpu()  # every helper program it runs and reaps, from here on
        self._targets_are_children = any(procfs.parent_of(p) == os.getpid() for p in opts.pids)
        self.followed: Followed | None = None
        self._service_of: dict[int, Service] = {}  # a followed cgroup's member -> that cgroup
        self._service_mode: dict[str, str] = {}  # a followed cgroup -> the unwinding of its one recorder

    # -- signals: a Ctrl-C/SIGTERM while collecting ends collection (the run is folded as usual);
    # one that comes after collection ended (while stopping or folding), or a second one, skips
    # folding: the perf data stays and `qprof report --refold` redoes it. The same signal again
    # within REPEAT_WINDOW_S is the same stop delivered twice (`timeout` signals its child and
    # then its process group; service managers do alike), not a person pressing Ctrl-C again.
    def _on_signal(self, signum: int, _frame: object) -> None:
        now = time.monotonic()
        if signum == self._last_signal and now - self._last_signal_at < REPEAT_WINDOW_S:
            return
        self._last_signal, self._last_signal_at = signum, now
        self._interrupts += 1
        self._stop_reason = self._stop_reason or f"interrupted ({signal.Signals(signum).name})"
        if self._wake_w >= 0:
            try:
                os.write(self._wake_w, b"\0")
            except OSError:  # full: a wake-up is pending already
                pass
        if self._tearing_down:
            return  # helpers are being stopped, each with its own time limit
        if self._interrupts > 1 or not self._collecting:
            raise KeyboardInterrupt

    def run(self) -> Path:
        opts = self.opts
        validate_options(opts)
        require_sampling_privileges()
        perf = require_perf()
        for pid in opts.pids:
            procfs.check_pid(pid)
        self._services_at_start()
        out = archive.create_run_dir(opts.out)
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        old_umask = os.umask(0o077)  # the archive is owner-only: it names other people's processes
        try:
            archive.reserve_space(out)
            self._collect(perf, out)
        except KeyboardInterrupt:
            self._abandon(out, "interrupted while writing: stacks folded so far are kept; "
                          "`qprof report --refold` folds the rest")
            raise QprofError(f"interrupted while writing the run: {out} is marked incomplete; "
                             f"`qprof report --refold {out}` folds what was not folded yet") from None
        except BaseException as e:
            reason = str(e) if isinstance(e, QprofError) else f"{type(e).__name__}: {e}"
            self._abandon(out, reason)
            if isinstance(e, OSError):
                raise QprofError(f"writing the run in {out}: {e.strerror or e}; it is marked incomplete, "
                                 "with what was written so far") from None
            raise
        finally:
            self._release_cgroups()
            kallsyms.remove(self._kallsyms)  # valid on this boot only: a later refold reads the host's
            os.umask(old_umask)
            for s, h in old.items():
                signal.signal(s, h)
            for fd in (self._wake_r, self._wake_w):
                os.close(fd)
            self._wake_r = self._wake_w = -1
        return out

    def _abandon(self, out: Path, reason: str) -> None:
        """On any failure or a second interrupt: stop every helper, mark the run incomplete."""
        self._tearing_down = True
        if self.folder is not None:
            self.folder.abort()
        if self.probes is not None:
            self.probes.abort()
        if self.traffic is not None:
            self.traffic.close()
        for r in self.recorders:
            r.stop()
        if self.meta is None:  # nothing collected yet: leave no half-made run directory
            archive.release_space(out)
            try:
                out.rmdir()
            except OSError:
                pass
            return
        self._finish(out, STATUS_INCOMPLETE, reason)

    def _readable(self, pid: int, path: str) -> str | None:
        return self.mapped.readable(pid, path) if self.mapped is not None else None

    def _describe(self, pid: int) -> Target:
        t = procfs.target_info(pid)
        names = procfs.mapped_objects(pid)
        if self.mapped is not None:  # read through the target's view while it lives; perf gets copies
            self.mapped.see(pid)
            self.symbols.add(names, self.mapped.of(pid, names))
        t.objects = [elf.object_info(p, self._readable(pid, p)) for p in names]
        t.role = self.opts.roles.get(pid)
        svc = self._service_of.get(pid)
        t.service = svc.name if svc is not None else None
        return t

    def _services_at_start(self) -> None:
        """The followed cgroups' members become targets, with their cgroup's role."""
        opts = self.opts
        if not opts.services:
            return
        self.followed = Followed(v2_hierarchy(), opts.services)
        for pid, svc in self.followed.start().items():
            self._join(pid, svc)

    def _join(self, pid: int, svc: Service) -> None:
        self._service_of[pid] = svc
        if pid not in self.opts.pids:
            self.opts.pids.append(pid)
        if svc.role is not None:
            self.opts.roles.setdefault(pid, svc.role)

    def _describe_targets(self) -> tuple[list[Target], dict[str, list[int]]]:
        """The targets with their unwinding chosen, and their pids by unwinding mode (one perf each).
        A followed cgroup is sampled by one recorder (perf -G names the cgroup, not its pids): its
        members take the mode most of them want."""
        targets: list[Target] = []
        for pid in self.opts.pids:
            t = self._describe(pid)
            t.unwind, t.unwind_reason = choose_unwind(
                self.opts.unwind, elf.object_info(t.exe, self._readable(pid, t.exe)) if t.exe else None)
            targets.append(t)
        for svc in self.opts.services:
            # every target's unwinding was chosen above (a Target read from an archive may have none)
            modes = [t.unwind for t in targets if t.service == svc.name and t.unwind is not None]
            mode = max(sorted(set(modes)), key=modes.count)  # a tie: "dwarf" sorts first, and recovers more
            self._service_mode[svc.name] = mode
            for t in targets:
                if t.service == svc.name and t.unwind != mode:
                    t.unwind, t.unwind_reason = mode, (f"{mode}, as most processes of {svc.name} want: one "
                                                       f"recorder samples the cgroup ({t.unwind_reason})")
        groups: dict[str, list[int]] = {}
        for t in targets:
            groups.setdefault(str(t.unwind), []).append(t.pid)
        return targets, groups

    def _follow_services(self, out: Path, elapsed: float) -> None:
        """Processes that appeared in a followed cgroup since the last look (a worker forked, replaced
        or moved in) become targets: described, sampled by their cgroup's recorder, probed, counted.
        The folder may then fold chunks written before this look: every pid in them is known."""
        if self.followed is None or self.meta is None:
            return
        looked = time.time()
        joined: list[int] = []
        for pid, svc in self.followed.arrivals().items():
            self._service_of[pid] = svc
            try:
                t = self._describe(pid)
            except (QprofError, OSError):
                continue  # gone before it could be described: a short-lived process
            if not t.exe:
                continue  # a kernel thread, or it exited meanwhile
            self._join(pid, svc)
            t.role, t.joined_s = self.opts.roles.get(pid), round(elapsed, 3)
            mode = self._service_mode[svc.name]
            t.unwind, t.unwind_reason = mode, f"{mode}, as the cgroup {svc.name} it joined"
            group = next((g for g in self.meta.sampling.groups if g.unwind == mode), None)
            if group is not None:
                group.pids.append(pid)
            self.meta.targets.append(t)
            joined.append(pid)
            self.status(f"following pid {pid} ({t.comm}): new in {svc.unit or svc.name}")
        if joined:
            if self.probes is not None:
                self.probes.add_targets(joined)
            if self.traffic is not None:
                self.traffic.follow(joined)
            archive.write_meta(out, self.meta)
        if self.folder is not None:
            self.folder.targets_seen = looked

    @staticmethod
    def _renew(t: Target, fresh: Target) -> None:
        """`t` as described again (its image, libraries, threads); its plan (role, unwinding) kept."""
        t.comm, t.cmdline, t.exe, t.objects, t.threads, t.cgroup = (fresh.comm, fresh.cmdline, fresh.exe,
                                                                      fresh.objects, fresh.threads, fresh.cgroup)

    def _refresh_targets(self, pids: set[int]) -> None:
        """Re-read live targets at the end: libraries loaded since the start; keep the plan."""
        assert self.meta is not None
        for t in self.meta.targets:
            if t.pid in pids and is_alive(t.pid):
                fresh = self._describe(t.pid)
                if fresh.exe:
                    self._renew(t, fresh)

    def _collect(self, perf: str, out: Path) -> None:
        opts = self.opts
        self.mapped = mapfiles.MappedFiles(out, self.symbols.root, self.status)
        targets, groups = self._describe_targets()
        meta = self.meta = Meta(
            status=STATUS_COLLECTING, qprof_version=__version__, host=sysinfo.host_info(),
            tools={"perf": tool_version("perf"), "bpftrace": tool_version("bpftrace")},
            kernel_features=kernel_features(),
            sampling=Sampling(opts.event, opts.frequency, SAMPLE_CLOCK,
                              [SampleGroup(m, p, runfiles.perf_data(m), {}, _stack_bytes(m)) for m, p in groups.items()],
                              opts.chunk_bytes, opts.keep_raw),
            targets=targets, requested_duration_s=opts.duration, probes=list(opts.probes),
            collector=process_identity(os.getpid()), services=list(opts.services))
        archive.write_meta(out, meta)
        self._kallsyms = kallsyms.snapshot(out)  # read once for perf, the waits loader and the folder
        # bpftrace compiles for ~1 s: launch it first, sample meanwhile, then wait for it
        self.probes = ProbeCollector(out, opts.pids, opts.probes, self.status, follow=bool(opts.services),
                                     kallsyms=self._kallsyms)
        self.probes.launch()
        self._perf = perf
        self.traffic = TrafficRecorder(out, opts.pids, self.status)
        self.traffic.start(time.monotonic())
        for mode, pids in groups.items():
            self._start_recorder(out, mode, pids)
        self._pressure_cgroups(out, [p for p in opts.pids if p not in self._service_of])
        self.folder = chunks.ChunkFolder(perf, out, meta.sampling.groups, keep_raw=opts.keep_raw,
                                         raw_budget=opts.raw_budget, status=self.status, kallsyms=self._kallsyms)
        if self.followed is not None:
            self.folder.targets_seen = time.time()  # every member so far is a target
        # names for stripped objects (collectors.debuginfo), looked for in the background as the targets map
        # them: a debuginfod server may take its time, sampling never waits; the folder waits for them
        self.folder.symbols_ready = self.symbols.ready
        self.symbols.add([o.path for t in meta.targets for o in t.objects])
        self.folder.start()
        start = time.monotonic()
        meta.start_time = _now()
        archive.write_meta(out, meta)
        self.probes.wait_ready(should_stop=lambda: self._stop_reason is not None)
        until = (f" for {opts.duration:g} s" if opts.duration else "") + (
            f" until the targets' work ends (idle {opts.until_idle:g} s)" if opts.until_idle is not None else "")
        self.status(f"sampling at {opts.frequency} Hz{until or ' until every target exits'}; Ctrl-C stops")
        if self.on_ready is not None:
            self.on_ready()
        self._poll(out, start)
        self._collecting = False
        self._refresh_targets(set(opts.pids))
        meta.duration_s = round(time.monotonic() - start, 3)
        meta.end_time = _now()
        meta.stop_reason = self._stop_reason
        meta.exited = [p for p in opts.pids if not is_alive(p)]
        self.status(f"stopping ({self._stop_reason})")
        self.probes.stop()
        self._last_reading(out)
        meta.perf_exit = {r.unwind: r.stop() for r in self.recorders}
        meta.perf_cpu_s = {r.unwind: r.cpu_s for r in self.recorders}
        self._release_cgroups()
        mapfiles.keep_jit_maps(out, opts.pids)
        self.status("resolving symbols and folding stacks" + _folder_note())
        assert self.folder is not None
        self.symbols.add([o.path for t in meta.targets for o in t.objects])
        self.symbols.ready.wait()
        meta.symbols = list(self.symbols.found)
        stats = self.folder.finish()
        meta.parse = chunks.parse_summary(stats)
        self._count_cut_stacks(stats)
        meta.chunks = chunks.summary(self.folder.state)
        self._describe_mapped_later()
        try:  # where the sampled functions start, from the files the run mapped: reports need no host file
            functions.write(out, self.folder.state.frames, meta, self._readable)
        except OSError as e:
            self.status(f"function starts not recorded ({e.strerror or e}): pprof addresses read at report time")
        # read after the last work whose CPU they count (the function starts above were missed before)
        meta.qprof_cpu_s = round(_counted_own_cpu() - self._own_cpu0, 3)
        # with no target a child of qprof (attach), what its reaped children used is all helpers'
        if not self._targets_are_children:
            meta.helpers_cpu_s = round(_children_cpu() - self._children_cpu0, 3)
        # perf ends on the SIGINT qprof sends it by raising it again: -SIGINT is a normal stop
        broken = {m: rc for m, rc in meta.perf_exit.items() if rc not in (0, None, -signal.SIGINT)}
        if broken or (self._stop_reason or "").startswith("perf exited"):
            codes = ", ".join(f"{m}: exit {rc}" for m, rc in broken.items()) or "exit 0"
            raise QprofError(f"perf record ended before qprof stopped it ({codes}; "
                             f"{self.recorders[0].log_tail()}): {out} is marked incomplete and keeps "
                             "the samples written until then")
        self._finish(out, STATUS_COMPLETE, None)

    def _count_cut_stacks(self, stats: ParseStats) -> None:
        """How many of each target's DWARF stacks went past the stack copy (the native folder counts
        them; perf script does not say): a user sees which target's stacks lost their callers."""
        assert self.meta is not None
        for t in self.meta.targets:
            need = stats.stack_need.get(t.pid)
            if need is not None and need.stacks:
                t.stacks_unwound, t.stacks_cut = need.stacks, need.truncated

    def _start_recorder(self, out: Path, mode: str, pids: list[int]) -> PerfRecorder:
        opts = self.opts
        rec = PerfRecorder(self._perf, pids, mode, opts.frequency, opts.event,
                           out / runfiles.perf_data(mode), out / runfiles.perf_log(mode),
                           self._sampling_cgroups(pids), switch_output=opts.chunk_bytes, kallsyms=self._kallsyms)
        self.recorders.append(rec)
        self.status(f"starting perf ({mode} unwinding for pid {','.join(map(str, pids))})")
        rec.start()
        return rec

    def _new_objects(self) -> None:
        """Objects a target mapped since it was described (its libraries, once a target held at exec is
        released; a dlopen): their names looked for now, in the background, before the folder needs
        them. Describing them (elf) waits for the end: ~7 ms each, it would delay the readings just
        when a short transfer's sockets open and close."""
        assert self.meta is not None
        for t in self.meta.targets:
            # a mapping made or dropped changes the size: its maps (formatted whole by the kernel, ~0.2 ms
            # a read) are read again then, and every MAPS_REREAD_S (ld.so maps a library's code over
            # its own reservation: a reading between the two sees a size that will not change again)
            size, now = procfs.vm_size(t.pid), time.monotonic()
            seen = self._vm_seen.get(t.pid)
            if size is None or seen is not None and seen[0] == size and now - seen[1] < MAPS_REREAD_S:
                continue
            self._vm_seen[t.pid] = size, now
            later = self._mapped_later.setdefault(t.pid, [])
            known = {o.path for o in t.objects}.union(later)
            new = [p for p in procfs.mapped_objects(t.pid) if p not in known]
            if new:
                later += new
                assert self.mapped is not None
                self.mapped.see(t.pid)
                self.symbols.add(new, self.mapped.of(t.pid, new))

    def _describe_mapped_later(self) -> None:
        for t in self.meta.targets if self.meta is not None else ():
            t.objects += [elf.object_info(p, self._readable(t.pid, p)) for p in self._mapped_later.pop(t.pid, [])]

    def follow_exec(self, out: Path, elapsed: float) -> None:
        """Targets that exec'd since the last look: their identity, objects and unwinding are the
        new image's. When the new image wants the other unwinding mode, its samples are taken from
        a recorder in that mode from now on (started on first need; both sample every CPU), and
        each group records the time window in which it holds the pid's samples."""
        assert self.meta is not None
        for t in self.meta.targets:
            pid = t.pid
            try:
                exe = os.readlink(f"/proc/{pid}/exe")
            except OSError:
                continue  # gone, or a kernel thread
            if exe.removesuffix(" (deleted)") == t.exe:
                continue  # the same image (its file replaced on disk is not an exec)
            fresh = self._describe(pid)
            if not fresh.exe:
                continue
            if not t.images:
                t.images.append(Image(t.exe, t.comm, t.unwind, 0.0))
            self._renew(t, fresh)
            mode, reason = choose_unwind(self.opts.unwind, elf.object_info(fresh.exe))
            t.images.append(Image(fresh.exe, fresh.comm, mode, round(elapsed, 3)))
            self.status(f"pid {pid} exec'd {fresh.exe} ({fresh.comm})")
            if mode != t.unwind:
                if self._move(out, pid, mode):
                    t.unwind, t.unwind_reason = mode, f"{reason} (after it exec'd {Path(fresh.exe).name})"
                else:
                    t.images[-1].unwind = t.unwind
                    t.unwind_reason = (f"{t.unwind_reason}; kept after it exec'd {Path(fresh.exe).name}"
                                       f" (wanted {mode}: --scope cgroup cannot add it to a running recorder)")
            archive.write_meta(out, self.meta)

    def _move(self, out: Path, pid: int, new: str) -> bool:
        """Read `pid`'s samples from the `new` mode's recorder from now on; False if it cannot be."""
        assert self.meta is not None
        groups = self.meta.sampling.groups
        target = next((g for g in groups if g.unwind == new), None)
        if target is None:
            target = SampleGroup(new, [], runfiles.perf_data(new), {}, _stack_bytes(new))
            self._start_recorder(out, new, [pid])
            groups.append(target)  # after its recorder runs: the folding thread may pick it up at once
        elif self.cgroups is not None:
            return False  # that recorder samples fixed cgroups, not this pid's
        now = time.clock_gettime_ns(time.CLOCK_MONOTONIC)  # the samples' clock (perf -k mono)
        for g in groups:
            if pid in g.pids and g is not target:
                spans = g.windows.setdefault(pid, [[None, None]])
                spans[-1][1] = now
        target.windows.setdefault(pid, []).append([now + 1, None])
        if pid not in target.pids:
            target.pids.append(pid)
        return True

    def _sampling_cgroups(self, pids: list[int]) -> list[str] | None:
        """perf -G names that keep sampling to `pids` in the kernel (scope cgroup, or auto when a
        cgroup can be set up), or None for system-wide sampling. Recorded in meta.json's
        sampling.scope: the mode in effect, and with auto the reason it fell back to system."""
        want = self.opts.scope
        assert self.meta is not None
        sampling = self.meta.sampling
        if sampling.scope is None:
            sampling.scope = SamplingScope("system" if want == "system" else "cgroup", want)
        scope = sampling.scope
        if scope.mode == "system":
            return None
        h = find_hierarchy()
        try:
            if h is None:
                raise OSError("no cgroup hierarchy is mounted")
            # a followed cgroup is sampled as it is, nothing moved; a pid of its own gets a child cgroup
            services = list(dict.fromkeys(self._service_of[p].name for p in pids if p in self._service_of))
            if services and h.version != "v2":
                raise OSError(f"perf's cgroups are the v1 perf_event hierarchy at {h.mount}, the followed "
                              f"cgroups are in cgroup v2")
            names = services
            own = [p for p in pids if p not in self._service_of]
            if own:
                if self.cgroups is None:
                    for gone in cleanup_leftovers(h):
                        self.status(f"removed a sampling cgroup left by a killed qprof: {gone}")
                    self.cgroups = SampleCgroups(h)
                names += self.cgroups.place(own)
        except OSError as e:
            if want == "cgroup" or scope.cgroups:
                # a later recorder cannot change mode: its targets' samples would follow another clock
                raise QprofError(f"cannot keep sampling to the targets with a cgroup: {e}; "
                                 "use --scope system") from None
            scope.mode, scope.fallback = "system", str(e)
            self.status(f"sampling system-wide: no cgroup for the targets ({e}); shares of work that "
                        "starts when a target wakes can be off (docs/usage.md: The report)")
            return None
        scope.hierarchy = f"{h.version} {h.mount}"
        scope.cgroups += names
        return names

    def _pressure_cgroups(self, out: Path, pids: list[int]) -> None:
        """Each target's own CPU pressure (PSI): a child cgroup of its own in cgroup v2. The sampling
        children serve where perf's hierarchy is v2; otherwise (a v1 perf_event hierarchy, system-wide
        sampling) the targets get children there for this alone. A child has no controller: nothing
        about how a target runs changes. Recorded in meta.json's `pressure`; where none can be had the
        verdict judges a multi-threaded target's stalls from its run-queue time and says so."""
        assert self.meta is not None
        record = self.meta.pressure = PressureSource()
        h = pressure_hierarchy()
        if h is None:
            record.unavailable = "no cgroup v2 hierarchy with CPU pressure (PSI) is mounted"
        elif not pids:
            record.hierarchy = f"v2 {h.mount} (the followed cgroups' own, shared by their processes)"
        elif self.cgroups is not None and self.cgroups.h.mount == h.mount:
            record.hierarchy = f"v2 {h.mount} (the sampling cgroups)"
        else:
            try:
                for gone in cleanup_leftovers(h):
                    self.status(f"removed a cgroup left by a killed qprof: {gone}")
                self.pressure_cgroups = SampleCgroups(h)
                self.pressure_cgroups.place(pids)
                record.hierarchy = f"v2 {h.mount}"
            except OSError as e:
                record.unavailable = f"cannot give the targets a cgroup of their own in {h.mount}: {e}"
        if record.unavailable:
            self.status(f"no CPU pressure per target: {record.unavailable}; the verdict estimates the stalls "
                        "of multi-threaded targets from run-queue time")
        archive.write_meta(out, self.meta)

    def _release_cgroups(self) -> None:
        for cg in (self.cgroups, self.pressure_cgroups):
            if cg is not None:
                cg.release()
        self.cgroups = self.pressure_cgroups = None

    def _last_reading(self, out: Path) -> None:
        """One reading after the probes stopped: their last print holds the final UDP totals (the one
        before it may be a second old, half of a short transfer), and the sockets closed at the end."""
        assert self.probes is not None and self.traffic is not None
        reading = replace(procfs.reading(self.opts.pids),
                          traffic=self.traffic.finish(time.monotonic(), self.probes.live_maps()))
        with open(out / runfiles.PROC, "a", encoding="utf-8") as procf:
            procf.write(archive.proc_line(reading))

    def _poll(self, out: Path, start: float) -> None:
        opts = self.opts
        next_reading = 0.0
        reading: ProcReading | None = None
        next_sockets = time.monotonic() + 0.2  # early: short transfers open and close sockets fast
        idle = IdleWatch(opts.pids, opts.until_idle) if opts.until_idle is not None else None
        with open(out / runfiles.PROC, "a", encoding="utf-8") as procf, procfs.ExitWatch() as running:
            while True:
                now = time.monotonic()
                if now >= next_reading or self._stop_reason:
                    self._follow_services(out, now - start)
                    self.follow_exec(out, now - start)
                    self._new_objects()
                    mapfiles.keep_jit_maps(out, [p for p in opts.pids if running.alive(p)])  # a private /tmp goes with its process
                    reading = procfs.reading(opts.pids, reading)
                    if self.probes is not None:  # new output lines only: the probes print once a second
                        self._probe_maps = self.probes.live_maps()
                    if self.traffic is not None:
                        reading = replace(reading, traffic=self.traffic.poll(now, self._probe_maps))
                    procf.write(archive.proc_line(reading))
                    procf.flush()
                    next_reading = now + opts.proc_interval
                    if idle is not None:
                        idle.see(reading)
                if self.probes is not None:
                    self.probes.tick()  # its statistics windows' edges are among the wake-ups (next_tick)
                    if now >= next_sockets:
                        self.probes.poll_sockets()
                if now >= next_sockets:
                    next_sockets = now + SOCKET_INTERVAL
                    if self.on_tick is not None and reading is not None:
                        self.on_tick(LiveData(now - start, opts.duration, reading,
                                              self._probe_maps, netstat.softirq_seconds(),
                                              tuple(self.meta.targets if self.meta else ())))
                if self._stop_reason:
                    return
                if opts.duration is not None and now - start >= opts.duration:
                    self._stop_reason = "duration reached"
                elif not any(running.alive(p) for p in opts.pids) and (self.followed is None or
                                                                          self.followed.empty()):
                    self._stop_reason = "every target exited"
                elif idle is not None and idle.ended():
                    self._stop_reason = f"the targets' work ended: idle for {opts.until_idle:g} s (--until-idle)"
                elif self.stop_when is not None and (why := self.stop_when()):
                    self._stop_reason = why if isinstance(why, str) else "stop condition met"
                elif not any(r.running() for r in self.recorders):
                    self._stop_reason = "perf exited: " + self.recorders[0].log_tail()
                else:
                    due = min(next_reading, next_sockets)
                    if self.probes is not None:
                        due = min(due, self.probes.next_tick())
                    if opts.duration is not None:
                        due = min(due, start + opts.duration)
                    self._sleep(running, due)

    def _sleep(self, running: procfs.ExitWatch, until: float) -> None:
        """Sleep until `until` (CLOCK_MONOTONIC), or until a target or perf exits or a stop signal comes
        (POLL_TICK at most where a stop condition can only be asked)."""
        watch = running.waiting([*self.opts.pids, *self.stop_when_exits,
                                 *(r.proc.pid for r in self.recorders if r.proc is not None)])
        if watch is None or (self.stop_when is not None and not self.stop_when_exits) or self.followed is not None:
            until = min(until, time.monotonic() + POLL_TICK)
        timeout = until - time.monotonic()
        if timeout <= 0:
            return
        ready, _, _ = select.select([self._wake_r, *(watch or ())], [], [], timeout)
        if self._wake_r in ready:
            try:
                while os.read(self._wake_r, 64):
                    pass
            except BlockingIOError:
                pass

    def _finish(self, out: Path, status: str, reason: str | None) -> None:
        if self.meta is None:
            return
        self._describe_mapped_later()
        self.meta.status = status
        if reason:
            self.meta.incomplete_reason = reason
        archive.release_space(out)  # a full disk still takes this last small write
        try:
            archive.write_meta(out, self.meta)
        except OSError:
            if status == STATUS_COMPLETE:
                raise
            # meta.json keeps "collecting" with a collector that is gone: readers see "incomplete"


def _folder_note() -> str:
    """What folds, when it is not qprof's own folder: the user should know it is the slow way."""
    try:
        if nativefold.chosen() is not None:
            return ""
    except QprofError as e:  # QPROF_FOLD/QPROF_FOLDER refused: the fold says it again, and fails
        return f" ({e})"
    if os.environ.get("QPROF_FOLD") == "perf-script":
        return " (perf script: QPROF_FOLD)"
    return " (perf script: qprof's native folder is not built; `make setup` builds it)"


IDLE_CORES = 0.02  # a target using less than this share of a core, moving no bytes, is idle


class IdleWatch:
    """When the targets' work has ended (`--until-idle`): every target that was active (CPU over
    IDLE_CORES or bytes moved between two readings) has been idle for `seconds`; a target never
    active does not hold the run open, and nothing ends before some target worked."""

    def __init__(self, pids: list[int], seconds: float) -> None:
        self.pids, self.seconds = pids, seconds
        self._prev: ProcReading | None = None
        self._active_at: dict[int, float] = {}  # pid -> when it was last seen working
        self._now = 0.0

    @staticmethod
    def _cpu(r: ProcReading, pid: int) -> float:
        """CPU seconds so far: schedstat's (ns) where it is on; ticks (10 ms) cannot see an idle timer's."""
        return sum(t.on_cpu_s if t.on_cpu_s is not None else t.utime_s + t.stime_s for t in r.threads.get(pid, []))

    def see(self, r: ProcReading) -> None:
        prev, self._prev, self._now = self._prev, r, r.mono
        if prev is None or r.mono <= prev.mono:
            return
        dt = r.mono - prev.mono
        # the probes' UDP totals arrive once a second and count up to `udp_through`: bytes they show
        # moved by then, not at this reading (taking the reading's time saw the end of a transfer up
        # to a second late)
        udp_at = min(r.mono, r.traffic.udp_through) if r.traffic.udp_through is not None else r.mono
        for pid in self.pids:
            if not r.threads.get(pid):
                continue
            cpu = self._cpu(r, pid) - self._cpu(prev, pid)
            if cpu > IDLE_CORES * dt or r.traffic.tcp.get(pid) != prev.traffic.tcp.get(pid):
                self._active_at[pid] = r.mono
            elif r.traffic.udp.get(pid) != prev.traffic.udp.get(pid):
                self._active_at[pid] = max(self._active_at.get(pid, udp_at), udp_at)

    def ended(self) -> bool:
        return bool(self._active_at) and all(self._now - t >= self.seconds for t in self._active_at.values())


# This process's CPU seconds already charged to a session: a session counts what qprof's process used
# since it began (its interpreter's start and imports are part of observing) or since the previous
# session of the same process (record --repeat) ended.
_OWN_CPU_COUNTED = 0.0


def harness_cpu_done() -> None:
    """What this process used so far was a benchmark's harness (`record` starting its commands, the
    demo writing its payload), not observing: the next session counts from here."""
    _counted_own_cpu()


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _counted_own_cpu() -> float:
    """CPU seconds this process has used, every thread (its children are counted where they are
    reaped), marked as charged."""
    global _OWN_CPU_COUNTED
    r = resource.getrusage(resource.RUSAGE_SELF)
    _OWN_CPU_COUNTED = r.ru_utime + r.ru_stime
    return _OWN_CPU_COUNTED
