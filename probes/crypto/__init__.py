"""Opt-in: AEAD seal/open and header-protection calls and bytes per thread, through uprobes.

symbols.py finds the entry points in the targets' own objects (pyelftools),
program.py writes the bpftrace program for them and prices it. A uprobe is a
trap on every call, several per packet, and on a shared library every process
that calls the function traps: opt-in, with the cost told before and after.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable

from qprof.probes.crypto import program
from qprof.probes.group import BpftraceGroup, Context, Findings, Launch, ProgramCost, Unavailable

if TYPE_CHECKING:
    from qprof.probes.packetio.maps import ProbeMaps


@dataclass(frozen=True)
class CryptoGroup(BpftraceGroup):
    def program(self, ctx: Context) -> tuple[str, Findings]:
        from qprof.probes.crypto import symbols  # pyelftools work only when the group is asked for
        found = symbols.discover(ctx.pids, ctx.mapped_objects)
        text, slots = program.build(found, follow=ctx.follow)
        for line in symbols.describe(found):
            ctx.status(f"crypto: {line}")
        if text is None:
            raise Unavailable("no crypto entry point found in the targets' objects")
        ctx.status(program.estimate_text(slots))
        found.slots = slots
        return text, Findings(crypto=found)

    def flags(self, findings: Findings) -> tuple[str, ...]:
        """bpftrace checks an address uprobe against the object's symbol table and refuses one it cannot
        match ("Could not resolve address"); a stripped Go binary's entry points come from its own
        function table (.gopclntab), which bpftrace does not read. --unsafe lifts that check only: the
        addresses are function entries Go's table gives, and the program uses no unsafe builtin."""
        slots = findings.crypto.slots if findings.crypto is not None else []
        return ("--unsafe",) if any(s.table == "gopclntab" for s in slots) else ()

    def start(self, ctx: Context) -> Launch:
        launched = super().start(ctx)
        if ctx.follow and launched.findings.crypto is not None:
            launched.follow_note = program.follow_limit(launched.findings.crypto.slots)
        return launched

    def finish(self, findings: Findings, maps: ProbeMaps, programs: list[ProgramCost],
               status: Callable[[str], None]) -> None:
        crypto = findings.crypto
        if crypto is not None:
            cost = program.cost(crypto.slots, maps, programs)
            crypto.cost = replace(cost, summary=program.cost_text(cost))
            status(crypto.cost.summary or "")


GROUP = CryptoGroup("crypto", __name__, "AEAD seal/open and header-protection calls and bytes per thread "
                    "(uprobes: a trap per call, several per packet; on shared libraries every caller traps)", ())
