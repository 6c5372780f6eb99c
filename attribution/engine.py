"""Stack -> category: walk from the leaf towards the root; the first frame a specific rule claims decides.

Why leaf first: the founding study matched one regex list against the whole
folded stack, first rule wins, so a frame far up ("stream") could claim a
sample that is really spent in sendto. Here the deepest frame with a specific
rule decides; generic frames (memcpy, malloc, locks) are transparent and pass
the decision to their caller; frames no rule knows pass it on as well.

Handoffs and other tools' eBPF programs (categories.CALLER_PLACED) are held,
not decided: a reschedule IPI, the switch it causes, a preemption at an
interrupt's exit, a kprobe's or trampoline's program are kernel work that the
thread's own clock counts in the code it interrupted or was called from. The
walk goes on past their kernel frames (and the interrupt's, the other
Uncategorized kernel rules) to the first frame a rule claims: a work category
there places the sample (keeping the held subcategory, as a tag), anything else
(the program's own code, a runtime, no rule at all) leaves it Uncategorized
under its held name.

Cost: rules are matched once per distinct (symbol, dso) pair, and each `within`
pattern once per distinct symbol; a stack then costs one lookup per frame.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Sequence

from qprof.attribution.categories import CALLER_PLACED, UNCATEGORIZED
from qprof.attribution.mapping import MappingFile, Rule
from qprof.attribution.patterns import BoundedPattern
from qprof.archive.stacks import KERNEL_DSO, Frame

# Object names perf puts in brackets that are user space, not kernel modules.
_USER_PSEUDO = re.compile(r"^\[(unknown|vdso|vsyscall|heap|stack|uprobes|anon.*|jit.*)\]$")


@functools.lru_cache(maxsize=8192)
def is_kernel_dso(dso: str) -> bool:
    """perf names kernel objects `[kernel.kallsyms]` and modules `[name]`."""
    return dso == KERNEL_DSO or (dso.startswith("[") and dso.endswith("]") and not _USER_PSEUDO.match(dso))


@dataclass(frozen=True)
class Decision:
    category: str
    subcategory: str | None
    rule: Rule | None  # the rule that decided; None when no rule did
    frame: int | None  # index (leaf = 0) of the deciding frame


UNDECIDED = Decision(UNCATEGORIZED, None, None, None)


class Classifier:
    """Classifies stacks with an ordered rule list (highest precedence first)."""

    def __init__(self, files: Sequence[MappingFile], last: Sequence[Rule] = ()) -> None:
        """`last`: rules after every file's (attribution.application: the process's own code)."""
        self.files = list(files)
        self.rules: list[Rule] = [r for f in self.files for r in f.rules] + list(last)
        self._cand: dict[Frame, tuple[Rule, ...]] = {}
        self._within: dict[tuple[int, str], bool] = {}

    def _candidates(self, frame: Frame) -> tuple[Rule, ...]:
        got = self._cand.get(frame)
        if got is None:
            sym, dso = frame
            kern = is_kernel_dso(dso)
            got = tuple(r for r in self.rules
                        if (r.kernel is None or r.kernel == kern)
                        and (r.symbol is None or r.symbol.search(sym))
                        and (r.dso is None or r.dso.search(dso)))
            self._cand[frame] = got
        return got

    def _within_match(self, pattern: BoundedPattern, sym: str) -> bool:
        key = (id(pattern), sym)
        got = self._within.get(key)
        if got is None:
            got = self._within[key] = pattern.search(sym) is not None
        return got

    def context(self, rule: Rule, frames: Sequence[Frame], kernel: Sequence[bool] | None = None) -> int:
        """Index of the rootmost frame satisfying `rule.within` (-1: none). A kernel rule's context is
        kernel frames only: a user function that happens to be called `ep_poll` must not turn its
        callees into polling. `kernel`: each frame's is_kernel_dso, when the caller has them."""
        pat = rule.within
        assert pat is not None
        if kernel is None:
            kernel = [is_kernel_dso(dso) for _, dso in frames]
        for k in range(len(frames) - 1, -1, -1):
            if (rule.kernel is None or kernel[k] == rule.kernel) and self._within_match(pat, frames[k][0]):
                return k
        return -1

    def classify(self, frames: Sequence[Frame]) -> Decision:
        tag: str | None = None
        rootmost: dict[tuple[int, bool | None], int] = {}  # (pattern, kernel) -> rootmost match
        kernel: list[bool] = []  # each frame's is_kernel_dso, once a rule asks for its context

        def within(rule: Rule, i: int) -> bool:
            assert rule.within is not None
            key = (id(rule.within), rule.kernel)
            j = rootmost.get(key)
            if j is None:
                if not kernel:
                    kernel.extend(is_kernel_dso(dso) for _, dso in frames)
                j = rootmost[key] = self.context(rule, frames, kernel)
            return j >= i

        held: Decision | None = None  # a handoff or another tool's eBPF program, waiting for its caller
        for i, frame in enumerate(frames):
            for rule in self._candidates(frame):
                if rule.leaf and i > 0:
                    continue
                if rule.within is not None and not within(rule, i):
                    continue
                if rule.transparent:
                    break
                if rule.category is None:  # a tag: keep the leaf-most one, let callers decide
                    tag = tag or rule.subcategory
                    break
                if rule.category == UNCATEGORIZED:
                    if held is None and rule.kernel and rule.subcategory in CALLER_PLACED:
                        held = Decision(UNCATEGORIZED, rule.subcategory, rule, i)
                        tag = rule.subcategory  # named over a deeper tag ("scheduler"), wherever it lands
                        break
                    if held is not None:
                        if rule.kernel:  # its own kernel frames, the interrupt that caused it: not the caller
                            break
                        return held  # the program's own code or a runtime: Uncategorized, under the held name
                elif held is not None:
                    return Decision(rule.category, tag, rule, i)
                # in Uncategorized the subcategory is all that says what the time is: the rule names it
                sub = (rule.subcategory or tag) if rule.category == UNCATEGORIZED else (tag or rule.subcategory)
                return Decision(rule.category, sub, rule, i)
        if held is not None:
            return held
        return Decision(UNCATEGORIZED, tag, None, None) if tag else UNDECIDED
