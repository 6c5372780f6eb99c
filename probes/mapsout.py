"""The probes' shared output format: JSON lines of maps, as bpftrace 0.17 prints them.

Probe children (bpftrace and probes/libbpf.py alike) print their maps every
second: {"type": "map", "data": {"@name": {"k1,k2": v}}} for counters and
"hist" entries as lists of {min, max, count}; an empty map may be printed as
{} or not at all. The last value printed for each map wins. On long runs the
stream is compacted (children.ProbeProcess.compact): the last value of every
map goes to probe-<group>.last.json and the stream starts again empty.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

from qprof.errors import QprofError
from qprof.readlimits import lines, open_regular


def last_path(output: Path) -> Path:
    """Where compaction keeps the last value of every map: probe-<group>.last.json."""
    return output.with_name(output.name.removesuffix(".jsonl") + ".last.json")


def _read_lines(stream: Iterable[str | bytes], maps: dict[str, Any]) -> None:
    for line in stream:
        try:
            obj = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
            continue
        if isinstance(obj, dict) and obj.get("type") in ("map", "hist", "stats") and \
                isinstance(obj.get("data"), dict):
            maps.update(obj["data"])


def read_maps(output: Path) -> dict[str, Any]:
    """The last value printed for each map: what compaction kept, then the stream (a line cut
    off by a kill does not parse and is ignored)."""
    maps: dict[str, Any] = {}
    for path in (last_path(output), output):
        try:
            f = open_regular(path)
        except (OSError, QprofError):
            continue
        with f:
            _read_lines(lines(f, path), maps)
    return maps


class MapTail:
    """Follow a probe output file while it is written: each `read()` parses only complete lines
    added since the last one. A compacted (shorter) file is read again from its start; what it
    held before is in `maps` already."""

    def __init__(self, output: Path) -> None:
        self.output = output
        self.maps: dict[str, Any] = {}
        self._offset = 0

    def read(self) -> dict[str, Any]:
        try:
            f = open(self.output, "rb")
        except OSError:
            return self.maps
        with f:
            size = f.seek(0, 2)
            if size < self._offset:
                self._offset = 0
            f.seek(self._offset)
            chunk = f.read()
        end = chunk.rfind(b"\n") + 1
        self._offset += end
        _read_lines(chunk[:end].splitlines(), self.maps)
        return self.maps
