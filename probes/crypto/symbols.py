"""Find the crypto entry points in a target's objects: which library, which symbols, what to probe.

For every object a target maps (or will map: a target held right after exec
has mapped nothing but itself, so its DT_NEEDED libraries are resolved the way
the loader would), the symbol tables are read (probes.elf, the one ELF reader) and matched
against a table of per-packet QUIC crypto entry points. A Go binary stripped of its
`.symtab` (`-ldflags=-s -w`, `strip`, as distributions ship it) is read through Go's own
function table instead (`.gopclntab`, probes.gopclntab), which it always keeps: its entry
points are found by the same names at the same addresses, so it is probed as its build with
symbols is.

  library      seal / open (AEAD)                          header protection (HP)
  OpenSSL,     EVP_EncryptUpdate / EVP_DecryptUpdate        inside EVP_EncryptUpdate (split by size)
  quictls
  BoringSSL,   EVP_AEAD_CTX_seal[_scatter] /                AES_ecb_encrypt, CRYPTO_chacha_20
  aws-lc       EVP_AEAD_CTX_open_gather
  ring         ring::aead::algorithm::*_seal / *_open       ring::aead::quic::*_new_mask
  GnuTLS       gnutls_aead_cipher_encrypt / _decrypt        gnutls_cipher_encrypt2
  nettle       nettle_gcm_aes*_encrypt / _decrypt, ...      -
  Go           gcmAesEnc / gcmAesDec (asm), *Generic        crypto/internal/fips140/aes.(*Block).Encrypt

One level only: a wrapper and the function it calls are never both probed
(EVP_CipherUpdate tail-calls EVP_EncryptUpdate/EVP_DecryptUpdate;
EVP_AEAD_CTX_open calls EVP_AEAD_CTX_open_gather; GnuTLS calls nettle), so
every call is counted once. Byte counts come from a length argument read on
entry (registers, or stack slots `sargN` for the 7th argument on and for Go's
ABI0 assembly); never from return probes, and never with uretprobes on Go.

Whether AES runs with hardware instructions is told from the object (symbols
of AES-NI/VAES code, or, when stripped, the CRYPTOGAMS banners the assembly
carries in .rodata) and from the CPU flags; a stripped object's missing
internals are reported as missing, not guessed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Callable, Iterable

from qprof.probes import gopclntab
from qprof.probes.crypto.records import AesHardware, CryptoFindings, CryptoObject, CryptoProbe, CryptoSite, CryptoTarget
from qprof.probes.elf import DYNSYM, SYMTAB, UNREADABLE, ElfObject

CPU_FLAGS = ("aes", "vaes", "pclmulqdq", "vpclmulqdq", "avx2", "avx512f", "sse4_1", "ssse3")
SEAL, OPEN, HP = "aead_seal", "aead_open", "header_protection"
AES_GCM, CHACHA = "aes-gcm", "chacha20-poly1305"


@dataclass(frozen=True)
class EntryPoint:
    """One probe-able entry point: a symbol pattern and what a call to it means."""

    library: str
    pattern: str  # regex, full match on the symbol (demangled for Rust legacy names)
    kind: str  # aead_seal | aead_open | header_protection
    cipher: str | None  # None: cipher-agnostic API (the cipher is not visible at this symbol)
    length: str | None = None  # bpftrace expression of the byte count on entry; None: calls only
    path: str | None = None  # "hw" or "sw" when only that implementation enters here
    split: str | None = None  # "evp": count AAD-only / <=16 B / payload calls apart
    note: str = ""


_AWS = r"(?:aws_lc_\d+_\d+_\d+_)?"
_XGO = r"(?:vendor/)?golang\.org/x/crypto/chacha20poly1305\."
_GCM_GO = r"(?:crypto/internal/fips140/aes/gcm|crypto/aes)\."

ENTRY_POINTS: tuple[EntryPoint, ...] = (
    # OpenSSL 3 / quictls. EVP_CipherUpdate tail-calls these two (jmp via PLT), so it is not probed.
    EntryPoint("openssl", "EVP_EncryptUpdate", SEAL, None, "(arg4 & 0xffffffff)", split="evp",
         note="payload, AAD (out == NULL) and header-protection calls (16-byte AES-ECB or 5-byte ChaCha20 "
              "mask) all enter here; counted apart by out == NULL and by length <= 16 B"),
    EntryPoint("openssl", "EVP_DecryptUpdate", OPEN, None, "(arg4 & 0xffffffff)", split="evp",
         note="payload and AAD (out == NULL) calls; bytes are ciphertext bytes without the tag"),
    # BoringSSL / aws-lc (aws-lc-rs prefixes its symbols aws_lc_X_Y_Z_)
    EntryPoint("boringssl", _AWS + "EVP_AEAD_CTX_seal", SEAL, None, "sarg1",
         note="calls the AEAD's seal_scatter through a function pointer, not EVP_AEAD_CTX_seal_scatter"),
    EntryPoint("boringssl", _AWS + "EVP_AEAD_CTX_seal_scatter", SEAL, None, "sarg2"),
    EntryPoint("boringssl", _AWS + "EVP_AEAD_CTX_open_gather", OPEN, None, "arg5",
         note="EVP_AEAD_CTX_open calls it for every QUIC AEAD (AES-GCM, ChaCha20-Poly1305), so "
              "EVP_AEAD_CTX_open itself is not probed; an AEAD with its own open() is not counted"),
    EntryPoint("boringssl", _AWS + "AES_ecb_encrypt", HP, "aes", path=None,
         note="one 16-byte block per call: the QUIC AES header-protection mask"),
    EntryPoint("boringssl", _AWS + "CRYPTO_chacha_20", HP, "chacha20", "arg2",
         note="QUIC ChaCha20 header-protection mask; the generic (non-assembly) ChaCha20-Poly1305 "
              "path also calls it"),
    # ring (Rust): AEAD and HP functions reached through ring's Algorithm function pointers,
    # so not inlined into their callers. Rust has no stable ABI: calls only, no bytes.
    EntryPoint("ring", r"ring::aead::(?:algorithm|aes_gcm)::aes_gcm_seal", SEAL, AES_GCM),
    EntryPoint("ring", r"ring::aead::(?:algorithm|aes_gcm)::aes_gcm_open", OPEN, AES_GCM),
    EntryPoint("ring", r"ring::aead::(?:algorithm|chacha20_poly1305)::chacha20_poly1305_seal", SEAL, CHACHA),
    EntryPoint("ring", r"ring::aead::(?:algorithm|chacha20_poly1305)::chacha20_poly1305_open", OPEN, CHACHA),
    EntryPoint("ring", r"ring::aead::quic::aes_new_mask", HP, "aes"),
    EntryPoint("ring", r"ring::aead::quic::chacha20_new_mask", HP, "chacha20"),
    # GnuTLS: ptext_len / ctext_len are the 8th argument (second stack slot on x86-64)
    EntryPoint("gnutls", "gnutls_aead_cipher_encrypt", SEAL, None, "sarg1"),
    EntryPoint("gnutls", "gnutls_aead_cipher_decrypt", OPEN, None, "(sarg1 - arg5)",
         note="bytes: ctext_len minus the tag size (6th argument)"),
    EntryPoint("gnutls", "gnutls_cipher_encrypt2", HP, None, "arg2",
         note="QUIC stacks on GnuTLS (ngtcp2) compute the header-protection mask with it; any other "
              "gnutls_cipher_encrypt2 use in the process is counted too"),
    # nettle (probed only when GnuTLS is not: GnuTLS calls into nettle)
    EntryPoint("nettle", r"nettle_gcm_aes(?:128|192|256)?_encrypt", SEAL, AES_GCM, "arg1"),
    EntryPoint("nettle", r"nettle_gcm_aes(?:128|192|256)?_decrypt", OPEN, AES_GCM, "arg1"),
    EntryPoint("nettle", "nettle_chacha_poly1305_encrypt", SEAL, CHACHA, "arg1"),
    EntryPoint("nettle", "nettle_chacha_poly1305_decrypt", OPEN, CHACHA, "arg1"),
    # Go: the assembly takes ABI0 stack arguments: gcmAesEnc(productTable, dst, src []byte, ...)
    # has len(src) in the 6th stack word, chacha20Poly1305Seal(dst, key, src, ad) in the 8th.
    # The generic fallbacks (CPU without AES/PCLMULQDQ or SSSE3) are exclusive with them.
    EntryPoint("go", _GCM_GO + r"gcmAesEnc(?:\.abi0)?", SEAL, AES_GCM, "sarg5", path="hw"),
    EntryPoint("go", _GCM_GO + r"gcmAesDec(?:\.abi0)?", OPEN, AES_GCM, "sarg5", path="hw",
         note="bytes: ciphertext without the tag"),
    EntryPoint("go", r"crypto/internal/fips140/aes/gcm\.sealGeneric", SEAL, AES_GCM, path="sw"),
    EntryPoint("go", r"crypto/internal/fips140/aes/gcm\.openGeneric", OPEN, AES_GCM, path="sw"),
    EntryPoint("go", r"crypto/cipher\.\(\*gcm\)\.Seal", SEAL, AES_GCM, path="sw"),
    EntryPoint("go", r"crypto/cipher\.\(\*gcm\)\.Open", OPEN, AES_GCM, path="sw"),
    EntryPoint("go", _XGO + r"chacha20Poly1305Seal(?:\.abi0)?", SEAL, CHACHA, "sarg7", path="hw"),
    EntryPoint("go", _XGO + r"chacha20Poly1305Open(?:\.abi0)?", OPEN, CHACHA, "sarg7", path="hw",
         note="bytes: ciphertext without the tag"),
    EntryPoint("go", _XGO + r"\(\*chacha20poly1305\)\.sealGeneric", SEAL, CHACHA, path="sw"),
    EntryPoint("go", _XGO + r"\(\*chacha20poly1305\)\.openGeneric", OPEN, CHACHA, path="sw"),
    EntryPoint("go", r"crypto/internal/fips140/aes\.\(\*Block\)\.Encrypt", HP, "aes",
         note="cipher.Block.Encrypt: QUIC AES header protection (GCM's own block encryptions use "
              "EncryptBlockInternal); any other single-block AES use is counted too"),
    EntryPoint("go", r"crypto/aes\.\(\*aesCipher(?:Asm)?\)\.Encrypt", HP, "aes",
         note="cipher.Block.Encrypt (Go < 1.24): QUIC AES header protection"),
    EntryPoint("go", r"github\.com/quic-go/quic-go/internal/handshake\.\(\*chachaHeaderProtector\)\.apply", HP,
         "chacha20"),
)

# Symbols that tell hardware AES code is in the object (not probed: they run inside the entry points).
_HW = {
    "openssl": r"aesni_\w+|\w*vaes\w*|gcm_ghash_(?:clmul|avx)|ossl_aes\w*_aesni\w*|aes_gcm_\w*avx512\w*",
    "boringssl": _AWS + r"(?:aes_hw_\w+|aesni_gcm_\w+|\w*vaes\w*|aes_gcm_\w*avx512|gcm_(?:ghash|init)_(?:clmul|avx)\w*)",
    "ring": r"ring_core_\w+?_(?:aes_hw_\w+|aesni_gcm_\w+|\w*vaes\w*|gcm_ghash_(?:clmul|avx|vpclmulqdq)\w*)",
    "gnutls": r"_gnutls_aesni\w*|aesni_gcm_\w+|\w*aes_gcm_\w*pclmul\w*",
    "nettle": r"_nettle_\w*aesni|_nettle_ghash_\w*pclmul",
    "go": _GCM_GO + r"gcmAesEnc(?:\.abi0)?|crypto/(?:internal/fips140/)?aes\.encryptBlockAsm(?:\.abi0)?",
}
_SW = {
    "openssl": r"vpaes_\w+|AES_encrypt|gcm_ghash_4bit",
    "boringssl": _AWS + r"(?:aes_nohw_\w+|vpaes_\w+)",
    "ring": r"ring_core_\w+?_(?:aes_nohw_\w+|vpaes_\w+)",
    "nettle": r"_nettle_aes\d*_encrypt_c|_nettle_aes_encrypt",
    "go": r"crypto/internal/fips140/aes\.encryptBlockGeneric|crypto/aes\.encryptBlockGo",
}
# Which cipher families the object implements (symbols present, used or not).
_CIPHERS = {
    AES_GCM: r"(?:\w+_)?(?:EVP_aes_\d+_gcm|EVP_aead_aes_\d+_gcm\w*|nettle_gcm_aes\w*)|"
             r"ring::aead::\w+::aes_gcm_\w+|ring_core_\w+_gcm_\w+|" + _GCM_GO + r"\w+",
    CHACHA: r"(?:\w+_)?(?:EVP_chacha20_poly1305|EVP_aead_chacha20_poly1305|nettle_chacha_poly1305\w*)|"
            r"ring::aead::\w+::chacha20_poly1305_\w+|" + _XGO + r".+",
}
# CRYPTOGAMS assembly carries these banners in .rodata: evidence of AES-NI code in a stripped object.
_HW_BANNERS = (b"AES for Intel AES-NI", b"AES-NI GCM module", b"aes-gcm-x86-aesni", b"aes-gcm-x86-pclmul")

# A Rust binary stripped of its symbols (Cargo's `strip = true`) keeps its crates' source paths in .rodata (panic
# locations): which crypto crate it links, when nothing names that crate's functions any more.
_RUST_CRATE_PATHS = re.compile(rb"/(ring|aws-lc-rs)-\d+\.\d+\.\d+/src/")

# GnuTLS names its ciphers in .rodata; its per-cipher code is stripped.
_CIPHER_NAMES = (b"AES-128-GCM", b"AES-256-GCM", b"CHACHA20-POLY1305")

# Cheap prefilter before the rule regexes (most symbols of a large binary are not crypto).
_INTEREST = re.compile(r"(?i)aes|gcm|chacha|aead|cipher|EVP_|ghash|HeaderProtector")
_ENTRY_POINT_RES = [(r, re.compile(r.pattern)) for r in ENTRY_POINTS]


@dataclass(frozen=True)
class Probe:
    """One uprobe qprof would place: an entry point found in an object."""

    library: str
    symbol: str
    address: int  # virtual address in the object (bpftrace converts it to a file offset)
    table: str  # "dynsym" (exported), "symtab" (full table) or "gopclntab" (a stripped Go binary's own table)
    kind: str
    cipher: str | None
    length: str | None
    path: str | None
    split: str | None
    note: str
    size: int = 0  # the function's bytes (Go: where a morestack call comes from)

    def record(self) -> CryptoProbe:
        """As probes.json records it: the address in hex."""
        return CryptoProbe(hex(self.address), self.symbol, self.library, self.table, self.kind, self.cipher,
                           self.length, self.path, self.split, self.note, self.size)


@dataclass
class ObjectCrypto:
    """What one object offers: library kinds, crypto symbols, probes, AES hardware paths."""

    path: str
    symbols: str  # "symtab", "dynsym", "gopclntab" (a Go binary without .symtab), "none" or "unreadable"
    libraries: list[str] = field(default_factory=list)
    found: dict[str, list[str]] = field(default_factory=dict)  # table -> matching crypto symbols
    probes: list[Probe] = field(default_factory=list)
    ciphers: list[str] = field(default_factory=list)
    aes_hw: AesHardware = field(default_factory=AesHardware)
    notes: list[str] = field(default_factory=list)
    go_morestack: int | None = None  # runtime.morestack's address in a Go object (re-entries: _GO_MORESTACK)
    # where an address has no symbol (a stripped Go binary), bpftrace places the probe at the number as a
    # file offset: an address minus this (its executable segment's address less its file offset) is one
    probe_delta: int | None = None

    def record(self) -> CryptoObject:
        """As probes.json records it: addresses in hex."""
        return CryptoObject(self.path, self.symbols, list(self.libraries), dict(self.found),
                            [p.record() for p in self.probes], list(self.ciphers), self.aes_hw, list(self.notes),
                            hex(self.go_morestack) if self.go_morestack is not None else None, self.probe_delta)


def _text_delta(obj: ElfObject) -> int | None:
    """The executable PT_LOAD segment's virtual address less its file offset (None: no such segment)."""
    return next((seg.vaddr - seg.offset for seg in obj.segments() if seg.executable), None)


def cpu_flags() -> dict[str, bool]:
    """The CPU features that decide AES/GHASH/ChaCha20 code paths (from /proc/cpuinfo)."""
    flags: set[str] = set()
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    return {f: f in flags for f in CPU_FLAGS}


def rust_legacy_demangle(name: str) -> str | None:
    """`_ZN4ring4aead9algorithm12aes_gcm_seal17h0123456789abcdefE` -> `ring::aead::algorithm::aes_gcm_seal`
    (Rust's legacy mangling, still the stable default; escapes like $LT$ are left as they are)."""
    if not name.startswith("_ZN") or not name.endswith("E"):
        return None
    parts: list[str] = []
    i, end = 3, len(name) - 1
    while i < end:
        j = i
        while j < end and name[j].isdigit():
            j += 1
        if j == i:
            return None
        n = int(name[i:j])
        parts.append(name[j:j + n])
        i = j + n
    if i != end or not parts:
        return None
    if re.fullmatch(r"h[0-9a-f]{16}", parts[-1]):
        parts.pop()
    return "::".join(parts)


# A Go function whose stack check fails (its stack must grow, or the scheduler asked it to yield by
# poisoning the stack guard) calls runtime.morestack and later runs again from its entry: a uprobe
# there fires twice for one call. Seen in the Go ground-truth workload: 11 extra seals and 23 extra
# opens in 20000, 124 extra opens in 200000, each one a morestack call from gcmAesDec's tail; the
# uprobe's own trap time widens the window in which the scheduler's request lands. The program
# notes such calls at runtime.morestack and skips the re-entry (probes/crypto/program.py).
_GO_MORESTACK = re.compile(r"runtime\.morestack(?:\.abi0)?")


def _function_symbols(obj: ElfObject, table: str, interest: re.Pattern[str] = _INTEREST
                      ) -> Iterable[tuple[str, int, int]]:
    """(name, address, size) of the defined functions in one symbol table whose names match
    `interest` (crypto-related by default), Rust's legacy names demangled."""
    for f in obj.functions(table, interest):
        if f.defined:
            yield (rust_legacy_demangle(f.name) or f.name) if f.name.startswith("_ZN") else f.name, f.address, f.size


def _go_functions(go: gopclntab.GoFunctions, interest: re.Pattern[str] = _INTEREST) -> list[tuple[str, int, int]]:
    """_function_symbols' (name, address, size) from a Go binary's own function table: the names are the
    runtime's, which are the linker's but for `.abi0` on assembly (the entry-point patterns accept both)."""
    return [(n, a, size) for n, a, size in go.sized() if interest.search(n)]


def _sections_have(obj: ElfObject, needles: tuple[bytes, ...]) -> list[str]:
    """Which needles occur in .rodata or .text (CRYPTOGAMS assembly keeps its banner after its code)."""
    found: list[str] = []
    for name in (".rodata", ".text"):
        data = obj.contents(name)
        if data is None:
            continue
        found += [n.decode() for n in needles if n in data and n.decode() not in found]
    return found


def _rust_crates(obj: ElfObject) -> set[str]:
    """The crypto crates whose source paths a Rust binary's .rodata holds (_RUST_CRATE_PATHS)."""
    data = obj.contents(".rodata")
    return set() if data is None else {m.decode() for m in _RUST_CRATE_PATHS.findall(data)}


def _libraries(names: set[str], path: str, is_go: bool, crates: set[str]) -> list[str]:
    base = os.path.basename(path)
    libs = []
    aws = any(re.match(r"aws_lc_\d+_\d+_\d+_", n) for n in names) or "awslc_api_version_num" in names or \
        "aws-lc-rs" in crates
    boring = aws or any(re.fullmatch(_AWS + r"EVP_AEAD_CTX_seal\w*", n) for n in names)
    if boring:
        libs.append("aws-lc" if aws else "boringssl")
    elif "EVP_EncryptUpdate" in names:
        libs.append("openssl")
    if any(n.startswith("ring::aead") or n.startswith("ring_core_") for n in names) or "ring" in crates:
        libs.append("ring")
    if "gnutls_aead_cipher_encrypt" in names or base.startswith("libgnutls."):
        libs.append("gnutls")
    if any(n.startswith("nettle_") for n in names) or base.startswith("libnettle."):
        libs.append("nettle")
    if is_go:
        libs.append("go")
    return libs


def _rule_library(lib: str) -> str:
    return "boringssl" if lib == "aws-lc" else lib


@lru_cache(maxsize=256)
def object_crypto(path: str) -> ObjectCrypto:
    """Read one object's crypto symbols; never raises (an unreadable object says so)."""
    try:
        with ElfObject.open(path) as elf_obj:
            tables = {t: list(_function_symbols(elf_obj, t)) for t in (SYMTAB, DYNSYM)}
            kind = "symtab" if elf_obj.symbols(SYMTAB) > 1 else (
                "dynsym" if tables[DYNSYM] or elf_obj.has(DYNSYM) else "none")
            is_go = elf_obj.has(*gopclntab.SECTIONS, ".go.buildinfo")
            go = gopclntab.read(elf_obj.elf) if is_go and kind != "symtab" else None
            if go is not None and go.functions:  # stripped Go: its own table names what .symtab did
                kind, tables["gopclntab"] = "gopclntab", _go_functions(go)
                runtime = _go_functions(go, _GO_MORESTACK)
            else:
                runtime = list(_function_symbols(elf_obj, SYMTAB, _GO_MORESTACK)) if is_go else []
            morestack = next((a for n, a, _ in runtime if _GO_MORESTACK.fullmatch(n)), None)
            banners = _sections_have(elf_obj, _HW_BANNERS)
            crates = _rust_crates(elf_obj) if kind != "symtab" else set()
            cipher_names = _sections_have(elf_obj, _CIPHER_NAMES) if \
                os.path.basename(path).startswith("libgnutls.") else []
            delta = _text_delta(elf_obj) if kind == "gopclntab" else None
    except UNREADABLE as e:
        return ObjectCrypto(path, "unreadable", notes=[f"unreadable: {e}"])
    names = {n for t in tables.values() for n, _, _ in t}
    obj = ObjectCrypto(path, kind, libraries=_libraries(names, path, is_go, crates), go_morestack=morestack,
                       probe_delta=delta)
    if not obj.libraries:
        return obj
    rule_libs = {_rule_library(lib) for lib in obj.libraries}
    seen: dict[int, Probe] = {}
    found: dict[str, set[str]] = {}
    for table, syms in tables.items():
        tname = table.lstrip(".")
        for name, addr, size in syms:
            for rule, rx in _ENTRY_POINT_RES:
                if rule.library in rule_libs and rx.fullmatch(name):
                    found.setdefault(tname, set()).add(name)
                    if addr not in seen:  # aliases and a symbol in both tables: one probe per address
                        seen[addr] = Probe(rule.library, name, addr, tname, rule.kind, rule.cipher, rule.length,
                                           rule.path, rule.split, rule.note, size)
                    break
    obj.probes = sorted(seen.values(), key=lambda p: (p.kind, p.symbol))
    hw_ev: list[str] = []
    sw_ev: list[str] = []
    for lib in rule_libs:
        if lib in _HW:
            hw_ev += sorted(n for n in names if re.fullmatch(_HW[lib], n))
        if lib in _SW:
            sw_ev += sorted(n for n in names if re.fullmatch(_SW[lib], n))
    for cipher, cipher_rx in _CIPHERS.items():
        if any(re.fullmatch(cipher_rx, n) for n in names) or \
                any(c.lower().startswith(cipher.split("-")[0]) for c in cipher_names):
            obj.ciphers.append(cipher)
    for tname, hw in (("hw", hw_ev), ("sw", sw_ev)):
        if hw:
            found.setdefault(tname + "_paths", set()).update(hw[:20])
    obj.found = {k: sorted(v) for k, v in found.items()}
    if hw_ev:
        obj.aes_hw = AesHardware(True, f"symbols: {', '.join(hw_ev[:4])}" +
                                 (f" (+{len(hw_ev) - 4})" if len(hw_ev) > 4 else ""))
    elif banners:
        obj.aes_hw = AesHardware(True, "symbols stripped; the object carries the AES-NI code's banners: "
                                 + "; ".join(banners))
    elif kind == "symtab" or "go" in obj.libraries:
        obj.aes_hw = AesHardware(False, "full symbol table has no AES-NI/VAES/aes_hw code"
                                 + (f"; software AES: {', '.join(sw_ev[:3])}" if sw_ev else ""))
    else:
        obj.aes_hw = AesHardware(None, "unknown: symbols stripped and no AES-NI banner found")
    obj.notes += _stripped_notes(obj, names, crates)
    if go is not None and not go.functions:
        obj.notes.append(f"symbols absent: {os.path.basename(path)} is a Go binary without .symtab and its "
                         f".gopclntab was not read ({go.reason}): its crypto calls are not counted")
    return obj


def _stripped_notes(obj: ObjectCrypto, names: set[str], crates: set[str]) -> list[str]:
    """Say what is missing from a stripped object and where calls are counted instead."""
    base = os.path.basename(obj.path)
    if crates and not obj.probes:
        return [f"symbols absent: {base} is stripped (no .symtab) and links {', '.join(sorted(crates))} (its source "
                "paths are in .rodata): no function of it has a name to probe, so its crypto calls are not counted"]
    if obj.symbols != "dynsym":
        return []
    notes = []
    if "gnutls" in obj.libraries:
        notes.append(f"symbols absent: {base} stripped to .dynsym; AEAD calls counted at the exported "
                     "gnutls_aead_cipher_* API only (cipher and AES-NI/software path not visible per call)")
    if "openssl" in obj.libraries:
        notes.append(f"symbols absent: {base} stripped to .dynsym (no aesni_*/gcm_*/ossl_* internals); "
                     "AEAD and header-protection calls counted at the exported EVP_EncryptUpdate/"
                     "EVP_DecryptUpdate API only, told apart by length")
    if obj.libraries and not obj.probes:
        notes.append(f"symbols absent: {base} ({', '.join(obj.libraries)}) exports none of the per-packet "
                     "entry points qprof probes: not counted")
    return notes


# ---- objects of a process, including libraries not mapped yet

@lru_cache(maxsize=1)
def _ld_cache() -> dict[str, str]:
    """soname -> path for this architecture, from the loader's cache (ldconfig -p)."""
    ldconfig = shutil.which("ldconfig") or "/sbin/ldconfig"
    try:
        out = subprocess.run([ldconfig, "-p"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    found: dict[str, str] = {}
    for line in out.splitlines():
        m = re.match(r"\s+(\S+) \(([^)]*)\) => (\S+)", line)
        if m and "x86-64" in m.group(2):
            found.setdefault(m.group(1), m.group(3))
    return found


def _dynamic(path: str) -> tuple[list[str], list[str]]:
    """(DT_NEEDED, search dirs from DT_RUNPATH or DT_RPATH with $ORIGIN expanded)."""
    try:
        with ElfObject.open(path) as obj:
            needed, paths = obj.needed()
    except UNREADABLE:
        return [], []
    origin = os.path.dirname(os.path.realpath(path))
    return needed, [d.replace("$ORIGIN", origin).replace("${ORIGIN}", origin) for d in paths]


def needed_objects(exe: str) -> list[str]:
    """The shared libraries `exe` will load (DT_NEEDED, recursively), resolved like the loader:
    RUNPATH/RPATH, then ld.so.cache, then the default directories. LD_LIBRARY_PATH is not read
    (qprof reads no target environment), nor are dlopen()ed libraries known in advance."""
    cache = _ld_cache()
    out: dict[str, None] = {}
    todo = [exe]
    while todo:
        obj = todo.pop()
        needed, dirs = _dynamic(obj)
        for name in needed:
            cands = [os.path.join(d, name) for d in dirs] + ([cache[name]] if name in cache else []) + \
                [os.path.join(d, name) for d in ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu",
                                                 "/lib64", "/usr/lib64", "/lib", "/usr/lib")]
            for c in cands:
                if os.path.isfile(c):
                    real = os.path.realpath(c)
                    if real not in out:
                        out[real] = None
                        todo.append(real)
                    break
    return list(out)


def process_objects(pid: int, mapped: list[str]) -> tuple[list[str], list[str]]:
    """(mapped objects, objects the executable needs but has not mapped yet) of a live target."""
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return mapped, []
    real_mapped = {os.path.realpath(p) for p in mapped}
    pending = [p for p in needed_objects(exe) if p not in real_mapped]
    return mapped, pending


def discover(pids: Iterable[int], mapped_objects: Callable[[int], list[str]]) -> CryptoFindings:
    """The crypto picture of the targets: per object what is there, per process what to probe
    (`mapped_objects`: a target's mapped files); program.build adds its slot table."""
    flags = cpu_flags()
    objects: dict[str, ObjectCrypto] = {}
    processes: dict[int, CryptoTarget] = {}
    for pid in pids:
        mapped, pending = process_objects(pid, mapped_objects(pid))
        entry = CryptoTarget()
        for path, is_pending in [(p, False) for p in mapped] + [(p, True) for p in pending]:
            obj = object_crypto(os.path.realpath(path))
            if not obj.libraries:
                continue
            objects[obj.path] = obj
            (entry.pending_objects if is_pending else entry.objects).append(obj.path)
        libs_here = {lib for p in entry.objects + entry.pending_objects for lib in objects[p].libraries}
        for p in entry.objects + entry.pending_objects:
            for probe in objects[p].probes:
                if probe.library == "nettle" and "gnutls" in libs_here:
                    continue
                entry.probes.append(CryptoSite(p, hex(probe.address), probe.symbol, probe.kind))
        if "gnutls" in libs_here and "nettle" in libs_here:
            entry.notes.append("nettle is GnuTLS's back end here: calls are counted at GnuTLS's API, "
                               "not again in nettle")
        if entry.pending_objects:
            entry.notes.append("libraries not mapped yet at attach (target held at exec) were found "
                               "through DT_NEEDED; dlopen()ed ones are not known in advance")
        if not entry.probes:
            entry.notes.append("no crypto entry point found in this process's objects: nothing to count")
        processes[pid] = entry
    return CryptoFindings(objects={p: o.record() for p, o in objects.items()}, processes=processes,
                          cpu_flags=flags, aes_hw_usable_by_cpu=flags["aes"] and flags["pclmulqdq"])


def describe(found: CryptoFindings) -> list[str]:
    """Human lines for `qprof attach` status output (what was found and what will be probed)."""
    lines = []
    for path, o in found.objects.items():
        lines.append(f"{Path(path).name}: {'/'.join(o.libraries)}, {o.symbols} symbols, "
                     f"{len(o.probes)} entry point(s), AES hardware code "
                     f"{ {True: 'present', False: 'absent', None: 'unknown'}[o.aes_hw.present] }")
        lines += [f"  {note}" for note in o.notes]
    return lines
