"""A default probe group: every target thread's wall-clock time, exactly, and what it waited for.

Per thread: time on a CPU, runnable (waiting for a CPU), and blocked, by what ended the wait
(network, timer, another thread of its process, disk, other); plus sampled call stacks of the
waits. waits.bpf.c holds the programs (tp_btf on sched_switch, sched_waking, fork and exit, and
the timer callbacks' bounds) and every struct they share with Python; loader.py loads them and
prints the maps every second; maps.py reads what it printed back as a typed record (WaitMaps).
It also writes each process's time per state per 100 ms to a file of its own (series.py: the
format, the loader's binning and the reader, WaitSeries).
"""

from __future__ import annotations

import platform
import struct
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable

from qprof import runfiles
from qprof.probes import btf, libbpf
from qprof.probes.follow import targets_file
from qprof.probes.group import Context, Findings, Launch, ProgramCost, ProgramFiles, Unavailable
from qprof.probes.waits.series import file_name

if TYPE_CHECKING:
    from qprof.probes.packetio.maps import ProbeMaps

STACK_INTERVAL_MS = 10.0  # mean gap between one thread's sampled wait stacks
_DATASEC = 15  # BTF kind


def preempt_from_rq() -> int:
    """Where the CPU's preempt count sits from its runqueue in the per-CPU area (x86_64's
    __preempt_count and runqueues, from the kernel BTF's .data..percpu section): how the programs
    read it without kallsyms' data symbols (waits.bpf.c, preempt_count_now). 0: not found (the
    programs then judge interrupt context by the stack in use)."""
    return btf.remembered("preempt_from_rq", _preempt_from_rq)


def _preempt_from_rq() -> int:
    b = btf.kernel()
    found: dict[str, int] = {}
    for ds in b.ids(_DATASEC, ".data..percpu"):
        _, vlen, _, _, data = b._record(ds)
        for i in range(vlen):
            var, offset, _size = struct.unpack_from("<III", b._data, data + 12 * i)
            name = b.name(var)
            if name in ("__preempt_count", "runqueues"):
                found[name] = offset
    if len(found) != 2 or platform.machine() != "x86_64":
        return 0
    return found["__preempt_count"] - found["runqueues"]


@dataclass(frozen=True)
class WaitsGroup:
    name: str = "waits"
    default: bool = True
    summary: str = ("each thread's wall-clock time, exact: on a CPU, runnable, and blocked by what it waited "
                    "for (network, timer, thread, disk, other), with sampled stacks of the waits "
                    "(hooks every context switch and wakeup of the host: ~0.1 us each, ~0.25 us the targets')")
    tracepoints: tuple[str, ...] = ("sched_switch", "sched_waking", "sched_process_fork", "sched_process_exit",
                                    "hrtimer_expire_entry", "hrtimer_expire_exit",
                                    "timer_expire_entry", "timer_expire_exit")
    stack_interval_ms: float = STACK_INTERVAL_MS

    def config(self, pids: list[int]) -> libbpf.LoaderConfig:
        """The loader's settings; Unavailable names what this kernel lacks."""
        try:
            missing = [tp for tp in self.tracepoints if not btf.tracepoint_exists(tp)]
            preempt = preempt_from_rq()
        except btf.BTFUnavailable as e:
            raise Unavailable(str(e)) from None
        if missing:
            raise Unavailable(f"this kernel lacks tracepoint(s) {', '.join(missing)}")
        return libbpf.LoaderConfig(pids=pids, stack_interval_ms=self.stack_interval_ms, preempt_from_rq=preempt)

    def start(self, ctx: Context) -> Launch:
        config = self.config(ctx.pids)
        if ctx.follow:
            config = replace(config, follow=True, added=str(targets_file(ctx.out)))
        ctx.status("starting probes: waits (compiled first if this kernel is new to qprof)")
        obj = libbpf.build(__name__, self.name)
        source = ctx.out / runfiles.probe_file(self.name, "bpf.c")
        source.write_bytes(libbpf.source_text(__name__, self.name))
        series = ctx.out / file_name()  # the wall clock per 100 ms (series.py), beside the maps' stream
        # the kallsyms snapshot is the attach's, gone after it: not in probes.json's config
        run_config = replace(config, series=str(series), kallsyms=None if ctx.kallsyms is None else str(ctx.kallsyms))
        proc = libbpf.LibbpfProcess(self.name, f"{__name__}.loader", obj, run_config,
                                    ctx.out / runfiles.probe_file(self.name, "jsonl"),
                                    ctx.out / runfiles.probe_file(self.name, "log"))
        proc.spawn()
        return Launch(proc, ProgramFiles(proc.output.name,
                                         "libbpf tp_btf, every context switch and wakeup, sampled stacks",
                                         script=source.name, object=obj.name, config=config, series=series.name))

    def finish(self, findings: Findings, maps: ProbeMaps, programs: list[ProgramCost],
               status: Callable[[str], None]) -> None:
        return None


GROUP = WaitsGroup()
