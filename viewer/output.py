"""Output files of the viewers (flame graphs, diffs): checked before the work, written atomically.

Checked first, so a bad `-o` fails in a moment rather than after attribution:
the format comes from the suffix, and a symbolic link, a directory, a missing
or unwritable parent are refused with the fix. Written like the run archive's
files (complete or absent, owner-only 0600), but through an unguessable
temporary name created exclusively (mkstemp): the archive writes into its own
0700 directory, a user's -o may point into a shared one such as /tmp, where a
fixed `NAME.tmp` could be planted as a link. The final rename replaces a link
that appeared meanwhile instead of writing through it.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Mapping

from qprof.errors import QprofError


def output_format(path: Path, formats: Mapping[str, str]) -> str:
    """The format `formats` maps the suffix of `path` to (e.g. {".svg": "svg"}); refuses what cannot
    be written. Raises QprofError naming the problem and the fix."""
    suffix = path.suffix.lower()
    if suffix not in formats:
        names = ", ".join(formats)
        raise QprofError(f"-o {path}: unknown output format {suffix or '(no suffix)'!r}; "
                         f"end the file name with {names}")
    if path.is_symlink():
        raise QprofError(f"-o {path} is a symbolic link; give a plain file path (qprof does not write "
                         "through links)")
    if path.is_dir():
        raise QprofError(f"-o {path} is a directory; give a file path ending in {suffix}")
    parent = path.parent
    if not parent.is_dir():
        raise QprofError(f"-o {path}: directory {parent} does not exist; create it or choose another -o")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise QprofError(f"-o {path}: cannot write to directory {parent} (permission denied); "
                         "choose another -o")
    return formats[suffix]


def _umask() -> int:
    """The process's umask, read without setting it (Linux >= 4.7), else the common 022."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022


def write_atomic(path: Path, text: str | bytes) -> None:
    """Write `text` (UTF-8 if a str) to `path`: readers see the old file or the whole new one, with the
    mode the user's shell would give a new file (a report or chart is made to be shared)."""
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        raise QprofError(f"cannot write {path}: {e.strerror}; choose another -o") from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(text.encode("utf-8") if isinstance(text, str) else text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise QprofError(f"cannot write {path}: {e.strerror}; choose another -o") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
