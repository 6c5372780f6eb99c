"""What the crypto group finds to probe and what probing costs, typed: probes.json's `crypto` as it is.

symbols.discover finds it (CryptoFindings: per object its entry points, per target what to count),
program.build adds the slot table, program.cost the cost; the collector records it as it is, and
the report reads it back through the same records (archive.model re-exports them). Addresses are
hex strings, as probes.json has always written them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from qprof.probes.fields import NEVER_NULL


@dataclass(frozen=True)
class AesHardware:
    present: bool | None = None
    evidence: str | None = None
    software_only: bool | None = field(default=None, metadata=NEVER_NULL)


@dataclass(frozen=True)
class CryptoProbe:
    """One entry point found in an object (probes.crypto.symbols.Probe); `address` in hex."""

    address: str
    symbol: str
    library: str | None = None
    table: str | None = None
    kind: str | None = None
    cipher: str | None = None
    length: str | None = None  # the bpftrace expression of its byte count
    path: str | None = None
    split: str | None = None
    note: str | None = None
    size: int = 0


@dataclass(frozen=True)
class CryptoObject:
    """What the crypto group found in one mapped object (probes.crypto.symbols.ObjectCrypto)."""

    path: str | None = field(default=None, metadata=NEVER_NULL)
    symbols: str | None = field(default=None, metadata=NEVER_NULL)
    libraries: list[str] = field(default_factory=list)
    found: dict[str, list[str]] = field(default_factory=dict)
    probes: list[CryptoProbe] = field(default_factory=list)
    ciphers: list[str] = field(default_factory=list)
    aes_hw: AesHardware = field(default_factory=AesHardware)
    notes: list[str] = field(default_factory=list)
    go_morestack: str | None = None  # hex
    probe_delta: int | None = None


@dataclass(frozen=True)
class CryptoSite:
    """An entry point one target's calls are counted at."""

    object: str
    address: str
    symbol: str
    kind: str | None = None


@dataclass(frozen=True)
class CryptoTarget:
    """The objects of one target the crypto group looked at (pending: needed but not mapped yet)."""

    objects: list[str] = field(default_factory=list)
    pending_objects: list[str] = field(default_factory=list)
    probes: list[CryptoSite] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class CryptoSlot:
    """One counted call site of the crypto program: the map key's slot number and what it counts."""

    slot: int
    symbol: str
    part: str | None = None  # evp splits one call into aad, short (header protection) and payload
    kind: str | None = None
    cipher: str | None = None
    path: str | None = None  # hw or sw AES
    bytes: bool = False  # its byte count is known
    object: str | None = field(default=None, metadata=NEVER_NULL)
    address: str | None = field(default=None, metadata=NEVER_NULL)
    library: str | None = field(default=None, metadata=NEVER_NULL)
    table: str | None = field(default=None, metadata=NEVER_NULL)


@dataclass(frozen=True)
class CryptoCost:
    """What the crypto probes cost (probes.crypto.program.cost); fields in the order probes.json
    writes them, the report carries it as written."""

    all_hits: int | None = None
    basis: str | None = field(default=None, metadata=NEVER_NULL)
    bpf_ns_per_hit: float | None = None
    bpf_run_time_ns: int | None = None
    host_estimated_ns: int | None = None
    summary: str | None = field(default=None, metadata=NEVER_NULL)
    target_estimated_ns: int | None = None
    target_hits: int = 0
    target_reentries: int = 0
    trap_ns_per_hit: int | float | None = field(default=None, metadata=NEVER_NULL)
    uprobes: int | None = field(default=None, metadata=NEVER_NULL)


@dataclass
class CryptoFindings:
    """What the crypto group found to probe and what probing it cost (probes.json `crypto`)."""

    slots: list[CryptoSlot] = field(default_factory=list)
    objects: dict[str, CryptoObject] = field(default_factory=dict)
    processes: dict[int, CryptoTarget] = field(default_factory=dict)
    cpu_flags: dict[str, bool] = field(default_factory=dict)
    aes_hw_usable_by_cpu: bool | None = field(default=None, metadata=NEVER_NULL)
    skipped: list[str] | None = field(default=None, metadata=NEVER_NULL)  # entry points bpftrace cannot take
    cost: CryptoCost | None = field(default=None, metadata=NEVER_NULL)
