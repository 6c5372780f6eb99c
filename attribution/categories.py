"""The five categories of the founding study; every sample lands in exactly one."""

from __future__ import annotations

PACKET_IO = "Packet I/O"
CRYPTO = "Crypto"
CONNECTION = "Connection Mgmt"
IO = "I/O"
UNCATEGORIZED = "Uncategorized"

CATEGORIES: tuple[str, ...] = (PACKET_IO, CRYPTO, CONNECTION, IO, UNCATEGORIZED)

# Named parts of Uncategorized that the code itself relies on (the mapping files use the same words).
PROBE_COST = "eBPF probes"  # programs on tracepoints and uprobes, the kinds qprof attaches (its own or another tool's)
OTHER_BPF = "other eBPF programs"  # entered through a kprobe or a BPF trampoline: kinds qprof never attaches
SKID = "interrupt skid"  # samples that landed where interrupts came back on (attribution.skid)
APPLICATION = "application"  # the target's own code, also when a library calls it back
RUNTIME = "runtime: "  # prefix of language-runtime overhead: "runtime: go scheduler", "runtime: tokio"...
HANDOFF = "thread handoff"  # waking its own threads and switching to them, where no caller says whose work waited
# Kernel work that stands for the code it interrupted or was called from: a handoff (a reschedule IPI and
# the switch it causes, a preemption at an interrupt's exit) and another tool's eBPF program. The thread's
# own clock counts it there, so a caller that a rule places in one of the four work categories decides
# (the subcategory stays, as a tag's); Uncategorized / this subcategory only where none does
# (attribution.engine). qprof's own probes are not among them: their cost is the observer's, shown apart.
CALLER_PLACED = (HANDOFF, OTHER_BPF)


def is_named_other(subcategory: str | None) -> bool:
    """Uncategorized time that is known, but is neither QUIC work nor the interrupt skid qprof could
    not place: the application's own code, language-runtime overhead and handoffs between threads."""
    return subcategory is not None and (subcategory in (APPLICATION, HANDOFF) or subcategory.startswith(RUNTIME))
