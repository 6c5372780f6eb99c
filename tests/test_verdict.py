"""The verdict's logic on synthetic /proc readings: thresholds, roles, cgroups, bad input."""

from __future__ import annotations

from typing import Any

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from qprof.attribution.verdict import THRESHOLDS, judge, side_evidence
from conftest import examples

def readings(pid: int, seconds: float, on_cpu: float, runq: float, quota: float | None = None,
             throttled: float = 0.0, syscall: str = "232", n: int = 11) -> list[dict[str, Any]]:
    """n readings over `seconds` of one single-threaded process with the given shares."""
    out = []
    for i in range(n):
        t = seconds * i / (n - 1)
        cg = {"version": "v1", "path": "/x", "quota_cores": quota, "nr_periods": int(t * 10),
              "nr_throttled": int(t * 10 * throttled), "throttled_s": t * throttled * 0.07}
        out.append({"mono": t, "t": t, "threads": {str(pid): [
            {"tid": pid, "comm": f"p{pid}", "state": "S", "utime_s": 0, "stime_s": 0, "on_cpu_s": t * on_cpu,
             "run_delay_s": t * runq, "syscall": syscall, "cpu": i % 2}]},
            "cgroups": {str(pid): cg}})
    return out


def merge(*rs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for parts in zip(*rs):
        r = {"mono": parts[0]["mono"], "t": parts[0]["t"], "threads": {}, "cgroups": {}}
        for p in parts:
            r["threads"].update(p["threads"])
            r["cgroups"].update(p["cgroups"])
        out.append(r)
    return out


def verdict(srv: list[dict[str, Any]], cli: list[dict[str, Any]], cpus: int = 2) -> Any:
    rs = merge(srv, cli)
    sides = [side_evidence(rs, 1, "server", "srv", cpus, None), side_evidence(rs, 2, "client", "cli", cpus, None)]
    return judge([s for s in sides if s is not None])


def test_busy_server_thread_is_server_limited() -> None:
    v = verdict(readings(1, 10, 0.97, 0.0), readings(2, 10, 0.6, 0.05))
    assert v.limited_by == "server-limited"
    assert "busiest thread" in v.summary and "90%" in v.summary


def test_run_queue_time_counts_as_demand() -> None:
    v = verdict(readings(1, 10, 0.5, 0.1), readings(2, 10, 0.55, 0.4))
    assert v.limited_by == "client-limited"


def test_capped_cgroup_is_limited_at_its_quota() -> None:
    v = verdict(readings(1, 10, 0.29, 0.0, quota=0.3, throttled=0.8), readings(2, 10, 0.2, 0.0))
    assert v.limited_by == "server-limited"
    ev = v.to_json()["evidence"]["server"]
    assert ev["quota_cores"] == 0.3 and ev["throttled_periods"] >= 0.75


def test_neither_when_both_wait_for_packets() -> None:
    v = verdict(readings(1, 10, 0.3, 0.02), readings(2, 10, 0.35, 0.03))
    assert v.limited_by == "neither"
    assert v.to_json()["evidence"]["server"]["blocked_in"] == {"epoll_wait": 1.0}


def test_both() -> None:
    assert verdict(readings(1, 10, 0.95, 0.0), readings(2, 10, 0.93, 0.0)).limited_by == "both"


def test_one_side_only_and_short_windows_are_noted() -> None:
    rs = readings(1, 0.2, 0.99, 0.0)
    ev = side_evidence(rs, 1, "server", "srv", 2, None)
    assert ev is not None
    v = judge([ev])
    assert v.limited_by == "neither"
    assert any("too short" in n for n in v.notes) and any("only one side" in n for n in v.notes)
    assert side_evidence(rs[:1], 1, "server", "srv", 2, None) is None


def test_thresholds_are_reported() -> None:
    v = verdict(readings(1, 10, 0.5, 0.0), readings(2, 10, 0.5, 0.0))
    assert v.to_json()["thresholds"] == THRESHOLDS


def limited_by_rule(on: float, rq: float, quota: float | None, throttled: float | None, cpus: int) -> bool:
    """The documented rule, from the shares the readings were made with."""
    demand = on + rq
    capacity = min(cpus, quota) if quota else cpus
    return (demand >= THRESHOLDS["busiest_thread_demand"]
            or demand / capacity >= THRESHOLDS["process_demand_of_capacity"]
            or (throttled is not None and throttled >= THRESHOLDS["throttled_periods"]))


@settings(max_examples=examples(200), deadline=None)
@given(st.floats(0, 2), st.floats(0, 1), st.floats(0, 2), st.floats(0, 1),
       st.one_of(st.none(), st.floats(0.05, 4)), st.floats(0, 1), st.integers(1, 64))
def test_verdict_follows_the_thresholds(on1: float, rq1: float, on2: float, rq2: float, quota: float | None,
                                        thr: float, cpus: int) -> None:
    cap1 = min(cpus, quota) if quota else cpus
    for demand, cap in ((on1 + rq1, cap1), (on2 + rq2, cpus)):  # off the thresholds by more than rounding
        assume(abs(demand - 0.9) > 1e-6 and abs(demand / cap - 0.9) > 1e-6)
    v = verdict(readings(1, 5, on1, rq1, quota, thr), readings(2, 5, on2, rq2), cpus)
    throttled = int(5 * 10 * thr) / (5 * 10) if quota else None  # readings(): 10 periods a second for 5 s
    want = {(True, False): "server-limited", (False, True): "client-limited", (True, True): "both",
            (False, False): "neither"}[(limited_by_rule(on1, rq1, quota, throttled, cpus),
                                        limited_by_rule(on2, rq2, None, None, cpus))]
    assert v.limited_by == want == v.to_json()["limited_by"]


def test_cgroup_evidence_survives_the_exit_move_to_the_root() -> None:
    """cgroup v1 moves an exiting task to the root cgroup: its last readings must not erase the quota."""
    rs = readings(2, 10, 0.3, 0.4, quota=0.3, throttled=0.95)
    for r in rs[-2:]:
        r["cgroups"]["2"] = {"version": "v1", "path": "/", "quota_cores": None, "nr_periods": 0,
                             "nr_throttled": 0, "throttled_s": 0.0}
    rs[-1]["cgroups"]["2"] = None
    v = verdict(readings(1, 10, 0.3, 0.0), rs)
    assert v.limited_by == "client-limited"
    assert v.to_json()["evidence"]["client"]["quota_cores"] == 0.3
