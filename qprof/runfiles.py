"""The names of a run directory's files, in one place: collectors and probes write them, the archive
reader and the commands read them (archive describes what each holds).

A leaf module (no qprof imports), so every layer may use it without importing another layer.
"""

from __future__ import annotations

import re
from pathlib import Path

META = "meta.json"
STACKS = "stacks.jsonl.gz"
PROC = "proc.jsonl"
PROBES = "probes.json"
TCP = "tcp.json"
PERF_MAPS = "perf-maps"  # copies of the targets' /tmp/perf-PID.map (JIT symbols)
FUNCTIONS = "functions.json"  # where the sampled functions start in their objects (collectors.functions)
MAPPED_FILES = "mapped-files.json"  # build-ids of mapped files perf reads from qprof's cache (collectors.mapfiles)
RESERVE = ".space-reserve"  # room kept for the last meta.json write when the disk fills up

# perf --switch-output names a finished chunk <perf data>.YYYYmmddHHMMSScc (collectors.chunks)
_CHUNK_SUFFIX = re.compile(r"^\.\d{8,}$")


def perf_data(unwind: str) -> str:
    """The raw perf data of one unwinding mode (and the prefix of its chunks)."""
    return f"perf-{unwind}.data"


def perf_log(unwind: str) -> str:
    """perf's own messages for one unwinding mode."""
    return f"perf-{unwind}.log"


def probe_file(group: str, suffix: str) -> str:
    """A probe group's files: its program (bt, bpf.c), raw output (jsonl) and messages (log)."""
    return f"probe-{group}.{suffix}"


def record_output(label: str) -> str:
    """What a process `qprof record` started printed (stdout and stderr)."""
    return f"output-{label}.log"


def chunk_files(out: Path, perf_data_name: str, include_current: bool) -> list[Path]:
    """A group's finished chunks in time order; with `include_current`, also the file perf writes
    into (after perf exited it is complete too, and a run recorded in one piece has only that)."""
    found = sorted(p for p in out.glob(perf_data_name + ".*") if _CHUNK_SUFFIX.match(p.name[len(perf_data_name):]))
    base = out / perf_data_name
    if include_current and base.is_file() and base.stat().st_size > 0:
        found.append(base)
    return found
