"""The tree every qprof flame graph draws: frames merged from the root, weighted and coloured by the
attribution engine's own decisions.

The engine decides a category per *sample* (leaf first: the deepest frame a
rule claims decides, attribution/engine.py), not per frame: `memcpy` under
AEAD encryption is Crypto, the same `memcpy` under `sendmsg` is Packet I/O,
and `main` holds every category. A flame graph frame stands for all the
samples whose stacks pass through it, so it is coloured by the category
holding the largest share of those samples' CPU time (period: the majority
when there is one), ties broken in the report's category order. Why that and
not the frame's own rule: the frame then shows what `qprof report` counted
for the time under it (a leaf is exactly its samples' category; a transparent
helper or an unmatched frame takes the colour of the work it did; a frame
spread over several categories names them all in its tooltip), and no second
classification can disagree with the report. The legend's shares are summed
from the same decisions, so they are the report's shares for what is shown.

The tree is filled by `FlameBuilder`, an attribution.profile.Visitor: it sees
each stack record with its decision in the report's own attribution pass.
Frames are named as the folded export names them (viewer.folded.frame_name).
Everything here is iterative: stacks can be thousands of frames deep.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Sequence

from qprof.attribution.categories import CATEGORIES
from qprof.attribution.engine import Decision
from qprof.attribution.analysis import Analysis
from qprof.attribution.profile import ProcessProfile, Profile
from qprof.attribution.timeline import Timeline, TimelineBuilder, build as build_timeline
from qprof.archive import Run
from qprof.archive.stacks import StackRecord
from qprof.errors import QprofError
from qprof.viewer.folded import frame_name
from qprof.viewer.palette import frame_colour

ROOT = "all"
_ORDER = {c: i for i, c in enumerate(CATEGORIES)}


@dataclass(eq=False)
class FrameNode:
    """One frame of the merged tree: its samples and period include everything above it."""

    name: str
    dso: str = ""
    samples: int = 0
    period: int = 0
    categories: Counter[str] = field(default_factory=Counter)  # period per decided category
    children: dict[str, "FrameNode"] = field(default_factory=dict)

    def add(self, path: Sequence[tuple[str, str]], category: str, samples: int, period: int) -> None:
        """Count one stack (names and objects, root first) decided as `category`, from this node up."""
        node = self
        node._count(category, samples, period)
        for name, dso in path:
            child = node.children.get(name)
            if child is None:
                child = node.children[name] = FrameNode(name, dso)
            child._count(category, samples, period)
            node = child

    def _count(self, category: str, samples: int, period: int) -> None:
        self.samples += samples
        self.period += period
        self.categories[category] += period

    @property
    def category(self) -> str:
        """The category holding the largest share of this frame's period (see the module's docstring)."""
        if not self.categories:
            return CATEGORIES[-1]
        return min(self.categories.items(), key=lambda kv: (-kv[1], _ORDER.get(kv[0], len(_ORDER))))[0]

    @property
    def colour(self) -> str:
        return frame_colour(self.category, self.name)

    def mix(self) -> list[tuple[str, float]]:
        """(category, share of this frame's period), largest first."""
        total = self.period or 1
        return sorted(((c, p / total) for c, p in self.categories.items() if p),
                      key=lambda cs: (-cs[1], _ORDER.get(cs[0], len(_ORDER))))

    @property
    def self_samples(self) -> int:
        return self.samples - sum(c.samples for c in self.children.values())

    def sorted_children(self) -> list["FrameNode"]:
        """Alphabetical, as flamegraph.pl draws them: a frame sits at the same place in every graph."""
        return [self.children[k] for k in sorted(self.children)]

    def walk(self) -> Iterator[tuple["FrameNode", int]]:
        """(node, depth) in pre-order, children alphabetical; depth 0 is this node."""
        stack: list[tuple[FrameNode, int]] = [(self, 0)]
        while stack:
            node, depth = stack.pop()
            yield node, depth
            stack.extend((c, depth + 1) for c in reversed(node.sorted_children()))

    def find(self, names: Sequence[str]) -> "FrameNode | None":
        node: FrameNode | None = self
        for n in names:
            node = node.children.get(n) if node is not None else None
        return node


class FlameBuilder:
    """An attribution.profile.Visitor that merges each selected stack into the tree.

    `label(rec)` names the stack's process frame (the tree's first level), or
    returns None to leave the record out.
    """

    def __init__(self, label: Callable[[StackRecord], str | None]) -> None:
        self.root = FrameNode(ROOT)
        self.label = label

    def __call__(self, rec: StackRecord, decision: Decision) -> None:
        top = self.label(rec)
        if top is None:
            return
        path = [(top, "")] + [(frame_name(sym, dso), dso) for sym, dso in reversed(rec.frames)]
        self.root.add(path, decision.category, rec.samples, rec.period)


@dataclass(frozen=True)
class Selection:
    """What to draw: one process (by pid or role), one thread, or everything sampled."""

    pid: int | None = None
    role: str | None = None
    tid: int | None = None

    def slug(self) -> str:
        """For default output names: `-server`, `-pid123`, `-tid456`."""
        return "".join(f"-{k}{v}" for k, v in (("", self.role), ("pid", self.pid), ("tid", self.tid))
                       if v is not None)


@dataclass
class Flame:
    """A tree ready to draw, with what it shows and how to read its numbers."""

    root: FrameNode
    title: str
    subtitle: str
    seconds_per_period: float
    processes: list[ProcessProfile]
    timeline: Timeline | None = None  # the shown processes' CPU by category and goodput over the run

    def shares(self) -> dict[str, float]:
        """Each category's share of the CPU time shown: the legend."""
        total = self.root.period or 1
        return {c: self.root.categories[c] / total for c in CATEGORIES}

    def legend(self) -> list[tuple[str, str]]:
        """(category, its legend text): formatted here for every output, as the terminal report does,
        so the HTML page does not round a share the other way (JavaScript's toFixed rounds ties up)."""
        return [(c, f"{c} {s:.1%}") for c, s in self.shares().items()]

    def describe(self, node: FrameNode) -> str:
        """A frame's tooltip: name, samples, CPU time and share, category (and the mix), object."""
        share = node.period / (self.root.period or 1)
        mix = node.mix()
        cats = f"{node.category}" if len(mix) <= 1 else \
            f"{node.category} ({mix[0][1]:.0%}); " + ", ".join(f"{c} {s:.0%}" for c, s in mix[1:4])
        lines = [node.name, f"{node.samples:,} samples, {node.period * self.seconds_per_period * 1e3:,.1f} ms CPU, "
                            f"{share:.2%} of shown", f"category: {cats}"]
        if node.dso:
            lines.append(node.dso)
        return "\n".join(lines)


def process_label(pid: int, comm: str, role: str | None) -> str:
    return f"{comm} (pid {pid}" + (f", {role})" if role else ")")


def _role_pids(run: Run, role: str) -> set[int]:
    targets = run.meta.targets
    pids = {t.pid for t in targets if t.role == role}
    if not pids:
        roles = sorted({t.role for t in targets if t.role})
        have = f"its roles: {', '.join(roles)}" if roles else \
            "its targets have no roles: attach with --server PID / --client PID to give them"
        raise QprofError(f"{run.path} has no {role} ({have}); drop --role or choose another")
    return pids


def _listing(items: list[str], most: int = 12) -> str:
    """For error messages: what there is, cut short when there is a lot."""
    return ", ".join(items[:most]) + (f" and {len(items) - most} more" if len(items) > most else "") or "none"


def _check_selection(run: Run, profile: Profile, sel: Selection, role_pids: set[int] | None) -> list[ProcessProfile]:
    procs = profile.processes
    listing = _listing([f"{p.pid} {p.comm}" for p in procs])
    if sel.pid is not None:
        if sel.pid not in {p.pid for p in procs}:
            raise QprofError(f"no samples of pid {sel.pid} in {run.path} (its processes: {listing}); "
                             "give one of them with --pid")
        if role_pids is not None and sel.pid not in role_pids:
            raise QprofError(f"pid {sel.pid} is not the {sel.role} of {run.path} (the {sel.role}: "
                             f"{', '.join(map(str, sorted(role_pids)))}); give --pid or --role, not both")
    chosen = [p for p in procs if (sel.pid is None or p.pid == sel.pid)
              and (role_pids is None or p.pid in role_pids)]
    if not chosen:
        raise QprofError(f"the {sel.role} of {run.path} has no samples (its processes: {listing})"
                         if sel.role else f"{run.path} has no samples to draw")
    if sel.tid is not None and not any(sel.tid in p.threads for p in chosen):
        threads = _listing([f"{t.tid} {t.comm}" for p in chosen for t in p.threads.values()])
        where = f"the {sel.role} of {run.path}" if sel.role else \
            f"pid {sel.pid}" if sel.pid is not None else str(run.path)
        raise QprofError(f"no samples of thread {sel.tid} in {where} (threads: {threads}); "
                         "give one of them with --thread")
    return [p for p in chosen if sel.tid is None or sel.tid in p.threads]


def selecting(run: Run, sel: Selection) -> tuple[FlameBuilder, TimelineBuilder]:
    """The visitors that build the selected part's tree and timeline while the run is attributed
    (viewer.outputs runs the pass). A role the run lacks is refused here, before the work."""
    role_pids = _role_pids(run, sel.role) if sel.role else None
    targets = {t.pid: t for t in run.meta.targets}
    labels: dict[int, str] = {}

    def label(rec: StackRecord) -> str | None:
        if (sel.pid is not None and rec.pid != sel.pid) or (role_pids is not None and rec.pid not in role_pids) \
                or (sel.tid is not None and rec.tid != sel.tid):
            return None
        got = labels.get(rec.pid)
        if got is None:
            t = targets.get(rec.pid)
            got = labels[rec.pid] = process_label(rec.pid, t.comm if t else rec.comm, t.role if t else None)
        return got

    return FlameBuilder(label), TimelineBuilder(lambda rec: label(rec) is not None)


def flame_of(analysis: Analysis, sel: Selection, builder: FlameBuilder, over_time: TimelineBuilder) -> Flame:
    """The flame of what `selecting`'s visitors saw during `analysis`'s attribution.

    Bad selections (unknown pid or thread) raise QprofError naming what the run has.
    """
    profile = analysis.profile
    run = profile.run
    role_pids = _role_pids(run, sel.role) if sel.role else None
    readings = list(run.proc_readings())
    chosen = _check_selection(run, profile, sel, role_pids)
    what = ", ".join(process_label(p.pid, p.comm, p.role) for p in chosen)
    if sel.tid is not None:
        what += f", thread {sel.tid}"
    cpu = builder.root.period * profile.seconds_per_period
    sampling = run.meta.sampling
    sub = (f"{what}: {builder.root.samples:,} samples, {cpu:.2f} CPU s; {sampling.event} at "
           f"{sampling.frequency} Hz; colour: the category holding most of a frame's time")
    return Flame(builder.root, f"qprof flame graph: {Path(run.path).resolve().name}", sub,
                 profile.seconds_per_period, chosen,
                 build_timeline(profile, over_time, readings, [p.pid for p in chosen], analysis.transfers))
