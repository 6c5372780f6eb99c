"""Interrupt skid, the application's own code and runtime overhead: pure logic on hand-made stacks.

Shapes taken from real captures on this VM (cpu-clock, no NMI): a sample that skids to the
exit of an interrupt has the exit-path function as its leaf and the interrupt's entry frame
(`asm_sysvec_*`) below it, then whatever code the interrupt stopped.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import examples
from qprof.attribution.application import application_rule
from qprof.archive import schema
from qprof.archive.model import Target
from qprof.attribution.categories import APPLICATION, CONNECTION, HANDOFF, PACKET_IO, SKID, UNCATEGORIZED, is_named_other
from qprof.attribution.engine import Classifier
from qprof.attribution.mapping import MappingSet, parse_mapping
from qprof.attribution.skid import SkidSplitter, split
from qprof.archive.stacks import StackRecord

pytestmark = pytest.mark.usefixtures("user_config")

K = "[kernel.kallsyms]"
GO = "/opt/quicgo"
CFS = ["__irq_exit_rcu", "sysvec_call_function_single", "asm_sysvec_call_function_single"]
RESCHED = ["irqentry_exit_to_user_mode", "asm_sysvec_reschedule_ipi"]
USER = [("crypto/internal/fips140/aes/gcm.gcmAesEnc.abi0", GO), ("main.main", GO)]


def k(*syms: str) -> list[tuple[str, str]]:
    return [(s, K) for s in syms]


def rec(frames: list[tuple[str, str]], period: int = 1_000_000, samples: int = 1, pid: int = 1,
        tid: int = 1) -> StackRecord:
    return StackRecord(pid, tid, "t", samples, period, tuple(frames))


@pytest.fixture(scope="module")
def shipped() -> Classifier:
    files = MappingSet.load().files
    return Classifier([f for f in files if f.name in ("go-runtime", "common")])


def run(clf: Classifier, records: list[StackRecord]) -> tuple[list[tuple[StackRecord, object]], SkidSplitter]:
    sp = SkidSplitter()
    out = [(r, d) for r in records for d in [clf.classify(r.frames)] if not sp.offer(clf, r, d)]
    out += list(sp.resolve())
    return out, sp


def test_leaf_rules_match_only_the_leaf() -> None:
    c = Classifier([parse_mapping('[mapping]\nname = "t"\n[[rule]]\nsymbol = "^h$"\nleaf = true\n'
                                  'category = "Crypto"\n[[rule]]\nsymbol = "^m$"\ncategory = "I/O"\n', "t.toml")])
    assert c.classify([("h", "/x"), ("m", "/x")]).category == "Crypto"
    assert c.classify([("f", "/x"), ("h", "/x"), ("m", "/x")]).category == "I/O"


def test_skid_after_network_ipi_goes_where_its_softirq_work_went(shipped: Classifier) -> None:
    skid = rec(k("handle_softirqs", *CFS) + USER, period=3_000_000, samples=3)
    follow = rec(k("napi_consume_skb", "skb_defer_free_flush", "net_rx_action", "handle_softirqs", *CFS) + USER)
    d = shipped.classify(skid.frames)
    assert (d.category, d.subcategory) == (UNCATEGORIZED, SKID), "the interrupted code does not decide"
    out, sp = run(shipped, [skid, follow])
    parts = [(r.period, r.samples, d.category, d.subcategory) for r, d in out if r.frames == skid.frames]
    assert parts == [(3_000_000, 3, PACKET_IO, SKID)]
    v = sp.summary(1, 4_000_000)
    assert v.share == 0.75 and v.attributed == 0.75
    assert v.vectors["asm_sysvec_call_function_single"].evidence == {PACKET_IO: 1.0}


def test_skid_without_follow_up_or_after_scheduling_stays_named(shipped: Classifier) -> None:
    """A timer interrupt's skid with no follow-up work stays interrupt skid; a reschedule IPI's, and the
    switch it causes, are the handoff between threads that sent it (common.toml), named as such: in the
    category of the code the IPI stopped when a rule places it (Go's AES-GCM: Crypto, where the thread's
    own clock counts it), else Uncategorized. Neither is skid the splitter moves."""
    unplaced = [("main.work", GO), ("main.main", GO)]
    lone = rec(k("irqentry_exit_to_user_mode", "asm_sysvec_apic_timer_interrupt") + USER)
    resched = rec(k(*RESCHED) + USER)
    switch = rec(k("finish_task_switch.isra.0", "__schedule", "schedule", *RESCHED) + USER)
    resched_own = rec(k(*RESCHED) + unplaced, tid=2)
    switch_own = rec(k("finish_task_switch.isra.0", "__schedule", "schedule", *RESCHED) + unplaced, tid=2)
    out, sp = run(shipped, [lone, resched, switch, resched_own, switch_own])
    decided = {(r.tid, r.frames[0][0] + r.frames[1][0]): (d.category, d.subcategory) for r, d in out}
    assert decided[1, "irqentry_exit_to_user_modeasm_sysvec_apic_timer_interrupt"] == (UNCATEGORIZED, SKID)
    assert decided[1, "irqentry_exit_to_user_modeasm_sysvec_reschedule_ipi"] == ("Crypto", HANDOFF)
    assert decided[1, "finish_task_switch.isra.0__schedule"] == ("Crypto", HANDOFF)
    assert decided[2, "irqentry_exit_to_user_modeasm_sysvec_reschedule_ipi"] == (UNCATEGORIZED, HANDOFF)
    assert decided[2, "finish_task_switch.isra.0__schedule"] == (UNCATEGORIZED, HANDOFF)
    assert sp.summary(1, 5_000_000).attributed == 0.0


def test_skid_inside_one_code_path_is_decided_by_its_callers(shipped: Classifier) -> None:
    """A lock released with interrupts re-enabled under udp_sendmsg: the send path ran."""
    d = shipped.classify(k("_raw_spin_unlock_irqrestore", "try_to_wake_up", "sock_def_readable", "udp_sendmsg",
                           "__sys_sendmsg"))
    assert d.category == PACKET_IO
    d = shipped.classify(k("handle_softirqs", "do_softirq", "__local_bh_enable_ip", "udp_sendmsg"))
    assert (d.category, d.subcategory) == (PACKET_IO, "tx syscall"), "process context: not skid"


def test_skid_split_follows_the_evidence_mix(shipped: Classifier) -> None:
    skid = rec(k("handle_softirqs", *CFS) + USER, period=4_000_000, samples=4)
    net = rec(k("net_rx_action", "handle_softirqs", *CFS) + USER, period=3_000_000, samples=3)
    rcu = rec(k("rcu_core", "handle_softirqs", *CFS) + USER, period=1_000_000)
    out, _ = run(shipped, [skid, net, rcu])
    parts = {d.category: (r.period, r.samples) for r, d in out if r.frames == skid.frames}
    assert parts == {PACKET_IO: (3_000_000, 3), UNCATEGORIZED: (1_000_000, 1)}


@settings(max_examples=examples(200), deadline=None)
@given(st.integers(0, 10**12), st.dictionaries(st.sampled_from("abcde"), st.integers(0, 10**9), max_size=5))
def test_split_is_exact_and_proportional(total: int, weights: dict[str, int]) -> None:
    got = split(total, weights)
    s = sum(v for v in weights.values() if v > 0)
    if not s:
        assert got == {}
        return
    assert sum(got.values()) == total and all(v >= 0 for v in got.values())
    for key, v in got.items():
        assert abs(v - total * weights[key] / s) < 1


def test_application_code_is_not_the_caller_library_s(tmp_path: Path) -> None:
    """A checksum in a stream-data callback of libngtcp2: application, not ngtcp2's Connection Mgmt."""
    ngtcp2 = "/usr/lib/x86_64-linux-gnu/libngtcp2.so.9"
    app = "/usr/local/bin/h3client"
    target = {"exe": app, "cmdline": [app], "objects": [{"path": app, "go": False}]}
    files = [f for f in MappingSet.load().files if f.name in ("ngtcp2", "common")]
    rule = application_rule(schema.decode(Target, {"pid": 1, **target}), [f.name for f in files], [])
    assert rule is not None
    c = Classifier(files, [rule])
    libc = "/usr/lib/x86_64-linux-gnu/libc.so.6"
    cb = [("checksum", app), ("recv_stream_data", app), ("[unknown]", ngtcp2), ("ngtcp2_conn_read_pkt", ngtcp2),
          ("main", app)]
    assert (c.classify(cb).category, c.classify(cb).subcategory) == (UNCATEGORIZED, APPLICATION)
    memcpy = [("__memmove_avx_unaligned_erms", libc)] + cb
    assert c.classify(memcpy).subcategory == APPLICATION, "memcpy in the callback is the callback's"
    lib = [("ngtcp2_conn_read_pkt", ngtcp2), ("main", app)]
    assert c.classify(lib).category == CONNECTION, "the library's own work stays the library's"
    send = k("udp_sendmsg", "__sys_sendmsg") + [("sendmsg", libc), ("write_pkt", app), ("main", app)]
    assert c.classify(send).category == PACKET_IO, "deeper claimed frames decide first"


@pytest.mark.parametrize("target,files,symbols,matches,not_matches", [
    ({"exe": "/b/quicgo", "objects": [{"path": "/b/quicgo", "go": True}]}, ["go-runtime"], [],
     ["main.work", "main.(*h).recv"], ["github.com/quic-go/quic-go.(*Conn).run", "runtime.main"]),
    ({"exe": "/b/tquic-bulk", "objects": []}, ["rust-std"], ["tquic_bulk::main"],
     ["tquic_bulk::checksum", "<tquic_bulk::ClientHandler as tquic::TransportHandler>::on_stream_readable"],
     ["tquic::connection::Connection::stream_read", "std::rt::lang_start"]),
    ({"exe": "/usr/bin/python3.12", "cmdline": ["/usr/bin/python3.12", "-X", "perf", "/srv/app/bulk.py"]},
     ["python"], [], ["py::Client.on_data:/srv/app/bulk.py"],
     ["py::BaseEventLoop.run_once:/usr/lib/python3.12/asyncio/base_events.py"]),
])
def test_application_namespace(target: dict, files: list[str], symbols: list[str], matches: list[str],
                               not_matches: list[str]) -> None:
    rule = application_rule(schema.decode(Target, {"pid": 1, **target}), files, symbols)
    assert rule is not None and rule.symbol is not None
    assert all(rule.symbol.search(s) for s in matches)
    assert not any(rule.symbol.search(s) for s in not_matches)


def test_runtime_overhead_is_named_not_connection_management(shipped: Classifier) -> None:
    d = shipped.classify([("runtime.findRunnable", GO), ("runtime.schedule", GO), ("runtime.mcall", GO)])
    assert d.category == UNCATEGORIZED and is_named_other(d.subcategory) and d.subcategory == "runtime: go scheduler"
    d = shipped.classify(k("futex_wait", "__schedule", "schedule") + [("runtime.futex.abi0", GO),
                                                                    ("runtime.futexsleep", GO), ("runtime.notesleep", GO),
                                                                    ("runtime.stopm", GO)])
    assert d.subcategory == "runtime: go scheduler", "its kernel part keeps the runtime's name, not a tag"
    assert not is_named_other(SKID) and not is_named_other(None)
