"""Names for stripped Go binaries from Go's own function table (probes.gopclntab), against the real thing.

The Go test workload (tests/workloads/gcm_go) is built twice with one toolchain, with its symbol
table and stripped (`-ldflags=-s -w`), and once more of each linked by the system linker (cgo,
`-linkmode=external`: C start-up code before the Go text, so `.text` does not start at
`runtime.text`): the stripped build's `.gopclntab` must give every function `go tool nm` lists
for the other build, at the same address and under the same name. Hand-made tables cover the
layouts this toolchain no longer writes (Go 1.16-1.17, 1.18-1.19), 32-bit and big-endian ones;
damaged tables (cut short, a wrong magic, offsets out of range, random bytes) give no names and a
one-line reason, never an exception (property-based: hypothesis damages the real section).

The crypto probes find Go's AES-GCM entry points by name in the stripped build's table: the same
functions at the same addresses as in the build with symbols.

Kernel-facing: the stripped build recorded as a user records it, against the build with symbols
(its Crypto share within the binomial noise of the two runs' samples, its frames and its wait
stacks named), and its seal, open and block-encrypt calls counted by the crypto probes as the
workload itself counts them. The stripped quic-go and Rust endpoints on real transfers are in
tests/test_stripped_endpoints.py.
"""

from __future__ import annotations

import http.server
import json
import os
import shutil
import struct
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from elftools.elf.elffile import ELFFile
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import ROOT, attach_held, examples, own_samples, qprof, share_difference_sd, share_of
from qprof.archive.model import GOPCLNTAB, NONE
from qprof.collectors.debuginfo import Debuginfod, check_debug_file, symbols_for, write_symbols
from qprof.probes import gopclntab
from qprof.probes.crypto import symbols as cryptosyms

GCM_GO = ROOT / "tests" / "workloads" / "gcm_go"
GCM_ROUNDS = "3000000"  # ~1.5 s of AES-GCM seal/open: ~700 samples at 499 Hz


def _go() -> str:
    go = shutil.which("go") or ("/usr/local/go/bin/go" if os.path.exists("/usr/local/go/bin/go") else None)
    if go is None:
        pytest.skip("no Go toolchain (make test installs golang-go)")
    return go


def _build(out: Path, ldflags: str, cgo: bool = False) -> Path:
    env = {**os.environ, "CGO_ENABLED": "1" if cgo else "0", "GOFLAGS": "-mod=mod"}
    subprocess.run([_go(), "build", "-ldflags", ldflags, "-o", str(out), "."], cwd=GCM_GO, check=True, env=env)
    return out


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    """Linking -> (the build with symbols, the stripped build) of gcm_go, same toolchain and source."""
    out = tmp_path_factory.mktemp("gcm_go")
    got = {"internal": (_build(out / "gcm_go", ""), _build(out / "s" / "gcm_go", "-s -w"))}
    if shutil.which("gcc") or shutil.which("cc"):
        got["external"] = (_build(out / "gcm_go_ext", "-linkmode=external", cgo=True),
                           _build(out / "s" / "gcm_go_ext", "-linkmode=external -s -w", cgo=True))
    return got


def _read(path: Path) -> gopclntab.GoFunctions:
    with open(path, "rb") as f:
        return gopclntab.read(ELFFile(f))


def _go_nm(path: Path) -> dict[int, set[str]]:
    """`go tool nm`'s text symbols: address -> names."""
    out: dict[int, set[str]] = {}
    for line in subprocess.run([_go(), "tool", "nm", str(path)], capture_output=True, text=True,
                               check=True).stdout.splitlines():
        parts = line.split(None, 2)
        if len(parts) == 3 and parts[1] in ("T", "t"):
            out.setdefault(int(parts[0], 16), set()).add(parts[2])
    return out


def _same_function(name: str, nm_names: set[str]) -> bool:
    """The runtime's name (gopclntab) is the symbol table's, but for two spellings of the linker's: an assembly
    function's ABI0 symbol when a Go one shares its name is `NAME.abi0`; `·` is written `.`."""
    return bool({name, name + ".abi0", name.replace("·", ".")} & nm_names)


@pytest.mark.parametrize("linking", ["internal", "external"])
def test_names_are_those_go_tool_nm_lists(builds: dict[str, tuple[Path, Path]], linking: str) -> None:
    if linking not in builds:
        pytest.skip("no C compiler for a cgo build (make test installs gcc)")
    full, stripped = builds[linking]
    with open(stripped, "rb") as f:
        elf = ELFFile(f)
        assert elf.get_section_by_name(".symtab") is None and elf.get_section_by_name(".debug_info") is None
        text = elf.get_section_by_name(".text")["sh_addr"]
    got = _read(stripped)
    nm = _go_nm(full)
    assert got.reason == "" and got.layout == "Go 1.20+", got.reason
    exact = sum(1 for a, n in got.functions if n in nm.get(a, ()))
    same = [n for a, n in got.functions if _same_function(n, nm.get(a, set()))]
    print(f"\n{linking}: {len(got.functions)} functions in .gopclntab, {exact} with go tool nm's exact name, "
          f"{len(same) - exact} spelt as the linker spells them (.abi0, ·), {len(nm)} text addresses in go tool nm")
    assert len(same) == len(got.functions), [(hex(a), n, nm.get(a)) for a, n in got.functions
                                             if not _same_function(n, nm.get(a, set()))][:5]
    assert exact >= 0.9 * len(got.functions)
    # every text symbol in the Go code is a function listed; with Go's linker, all but runtime.etext (its end)
    listed = {a for a, _ in got.functions}
    assert {a for a in nm if got.covers(a)} == listed
    unlisted = set().union(*(n for a, n in nm.items() if a not in listed))
    assert unlisted == {"runtime.etext"} if linking == "internal" else "runtime.etext" in unlisted, unlisted
    runtime_text = next(a for a, n in nm.items() if "runtime.text" in n)
    assert got.functions[0][0] == runtime_text
    if linking == "external":
        assert runtime_text > text, "C start-up code comes first: .text's start is not runtime.text"


def test_symbols_for_writes_a_debug_file_perf_reads(builds: dict[str, tuple[Path, Path]], tmp_path: Path) -> None:
    """The chain's gopclntab step: a debug file in qprof's cache, its names those of the table, held beside it."""
    if shutil.which("objcopy") is None:
        pytest.skip("binutils' objcopy writes the debug file (make test installs binutils)")
    stripped = builds["internal"][1]
    got = symbols_for(str(stripped), tmp_path, None)
    table = _read(stripped)
    assert got.how == GOPCLNTAB and got.note == f"{len(table.functions):,} Go functions named from .gopclntab " \
                                                "(Go 1.20+ layout)", got
    assert got.source is not None and got.build_id is not None
    assert check_debug_file(Path(got.source), got.build_id) is None
    nm = subprocess.run(["nm", "-n", got.source], capture_output=True, text=True, check=True).stdout
    written = {int(a, 16): n for a, _, n in (line.split(" ", 2) for line in nm.splitlines())}
    assert written == {a: n.replace("=", "%3D") for a, n in table.functions}
    assert symbols_for(str(stripped), tmp_path, None) == got  # the next run reads what this one held
    # built with symbols: its own .symtab, nothing written
    assert symbols_for(str(builds["internal"][0]), tmp_path / "other", None).how == "symtab"


def test_the_table_comes_before_debuginfod(builds: dict[str, tuple[Path, Path]], tmp_path: Path) -> None:
    """Exact and local: a server in DEBUGINFOD_URLS is not asked for a Go binary's names."""
    if shutil.which("objcopy") is None:
        pytest.skip("binutils' objcopy writes the debug file (make test installs binutils)")
    asked: list[str] = []

    class Counting(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (the base class's name)
            asked.append(self.path)
            self.send_error(404)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Counting)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        client = Debuginfod([f"http://127.0.0.1:{server.server_address[1]}"], tmp_path, timeout_s=1.0)
        assert symbols_for(str(builds["internal"][1]), tmp_path, client).how == GOPCLNTAB
        assert asked == []
    finally:
        server.shutdown()
        server.server_close()


def test_a_damaged_table_falls_through_with_its_reason(builds: dict[str, tuple[Path, Path]], tmp_path: Path) -> None:
    damaged = tmp_path / "gcm_go"
    shutil.copy(builds["internal"][1], damaged)
    with open(damaged, "r+b") as f:
        offset = ELFFile(f).get_section_by_name(".gopclntab")["sh_offset"]
        f.seek(offset)
        f.write(b"\0\0\0\0")
    got = symbols_for(str(damaged), tmp_path / "cache", None)
    print(f"\n{got.how}: {got.note}")
    # a static Go binary has no unwind table and no exports: nothing else names it
    assert got.how == NONE and "gopclntab not used: unknown magic 0x00000000" in got.note and "\n" not in got.note


def test_without_a_build_id_it_says_why(tmp_path: Path) -> None:
    """Go wrote no GNU build-id before 1.24 (nor with `-B none`): perf finds a debug file by it, so none is made."""
    binary = _build(tmp_path / "gcm_go", "-s -w -B none")
    got = symbols_for(str(binary), tmp_path / "cache", None)
    assert got.how == NONE and got.build_id is None and got.note == (
        "no build-id: no debug file, no debuginfod; gopclntab not used: without a build-id perf cannot find the "
        "names qprof would make"), got
    assert len(_read(binary).functions) > 2000  # the table itself is there


def test_symbol_names_survive_objcopy(builds: dict[str, tuple[Path, Path]], tmp_path: Path) -> None:
    """Go's names hold spaces, quotes and backslashes (generic shapes, struct tags): objcopy's @file keeps them;
    `=`, which ends a name in --add-symbol, is written %3D."""
    if shutil.which("objcopy") is None:
        pytest.skip("binutils' objcopy writes the debug file (make test installs binutils)")
    stripped = builds["internal"][1]
    (start, _), (second, _) = _read(stripped).functions[:2]
    names = {start: 'pkg.F[go.shape.struct { a int "json:\\"x\\"" }]', second: "type:.eq.struct { p = q; 'r' }"}
    assert write_symbols(str(stripped), names, tmp_path / "debug") == 2
    nm = subprocess.run(["nm", str(tmp_path / "debug")], capture_output=True, text=True, check=True).stdout
    assert {line.split(" ", 2)[2] for line in nm.splitlines()} == {names[start], "type:.eq.struct { p %3D q; 'r' }"}


# ---- hand-made tables: every layout, both byte orders, both pointer sizes ----------------------------

MAGICS = {"Go 1.16-1.17": 0xFFFFFFFA, "Go 1.18-1.19": 0xFFFFFFF0, "Go 1.20+": 0xFFFFFFF1}


def make_table(funcs: list[tuple[int, str]], end: int, layout: str, text_start: int = 0, ptr: int = 8,
               order: str = "<") -> bytes:
    """A `.gopclntab` as Go's linker lays it out (header, funcnametab, functab, _func records); entries are
    offsets from `text_start` for 1.18+, addresses before."""
    new = layout != "Go 1.16-1.17"
    words = 8 if new else 7
    word, field = ("Q" if ptr == 8 else "I"), (4 if new else ptr)
    entry_fmt = f"{order}{'I' if field == 4 else word}"
    names, name_offs = b"", []
    for _, n in funcs:
        name_offs.append(len(names))
        names += n.encode() + b"\0"
    funcnametab = 8 + words * ptr
    functab = funcnametab + len(names)
    records = functab + (2 * len(funcs) + 1) * field
    rec_size = field + 4 + 32
    body = b""
    for i, (addr, _) in enumerate(funcs):
        entry = addr - text_start if new else addr
        body += struct.pack(entry_fmt, entry) + struct.pack(entry_fmt, records - functab + i * rec_size)
    body += struct.pack(entry_fmt, end - text_start if new else end)
    recs = b"".join(struct.pack(entry_fmt, (addr - text_start) if new else addr) + struct.pack(f"{order}i", off)
                    + bytes(32) for (addr, _), off in zip(funcs, name_offs))
    offsets = [functab] * 4  # cutab, filetab, pctab: not read
    head = [len(funcs), 0] + ([text_start] if new else []) + [funcnametab] + offsets[:3] + [functab]
    return (struct.pack(f"{order}I", MAGICS[layout]) + bytes([0, 0, 1, ptr])
            + struct.pack(f"{order}{words}{word}", *head) + names + body + recs)


FUNCS = [(0x401000, "internal/abi.Kind.String"), (0x401040, "runtime.main"),
         (0x4010a0, "github.com/quic-go/quic-go.(*Conn).run")]


@pytest.mark.parametrize("layout", MAGICS)
@pytest.mark.parametrize("ptr, order", [(8, "<"), (4, "<"), (8, ">")])
def test_every_layout(layout: str, ptr: int, order: str) -> None:
    data = make_table(FUNCS, 0x401100, layout, text_start=0x401000, ptr=ptr, order=order)
    got = gopclntab.parse(data, 0x401000)
    assert (got.functions, got.end, got.layout, got.reason) == (tuple(FUNCS), 0x401100, layout, "")
    assert got.covers(0x4010a0) and not got.covers(0x401100)


GOOD = make_table(FUNCS, 0x401100, "Go 1.20+", text_start=0x401000)


@pytest.mark.parametrize("data, reason", [
    (b"", "only 0 bytes"),
    (GOOD[:20], "header cut short (20 bytes)"),
    (b"\xfb\xff\xff\xff" + GOOD[4:], "Go 1.2-1.15 layout (magic 0xfffffffb), not read"),
    (b"\x7fELF" + GOOD[4:], "unknown magic 0x464c457f"),
    (GOOD[:7] + b"\x03" + GOOD[8:], "bad header (pad 0,0, instruction size 1, pointer size 3)"),
    (GOOD[:8] + struct.pack("<Q", 1 << 40) + GOOD[16:], "do not fit in the table"),
    (GOOD[:8] + struct.pack("<Q", 0) + GOOD[16:], "no functions listed"),
    (GOOD[:32] + struct.pack("<Q", 1 << 62) + GOOD[40:], "funcnametab offset 0x4000000000000000 outside the table"),
    (GOOD[:64] + struct.pack("<Q", len(GOOD)) + GOOD[72:], "functab offset"),
    (GOOD[:-40], "record at"),
])
def test_damaged_tables_say_why(data: bytes, reason: str) -> None:
    got = gopclntab.parse(data, 0x401000)
    assert got.functions == () and reason in got.reason and "\n" not in got.reason, got


def test_records_that_disagree_with_the_table_are_refused() -> None:
    functab = 8 + 8 * 8 + sum(len(n) + 1 for _, n in FUNCS)
    swapped = bytearray(GOOD)
    swapped[functab:functab + 4] = struct.pack("<I", 0x20)  # the first entry no longer its record's
    assert gopclntab.parse(bytes(swapped), 0x401000).reason == "function 0's record does not match its table entry"
    backwards = make_table([FUNCS[1], FUNCS[0]], 0x401100, "Go 1.20+", text_start=0x401000)
    assert "is before the previous one" in gopclntab.parse(backwards, 0x401000).reason


def test_an_object_without_the_table(tmp_path: Path) -> None:
    with open(sys.executable, "rb") as f:
        assert gopclntab.read(ELFFile(f)).reason == "no .gopclntab section"


# ---- property: damaged real bytes never raise ---------------------------------------------------------

@pytest.fixture(scope="module")
def section(builds: dict[str, tuple[Path, Path]]) -> tuple[bytes, int]:
    with open(builds["internal"][1], "rb") as f:
        elf = ELFFile(f)
        return elf.get_section_by_name(".gopclntab").data(), int(elf.get_section_by_name(".text")["sh_addr"])


def _check(got: gopclntab.GoFunctions) -> None:
    if got.functions:
        assert got.reason == "" and all(n for _, n in got.functions)
        starts = [a for a, _ in got.functions]
        assert starts == sorted(set(starts)) and got.end is not None and got.end >= starts[-1]
    else:
        assert got.reason and "\n" not in got.reason


_WORDS = st.sampled_from([0, 1, 0xFFFFFFFF, 1 << 31, 1 << 63, (1 << 64) - 1, 0x48, 0x100000])


@settings(max_examples=examples(150), deadline=None)
@given(cut=st.integers(min_value=0, max_value=1 << 21), edits=st.lists(st.tuples(st.integers(min_value=0),
       st.integers(min_value=0, max_value=255)), max_size=8), word=st.tuples(st.integers(min_value=0, max_value=7),
       _WORDS), text_start=st.sampled_from([0, 0x401000, (1 << 64) - 1]))
def test_damaged_real_bytes_never_raise(section: tuple[bytes, int], cut: int, edits: list[tuple[int, int]],
                                        word: tuple[int, int], text_start: int) -> None:
    data, _ = section
    damaged = bytearray(data[:cut])
    for at, value in edits:
        if damaged:
            damaged[at % len(damaged)] = value
    if len(damaged) >= 72 and word[1] != 0:
        damaged[8 + 8 * word[0]:16 + 8 * word[0]] = struct.pack("<Q", word[1])
    _check(gopclntab.parse(bytes(damaged), text_start))


@settings(max_examples=examples(150), deadline=None)
@given(data=st.binary(max_size=400), magic=st.sampled_from([None, *MAGICS.values()]))
def test_random_bytes_never_raise(data: bytes, magic: int | None) -> None:
    if magic is not None:
        data = struct.pack("<I", magic) + bytes([0, 0, 1, 8]) + data
    _check(gopclntab.parse(data, 0x401000))


# ---- kernel-facing: recorded as users record -----------------------------------------------------------

def _env(tmp: Path) -> dict[str, str]:
    """qprof's build-id cache of the run's own (perf would read one build's names for another with the same
    build-id), no debuginfod."""
    env = {k: v for k, v in os.environ.items() if k != "DEBUGINFOD_URLS"}
    return {**env, "QPROF_SYMBOL_CACHE": str(tmp)}


def _recorded(run: Path, *argv: str) -> dict[str, Any]:
    r = subprocess.run([sys.executable, "-m", "qprof.cli", "record", "-q", "-o", str(run), *argv],
                       env=_env(run.parent / f"{run.name}-symbols"), cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    return json.loads(qprof("report", str(run), "--format", "json", "--top", "100000").stdout)


def _naming(p: dict[str, Any], binary: Path) -> dict[str, Any]:
    return next(o for o in p["symbols"] if o["object"] == str(binary))


@pytest.mark.root
@pytest.mark.slow
def test_a_stripped_go_binary_is_profiled_as_its_build_with_symbols(kernel_facing: None, tmp_path: Path,
                                                                    builds: dict[str, tuple[Path, Path]]) -> None:
    full, stripped = builds["internal"]
    got = {}
    for name, binary in (("symbols", full), ("stripped", stripped)):
        (p,) = _recorded(tmp_path / name, "--", str(binary), GCM_ROUNDS, str(tmp_path / "out.json"))["processes"]
        got[name] = p
        crypto, n = p["categories"]["Crypto"], p["samples"]
        print(f"\n{name}: {n} samples, Crypto {crypto:.1%}, unnamed {p['unnamed_share']:.2%}, "
              f"{_naming(p, binary)['how']} ({_naming(p, binary)['note']})")
    p, base = got["stripped"], got["symbols"]
    assert _naming(p, stripped)["how"] == GOPCLNTAB and _naming(base, full)["how"] == "symtab"
    go = next(m for m in p["mappings"] if m["name"] == "go-runtime")
    assert go["detected_by"].startswith("Go binary")
    assert p["unnamed_share"] <= 0.05
    # Both builds' own code, named two ways, is placed alike: each function in the category the other named it
    # in, and Crypto's share of the binary's samples within two binomial shares' spread. (CI once read Crypto
    # 97.9% against 91.3% of all samples: the stripped run had 100 more outside the binary, in the kernel.)
    own, own0 = own_samples(p, stripped), own_samples(base, full)
    placed: dict[str, set[str]] = {}
    placed0: dict[str, set[str]] = {}
    for into, keys in ((placed, own), (placed0, own0)):
        for c, f in keys:
            into.setdefault(f, set()).add(c)  # a rule on the callers may place one function in two
    assert {f: (c, placed0[f]) for f, c in placed.items() if f in placed0 and not c & placed0[f]} == {}
    (share, n), (share0, n0) = share_of(own, "Crypto"), share_of(own0, "Crypto")
    print(f"in the binary: stripped {n} samples ({n / p['samples']:.1%}), Crypto {share:.1%}; "
          f"symbols {n0} ({n0 / base['samples']:.1%}), Crypto {share0:.1%}")
    assert share0 > 0.5, "the workload is mostly AES-GCM"
    sd = share_difference_sd(share, n, share0, n0)
    assert abs(share - share0) <= 4 * sd + 0.005, (share, share0, sd)
    assert {s["symbol"] for s in p["top_symbols"]["Crypto"][:3]} & {"crypto/internal/fips140/aes/gcm.gcmAesEnc",
                                                                    "crypto/internal/fips140/aes/gcm.gcmAesDec"}
    text = qprof("report", str(tmp_path / "stripped")).stdout.splitlines()
    line = next(ln for ln in text if "symbols:" in ln)
    assert f"{stripped.name} gopclntab" in line, line
    waits = [ln for ln in text if ln.strip().startswith("waiting:")]  # the waits probes' user frames, named too
    print("\n".join(waits))
    assert all(f"[{stripped.name}+0x" not in ln for ln in waits)
    assert any("<- runtime." in ln for ln in waits) == bool(waits)


def same_probes(full: cryptosyms.ObjectCrypto, stripped: cryptosyms.ObjectCrypto) -> None:
    """The stripped object's crypto probes are its build's with symbols: one per address, same kind, byte count
    and path, the runtime's name (the linker's but for `.abi0`), and a size that runs on to the next function
    (the table keeps no sizes: at most the 32-byte alignment's padding more)."""
    assert full.symbols == "symtab" and stripped.symbols == "gopclntab", (full.symbols, stripped.symbols)
    want, got = {p.address: p for p in full.probes}, {p.address: p for p in stripped.probes}
    assert want and set(got) == set(want), sorted(set(got) ^ set(want))
    for a, p in want.items():
        q = got[a]
        assert (q.kind, q.cipher, q.length, q.path, q.library) == (p.kind, p.cipher, p.length, p.path, p.library)
        assert q.symbol in (p.symbol, p.symbol.removesuffix(".abi0")) and q.table == "gopclntab", (p.symbol, q.symbol)
        assert p.size <= q.size < p.size + 32, (p.symbol, p.size, q.size)
    assert stripped.go_morestack == full.go_morestack is not None
    assert (stripped.libraries, stripped.ciphers, stripped.aes_hw.present) == \
        (full.libraries, full.ciphers, full.aes_hw.present)


def test_crypto_entry_points_of_a_stripped_build(builds: dict[str, tuple[Path, Path]]) -> None:
    full, stripped = builds["internal"]
    a, b = cryptosyms.object_crypto(str(full)), cryptosyms.object_crypto(str(stripped))
    print("\n" + "\n".join(f"{p.kind:18s} {p.symbol} {p.address:#x}" for p in b.probes))
    same_probes(a, b)
    assert {p.kind for p in b.probes} == {"aead_seal", "aead_open", "header_protection"}


@pytest.mark.root
@pytest.mark.slow
def test_crypto_probes_count_a_stripped_build_exactly(probes_available: None, tmp_path: Path,
                                                     builds: dict[str, tuple[Path, Path]]) -> None:
    """Found by name in .gopclntab, probed at the same addresses: every seal, open and block encryption the
    stripped workload makes is counted, as for its build with symbols (tests/test_crypto_probes.py)."""
    stripped = builds["internal"][1]
    if not any("gcmAesEnc" in p.symbol for p in cryptosyms.object_crypto(str(stripped)).probes):
        pytest.skip("this Go toolchain has no gcmAesEnc assembly on this architecture")
    truth_file, run = tmp_path / "truth.json", tmp_path / "run"
    proc = attach_held([str(stripped), "20000", str(truth_file)], run, probes=("crypto",))
    truth = json.loads(truth_file.read_text())
    found = json.loads((run / "probes.json").read_text())["crypto"]
    assert found["objects"][str(stripped)]["symbols"] == "gopclntab"
    probed = {s["symbol"] for s in found["slots"]}
    report = json.loads(qprof("report", str(run), "--format", "json").stdout)["crypto"]
    assert report is not None, (run / "probe-crypto.log").read_text()[-300:]  # the uprobes attached and counted
    p = report["processes"][str(proc.pid)]
    print(f"\nworkload: {truth}; qprof: {p['calls']} {p['bytes']}; probed {sorted(probed)}")
    assert {"crypto/internal/fips140/aes/gcm.gcmAesEnc", "crypto/internal/fips140/aes/gcm.gcmAesDec"} <= probed
    assert (p["calls"]["aead_seal"], p["calls"]["aead_open"], p["calls"]["header_protection"]) == \
        (truth["seal"], truth["open"], truth["block_encrypt"])
    assert p["bytes"]["aead_seal"] == p["bytes"]["aead_open"] == truth["plaintext_bytes"]
    assert "runtime.morestack" in (run / "probe-crypto.bt").read_text()  # re-entries found through the table too
