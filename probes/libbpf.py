"""Build and load qprof's libbpf probe programs (a group's <name>.bpf.c) beside perf.

Why a second mechanism beside bpftrace: bpftrace 0.17 can attach only classic
tracepoints, whose cost every task on the host pays per event before a
program can test the pid; programs that fire per datagram are therefore C,
compiled once per source and kernel with clang against the kernel's own BTF
(vmlinux.h from bpftool: CO-RE, no kernel headers), cached under
~/.cache/qprof/bpf, and attached as BTF tracepoints through libbpf.so.1.

A group's loader runs as a child process (`python -m <its sampler module>`) so
that it behaves like a bpftrace child: it dies with qprof (PR_SET_PDEATHSIG),
every program, link and map is a file descriptor of it and vanishes with it
(nothing pinned), it prints a readiness line once its probes are live, and it
prints its measurements every second as JSON lines, so an interrupted run keeps
the last complete snapshot.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import gc
import hashlib
import importlib
import json
import mmap
import os
import platform
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Iterable, Protocol, TextIO

from qprof.cachefiles import CACHE_HOME
from qprof.probes import btf
from qprof.probes.children import ProbeProcess, die_with_parent
from qprof.probes.features import version_output
from qprof.probes.fields import NEVER_NULL
from qprof.probes.group import Unavailable

CACHE = CACHE_HOME / "bpf"
VMLINUX_BTF = Path(btf.VMLINUX_BTF)
READY = "qprof-ready"
_ARCH = {"x86_64": "x86", "aarch64": "arm64", "ppc64le": "powerpc", "s390x": "s390", "riscv64": "riscv"}


def source_text(package: str, name: str) -> bytes:
    """A group's C source, shipped in its package (e.g. qprof.probes.packetio, packetio)."""
    return resources.files(package).joinpath(f"{name}.bpf.c").read_bytes()


def build(package: str, name: str, cache: Path = CACHE) -> Path:
    """The compiled object of <package>/<name>.bpf.c for this kernel; compiled on first use (~3 s)."""
    clang, bpftool = shutil.which("clang"), shutil.which("bpftool")
    if clang is None:
        raise Unavailable("clang not found, needed to compile the probes once (Debian: apt-get install clang)")
    if bpftool is None:
        raise Unavailable("bpftool not found, needed for the kernel's types (Debian: apt-get install bpftool)")
    if not VMLINUX_BTF.exists():
        raise Unavailable(f"the kernel exposes no BTF at {VMLINUX_BTF} (needs CONFIG_DEBUG_INFO_BTF)")
    src = source_text(package, name)
    clang_version = version_output(clang).split("\n")[0]
    key = hashlib.sha256(src + clang_version.encode() + btf.digest().encode()).hexdigest()[:16]
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
    try:  # by its soname first: find_library runs ldconfig (a process) to find what this names
        lib = ctypes.CDLL("libbpf.so.1", use_errno=True)
    except OSError:
        try:
            lib = ctypes.CDLL(ctypes.util.find_library("bpf") or "libbpf.so", use_errno=True)
        except OSError as e:
            raise Unavailable(f"libbpf not found ({e}; Debian: apt-get install libbpf1)") from None
    vp, cp, i, sz = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_size_t
    for fn, res, args in (
            ("bpf_object__open_file", vp, [cp, vp]), ("bpf_object__load", i, [vp]),
            ("bpf_object__next_program", vp, [vp, vp]), ("bpf_object__next_map", vp, [vp, vp]),
            ("bpf_program__attach", vp, [vp]), ("bpf_program__name", cp, [vp]),
            ("bpf_program__set_autoload", i, [vp, ctypes.c_bool]), ("bpf_link__destroy", i, [vp]),
            ("bpf_program__fd", i, [vp]), ("bpf_prog_test_run_opts", i, [i, vp]),
            ("bpf_map__name", cp, [vp]), ("bpf_map__fd", i, [vp]),
            ("bpf_map__key_size", ctypes.c_uint32, [vp]), ("bpf_map__value_size", ctypes.c_uint32, [vp]),
            ("bpf_map__type", i, [vp]), ("bpf_map__set_initial_value", i, [vp, vp, sz]),
            ("bpf_map__initial_value", vp, [vp, ctypes.POINTER(sz)]),
            ("bpf_map_get_next_key", i, [i, vp, vp]), ("bpf_map_lookup_elem", i, [i, vp, vp]),
            ("bpf_map_update_elem", i, [i, vp, vp, ctypes.c_uint64]),
            ("libbpf_num_possible_cpus", i, []), ("libbpf_get_error", ctypes.c_long, [vp])):
        f = getattr(lib, fn)
        f.restype, f.argtypes = res, args
    return lib


class _TestRunOpts(ctypes.Structure):
    """libbpf's struct bpf_test_run_opts (1.1)."""

    _fields_ = [("sz", ctypes.c_size_t), ("data_in", ctypes.c_void_p), ("data_out", ctypes.c_void_p),
                ("data_size_in", ctypes.c_uint32), ("data_size_out", ctypes.c_uint32),
                ("ctx_in", ctypes.c_void_p), ("ctx_out", ctypes.c_void_p),
                ("ctx_size_in", ctypes.c_uint32), ("ctx_size_out", ctypes.c_uint32),
                ("retval", ctypes.c_uint32), ("repeat", ctypes.c_int), ("duration", ctypes.c_uint32),
                ("flags", ctypes.c_uint32), ("cpu", ctypes.c_uint32), ("batch_size", ctypes.c_uint32)]


_PERCPU = {5, 6, 10, 21}  # PERCPU_HASH, PERCPU_ARRAY, LRU_PERCPU_HASH, PERCPU_CGROUP_STORAGE


@dataclass
class Map:
    name: str
    fd: int
    key_size: int
    value_size: int
    percpu: bool

    @property
    def slot(self) -> int:
        """Bytes one CPU's value takes in a lookup's buffer (the kernel aligns a per-CPU map's to 8)."""
        return (self.value_size + 7) // 8 * 8 if self.percpu else self.value_size


class Loaded:
    """A loaded object: its programs attached and detached by name, its maps readable, its
    global data writable in place (libbpf mmaps .bss and .data once loaded).

    Programs, links and maps are file descriptors of this process: they vanish with it."""

    def __init__(self, obj_path: Path, rodata: bytes | None = None, skip: tuple[str, ...] = ()) -> None:
        """`rodata`: the whole .rodata section to load with (read-only: the verifier sees its
        values as constants); `skip`: programs not to load (e.g. for another kernel version)."""
        self.lib = lib = _libbpf()
        self.obj = lib.bpf_object__open_file(str(obj_path).encode(), None)
        if not self.obj or lib.libbpf_get_error(self.obj):
            raise Unavailable(f"libbpf could not open {obj_path}")
        self.maps: dict[str, Map] = {}
        self._handles: dict[str, int] = {}
        m = lib.bpf_object__next_map(self.obj, None)
        while m:
            name = lib.bpf_map__name(m).decode()
            if name.endswith(".rodata") and rodata:
                buf = ctypes.create_string_buffer(rodata, len(rodata))
                if lib.bpf_map__set_initial_value(m, buf, len(rodata)) != 0:
                    raise Unavailable(f"the program's read-only data is not {len(rodata)} bytes: rebuild it")
            self.maps[name] = Map(name, -1, lib.bpf_map__key_size(m), lib.bpf_map__value_size(m),
                                  lib.bpf_map__type(m) in _PERCPU)
            self._handles[name] = m
            m = lib.bpf_object__next_map(self.obj, m)
        self.programs: dict[str, int] = {}
        p = lib.bpf_object__next_program(self.obj, None)
        while p:
            name = lib.bpf_program__name(p).decode()
            if name in skip:
                lib.bpf_program__set_autoload(p, False)
            else:
                self.programs[name] = p
            p = lib.bpf_object__next_program(self.obj, p)
        if lib.bpf_object__load(self.obj) != 0:
            raise Unavailable(f"the kernel refused to load {obj_path.name}: "
                              f"{os.strerror(ctypes.get_errno() or 1)} (details in the probe log)")
        for name, handle in self._handles.items():
            self.maps[name].fd = lib.bpf_map__fd(handle)
        self.links: dict[str, int] = {}
        self._mapped: list[mmap.mmap] = []
        self.ncpus = max(1, lib.libbpf_num_possible_cpus())
        self._summed: dict[str, tuple[int, Any, Any, int, struct.Struct]] = {}
        self._batch: dict[tuple[str, int], tuple[Any, Any, Any, Any]] = {}  # (map, chunk) -> its buffers
        self._no_batch: set[str] = set()  # maps the kernel refused a batch lookup of (their kind has none)

    def attach(self, names: Iterable[str]) -> None:
        """Attach these programs (those attached already stay as they are)."""
        for name in names:
            if name in self.links:
                continue
            link = self.lib.bpf_program__attach(self.programs[name])
            if not link or self.lib.libbpf_get_error(link):
                raise Unavailable(f"could not attach {name}: {os.strerror(ctypes.get_errno() or 1)}")
            self.links[name] = link

    def detach(self, names: Iterable[str]) -> None:
        for name in names:
            link = self.links.pop(name, None)
            if link:
                self.lib.bpf_link__destroy(link)

    def global_data(self, section: str) -> mmap.mmap:
        """A global data section as the programs see it (.bss, .data), mapped into this process:
        writes there reach running programs at once. (libbpf 1.1 maps it for skeletons only.)"""
        for name, m in self.maps.items():
            if name.endswith(section):
                size = (m.value_size + mmap.PAGESIZE - 1) // mmap.PAGESIZE * mmap.PAGESIZE
                try:
                    mem = mmap.mmap(m.fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
                except OSError as e:
                    raise Unavailable(f"the kernel did not map the program's {section} section: {e}") from None
                self._mapped.append(mem)
                return mem
        raise Unavailable(f"the program has no {section} section")

    def update(self, name: str, key: bytes, value: bytes) -> None:
        m = self.maps[name]
        k, v = ctypes.create_string_buffer(key, m.key_size), ctypes.create_string_buffer(value, m.value_size)
        if self.lib.bpf_map_update_elem(m.fd, k, v, 0) != 0:
            raise Unavailable(f"could not set an entry of map {name}: {os.strerror(ctypes.get_errno() or 1)}")

    def push(self, name: str, value: bytes) -> None:
        """Push onto a queue map (no key)."""
        m = self.maps[name]
        v = ctypes.create_string_buffer(value, m.value_size)
        if self.lib.bpf_map_update_elem(m.fd, None, v, 0) != 0:
            raise Unavailable(f"could not push onto map {name}: {os.strerror(ctypes.get_errno() or 1)}")

    def call(self, name: str, ctx: bytes) -> bytes:
        """Run a loaded SEC("syscall") program once on `ctx` (BPF_PROG_RUN) and return the context as
        it left it: how the loader changes the programs' state with the programs' own atomic operations,
        which Python has none of."""
        buf = ctypes.create_string_buffer(ctx, len(ctx))
        opts = _TestRunOpts(sz=ctypes.sizeof(_TestRunOpts), ctx_in=ctypes.cast(buf, ctypes.c_void_p),
                            ctx_size_in=len(ctx))
        fd = self.lib.bpf_program__fd(self.programs[name])
        if self.lib.bpf_prog_test_run_opts(fd, ctypes.byref(opts)) != 0:
            raise Unavailable(f"could not run {name}: {os.strerror(ctypes.get_errno() or 1)}")
        return buf.raw

    def summed_u64s(self, name: str, key: int = 0) -> list[int]:
        """Entry `key` of a per-CPU array whose value is u64 fields, summed over the CPUs: one
        lookup into buffers kept from the last call (~10 us), for counters polled often."""
        fast = self._summed.get(name)
        if fast is None:
            m = self.maps[name]
            if not m.percpu or m.value_size % 8 or m.key_size != 4:
                raise ValueError(f"{name} is not a per-CPU array of u64 fields")
            per = m.slot
            fast = self._summed[name] = (m.fd, ctypes.create_string_buffer(struct.pack("<I", key), 4),
                                         ctypes.create_string_buffer(per * self.ncpus), per,
                                         struct.Struct(f"<{m.value_size // 8}Q"))
        fd, k, val, per, fields = fast
        totals = [0] * (fields.size // 8)
        if self.lib.bpf_map_lookup_elem(fd, k, val) != 0:
            return totals
        raw = val.raw
        for cpu in range(self.ncpus):
            for i, v in enumerate(fields.unpack_from(raw, cpu * per)):
                totals[i] += v
        return totals

    def batch(self, name: str, chunk: int = 1024) -> tuple[int, bytes, bytes] | None:
        """Every entry of a map in a few BPF_MAP_LOOKUP_BATCH calls: (count, keys packed at key_size,
        values packed at value_size, or for a per-CPU map at each CPU's 8-byte-aligned slot times the
        CPUs), for a map read often (one system call per `chunk` entries where a walk makes two per
        entry). None where the kernel or libbpf lacks it (the caller walks the map). Buffers are kept
        from the last call."""
        m = self.maps[name]
        if name in self._no_batch:
            return None
        stride = m.slot * (self.ncpus if m.percpu else 1)
        fast = self._batch.get((name, chunk))
        if fast is None:
            try:
                fn = self.lib.bpf_map_lookup_batch
            except AttributeError:
                self._no_batch.add(name)
                return None
            fn.restype = ctypes.c_int
            fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                           ctypes.POINTER(ctypes.c_uint32), ctypes.c_void_p]
            fast = self._batch[name, chunk] = (ctypes.create_string_buffer(max(8, m.key_size)),
                                        ctypes.create_string_buffer(max(8, m.key_size)),
                                        ctypes.create_string_buffer(m.key_size * chunk),
                                        ctypes.create_string_buffer(stride * chunk))
        token_in, token_out, keys, values = fast
        fn = self.lib.bpf_map_lookup_batch
        got_keys, got_values, total = [], [], 0
        first = True
        while True:
            count = ctypes.c_uint32(chunk)
            rc = fn(m.fd, None if first else token_in, token_out, keys, values, ctypes.byref(count), None)
            err = ctypes.get_errno() if rc != 0 else 0
            if rc != 0 and err != errno.ENOENT:
                if err != errno.ENOSPC:  # unsupported here (EINVAL, ENOTSUPP): not asked again
                    self._no_batch.add(name)
                return None  # or a bucket larger than `chunk` (ENOSPC)
            n = count.value
            if n:  # only what the call filled: `.raw` copies the whole buffer (~200 KiB, fresh pages each time)
                got_keys.append(ctypes.string_at(keys, n * m.key_size))
                got_values.append(ctypes.string_at(values, n * stride))
                total += n
            if rc != 0:  # ENOENT: that was the last of them
                return total, b"".join(got_keys), b"".join(got_values)
            ctypes.memmove(token_in, token_out, len(token_out))
            first = False

    def entries(self, name: str) -> list[tuple[bytes, list[bytes]]]:
        """(key, [value per CPU]) of every entry (one value for a shared map): by batch where it works,
        else by a walk of two system calls per entry."""
        m = self.maps[name]
        per, n = m.slot, self.ncpus if m.percpu else 1
        got = self.batch(name)
        if got is not None:
            count, keys, values = got
            ks, stride = m.key_size, per * n
            return [(keys[i * ks:(i + 1) * ks],
                     [values[i * stride + c * per:i * stride + c * per + m.value_size] for c in range(n)])
                    for i in range(count)]
        lib = self.lib
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


@dataclass(frozen=True)
class LoaderConfig:
    """What a libbpf group's loader is started with (probes/<group>/__init__.py `config`): handed to the
    child as JSON, and recorded in probes.json as its program's `config` (there without the files the
    loader writes beside its stream, which the program's record names itself)."""

    pids: list[int] = field(default_factory=list)
    follow: bool | None = field(default=None, metadata=NEVER_NULL)
    added: str | None = field(default=None, metadata=NEVER_NULL)  # the file of targets added while following
    gro_bit: int | None = field(default=None, metadata=NEVER_NULL)  # packetio
    kfree_skb_has_socket: bool | None = field(default=None, metadata=NEVER_NULL)
    netns: list[int] | None = field(default=None, metadata=NEVER_NULL)
    stack_interval_ms: float | None = field(default=None, metadata=NEVER_NULL)  # waits
    preempt_from_rq: int | None = field(default=None, metadata=NEVER_NULL)
    series: str | None = field(default=None, metadata=NEVER_NULL)  # waits: the series file it appends to
    timing: str | None = field(default=None, metadata=NEVER_NULL)  # packetio: the messages' timing file
    kallsyms: str | None = field(default=None, metadata=NEVER_NULL)  # waits: the kernel's symbols (probes.kallsyms)

    def to_argv(self) -> str:
        """The JSON the child is given: the fields set (None is absent, as in probes.json)."""
        return json.dumps({k: v for k, v in asdict(self).items() if v is not None})

    @classmethod
    def from_argv(cls, text: str) -> "LoaderConfig":
        """The config `to_argv` wrote, from the parent of this same qprof: its keys are this record's
        fields (ValueError otherwise)."""
        doc = json.loads(text)
        if not isinstance(doc, dict):
            raise ValueError("not an object")
        try:
            config = cls(**doc)
        except TypeError as e:  # a key it does not know
            raise ValueError(str(e)) from None
        if not isinstance(config.pids, list):
            raise ValueError("pids is not a list")
        return config


class LibbpfProcess(ProbeProcess):
    """A probe group's loader (MODULE's main(OBJECT, CONFIG_JSON), forked or `python -m`) writing JSON
    lines to `output`: it loads and attaches, prints READY once its probes are live, then its
    measurements every second and a last time on SIGINT/SIGTERM."""

    def __init__(self, name: str, module: str, obj: Path, config: LoaderConfig, output: Path,
                 log: Path) -> None:
        super().__init__(name, output, log)
        self.module, self.obj, self.config = module, obj, config

    def spawn(self) -> None:
        """Forked from qprof (fork_child) where it can be, else `python -m MODULE` as a fresh process."""
        argv = [str(self.obj), self.config.to_argv()]
        preexec = die_with_parent(signal.SIGTERM)
        module = self.module

        def run() -> int:
            main: Callable[[list[str]], int] = importlib.import_module(module).main
            return main(argv)

        self._start([sys.executable, "-m", module, *argv], preexec, run=run)


# ---------------------------------------------------------------- a group's loader child

@dataclass
class Stop:
    """Set by SIGINT/SIGTERM (also while loading: qprof may die before the probes are live)."""

    requested: bool = False

    def sleep_until(self, t: float, wake: int) -> None:
        """Sleep to monotonic time `t`, or until a stop: a signal writes to the pipe `wake`."""
        while not self.requested:
            left = t - time.monotonic()
            if left <= 0:
                return
            select.select([wake], [], [], left)
            try:
                os.read(wake, 4096)
            except BlockingIOError:
                pass


class Runner(Protocol):
    def run(self, wake: int) -> None:
        """Run until stopped; `wake` is a pipe a signal writes to, to end a wait at once."""


def loader_main(argv: list[str], module: str, make: Callable[[Path, LoaderConfig, TextIO, Stop], Runner],
                errors: tuple[type[Exception], ...] = ()) -> int:
    """The entry of a group's loader (main(OBJECT, CONFIG_JSON), forked or `python -m MODULE`): the config
    checked, SIGINT and SIGTERM turned into a stop and a wake-up, the loader made and run; exit 2 on bad
    arguments, 1 with one `qprof: error:` line when the group cannot run (Unavailable, OSError, ValueError
    and `errors`)."""
    if len(argv) != 2:
        print(f"usage: python -m {module} OBJECT CONFIG_JSON", file=sys.stderr)
        return 2
    try:
        config = LoaderConfig.from_argv(argv[1])
    except ValueError:
        print('qprof: error: CONFIG_JSON is not {"pids": [...], ...}', file=sys.stderr)
        return 2
    r, w = os.pipe()
    os.set_blocking(r, False)
    os.set_blocking(w, False)
    signal.set_wakeup_fd(w)
    stop = Stop()

    def on_signal(_s: int, _f: object) -> None:
        stop.requested = True

    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, on_signal)
    caught: tuple[type[BaseException], ...] = (Unavailable, OSError, ValueError, *errors)
    try:
        runner = make(Path(argv[0]), config, sys.stdout, stop)
        if not stop.requested:
            # what loading made lives to the end: the collector need not walk it again (it was up
            # to 15% of the packetio loader's CPU during a transfer)
            gc.collect()
            gc.freeze()
            runner.run(r)
    except caught as e:
        print(f"qprof: error: {e}", file=sys.stderr, flush=True)
        return 1
    return 0
