"""qprof's own cache (~/.cache/qprof, or under XDG_CACHE_HOME): where answers that outlive one run are kept.

Compiled probes, the folder's build, answers about the kernel's BTF, tools' versions and the frame pointers of
the objects targets map (collectors.elf) live in it. A cache file is only ever a shortcut: unreadable, damaged
or unwritable, it costs the work it saves and is never an error.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

CACHE_HOME = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "qprof"


def read_json(path: Path) -> dict[str, object]:
    """A cache file's object; {} when it is absent, unreadable or not a JSON object."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def write_json(path: Path, doc: dict[str, object]) -> None:
    """Written whole and renamed: a reader sees the old file or the new one; a failure leaves it be."""
    write_bytes(path, json.dumps(doc).encode())


def write_bytes(path: Path, data: bytes) -> bool:
    """Written whole and renamed: a reader sees the old file or the new one; a failure leaves it be
    (False)."""
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError:
        return False
    return True
