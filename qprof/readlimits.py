"""Reading files another user may have written (run archives, mapping files) at a bounded cost.

Archives and mapping files are shared: whoever made them may have made them hostile. They are
data (JSON, TOML, never evaluated), and reading them is bounded too: only regular files are
opened (a FIFO would block, /dev/zero never ends: a symbolic link to either is refused as well),
whole documents have a size limit, line-oriented files a line-length limit, and a compressed
file may not expand past a multiple of its own size (a gzip bomb stops with one line).
"""

from __future__ import annotations

import gzip
import io
import os
import stat
from pathlib import Path
from typing import BinaryIO, Iterator

from qprof.errors import QprofError

MAX_LINE = 16 << 20  # bytes of one JSON line: a stack of 127 frames is ~30 KiB
# a gzip stream may expand to this multiple of its size plus GZIP_FLOOR (qprof's stacks: ~30x)
GZIP_RATIO, GZIP_FLOOR = 64, 32 << 20


def open_regular(path: Path) -> BinaryIO:
    """`path` opened for reading if it is a regular file (following links); QprofError if it is
    a FIFO, device, socket or directory. FileNotFoundError passes through."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise QprofError(f"{path}: not a regular file; a run archive or mapping file holds plain files only")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bytes(path: Path, limit: int) -> bytes:
    """A whole regular file of at most `limit` bytes."""
    with open_regular(path) as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise QprofError(f"{path}: larger than {limit >> 20} MiB; this is not a file qprof wrote")
    return data


def read_text(path: Path, limit: int) -> str:
    """read_bytes as UTF-8 (UnicodeDecodeError passes through, like Path.read_text's)."""
    return read_bytes(path, limit).decode("utf-8")


class _Capped(io.RawIOBase):
    """A decompressed stream that stops with QprofError past `limit` bytes."""

    def __init__(self, inner: gzip.GzipFile, raw: BinaryIO, limit: int, path: Path) -> None:
        self.inner, self.raw, self.left, self.path = inner, raw, limit, path

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        if not self.closed:
            self.inner.close()
            self.raw.close()
        super().close()

    def readinto(self, b: bytearray | memoryview) -> int:  # type: ignore[override]
        n = self.inner.readinto(b)
        self.left -= n
        if self.left < 0:
            raise QprofError(f"{self.path}: expands to more than {GZIP_RATIO}x its size; "
                             "this is not a stacks file qprof wrote")
        return n


def open_gzip_text(path: Path) -> io.TextIOWrapper:
    """A regular gzip file as UTF-8 text whose expansion is capped (GZIP_RATIO, GZIP_FLOOR)."""
    raw = open_regular(path)
    size = os.fstat(raw.fileno()).st_size
    capped = _Capped(gzip.GzipFile(fileobj=raw, mode="rb"), raw, size * GZIP_RATIO + GZIP_FLOOR, path)
    return io.TextIOWrapper(io.BufferedReader(capped), encoding="utf-8")


def appended_lines(path: Path) -> list[str | bytes] | None:
    """The lines of a JSON-lines file a loader appended while the run went on; None when there is none
    (absent, or not a regular file). A line past MAX_LINE ends what is read as one damaged line (b"\\0"):
    the lines before it are kept."""
    try:
        f = open_regular(path)
    except (OSError, QprofError):
        return None
    out: list[str | bytes] = []
    with f:
        try:
            out.extend(lines(f, path))
        except QprofError:
            out.append(b"\0")
    return out


def lines(f: io.TextIOBase | BinaryIO, path: Path) -> Iterator[str | bytes]:
    """A file's lines, each at most MAX_LINE long (a longer one stops with QprofError)."""
    while True:
        line = f.readline(MAX_LINE + 1)
        if not line:
            return
        if len(line) > MAX_LINE:
            raise QprofError(f"{path}: a line longer than {MAX_LINE >> 20} MiB; this is not a file qprof wrote")
        yield line
