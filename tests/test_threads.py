"""The thread view's pure logic: pools from the shipped mapping files' frames, threads grouped by name,
/proc figures over a window, parallelism, handoff kinds, and [[pool]] tables refused with file:line."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import examples
from qprof.attribution import handoff
from qprof.attribution.mapping import MappingError, MappingSet, parse_mapping
from qprof.attribution.pools import PoolMatcher
from qprof.attribution.profile import Breakdown, ProcessProfile, ThreadProfile
from qprof.attribution.threads import busiest, thread_view, window
from qprof.archive import schema
from qprof.archive.model import ProcReading

pytestmark = pytest.mark.usefixtures("user_config")

K = "[kernel.kallsyms]"
GO, RS = "/opt/quicgo", "/opt/quinn-bulk"


def pools_of(*names: str) -> PoolMatcher:
    files = {f.name: f for f in MappingSet.load().files}
    return PoolMatcher([p for n in names for p in files[n].pools])


def test_go_threads_are_ms_but_sysmon_is_its_own() -> None:
    m = pools_of("go-runtime")
    assert m.match([("runtime.usleep", GO), ("runtime.sysmon", GO), ("runtime.mstart1", GO),
                    ("runtime.mstart", GO)]) == "Go sysmon"
    assert m.match([("github.com/quic-go/quic-go.(*Conn).run", GO), ("runtime.goexit.abi0", GO)]) == "Go Ms"
    assert m.match([("futex_wait", K), ("runtime.futex.abi0", GO)]) is None, "kernel frames and runtime leaves alone"


def test_tokio_workers_started_by_the_blocking_pool_are_workers() -> None:
    """tokio starts its multi-thread workers through the blocking pool: its frame is at the root of every
    worker's stack, so a worker is a worker and only a thread without the worker's frames is blocking."""
    m = pools_of("tokio")
    root = [("tokio::runtime::blocking::pool::Inner::run", RS), ("std::sys::thread::unix::Thread::new::thread_start", RS)]
    worker = [("quinn::connection::State::drive", RS),
              ("tokio::runtime::scheduler::multi_thread::worker::Context::run_task", RS),
              ("tokio::runtime::scheduler::multi_thread::worker::run", RS), *root]
    assert m.match(worker) == "tokio workers"
    assert m.match([("std::fs::read", RS), *root]) == "tokio blocking pool"
    assert m.match([("quinn_bulk::client::{{closure}}", RS), ("tokio::runtime::runtime::Runtime::block_on", RS),
                    ("quinn_bulk::main", RS)]) == "main (block_on)"


def test_pool_tables_are_checked_with_file_and_line() -> None:
    head = '[mapping]\nname = "t"\n'
    f = parse_mapping(head + '[[pool]]\nname = "workers"\nsymbol = "^w::run$"\nnote = "n"\n', "t.toml")
    assert [(p.name, p.note, p.source, p.works) for p in f.pools] == [("workers", "n", "t.toml:3", True)]
    monitor = parse_mapping(head + '[[pool]]\nname = "mon"\nsymbol = "^m$"\nworks = false\n', "t.toml")
    assert [p.works for p in monitor.pools] == [False]
    for body, said in (('[[pool]]\nsymbol = "^w$"\n', "t.toml:3: a pool needs a `name`"),
                       ('[[pool]]\nname = "w"\n', "t.toml:3: pool 'w' needs `symbol`"),
                       ('[[pool]]\nname = "w"\nsymbol = "(a"\n', "t.toml:5: `symbol` is not a valid regular"),
                       ('[[pool]]\nname = "w"\nsymbol = "a"\ncolour = 1\n', "t.toml:6: unknown pool key `colour`"),
                       ('[[pool]]\nname = "w"\nsymbol = "a"\nworks = "no"\n', "`works` must be true or false"),
                       ('', "")):
        with pytest.raises(MappingError) as e:
            parse_mapping(head + body if body else "pool = 3\n" + head, "t.toml")
        assert said in str(e.value) and (body or "`pool` must be an array of tables" in str(e.value)), str(e.value)


@given(st.lists(st.tuples(st.sampled_from(["w", "x", "^a", "(", "[", "name", ""]),
                          st.sampled_from(["name", "symbol", "note", "other"])), max_size=4))
@settings(max_examples=examples(200), deadline=None)
def test_pool_tables_never_crash_on_bad_input(fields: list[tuple[str, str]]) -> None:
    body = "[[pool]]\n" + "".join(f'{k} = "{v}"\n' for v, k in dict((k, v) for v, k in fields).items())
    try:
        parse_mapping('[mapping]\nname = "t"\n' + body, "t.toml")
    except MappingError as e:
        assert str(e).startswith("t.toml:")


def test_handoff_kinds() -> None:
    def kind(*syms: str) -> str | None:
        return handoff.kind([(s, K) for s in syms] + [("main", "/bin/x")])

    assert kind("finish_task_switch.isra.0", "__schedule", "schedule", "futex_do_wait", "__futex_wait",
                "futex_wait", "do_futex", "__x64_sys_futex") == "futex"
    assert kind("_raw_spin_unlock_irqrestore", "try_to_wake_up", "wake_up_q", "futex_wake", "do_futex") == "futex"
    assert kind("irqentry_exit_to_user_mode", "asm_sysvec_reschedule_ipi") == "reschedule IPI"
    assert kind("try_to_wake_up", "eventfd_write", "ksys_write") == "wakeup"
    assert kind("try_to_wake_up", "ep_poll_callback", "sock_def_readable", "udp_queue_rcv_skb", "net_rx_action",
                "handle_softirqs") is None, "a packet waking its reader is not a handoff"
    assert kind("finish_task_switch.isra.0", "__schedule", "schedule", "ep_poll", "do_epoll_wait") == "switch"
    assert kind("udp_sendmsg", "__sys_sendmsg") is None
    assert handoff.kind([("schedule", "/usr/lib/libfoo.so")]) is None, "a user function named like the kernel's"


def _reading(t: float, threads: list[tuple[int, str, float, float, int, int]], idle: float = 0.0) -> ProcReading:
    return schema.decode(ProcReading, {"mono": t, "threads": {"7": [
        {"tid": tid, "comm": comm, "state": "S", "utime_s": 0, "stime_s": 0, "on_cpu_s": on, "run_delay_s": rq,
         "voluntary": vol, "involuntary": inv, "cpu": 0} for tid, comm, on, rq, vol, inv in threads]},
        "cpu_idle": {"0": idle}})


def test_window_figures_parallelism_and_busiest() -> None:
    rs = [_reading(0.0, [(7, "srv", 1.0, 0.5, 10, 1), (8, "worker-1", 0.0, 0.0, 0, 0)]),
          _reading(1.0, [(7, "srv", 1.2, 0.6, 30, 2), (8, "worker-1", 0.9, 0.1, 100, 5),
                         (9, "worker-2", 0.5, 0.0, 50, 0)]),
          _reading(2.0, [(7, "srv", 1.3, 0.6, 40, 2), (8, "worker-1", 1.0, 0.3, 150, 9),
                         (9, "worker-2", 0.9, 0.2, 90, 1)])]
    w = window(rs, 7)
    stats = {t.tid: t for t in w.threads}
    assert w.seconds == 2.0 and stats[7].on_cpu_s == pytest.approx(0.3) and stats[8].voluntary == 150
    assert stats[9].on_cpu_s == pytest.approx(0.4), "a thread born after the first reading: from its first"
    assert w.cores == pytest.approx((1.1, 0.6)), "threads present in both readings of an interval"
    assert w.cores_peak == pytest.approx(1.1) and w.cores_mean == pytest.approx((0.3 + 1.0 + 0.4) / 2)
    assert busiest(w).tid == 8
    assert window(rs[:1], 7).threads == () and busiest(window([], 7)) is None


def _profile(threads: dict[int, tuple[str, Counter[str]]]) -> ProcessProfile:
    p = ProcessProfile(7, "srv", "server", pool_notes={"Go Ms": "goroutines move between them"})
    for tid, (comm, pools) in threads.items():
        b = Breakdown()
        b.add("Crypto", "aead", ("f", "/x"), 3, 3_000_000)
        p.threads[tid] = ThreadProfile(tid, comm, b, pools)
        p.breakdown.merge(b)
    p.breakdown.add("Uncategorized", "runtime: go scheduler", ("runtime.schedule", "/x"), 1, 1_000_000)
    p.handoffs.update({"futex": 500_000, "switch": 250_000})
    return p


def test_pools_from_samples_else_numbered_names() -> None:
    rs = [_reading(0.0, [(7, "srv", 0, 0, 0, 0), (8, "quic_worker1", 0, 0, 0, 0), (9, "quic_worker2", 0, 0, 0, 0),
                         (10, "logger", 0, 0, 0, 0)]),
          _reading(1.0, [(7, "srv", 0.2, 0.1, 5, 0), (8, "quic_worker1", 0.6, 0.2, 900, 3),
                         (9, "quic_worker2", 0.5, 0.1, 800, 1), (10, "logger", 0.01, 0, 2, 0)])]
    prof = _profile({7: ("srv", Counter({"Go Ms": 3_000_000}))})
    view = thread_view(rs, 7, prof, 1e-9, bytes_moved=2_000_000_000, datagrams=1_700)
    assert [(p.name, [t.stat.tid for t in p.threads]) for p in view.pools] == \
        [("quic_worker*", [8, 9]), ("Go Ms", [7]), ("logger", [10])]
    assert view.busiest is not None and view.busiest.stat.tid == 8
    assert view.pools[1].note == "goroutines move between them"
    assert view.runtime == {"runtime: go scheduler": 0.25}
    h = view.handoffs
    assert h.cpu_s == {"futex": 0.0005, "switch": 0.00025} and h.share == pytest.approx(0.1875)
    assert h.cpu_s_per_gb == pytest.approx(0.00075 / 2) and h.wakeups_per_datagram == pytest.approx(1707 / 1700)
    j: dict[str, Any] = view.to_json(1e-9)
    assert j["busiest_tid"] == 8 and j["pools"][0]["threads"] == 2 and j["handoffs"]["voluntary_switches"] == 1707
