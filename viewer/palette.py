"""Category colours, one hue family each, shared by every view (terminal, flame graphs, diffs).

A flame graph has hundreds of frames of one category; one flat colour per
category would melt neighbouring frames into one block, so each frame gets a
shade of its category's family picked by a stable hash of its name (the same
function is the same shade in every graph and run, which makes two graphs
comparable side by side). The terminal's colours are the same families.
"""

from __future__ import annotations

import colorsys
import zlib
from dataclasses import dataclass

from qprof.attribution.categories import CATEGORIES, CONNECTION, CRYPTO, IO, PACKET_IO, UNCATEGORIZED


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
SEARCH_MATCH = "#e600e6"  # magenta, as flamegraph.pl marks search matches: in no category's family


def _hex(h: float, lightness: float, s: float) -> str:
    r, g, b = colorsys.hls_to_rgb(h / 360.0, lightness, s)
    return f"#{round(r * 255):02x}{round(g * 255):02x}{round(b * 255):02x}"


def _unit(name: str, salt: int) -> float:
    """A stable number in [0, 1] from a name (zlib.crc32: unlike hash(), the same in every process)."""
    return (zlib.crc32(name.encode("utf-8", "surrogatepass"), salt) & 0xFFFF) / 0xFFFF


def frame_colour(category: str, name: str) -> str:
    """`#rrggbb` in the category's family; the shade depends on the frame's name only."""
    f = FAMILIES[category]
    hue = f.hue[0] + (f.hue[1] - f.hue[0]) * _unit(name, 1)
    light = f.lightness[0] + (f.lightness[1] - f.lightness[0]) * _unit(name, 2)
    return _hex(hue, light, f.saturation)


def category_colour(category: str) -> str:
    """The family's middle shade: legends and swatches."""
    f = FAMILIES[category]
    return _hex(sum(f.hue) / 2, sum(f.lightness) / 2, f.saturation)


def diff_colour(delta: float, scale: float) -> str:
    """Differential flame graphs (as Brendan Gregg's difffolded): red grew, blue shrank, white-ish
    unchanged; intensity is |delta| / scale (scale: the largest |delta| in the graph)."""
    if delta == 0 or scale <= 0:
        return "#e8e8e8"
    t = min(1.0, abs(delta) / scale)
    fade = round(225 * (1 - t))
    return f"#ff{fade:02x}{fade:02x}" if delta > 0 else f"#{fade:02x}{fade:02x}ff"
