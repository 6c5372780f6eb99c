"""An append-only JSON-lines file a probe loader writes while the run goes on (a series beside its stream).

Each line is written whole in one write(2) to a file opened with O_APPEND, so a kill leaves whole
lines and at most one cut: a run cut short keeps every line written before the cut. A failed write
(a full disk) is counted, not raised: the loader's maps go on.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Mapping


class LineFile:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None
        self.write_errors = 0

    def open(self) -> None:
        """The file, emptied (before the programs attach)."""
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_CLOEXEC, 0o600)

    def write(self, obj: Mapping[str, object]) -> None:
        """One JSON object as one line (the writer's own line types: a TypedDict each)."""
        if self._fd is None:
            return
        data = (json.dumps(obj, separators=(",", ":")) + "\n").encode()
        try:
            while data:
                data = data[os.write(self._fd, data):]
        except OSError:
            self.write_errors += 1

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
