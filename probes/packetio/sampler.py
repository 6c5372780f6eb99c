"""The packetio loader: load the programs, run the sampling windows, print what was counted.

Run by qprof as a child (forked, or `python -m qprof.probes.packetio.sampler OBJECT CONFIG_JSON`,
probes.libbpf.LibbpfProcess): it dies with qprof, its programs and links are
its file descriptors. The drop programs stay attached; the per-packet ones are
attached for one window per period (probes/packetio/windows.py), and the gate
in the programs' .bss opens and closes each window at one instant, with the
kernel's UDP counters of every target's network namespace read right around it.

Following (config "follow": true, an `attach --cgroup` run): a target's new process becomes a
target at its birth in the kernel (on_fork), and pids appended to the file config.added names
(probes.follow) are made targets by the add_target program; the loader finds either kind in
`target_slot` before each window's counts are taken and keys them by pid like the start targets.
A target that exits keeps what it counted.

Output, one JSON line each, every second and a last time at SIGINT/SIGTERM:
  {"type": "stats", "data": {"@windows": ...}}  the windows' statistics (windows.WindowStats),
        the namespaces' UDP counter totals over the same span, the hook runs counted
  {"type": "map", "data": {"@udp_drops": {"reason,port": n}, "@udp_queue_fail": ...,
        "@ports": {"pid,port": 1}}}              drops at the targets' ports, their ports
  {"type": "hist", "data": {"@tx_gso_segs": {pid: [{min, max, count}]}, ...}}
        (histograms from the windows only)
  {"type": "map", "data": {"@followed": {pid: parent}, "@follow_stats": {"refused": n}}}  (following:
        the targets added during the run, 0 for a pid the collector added; targets the table had no room for)
"""

from __future__ import annotations

import ctypes
import json
import os
import random
import struct
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from qprof.probes import layout as layouts
from qprof.probes.children import cpu_seconds
from qprof.probes.follow import TargetsReader
from qprof.probes.group import Unavailable
from qprof.probes.libbpf import READY, Loaded, LoaderConfig, Stop, loader_main
from qprof.probes.packetio import timing, windows
from qprof.probes.sockets import snmp_table, udp_ports

HOT = ("send_length", "recv_length", "start_xmit", "copy_datagram")
FOLLOW = ("on_fork", "add_target")  # loaded only when following; add_target is run, never attached
PRINT_S = 1.0


class NetnsCounters:
    """One network namespace's counters the windows are scaled to (windows.AUX): UDP InDatagrams and
    OutDatagrams, IP OutOctets (v4 + v6). Each is counted in the syscall the programs count in
    (udp_recvmsg; udp_send_skb and ip_output), so a window's edges cut both alike whatever waits in
    a socket or qdisc queue. Read through files opened while a member process lived: they keep
    reading that namespace after it exits."""

    def __init__(self, pid: int) -> None:
        self.fds = [os.open(f"/proc/{pid}/net/{name}", os.O_RDONLY) for name in ("snmp", "snmp6", "netstat")]

    def read_raw(self) -> list[bytes]:
        """The files as the kernel formats them now (~100 us here): parse later, off the clock."""
        out = []
        for fd in self.fds:
            os.lseek(fd, 0, os.SEEK_SET)
            parts = []
            while chunk := os.read(fd, 65536):
                parts.append(chunk)
            out.append(b"".join(parts))
        return out

    @staticmethod
    def parse(raw: list[bytes]) -> tuple[int, int, int]:
        """(InDatagrams, OutDatagrams, OutOctets), windows.AUX's order."""
        udp = snmp_table(raw[0].decode("ascii", "replace"), "Udp:")
        ip = snmp_table(raw[2].decode("ascii", "replace"), "IpExt:")
        rx, tx, octets = int(udp.get("InDatagrams", 0)), int(udp.get("OutDatagrams", 0)), int(ip.get("OutOctets", 0))
        for ln in raw[1].decode("ascii", "replace").splitlines():
            k, _, v = ln.partition(" ")
            if k == "Udp6InDatagrams":
                rx += int(v)
            elif k == "Udp6OutDatagrams":
                tx += int(v)
            elif k == "Ip6OutOctets":
                octets += int(v)
        return rx, tx, octets

    def read(self) -> tuple[int, int, int]:
        return self.parse(self.read_raw())


Mib = dict[str, tuple[float, ...]]  # netns -> its counters, windows.AUX's order


@dataclass
class Window:
    """One period's window, kept until the period is known to be over."""

    start: float  # the period's start
    full: bool  # counted the whole period
    length: float  # seconds counted
    groups: dict[str, tuple[str, list[int]]]
    aux: Mib  # per namespace: its counters' deltas in the window


def _aux_delta(before: Mib, after: Mib) -> Mib:
    """Each namespace's counters' growth between two readings."""
    return {ns: tuple(y - x for x, y in zip(before.get(ns, b), b)) for ns, b in after.items()}


class Sampler:
    """The loaded programs, their windows, and what they counted."""

    def __init__(self, obj: Path, config: LoaderConfig, out: TextIO, stop: Stop) -> None:
        self._stop = stop
        self.pids = [int(p) for p in config.pids]  # the targets in the order they became ones
        self.follow = bool(config.follow)
        self.layout = layouts.read(obj)
        initial_limits = self.layout.initial("limits", "limits")  # scalars, each a map's or array's size
        limits = {k: layouts.one(initial_limits, k) for k in initial_limits}
        least = 0 if self.follow else 1  # a followed cgroup may be empty at the start
        if not least <= len(self.pids) <= limits["targets"]:
            raise Unavailable(f"the packetio probes follow {least} to {limits['targets']} targets, not {len(self.pids)}")
        self.limits = limits
        if config.gro_bit is None:
            raise ValueError("the config lacks gro_bit (packetio.PacketioGroup.config reads it from BTF)")
        netns = sorted({int(n) for n in config.netns or []})
        if len(netns) > limits["netns"]:
            netns = []  # more namespaces than the map holds: drops counted in every namespace
        scan = self.layout.struct("config").field("first").count  # a few targets: scanned for, no hash
        rodata = self.layout.section_with(".rodata", "cfg", "config", {
            "first": self.pids if len(self.pids) <= scan and not self.follow else [], "ntargets": len(self.pids),
            "gro_bit": config.gro_bit, "nnetns": len(netns), "follow": int(self.follow)})
        skip: tuple[str, ...] = ("free_skb",) if config.kfree_skb_has_socket else ("free_skb_sk",)
        skip += () if self.follow else FOLLOW
        self.prog = Loaded(obj, rodata, skip)
        # the targets, before anything is attached: their bits, their indexes, their namespaces
        bss = self.prog.global_data(".bss")
        watch = self.layout.variable("watch")
        words = self.layout.struct("watch").field("tgids")
        bits = (ctypes.c_uint64 * words.count).from_buffer(bss, watch.offset + words.offset)
        for i, pid in enumerate(self.pids):
            bits[(pid >> 6) % words.count] |= 1 << (pid & 63)
            self.prog.update("target_slot", struct.pack("<I", pid), struct.pack("<I", i))
        self.pid_at = dict(enumerate(self.pids))  # a target's index -> its pid
        self.followed: dict[int, int] = {}  # targets added during the run -> the process that forked them (0: added)
        self.added = TargetsReader(Path(config.added)) if self.follow and config.added else None
        if self.follow:
            for i in range(len(self.pids), limits["targets"]):  # the indexes the programs may hand out
                self.prog.push("free_slots", struct.pack("<I", i))
            follow_var = self.layout.variable("follow")
            fst = self.layout.struct("follow")
            parents = fst.field("parent")
            self._parents = (ctypes.c_uint32 * parents.count).from_buffer(bss, follow_var.offset + parents.offset)
            self._refused = ctypes.c_uint64.from_buffer(bss, follow_var.offset + fst.field("refused").offset)
        for n in netns:
            self.prog.update("target_netns", struct.pack("<I", n), struct.pack("<I", 1))
        self.out = out
        self.counts = self.layout.struct("counts")
        self.slot = self.layout.struct("slot")
        self.events_struct = self.layout.struct("events")
        if self.prog.maps["events"].value_size != 8 * len(self.events_struct.fields):
            raise Unavailable("the events map's value is not the u64 fields the loader sums")
        self.hists = self.layout.struct("hists")
        self.steps = self.layout.initial("steps", "hist_steps")
        bss, base = self.prog.global_data(".bss"), self.layout.variable("ctl").offset
        control = self.layout.struct("control")
        self._gate = ctypes.c_uint32.from_buffer(bss, base + control.field("gate").offset)
        ports = control.field("ports")
        self._ports = (ctypes.c_uint64 * ports.count).from_buffer(bss, base + ports.offset)
        # the messages' timing (timing.py): the ring in .bss, counted while the flag is set
        self._timing = ctypes.c_uint32.from_buffer(bss, base + control.field("timing").offset)
        self.drainer: timing.Drainer | None = None
        if config.timing:
            ring_var, ring = self.layout.variable("tim"), self.layout.struct("timing").field("n")
            bins = ring.size // 8  # [targets][2][bins] of u32
            ring_words = (ctypes.c_uint32 * (ring.count * 2 * bins)).from_buffer(bss, ring_var.offset)

            def take(t: int, d: int, i: int, j: int) -> list[int]:
                """Bins i..j-1 of one row, zeroed as read (a message counted in between is lost: rare)."""
                a = (t * 2 + d) * bins
                out: list[int] = ring_words[a + i:a + j]
                ctypes.memset(ctypes.addressof(ring_words) + 4 * (a + i), 0, 4 * (j - i))
                return out

            shift = layouts.one(self.layout.initial("timing_cfg", "timing_cfg"), "shift")
            # the ring's rows: the first targets' (limits.timed); the others' messages are counted, not timed
            self.drainer = timing.Drainer(Path(config.timing), self.pids[:ring.count], shift, bins, take)
            self.timed_rows = ring.count
        self.mib_start: Mib = {}
        self.mib_frame_end: Mib = {}
        self.netns: dict[str, NetnsCounters] = {}
        self.netns_of: dict[int, str] = {}
        self.netns_pids: dict[str, list[int]] = {}
        for pid in self.pids:
            self._place(pid)
        self.stats = windows.WindowStats(tuple(self.counts.fields))
        self.cumulative: dict[tuple[int, int], list[int]] = {}
        self._events_seen = [0] * len(self.events_struct.fields)
        self.known_ports: set[int] = set()
        self.rng = random.Random(int.from_bytes(os.urandom(8), "little"))
        # windows.budget_scale over the window decisions: a sum and a minimum, constant size on long runs
        self.scale_sum, self.scale_n, self.scale_min = 0.0, 0, 1.0
        self.overruns = 0  # whole-period windows whose hooks passed windows.overran (ended at that check)
        self._check_s = windows.CHECK_S  # the wait to the next overrun check (windows.next_check), across periods
        self._pending: Window | None = None  # the last window, until its period is known to be over
        self.through: float | None = None  # CLOCK_MONOTONIC end of the last committed period: what the sums cover

    @property
    def stop(self) -> bool:
        return self._stop.requested

    def _place(self, pid: int, parent: int = 0) -> None:
        """A target's network namespace, its counters opened if it is new to the run. A followed
        process gone before the loader saw it is placed in its parent's (a fork keeps the namespace)."""
        try:
            ns = os.readlink(f"/proc/{pid}/ns/net")
            if ns not in self.netns:
                self.netns[ns] = NetnsCounters(pid)
                if self.mib_start:  # mid-run: its totals run from here
                    self.mib_start[ns] = self.mib_frame_end[ns] = self.netns[ns].read()
        except OSError:
            ns = self.netns_of.get(parent, "")
            if not ns:
                return  # gone already: its counts, if any, are estimated without the kernel's
        self.netns_of[pid] = ns
        self.netns_pids.setdefault(ns, []).append(pid)

    # -- following

    def _register(self, pid: int, index: int, parent: int) -> None:
        """A target added during the run, keyed by pid in every output as the start targets are."""
        self.pids.append(pid)
        self.pid_at[index] = pid
        self.followed[pid] = parent
        self._place(pid, parent)
        if self.drainer is not None and index < self.timed_rows:
            rows = self.drainer.pids
            rows += [0] * (index + 1 - len(rows))
            rows[index] = pid

    def follow_turn(self) -> None:
        """Add the pids the collector appended since the last turn, then take up every target the
        programs added (forks) or these calls did: before each window's counts are read, so a new
        target's first counts are its own group's, in its namespace."""
        if not self.follow:
            return
        for pid in self.added.new() if self.added is not None else []:
            self.prog.call("add_target", struct.pack("<Ii", pid, -1))  # a full table: counted as refused
        got = self.prog.batch("target_slot")
        if got is not None:
            n, keys, values = got
            pairs = [(struct.unpack_from("<I", keys, 4 * i)[0], struct.unpack_from("<I", values, 4 * i)[0])
                     for i in range(n)]
        else:
            pairs = [(struct.unpack_from("<I", k)[0], struct.unpack_from("<I", v[0])[0])
                     for k, v in self.prog.entries("target_slot")]
        for pid, index in sorted(pairs, key=lambda p: p[1]):  # a child after its parent
            if index not in self.pid_at:
                self._register(pid, index, int(self._parents[index]))

    # -- kernel state

    def mibs(self) -> Mib:
        return {ns: c.read() for ns, c in self.netns.items()}

    def set_timing(self, on: bool) -> None:
        """Bin the messages' times (windows of timing.MIN_WINDOW_S or more) or stop."""
        if self.drainer is None:
            return
        if on and not self._timing.value:
            self._timing.value = 1
            self.drainer.start(time.monotonic_ns())
        elif not on and self._timing.value:
            self._timing.value = 0
            self.drainer.stop(time.monotonic_ns())

    def drain_timing(self) -> None:
        if self.drainer is not None and self._timing.value:
            self.drainer.drain(time.monotonic_ns())

    def flip_gate(self, value: int) -> tuple[float, Mib]:
        """Open or close the window, and the namespaces' counters at that instant: read before and
        after, interpolated to the flip. (One read takes ~100 us, a window can be 2 ms: a counter
        read on one side only would count ~2% more than the programs did.)"""
        t0 = time.monotonic()
        before = {ns: c.read_raw() for ns, c in self.netns.items()}
        t1 = time.monotonic()
        self._gate.value = value
        tg = time.monotonic()
        after = {ns: c.read_raw() for ns, c in self.netns.items()}
        t2 = time.monotonic()
        mid1, mid2 = (t0 + t1) / 2, (tg + t2) / 2
        f = (tg - mid1) / (mid2 - mid1) if mid2 > mid1 else 0.5
        out: Mib = {}
        for ns in self.netns:
            a, b = NetnsCounters.parse(before[ns]), NetnsCounters.parse(after[ns])
            out[ns] = tuple(x + (y - x) * f for x, y in zip(a, b))
        return tg, out

    def watch_ports(self) -> None:
        """Tell the drop programs the targets' ports (those the per-packet programs saw are set already)."""
        for pid in self.pids:
            for port in set(udp_ports(pid).values()) - self.known_ports:
                self.known_ports.add(port)
                self._ports[port >> 6] |= 1 << (port & 63)
                try:
                    self.prog.update("port_owner", struct.pack("<I", port), struct.pack("<I", pid))
                except Unavailable:
                    pass  # the map is full: the port's drops are counted, its owner is not named

    def _read_counts(self) -> dict[tuple[int, int], list[int]]:
        """Every thread's cumulative counts: the hash plus what CPUs' slots still hold."""
        names = list(self.counts.fields)
        totals: dict[tuple[int, int], list[int]] = {}
        for key, per_cpu in self.prog.entries("threads"):
            pid, tid = struct.unpack_from("<II", key)
            acc = totals.setdefault((pid, tid), [0] * len(names))
            for v in per_cpu:
                d = self.counts.decode(v)
                for i, n in enumerate(names):
                    acc[i] += layouts.one(d, n)  # the counts are u64 scalars
        key_f, c_f = self.slot.field("key"), self.slot.field("c")
        for _, per_cpu in self.prog.entries("slots"):
            for v in per_cpu:
                pid, tid = struct.unpack_from("<II", v, key_f.offset)
                if not pid:
                    continue
                d = self.counts.decode(v, c_f.offset)
                acc = totals.setdefault((pid, tid), [0] * len(names))
                for i, n in enumerate(names):
                    acc[i] += layouts.one(d, n)
        return totals

    def _read_events(self) -> list[int]:
        return self.prog.summed_u64s("events")  # one lookup (~10 us): the map walk took ~0.3 ms

    def targets_cpu(self) -> dict[int, float]:
        """CPU seconds of each target still there (windows.budget_scale's input)."""
        return {p: c for p in self.pids if (c := cpu_seconds(p)) is not None}

    def hook_runs(self) -> int:
        """Hook runs (any task) since the last call: what the next window's length is decided on."""
        ev = self._read_events()
        runs = sum(ev) - sum(self._events_seen)
        self._events_seen = ev
        return runs

    def window_deltas(self) -> dict[str, tuple[str, list[int]]]:
        """Counts since the last call per thread ("pid,tid") and per process ("pid")."""
        self.follow_turn()
        now = self._read_counts()
        # every target is a group from the start, counts or not: a silent one is estimated too
        groups: dict[str, tuple[str, list[int]]] = {
            str(pid): (self.netns_of.get(pid, ""), [0] * len(self.counts.fields)) for pid in self.pids}
        for (pid, tid), acc in now.items():
            before = self.cumulative.get((pid, tid))
            delta = [a - b for a, b in zip(acc, before)] if before else list(acc)
            ns = self.netns_of.get(pid, "")
            groups[f"{pid},{tid}"] = (ns, delta)
            proc = groups.setdefault(str(pid), (ns, [0] * len(delta)))[1]
            for i, v in enumerate(delta):
                proc[i] += v
        self.cumulative = now
        return groups

    # -- output

    def snapshot(self, final: bool = False) -> None:
        frame_end = self.mib_frame_end or self.mib_start
        zero = (0.0,) * len(windows.AUX)
        netns = {ns: {"pids": self.netns_pids.get(ns, []),
                      **{name: b - a for name, a, b in zip(windows.AUX, self.mib_start.get(ns, zero),
                                                           frame_end.get(ns, zero))}}
                 for ns in self.netns}
        data = {**self.stats.to_json(), "netns": netns, "final": final,
                **({"through_mono": round(self.through, 6)} if self.through is not None else {}),
                **({"timing": {"lost_bins": self.drainer.lost_bins, "write_errors": self.drainer.write_errors}}
                   if self.drainer is not None else {}),
                "events": dict(zip(self.events_struct.fields, self._events_seen)),
                "budget": {"cpu_share": windows.CPU_BUDGET, "event_cost_ns": windows.EVENT_COST_S * 1e9,
                           "period_s": windows.PERIOD_S, "overruns": self.overruns,
                           **({"scale_mean": round(self.scale_sum / self.scale_n, 3),
                               "scale_min": round(self.scale_min, 3)} if self.scale_n else {})}}
        lines = [{"type": "stats", "data": {"@windows": data}}]
        maps: dict[str, dict[str, int]] = {}
        for m, name in (("udp_drops", "@udp_drops"), ("udp_queue_fail", "@udp_queue_fail")):
            for key, per_cpu in self.prog.entries(m):
                a, b = struct.unpack_from("<iI", key)
                maps.setdefault(name, {})[f"{a},{b}"] = sum(struct.unpack_from("<Q", v)[0] for v in per_cpu)
        owners = {struct.unpack_from("<I", k)[0]: struct.unpack_from("<I", v[0])[0]
                  for k, v in self.prog.entries("port_owner")}
        maps["@ports"] = {f"{pid},{port}": 1 for port, pid in sorted(owners.items())}
        if self.follow:
            maps["@followed"] = {str(pid): parent for pid, parent in self.followed.items()}
            maps["@follow_stats"] = {"refused": int(self._refused.value)}
        lines += [{"type": "map", "data": {name: m}} for name, m in sorted(maps.items())]
        hists: dict[str, dict[str, list[dict[str, int]]]] = {f"@{n}": {} for n in self.hists.fields}
        for key, per_cpu in self.prog.entries("hists"):
            (t,) = struct.unpack_from("<I", key)
            if t not in self.pid_at:
                continue
            for name in self.hists.fields:
                counts = [0] * self.hists.fields[name].count
                for v in per_cpu:
                    counts = [c + x for c, x in zip(counts, self.hists.field(name).values(v))]
                width, last = layouts.one(self.steps, name), len(counts) - 1
                buckets = [{"min": b * width, "max": (b + 1) * width - 1 if b < last else b * width, "count": c}
                           for b, c in enumerate(counts) if c]
                if buckets:
                    hists[f"@{name}"][str(self.pid_at[t])] = buckets
        lines += [{"type": "hist", "data": {name: h}} for name, h in hists.items()]
        for obj in lines:
            self.out.write(json.dumps(obj, separators=(",", ":")) + "\n")
        self.out.flush()

    # -- the windows

    def _sleep_until(self, t: float, wake: int) -> None:
        self._stop.sleep_until(t, wake)

    def _count_whole(self, end: float, opened: float, budget_events_s: float, wake: int) -> tuple[int, bool]:
        """Wait for the end of a whole-period window, checking the hook rate (windows.next_check says how
        often): (hook runs so far, whether they overran the budget and the period ends now)."""
        runs = 0
        while not self.stop:
            now = time.monotonic()
            if now >= end:
                break
            self._sleep_until(min(end, now + self._check_s), wake)
            new = self.hook_runs()
            runs += new
            looked = time.monotonic()
            if windows.overran(runs, looked - opened, budget_events_s):
                self.overruns += 1
                self._check_s = windows.CHECK_S
                return runs, True
            self._check_s = windows.next_check(self._check_s, new, looked - now, budget_events_s)
        return runs, False

    def _commit(self, end: float, end_mib: Mib, uncounted_from: float | None = None) -> None:
        """The pending window's period ends at `end`: add it to the statistics. `uncounted_from`: a
        later period's start since which the gate was closed (a stop before that period's window).
        A sampled window's period then ends there: the window was drawn from that period alone, and
        stretching it to the stop weighed the window by time it could not have fallen in (a transfer
        ending before the stop read up to 1.5x too fast over its last period); the time after is left
        to the namespace's counters (probes.packetio.estimate's regression). A whole-period window counted
        only its own period of the extended one: the run is then sampled, never exact."""
        pending = self._pending
        if pending is not None:
            gap_from = uncounted_from if uncounted_from is not None and uncounted_from > pending.start else None
            if gap_from is not None and not pending.full:
                end = min(end, gap_from)  # a stop in the wait for that period's start: not begun
            period = max(end - pending.start, pending.length)
            counted = period if pending.full else pending.length
            if gap_from is not None and pending.full:
                counted = min(period, gap_from - pending.start)
            zero = (0.0,) * len(windows.AUX)
            before = {ns: tuple(b - a for a, b in zip(self.mib_start.get(ns, zero), self.mib_frame_end.get(ns, zero)))
                      for ns in self.mib_frame_end}
            self.stats.add_window(period, counted, pending.groups, pending.aux, before)
            self.mib_frame_end = end_mib
            self._pending = None
            self.through = end

    def run(self, wake: int) -> None:
        """Windows until told to stop. A period's statistics are committed when the next window
        opens (the period is over then), or at the stop (see _commit for a stop between windows)."""
        prog = self.prog
        prog.attach(n for n in prog.programs if n not in HOT and n != "add_target")
        self.watch_ports()
        prog.attach(HOT)
        if self.drainer is not None:
            self.drainer.open()
        self.set_timing(True)  # the first period is counted whole
        opened, mib_a = self.flip_gate(1)
        self.mib_start = mib_a
        self.out.write(READY + "\n")
        self.out.flush()
        t0 = start = opened  # the period's start; the open window's start
        cpu_at, cpu = opened, self.targets_cpu()
        P = windows.START_PERIOD_S
        counting, w = True, P  # the first period is counted whole
        scale = 1.0  # the whole budget until the targets' CPU is known
        budget_events_s = windows.budget_rate(scale)
        self._pending = None
        next_print = start + PRINT_S

        while not self.stop:
            self.follow_turn()
            mib_s = self.mibs()
            runs, early = 0, False
            if w >= P:  # the window is the whole period
                self.set_timing(True)
                if not counting:
                    prog.attach(HOT)
                    opened, mib_a = self.flip_gate(1)
                    counting = True
                self._commit(start, mib_s)
                runs, early = self._count_whole(start + P, opened, budget_events_s, wake)
            else:
                self._sleep_until(start + self.rng.uniform(0, P - w) - 0.0005, wake)  # attaching: ~0.3 ms
                if self.stop:
                    break
                self.set_timing(w >= timing.MIN_WINDOW_S)
                prog.attach(HOT)
                self._commit(start, mib_s)
                opened, mib_a = self.flip_gate(1)
                counting = True
                self._sleep_until(opened + w, wake)
            # the window ends: decide the next one before closing, so nothing is counted in between
            runs += self.hook_runs()
            now = time.monotonic()
            if now - cpu_at >= windows.SCALE_SPAN_S:  # else the last scale stays
                cpu_now = self.targets_cpu()  # a target that exited meanwhile counts no more
                scale = windows.budget_scale(sum(c - cpu[p] for p, c in cpu_now.items() if p in cpu),
                                             now - cpu_at, len(cpu_now))
                cpu_at, cpu = now, cpu_now
            self.scale_sum, self.scale_n, self.scale_min = \
                self.scale_sum + scale, self.scale_n + 1, min(self.scale_min, scale)
            budget_events_s = windows.budget_rate(scale)
            P_next, w_next = windows.next_window(runs, now - opened, now - t0, budget_events_s)
            if w < P or w_next < P_next or self.stop:
                closed, mib_b = self.flip_gate(0)
                self.set_timing(False)
                counting = False
            else:
                closed, mib_b = time.monotonic(), self.mibs()
            self._pending = Window(start, w >= P, closed - opened, self.window_deltas(), _aux_delta(mib_a, mib_b))
            nxt = time.monotonic() if early else max(start + P, time.monotonic())  # early: the period ends here
            opened, mib_a, w, P = closed, mib_b, w_next, P_next
            if not counting:
                prog.detach(HOT)
            self.drain_timing()
            if self.stop:
                break
            self._sleep_until(nxt, wake)
            start = nxt
            if time.monotonic() >= next_print:
                next_print = max(next_print + PRINT_S, time.monotonic())
                self.watch_ports()
                self.snapshot()
        # stopping. A gate still open (the stop came between two whole-period windows) counted this
        # period whole up to now: its own window. Else the last window's period ends at the stop, or at
        # its own end when the stop came in the wait for the next window: what came after was not counted.
        # A whole-period window is then extended to the stop, partial: never exact with datagrams it missed.
        if counting:
            closed, mib_b = self.flip_gate(0)
            self.set_timing(False)
            self._commit(start, mib_a)
            self._pending = Window(start, True, closed - opened, self.window_deltas(), _aux_delta(mib_a, mib_b))
        self._gate.value = 0
        self.set_timing(False)
        if self.drainer is not None:
            self.drainer.close()
        prog.detach(HOT)
        end_mib = self.mibs()
        self._commit(time.monotonic(), end_mib, uncounted_from=start)
        self.mib_frame_end = end_mib
        self.snapshot(final=True)


def main(argv: list[str]) -> int:
    return loader_main(argv, "qprof.probes.packetio.sampler", Sampler, (layouts.LayoutError,))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
