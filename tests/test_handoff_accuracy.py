"""Accuracy against ground truth on threads that hand work to each other.

tests/workloads/handoff.c runs three threads (producer -> worker -> sender) that hand items through
mutex+condvar queues; its queue functions are Connection Mgmt by tests/workloads/handoff.toml, as a
user would name them. Each thread measures its own CPU time per phase (CLOCK_THREAD_CPUTIME_ID), which
counts a handoff's CPU (a futex wait or wake, a reschedule IPI and the switch it causes, a preemption
at an interrupt's exit) and another tool's eBPF program inside a system call (this VM runs one on
udp_send_skb) in the function that called or was interrupted. Recorded with `qprof record` as a user
records (default probes and scope), qprof's shares must match per category.

Tolerance: within 2 pp, or within the binomial bound tests/test_accuracy.py uses (4 standard errors
of the expected share at the run's sample count) where that is stricter: 1.5-2 pp at this run's
~5,000-10,000 samples. qprof's own probes' frames are shown apart (Uncategorized / eBPF probes: the
observer's cost, stated as probe_share) though they run in the sender's system calls, so, as in
tests/test_accuracy.py, Packet I/O and Uncategorized may be off by that share beyond the bound; and
what Uncategorized holds above the clock beyond them (work no rule places) may be missing from each
other category in proportion to its time.

Measured on qprof's 2-vCPU VM (2026-11-27, 6-8 s runs at 999 Hz), before handoffs and other eBPF
programs were placed under their callers (4 runs): Packet I/O 1.4-1.9 pp under the clock and
Uncategorized 1.5-2.0 pp over it (the VM's program on udp_send_skb: 1.0-1.1% of the samples, in the
sender's send path; thread handoffs under a mapped caller: under 0.1%); after (8 runs): every category
within 1.6 pp, Uncategorized the most (+0.4 to +1.6 pp: clock reads dearer in place than back to
back, interrupt and softirq work no rule places, the probes). Before, the check of the stacks below
failed on every run here: the VM's program under handoff_transmit's sendto was Uncategorized.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import pytest

from conftest import ROOT, build_c, past_the_clock, qprof, steal_s, stolen_since
from qprof.archive import Run
from qprof.archive.stacks import StackRecord
from qprof.attribution.categories import CALLER_PLACED, CATEGORIES, OTHER_BPF, PACKET_IO, UNCATEGORIZED
from qprof.attribution.engine import Decision
from qprof.attribution.mapping import MappingSet
from qprof.attribution.profile import attribute

pytestmark = [pytest.mark.root, pytest.mark.slow]
WORKLOAD = ROOT / "tests" / "workloads"
MAPPING = WORKLOAD / "handoff.toml"
SECONDS = "6"  # wall time; the threads use 0.8-1.6 CPUs of two
FREQUENCY = "999"  # ~5,000-10,000 samples in SECONDS
Z = 4.0  # standard errors, as tests/test_accuracy.py
MAX_ERROR = 0.02
# the workload's functions a rule of handoff.toml places (the frames a handoff or eBPF program must go to)
MAPPED = ("handoff_queue_push", "handoff_queue_pop", "handoff_transmit", "handoff_seal")


def tolerance(expected: float, measured: float, samples: int) -> float:
    """The bound for a share: the standard error at the larger of the two shares (I/O is none of the
    threads' time, yet the main thread writes OUT.json: a sample or two)."""
    share = max(expected, measured)
    return min(MAX_ERROR, Z * math.sqrt(share * (1 - share) / samples))


def test_handoffs_are_placed_where_the_threads_own_clocks_count_them(kernel_facing: None, tmp_path: Path,
                                                                      user_config: Path) -> None:
    binary = build_c(WORKLOAD / "handoff.c", "handoff", ["-pthread", "-lcrypto"])
    truth_file = tmp_path / "truth.json"
    run = tmp_path / "run"
    stolen = steal_s()
    qprof("record", "-q", "-F", FREQUENCY, "-o", str(run), "--", str(binary), SECONDS, str(truth_file))
    stolen = stolen_since(stolen)
    truth = json.loads(truth_file.read_text())
    assert abs(sum(truth[c] for c in CATEGORIES) - truth["total"]) < 1e-3, "the workload's categories add up"
    expected = {c: truth[c] / truth["total"] for c in CATEGORIES}
    report = json.loads(qprof("report", str(run), "--format", "json", "--mapping", str(MAPPING)).stdout)
    (p,) = report["processes"]
    n = p["samples"]
    probes, other = p["probe_share"], p["other_bpf_share"]
    errors = {c: p["categories"][c] - expected[c] for c in CATEGORIES}
    # samples past the threads' CPU clock (steal) may be in any category (CI: 8.37 s of samples for 7.99 s of
    # clock, Uncategorized +2.26 pp)
    past = past_the_clock(p["cpu_seconds"], truth["total"], stolen)
    print(f"\nsamples={n} cpu={p['cpu_seconds']:.2f}s truth={truth['total']:.2f}s items={truth['items']} "
          f"waits={truth['waits']} eBPF probes {probes:.2%}, other eBPF programs {other:.2%}; the host took "
          f"{stolen:.2f} CPU s in the run, samples past the clock {past:.2%}")
    # qprof's probes run in the sender's system calls: their frames may move Packet I/O to Uncategorized
    allowed = {c: tolerance(expected[c], p["categories"][c], n) + past
               + (probes if c in (PACKET_IO, UNCATEGORIZED) else 0.0) for c in CATEGORIES}
    # Work no rule places (interrupt and softirq work, clock reads dearer in place) is Uncategorized above
    # the clock and missing from the categories it interrupted, each in proportion to its time: CI read
    # Uncategorized +1.15 pp and Connection Mgmt -1.93 pp (2026-11-28), 0.38 pp of it that share.
    unplaced = max(0.0, errors[UNCATEGORIZED] - probes)
    for c in CATEGORIES:
        if c != UNCATEGORIZED:
            allowed[c] += unplaced * expected[c] / (1 - expected[UNCATEGORIZED])
    for c in CATEGORIES:
        print(f"  {c:16s} qprof {p['categories'][c]:6.2%}  self-measured {expected[c]:6.2%}  "
              f"error {errors[c] * 100:+.2f} pp  (allowed {allowed[c] * 100:.2f} pp)")
    assert n >= 4000, "too few samples for the bound"
    assert truth["waits"] > truth["items"] / 2, "the threads waited for each other"
    for c in CATEGORIES:
        assert abs(errors[c]) <= allowed[c], f"{c}: {errors[c] * 100:+.2f} pp"

    # Where the placed samples went, from the stacks: a handoff or another tool's eBPF program under a
    # function handoff.toml places is that function's category, named by its subcategory; Uncategorized
    # keeps the name only without such a caller. The other-eBPF share is still all of it, wherever it went.
    misplaced: Counter[str] = Counter()
    named: Counter[tuple[str, str]] = Counter()
    total = 0

    def visit(rec: StackRecord, d: Decision) -> None:
        nonlocal total
        total += rec.period
        if d.subcategory in CALLER_PLACED:
            named[(d.category, d.subcategory)] += rec.period
            if d.category == UNCATEGORIZED and any(sym in MAPPED for sym, _ in rec.frames):
                misplaced[";".join(sym for sym, _ in reversed(rec.frames))] += rec.period

    attribute(Run.open(run), MappingSet.load([str(MAPPING)]), visit=visit)
    print("  placed: " + ", ".join(f"{c} / {s} {v / total:.2%}" for (c, s), v in named.most_common()))
    assert not misplaced, misplaced.most_common(3)
    assert abs(sum(v for (_, s), v in named.items() if s == OTHER_BPF) / total - other) < 1e-4
