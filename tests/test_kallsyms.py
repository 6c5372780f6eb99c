"""The attach's kallsyms snapshot: names looked up in it match a full parse, and perf record given it
writes the kernel map it writes reading /proc/kallsyms itself."""

from __future__ import annotations

import bisect
import ctypes
import os
import random
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qprof.collectors.perf import with_kallsyms
from qprof.probes import kallsyms
from qprof.probes.kallsyms import UNKNOWN_FRAME, KernelSymbols


def reference(data: bytes) -> tuple[list[bytes], list[bytes]]:
    """Every text symbol, sorted by (address, name): what the lookups must agree with."""
    syms = sorted(m for m in re.findall(rb"^([0-9a-f]{16}) [tTwW] (\S+)", data, re.M) if m[0] != b"0" * 16)
    return [a for a, _ in syms], [n for _, n in syms]


def ref_name(starts: list[bytes], names: list[bytes], addr: int) -> str:
    i = bisect.bisect_right(starts, b"%016x" % addr) - 1
    return names[i].decode() if i >= 0 else UNKNOWN_FRAME


line = st.tuples(st.integers(0x1000, 0x2000), st.sampled_from("tTwWdDbBrR"), st.sampled_from(["a", "b", "c_d", "e.1"]))
module_line = st.tuples(st.integers(0x3000, 0x4000), st.sampled_from("tTd"), st.sampled_from(["m1", "m2"]))


@settings(max_examples=300, deadline=None)
@given(core=st.lists(line, max_size=40), mods=st.lists(module_line, max_size=10), probes=st.lists(
    st.integers(0, 0x5000), min_size=1, max_size=30))
def test_lookup_matches_a_full_parse(tmp_path_factory: pytest.TempPathFactory, core: list[tuple[int, str, str]],
                                     mods: list[tuple[int, str, str]], probes: list[int]) -> None:
    """The kernel's own symbols sorted (aliases and data symbols among them), modules after, unsorted."""
    text = "".join(f"{a:016x} {t} {n}\n" for a, t, n in sorted(core))
    text += "".join(f"{a:016x} {t} {n}\t[mod]\n" for a, t, n in mods)
    path = tmp_path_factory.mktemp("ks") / "kallsyms"
    path.write_text(text)
    syms = KernelSymbols(path)
    starts, names = reference(text.encode())
    for addr in probes:
        assert syms.name(addr) == ref_name(starts, names, addr), hex(addr)


def test_hidden_addresses_name_nothing(tmp_path: Path) -> None:
    path = tmp_path / "kallsyms"
    path.write_text("0000000000000000 T _text\n0000000000000000 t f\n")
    assert KernelSymbols(path).name(0x1234) == UNKNOWN_FRAME
    assert kallsyms.snapshot(tmp_path / "absent-dir") is None


def test_snapshot_of_this_kernel_names_as_a_full_parse(tmp_path: Path) -> None:
    snap = kallsyms.snapshot(tmp_path)
    if snap is None:
        pytest.skip("/proc/kallsyms is unreadable or its addresses hidden here (kptr_restrict)")
    data = snap.read_bytes()
    starts, names = reference(data)
    syms = KernelSymbols(snap)
    rng = random.Random(7)
    addrs = [int(a, 16) for a in rng.sample(starts, 2000)]
    lo, hi = int(starts[0], 16), int(starts[-1], 16)
    probes = [a + rng.randrange(0, 256) for a in addrs] + [rng.randrange(lo - 4096, hi + 4096) for _ in range(2000)]
    assert all(syms.name(a) == ref_name(starts, names, a) for a in probes)
    kallsyms.remove(snap)
    assert not snap.exists()


def _kernel_map(perf: str, cmd: list[str], data: Path) -> str:
    subprocess.run(cmd, check=True, capture_output=True, timeout=60)
    dump = subprocess.run([perf, "report", "-D", "-i", str(data)], capture_output=True, text=True, timeout=60).stdout
    maps = [ln.split(":", 1)[1].strip() for ln in dump.splitlines() if "PERF_RECORD_MMAP -1/0" in ln]
    assert maps, "perf wrote no kernel map"
    return "\n".join(maps)


def test_perf_record_given_the_snapshot_writes_the_same_kernel_map(tmp_path: Path) -> None:
    """The bound file is read in place of /proc/kallsyms (perf's start-up CPU drops) and the kernel's
    map perf records is the same as with the kernel's own file."""
    perf = shutil.which("perf")
    if perf is None or os.geteuid() != 0:
        pytest.skip("needs perf, as root")
    snap = kallsyms.snapshot(tmp_path)
    assert snap is not None
    def record(data: Path) -> list[str]:
        return [perf, "record", "-a", "-F", "99", "-N", "--no-bpf-event", "-B", "-o", str(data), "--", "sleep", "0.2"]
    wrapped = with_kallsyms(record(tmp_path / "b.data"), snap)
    assert wrapped[0] == "unshare", "this root cannot make a mount namespace: perf would read /proc/kallsyms"
    assert _kernel_map(perf, wrapped, tmp_path / "b.data") == _kernel_map(perf, record(tmp_path / "a.data"),
                                                                          tmp_path / "a.data")
    # and it read the snapshot: a namespace whose file names a symbol the kernel has not
    fake = tmp_path / "fake"
    fake.write_bytes(snap.read_bytes().replace(b" T _text\n", b" T _text_fake\n", 1).replace(b" T _stext\n",
                                                                                             b" T _stext_fake\n", 1))
    seen = subprocess.run(with_kallsyms(["grep", "-c", "_text_fake", "/proc/kallsyms"], fake),
                          capture_output=True, text=True, timeout=30)
    assert seen.stdout.strip() == "1"


class _ProgLoad(ctypes.Structure):
    """bpf(2)'s attr for BPF_PROG_LOAD, as far as a socket filter needs it."""

    _fields_ = [("prog_type", ctypes.c_uint32), ("insn_cnt", ctypes.c_uint32), ("insns", ctypes.c_uint64),
                ("license", ctypes.c_uint64), ("log_level", ctypes.c_uint32), ("log_size", ctypes.c_uint32),
                ("log_buf", ctypes.c_uint64), ("kern_version", ctypes.c_uint32), ("prog_flags", ctypes.c_uint32),
                ("prog_name", ctypes.c_char * 16)]


def _load_socket_filter(name: bytes) -> int:
    """A real two-instruction program (r0 = 0; exit) loaded into the kernel: its fd."""
    insns = ctypes.create_string_buffer(bytes.fromhex("b700000000000000" "9500000000000000"), 16)
    lic = ctypes.create_string_buffer(b"GPL")
    attr = _ProgLoad(prog_type=1, insn_cnt=2, insns=ctypes.addressof(insns), license=ctypes.addressof(lic),
                     prog_name=name)
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.syscall(321, 5, ctypes.byref(attr), ctypes.sizeof(attr))
    assert fd >= 0, os.strerror(ctypes.get_errno())
    return int(fd)


def test_snapshot_comes_from_the_cache_while_the_kernels_symbols_stay(tmp_path: Path) -> None:
    """The second attach's snapshot is the first one's file, as the kernel would write it; a BPF program
    loaded in between (a new JIT image with a name of its own) makes it read /proc/kallsyms again."""
    if os.geteuid() != 0:
        pytest.skip("needs root: listing BPF programs and reading kallsyms' addresses")
    cache = tmp_path / "cache"
    first, second, third = (tmp_path / n for n in ("a", "b", "c"))
    for d in (first, second, third):
        d.mkdir()
    a = kallsyms.snapshot(first, cache)
    assert a is not None and kallsyms.fingerprint() is not None
    assert [p.name for p in cache.iterdir()] == [f"kallsyms-{kallsyms.fingerprint()}"]
    b = kallsyms.snapshot(second, cache)
    assert b is not None and b.stat().st_ino == (cache / f"kallsyms-{kallsyms.fingerprint()}").stat().st_ino
    assert b.read_bytes() == Path("/proc/kallsyms").read_bytes()
    before = kallsyms.fingerprint()
    fd = _load_socket_filter(b"qprof_fp_test")
    try:
        assert kallsyms.fingerprint() != before
        c = kallsyms.snapshot(third, cache)
        assert c is not None and b"_qprof_fp_test" in c.read_bytes() and b"_qprof_fp_test" not in b.read_bytes()
    finally:
        os.close(fd)
