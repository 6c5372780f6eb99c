"""Classifier semantics (small hand-written mappings) and shipped mappings on realistic stacks."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qprof.attribution.categories import (CATEGORIES, CONNECTION, CRYPTO, HANDOFF, IO, OTHER_BPF, PACKET_IO,
                                          PROBE_COST, UNCATEGORIZED)
from qprof.attribution.engine import Classifier, is_kernel_dso
from qprof.attribution.mapping import MappingSet, parse_mapping
from conftest import examples

K = "[kernel.kallsyms]"
LIBC = "/usr/lib/x86_64-linux-gnu/libc.so.6"
NGTCP2 = "/usr/lib/x86_64-linux-gnu/libngtcp2.so.16.0.0"
NGTCP2_GNUTLS = "/usr/lib/x86_64-linux-gnu/libngtcp2_crypto_gnutls.so.8"
GNUTLS = "/usr/lib/x86_64-linux-gnu/libgnutls.so.30.36.0"
NETTLE = "/usr/lib/x86_64-linux-gnu/libnettle.so.8.8"
APP = "/usr/bin/gtlsserver"


pytestmark = pytest.mark.usefixtures("user_config")


def clf(*texts: str) -> Classifier:
    return Classifier([parse_mapping(t, f"m{i}.toml") for i, t in enumerate(texts)])


def m(*rules: str, name: str = "t") -> str:
    return f'[mapping]\nname = "{name}"\n' + "".join(f"[[rule]]\n{r}\n" for r in rules)


def k(*syms: str) -> list[tuple[str, str]]:
    return [(s, K) for s in syms]


def u(*syms: str, dso: str = APP) -> list[tuple[str, str]]:
    return [(s, dso) for s in syms]


# ---------------------------------------------------------------- semantics

BASIC = m(
    "symbol = '^memcpy$'\ntransparent = true",
    "kernel = true\nwithin = '^udp_sendmsg$'\ncategory = \"Packet I/O\"\nsubcategory = \"tx\"",
    "symbol = '^app_'\ncategory = \"Connection Mgmt\"\nsubcategory = \"app\"",
    "dso = 'libcrypto'\ncategory = \"Crypto\"",
)


def test_leaf_first_kernel_beats_app_frame_above() -> None:
    c = clf(BASIC)
    d = c.classify(k("ip_output", "udp_sendmsg", "__sys_sendmsg") + u("app_send", "main"))
    assert (d.category, d.subcategory, d.frame) == (PACKET_IO, "tx", 0)
    assert d.rule is not None and d.rule.source == "m0.toml:6"
    d = c.classify(u("app_send", "main"))
    assert (d.category, d.subcategory, d.frame) == (CONNECTION, "app", 0)


def test_transparent_frame_inherits_from_caller() -> None:
    c = clf(BASIC)
    d = c.classify(u("memcpy", "app_pack", "main"))
    assert (d.category, d.frame) == (CONNECTION, 1)
    d = c.classify(u("memcpy", "memcpy") + u("EVP_x", dso="/lib/libcrypto.so.3"))
    assert (d.category, d.frame) == (CRYPTO, 2)


def test_unmatched_frames_pass_through() -> None:
    d = clf(BASIC).classify(u("helper", "other_helper", "app_loop", "main"))
    assert (d.category, d.frame) == (CONNECTION, 2)


def test_dso_only_rule() -> None:
    d = clf(BASIC).classify(u("anything", dso="/usr/lib/libcrypto.so.3") + u("main"))
    assert d.category == CRYPTO and d.subcategory is None and d.rule.symbol is None


def test_uncategorized_when_nothing_matches() -> None:
    c = clf(BASIC)
    for frames in ([], u("main"), k("schedule", "do_nanosleep"), u("memcpy")):
        d = c.classify(frames)
        assert (d.category, d.subcategory, d.rule, d.frame) == (UNCATEGORIZED, None, None, None)


def test_kernel_flag() -> None:
    c = clf(m("symbol = '^f$'\nkernel = true\ncategory = \"I/O\"",
              "symbol = '^f$'\nkernel = false\ncategory = \"Crypto\""))
    assert c.classify(k("f")).category == IO
    assert c.classify([("f", "[nf_tables]")]).category == IO       # module
    assert c.classify(u("f")).category == CRYPTO
    assert c.classify([("f", "[unknown]")]).category == CRYPTO     # user pseudo objects
    assert c.classify([("f", "[vdso]")]).category == CRYPTO


def test_is_kernel_dso() -> None:
    assert is_kernel_dso(K) and is_kernel_dso("[ext4]")
    for d in ("[unknown]", "[vdso]", "[heap]", "[stack]", "[anon:jit]", "[jit]-123", APP):
        assert not is_kernel_dso(d), d


WITHIN = m("kernel = true\nwithin = '^udp_sendmsg$'\ncategory = \"Packet I/O\"")


def test_within_includes_frame_itself_and_callers_not_callees() -> None:
    c = clf(WITHIN)
    d = c.classify(k("udp_sendmsg", "__sys_sendmsg"))            # the frame itself
    assert (d.category, d.frame) == (PACKET_IO, 0)
    d = c.classify(k("ip_output", "udp_sendmsg"))                 # a caller
    assert (d.category, d.frame) == (PACKET_IO, 0)
    d = c.classify(k("udp_sendmsg") + u("main"))                   # app frame above: user space
    assert d.frame == 0
    # callee only: the rootward frames are not under udp_sendmsg
    c2 = clf(m("symbol = '^outer$'\nwithin = '^udp_sendmsg$'\ncategory = \"Crypto\""))
    assert c2.classify(k("udp_sendmsg", "outer")).category == UNCATEGORIZED
    assert c2.classify(k("outer", "udp_sendmsg")).category == CRYPTO


def test_kernel_rule_context_is_kernel_frames_only() -> None:
    """A user function named like a kernel one must not claim the kernel frames below it."""
    c = clf(m("kernel = true\nwithin = '^ep_poll$'\ncategory = \"Packet I/O\""))
    assert c.classify(k("copy_page") + u("ep_poll", "main")).category == UNCATEGORIZED
    assert c.classify(k("copy_page", "ep_poll") + u("main")).category == PACKET_IO


def test_within_failing_rule_lets_later_rule_of_same_frame_match() -> None:
    c = clf(m("symbol = '^f$'\nwithin = '^nope$'\ncategory = \"Crypto\"",
              "symbol = '^f$'\ncategory = \"I/O\""))
    assert c.classify(u("f", "main")).category == IO


TAGS = m(
    "kernel = true\nsymbol = '^(schedule|__schedule)$'\nsubcategory = \"scheduler\"",
    "kernel = true\nsymbol = '^finish_task_switch$'\nsubcategory = \"switch\"",
    "kernel = true\nwithin = '^do_epoll_wait$'\ncategory = \"Packet I/O\"\nsubcategory = \"poll\"",
    "symbol = '^app_'\ncategory = \"Connection Mgmt\"",
)


def test_tag_takes_category_from_caller() -> None:
    d = clf(TAGS).classify(k("__schedule", "schedule", "do_epoll_wait") + u("app_loop"))
    assert (d.category, d.subcategory, d.frame) == (PACKET_IO, "scheduler", 2)


def test_tag_leaf_most_kept() -> None:
    d = clf(TAGS).classify(k("finish_task_switch", "__schedule", "schedule") + u("app_loop"))
    assert (d.category, d.subcategory) == (CONNECTION, "switch")


def test_tag_alone_is_uncategorized_with_subcategory() -> None:
    d = clf(TAGS).classify(k("__schedule", "schedule", "kthread"))
    assert (d.category, d.subcategory, d.rule, d.frame) == (UNCATEGORIZED, "scheduler", None, None)


def test_precedence_earlier_file_wins() -> None:
    a = m("symbol = '^f$'\ncategory = \"Crypto\"", name="a")
    b = m("symbol = '^f$'\ncategory = \"I/O\"", name="b")
    assert clf(a, b).classify(u("f")).category == CRYPTO
    assert clf(b, a).classify(u("f")).category == IO
    # within a file, the earlier rule wins too
    assert clf(m("symbol = 'f'\ncategory = \"I/O\"", "symbol = '^f$'\ncategory = \"Crypto\"")).classify(
        u("f")).category == IO
    # an earlier transparent rule hides a later specific one for that frame
    t = m("symbol = '^f$'\ntransparent = true", name="t")
    assert clf(t, a).classify(u("f")).category == UNCATEGORIZED


def test_classifier_cache_consistent_across_calls() -> None:
    c = clf(WITHIN)
    s1 = k("ip_output", "udp_sendmsg")
    s2 = k("ip_output", "tcp_sendmsg")
    assert [c.classify(s).category for s in (s1, s2, s1, s2)] == [PACKET_IO, UNCATEGORIZED] * 2


# ---------------------------------------------------------------- shipped mappings

SEND_SYSCALL = k("__sys_sendmsg", "__x64_sys_sendmsg", "do_syscall_64", "entry_SYSCALL_64_after_hwframe")
NGTCP2_CALLERS = [("__libc_sendmsg", LIBC), ("ngtcp2_conn_write_pkt", NGTCP2), ("main", APP)]


def _shipped_set() -> MappingSet:
    """MappingSet.load() without reading the real per-user folder."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CONFIG_HOME", "/nonexistent-qprof-test")
        return MappingSet.load()


@pytest.fixture(scope="module")
def shipped_clf() -> Classifier:
    files = [f for f, _ in _shipped_set().for_process([LIBC, NGTCP2, NGTCP2_GNUTLS, GNUTLS, NETTLE, APP], [])]
    assert [f.name for f in files] == ["ngtcp2", "crypto", "common"]
    return Classifier(files)


def cat(c: Classifier, frames: list[tuple[str, str]]) -> tuple[str, str | None]:
    d = c.classify(frames)
    return d.category, d.subcategory


def test_loopback_send_with_receiver_softirq(shipped_clf: Classifier) -> None:
    frames = k("udp_queue_rcv_one_skb", "udp_unicast_rcv_skb", "__udp4_lib_rcv", "ip_protocol_deliver_rcu",
               "ip_local_deliver_finish", "__netif_receive_skb_one_core", "process_backlog", "__napi_poll",
               "net_rx_action", "handle_softirqs", "do_softirq", "__local_bh_enable_ip", "__dev_queue_xmit",
               "ip_finish_output2", "ip_output", "ip_send_skb", "udp_send_skb", "udp_sendmsg") \
        + SEND_SYSCALL + NGTCP2_CALLERS
    assert cat(shipped_clf, frames) == (PACKET_IO, "softirq")


def test_plain_send(shipped_clf: Classifier) -> None:
    frames = k("dev_hard_start_xmit", "__dev_queue_xmit", "ip_finish_output2", "ip_output", "ip_send_skb",
               "udp_send_skb", "udp_sendmsg") + SEND_SYSCALL + NGTCP2_CALLERS
    assert cat(shipped_clf, frames) == (PACKET_IO, "tx syscall")
    # the user-mode wrapper itself
    assert cat(shipped_clf, NGTCP2_CALLERS) == (PACKET_IO, "tx syscall")


def test_recvmsg(shipped_clf: Classifier) -> None:
    frames = k("_copy_to_iter", "__skb_datagram_iter", "skb_copy_datagram_iter", "udp_recvmsg", "inet_recvmsg",
               "sock_recvmsg", "____sys_recvmsg", "___sys_recvmsg", "__sys_recvmsg", "__x64_sys_recvmsg",
               "do_syscall_64") + [("__libc_recvmsg", LIBC), ("ngtcp2_conn_read_pkt", NGTCP2)]
    assert cat(shipped_clf, frames) == (PACKET_IO, "rx syscall")


def test_gso_under_send(shipped_clf: Classifier) -> None:
    frames = k("skb_copy_bits", "skb_segment", "__udp_gso_segment", "udp4_ufo_fragment", "inet_gso_segment",
               "skb_mac_gso_segment", "__skb_gso_segment", "validate_xmit_skb", "__dev_queue_xmit",
               "ip_finish_output2", "ip_output", "udp_send_skb", "udp_sendmsg") + SEND_SYSCALL + NGTCP2_CALLERS
    assert cat(shipped_clf, frames) == (PACKET_IO, "gso/gro")


def test_epoll_wait(shipped_clf: Classifier) -> None:
    frames = k("_raw_spin_unlock_irqrestore", "ep_poll", "do_epoll_wait", "__x64_sys_epoll_wait",
               "do_syscall_64") + [("epoll_wait", LIBC), ("main", APP)]
    assert cat(shipped_clf, frames) == (PACKET_IO, "poll")


def test_scheduler_under_epoll_wait(shipped_clf: Classifier) -> None:
    frames = k("finish_task_switch.isra.0", "__schedule", "schedule", "schedule_hrtimeout_range_clock",
               "ep_poll", "do_epoll_wait", "__x64_sys_epoll_wait", "do_syscall_64") + [("epoll_wait", LIBC)]
    assert cat(shipped_clf, frames) == (PACKET_IO, "scheduler")


def test_pwrite_on_ext4(shipped_clf: Classifier) -> None:
    frames = k("copy_page_from_iter_atomic", "generic_perform_write", "ext4_buffered_write_iter",
               "ext4_file_write_iter", "vfs_write", "__x64_sys_pwrite64", "do_syscall_64") \
        + [("__libc_pwrite64", LIBC), ("write_qlog", APP)]
    assert cat(shipped_clf, frames) == (IO, "file write")
    assert cat(shipped_clf, [("__libc_pwrite64", LIBC), ("write_qlog", APP)]) == (IO, "file write")


def test_write_on_udp_socket_is_packet_io(shipped_clf: Classifier) -> None:
    frames = k("ip_finish_output2", "ip_output", "udp_send_skb", "udp_sendmsg", "sock_write_iter", "vfs_write",
               "ksys_write", "__x64_sys_write", "do_syscall_64") + [("__libc_write", LIBC), ("main", APP)]
    assert cat(shipped_clf, frames) == (PACKET_IO, "tx syscall")


def test_gnutls_leaf_is_crypto(shipped_clf: Classifier) -> None:
    frames = [("_gnutls_cipher_encrypt2", GNUTLS), ("gnutls_cipher_encrypt2", GNUTLS),
              ("ngtcp2_crypto_encrypt", NGTCP2_GNUTLS), ("ngtcp2_conn_write_pkt", NGTCP2), ("main", APP)]
    assert cat(shipped_clf, frames)[0] == CRYPTO
    frames = [("_nettle_gcm_hash", NETTLE), ("gnutls_cipher_encrypt2", GNUTLS)]
    assert cat(shipped_clf, frames) == (CRYPTO, "aead")


def test_libc_memcpy_from_ngtcp2_is_connection(shipped_clf: Classifier) -> None:
    frames = [("__memmove_avx_unaligned_erms", LIBC), ("ngtcp2_conn_write_pkt", NGTCP2), ("main", APP)]
    assert cat(shipped_clf, frames) == (CONNECTION, "quic")
    frames = [("_int_malloc", LIBC), ("malloc", LIBC), ("ngtcp2_mem_malloc", NGTCP2)]
    assert cat(shipped_clf, frames) == (CONNECTION, "quic")


def test_unknown_app_code_uncategorized(shipped_clf: Classifier) -> None:
    assert cat(shipped_clf, [("[unknown]", "[unknown]"), ("main", APP)]) == (UNCATEGORIZED, None)


# ---------------------------------------------------------------- property

POOL = (
    k("udp_sendmsg", "__sys_sendmsg", "ip_output", "net_rx_action", "__napi_poll", "__udp_gso_segment",
      "udp_recvmsg", "do_epoll_wait", "ep_poll", "__schedule", "schedule", "vfs_write", "vfs_read",
      "do_syscall_64", "entry_SYSCALL_64", "copy_user_generic", "__x64_sys_openat", "sock_write_iter",
      "finish_task_switch.isra.0", "kthread")
    + [("__memmove_avx_unaligned_erms", LIBC), ("malloc", LIBC), ("__libc_sendmsg", LIBC),
       ("recvmsg", LIBC), ("epoll_wait", LIBC), ("write", LIBC), ("pthread_mutex_lock", LIBC),
       ("ngtcp2_conn_write_pkt", NGTCP2), ("ngtcp2_crypto_encrypt", NGTCP2), ("x", NGTCP2_GNUTLS),
       ("gnutls_cipher_encrypt2", GNUTLS), ("_nettle_gcm_hash", NETTLE), ("main", APP),
       ("[unknown]", "[unknown]"), ("clock_gettime", "[vdso]"), ("memcpy@plt", APP),
       ("[unknown]", K), ("std::vector<int>::push_back(int const&)", APP)]
)


_PROP_CLF = Classifier([f for f, _ in _shipped_set().for_process([d for _, d in POOL], [s for s, _ in POOL])])


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(st.sampled_from(POOL), max_size=25))
def test_classify_total_and_deterministic(frames: list[tuple[str, str]]) -> None:
    c = _PROP_CLF
    d = c.classify(frames)
    assert d.category in CATEGORIES
    assert d == c.classify(list(frames))
    fresh = Classifier(c.files)
    assert fresh.classify(tuple(frames)) == d
    if d.frame is not None:
        assert 0 <= d.frame < len(frames) and d.rule is not None and d.rule.category == d.category



def test_probe_handlers_are_kept_apart(shipped_clf: Classifier) -> None:
    """eBPF programs running inside a send are probe cost, not Packet I/O."""
    d = shipped_clf.classify(k("bpf_prog_6deef7357e7b4530_sock_send_length", "trace_call_bpf",
                               "perf_trace_sock_msg_length", "sock_sendmsg", "__sys_sendto"))
    assert (d.category, d.subcategory) == (UNCATEGORIZED, "eBPF probes")
    d = shipped_clf.classify(k("handle_swbp", "exc_int3", "asm_exc_int3") + u("EVP_EncryptUpdate", dso="/usr/lib/libcrypto.so.3"))
    assert (d.category, d.subcategory) == (UNCATEGORIZED, "eBPF probes")


SEND = ("udp_sendmsg", "____sys_sendmsg", "___sys_sendmsg", "__sys_sendmsg", "do_syscall_64")


@pytest.mark.parametrize("frames,sub", [
    # qprof's tp_btf programs as perf unwinds them on its test VM (kept apart: the observer's cost)
    (("bpf_prog_894bd9ef255d2238_copy_datagram", "bpf_trace_run2", "skb_copy_datagram_iter", "udp_recvmsg"),
     "eBPF probes"),
    (("[unknown]", "bpf_trace_run3", "call_trace_sock_recv_length", "sock_recvmsg"), "eBPF probes"),
    (("__htab_map_lookup_elem", "bpf_trace_run2", "dev_hard_start_xmit", "__dev_queue_xmit"), "eBPF probes"),
    # the crypto group's uprobe programs (bpftrace): helpers keep the uprobe dispatch in the stack
    (("htab_map_update_elem_in_place", "[unknown]", "__uprobe_perf_func", "uprobe_dispatcher", "handler_chain",
      "uprobe_notify_resume", "irqentry_exit_to_user_mode"), "eBPF probes"),
    (("copy_from_user_nofault", "bpf_probe_read_user", "[unknown]", "__uprobe_perf_func", "uprobe_dispatcher"),
     "eBPF probes"),
    (("mtree_load", "find_active_uprobe_rcu", "uprobe_notify_resume", "irqentry_exit_to_user_mode"),
     "eBPF probes"),
    # a BPF trampoline on udp_send_skb (not qprof's): its program's frames are lost, helpers hang off
    # the traced function's ftrace site; the send path it runs in places it (Packet I/O), under its name
    (("__bpf_prog_enter_recur", "udp_send_skb") + SEND, "other eBPF programs"),
    (("__rcu_read_lock", "__bpf_prog_enter_recur", "udp_send_skb") + SEND, "other eBPF programs"),
    (("sched_clock", "__bpf_prog_exit_recur", "udp_send_skb") + SEND, "other eBPF programs"),
    (("copy_from_kernel_nofault", "bpf_probe_read_kernel", "udp_send_skb") + SEND, "other eBPF programs"),
    (("htab_map_hash", "__htab_map_lookup_elem", "udp_send_skb") + SEND, "other eBPF programs"),
    (("lookup_nulls_elem_raw", "udp_send_skb") + SEND, "other eBPF programs"),
    # a kprobe's program: trace_call_bpf under kprobe handling is not a tracepoint's
    (("bpf_probe_read_kernel", "bpf_prog_0123456789abcdef_kp", "trace_call_bpf", "kprobe_perf_func",
      "kprobe_ftrace_handler", "udp_send_skb") + SEND, "other eBPF programs"),
])
def test_ebpf_frames_split_by_how_the_program_was_entered(shipped_clf: Classifier, frames: tuple[str, ...],
                                                           sub: str) -> None:
    """Tracepoint and uprobe programs (the kinds qprof attaches) are "eBPF probes", Uncategorized whatever
    they interrupt; kprobe and trampoline programs, which qprof never attaches, are another tool's, named
    apart but placed where the thread's own clock counts them: in the code that ran them (udp_send_skb's
    send path here, Packet I/O)."""
    d = shipped_clf.classify(k(*frames))
    placed = UNCATEGORIZED if sub == PROBE_COST else PACKET_IO if "udp_send_skb" in frames else UNCATEGORIZED
    assert (d.category, d.subcategory) == (placed, sub), d
    assert shipped_clf.classify(k("udp_send_skb", *SEND)).category == "Packet I/O", "the traced function itself"


def test_other_ebpf_program_without_a_placing_caller_stays_named(shipped_clf: Classifier) -> None:
    """Another tool's program with no caller a rule places (a kernel thread's, or its callers lost):
    Uncategorized / other eBPF programs, as before."""
    d = shipped_clf.classify(k("bpf_probe_read_kernel", "__bpf_prog_enter_recur", "do_nanosleep", "kthread"))
    assert (d.category, d.subcategory) == (UNCATEGORIZED, OTHER_BPF), d
    assert d.rule is not None and d.rule.subcategory == OTHER_BPF and d.frame == 0


QUEUE = m("symbol = '^handoff_queue_(push|pop)$'\ncategory = \"Connection Mgmt\"\nsubcategory = \"queues\"",
          name="handoff")
WORKLOAD = "/opt/handoff"


def _with_queue(shipped: Classifier) -> Classifier:
    return Classifier([parse_mapping(QUEUE, "handoff.toml"), *shipped.files])


@pytest.mark.parametrize("kernel_part,user_part,placed", [
    # a reschedule IPI taken in a mapped queue function, its sample skidded to the IPI's exit
    (("irqentry_exit_to_user_mode", "asm_sysvec_reschedule_ipi"), ["handoff_queue_pop", "sender"], CONNECTION),
    # ... and the switch it caused, sampled when the thread runs again
    (("finish_task_switch.isra.0", "__schedule", "schedule", "irqentry_exit_to_user_mode",
      "asm_sysvec_reschedule_ipi"), ["handoff_queue_push", "worker"], CONNECTION),
    # preempted at a timer interrupt's exit while in libcrypto: the interrupt's frames are the handoff's
    (("finish_task_switch.isra.0", "__schedule", "schedule", "irqentry_exit_to_user_mode",
      "asm_sysvec_apic_timer_interrupt"), [("gcm_ghash_avx", "/usr/lib/libcrypto.so.3"), "handoff_seal"], CRYPTO),
    # preempted at a device interrupt's exit inside the kernel's send path
    (("finish_task_switch.isra.0", "__schedule", "preempt_schedule_irq", "irqentry_exit", "asm_common_interrupt",
      "ip_finish_output2", "udp_send_skb", *SEND), [("__libc_sendto", LIBC), "sender"], PACKET_IO),
])
def test_handoff_goes_to_the_caller_a_rule_places(shipped_clf: Classifier, kernel_part: tuple[str, ...],
                                                  user_part: list, placed: str) -> None:
    """A reschedule IPI, the switch it causes and a preemption at an interrupt's exit stand for the code
    they interrupted, which the thread's own clock charges: a frame a rule places in a work category
    decides the category; the subcategory still says it was a handoff."""
    user = [f if isinstance(f, tuple) else (f, WORKLOAD) for f in user_part]
    d = _with_queue(shipped_clf).classify(k(*kernel_part) + user)
    assert (d.category, d.subcategory) == (placed, HANDOFF), d
    assert d.rule is not None and d.rule.category == placed


def test_handoff_without_a_placing_caller_stays_named(shipped_clf: Classifier) -> None:
    """No caller a rule places (code no rule knows, the program's own code, a runtime's): Uncategorized /
    thread handoff, decided by the handoff's own rule."""
    c = _with_queue(shipped_clf)
    for user in (u("compute", "main", dso=WORKLOAD), [], u("[unknown]", dso="[unknown]")):
        d = c.classify(k("finish_task_switch.isra.0", "__schedule", "schedule", "irqentry_exit_to_user_mode",
                         "asm_sysvec_reschedule_ipi") + user)
        assert (d.category, d.subcategory) == (UNCATEGORIZED, HANDOFF), (user, d)
        assert d.rule is not None and d.rule.subcategory == HANDOFF and d.frame == 0
    own = Classifier([*c.files], [parse_mapping(m("dso = '/opt/handoff$'\ncategory = \"Uncategorized\"\n"
                                                  "subcategory = \"application\""), "app.toml").rules[0]])
    d = own.classify(k("irqentry_exit_to_user_mode", "asm_sysvec_reschedule_ipi") + u("compute", "handoff_queue_pop",
                                                                                       dso=WORKLOAD))
    assert (d.category, d.subcategory) == (UNCATEGORIZED, HANDOFF), "the program's own code decides first"


def test_user_space_rules_naming_a_handoff_are_not_held() -> None:
    """Only kernel rules are held for their caller: a user's rule that names a function of its own
    "thread handoff" places it there."""
    c = clf(m("symbol = '^my_park$'\ncategory = \"Uncategorized\"\nsubcategory = \"thread handoff\"",
              "symbol = '^my_loop$'\ncategory = \"Connection Mgmt\""))
    d = c.classify(u("my_park", "my_loop"))
    assert (d.category, d.subcategory, d.frame) == (UNCATEGORIZED, HANDOFF, 0)


def test_probe_cost_is_not_placed_under_its_caller(shipped_clf: Classifier) -> None:
    """qprof's own programs stay Uncategorized / eBPF probes under a send: the report states their cost."""
    d = _with_queue(shipped_clf).classify(k("bpf_prog_6deef7357e7b4530_sock_send_length", "trace_call_bpf",
                                            "perf_trace_sock_msg_length", "sock_sendmsg", "__sys_sendto")
                                          + [("__libc_sendto", LIBC), ("handoff_queue_push", WORKLOAD)])
    assert (d.category, d.subcategory) == (UNCATEGORIZED, PROBE_COST)


def test_cpu_shortfall_note_only_beyond_sampling_error() -> None:
    from qprof.attribution.profile import cpu_shortfall_note

    assert cpu_shortfall_note(3.29, 3286, 3.40, "system") is None  # -3%: within 3/sqrt(3286) = 5.2%
    note = cpu_shortfall_note(2.79, 2790, 3.42, "system")
    assert note is not None and "-18%" in note and "--scope cgroup" in note
    assert "--scope cgroup" not in (cpu_shortfall_note(2.79, 2790, 3.42, "cgroup") or "")
    assert cpu_shortfall_note(3.6, 3600, 3.42, "system") is None  # above /proc: its window is shorter
    assert cpu_shortfall_note(1.0, 1000, None, "system") is None
