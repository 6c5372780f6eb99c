"""Every probe group qprof ships, in the order `--probes` lists them (probes/group.py)."""

from __future__ import annotations

from qprof.probes import crypto, packetio, softirq, syscalls, waits
from qprof.probes.group import ProbeGroup

GROUPS: dict[str, ProbeGroup] = {g.name: g for g in (
    packetio.GROUP,
    waits.GROUP,
    softirq.GROUP,
    syscalls.GROUP,
    crypto.GROUP,
)}
DEFAULT_GROUPS = tuple(name for name, g in GROUPS.items() if g.default)
