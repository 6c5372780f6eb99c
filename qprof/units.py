"""Sizes as users write them on the command line ('1G', '512M', '64K', bytes)."""

from __future__ import annotations

from qprof.errors import QprofError


def parse_size(text: str) -> int:
    """'1G', '512M', '64K' or bytes -> bytes."""
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    num, unit = (t[:-1], t[-1]) if t and t[-1] in units else (t, "")
    try:
        n = int(float(num) * units[unit])
    except (ValueError, OverflowError):
        raise QprofError(f"size {text!r} is not a size: write e.g. 1G, 256M or 65536") from None
    if not 0 < n <= 64 << 30:
        raise QprofError(f"size {text!r} is out of range: give 1 byte to 64G")
    return n
