"""Which pool of a runtime's threads a sample ran in, from the frames its stack runs through.

A multi-threaded runtime moves its work between OS threads (goroutines between
Go's Ms, tasks between tokio's workers), so threads are compared as pools: the
`[[pool]]` tables of the mapping files a process loads (attribution.mapping)
name the frame each pool's threads run through. A sample belongs to the first
pool, in the files' precedence order, that one of its user-space frames
matches; a thread to the pool most of its sampled CPU time belongs to
(attribution.threads).
"""

from __future__ import annotations

from typing import Sequence

from qprof.attribution.engine import is_kernel_dso
from qprof.attribution.mapping import Pool
from qprof.archive.stacks import Frame


class PoolMatcher:
    """The pools of one process's mapping files, matched once per distinct symbol."""

    def __init__(self, pools: Sequence[Pool]) -> None:
        self.pools = list(pools)
        self._hit: dict[str, int | None] = {}  # symbol -> index of the first pool it matches

    def _index(self, sym: str) -> int | None:
        if sym not in self._hit:
            self._hit[sym] = next((i for i, p in enumerate(self.pools) if p.symbol.search(sym)), None)
        return self._hit[sym]

    def match(self, frames: Sequence[Frame]) -> str | None:
        """The name of the first pool any user-space frame of the stack matches, or None."""
        if not self.pools:
            return None
        best: int | None = None
        for sym, dso in frames:
            if is_kernel_dso(dso):
                continue
            i = self._index(sym)
            if i is not None and (best is None or i < best):
                best = i
                if i == 0:
                    break
        return None if best is None else self.pools[best].name
