"""The waits loader: load the programs, seed the targets' threads, print their time every second.

Run by qprof as a child (forked, or `python -m qprof.probes.waits.loader OBJECT CONFIG_JSON`,
probes.libbpf.LibbpfProcess): it dies with qprof, its programs and maps are its
file descriptors. CONFIG_JSON: {"pids": [...], "stack_interval_ms": 10, "preempt_from_rq": N,
"series": PATH} (probes/waits/__init__.py: where the CPU's preempt count sits from its runqueue; 0:
unknown; PATH: where to write the wall clock per 100 ms, probes/waits/series.py; absent: none).

Start: the fork and exit programs are attached first, then every existing thread of the
targets is written into `threads` as UNKNOWN since the start (CLOCK_MONOTONIC, the clock of
bpf_ktime_get_ns), then the scheduler programs are attached and the READY line printed.
Output, one JSON line every second and a last one at SIGINT/SIGTERM (after detaching, so the
last is consistent): {"type": "map", "data": {...}} with the maps probes/waits/maps.py reads.
Each thread's open interval is closed in the output at the print's time (not in the map): ON ->
on_cpu, RUNNABLE -> runnable, BLOCKED -> its provisional kind, UNKNOWN (no event since the
start) -> /proc's state for it (R: on_cpu, anything else: other; also in "@wait_unknown").

Following (config "follow": true, with "added": the file probes.follow names): pids appended there
are made targets at the loader's next turn (at most PRINT_S later, or a series bin), their threads
seeded as UNKNOWN since then. A target's new threads and processes are followed from their fork
whatever the config (on_fork). Exited threads keep their totals in the output.

The series (with "series" in the config): at every 100 ms edge of CLOCK_MONOTONIC the loader reads
`threads` again and appends one line to PATH, per process the time its threads spent per state
since the previous edge (series.Binner; the format in series.py), each line one write(2) to a file
opened O_APPEND, so a kill leaves whole lines and at most one cut last line. A write that fails
(a full disk) is counted ("series_write_errors") and the maps go on. The prints follow a cut, so
a slow print (the first, which names the stacks) has a whole bin before the next edge; a cut made
more than a bin late is one line for its bins ("series_late_cuts"). What the reads cost is
measured here: "series_cpu_s" in "@wait_stats" (this thread's CPU time in them).

Stacks are named here, once per stack id (ids are stable: the stack map never replaces an
entry): kernel frames from the attach's kallsyms snapshot (probes.kallsyms; config "kallsyms", else
/proc/kallsyms) as `name_[k]`, user frames as
`[object+0xOFFSET]` (the mapped file's name and the file offset of the address, from the
target's /proc/PID/maps), since the probes layer may not use the collectors' ELF readers:
naming functions is the report's.
"""

from __future__ import annotations

import bisect
import ctypes
import json
import os
import struct
import sys
import time
from pathlib import Path
from typing import Iterable, Mapping, TextIO

from qprof.probes import layout as layouts
from qprof.probes.kallsyms import PROC_KALLSYMS, UNKNOWN_FRAME, KernelSymbols
from qprof.probes.btf import ENUM
from qprof.probes.children import cpu_seconds
from qprof.probes.follow import TargetsReader
from qprof.probes.group import Unavailable
from qprof.probes.libbpf import READY, Loaded, LoaderConfig, Stop, loader_main
from qprof.probes.waits.maps import STATES
from qprof.probes.lines import LineFile
from qprof.probes.waits.series import BinLine, Binner, SeriesHeader

PRINT_S = 1.0
COMM_READS = 5  # a thread's name is read at its first prints (renamed just after its start, then kept)
TRACKING = ("on_fork", "on_exit")  # attached before the threads are listed: none is missed
CALLED = ("watch_tid",)  # run by the loader (BPF_PROG_RUN), never attached
BPF_NOEXIST = 1
# kernel frames of the probe itself, above __schedule (the tracepoint's caller) in every stack
_PROBE_FRAMES = ("bpf_", "__bpf_", "__traceiter_", "trace_")



def _enum(lay: layouts.ObjectLayout, name: str, prefix: str) -> list[str]:
    """An enum of the object's BTF as lower-case names in value order, its prefix removed."""
    for i in lay.btf.ids(ENUM, name):
        items = sorted(lay.btf.enumerators(i).items(), key=lambda kv: kv[1])
        return [k.removeprefix(prefix).lower() for k, _ in items]
    raise layouts.LayoutError(f"the object defines no enum {name}")


def _pack(st: layouts.Struct, values: dict[str, int]) -> bytes:
    """A struct's bytes with these fields set (the others zero)."""
    buf = bytearray(st.size)
    for key, value in values.items():
        f = st.field(key)
        fmt = "<" + {1: "b", 2: "h", 4: "i", 8: "q"}[f.size]
        fmt = fmt if f.signed or int(value) < 0 else fmt.upper()
        struct.pack_into(fmt, buf, f.offset, int(value))
    return bytes(buf)


def proc_state(pid: int, tid: int) -> str:
    """A thread's state letter from /proc (R, S, D, ...); '' when it is gone."""
    try:
        with open(f"/proc/{pid}/task/{tid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0].decode("ascii", "replace")
    except (OSError, IndexError):
        return ""


def thread_name(pid: int, tid: int) -> str | None:
    """A thread's comm from /proc; None when it is gone."""
    try:
        with open(f"/proc/{pid}/task/{tid}/comm", "rb") as f:
            return f.read().strip().decode("utf-8", "replace")
    except OSError:
        return None


def thread_ids(pid: int) -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task") if t.isdigit()]
    except OSError:
        return []


class UserMaps:
    """One process's file mappings (/proc/PID/maps), read again when an address falls outside them."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.generation = -1  # the print that last read the maps again
        self.outside: set[int] = set()  # addresses outside every mapping at a reading made after them
        self._starts: list[int] = []
        self._maps: list[tuple[int, int, int, str]] = []  # start, end, file offset, object name
        self.read()

    def read(self) -> None:
        maps = []
        try:
            with open(f"/proc/{self.pid}/maps", "rb") as f:
                for line in f:
                    parts = line.split(None, 5)
                    if len(parts) < 5:
                        continue
                    lo, _, hi = parts[0].partition(b"-")
                    path = parts[5].strip().decode("utf-8", "replace") if len(parts) > 5 else ""
                    obj = path.rsplit("/", 1)[-1].removesuffix(" (deleted)").strip("[]").replace(";", ":")
                    maps.append((int(lo, 16), int(hi, 16), int(parts[2], 16), obj))
        except (OSError, ValueError):
            return  # gone: the last reading stays
        maps.sort()
        self._maps = maps
        self._starts = [m[0] for m in maps]

    def find(self, addr: int) -> str | None:
        i = bisect.bisect_right(self._starts, addr) - 1
        if i < 0:
            return None
        start, end, off, obj = self._maps[i]
        if addr >= end:
            return None
        return f"[{obj}+{addr - start + off:#x}]" if obj else UNKNOWN_FRAME


class Waits:
    """The loaded programs and what they measured."""

    def __init__(self, obj: Path, config: LoaderConfig, out: TextIO, stop: Stop) -> None:
        self._stop = stop
        self.out = out
        self.pids = [int(p) for p in config.pids]
        self.added = TargetsReader(Path(config.added)) if config.follow and config.added else None
        self.interval_ms = float(10.0 if config.stack_interval_ms is None else config.stack_interval_ms)
        if not self.interval_ms > 0:
            raise Unavailable(f"stack_interval_ms must be positive, not {self.interval_ms}")
        self.layout = lay = layouts.read(obj)
        states = _enum(lay, "wait_state", "WAIT_")
        if tuple(states[:len(STATES)]) != STATES:
            raise Unavailable(f"waits.bpf.c's states {states} are not maps.STATES {STATES}: rebuild it")
        self.phases = {name: i for i, name in enumerate(_enum(lay, "thread_phase", "PHASE_"))}
        self.thread = lay.struct("thread")
        self.stack_key, self.stack_val, self.stats = lay.struct("stack_key"), lay.struct("stack_val"), lay.struct("stats")
        if self.thread.field("ns").count != len(STATES):
            raise Unavailable("struct thread's ns[] is not one per state: rebuild the object")
        rodata = lay.section_with(".rodata", "cfg", "config",
                                  {"stack_interval_ns": round(self.interval_ms * 1e6),
                                   "preempt_from_rq": int(config.preempt_from_rq or 0)})
        self.prog = Loaded(obj, rodata)
        lib = self.prog.lib
        lib.bpf_map_delete_elem.restype, lib.bpf_map_delete_elem.argtypes = ctypes.c_int, [ctypes.c_int, ctypes.c_void_p]
        stacks = self.prog.maps["stacks"]
        self._stack_buf = ctypes.create_string_buffer(stacks.value_size)
        self._depth = stacks.value_size // 8
        self.start_ns = 0
        self.dead: dict[tuple[int, int], tuple[list[int], list[int]]] = {}  # exited threads' totals
        self.comm: dict[tuple[int, int], tuple[str, int]] = {}  # a thread's name and the prints that read it
        self.kernel = KernelSymbols(config.kallsyms or PROC_KALLSYMS)
        self.kernel.name(0)  # read now, before the probes are live and the targets released
        self.user: dict[int, UserMaps] = {}
        self._kstacks: dict[int, list[str]] = {}
        self._ustacks: dict[tuple[int, int], list[str]] = {}
        self._generation = 0  # prints so far
        self.dead_ns: dict[tuple[int, int], list[int]] = {}  # exited threads' totals per state (the series')
        self._unknown_state: dict[tuple[int, int], str] = {}  # /proc's state of a thread no event has told yet
        # the series: each thread's few fields it needs, unpacked without decoding the whole struct
        self.series_path = Path(config.series) if config.series else None
        self.binner: Binner | None = None
        self._series = LineFile(self.series_path) if self.series_path is not None else None
        self._series_cpu_ns = 0
        self._series_late = 0
        t = self.thread
        self._fast = [(struct.Struct("<" + {4: "I", 8: "Q"}[f.size] * f.count), f.offset)
                      for f in (t.field("since_ns"), t.field("ns"), t.field("tgid"), t.field("phase"), t.field("kind"))]

    @property
    def stop(self) -> bool:
        return self._stop.requested

    # -- start

    def seed(self, pids: list[int], since_ns: int) -> None:
        """The targets, and each of their threads as UNKNOWN since `since_ns` (the start, or when a
        target was added)."""
        one = struct.pack("<I", 1)
        for pid in pids:
            self.prog.update("targets", struct.pack("<I", pid), one)
        m = self.prog.maps["threads"]
        unknown = self.phases["unknown"]
        for pid in pids:
            for tid in thread_ids(pid):
                value = _pack(self.thread, {"since_ns": since_ns, "tgid": pid, "phase": unknown,
                                            "kind": STATES.index("other"), "syscall": -1,
                                            "ustack": -1, "kstack": -1})
                k = ctypes.create_string_buffer(struct.pack("<I", tid), 4)
                v = ctypes.create_string_buffer(value, m.value_size)
                self.prog.lib.bpf_map_update_elem(m.fd, k, v, BPF_NOEXIST)  # a forked one is newer
                self.prog.call("watch_tid", struct.pack("<I", tid))  # after its entry: a set bit finds one

    def add_new(self) -> None:
        """Targets the collector added since the last turn (following)."""
        pids = [p for p in self.added.new() if p not in self.pids] if self.added is not None else []
        if pids:
            self.pids += pids
            self.seed(pids, time.monotonic_ns())

    # -- symbols

    def _stack(self, stack_id: int) -> list[int]:
        """A stack's addresses, leaf first ([] when the id is gone or none)."""
        if stack_id < 0:
            return []
        m = self.prog.maps["stacks"]
        k = ctypes.create_string_buffer(struct.pack("<I", stack_id), 4)
        if self.prog.lib.bpf_map_lookup_elem(m.fd, k, self._stack_buf) != 0:
            return []
        addrs = struct.unpack_from(f"<{self._depth}Q", self._stack_buf)  # in place: no copy of the buffer
        out = []
        for a in addrs:
            if not a:
                break
            out.append(a)
        return out

    def kernel_frames(self, stack_id: int) -> list[str]:
        """Root first, each `name_[k]`, without the probe's own frames above __schedule."""
        got = self._kstacks.get(stack_id)
        if got is None:
            names = [self.kernel.name(a) for a in self._stack(stack_id)]
            if "__schedule" in names:
                names = names[names.index("__schedule"):]
            else:
                while names and (names[0] == UNKNOWN_FRAME or names[0].startswith(_PROBE_FRAMES)):
                    names.pop(0)
            got = self._kstacks[stack_id] = [f"{n}_[k]" for n in reversed(names)]
        return got

    def user_frames(self, pid: int, stack_id: int) -> list[str]:
        """Root first, each `[object+0xOFFSET]` (`[unknown]` outside any file mapping)."""
        got = self._ustacks.get((pid, stack_id))
        if got is None:
            addrs = self._stack(stack_id)
            maps = self.user.get(pid)
            if maps is None:
                maps = self.user[pid] = UserMaps(pid)
            frames = [maps.find(a) for a in addrs]
            outside = {a for a, f in zip(addrs, frames) if f is None}
            if not outside <= maps.outside and maps.generation != self._generation:
                # mapped since the last reading (dlopen): read again once a print at most, and not for an
                # address outside a reading made after it was sampled (a stack with one read the maps at
                # every print: ~1 ms each, 30 of the loader's ~150 ms on a transfer)
                maps.read()
                maps.generation = self._generation
                frames = [maps.find(a) for a in addrs]
                outside = {a for a, f in zip(addrs, frames) if f is None}
            if maps.generation == self._generation:  # read this print, after these were sampled
                maps.outside |= outside
            got = [f or UNKNOWN_FRAME for f in reversed(frames)]
            if None not in frames or not os.path.exists(f"/proc/{pid}"):
                self._ustacks[(pid, stack_id)] = got  # else named again at the next print
        return got

    # -- output

    def snapshot(self) -> dict[str, Mapping[str, float]]:
        """Every map as printed (maps.py reads them), by name: the threads' totals with their open
        intervals closed now."""
        now = time.monotonic_ns()
        self._generation += 1
        phases = {v: k for k, v in self.phases.items()}
        wait_ns: dict[str, int] = {}
        wait_n: dict[str, int] = {}
        unknown: dict[str, int] = {}
        rows: dict[tuple[int, int], tuple[list[int], list[int]]] = dict(self.dead)
        gone = []
        for key, (value, *_) in self.prog.entries("threads"):
            (tid,) = struct.unpack_from("<I", key)
            d = self.thread.decode(value)
            pid, phase = layouts.one(d, "tgid"), phases.get(layouts.one(d, "phase"), "")
            ns, n = layouts.many(d, "ns"), layouts.many(d, "n")
            open_ns = max(0, now - layouts.one(d, "since_ns"))
            state = None
            if phase == "on":
                state = "on_cpu"
            elif phase == "runnable":
                state = "runnable"
            elif phase == "blocked":
                kind = layouts.one(d, "kind")
                state = STATES[kind] if 0 <= kind < len(STATES) else "other"
            elif phase == "unknown":
                state = "on_cpu" if proc_state(pid, tid) == "R" else "other"
                self._unknown_state[(pid, tid)] = state
                unknown[f"{pid},{tid}"] = open_ns
            elif phase == "dead":
                self.dead[(pid, tid)] = (ns, n)
                self.dead_ns[(pid, tid)] = list(ns)
                self._unknown_state.pop((pid, tid), None)
                gone.append(key)
            if state is not None:
                i = STATES.index(state)
                ns[i] += open_ns
                n[i] += 1
            rows[(pid, tid)] = (ns, n)
        m = self.prog.maps["threads"]
        for key in gone:  # their totals are kept here: the map holds the living
            self.prog.lib.bpf_map_delete_elem(m.fd, ctypes.create_string_buffer(key, len(key)))
        comm: dict[str, int] = {}
        for (pid, tid), (ns, n) in sorted(rows.items()):
            name, reads = self.comm.get((pid, tid), ("", 0))
            if reads < COMM_READS and (pid, tid) not in self.dead:  # threads name themselves early on
                name = thread_name(pid, tid) or name
                self.comm[(pid, tid)] = (name, reads + 1)
            if name:
                comm[f"{pid},{tid},{name}"] = 1
            for i, state in enumerate(STATES):
                if n[i] or ns[i]:
                    wait_ns[f"{pid},{tid},{state}"] = ns[i]
                    wait_n[f"{pid},{tid},{state}"] = n[i]
        stacks: dict[str, int] = {}
        for key, (value, *_) in self.prog.entries("wait_stacks"):
            k, v = self.stack_key.decode(key), self.stack_val.decode(value)
            pid, kind = layouts.one(k, "tgid"), layouts.one(k, "kind")
            if not 0 <= kind < len(STATES):
                continue
            frames = [str(pid), STATES[kind], *self.user_frames(pid, layouts.one(k, "ustack")),
                      *self.kernel_frames(layouts.one(k, "kstack"))]
            folded = ";".join(frames)
            stacks[folded] = stacks.get(folded, 0) + layouts.one(v, "ns")
        stats: dict[str, float] = dict(zip(self.stats.fields, map(float, self.prog.summed_u64s("stats"))))
        stats["loader_cpu_s"] = cpu_seconds(os.getpid()) or 0.0
        if self.binner is not None:
            stats["series_cpu_s"] = self._series_cpu_ns / 1e9
            stats["series_late_cuts"] = float(self._series_late)  # lines over more than one bin
            stats["series_write_errors"] = float(self._series.write_errors if self._series else 0)
        return {"@wait_ns": wait_ns, "@wait_n": wait_n, "@wait_unknown": unknown, "@wait_comm": comm,
                "@wait_span": {"start_ns": self.start_ns, "end_ns": now},
                "@wait_config": {"stack_interval_ms": self.interval_ms},
                "@wait_stacks": stacks, "@wait_stats": stats}

    def print(self) -> None:
        self.out.write(json.dumps({"type": "map", "data": self.snapshot()}, separators=(",", ":")) + "\n")
        self.out.flush()

    # -- the series

    def _series_write(self, obj: SeriesHeader | BinLine) -> None:
        if self._series is not None:
            self._series.write(obj)

    def series_open(self) -> None:
        """The series file, empty, with its header line (before the programs attach)."""
        if self.series_path is None:
            return
        self.binner = Binner(self.start_ns)
        assert self._series is not None
        self._series.open()
        self._series_write(self.binner.header())

    def series_cut(self, at_ns: int) -> None:
        """Every thread's totals with its open interval closed at `at_ns` (a bin edge, or the stop),
        and the line for the time since the last cut."""
        if self.binner is None:
            return
        t0 = time.thread_time_ns()
        (since_f, since_o), (ns_f, ns_o), (tgid_f, tgid_o), (phase_f, phase_o), (kind_f, kind_o) = self._fast
        on, runnable, blocked = self.phases["on"], self.phases["runnable"], self.phases["blocked"]
        unknown, dead = self.phases["unknown"], self.phases["dead"]
        on_i, runnable_i, other_i, nstates = STATES.index("on_cpu"), STATES.index("runnable"), \
            STATES.index("other"), len(STATES)
        # the map in one or a few system calls (BPF_MAP_LOOKUP_BATCH), else entry by entry
        got = self.prog.batch("threads")
        if got is not None:
            n, keys, values = got
            ks, vs = self.prog.maps["threads"].key_size, self.prog.maps["threads"].value_size
            rows: Iterable[tuple[bytes, int, bytes, int]] = ((keys, i * ks, values, i * vs) for i in range(n))
        else:
            rows = ((key, 0, value, 0) for key, (value, *_) in self.prog.entries("threads"))
        living = []
        for key, kbase, value, base in rows:
            (tid,) = struct.unpack_from("<I", key, kbase)
            (pid,), (phase,), (since,) = tgid_f.unpack_from(value, base + tgid_o), \
                phase_f.unpack_from(value, base + phase_o), since_f.unpack_from(value, base + since_o)
            ns = list(ns_f.unpack_from(value, base + ns_o))
            if since < at_ns and phase != dead:
                if phase == on:
                    i = on_i
                elif phase == runnable:
                    i = runnable_i
                elif phase == blocked:
                    (i,) = kind_f.unpack_from(value, base + kind_o)
                    i = i if 0 <= i < nstates else other_i
                elif phase == unknown:
                    state = self._unknown_state.get((pid, tid))
                    if state is None:
                        state = self._unknown_state[(pid, tid)] = "on_cpu" if proc_state(pid, tid) == "R" else "other"
                    i = STATES.index(state)
                else:
                    i = other_i
                ns[i] += at_ns - since
            living.append((pid, tid, ns))
        line = self.binner.cut(at_ns, living, self.dead_ns)
        if line is not None:
            self._series_late += "n" in line
            self._series_write(line)
        self._series_cpu_ns += time.thread_time_ns() - t0

    # -- the run

    def _sleep_until(self, t: float, wake: int) -> None:
        self._stop.sleep_until(t, wake)

    def run(self, wake: int) -> None:
        prog = self.prog
        self.start_ns = time.monotonic_ns()
        self.series_open()
        prog.attach(TRACKING)
        self.seed(self.pids, self.start_ns)
        prog.attach(n for n in prog.programs if n not in TRACKING and n not in CALLED)
        self.out.write(READY + "\n")
        self.out.flush()
        next_print = time.monotonic() + PRINT_S
        binner = self.binner
        next_edge = binner.next_edge(time.monotonic_ns()) if binner is not None else None
        while not self.stop:
            # with the series, the prints follow a cut (a print can take tens of ms, the first one, which
            # names the stacks, more: it then has a whole bin before the next edge)
            self._sleep_until(next_print if next_edge is None else next_edge / 1e9, wake)
            if self.stop:
                break
            self.add_new()
            if binner is not None and next_edge is not None:
                now_ns = time.monotonic_ns()
                if now_ns < next_edge:
                    continue
                self.series_cut(binner.edge_before(now_ns))  # late by several bins: one line for them
                next_edge = binner.next_edge(now_ns)
            if time.monotonic() >= next_print:
                next_print = max(next_print + PRINT_S, time.monotonic())
                self.print()
        prog.detach(list(prog.links))  # the last print sees no half-made transition
        self.series_cut(time.monotonic_ns())  # the last bin, to the stop
        self.print()
        if self._series is not None:
            self._series.close()


def main(argv: list[str]) -> int:
    return loader_main(argv, "qprof.probes.waits.loader", Waits, (layouts.LayoutError,))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
