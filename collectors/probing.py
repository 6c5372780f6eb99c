"""eBPF probes beside perf: start, stop and record the probe groups in the run archive (probes.json).

The groups (probes/registry.py; each one a package under probes/) say what
they need and how they start; this module runs the ones asked for with
`--probes`, keeps what each printed, and reads what needs no probe at all at
the start and the end of every run: the targets' UDP sockets (buffers, drop
counters), the UDP MIB counters of their namespaces, and the sysctls; sockets
(every second) and the namespaces' qdiscs (queue drops, shaper overlimits;
every 5 s) as first and last seen.

Probe cost is measured, not guessed: BPF run-time statistics are switched on
with BPF_ENABLE_STATS, whose effect ends when its file descriptor closes, so
the global setting cannot outlive qprof even after SIGKILL. The statistics
themselves cost two clock reads per program run (on a VM several times as much
as a BTF tracepoint program), so they are on for 0.1 s in every second, at a
random phase (the packet programs count in windows of their own: a statistics
window tied to the start would always see the whole first one), and the
measured time is scaled to the probes' whole lifetime.

Following (`follow`, an `attach --cgroup` run): every group takes up the targets' new processes
itself, at their birth, and the session hands the processes that appear otherwise to `add_targets`
(probes.follow: how each kind of group learns them). probes.json's `follow` lists what was added
when; a group that cannot follow everything says so once, as an `unavailable` entry.
"""

from __future__ import annotations

import ctypes
import json
import os
import random
import shutil
import subprocess
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

from qprof import archive
from qprof.archive import schema
from qprof.archive.model import (Follow, FollowedPid, GroupCost, NamespaceQueues, ProbeCost, ProbeRecord, ProgramCost, ProgramRecord,
                                 UdpSocket, UnavailableProbe)
from qprof.collectors import procfs
from qprof.collectors import netstat
from qprof.errors import QprofError
from qprof.probes import bpfsys, btf
from qprof.probes.bpftrace import announce
from qprof.probes.children import ProbeProcess
from qprof.probes.follow import TargetsWriter, targets_file
from qprof.probes.group import Context, Findings, ProgramFiles, Unavailable
from qprof.probes.leftovers import owned_prog_ids
from qprof.jsonvalue import Json
from qprof.probes.mapsout import MapTail, read_maps
from qprof.probes.registry import DEFAULT_GROUPS, GROUPS
_SOCKET_COUNTERS = ("rcvbuf", "sndbuf", "drops", "rmem_alloc", "wmem_alloc")
STATS_WINDOW_S, STATS_PERIOD_S = 0.1, 1.0  # BPF run-time statistics duty cycle
STATS_FIRST_S = 0.25  # the first window opens at a random point of this: a sub-second run is measured
QDISC_INTERVAL_S = 5.0
# How often the probes' streamed output is cut back to its last snapshot. Maps keyed by port
# (host-wide drops) gain a key per client port, up to bpftrace's map size cap, so a print can
# reach hundreds of KiB: the window bounds the stream to a few MiB.
COMPACT_S = 10.0


def parse_groups(text: str) -> tuple[str, ...]:
    """`--probes` value: 'default', 'none', or a comma list of groups."""
    text = text.strip()
    if text == "default":
        return DEFAULT_GROUPS
    if text == "none":
        return ()
    groups = tuple(g.strip() for g in text.split(",") if g.strip())
    bad = [g for g in groups if g not in GROUPS]
    if bad or not groups:
        raise QprofError(f"unknown probe group {', '.join(bad) or repr(text)}: use default, none, "
                         f"or a comma list of {', '.join(GROUPS)}")
    return groups


def enable_bpf_stats() -> tuple[int | None, str | None]:
    """(fd, None) while run-time stats are on; (None, reason) when the kernel refuses."""
    try:
        return bpfsys.bpf(bpfsys.ENABLE_STATS, (ctypes.c_uint32 * 4)(bpfsys.STATS_RUN_TIME, 0, 0, 0)), None
    except OSError as e:
        return None, f"BPF_ENABLE_STATS refused: {e.strerror}"


def program_stats(ids: set[int]) -> list[ProgramCost]:
    """run_time_ns/run_cnt of the BPF programs with these ids (bpftool prog show; probes.leftovers.owned_prog_ids
    gives those a process holds)."""
    bpftool = shutil.which("bpftool")
    if bpftool is None or not ids:
        return []
    try:
        r = subprocess.run([bpftool, "prog", "show", "-j"], capture_output=True, text=True, timeout=20)
        progs = json.loads(r.stdout or "[]")
    except (OSError, subprocess.SubprocessError, json.JSONDecodeError):
        return []
    # each program's fields of a ProgramCost, checked against its shape; bpftool leaves the run-time
    # statistics out of a program that never ran with them on: 0
    found = (schema.decode(ProgramCost, p) for p in progs if schema.conforms(p, _PROGRAM_COST)) \
        if isinstance(progs, list) else ()
    return [replace(c, run_time_ns=c.run_time_ns or 0, run_cnt=c.run_cnt or 0) for c in found if c.id in ids]


_PROGRAM_COST = schema.shape_of(ProgramCost)


def program_record(files: ProgramFiles) -> ProgramRecord:
    """A started group's entry in probes.json's `programs`: its files; the rest is added as it runs."""
    return ProgramRecord(output=files.output, script=files.script, mechanism=files.mechanism, object=files.object,
                         config=files.config, series=files.series, timing=files.timing)


class ProbeCollector:
    """Runs the selected probe groups for one attach session."""

    def __init__(self, out: Path, pids: list[int], groups: tuple[str, ...],
                 status: Callable[[str], None], follow: bool = False, kallsyms: Path | None = None) -> None:
        self.out, self.pids, self.groups, self.status = out, list(pids), groups, status
        self.follow, self.kallsyms = follow, kallsyms
        self._added: TargetsWriter | None = None
        self._known = set(self.pids)  # start targets and every pid added
        self.record = ProbeRecord(groups=list(groups))
        self._findings: dict[str, Findings] = {}  # each group's own parts of probes.json, as it started
        self.procs: list[ProbeProcess] = []
        self._stats_fd: int | None = None
        self._stats_since = 0.0  # monotonic time stats were last switched on (or off)
        self._stats_on_s = 0.0  # total time with stats on
        self._stats_next: float | None = None  # monotonic time the next statistics window opens
        self._next_qdiscs = 0.0  # monotonic time of the next qdisc reading
        self._probes_since: float | None = None
        self._sockets: dict[str, UdpSocket] = {}
        self._udp = netstat.UdpSocketTable(self.pids)  # the same list: added targets' sockets too
        self._tails: dict[str, MapTail] = {}
        self._next_compact = time.monotonic() + COMPACT_S

    def poll_sockets(self, final: bool = False) -> None:
        """Track the targets' UDP sockets over the run: buffers and drop counters when first
        and last seen, so sockets opened after the start or closed before the end count too;
        `final` at the start and the stop reads the qdiscs whatever their interval."""
        socks, err = self._udp.read()
        if err:
            self.record.sockets_error = err
        now = round(time.time(), 3)
        for sk in socks:
            key = f"{sk.local} {sk.peer} {sk.pids} {sk.fds}"
            seen = self._sockets.get(key)
            counters: dict[str, int | float | None] = {k: sk.counters.get(k) for k in _SOCKET_COUNTERS}
            if seen is None:
                self._sockets[key] = UdpSocket(fds=sk.fds, first=counters, first_time=now, last=counters,
                                               last_time=now, local=sk.local, peer=sk.peer, pids=sk.pids, port=sk.port)
            else:
                self._sockets[key] = replace(seen, last=counters, last_time=now)
        self.record.sockets = list(self._sockets.values())
        # qdisc counters (tc, ~10 ms) only matter first and last: read every QDISC_INTERVAL_S and at the
        # start and the stop (a namespace that goes with its last target keeps its last reading)
        now_m = time.monotonic()
        if not final and now_m < self._next_qdiscs:
            return
        self._next_qdiscs = now_m + QDISC_INTERVAL_S
        for ns, found in netstat.netns_qdiscs(self.pids).items():
            seen_ns = self.record.qdiscs.setdefault(ns, NamespaceQueues(tuple(found.pids), found.qdiscs,
                                                                        first_time=now))
            seen_ns.last, seen_ns.last_time = found.qdiscs, now

    def _save(self) -> None:
        archive.write_probes(self.out, self.record)

    def _take_findings(self, name: str, findings: Findings) -> None:
        """A group's own parts of probes.json (the bpftrace version, what the crypto group found to
        probe), into the record's fields."""
        self._findings[name] = findings
        if findings.bpftrace_version is not None:
            self.record.bpftrace_version = findings.bpftrace_version
        if findings.crypto is not None:
            self.record.crypto = findings.crypto

    def launch(self) -> None:
        """Snapshot counters and start every probe group (they compile while perf starts)."""
        self.record.before = netstat.snapshot(self.pids)
        self.poll_sockets(final=True)
        if self.follow:
            path = targets_file(self.out)
            self._added = TargetsWriter(path)
            self.record.follow = Follow(path.name)
        self._save()
        ctx = Context(self.out, list(self.pids), self.status, procfs.mapped_objects, follow=self.follow,
                      kallsyms=self.kallsyms)
        for name in self.groups:
            try:
                launched = GROUPS[name].start(ctx)
            except Unavailable as e:
                self._unavailable(name, str(e))
                continue
            self.procs.append(launched.process)
            self.record.programs[name] = program_record(launched.program)
            self._take_findings(name, launched.findings)
            if launched.follow_note:
                self._unavailable(f"{name} following", launched.follow_note)

    def add_targets(self, pids: list[int]) -> None:
        """Make these processes targets of every running group from now on (a pid already followed,
        from the start, an earlier call or its parent's fork, is left as it is). Called by a
        followed session about once a second with the processes new in its cgroup."""
        if not self.follow:
            raise QprofError("add_targets needs a ProbeCollector made with follow=True")
        new = [int(p) for p in dict.fromkeys(pids) if int(p) not in self._known]
        if not new:
            return
        self._known.update(new)
        self.pids += new
        assert self._added is not None
        self._added.add(new)  # the libbpf loaders take them up at their next turn
        announce(new)  # the bpftrace programs at once
        now = round(time.time(), 3)
        assert self.record.follow is not None
        self.record.follow.added += [FollowedPid(p, now) for p in new]

    def followed(self) -> dict[int, int]:
        """The processes that became targets during the run and are counted, so far: pid -> the target
        that forked it (0: given to add_targets), as packetio's last print tells (every second). A pid
        given to add_targets shows once the loader took it up, not before: its datagrams count from then."""
        found = self.live_maps().get("@followed")  # {"pid": parent}, printed by packetio's sampler
        return {int(key): parent for key, parent in found.items() if isinstance(parent, int)} \
            if isinstance(found, dict) else {}

    def tick(self) -> None:
        """Periodic upkeep, at every wake-up of the collector (next_tick: when it is due): duty-cycle the
        BPF run-time statistics (0.1 s windows), and every COMPACT_S compact the probes' streamed output
        so long runs keep it small."""
        now = time.monotonic()
        if now >= self._next_compact:
            self._next_compact = now + COMPACT_S
            for p in self.procs:
                if p.running() and p.started_at is not None:
                    self._tail(p).compact()
        if self._stats_fd is not None and now - self._stats_since >= STATS_WINDOW_S:
            os.close(self._stats_fd)
            self._stats_fd = None
            self._stats_on_s += now - self._stats_since
            self._stats_since = now
        elif self._stats_fd is None and self._stats_next is not None and now >= self._stats_next:
            self._stats_fd, _ = enable_bpf_stats()
            self._stats_since = now
            self._stats_next = now + STATS_PERIOD_S

    def next_tick(self) -> float:
        """When `tick` has work next (CLOCK_MONOTONIC): a statistics window's edge or the compaction."""
        due = self._next_compact
        if self._stats_fd is not None:
            due = min(due, self._stats_since + STATS_WINDOW_S)
        elif self._stats_next is not None:
            due = min(due, self._stats_next)
        return due

    def wait_ready(self, should_stop: Callable[[], bool] = lambda: False) -> None:
        """Wait for every launched group to attach; a group that fails is recorded and dropped.
        Returns early once `should_stop` says so (Ctrl-C while bpftrace compiles)."""
        t0 = time.monotonic()
        for proc in list(self.procs):
            try:
                if not proc.wait_attached(should_stop=should_stop):
                    continue
            except QprofError as e:
                self.procs.remove(proc)
                del self.record.programs[proc.name]
                self._unavailable(proc.name, str(e))
                continue
            prog = self.record.programs[proc.name]
            prog.attach_seconds, prog.started = round(time.monotonic() - t0, 3), time.time()
        if self.follow:  # announced before a bpftrace program attached: told again
            announce(self.pids)
        # cost is measured from here: statistics windows start with the targets' real work
        self._probes_since = self._stats_since = time.monotonic()
        if self.procs:
            fd, why = enable_bpf_stats()  # can the kernel measure? the first window opens soon, at a random phase
            if why:
                self._unavailable("cost", why)
            else:
                assert fd is not None  # enable_bpf_stats gives an fd exactly when it gives no reason
                os.close(fd)
                self._stats_next = self._probes_since + random.uniform(0, STATS_FIRST_S)
        self._save()

    def live_maps(self) -> dict[str, Json]:
        """Every running group's maps as last printed (new output lines only are parsed), not checked:
        each reader checks the maps it reads (traffic.udp_totals, the live view)."""
        maps: dict[str, Json] = {}
        for p in self.procs:
            maps.update(self._tail(p).read())
        return maps

    def _tail(self, p: ProbeProcess) -> MapTail:
        tail = self._tails.get(p.name)
        if tail is None:
            tail = self._tails[p.name] = MapTail(p.output)
        return tail

    def _unavailable(self, probe: str, reason: str) -> None:
        self.record.unavailable.append(UnavailableProbe(probe, reason))
        self.status(f"warning: probe {probe} unavailable: {reason}")

    def stop(self) -> None:
        """Read program costs while they are loaded, stop bpftrace, snapshot counters again."""
        by_group: dict[str, list[ProgramCost]] = {}
        if self._stats_on_s > 0 or self._stats_fd is not None:
            now = time.monotonic()
            on_s = self._stats_on_s + (now - self._stats_since if self._stats_fd is not None else 0.0)
            life = now - (self._probes_since or now)
            scale = life / on_s if on_s > 0 else 1.0

            def total(progs: list[ProgramCost]) -> tuple[int, int]:
                """(run time ns, runs) of these programs."""
                return (sum(int(p.run_time_ns or 0) for p in progs), sum(int(p.run_cnt or 0) for p in progs))

            # each group's programs, those its loader and the loader's children hold
            held = {p.name: owned_prog_ids(set(procfs.descendants(p.proc.pid))) for p in self.procs
                    if p.proc is not None}
            progs = program_stats(set().union(*held.values()))  # one bpftool listing for all the groups
            # per-program figures scaled the same way (crypto's cost model reads them)
            by_group = {name: [replace(x, run_time_ns=round(int(x.run_time_ns or 0) * scale),
                                       run_cnt=round(int(x.run_cnt or 0) * scale))
                               for x in progs if x.id in ids]
                        for name, ids in held.items()}
            t, n = total(progs)
            self.record.cost = ProbeCost(
                bpf_run_cnt=round(n * scale), bpf_run_time_ns=round(t * scale),
                by_group={g: GroupCost(bpf_run_cnt=total(ps)[1], bpf_run_time_ns=total(ps)[0])
                          for g, ps in by_group.items()},
                measured_run_cnt=n, measured_run_time_ns=t,
                method=f"BPF run-time statistics on {STATS_WINDOW_S:g} s in every {STATS_PERIOD_S:g} s, "
                       "scaled to the probes' lifetime",
                probes_s=round(life, 3), programs=progs, stats_on_s=round(on_s, 3))
            if self._stats_fd is not None:
                os.close(self._stats_fd)
                self._stats_fd = None
        elif self._stats_next is not None:
            life = time.monotonic() - (self._probes_since or time.monotonic())
            self._unavailable("cost", f"the probes ran {life:.2f} s, less than the wait for the first "
                                      "run-time statistics window")
        for p in self.procs:
            rc = p.stop()
            prog = self.record.programs[p.name]
            prog.exit, prog.log_tail, prog.cpu_s = rc, p.log_tail() if rc not in (0, None) else "", p.cpu_s
            prog.maps = maps = schema.probe_maps(read_maps(p.output))
            findings = self._findings.get(p.name, Findings())
            GROUPS[p.name].finish(findings, maps, by_group.get(p.name, []), self.status)
            self._take_findings(p.name, findings)
        self.poll_sockets(final=True)
        self._udp.close()
        if self._added is not None:
            self._added.close()
        self.record.after = netstat.snapshot(self.pids)
        if self.procs:
            try:
                reasons = btf.enum("skb_drop_reason")
                self.record.drop_reason_names = {int(v): k.removeprefix("SKB_DROP_REASON_")
                                                 for k, v in reasons.items()}
            except btf.BTFUnavailable as e:
                self._unavailable("drop reason names", str(e))
        self._save()

    def abort(self) -> None:
        """On failure: stop what runs, keep whatever was written."""
        for p in self.procs:
            p.stop()
        self._udp.close()
        if self._added is not None:
            self._added.close()
        if self._stats_fd is not None:
            os.close(self._stats_fd)
            self._stats_fd = None
