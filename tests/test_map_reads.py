"""The loaders' map reads: a batch lookup gives what a walk of the map gives, for every kind of map the
probes read (hash and array, shared and per-CPU), in one chunk and in many, empty and full."""

from __future__ import annotations

import ctypes
import os
import shutil
import struct
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

from qprof.probes.libbpf import Loaded

MAPS = ("hash", "pcpu_hash", "array", "pcpu_array")
ENTRIES = 300

# libbpf's map definition macros (bpf_helpers.h) spelled out: no kernel headers needed
SOURCE = f"""
#define SEC(name) __attribute__((section(name), used))
#define __uint(name, val) int (*name)[val]
#define __type(name, val) typeof(val) *name
typedef unsigned int __u32;
enum {{ BPF_MAP_TYPE_HASH = 1, BPF_MAP_TYPE_ARRAY = 2, BPF_MAP_TYPE_PERCPU_HASH = 5, BPF_MAP_TYPE_PERCPU_ARRAY = 6 }};
struct value {{ __u32 a, b, c; }};  /* 12 bytes: a per-CPU slot is padded to 16 */
struct {{ __uint(type, BPF_MAP_TYPE_HASH); __uint(max_entries, {ENTRIES}); __type(key, __u32);
         __type(value, struct value); }} hash SEC(".maps");
struct {{ __uint(type, BPF_MAP_TYPE_PERCPU_HASH); __uint(max_entries, {ENTRIES}); __type(key, __u32);
         __type(value, struct value); }} pcpu_hash SEC(".maps");
struct {{ __uint(type, BPF_MAP_TYPE_ARRAY); __uint(max_entries, {ENTRIES}); __type(key, __u32);
         __type(value, struct value); }} array SEC(".maps");
struct {{ __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY); __uint(max_entries, {ENTRIES}); __type(key, __u32);
         __type(value, struct value); }} pcpu_array SEC(".maps");
char LICENSE[] SEC("license") = "GPL";
"""


@pytest.fixture(scope="module")
def maps(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Loaded]:
    if os.geteuid() != 0:
        pytest.skip("loading BPF maps needs root")
    clang = shutil.which("clang")
    if clang is None:
        pytest.skip("clang is not installed (make test installs it)")
    d = tmp_path_factory.mktemp("maps")
    (d / "maps.bpf.c").write_text(SOURCE)
    r = subprocess.run([clang, "-O2", "-g", "-target", "bpf", "-c", str(d / "maps.bpf.c"), "-o", str(d / "maps.o")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    yield Loaded(Path(d / "maps.o"))


def _fill(prog: Loaded, name: str, count: int) -> None:
    """`count` entries (keys 0..count-1), each CPU's value its own; the rest of a hash emptied."""
    m = prog.maps[name]
    cpus = prog.ncpus if m.percpu else 1
    slot = 16 if m.percpu else m.value_size
    for k in range(ENTRIES):
        key = ctypes.create_string_buffer(struct.pack("<I", k), 4)
        if k >= count and name.endswith("hash"):
            prog.lib.bpf_map_delete_elem(m.fd, key)
            continue
        value = b"".join(struct.pack("<III", (k + 1) * 1000 + c if k < count else 0, k ^ c, c).ljust(slot, b"\0")
                         for c in range(cpus))
        buf = ctypes.create_string_buffer(value, len(value))
        assert prog.lib.bpf_map_update_elem(m.fd, key, buf, 0) == 0


def _walked(prog: Loaded, name: str) -> list[tuple[bytes, list[bytes]]]:
    """The entries by the walk (get-next-key and lookup), as where the kernel has no batch lookup."""
    prog._no_batch.add(name)
    try:
        return prog.entries(name)
    finally:
        prog._no_batch.discard(name)


@pytest.mark.root
@pytest.mark.parametrize("count", [0, 1, 37, ENTRIES])
@pytest.mark.parametrize("name", MAPS)
def test_batch_reads_equal_the_walk(maps: Loaded, name: str, count: int) -> None:
    _fill(maps, name, count)
    walked = sorted(_walked(maps, name))
    if name.endswith("hash"):
        assert len(walked) == count
    else:
        assert len(walked) == ENTRIES  # an array has all its entries
    assert sorted(maps.entries(name)) == walked
    assert name not in maps._no_batch  # the batch lookup was taken, not the walk again
    got = maps.batch(name, chunk=7)  # many calls, each a part of the map
    assert got is not None
    n, keys, values = got
    stride = len(values) // n if n else 0
    per = stride // maps.ncpus if maps.maps[name].percpu else stride
    size = maps.maps[name].value_size
    assert sorted((keys[i * 4:i * 4 + 4], [values[i * stride + c * per:i * stride + c * per + size]
                                           for c in range(stride // per if per else 0)])
                  for i in range(n)) == walked
