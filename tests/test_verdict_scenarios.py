"""The verdict on controlled runs: one real transfer per scenario, across the network lab.

The same code as bench/verdict_matrix.py (lab.scenarios: SCENARIOS, calibration,
run_scenario), one run each instead of ten, on ngtcp2; the scenarios that need
the server to pace itself (application) run on the quic-go test endpoint,
which also writes qlog in the link and application scenarios: there the
stack's own record must agree with the verdict. Uncapped runs have no
expected answer: the verdict must only be one of the four words with a cause.
The scenarios with the sides in a shared cgroup (a shell's or a service's,
none made for them) run on the multi-threaded endpoints: quic-go and the
tokio multi-thread quinn and s2n-quic. The path cells (a forwarder adding
delay and loss between the namespaces) read the stack's qlog beside the verdict.
A multi-threaded runtime uncapped is judged by pinning it: the verdict's
`scheduling` must see the same transfer pinned move more, `handoffs` less.
"""

from __future__ import annotations

import os
import shutil
import statistics
from collections import Counter
from typing import Any

import pytest

from lab.scenarios import (SCENARIOS, RunResult, measure_goodput, pinning_predictions, run_scenario, size_for,
                           transfer_factory, unprofiled_transfer, unsupported)
from qprof.attribution.causes import Cause

pytestmark = [pytest.mark.root, pytest.mark.slow]
SECONDS = 5.0  # a profiled transfer of about this long per scenario (2-8 s measured)
VERDICTS = {"server-limited", "client-limited", "both", "neither"}
QLOG_PROOF = ("link", "application")  # quic-go writes qlog here; its record must agree


@pytest.fixture(scope="module")
def scenario_run(ngtcp2_tools: None, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Run a scenario once per stack and test session (calibrated size, profiled transfer, report); cached."""
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None:
        pytest.skip("the network lab needs root, ip and tc (make test installs iproute2)")
    done: dict[tuple[str, str], RunResult] = {}

    def get(name: str, stack: str) -> RunResult:
        if (name, stack) not in done:
            from lab.endpoints.build import BuildUnavailable

            try:
                factory = transfer_factory(stack)
            except BuildUnavailable as e:
                pytest.skip(f"{stack}: {e}")
            sc = SCENARIOS[name]
            why = unsupported(sc, stack)
            if why:
                pytest.skip(f"{name}: {why}")
            size = size_for(measure_goodput(sc, stack, factory), SECONDS)
            out = tmp_path_factory.mktemp(f"{name}-{stack}") / "run"
            done[name, stack] = run_scenario(sc, stack, factory, size, out)
        return done[name, stack]

    return get


def describe(r: RunResult) -> str:
    cpu = ", ".join(f"{role} {r.cpu.get(role, 0):.2f} cores"
                    + (f" throttled {r.throttled[role]:.0%}" if role in r.throttled else "")
                    for role in ("server", "client"))
    return (f"{r.scenario} on {r.stack}: verdict {r.verdict} ({r.cause}), expected {r.expected} "
            f"({r.expected_cause}); {r.goodput_mbit or 0:.0f} Mbit/s in {r.seconds or 0:.1f} s, {cpu}")


# The sides where a shell leaves them (no cgroup of their own) on the multi-threaded endpoints: every such
# cell once across quic-go (default GOMAXPROCS) and tokio's multi-thread runtime; the bench runs them all.
SHARED_CASES = [("server-contention-shared", "quicgo"), ("client-cpuset-shared", "quicgo"), ("busy-host", "quicgo"),
                ("client-contention-shared", "quinn-mt"), ("server-quota-shared", "quinn-mt"),
                ("server-cpuset-shared", "s2nquic-mt"), ("client-quota-shared", "s2nquic-mt"),
                ("busy-host", "s2nquic-mt")]
# What binds when no CPU does: a path with loss at two round-trip times, the receiver's flow control over a path
# (ngtcp2, whose qlog names no block: its credit used up does), quic-go's runtime pool over a path; the bench runs
# every RTT and loss
SURE_RTT_MS = 35  # round trips the datagram timing read within 20% of the qlog every time (50/50, 2026-11-27)
PATH_CASES = [("path-50ms-0.5%", "ngtcp2"), ("path-10ms-2%", "ngtcp2"), ("flow-control", "ngtcp2"),
              ("path-50ms-0.5%", "quicgo")]
CASES = [(name, "ngtcp2") for name in SCENARIOS
         if not SCENARIOS[name].needs and SCENARIOS[name].own_cgroups and not SCENARIOS[name].delay_ms] + \
        [(name, "quicgo") for name in QLOG_PROOF] + SHARED_CASES + PATH_CASES


@pytest.mark.parametrize("name,stack", CASES)
def test_scenario_verdict(scenario_run: Any, name: str, stack: str) -> None:
    r = scenario_run(name, stack)
    print("\n" + describe(r))
    assert r.error is None, r.error
    assert r.run is not None and (r.run / "meta.json").exists()
    assert r.seconds and r.seconds > 1.0, "the transfer was too short to judge"
    sc = SCENARIOS[name]
    if sc.rate_mbit:
        assert r.goodput_mbit is not None and r.goodput_mbit <= sc.rate_mbit * 1.1
    if sc.app_rate_mbit:
        assert r.goodput_mbit is not None and r.goodput_mbit <= sc.app_rate_mbit * 1.1
    assert r.has_verdict, "the report has no verdict.limited_by"
    assert r.verdict in VERDICTS and r.cause
    if r.expected is not None:
        assert (r.verdict, r.cause) == (r.expected, r.expected_cause), describe(r)
    if (stack == "quicgo" and name in QLOG_PROOF) or sc.delay_ms:
        word = r.stack_word
        assert word is not None, f"{stack} wrote no qlog the report could read"
        print(f"the stack's own record: {word['shares']} ({word['packets_lost']} lost, RTT {word['rtt_ms']} ms): "
              f"agrees {word['agrees']}")
        assert word["role"] == "server" and word["agrees"] is True, word
        if sc.delay_ms:  # the stack measured the path the lab made
            assert word["rtt_ms"] is not None and abs(word["rtt_ms"] - 2 * sc.delay_ms) <= 0.2 * 2 * sc.delay_ms
            # and qprof read a round trip in the sender's datagram timing, without the qlog: the same one
            # where the probes' windows (~0.1 s on these slow paths) hold several; on the 50 ms paths 3
            # server readings of 60 were off (2026-11-27: quic-go dropping 2% read 25.0 ms twice, its
            # sends repeating twice a round trip; ngtcp2 once 11.7 ms): docs/measurements.md
            kernel = r.round_trip_ms.get("server")
            print(f"round trip: qlog {word['rtt_ms']} ms, the server's datagram timing {kernel} ms")
            if sc.cause == Cause.FLOW_CONTROL:
                # not asserted: a sender held by the receiver's credit sends when credit arrives, several
                # times a round trip, and its timing then repeats at a fraction of the round trip, with
                # ~40 messages counted on this 34 Mbit/s transfer; 2 of 13 runs read a third of it
                # (10.1 and 10.0 ms, 2026-11-28), the others 30.2-30.3 ms. The verdict does not use it.
                return
            if word["rtt_ms"] <= SURE_RTT_MS:
                assert kernel is not None
                assert abs(kernel - word["rtt_ms"]) <= 0.2 * word["rtt_ms"], (kernel, word["rtt_ms"])
            # Longer round trips are not asserted either way: targets using ~0.1 core get short windows
            # (the hooks' budget follows their CPU), and on the 50 ms path most of the transfer's windows
            # were 50-75 ms, too short to hold an echo, the first one alone longer (CI, 2026-11-28: quic-go's
            # server read none from 194 messages, its client 32.8 ms, ngtcp2's server 17.3 ms).


# quic-go's runtime queueing for the CPUs (pinning raised goodput 1.32-1.65x, 10 pairs) and s2n-quic's threads
# waiting for one another's wakeups on idle CPUs (0.66-0.89x), 2026-11-27: docs/measurements.md
PINNING_CASES = ["quicgo", "s2nquic-mt"]
# One profiled pair misjudged pinning on a host taking the VM's CPUs away (CI, 2026-11-28: s2nquic-mt x1.69 and
# quicgo x2.41, each against 10 of 10 pairs the other way the day before; quicgo read x0.98 in 1 of 3 pairs
# beside a quiet host): pinning's effect is the median of interleaved pairs, unprofiled as the verdict's
# remedy speaks of the transfer alone (quicgo 1.08-1.26, s2nquic-mt 0.78-0.99 in 4 pairs, 2026-11-28), and
# the prediction is what most of up to three uncapped verdicts say (a CI run read quic-go's CPUs idle 43%: handoffs).
PINNING_PAIRS = 5
PINNING_VERDICTS = 3
PINNING_SECONDS = 1.5  # each unprofiled transfer


@pytest.mark.parametrize("stack", PINNING_CASES)
def test_pinning_does_what_the_uncapped_verdict_predicts(scenario_run: Any, stack: str,
                                                          tmp_path: Any) -> None:
    free, bound = SCENARIOS["scheduling"], SCENARIOS["pinned"]
    first = scenario_run("scheduling", stack)
    factory = transfer_factory(stack)
    runs, said = [first], Counter[str]()
    while True:
        r = runs[-1]
        print("\n" + describe(r))
        assert r.error is None and r.has_verdict and r.goodput_mbit, describe(r)
        parts = set(pinning_predictions(r.cause))
        assert len(parts) == 1, f"the uncapped verdict predicts nothing of pinning: {describe(r)}"
        said.update(parts)
        predicted, votes = said.most_common(1)[0]
        if votes > PINNING_VERDICTS // 2:
            break
        runs.append(run_scenario(free, stack, factory, first.size, tmp_path / f"uncapped-{len(runs)}" / "run"))
    size = size_for(first.goodput_mbit * 1e6, PINNING_SECONDS, 1.0)  # the profiled rate: unprofiled runs shorter
    ratios = []
    for i in range(PINNING_PAIRS):  # ABBA: a drift of the host's speed falls on both arms alike
        order = (free, bound) if i % 2 == 0 else (bound, free)
        got = {sc.name: unprofiled_transfer(sc, stack, factory, size)[0] for sc in order}
        ratios.append(got[bound.name] / got[free.name])
        print(f"pair {i}: uncapped {got[free.name] / 1e6:.0f}, pinned {got[bound.name] / 1e6:.0f} Mbit/s: "
              f"x{ratios[-1]:.2f}")
    ratio = statistics.median(ratios)
    print(f"pinned/uncapped goodput x{ratio:.2f} (median of {PINNING_PAIRS} pairs); {votes} of {len(runs)} uncapped "
          f"verdicts predicted it would {predicted}")
    assert (ratio > 1) == (predicted == "raise"), f"x{ratio:.2f}, predicted {predicted}"
