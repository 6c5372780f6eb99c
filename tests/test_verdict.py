"""The verdict's logic on synthetic /proc readings: thresholds, causes, capacity, drops, queues, bad input."""

from __future__ import annotations

from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from qprof.attribution.packetio import PacketIO, ProcessPacketIO
from qprof.probes.packetio.estimate import Estimate
from qprof.attribution.transfer import Transfer
from qprof.attribution.causes import Cause, causes_of
from qprof.attribution.verdict import CAUSES, CHECK_GROUPS, THRESHOLDS, judge, service_evidence, side_evidence
from qprof.archive import schema
from qprof.archive.model import NamespaceQueues, ProcReading
from conftest import examples

def readings(pid: int, seconds: float, on_cpu: float, runq: float, quota: float | None = None,
             throttled: float = 0.0, syscall: str = "232", n: int = 11, threads: int = 1,
             psi_full: float | None = None, psi_some: float | None = None, cpus: list[int] | None = None,
             cpuset: list[int] | None = None, procs_in_cgroup: int = 1,
             cpu_idle: tuple[float, ...] | None = None) -> list[dict[str, Any]]:
    """n readings over `seconds` of one process whose `threads` threads share `on_cpu` and `runq`
    (cores) equally; with `psi_full`, its own cgroup's CPU pressure; with `cpu_idle`, the share of
    the time each of the host's CPUs was idle."""
    out = []
    for i in range(n):
        t = seconds * i / (n - 1)
        cg = {"version": "v1", "path": "/x", "quota_cores": quota, "nr_periods": int(t * 10),
              "nr_throttled": int(t * 10 * throttled), "throttled_s": t * throttled * 0.07}
        pressure = None if psi_full is None else {"some_s": t * (psi_some or psi_full), "full_s": t * psi_full}
        out.append({"mono": t, "t": t, "threads": {str(pid): [
            {"tid": pid + k, "comm": f"p{pid}", "state": "S", "utime_s": 0, "stime_s": 0,
             "on_cpu_s": t * on_cpu / threads, "run_delay_s": t * runq / threads, "syscall": syscall, "cpu": i % 2}
            for k in range(threads)]},
            "cgroups": {str(pid): cg},
            "limits": {str(pid): {"cpus_allowed": cpus or [0, 1], "cpuset": cpuset or [0, 1], "pressure": pressure,
                                  "pressure_procs": procs_in_cgroup}},
            "pressure": {"some_s": t * 0.1, "full_s": 0.0}})
        if cpu_idle is not None:
            out[-1]["cpu_idle"] = {str(c): 1000.0 + t * idle for c, idle in enumerate(cpu_idle)}
    return out


def typed(rs: list[dict[str, Any]]) -> list[ProcReading]:
    """The readings as the archive hands them out (they are written as proc.jsonl's lines): each
    checked against the line's shape, then decoded, as Run.proc_readings reads them."""
    for r in rs:
        schema.validate(r, schema.PROC_READING, "proc.jsonl")
    return [schema.decode(ProcReading, r) for r in rs]


def merge(*rs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for parts in zip(*rs):
        r: dict[str, Any] = {"mono": parts[0]["mono"], "t": parts[0]["t"], "threads": {}, "cgroups": {}, "limits": {},
                             "pressure": parts[0]["pressure"]}
        if "cpu_idle" in parts[0]:
            r["cpu_idle"] = parts[0]["cpu_idle"]
        for p in parts:
            for k in ("threads", "cgroups", "limits"):
                r[k].update(p[k])
        out.append(r)
    return out


def packet_io(client_rx: float = 0, client_drops: dict[str, int] | None = None) -> PacketIO:
    """The probes' view: the client received `client_rx` datagrams and lost `client_drops` at its port."""
    cli = ProcessPacketIO(2, drops=dict(client_drops or {}))
    cli.rx.dgrams = int(client_rx)
    cli.estimates["rx.datagrams"] = Estimate.of(client_rx)
    return PacketIO({1: ProcessPacketIO(1), 2: cli}, {}, {}, {}, None, [])


def verdict(srv: list[dict[str, Any]], cli: list[dict[str, Any]], cpus: int = 2, pio: PacketIO | None = None,
            qdiscs: dict[str, Any] | None = None) -> Any:
    rs = typed(merge(srv, cli))
    queues = {ns: schema.decode(NamespaceQueues, q) for ns, q in (qdiscs or {}).items()}
    sides = [side_evidence(rs, 1, "server", "srv", cpus, pio, None, queues),
             side_evidence(rs, 2, "client", "cli", cpus, pio, None, queues)]
    return judge([s for s in sides if s is not None])


def test_busy_server_thread_is_server_limited_cpu_busy() -> None:
    v = verdict(readings(1, 10, 0.97, 0.0), readings(2, 10, 0.6, 0.05))
    assert (v.limited_by, v.cause) == ("server-limited", "cpu-busy")
    assert "busiest thread" in v.summary and "90%" in v.summary


def test_a_service_whose_workers_together_fill_the_cpus_limits() -> None:
    """A server with a worker per core (attach --cgroup): four workers each on a CPU 48% of the time, none
    near a limit on its own, together on 1.92 of the host's 2 CPUs: the service is cpu-busy, the run
    server-limited, and the summary speaks for the service, each worker judged in the evidence."""
    workers = [11, 12, 13, 14]
    rs = typed(merge(*(readings(p, 10, 0.48, 0.02, cpu_idle=(0.03, 0.03)) for p in workers),
                     readings(2, 10, 0.05, 0.0)))
    sides = [s for p in workers if (s := side_evidence(rs, p, "server", "worker", 2, None)) is not None]
    assert len(sides) == 4 and not any(s.cpu_limited for s in sides)
    whole = service_evidence(sides, "/svc")
    assert whole is not None and whole.members == workers
    client = side_evidence(rs, 2, "client", "cli", 2, None)
    assert client is not None
    v = judge([*sides, whole, client])
    assert (v.limited_by, v.cause) == ("server-limited", "cpu-busy")
    assert v.summary.startswith("server service /svc is cpu-busy: process on a CPU 1.92 cores of 2.00")
    assert set(v.to_json()["evidence"]) == {"server 11", "server 12", "server 13", "server 14",
                                           "server service /svc", "client"}
    alone = service_evidence(sides[:1], "/svc")
    assert alone is None, "one process judged is judged as itself"


def test_one_thread_waiting_half_its_runnable_time_is_starved() -> None:
    """One busy process beside it on its CPU: on a CPU 26%, in the run queue 26% (the case that said
    'neither' before): stalled for half of what it got."""
    v = verdict(readings(1, 10, 0.26, 0.26), readings(2, 10, 0.22, 0.03))
    assert (v.limited_by, v.cause) == ("server-limited", "cpu-starved")
    srv = v.to_json()["evidence"]["server"]
    assert srv["stalled_from"] == "its one thread's run-queue time"
    assert srv["stall_ratio"] == 0.5


def test_threads_waiting_for_each_other_are_not_starved() -> None:
    """A Go-like process: its threads' summed run-queue time is as large as its CPU time, but its cgroup's
    PSI says it was rarely stalled as a whole."""
    v = verdict(readings(1, 10, 0.45, 0.5, threads=6, psi_full=0.07, psi_some=0.4), readings(2, 10, 0.4, 0.02))
    assert v.limited_by == "neither"
    srv = v.to_json()["evidence"]["server"]
    assert srv["stalled_from"].startswith("CPU pressure") and srv["stalled"] == 0.07


def test_multithreaded_stall_from_its_cgroups_pressure() -> None:
    v = verdict(readings(1, 10, 0.2, 0.5, threads=4), readings(2, 10, 0.45, 0.9, threads=6, psi_full=0.46))
    assert (v.limited_by, v.cause) == ("client-limited", "cpu-starved")
    srv = v.to_json()["evidence"]["server"]
    assert srv["stalled"] is None, "summed run-queue time of threads is not a stall"
    assert any("stalls unknown" in n for n in v.notes)


def test_stalls_beside_idle_cpus_are_latency_not_starvation() -> None:
    """A fresh-clone run with one busy process on the 2-CPU host: the quic-go server pacing itself to
    100 Mbit/s got it (99 Mbit/s), on a CPU 0.25 cores, its cgroup's PSI full 18% (42% as long as it
    ran and stalled), blocked 73% of the time; the CPUs it may use were idle for longer than it stalled.
    With the same stalls on saturated CPUs it is starved."""
    def server(cpu_idle: tuple[float, float]) -> list[dict[str, Any]]:
        return readings(1, 3.5, 0.25, 0.59, threads=5, psi_full=0.18, psi_some=0.34, cpu_idle=cpu_idle)

    client = readings(2, 3.5, 0.15, 0.38, threads=5, psi_full=0.13, psi_some=0.23, cpu_idle=(0.2, 0.2))
    v = verdict(server((0.2, 0.2)), client)
    assert (v.limited_by, v.cause) == ("neither", "flow-control/application")
    srv = v.to_json()["evidence"]["server"]
    assert srv["cpus_busy"] == 0.8 and srv["stall_ratio"] > THRESHOLDS["stall_ratio"]
    assert any(f["threshold"] == "cpus_busy" and not f["met"] for f in srv["findings"])
    v = verdict(server((0.03, 0.05)), client)
    assert (v.limited_by, v.cause) == ("server-limited", "cpu-starved")
    assert v.to_json()["evidence"]["server"]["cpus_busy"] == 0.96


def test_starved_on_its_one_saturated_cpu_whatever_the_other_does() -> None:
    """Bound to CPU 0 beside a busy process (the contention scenario): CPU 0 never idle, CPU 1 mostly
    idle. Only the CPUs it may use count."""
    v = verdict(readings(1, 10, 0.26, 0.26, cpus=[0], cpu_idle=(0.0, 0.7)), readings(2, 10, 0.22, 0.03))
    assert (v.limited_by, v.cause) == ("server-limited", "cpu-starved")
    srv = v.to_json()["evidence"]["server"]
    assert srv["usable_cpus"] == [0] and srv["cpus_busy"] == 1.0


def test_a_shared_cgroups_pressure_is_not_the_sides() -> None:
    v = verdict(readings(1, 10, 0.45, 0.9, threads=6, psi_full=0.46, procs_in_cgroup=3), readings(2, 10, 0.4, 0.02))
    assert v.limited_by == "neither"
    assert v.to_json()["evidence"]["server"]["pressure_full"] is None


def test_capacity_is_affinity_and_cpuset_and_quota() -> None:
    """Four threads at 0.23 cores each: nothing near a CPU, but the process may use only CPU 1."""
    v = verdict(readings(1, 10, 0.92, 0.0, threads=4, cpus=[0, 1], cpuset=[1]), readings(2, 10, 0.3, 0.0),
                cpus=2)
    assert (v.limited_by, v.cause) == ("server-limited", "cpu-busy")
    srv = v.to_json()["evidence"]["server"]
    assert srv["capacity_cores"] == 1 and "cpuset (CPU 1)" in srv["capacity_from"]
    v = verdict(readings(1, 10, 0.92, 0.0, threads=4, cpus=[1], cpuset=[0, 1], quota=0.5), readings(2, 10, 0.3, 0))
    assert v.to_json()["evidence"]["server"]["capacity_cores"] == 0.5
    v = verdict(readings(1, 10, 0.92, 0.0, threads=4), readings(2, 10, 0.3, 0.0), cpus=2)
    assert v.limited_by == "neither", "on 2 free CPUs 0.92 cores is not a limit"


def test_capped_cgroup_is_starved_by_throttling() -> None:
    v = verdict(readings(1, 10, 0.29, 0.0, quota=0.3, throttled=0.8), readings(2, 10, 0.2, 0.0))
    assert (v.limited_by, v.cause) == ("server-limited", "cpu-starved")
    ev = v.to_json()["evidence"]["server"]
    assert ev["quota_cores"] == 0.3 and ev["throttled_periods"] >= 0.75
    assert any(f["threshold"] == "throttled_periods" and f["met"] for f in ev["findings"])


def test_receive_buffer_drops_limit_the_receiver() -> None:
    pio = packet_io(client_rx=80_000, client_drops={"SOCKET_RCVBUFF": 18_000, "NOT_SPECIFIED": 3})
    v = verdict(readings(1, 10, 0.4, 0.03), readings(2, 10, 0.35, 0.03), pio=pio)
    assert (v.limited_by, v.cause) == ("client-limited", "receive-buffer")
    cli = v.to_json()["evidence"]["client"]
    assert cli["receive_drops"] == 18_000 and cli["drops"] == 18_003
    assert 0.18 < cli["receive_drop_share"] < 0.19


def test_few_drops_do_not_decide() -> None:
    pio = packet_io(client_rx=300_000, client_drops={"SOCKET_RCVBUFF": 500})  # 0.17%: bursts, not a limit
    assert verdict(readings(1, 10, 0.4, 0.03), readings(2, 10, 0.35, 0.03), pio=pio).limited_by == "neither"


def test_a_cpu_limited_sender_with_a_few_drops_at_the_receiver() -> None:
    """A starved sender sends in bursts: a few drops at the receiver (0.2%) do not move the verdict."""
    pio = packet_io(client_rx=300_000, client_drops={"SOCKET_RCVBUFF": 561})
    v = verdict(readings(1, 10, 0.26, 0.26), readings(2, 10, 0.35, 0.03), pio=pio)
    assert (v.limited_by, v.cause) == ("server-limited", "cpu-starved")
    assert "SOCKET_RCVBUFF 561" in " ".join(v.notes)


def test_losing_a_fifth_of_the_datagrams_binds_before_the_senders_cpu() -> None:
    pio = packet_io(client_rx=80_000, client_drops={"SOCKET_RCVBUFF": 18_000})
    v = verdict(readings(1, 10, 0.3, 0.0, quota=0.3, throttled=0.9), readings(2, 10, 0.35, 0.03), pio=pio)
    assert (v.limited_by, v.cause) == ("client-limited", "receive-buffer")
    assert any(n.startswith("server was cpu-starved too") for n in v.notes)
    assert v.to_json()["evidence"]["server"]["cause"] is None


def qdiscs(pid: int, packets: int, overlimits: int, drops: int = 0) -> dict[str, Any]:
    q0 = {"dev": "veth0", "kind": "tbf", "packets": 0, "overlimits": 0, "drops": 0, "requeues": 0}
    return {"net:[1]": {"pids": [pid], "first": [q0], "last": [{**q0, "packets": packets, "overlimits": overlimits,
                                                                  "drops": drops}]}}


def test_a_queue_on_the_way_is_the_link() -> None:
    v = verdict(readings(1, 10, 0.1, 0.02), readings(2, 10, 0.15, 0.01), qdiscs=qdiscs(1, 54_000, 13_000, 1))
    assert (v.limited_by, v.cause) == ("neither", "link")
    assert "13001 of 54000" in v.summary


def test_a_filled_queue_binds_before_a_senders_stalls() -> None:
    """The sender kept a shaper's queue full: it outpaced the link, whatever stalls it had."""
    v = verdict(readings(1, 10, 0.43, 1.1, threads=6, psi_full=0.31), readings(2, 10, 0.45, 0.6, threads=6,
                                                                             psi_full=0.18),
                qdiscs=qdiscs(1, 58_000, 15_000))
    assert (v.limited_by, v.cause) == ("neither", "link")
    assert any(n.startswith("server was cpu-starved too") and "outpaced the link" in n for n in v.notes)


def test_neither_with_nothing_found_is_flow_control_or_application() -> None:
    v = verdict(readings(1, 10, 0.3, 0.02), readings(2, 10, 0.35, 0.03), qdiscs=qdiscs(1, 54_000, 0))
    assert (v.limited_by, v.cause) == ("neither", "flow-control/application")
    assert v.to_json()["evidence"]["server"]["blocked_in"] == {"epoll_wait": 1.0}


def test_both() -> None:
    v = verdict(readings(1, 10, 0.95, 0.0), readings(2, 10, 0.3, 0.0, quota=0.3, throttled=0.9))
    assert (v.limited_by, v.cause) == ("both", "cpu-busy+cpu-starved")


def test_one_side_only_and_short_windows_are_noted() -> None:
    rs = typed(readings(1, 0.2, 0.99, 0.0))
    ev = side_evidence(rs, 1, "server", "srv", 2, None)
    assert ev is not None
    v = judge([ev])
    assert v.limited_by == "neither"
    assert any("too short" in n for n in v.notes) and any("only one side" in n for n in v.notes)
    assert side_evidence(rs[:1], 1, "server", "srv", 2, None) is None


def test_thresholds_and_findings_are_reported() -> None:
    v = verdict(readings(1, 10, 0.5, 0.0), readings(2, 10, 0.5, 0.0))
    doc = v.to_json()
    assert doc["thresholds"] == THRESHOLDS
    for f in doc["evidence"]["server"]["findings"]:
        assert f["limit"] == THRESHOLDS[f["threshold"]] and f["met"] == (f["value"] >= f["limit"])


CPU_CAUSES = ("cpu-busy", "cpu-starved")
VERDICT_OF = {(True, False): "server-limited", (False, True): "client-limited", (True, True): "both",
              (False, False): "neither"}


@settings(max_examples=examples(200), deadline=None)
@given(st.floats(0, 2), st.floats(0, 1), st.floats(0, 2), st.floats(0, 1),
       st.one_of(st.none(), st.floats(0.05, 4)), st.floats(0, 1), st.integers(1, 64), st.integers(1, 8),
       st.one_of(st.none(), st.floats(0, 1)), st.one_of(st.none(), st.floats(0, 1)))
# a stall ratio a hair under its 0.33 limit (0.329998) that the report prints as 0.33: judged as printed
@example(on1=0.0, rq1=0.0, on2=1.5, rq2=0.7388, quota=None, thr=0.0, cpus=1, threads=1, psi=None, idle=None)
def test_verdict_follows_the_findings(on1: float, rq1: float, on2: float, rq2: float, quota: float | None,
                                      thr: float, cpus: int, threads: int, psi: float | None,
                                      idle: float | None) -> None:
    """Without drops or queues, a side limits exactly when its CPU findings say so, and the verdict is
    the pair of sides' answers: what was measured decides, checked against the findings the report prints."""
    cpu_idle = None if idle is None else (idle,) * cpus
    v = verdict(readings(1, 5, on1, rq1, quota, thr, threads=threads, psi_full=psi, cpu_idle=cpu_idle),
                readings(2, 5, on2, rq2, cpu_idle=cpu_idle), cpus)
    doc = v.to_json()
    assert doc["limited_by"] == v.limited_by
    assert set(v.cause.split("+")) <= set(CAUSES)
    for side in v.sides:  # every finding shown in a group; a met group not its cause says why
        grouped = [f for _, fs, _ in side.groups() for f in fs]
        assert all(f in grouped for f in side.findings), (side.findings, side.groups())
        for g, fs, met in side.groups():
            assert met == (any if g.combine == "any" else all)(f.met for f in fs)
            assert not met or g.cause == side.cause or side.not_its_cause(g)
    limited = {}
    for role in ("server", "client"):
        findings = doc["evidence"][role]["findings"]
        for f in findings:
            assert f["met"] == (f["value"] >= f["limit"]), f
        met = {f["threshold"]: f["met"] for f in findings if f["cause"] in CPU_CAUSES}
        # stalled decides only together with the stall ratio (stalled as long as it ran) and, when the
        # idle time is known, CPUs it may use that were busy
        limited[role] = (any(met.get(k, False) for k in ("thread_on_cpu", "on_cpu_of_capacity", "demand_of_capacity",
                                                         "throttled_periods"))
                         or (met.get("stalled", False) and met.get("stall_ratio", False)
                             and met.get("cpus_busy", True)))
        assert doc["evidence"][role]["cpu_limited"] == limited[role], doc["evidence"][role]
    assert v.limited_by == VERDICT_OF[(limited["server"], limited["client"])]
    assert (v.limited_by == "neither") == (v.cause == "flow-control/application")


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


def test_a_starved_senders_bursts_do_not_make_the_receiver_bind() -> None:
    """A throttled server on tokio's multi-thread runtime (75% stalled, 0.06 cores of its 0.3 quota), its
    client dropping 2.35% of datagrams in the server's bursts: the server's CPU binds, the drops are a note.
    A fifth lost still binds first (test_losing_a_fifth_of_the_datagrams_binds_before_the_senders_cpu)."""
    pio = packet_io(client_rx=60_053, client_drops={"SOCKET_RCVBUFF": 1_446})
    v = verdict(readings(1, 10, 0.06, 0.79, quota=0.3, throttled=1.0, threads=2, psi_full=0.75),
                readings(2, 10, 0.12, 0.08, threads=3, psi_full=0.03), pio=pio)
    assert (v.limited_by, v.cause) == ("server-limited", "cpu-starved")
    assert any(n.startswith("client was receive-buffer too") and "bursts" in n for n in v.notes)
    assert v.to_json()["evidence"]["client"]["cause"] is None


def test_multithreaded_stall_estimated_without_a_cgroup_of_its_own() -> None:
    """No CPU pressure of its own (a shared cgroup), its CPU never idle: its threads' run-queue time, at
    most the time others ran there, is the stall, and says it was estimated."""
    srv = readings(1, 10, 0.4, 1.2, threads=4, cpus=[0], cpu_idle=(0.0, 0.6), procs_in_cgroup=5, psi_full=0.5)
    v = verdict(srv, readings(2, 10, 0.3, 0.02, cpus=[1]))
    assert (v.limited_by, v.cause) == ("server-limited", "cpu-starved")
    ev = v.to_json()["evidence"]["server"]
    assert ev["pressure_full"] is None and ev["stalled"] == 0.6
    assert ev["stalled_from"].startswith("estimated from its threads' run-queue time")
    # the same threads waiting as long beside an idle CPU: waiting for each other, not starved
    v = verdict(readings(1, 10, 0.4, 1.2, threads=4, cpus=[0], cpu_idle=(0.55, 0.6), procs_in_cgroup=5),
                readings(2, 10, 0.3, 0.02, cpus=[1]))
    assert v.limited_by == "neither"
    assert v.to_json()["evidence"]["server"]["stalled"] == 0.05


def _threads(pid: int, seconds: float, per_thread: list[tuple[float, float]], n: int = 11) -> list[dict[str, Any]]:
    """Readings of one process whose threads each have their own (on-CPU, run-queue) cores."""
    base = readings(pid, seconds, 0.0, 0.0, n=n)
    for i, r in enumerate(base):
        t = seconds * i / (n - 1)
        r["threads"][str(pid)] = [{"tid": pid * 100 + k, "comm": f"w{k}", "state": "S", "utime_s": 0, "stime_s": 0,
                                   "on_cpu_s": t * on, "run_delay_s": t * rq, "syscall": "202", "cpu": 0}
                                  for k, (on, rq) in enumerate(per_thread)]
    return base


def test_busiest_is_the_thread_most_on_a_cpu_and_binds() -> None:
    """The busiest thread is the one with the most on-CPU time, not the one most often runnable (a Go
    runtime thread waiting 60% of the time in the run queue is not busy)."""
    srv = _threads(1, 10, [(0.95, 0.02), (0.05, 0.6)])
    v = verdict(srv, readings(2, 10, 0.3, 0.02))
    ev = v.to_json()["evidence"]["server"]
    assert ev["busiest_tid"] == 100 and ev["busiest_on_cpu"] == 0.95
    assert (v.limited_by, v.cause) == ("server-limited", "cpu-busy")
    assert ev["binds"].startswith("thread w0 (100)") and "95%" in ev["binds"]


def _moved(pid: int, nbytes: int | None) -> Transfer:
    return Transfer(pid, nbytes, "sent" if nbytes else None, "UDP" if nbytes else None, "exact" if nbytes else "",
                    0.0, 10.0, "samples")


def test_a_side_that_moved_nothing_is_named_and_never_judged() -> None:
    """A busy `yes` attached as the server and a `sleep` as the client: no verdict on CPU, the sides
    named with what they lacked; a side that moved too little beside one that worked: that one judged."""
    rs = typed(merge(readings(1, 10, 0.99, 0.0), readings(2, 10, 0.0, 0.0)))
    pio = PacketIO({1: ProcessPacketIO(1), 2: ProcessPacketIO(2)}, {}, {}, {}, None, [])
    sides = [side_evidence(rs, 1, "server", "yes", 2, pio, moved=_moved(1, None)),
             side_evidence(rs, 2, "client", "sleep", 2, pio, moved=_moved(2, None))]
    v = judge([s for s in sides if s is not None])
    assert (v.limited_by, v.cause) == ("neither", "no-traffic")
    assert "server yes (1) sent and received no UDP datagram and no TCP payload" in v.summary
    assert all(s.findings == [] and s.cause is None for s in v.sides)
    rs = typed(merge(readings(1, 10, 0.99, 0.0), readings(2, 10, 0.3, 0.0)))
    sides = [side_evidence(rs, 1, "server", "srv", 2, pio, moved=_moved(1, 2_000_000_000)),
             side_evidence(rs, 2, "client", "cli", 2, pio, moved=_moved(2, 40_000))]
    v = judge([s for s in sides if s is not None])
    assert (v.limited_by, v.cause) == ("server-limited", "cpu-busy")
    assert any("client cli (2) moved 40.0 kB of UDP payload, under the 256 kB" in n for n in v.notes)


def test_every_cause_is_defined_once_with_its_proof() -> None:
    """Each cause says what it means and where it is proven: a lab scenario whose verdict must name it
    (or, for the causes the pinning check decides, the scenario it runs), else the test that makes it."""
    from lab.scenarios import PINNING_PREDICTS, SCENARIOS

    assert CAUSES == tuple(Cause) and len({c.value for c in Cause}) == len(Cause)
    for c in Cause:
        about = c.about
        assert about.meaning and (about.scenario or about.proof), c
        if about.scenario is not None:
            sc = SCENARIOS[about.scenario]
            assert sc.cause == c or (about.pinning is not None and PINNING_PREDICTS[c] == about.pinning), c
        assert not about.cpu or about.qlog is None, f"{c}: what a CPU limit's qlog says depends on the side"
    # every cause a scenario expects is a Cause, and every check group's cause says why it may come second
    assert all(sc.cause is None or isinstance(sc.cause, Cause) for sc in SCENARIOS.values())
    assert all(g.cause.about.second_to for g in CHECK_GROUPS)
    # a joined cause as reports print it reads back as its members; an unknown word as none
    assert causes_of("cpu-busy+cpu-starved") == (Cause.CPU_BUSY, Cause.CPU_STARVED)
    assert causes_of("flow-control/application") == (Cause.UNMEASURED_WAITS,) and causes_of(None) == ()
    assert causes_of("a cause of another version") == ()
