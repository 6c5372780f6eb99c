"""Kernel type facts from BTF (/sys/kernel/btf/vmlinux), read through bpftool.

Probe scripts must fit the running kernel: tracepoint fields and enum values
(e.g. skb_drop_reason numbers) differ across kernel versions. Reading them
from BTF, not from a table in qprof, keeps them right on kernels qprof has
never seen.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from functools import lru_cache

VMLINUX_BTF = "/sys/kernel/btf/vmlinux"
_TYPE = re.compile(r"^\[(\d+)\] (\w+) '([^']*)'")
_MEMBER = re.compile(r"^\t'([^']*)' (?:type_id=\d+ )?(?:bits_offset|val)=(-?\d+)")


class BTFUnavailable(Exception):
    pass


@lru_cache(maxsize=1)
def _dump() -> dict[tuple[str, str], list[tuple[str, int]]]:
    """(kind, name) -> members (name, value or bit offset) for every struct and enum;
    all anonymous enums are merged under ("ENUM", "(anon)") (C enumerators are unique)."""
    bpftool = shutil.which("bpftool")
    if bpftool is None:
        raise BTFUnavailable("bpftool not found (Debian: apt-get install bpftool)")
    try:
        out = subprocess.run([bpftool, "btf", "dump", "file", VMLINUX_BTF, "format", "raw"],
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
        raise BTFUnavailable(f"bpftool failed: {e}") from None
    if out.returncode != 0:
        raise BTFUnavailable(f"no kernel BTF at {VMLINUX_BTF}: {out.stderr.strip()[:200]}")
    types: dict[tuple[str, str], list[tuple[str, int]]] = {}
    current: list[tuple[str, int]] | None = None
    for line in out.stdout.splitlines():
        if line.startswith("["):
            m = _TYPE.match(line)
            current = None
            if m and m.group(3) and m.group(2) in ("STRUCT", "UNION", "ENUM", "ENUM64"):
                current = types.setdefault((m.group(2).replace("ENUM64", "ENUM"), m.group(3)), [])
            elif m and m.group(2) == "TYPEDEF" and m.group(3).startswith("btf_trace_"):
                types[("TRACEPOINT", m.group(3).removeprefix("btf_trace_"))] = []
        elif current is not None:
            m = _MEMBER.match(line)
            if m:
                current.append((m.group(1), int(m.group(2))))
    return types


def enum(name: str) -> dict[str, int]:
    """Enumerator -> value, e.g. enum('skb_drop_reason')['SKB_DROP_REASON_SOCKET_RCVBUFF']."""
    return dict(_dump().get(("ENUM", name), []))


def enumerator(name: str) -> int | None:
    """Value of one enumerator, whichever enum (named or anonymous) declares it."""
    for (kind, _), members in _dump().items():
        if kind == "ENUM":
            for m, v in members:
                if m == name:
                    return v
    return None


def struct_fields(name: str) -> set[str]:
    return {m for m, _ in _dump().get(("STRUCT", name), [])}


def tracepoint_exists(event: str) -> bool:
    """Every tracepoint has a `btf_trace_<event>` typedef in BTF."""
    return ("TRACEPOINT", event) in _dump()


def tracepoint_fields(event_class: str) -> set[str]:
    """Record fields of a tracepoint *class* (an event defined with DEFINE_EVENT uses its class's)."""
    return struct_fields(f"trace_event_raw_{event_class}")
