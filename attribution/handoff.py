"""Handoffs: CPU a process spends waking its own threads and switching between them.

A multi-threaded stack pays for moving work between its threads: a futex to
wake a parked thread (and the parked thread's futex wait), the context switch
out of a thread that blocks and into the one woken, and the reschedule IPI the
waker sends to the CPU the woken thread is queued on. These are kernel
functions whatever the stack, so they are found by name here, not by the
mapping files (which decide where each sample is *placed*: a datapath thread's
switch under epoll_wait is Packet I/O, a futex under tokio's park is tokio's).
Each sample is one kind at most, the first that fits:

- "futex": futex wait or wake, with the scheduling under it;
- "reschedule IPI": handling the IPI a waker sends (asm_sysvec_reschedule_ipi);
- "wakeup": waking a task outside a futex and outside softirq (eventfd or pipe
  writes: Go's netpollBreak; a packet's softirq waking its reader is not the
  process handing work to itself);
- "switch": switching out and in (schedule, finish_task_switch ...) under any
  other blocking call (epoll_wait, nanosleep, a read).
"""

from __future__ import annotations

import functools
import re
from typing import Sequence

from qprof.attribution.engine import is_kernel_dso
from qprof.archive.stacks import Frame

KINDS = ("futex", "reschedule IPI", "wakeup", "switch")
_FUTEX = re.compile(r"^(__x64_sys_futex\w*|__ia32_sys_futex\w*|__se_sys_futex|do_futex|futex_wait\w*|futex_wake\w*|"
                    r"__futex_wait|futex_requeue|futex_wake_op|futex_q_lock|futex_unqueue)$")
_IPI = re.compile(r"^(asm_sysvec_reschedule_ipi|sysvec_reschedule_ipi|__sysvec_reschedule_ipi|scheduler_ipi)$")
_WAKE = re.compile(r"^(try_to_wake_up|ttwu_\w+|wake_up_q|wake_up_process|__wake_up_common\w*|__wake_up\w*)$")
_SOFTIRQ = re.compile(r"^(handle_softirqs|__do_softirq|do_softirq|net_rx_action|__napi_poll|run_ksoftirqd)$")
_SWITCH = re.compile(r"^(__schedule|schedule|schedule_idle|schedule_timeout|schedule_hrtimeout_range\w*|"
                     r"preempt_schedule\w*|finish_task_switch\S*|__switch_to\S*|context_switch|prepare_task_switch|"
                     r"pick_next_task\S*|__pick_next_task\S*|put_prev_task\S*|set_next_task\S*|dequeue_task\S*|"
                     r"dequeue_entit\S*|switch_mm_irqs_off)$")


_F_FUTEX, _F_IPI, _F_WAKE, _F_SOFTIRQ, _F_SWITCH = 1, 2, 4, 8, 16
_PATTERNS = ((_F_FUTEX, _FUTEX), (_F_IPI, _IPI), (_F_WAKE, _WAKE), (_F_SOFTIRQ, _SOFTIRQ), (_F_SWITCH, _SWITCH))


@functools.lru_cache(maxsize=1 << 16)
def _flags(sym: str) -> int:
    return sum(flag for flag, pat in _PATTERNS if pat.match(sym))


def kind(frames: Sequence[Frame]) -> str | None:
    """The handoff a sample's stack shows (one of KINDS), or None."""
    seen = 0
    for sym, dso in frames:
        if is_kernel_dso(dso):
            seen |= _flags(sym)
    if seen & _F_FUTEX:
        return "futex"
    if seen & _F_IPI:
        return "reschedule IPI"
    if seen & _F_WAKE and not seen & _F_SOFTIRQ:
        return "wakeup"
    return "switch" if seen & _F_SWITCH else None
