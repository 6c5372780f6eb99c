"""The verdict on controlled runs: one real ngtcp2 transfer per scenario, across the network lab.

The same code as bench/verdict_matrix.py (qprof.netlab: SCENARIOS, calibration,
run_scenario), one run each instead of ten: the server's cgroup capped at 0.3
of a core, the client's capped the same, neither (both uncapped, the veth shaped
with tbf far below what either side can do), and uncapped (no expected answer: on
this 2-CPU host a side's demand lands near the 90% threshold, run-queue waits
included). Every verdict, uncapped too, must be the documented rule applied to
the evidence the report shows: what was measured, not how the test set it up.
"""

from __future__ import annotations


import pytest

from qprof.netlab import (SCENARIOS, RunResult, measure_goodput, normalize_verdict, report_json, run_scenario,
                          size_for, transfer_factory)

pytestmark = [pytest.mark.root, pytest.mark.slow]
SECONDS = 6.0  # a profiled transfer of about this long per scenario (3-6 s measured)
VERDICT_OF = {(True, False): "server-limited", (False, True): "client-limited", (True, True): "both",
              (False, False): "neither"}


def side_limited(ev: dict, th: dict) -> bool:
    """The verdict's rule (attribution.verdict), from the evidence as the report prints it."""
    demand = ev["process_cpu_cores"] + ev["process_runqueue_cores"]
    return (ev["busiest_on_cpu"] + ev["busiest_runqueue"] >= th["busiest_thread_demand"]
            or (ev["capacity_cores"] > 0 and demand / ev["capacity_cores"] >= th["process_demand_of_capacity"])
            or (ev["throttled_periods"] is not None and ev["throttled_periods"] >= th["throttled_periods"]))


@pytest.fixture(scope="module")
def scenario_run(ngtcp2_tools: None, tmp_path_factory: pytest.TempPathFactory):
    """Run a scenario once per test session (calibrated size, profiled transfer, report); cached."""
    import os
    import shutil

    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None:
        pytest.skip("the network lab needs root, ip and tc (make test installs iproute2)")
    factory = transfer_factory("ngtcp2")
    done: dict[str, RunResult] = {}

    def get(name: str) -> RunResult:
        if name not in done:
            sc = SCENARIOS[name]
            size = size_for(measure_goodput(sc, factory), SECONDS)
            out = tmp_path_factory.mktemp(name) / "run"
            done[name] = run_scenario(sc, "ngtcp2", factory, size, out)
        return done[name]

    return get


def describe(r: RunResult) -> str:
    cpu = ", ".join(f"{role} {r.cpu.get(role, 0):.2f} cores"
                    + (f" throttled {r.throttled[role]:.0%}" if role in r.throttled else "")
                    for role in ("server", "client"))
    return (f"{r.scenario}: verdict {r.verdict} (expected {r.expected}), {r.goodput_mbit or 0:.0f} Mbit/s "
            f"in {r.seconds or 0:.1f} s, {cpu}")


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_scenario_verdict(scenario_run, name: str) -> None:
    r = scenario_run(name)
    print("\n" + describe(r))
    assert r.error is None, r.error
    assert r.run is not None and (r.run / "meta.json").exists()
    assert r.seconds and r.seconds > 1.0, "the transfer was too short to judge"
    if SCENARIOS[name].rate_mbit:
        assert r.goodput_mbit is not None and r.goodput_mbit <= SCENARIOS[name].rate_mbit * 1.1
    assert r.has_verdict, "the report has no verdict.limited_by"
    verdict = report_json(r.run)["verdict"]
    for role, ev in verdict["evidence"].items():
        print(f"  {role}: busiest thread {ev['busiest_on_cpu']:.2f} on CPU + {ev['busiest_runqueue']:.2f} waiting, "
              f"process {ev['process_cpu_cores']:.2f} cores, throttled {ev['throttled_periods']}, "
              f"limited {ev['cpu_limited']}")
    # each side's decision is the documented rule applied to the evidence the report shows
    sides = {role: side_limited(ev, verdict["thresholds"]) for role, ev in verdict["evidence"].items()}
    assert all(verdict["evidence"][role]["cpu_limited"] == lim for role, lim in sides.items()), verdict
    assert r.verdict == normalize_verdict(VERDICT_OF[(sides.get("server", False), sides.get("client", False))])
    if r.expected is not None:
        assert r.verdict == r.expected, describe(r)
