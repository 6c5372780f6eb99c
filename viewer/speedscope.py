"""A flame graph's tree as a speedscope file (https://www.speedscope.app/file-format-schema.json).

One "sampled" profile per process (or the one thread selected), frames in one
shared table (name and object), each distinct stack once, root first, weighted
by its sample count: the weights of a profile add up to the samples the run
holds for that process, as `qprof report` counts them. Categories have no
place in the format; open the SVG or HTML flame graph for those.
"""

from __future__ import annotations

import json

from qprof.jsonvalue import JsonObject
from qprof.version import __version__
from qprof.viewer.flametree import Flame, FrameNode

SCHEMA = "https://www.speedscope.app/file-format-schema.json"
NO_STACK = "[no stack]"


def _profile(proc: FrameNode, frame_index: dict[tuple[str, str], int], frames: list[dict[str, str]]) -> JsonObject:
    samples: list[list[int]] = []
    weights: list[int] = []
    path: list[int] = []
    stack: list[tuple[FrameNode, int]] = [(c, 0) for c in reversed(proc.sorted_children())]

    def index(name: str, dso: str) -> int:
        idx = frame_index.get((name, dso))
        if idx is None:
            idx = frame_index[(name, dso)] = len(frames)
            frames.append({"name": name, "file": dso} if dso else {"name": name})
        return idx

    if proc.self_samples:  # samples perf could not unwind at all: the report's "[no stack]"
        samples.append([index(NO_STACK, "")])
        weights.append(proc.self_samples)
    while stack:
        node, depth = stack.pop()
        del path[depth:]
        path.append(index(node.name, node.dso))
        if node.self_samples:
            samples.append(list(path))
            weights.append(node.self_samples)
        stack.extend((c, depth + 1) for c in reversed(node.sorted_children()))
    return {"type": "sampled", "name": proc.name, "unit": "none", "startValue": 0, "endValue": sum(weights),
            "samples": samples, "weights": weights}


def speedscope_doc(flame: Flame) -> JsonObject:
    frames: list[dict[str, str]] = []
    index: dict[tuple[str, str], int] = {}
    profiles = [_profile(p, index, frames) for p in flame.root.sorted_children()]
    return {"$schema": SCHEMA, "shared": {"frames": frames}, "profiles": profiles, "name": flame.title,
            "activeProfileIndex": 0, "exporter": f"qprof {__version__}"}


def speedscope_json(flame: Flame) -> str:
    return json.dumps(speedscope_doc(flame), separators=(",", ":")) + "\n"
