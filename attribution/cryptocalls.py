"""Crypto per process from the opt-in `crypto` probes: calls and bytes per operation, per datagram.

Turns the crypto group's maps (calls and bytes per pid, tid and slot; the slot
table says which entry point and part each slot is) into what a QUIC
maintainer asks: how many AEAD seals, opens and header-protection (HP) calls
the endpoint made, how many per datagram sent and received (packet I/O probes,
when they ran too), which cipher, and whether AES ran on hardware instructions.
Every figure says what it rests on; nothing missing from a stripped library is
filled in.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

from qprof.attribution.packetio import PacketIO
from qprof.attribution import probemaps
from qprof.archive import schema
from qprof.archive.model import CryptoCost, CryptoObject, CryptoSlot, CryptoTarget, ProbeRecord
from qprof.jsonvalue import JsonObject

KINDS = ("aead_seal", "aead_open", "header_protection")


def _r(x: float | None, nd: int = 3) -> float | None:
    return None if x is None else round(x, nd)


def _kind(slot: CryptoSlot) -> str:
    """The operation a slot counts. OpenSSL's EVP_EncryptUpdate parts: AAD-only updates are their own
    kind; <= 16-byte calls are header-protection-sized (told apart by size, see `basis`)."""
    if slot.part == "aad":
        return "aad_update"
    if slot.part == "short" and slot.kind == "aead_seal":
        return "header_protection"
    return str(slot.kind)


@dataclass
class ProcessCrypto:
    pid: int
    calls: Counter[str] = field(default_factory=Counter)  # operation (KINDS, aad_update) -> calls
    bytes: Counter[str] = field(default_factory=Counter)
    bytes_complete: dict[str, bool] = field(default_factory=dict)  # False: some calls carry no length
    threads: dict[int, dict[str, int]] = field(default_factory=dict)
    symbols: dict[str, int] = field(default_factory=lambda: defaultdict(int))  # "symbol (part)" -> calls
    ciphers_called: set[str] = field(default_factory=set)
    hp_ciphers: set[str] = field(default_factory=set)  # "aes" / "chacha20" from cipher-specific HP symbols
    ciphers_supported: set[str] = field(default_factory=set)
    hw_calls: int = 0
    sw_calls: int = 0
    aes_hw_present: bool | None = None
    aes_hw_evidence: list[str] = field(default_factory=list)
    libraries: set[str] = field(default_factory=set)
    tx_dgrams: int | None = None
    rx_dgrams: int | None = None
    cpu_aes: bool | None = None  # the CPU has AES-NI and PCLMULQDQ
    basis: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def per_datagram(self) -> dict[str, float | None]:
        tx, rx = self.tx_dgrams, self.rx_dgrams
        both = (tx or 0) + (rx or 0)
        total = sum(self.calls[k] for k in (*KINDS, "aad_update"))
        return {
            "seal_per_datagram_sent": _r(self.calls["aead_seal"] / tx) if tx else None,
            "open_per_datagram_received": _r(self.calls["aead_open"] / rx) if rx else None,
            "header_protection_per_datagram": _r(self.calls["header_protection"] / both) if both else None,
            "calls_per_datagram": _r(total / both) if both else None,
        }

    @property
    def cipher(self) -> str:
        if self.ciphers_called:
            return ", ".join(sorted(self.ciphers_called))
        if self.hp_ciphers:
            aead = {"aes": "aes-gcm", "chacha20": "chacha20-poly1305"}
            return (", ".join(sorted(aead[c] for c in self.hp_ciphers)) + " (from header protection: "
                    "RFC 9001 uses AES for AES-GCM and ChaCha20 for ChaCha20-Poly1305)")
        sup = ", ".join(sorted(self.ciphers_supported)) or "?"
        return f"not visible at the probed API (library implements {sup})"

    @property
    def aes_path(self) -> str:
        """hardware / software as seen per call when the probed symbols tell, else what the objects hold."""
        if self.hw_calls or self.sw_calls:
            if self.hw_calls and self.sw_calls:
                return f"mixed: {self.hw_calls:,} calls on hardware paths, {self.sw_calls:,} on software"
            return "hardware (per call: assembly path)" if self.hw_calls else "software fallback (per call)"
        if self.aes_hw_present is True:
            cpu = {True: "the CPU has AES-NI and PCLMULQDQ: hardware expected",
                   False: "the CPU lacks AES-NI/PCLMULQDQ: software fallback expected",
                   None: "CPU flags unknown"}[self.cpu_aes]
            return f"AES hardware code present in the library; {cpu} (not visible per call)"
        if self.aes_hw_present is False:
            return "software only (no AES hardware code in the library)"
        return "unknown (library stripped)"

    def to_json(self) -> JsonObject:
        symbols = sorted(self.symbols.items(), key=lambda kv: -kv[1])
        return {
            "calls": {k: self.calls[k] for k in (*KINDS, "aad_update")},
            "bytes": {k: self.bytes[k] for k in KINDS if k in self.bytes},
            "bytes_complete": self.bytes_complete,
            **self.per_datagram(),
            "datagrams_sent": self.tx_dgrams, "datagrams_received": self.rx_dgrams,
            "cipher": self.cipher, "ciphers_called": sorted(self.ciphers_called),
            "aes_path": self.aes_path, "aes_hw_present": self.aes_hw_present,
            "aes_hw_evidence": self.aes_hw_evidence, "libraries": sorted(self.libraries),
            "symbols": dict(symbols),
            "threads": {str(t): dict(v) for t, v in sorted(self.threads.items())},
            "basis": self.basis, "notes": self.notes,
        }


@dataclass
class Crypto:
    processes: dict[int, ProcessCrypto]
    cpu_flags: dict[str, bool]
    cost: CryptoCost | None  # what the crypto probes cost (the report carries it as probes.json has it)
    slots: int

    def to_json(self) -> JsonObject:
        return {"processes": {str(p): v.to_json() for p, v in sorted(self.processes.items())},
                "cpu_flags": self.cpu_flags, "probe_cost": None if self.cost is None else schema.encode(self.cost),
                "slots": self.slots}


def analyse(probes: ProbeRecord, pids: list[int], packet_io: PacketIO | None = None) -> Crypto | None:
    """The crypto picture of a run; None when the crypto group did not run."""
    rec = probes.crypto  # the symbols and slots it found (probes.crypto)
    if rec is None or "crypto" not in probes.programs:
        return None  # not asked for, or did not start (probes.json "unavailable" says why)
    slots = {s.slot: s for s in rec.slots}
    maps = probes.maps("crypto")
    cpu = rec.cpu_flags
    cpu_aes = bool(cpu.get("aes") and cpu.get("pclmulqdq")) if cpu else None
    procs = {p: ProcessCrypto(p, cpu_aes=cpu_aes) for p in pids}
    for pid, proc in procs.items():
        entry = rec.processes.get(pid, CryptoTarget())
        for path in entry.objects + entry.pending_objects:
            o = rec.objects.get(path, CryptoObject())
            proc.libraries.update(o.libraries)
            proc.ciphers_supported.update(o.ciphers)
            if o.aes_hw.present is not None and proc.aes_hw_present is not True:
                proc.aes_hw_present = o.aes_hw.present
            if o.aes_hw.evidence:
                proc.aes_hw_evidence.append(f"{path.rsplit('/', 1)[-1]}: {o.aes_hw.evidence}")
            proc.notes += [n for n in o.notes if n not in proc.notes]
        proc.notes += entry.notes
    has_bytes: dict[tuple[int, str], list[bool]] = defaultdict(list)
    for key, n in probemaps.counters(maps, "@calls"):
        if len(key) < 3 or key[0] not in procs or key[2] not in slots:
            continue
        proc, slot = procs[key[0]], slots[key[2]]
        kind = _kind(slot)
        proc.calls[kind] += n
        proc.threads.setdefault(key[1], defaultdict(int))[kind] += n
        label = slot.symbol + ("" if slot.part in (None, "all") else f" ({slot.part})")
        proc.symbols[label] += n
        has_bytes[(key[0], kind)].append(slot.bytes)
        if slot.cipher in ("aes-gcm", "chacha20-poly1305") and n:
            proc.ciphers_called.add(slot.cipher)
        elif slot.cipher in ("aes", "chacha20") and kind == "header_protection" and n:
            proc.hp_ciphers.add(slot.cipher)
        if slot.path == "hw":
            proc.hw_calls += n
        elif slot.path == "sw":
            proc.sw_calls += n
        if slot.part == "short":
            basis = (f"{slot.symbol} calls of <= 16 bytes are counted as header protection (the mask is "
                     "one 16-byte AES block or 5 ChaCha20 bytes); a payload that small is counted with them")
            if basis not in proc.basis:
                proc.basis.append(basis)
    for key, n in probemaps.counters(maps, "@bytes"):
        if len(key) < 3 or key[0] not in procs or key[2] not in slots:
            continue
        procs[key[0]].bytes[_kind(slots[key[2]])] += n
    for (pid, kind), flags in has_bytes.items():
        procs[pid].bytes_complete[kind] = all(flags)
    for pid, proc in procs.items():
        if packet_io is not None and pid in packet_io.processes:
            pp = packet_io.processes[pid]
            proc.tx_dgrams, proc.rx_dgrams = pp.tx.dgrams, pp.rx.dgrams
        if proc.calls["aead_seal"] and not proc.calls["aead_open"] and proc.rx_dgrams:
            proc.notes.append(f"no AEAD open counted although {proc.rx_dgrams:,} datagrams were received: "
                              "the open path may enter below the probed symbols (inlined or another API)")
        hp = proc.calls["header_protection"]
        if hp and proc.bytes["header_protection"] and proc.bytes_complete.get("header_protection"):
            per = proc.bytes["header_protection"] / hp
            proc.basis.append(f"header protection input {per:.1f} bytes per call (an AES mask encrypts one "
                              "16-byte sample; a ChaCha20 mask is 5 bytes)")
    return Crypto(procs, rec.cpu_flags, rec.cost, len(slots))
