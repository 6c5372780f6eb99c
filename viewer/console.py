"""The consoles text reports print to: a terminal's width on a terminal, no wrapping anywhere else.

Reports are redirected into files and CI logs; rich falls back to 80 columns there and wraps
tables into a garble (`serve` / `r` on the next line). In a file or pipe the width is wide enough
for any row, so each table row stays one line and text lines are never folded.
"""

from __future__ import annotations

import sys
from typing import TextIO

from rich.console import Console

UNWRAPPED_WIDTH = 4096  # columns in a file or pipe: wider than any row qprof prints


def text_console(stderr: bool = False, file: TextIO | None = None) -> Console:
    """A rich console for qprof's text output (no markup highlighting); unwrapped when not a terminal."""
    stream = file if file is not None else (sys.stderr if stderr else sys.stdout)
    if stream.isatty():
        return Console(highlight=False, stderr=stderr, file=file)
    return Console(highlight=False, stderr=stderr, file=file, width=UNWRAPPED_WIDTH, soft_wrap=True)
