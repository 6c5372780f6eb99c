"""Records that cross from collection to analysis: both sides import them from here, the layer
between them (collectors write, attribution and viewer read), never from the collectors themselves.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class LiveData:
    """What the session knows about the targets this second, raw, for a live view (attribution.live)."""

    elapsed_s: float
    duration_s: float | None
    reading: dict[str, Any]  # the latest procfs.reading of the targets
    maps: dict[str, Any]  # the probe groups' maps as last printed (bpftrace JSON shape)
    softirq_seconds: dict[str, float]  # per CPU since boot (/proc/stat)
    targets: list[dict[str, Any]]  # meta.json's targets
