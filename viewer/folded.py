"""Folded stacks for flamegraph.pl, inferno and speedscope: `root;...;leaf count` per line.

Same shape as stackcollapse-perf.pl's output (process name as the root frame,
kernel frames suffixed `_[k]`), weighted by samples, so others' flamegraph
tools read a qprof run directly: `qprof report RUN --format folded | flamegraph.pl`.
`frame_name` is the one naming of a frame that every qprof flame graph shares
(folded, SVG, HTML, speedscope), so a frame reads the same in all of them.
"""

from __future__ import annotations

from collections import Counter
from typing import Iterator

from qprof.attribution.engine import is_kernel_dso
from qprof.archive import Run


def frame_name(sym: str, dso: str) -> str:
    """A frame's display name: its symbol, or its object when perf could not name it (as
    stackcollapse-perf.pl shows it); kernel frames suffixed `_[k]`."""
    name = sym if sym != "[unknown]" or dso.startswith("[") else f"[{dso.rsplit('/', 1)[-1]}]"
    return name + "_[k]" if is_kernel_dso(dso) else name


def _folded(name: str) -> str:
    # the folded format's separators cannot appear inside a frame
    return name.replace(";", ":").replace("\n", " ")


def folded_lines(run: Run, pid: int | None = None) -> Iterator[str]:
    counts: Counter[str] = Counter()
    for rec in run.stacks():
        if pid is not None and rec.pid != pid:
            continue
        frames = [rec.comm.replace(";", ":").replace(" ", "_")] + \
            [_folded(frame_name(s, d)) for s, d in reversed(rec.frames)]
        counts[";".join(frames)] += rec.samples
    for stack, n in sorted(counts.items()):
        yield f"{stack} {n}"
