"""Build and run qprof's libbpf probe programs (probes/<name>.bpf.c) beside perf.

Why a second mechanism beside bpftrace: bpftrace 0.17 can attach only classic
tracepoints, whose cost every task on the host pays per event before a
program can test the pid (see packetio.bpf.c for the measurement). Programs
that fire per datagram are therefore C, compiled once per source and kernel
with clang against the kernel's own BTF (vmlinux.h from bpftool: CO-RE, no
kernel headers), cached under ~/.cache/qprof/bpf, and attached as BTF
tracepoints through libbpf.so.1.

The loader runs as a child process (`python -m qprof.probes.libbpf`) so that
it behaves like a bpftrace child: it dies with qprof (PR_SET_PDEATHSIG), every
program, link and map is a file descriptor of it and vanishes with it (nothing
pinned), it prints a readiness line once every program is attached, and it
prints its maps every second in bpftrace's JSON format, so an interrupted run
keeps the last complete snapshot and analysis reads both mechanisms alike.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import importlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Callable

from qprof.probes.children import ProbeProcess, die_with_parent

CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "qprof" / "bpf"
VMLINUX_BTF = Path("/sys/kernel/btf/vmlinux")
READY = "qprof-ready"
_ARCH = {"x86_64": "x86", "aarch64": "arm64", "ppc64le": "powerpc", "s390x": "s390", "riscv64": "riscv"}


class Unavailable(Exception):
    """What this host lacks to build or load a libbpf program (the message says how to fix it)."""


def source_text(name: str) -> bytes:
    return resources.files("qprof.probes").joinpath(f"{name}.bpf.c").read_bytes()


def _btf_digest() -> str:
    h = hashlib.sha256()
    with open(VMLINUX_BTF, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def build(name: str, cache: Path = CACHE) -> Path:
    """The compiled object of probes/<name>.bpf.c for this kernel; compiled on first use (~3 s)."""
    clang, bpftool = shutil.which("clang"), shutil.which("bpftool")
    if clang is None:
        raise Unavailable("clang not found, needed to compile the probes once (Debian: apt-get install clang)")
    if bpftool is None:
        raise Unavailable("bpftool not found, needed for the kernel's types (Debian: apt-get install bpftool)")
    if not VMLINUX_BTF.exists():
        raise Unavailable(f"the kernel exposes no BTF at {VMLINUX_BTF} (needs CONFIG_DEBUG_INFO_BTF)")
    src = source_text(name)
    version = subprocess.run([clang, "--version"], capture_output=True, text=True).stdout.split("\n")[0]
    key = hashlib.sha256(src + version.encode() + _btf_digest().encode()).hexdigest()[:16]
    obj = cache / f"{name}-{key}.bpf.o"
    if obj.is_file():
        return obj
    cache.mkdir(mode=0o700, parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="qprof-bpf-") as tmp:
        t = Path(tmp)
        (t / f"{name}.bpf.c").write_bytes(src)
        with open(t / "vmlinux.h", "wb") as f:
            r = subprocess.run([bpftool, "btf", "dump", "file", str(VMLINUX_BTF), "format", "c"],
                               stdout=f, stderr=subprocess.PIPE, text=True)
        if r.returncode != 0:
            raise Unavailable(f"bpftool could not dump the kernel's BTF: {r.stderr.strip()[-200:]}")
        arch = _ARCH.get(platform.machine(), platform.machine())
        r = subprocess.run([clang, "-O2", "-g", "-target", "bpf", f"-D__TARGET_ARCH_{arch}", "-I", tmp,
                            "-c", str(t / f"{name}.bpf.c"), "-o", str(t / "out.o")],
                           capture_output=True, text=True)
        if r.returncode != 0:
            first = next((ln for ln in r.stderr.splitlines() if "error" in ln), r.stderr.strip()[-200:])
            if "bpf/bpf_helpers.h" in r.stderr:
                raise Unavailable("libbpf headers not found (Debian: apt-get install libbpf-dev)")
            raise Unavailable(f"clang could not compile {name}.bpf.c for this kernel: {first}")
        part = obj.with_name(obj.name + ".part")
        shutil.copyfile(t / "out.o", part)  # the cache may be on another filesystem than /tmp
        os.replace(part, obj)
    return obj


# ---------------------------------------------------------------- libbpf through ctypes

def _libbpf() -> ctypes.CDLL:
    path = ctypes.util.find_library("bpf") or "libbpf.so.1"
    try:
        lib = ctypes.CDLL(path, use_errno=True)
    except OSError as e:
        raise Unavailable(f"libbpf not found ({e}; Debian: apt-get install libbpf1)") from None
    vp, cp, i, sz = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_size_t
    for fn, res, args in (
            ("bpf_object__open_file", vp, [cp, vp]), ("bpf_object__load", i, [vp]),
            ("bpf_object__next_program", vp, [vp, vp]), ("bpf_object__next_map", vp, [vp, vp]),
            ("bpf_program__attach", vp, [vp]), ("bpf_program__name", cp, [vp]),
            ("bpf_map__name", cp, [vp]), ("bpf_map__fd", i, [vp]),
            ("bpf_map__key_size", ctypes.c_uint32, [vp]), ("bpf_map__value_size", ctypes.c_uint32, [vp]),
            ("bpf_map__type", i, [vp]), ("bpf_map__set_initial_value", i, [vp, vp, sz]),
            ("bpf_map_get_next_key", i, [i, vp, vp]), ("bpf_map_lookup_elem", i, [i, vp, vp]),
            ("libbpf_num_possible_cpus", i, []), ("libbpf_get_error", ctypes.c_long, [vp])):
        f = getattr(lib, fn)
        f.restype, f.argtypes = res, args
    return lib


_PERCPU = {5, 6, 10, 21}  # PERCPU_HASH, PERCPU_ARRAY, LRU_PERCPU_HASH, PERCPU_CGROUP_STORAGE


@dataclass
class Map:
    name: str
    fd: int
    key_size: int
    value_size: int
    percpu: bool


class Loaded:
    """A loaded and attached object: its maps, readable while it lives."""

    def __init__(self, obj_path: Path, rodata: bytes) -> None:
        self.lib = lib = _libbpf()
        self.obj = lib.bpf_object__open_file(str(obj_path).encode(), None)
        if not self.obj or lib.libbpf_get_error(self.obj):
            raise Unavailable(f"libbpf could not open {obj_path}")
        self.maps: dict[str, Map] = {}
        handles: dict[str, int] = {}
        m = lib.bpf_object__next_map(self.obj, None)
        while m:
            name = lib.bpf_map__name(m).decode()
            if name.endswith(".rodata") and rodata:
                buf = ctypes.create_string_buffer(rodata, len(rodata))
                if lib.bpf_map__set_initial_value(m, buf, len(rodata)) != 0:
                    raise Unavailable(f"the program's read-only data is not {len(rodata)} bytes: rebuild it")
            self.maps[name] = Map(name, -1, lib.bpf_map__key_size(m), lib.bpf_map__value_size(m),
                                  lib.bpf_map__type(m) in _PERCPU)
            handles[name] = m
            m = lib.bpf_object__next_map(self.obj, m)
        if lib.bpf_object__load(self.obj) != 0:
            raise Unavailable(f"the kernel refused to load {obj_path.name}: "
                              f"{os.strerror(ctypes.get_errno() or 1)} (details in the probe log)")
        for name, handle in handles.items():
            self.maps[name].fd = lib.bpf_map__fd(handle)
        self.links: list[int] = []  # held, never destroyed: they detach when this process exits
        p = lib.bpf_object__next_program(self.obj, None)
        while p:
            link = lib.bpf_program__attach(p)
            if not link or lib.libbpf_get_error(link):
                raise Unavailable(f"could not attach {lib.bpf_program__name(p).decode()}: "
                                  f"{os.strerror(ctypes.get_errno() or 1)}")
            self.links.append(link)
            p = lib.bpf_object__next_program(self.obj, p)
        self.ncpus = max(1, lib.libbpf_num_possible_cpus())

    def entries(self, name: str) -> list[tuple[bytes, list[bytes]]]:
        """(key, [value per CPU]) of every entry (one value for a shared map)."""
        m = self.maps[name]
        lib = self.lib
        per = (m.value_size + 7) // 8 * 8 if m.percpu else m.value_size
        n = self.ncpus if m.percpu else 1
        key, nxt = ctypes.create_string_buffer(m.key_size), ctypes.create_string_buffer(m.key_size)
        val = ctypes.create_string_buffer(per * n)
        out, prev = [], None
        while lib.bpf_map_get_next_key(m.fd, prev, nxt) == 0:
            ctypes.memmove(key, nxt, m.key_size)
            prev = key
            if lib.bpf_map_lookup_elem(m.fd, key, val) == 0:
                raw = val.raw
                out.append((key.raw, [raw[i * per:i * per + m.value_size] for i in range(n)]))
        return out


# ---------------------------------------------------------------- a probe group in C

@dataclass(frozen=True)
class Group:
    """What probes/<name>.py tells the runner: read-only data to set, and how its maps print."""

    name: str
    rodata: Callable[[dict[str, Any]], bytes]
    snapshot: Callable[[Loaded], list[dict[str, Any]]]  # JSON objects in bpftrace's print format


def _group(name: str) -> Group:
    return importlib.import_module(f"qprof.probes.{name}").GROUP


def _run(name: str, obj: Path, config: dict[str, Any]) -> int:
    """The child: load, attach, say ready, print the maps every second and at SIGINT/SIGTERM."""
    group = _group(name)
    stop = False

    def on_signal(_s: int, _f: object) -> None:
        nonlocal stop
        stop = True

    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, on_signal)
    try:
        loaded = Loaded(obj, group.rodata(config))
    except Unavailable as e:
        print(f"qprof: error: {e}", file=sys.stderr, flush=True)
        return 1
    out = sys.stdout
    out.write(READY + "\n")
    out.flush()

    def dump() -> None:
        for o in group.snapshot(loaded):
            out.write(json.dumps(o) + "\n")
        out.flush()

    while not stop:
        deadline = time.monotonic() + 1.0
        while not stop and time.monotonic() < deadline:
            time.sleep(0.05)
        dump()
    return 0


class LibbpfProcess(ProbeProcess):
    """One running libbpf probe group writing bpftrace-format JSON lines to `output`."""

    def __init__(self, name: str, obj: Path, config: dict[str, Any], output: Path, log: Path) -> None:
        super().__init__(name, output, log)
        self.obj, self.config = obj, config

    def spawn(self) -> None:
        cmd = [sys.executable, "-m", "qprof.probes.libbpf", self.name, str(self.obj), json.dumps(self.config)]
        self._popen(cmd, lambda: die_with_parent(signal.SIGTERM))


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: python -m qprof.probes.libbpf GROUP OBJECT CONFIG_JSON", file=sys.stderr)
        return 2
    try:
        config = json.loads(argv[2])
    except ValueError:
        print("qprof: error: CONFIG_JSON is not JSON", file=sys.stderr)
        return 2
    return _run(argv[0], Path(argv[1]), config)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

