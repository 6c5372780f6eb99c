"""The off-CPU flame graph: a process's whole wall time, each kind of wait with the call paths it blocked in.

`qprof flamegraph RUN --off-cpu` draws this tree with the flame graph writers
(viewer.flamegraph_svg, viewer.flamegraph_html) in place of the on-CPU one.
Widths are seconds of the threads' summed window (attribution.waits): the
root's children are where that time went: on a CPU and runnable as flat blocks
(the on-CPU graph draws the first), then each kind of wait, network, timer,
thread, disk, other, above it the call paths its waits were sampled in, their
user frames named at report time (attribution.waitstacks) and the kernel's
ending in the scheduler, scaled to the kind's exact total (a kind's seconds
no sampled stack covers stay the kind's own width). Each state has its hue
family (viewer.palette.WAIT_FAMILIES), a frame the state of most of its time.
With several processes shown, each has its frame under the root first.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from qprof.archive import Run
from qprof.attribution.analysis import Analysis
from qprof.attribution.categories import CATEGORIES
from qprof.attribution.waits import LABELS, ON_CPU, STATES, WallClock
from qprof.attribution.waitstacks import KERNEL, named
from qprof.errors import QprofError
from qprof.viewer.flametree import ROOT, Flame, FrameNode, Selection, _listing, _role_pids, process_label

NS = 1e-9  # seconds per period: the tree counts nanoseconds
KERNEL_DSO = "[kernel.kallsyms]"


@dataclass
class OffCpuFlame(Flame):
    """A Flame whose periods are nanoseconds of wall time and whose "categories" are wall-clock states."""

    seconds: dict[str, float] = field(default_factory=dict)  # state -> seconds shown
    notes: dict[int, str] = field(default_factory=dict)  # id(node) -> an extra tooltip line

    @property
    def total_s(self) -> float:
        return self.root.period * NS

    def shares(self) -> dict[str, float]:
        total = sum(self.seconds.values()) or 1.0
        return {s: self.seconds.get(s, 0.0) / total for s in STATES}

    def legend(self) -> list[tuple[str, str]]:
        return [(s, f"{LABELS[s]} {x:.1%}") for s, x in self.shares().items() if self.seconds.get(s, 0.0) > 0]

    def describe(self, node: FrameNode) -> str:
        mix = node.mix()
        states = LABELS.get(mix[0][0], mix[0][0]) if len(mix) == 1 else \
            ", ".join(f"{LABELS.get(s, s)} {x:.0%}" for s, x in mix[:4])
        lines = [node.name, f"{node.period * NS:,.3f} s, {node.period / (self.root.period or 1):.2%} of the wall "
                            "time shown", states]
        if id(node) in self.notes:
            lines.append(self.notes[id(node)])
        if node.dso:
            lines.append(node.dso)
        return "\n".join(lines)


def check(run: Run, sel: Selection) -> None:
    """What is refused before the run is attributed: a thread (the wait stacks are the process's) or a role
    the run lacks."""
    if sel.tid is not None:
        raise QprofError("--off-cpu draws whole processes (wait stacks are sampled per process, not per thread): "
                         "drop --thread; `qprof report` lists each thread's wall clock")
    if sel.role is not None:
        _role_pids(run, sel.role)


def _chosen(analysis: Analysis, sel: Selection) -> list[WallClock]:
    run = analysis.profile.run
    walls = analysis.wall
    if not walls:
        probes = run.probes()
        why = next((r for g, r in probes.unavailable if g == "waits"), None) if probes is not None else None
        raise QprofError(f"{run.path} has no wall-clock record: the waits probes did not run"
                         + (f" ({why})" if why else " (attach with the default --probes, which include waits)"))
    role_pids = _role_pids(run, sel.role) if sel.role else None
    chosen = [w for pid, w in walls.items()
              if (sel.pid is None or pid == sel.pid) and (role_pids is None or pid in role_pids)]
    if not chosen:
        have = _listing([str(pid) for pid in walls])
        raise QprofError(f"no wall-clock record of {f'pid {sel.pid}' if sel.pid is not None else f'the {sel.role}'} "
                         f"in {run.path} (the processes with one: {have}); give one of them with --pid")
    return chosen


def _add(root: FrameNode, top: list[tuple[str, str]], wall: WallClock, run: Run) -> str | None:
    """One process's states and wait stacks under `top`; its on-CPU categories as a tooltip line."""
    stacks = named(wall.stacks, run, wall.pid)
    for state in STATES:
        total = round(wall.total.seconds[state] / NS)
        if total <= 0:
            continue
        here = [*top, (state, "")]
        placed = 0
        for path, seconds in sorted(stacks.get(state, {}).items()):
            ns = min(round(seconds / NS), total - placed)
            if ns <= 0:
                continue
            frames = [(f, KERNEL_DSO if f.endswith(KERNEL) else "") for f in path.split(";") if f]
            root.add([*here, *frames], state, 0, ns)
            placed += ns
        if total > placed:
            root.add(here, state, 0, total - placed)
    cats = wall.total.on_cpu_categories
    if not cats or not any(cats.values()):
        return None
    return "on-CPU by category: " + ", ".join(f"{c} {cats[c]:.2f} s" for c in CATEGORIES if cats.get(c))


def offcpu_flame(analysis: Analysis, sel: Selection) -> OffCpuFlame:
    """The off-CPU tree of the selected processes (all with a wall-clock record when none is selected)."""
    run = analysis.profile.run
    check(run, sel)
    chosen = _chosen(analysis, sel)
    targets = {t.pid: t for t in run.meta.targets}

    def label(pid: int) -> str:
        t = targets.get(pid)
        return process_label(pid, t.comm if t else str(pid), t.role if t else None)

    root = FrameNode(label(chosen[0].pid) if len(chosen) == 1 else ROOT)
    notes: dict[int, str] = {}
    for w in chosen:
        top = [] if len(chosen) == 1 else [(label(w.pid), "")]
        line = _add(root, top, w, run)
        on = root.find([*(n for n, _ in top), ON_CPU])
        if line is not None and on is not None:
            notes[id(on)] = line
    seconds = {s: sum(w.total.seconds[s] for w in chosen) for s in STATES}
    threads = sum(len(w.threads) for w in chosen)
    interval = next((w.stack_interval_ms for w in chosen if w.stack_interval_ms), None)
    span = max(w.span_s for w in chosen)
    sub = (f"{', '.join(label(w.pid) for w in chosen)}: {sum(seconds.values()):,.2f} s of wall time, "
           f"{threads} thread{'s' if threads != 1 else ''} over {span:.2f} s, traced at every context switch; "
           "wait call paths sampled" + (f" every {interval:g} ms" if interval else "")
           + ", scaled to each kind's exact total; colour: where the time went")
    procs = [p for p in analysis.profile.processes if p.pid in {w.pid for w in chosen}]
    return OffCpuFlame(root, f"qprof off-CPU flame graph: {Path(run.path).resolve().name}", sub, NS, procs,
                       None, seconds, notes)
