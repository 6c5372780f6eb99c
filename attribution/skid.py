"""Interrupt skid: samples that land where interrupts come back on, given to the work the interrupt did.

Without a PMU (most VMs) perf samples with cpu-clock, an hrtimer. Its interrupt
cannot be taken while interrupts are off, so a sample that falls due then is
taken where they come back on: at the end of an interrupt handler
(`irqentry_exit_to_user_mode`, `handle_softirqs` entered from `__irq_exit_rcu`),
under the interrupt's entry frame (`asm_sysvec_call_function_single`,
`asm_sysvec_reschedule_ipi`, `asm_sysvec_apic_timer_interrupt`...). Such a
sample stands for time the CPU spent handling that interrupt (and, on a VM,
delivering it), not for the code the interrupt happened to stop, nor for the
exit path where it was taken.

What an interrupt was for shows in the work it leaves to be done with
interrupts on, sampled normally in the same threads: the softirqs run at its
exit (`net_rx_action` after the network stack's skb-freeing IPIs:
Packet I/O) or the scheduling it caused (a reschedule IPI: the scheduler, not
QUIC work). So the skid samples of each interrupt vector in a process are
split over categories in proportion to the CPU time of those follow-up samples
of the same vector in the same process; the share whose follow-up work is
Uncategorized, or that has no follow-up samples at all, stays
Uncategorized / "interrupt skid". Skid inside one code path (a lock released
with `_raw_spin_unlock_irqrestore` under `udp_sendmsg`) needs none of this:
its callers say what ran.

Which frames are skid points and which are interrupt entries is data: the
rules of the mapping files with `leaf = true` and subcategory "interrupt
skid" (common.toml); their `within` names the entry frames.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field, replace
from typing import Iterator, Sequence

from qprof.attribution.categories import CATEGORIES, SKID, UNCATEGORIZED
from qprof.attribution.engine import Classifier, Decision
from qprof.attribution.mapping import Rule
from qprof.archive.stacks import Frame, StackRecord
from qprof.jsonvalue import JsonObject

METHOD = ("samples taken where interrupts are re-enabled after an interrupt (perf's cpu-clock timer "
          "cannot fire while they are off) are split over categories in proportion to the CPU time of the "
          "work the same interrupt vector ran with interrupts on in the same process (softirqs at its exit, "
          "scheduling), as sampled; with no such work they stay Uncategorized / interrupt skid")


def skid_rules(clf: Classifier) -> list[Rule]:
    """The classifier's skid rules: leaf-only, Uncategorized / interrupt skid, entry frames in `within`."""
    return [r for r in clf.rules if r.leaf and r.within is not None and r.category == UNCATEGORIZED
            and r.subcategory == SKID]


@dataclass
class VectorSkid:
    """One process's skid samples after one interrupt vector, and the follow-up work they are split by."""

    samples: int = 0
    period: int = 0
    to: Counter[str] = field(default_factory=Counter)  # category -> skid period given to it
    evidence: Counter[str] = field(default_factory=Counter)  # category -> period of follow-up samples
    evidence_samples: int = 0

    def shares(self, total: int) -> "VectorShares":
        """Its figures as shares of the process's sampled time (`total`), as every report shows them."""
        ev = sum(self.evidence.values()) or 1
        return VectorShares(self.samples, round(self.period / total, 6),
                            {c: round(self.to[c] / total, 6) for c in CATEGORIES if self.to[c]},
                            self.evidence_samples,
                            {c: round(self.evidence[c] / ev, 4) for c in CATEGORIES if self.evidence[c]})


@dataclass(frozen=True)
class VectorShares:
    """One vector's skid in a process, rounded: its share, where it went, and the evidence it was split by."""

    samples: int
    share: float
    to: dict[str, float]  # category -> share of the process's time given to it
    evidence_samples: int
    evidence: dict[str, float]  # category -> share of the follow-up samples

    def to_json(self) -> JsonObject:
        return {"samples": self.samples, "share": self.share, "to": self.to,
                "evidence_samples": self.evidence_samples, "evidence": self.evidence}


@dataclass(frozen=True)
class SkidSummary:
    """A process's interrupt skid (shares of its sampled time) per vector, largest first."""

    share: float = 0.0
    attributed: float = 0.0  # placed in a category by the follow-up work
    vectors: dict[str, VectorShares] = field(default_factory=dict)

    def to_json(self) -> JsonObject:
        return {"share": self.share, "attributed": self.attributed, "method": METHOD,
                "vectors": {k: v.to_json() for k, v in self.vectors.items()}}


def split(total: int, weights: dict[str, int]) -> dict[str, int]:
    """`total` (a period or a sample count) apportioned to the weights' keys by largest remainder:
    integers that add up to `total` exactly."""
    w = {k: v for k, v in weights.items() if v > 0}
    s = sum(w.values())
    if not s:
        return {}
    exact = {k: total * v / s for k, v in w.items()}
    out = {k: int(x) for k, x in exact.items()}
    for k in sorted(w, key=lambda k: (out[k] - exact[k], k))[:total - sum(out.values())]:
        out[k] += 1
    return out


class SkidSplitter:
    """Holds a run's skid samples until every follow-up sample was seen, then splits them."""

    def __init__(self) -> None:
        self.vectors: dict[int, dict[str, VectorSkid]] = defaultdict(dict)  # pid -> vector -> skid
        self._held: list[tuple[StackRecord, Decision, str]] = []
        self._rules: dict[int, list[Rule]] = {}

    def _skid_rules(self, clf: Classifier) -> list[Rule]:
        got = self._rules.get(id(clf))
        if got is None:
            got = self._rules[id(clf)] = skid_rules(clf)
        return got

    def _vector(self, pid: int, name: str) -> VectorSkid:
        v = self.vectors[pid].get(name)
        if v is None:
            v = self.vectors[pid][name] = VectorSkid()
        return v

    def offer(self, clf: Classifier, rec: StackRecord, d: Decision) -> bool:
        """Take a skid record (True: hold it) or note a follow-up sample of an interrupt (False)."""
        rules = self._skid_rules(clf)
        if not rules:
            return False
        if d.rule is not None and any(d.rule is r for r in rules):
            self._held.append((rec, d, _entry(clf, d.rule, rec.frames)))
            return True
        for r in rules:
            j = clf.context(r, rec.frames)
            if j >= 0:
                # what the interrupt's own part of the stack did, whatever code it had stopped
                v = self._vector(rec.pid, rec.frames[j][0])
                v.evidence[clf.classify(rec.frames[:j + 1]).category] += rec.period
                v.evidence_samples += rec.samples
                break
        return False

    def resolve(self) -> Iterator[tuple[StackRecord, Decision]]:
        """Every held record, cut into one part per category its vector's follow-up work went to."""
        for rec, d, name in self._held:
            v = self._vector(rec.pid, name)
            v.samples += rec.samples
            v.period += rec.period
            weights = {c: v.evidence[c] for c in CATEGORIES if c != UNCATEGORIZED}
            weights[UNCATEGORIZED] = v.evidence[UNCATEGORIZED] if v.evidence else 1
            periods = split(rec.period, weights)
            samples = split(rec.samples, weights)
            for cat in (c for c in CATEGORIES if c in periods):
                v.to[cat] += periods[cat]
                yield replace(rec, samples=samples.get(cat, 0), period=periods[cat]), replace(d, category=cat)
        self._held = []

    def summary(self, pid: int, total: int) -> SkidSummary:
        """A process's skid per interrupt vector (shares of its sampled time)."""
        vecs = self.vectors.get(pid, {})
        held = {k: v for k, v in vecs.items() if v.samples}
        share = sum(v.period for v in held.values()) / (total or 1)
        moved = sum(v.period - v.to[UNCATEGORIZED] for v in held.values()) / (total or 1)
        return SkidSummary(round(share, 6), round(moved, 6),
                           {k: v.shares(total or 1) for k, v in sorted(held.items(), key=lambda kv: -kv[1].period)})


def _entry(clf: Classifier, rule: Rule, frames: Sequence[Frame]) -> str:
    j = clf.context(rule, frames)
    return frames[j][0] if j >= 0 else "?"
