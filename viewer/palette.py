"""Category colours, one hue family each, shared by every view (terminal, flame graphs, diffs).

A flame graph has hundreds of frames of one category; one flat colour per
category would melt neighbouring frames into one block, so each frame gets a
shade of its category's family picked by a stable hash of its name (the same
function is the same shade in every graph and run, which makes two graphs
comparable side by side). The terminal's colours are the same families.

The off-CPU flame graph (viewer.offcpu) colours by where the wall time went
instead: on a CPU, runnable, or waiting for the network, a timer, another
thread, the disk, something else (attribution.waits' states): one family each
in WAIT_FAMILIES, the network's blue and the disk's purple those of Packet I/O
and I/O.
"""

from __future__ import annotations

import colorsys
import zlib
from dataclasses import dataclass

from qprof.attribution.categories import CATEGORIES, CONNECTION, CRYPTO, IO, PACKET_IO, UNCATEGORIZED
from qprof.attribution.waits import STATES


@dataclass(frozen=True)
class Family:
    """A hue family in HLS: hue range (degrees), saturation, lightness range; `terminal` is its rich colour."""

    hue: tuple[float, float]
    saturation: float
    lightness: tuple[float, float]
    terminal: str


FAMILIES: dict[str, Family] = {
    PACKET_IO: Family((198.0, 226.0), 0.72, (0.55, 0.72), "bright_blue"),        # blues
    CRYPTO: Family((0.0, 32.0), 0.82, (0.56, 0.68), "bright_red"),               # reds to oranges
    CONNECTION: Family((88.0, 140.0), 0.52, (0.48, 0.64), "bright_green"),       # greens
    IO: Family((262.0, 292.0), 0.55, (0.60, 0.76), "bright_magenta"),            # purples
    UNCATEGORIZED: Family((0.0, 0.0), 0.0, (0.64, 0.82), "grey62"),              # greys
}
assert set(FAMILIES) == set(CATEGORIES)

TERMINAL: dict[str, str] = {c: FAMILIES[c].terminal for c in CATEGORIES}

# wall-clock states (attribution.waits.STATES): the off-CPU flame graph's colours
WAIT_FAMILIES: dict[str, Family] = {
    "on_cpu": Family((0.0, 28.0), 0.80, (0.56, 0.68), "bright_red"),        # reds to oranges: a CPU flame graph's
    "runnable": Family((318.0, 342.0), 0.62, (0.68, 0.80), "orchid"),       # pinks
    "network": Family((196.0, 222.0), 0.70, (0.52, 0.70), "bright_blue"),   # blues
    "timer": Family((44.0, 58.0), 0.85, (0.50, 0.64), "yellow"),            # golds
    "thread": Family((150.0, 172.0), 0.55, (0.40, 0.56), "dark_cyan"),      # teals
    "disk": Family((262.0, 292.0), 0.50, (0.60, 0.76), "medium_purple"),    # purples
    "other": Family((0.0, 0.0), 0.0, (0.64, 0.82), "grey62"),               # greys
}
assert tuple(WAIT_FAMILIES) == STATES
SEARCH_MATCH = "#e600e6"  # magenta, as flamegraph.pl marks search matches: in no category's family


def _hex(h: float, lightness: float, s: float) -> str:
    r, g, b = colorsys.hls_to_rgb(h / 360.0, lightness, s)
    return f"#{round(r * 255):02x}{round(g * 255):02x}{round(b * 255):02x}"


def _unit(name: str, salt: int) -> float:
    """A stable number in [0, 1] from a name (zlib.crc32: unlike hash(), the same in every process)."""
    return (zlib.crc32(name.encode("utf-8", "surrogatepass"), salt) & 0xFFFF) / 0xFFFF


def _family(key: str) -> Family:
    """A category's family, or a wall-clock state's (WAIT_FAMILIES)."""
    return FAMILIES[key] if key in FAMILIES else WAIT_FAMILIES[key]


def frame_colour(category: str, name: str) -> str:
    """`#rrggbb` in the category's (or wall-clock state's) family; the shade depends on the frame's name only."""
    f = _family(category)
    hue = f.hue[0] + (f.hue[1] - f.hue[0]) * _unit(name, 1)
    light = f.lightness[0] + (f.lightness[1] - f.lightness[0]) * _unit(name, 2)
    return _hex(hue, light, f.saturation)


def category_colour(category: str) -> str:
    """The family's middle shade: legends and swatches."""
    f = _family(category)
    return _hex(sum(f.hue) / 2, sum(f.lightness) / 2, f.saturation)


def diff_colour(delta: float, scale: float) -> str:
    """Differential flame graphs (as Brendan Gregg's difffolded): red grew, blue shrank, white-ish
    unchanged; intensity is |delta| / scale (scale: the largest |delta| in the graph)."""
    if delta == 0 or scale <= 0:
        return "#e8e8e8"
    t = min(1.0, abs(delta) / scale)
    fade = round(225 * (1 - t))
    return f"#ff{fade:02x}{fade:02x}" if delta > 0 else f"#{fade:02x}{fade:02x}ff"
