"""The wall-clock split (attribution.waits) and the causes it lets the verdict name when no CPU binds,
on synthetic probe maps and /proc readings: pure logic, fast."""

from __future__ import annotations

from collections import Counter
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from qprof.attribution.profile import ProcessProfile, ThreadProfile
from qprof.attribution.qlog import SenderRecord
from qprof.attribution.threads import ThreadView, thread_view
from qprof.attribution.transfer import Transfer
from qprof.attribution.verdict import CAUSES, judge, side_evidence
from qprof.attribution.waits import STATES, WAIT_KINDS, wall_clock
from qprof.probes.waits.maps import WaitMaps
from conftest import examples
from test_verdict import merge, readings, typed


def maps(threads: dict[tuple[int, int], dict[str, float]], seconds: float = 10.0,
         stacks: dict[str, int] | None = None, comm: str | None = None) -> WaitMaps:
    """The waits group's printed maps: per (pid, tid), the share of `seconds` in each state; threads named
    `comm` are one pool (a thread view's pools stand in for names without one)."""
    doc: dict[str, Any] = {"@wait_ns": {}, "@wait_n": {}, "@wait_comm": {},
                           "@wait_span": {"start_ns": 0, "end_ns": int(seconds * 1e9)},
                           "@wait_stacks": stacks or {}}
    for (pid, tid), shares in threads.items():
        doc["@wait_comm"][f"{pid},{tid},{comm or f't{tid}'}"] = 1
        for state, share in shares.items():
            doc["@wait_ns"][f"{pid},{tid},{state}"] = int(share * seconds * 1e9)
            doc["@wait_n"][f"{pid},{tid},{state}"] = 10
    return WaitMaps.from_maps(doc)


def moved(pid: int, direction: str) -> Transfer:
    return Transfer(pid, 10**9, direction, "UDP", "exact", 0.0, 10.0, "test")


def verdict(srv_wall: dict[tuple[int, int], dict[str, float]], cli_wall: dict[tuple[int, int], dict[str, float]],
            srv: list[dict[str, Any]] | None = None, cli: list[dict[str, Any]] | None = None,
            record: SenderRecord | None = None, comm: str | None = None, srv_view: ThreadView | None = None) -> Any:
    rs = typed(merge(srv or readings(1, 10, 0.3, 0.01), cli or readings(2, 10, 0.2, 0.01)))
    waits = maps({**srv_wall, **cli_wall}, comm=comm)
    sides = [side_evidence(rs, 1, "server", "srv", 2, None, None, {}, moved(1, "sent"), srv_view,
                           wall_clock(waits, 1, srv_view)),
             side_evidence(rs, 2, "client", "cli", 2, None, None, {}, moved(2, "received"), None,
                           wall_clock(waits, 2, None))]
    return judge([s for s in sides if s is not None], [record] if record else None)


RECEIVER = {(2, 2): {"on_cpu": 0.2, "runnable": 0.01, "network": 0.79}}


def test_a_sender_waiting_for_the_network_names_the_path_or_flow_control() -> None:
    v = verdict({(1, 1): {"on_cpu": 0.3, "runnable": 0.01, "network": 0.69}}, RECEIVER)
    assert (v.limited_by, v.cause) == ("neither", "path/flow-control")
    assert "network 69%" in v.summary and "qlog" in v.summary


def test_the_qlog_tells_the_path_from_flow_control() -> None:
    cc = SenderRecord("s.sqlog", "server", 10.0, {"congestion_control": 9.0, "flow_control": 0.5, "application": 0.5},
                      1000, 20, True, [30.0, 31.0, 29.0])
    v = verdict({(1, 1): {"on_cpu": 0.3, "runnable": 0.01, "network": 0.69}}, RECEIVER, record=cc)
    assert (v.limited_by, v.cause) == ("neither", "path")
    assert "RTT 30.0 ms" in v.summary and "20 of 1000 packets lost" in v.summary
    assert v.stack_record is not None and v.stack_record.agrees is True
    fc = SenderRecord("s.sqlog", "server", 10.0, {"congestion_control": 1.0, "flow_control": 8.0, "application": 1.0},
                      1000, 0, True)
    assert verdict({(1, 1): {"on_cpu": 0.3, "network": 0.7}}, RECEIVER, record=fc).cause == "flow-control"


def test_a_sender_asleep_on_a_timer_is_the_application_unless_its_pacer_says_congestion() -> None:
    paced = {(1, 1): {"on_cpu": 0.1, "runnable": 0.0, "timer": 0.8, "network": 0.1}}
    assert verdict(paced, RECEIVER).cause == "application"
    cc = SenderRecord("s.sqlog", "server", 10.0, {"congestion_control": 9.0, "flow_control": 0.0, "application": 1.0},
                      1000, 5, True, [50.0])
    assert verdict(paced, RECEIVER, record=cc).cause == "path"


def test_threads_waiting_for_each_other_name_scheduling_on_their_side() -> None:
    """Two working threads of the server runnable 20% and waiting for each other 25% of their time."""
    go = {(1, 1): {"on_cpu": 0.4, "runnable": 0.2, "thread": 0.25, "network": 0.15},
          (1, 3): {"on_cpu": 0.35, "runnable": 0.2, "thread": 0.3, "network": 0.15},
          (1, 4): {"on_cpu": 0.01, "thread": 0.99}}  # an idle thread: not a working one
    v = verdict(go, RECEIVER, srv=readings(1, 10, 0.75, 0.4, threads=3, psi_full=0.05))
    assert (v.limited_by, v.cause) == ("server-limited", "scheduling")
    srv = v.to_json()["evidence"]["server"]
    assert srv["working_threads"] == 2 and srv["scheduling_wait"] == 0.475
    assert f"2 working threads runnable 20% and waiting for one another {0.275:.0%} of their wall time = 48%" in v.summary


def test_busy_cpus_say_scheduling_and_idle_ones_handoffs() -> None:
    """The same waits: with the CPUs it may use busy 88% its threads queue for them (`scheduling`, pinning
    helps); with them idle 25% of the time they wait for one another's wakeups (`handoffs`, pinning hurts)."""
    go = {(1, 1): {"on_cpu": 0.4, "runnable": 0.2, "thread": 0.25, "network": 0.15},
          (1, 3): {"on_cpu": 0.35, "runnable": 0.2, "thread": 0.3, "network": 0.15}}
    for idle, cause in ((0.12, "scheduling"), (0.25, "handoffs")):
        srv = readings(1, 10, 0.75, 0.4, threads=2, psi_full=0.05, cpu_idle=(idle, idle))
        v = verdict(go, RECEIVER, srv=srv)
        assert (v.limited_by, v.cause) == ("server-limited", cause)
        found = {f.threshold: f for f in v.sides[0].findings}
        assert found["handoffs_cpus_idle"].met == (cause == "handoffs")
        assert found["handoffs_cpus_idle"].value == idle
        assert found["scheduling_wait"].cause == cause and found["scheduling_wait"].met
        assert v.sides[0].reasons[0].startswith("its 2 working threads runnable 20%")
        want = "expected to raise goodput" if cause == "scheduling" else "expected to lower goodput"
        assert any(n.startswith("server: ") and want in n for n in v.notes)


def test_a_runtime_monitor_is_never_a_working_thread() -> None:
    """A quic-go server pacing itself (CI 2026-11-29, the `application` scenario): its busiest thread was
    sysmon, the runtime's monitor, on a CPU 13% of the time and asleep in its own polling; beside an M
    on a CPU 12%, the two read as working threads waiting for one another (`handoffs`, server-limited).
    Its pool is `works = false` (mappings/go-runtime.toml): sysmon runs no goroutine, and the M alone
    is no pool of working threads."""
    paced = {(1, 1): {"on_cpu": 0.13, "runnable": 0.24, "timer": 0.55, "thread": 0.08},
             (1, 3): {"on_cpu": 0.12, "runnable": 0.11, "network": 0.06, "timer": 0.16, "thread": 0.55}}
    srv = readings(1, 10, 0.25, 0.1, threads=2, cpu_idle=(0.5, 0.5))
    assert verdict(paced, RECEIVER, srv=srv).cause == "handoffs", "counted as working, sysmon makes two"
    go = load_go_mapping_pools()
    prof = ProcessProfile(1, "srv", "server", pool_notes={p.name: p.note for p in go},
                          monitor_pools=frozenset(p.name for p in go if not p.works))
    prof.threads = {1: ThreadProfile(1, "p1", pools=Counter({"Go sysmon": 1})),
                    3: ThreadProfile(3, "p1", pools=Counter({"Go Ms": 1}))}
    view = thread_view(typed(srv), 1, prof, 1e-9)
    assert {p.name: p.works for p in view.pools if p.name.startswith("Go")} == {"Go sysmon": False, "Go Ms": True}
    v = verdict(paced, RECEIVER, srv=srv, srv_view=view)
    assert v.limited_by == "neither" and v.sides[0].working_threads == 1
    assert not any(f.threshold == "scheduling_wait" for f in v.sides[0].findings)


def load_go_mapping_pools() -> list[Any]:
    """The pools the shipped Go runtime mapping names."""
    from qprof.attribution.mapping import MappingSet

    (go,) = [f for f in MappingSet.load([]).files if f.name == "go-runtime"]
    return go.pools


def test_a_runtime_pool_waits_for_what_wakes_its_threads() -> None:
    """Go's threads park on a futex until the one polling the network wakes them: the pool's waits other
    than on its own threads name what it waited for; only waits on its own threads are its own input."""
    go = {(1, 1): {"on_cpu": 0.05, "network": 0.3, "timer": 0.02, "thread": 0.63},
          (1, 3): {"on_cpu": 0.02, "network": 0.25, "thread": 0.73}, (1, 4): {"on_cpu": 0.01, "thread": 0.99}}
    v = verdict(go, RECEIVER, srv=readings(1, 10, 0.08, 0.0, threads=3), comm="go")
    assert (v.cause, v.sides[0].waited_for) == ("path/flow-control", "network")
    assert "of go:" in v.summary and "its pool waited longest" in v.summary
    own_input = {(1, 1): {"on_cpu": 0.05, "network": 0.02, "thread": 0.93}, (1, 3): {"on_cpu": 0.5, "thread": 0.5}}
    v = verdict(own_input, RECEIVER, srv=readings(1, 10, 0.6, 0.0, threads=2), comm="go")
    assert (v.cause, v.sides[0].waited_for) == ("application", "thread")


def test_one_working_thread_is_never_scheduling() -> None:
    one = {(1, 1): {"on_cpu": 0.4, "runnable": 0.3, "thread": 0.3}, (1, 3): {"on_cpu": 0.01, "thread": 0.99}}
    v = verdict(one, RECEIVER)
    assert v.cause != "scheduling"
    assert not any(f.cause == "scheduling" for s in v.sides for f in s.findings)


def test_without_the_waits_probes_the_old_label_stays() -> None:
    rs = typed(merge(readings(1, 10, 0.3, 0.01), readings(2, 10, 0.2, 0.01)))
    sides = [side_evidence(rs, 1, "server", "srv", 2, None, None, {}, moved(1, "sent")),
             side_evidence(rs, 2, "client", "cli", 2, None, None, {}, moved(2, "received"))]
    v = judge([s for s in sides if s is not None])
    assert (v.limited_by, v.cause) == ("neither", "flow-control/application")


def test_wall_clock_pools_threads_and_scales_stacks_to_the_exact_totals() -> None:
    w = wall_clock(maps({(1, 1): {"on_cpu": 0.5, "network": 0.5}, (1, 2): {"on_cpu": 0.1, "timer": 0.9}},
                        stacks={"1;network;main;epoll_wait": 300, "1;network;main;recvmsg": 100,
                                "1;timer;main;nanosleep": 50, "2;timer;x": 5}), 1, None)
    assert w is not None
    assert [t.tid for t in w.threads] == [1, 2]
    assert abs(w.total.seconds["network"] - 5.0) < 1e-6 and abs(w.total.window_s - 20.0) < 1e-6
    assert abs(w.stacks["network"]["main;epoll_wait"] - 3.75) < 1e-6
    assert abs(sum(w.stacks["timer"].values()) - 9.0) < 1e-6
    assert w.closure < 1e-6
    assert wall_clock(maps({(1, 1): {"on_cpu": 1.0}}), 7, None) is None


@settings(max_examples=examples(200), deadline=None)
@given(st.dictionaries(st.tuples(st.integers(1, 3), st.integers(1, 40)),
                       st.dictionaries(st.sampled_from(STATES), st.floats(0, 1)), max_size=8))
def test_any_split_adds_up_and_any_verdict_names_a_known_cause(threads: dict[tuple[int, int], dict[str, float]]) -> None:
    waits = maps(threads)
    for pid in (1, 2, 3):
        w = wall_clock(waits, pid, None)
        if w is None:
            continue
        for t in w.threads:
            assert abs(sum(t.split.seconds.values()) - t.split.window_s) <= 1e-9 * max(1.0, t.split.window_s)
            assert all(0.0 <= t.split.share(k) <= 1.0 + 1e-9 for k in STATES)
            assert t.split.waited_for is None or t.split.waited_for in WAIT_KINDS
    srv = {k: v for k, v in threads.items() if k[0] == 1}
    cli = {(2, k[1]): v for k, v in threads.items() if k[0] == 2}
    v = verdict(srv, cli)
    assert set(v.cause.split("+")) <= set(CAUSES)


def test_the_qlog_names_the_path_over_a_runtime_pool_waiting_on_itself() -> None:
    """A Go pool whose waits are nearly all on its own threads reads as its own input, unless the stack's
    qlog says its window was full most of the time: then the path holds it."""
    own = {(1, 1): {"on_cpu": 0.02, "network": 0.03, "thread": 0.95}, (1, 3): {"on_cpu": 0.02, "thread": 0.98}}
    srv = readings(1, 10, 0.04, 0.0, threads=2)
    assert verdict(own, RECEIVER, srv=srv, comm="go").cause == "application"
    cc = SenderRecord("s.sqlog", "server", 10.0, {"congestion_control": 9.4, "flow_control": 0.0, "application": 0.6},
                      1000, 5, True, [50.0])
    assert verdict(own, RECEIVER, srv=srv, comm="go", record=cc).cause == "path"
