"""The probes' shared output format: JSON lines of maps, as bpftrace 0.17 prints them.

Probe children (bpftrace and probes/libbpf.py alike) print their maps every
second: {"type": "map", "data": {"@name": {"k1,k2": v}}} for counters and
"hist" entries as lists of {min, max, count}; an empty map may be printed as
{} or not at all. The last value printed for each map wins. On long runs the
stream is compacted (MapTail.compact): the last value of every
map goes to probe-<group>.last.json and the stream starts again empty.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable, Mapping, TypedDict

from qprof.errors import QprofError
from qprof.jsonvalue import Json
from qprof.readlimits import lines, open_regular


class HistBucket(TypedDict, total=False):
    """One bucket of a histogram map, as bpftrace prints it."""

    min: int | float | None
    max: int | float | None
    count: int | float


# A map entry's value: a count or sum, a histogram, or (a map printed per key) a map of them
MapEntry = int | float | list[HistBucket] | dict[str, int | float | list[HistBucket]]
# A map as a loader prints it, once its shape is checked (archive.schema.probe_maps): its keys are the
# program's own text ("pid,tid,port"), whose meaning is the group's own (probes/<group>/maps.py reads them)
RawMap = dict[str, MapEntry]


def raw_map(maps: Mapping[str, RawMap | object], name: str) -> RawMap:
    """A group's raw map by name from its checked maps; {} when its program printed none (a map it
    prints only once it holds something) or the name is of a typed one (packetio's `@windows`)."""
    m = maps.get(name)
    return m if isinstance(m, dict) else {}


def last_path(output: Path) -> Path:
    """Where compaction keeps the last value of every map: probe-<group>.last.json."""
    return output.with_name(output.name.removesuffix(".jsonl") + ".last.json")


def _read_lines(stream: Iterable[str | bytes], maps: dict[str, Json]) -> None:
    for line in stream:
        try:
            obj: Json = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
            continue
        match obj:  # a print of maps; other lines (READY, a loader's notes) are not
            case {"type": "map" | "hist" | "stats", "data": dict() as data}:
                maps.update(data)


def read_maps(output: Path) -> dict[str, Json]:
    """The last value printed for each map, as printed (its shape is checked where it is read: the
    collector's archive.schema.probe_maps): what compaction kept, then the stream (a line cut off by
    a kill does not parse and is ignored)."""
    maps: dict[str, Json] = {}
    for path in (last_path(output), output):
        _read_file(path, maps)
    return maps


def _read_file(path: Path, maps: dict[str, Json]) -> None:
    """A file's prints into `maps`; one that is absent or not a regular file adds none."""
    try:
        f = open_regular(path)
    except (OSError, QprofError):
        return
    with f:
        _read_lines(lines(f, path), maps)


class MapTail:
    """Follow a probe output file while it is written: each `read()` parses only complete lines
    added since the last one. A compacted (shorter) file is read again from its start; what it
    held before is in `maps` already."""

    def __init__(self, output: Path) -> None:
        self.output = output
        self.maps: dict[str, Json] = {}
        self._offset = 0
        _read_file(last_path(output), self.maps)  # what a compaction kept before this tail was made

    def compact(self) -> None:
        """Keep the streamed output small on long runs (the maps are printed in full every second):
        the last value of every map goes to last_path(output) atomically, then the stream starts
        again empty; a print cut by the truncation is superseded a second later. The maps are this
        tail's: a stream parsed again whole at each compaction was ~10 ms of the collector's CPU."""
        maps = self.read()
        if not maps:
            return
        last = last_path(self.output)
        tmp = last.with_name(last.name + ".tmp")
        tmp.write_text(json.dumps({"type": "map", "data": maps}) + "\n", encoding="utf-8")
        tmp.replace(last)
        os.truncate(self.output, 0)
        self._offset = 0

    def read(self) -> dict[str, Json]:
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
