"""The watchdog that puts the targets back where they were: its own tiny program, stdlib only.

collectors.perfcgroup moves each target into a child cgroup of its own; this
process holds the read end of a pipe from qprof and, on EOF (qprof closed it,
exited, or was SIGKILLed), moves every task of each child back to its original
cgroup and removes the child. It runs as a script (`python -I -S cgroupwatch.py`),
not as a module of the qprof package: importing the package for these few
functions cost each attach ~0.1 CPU s of a helper that then waits for EOF
(bench/footprint.py).
"""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

# qprof closing its pipe is what tells the watchdog to restore the cgroups; these must not
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _procs(cg: Path) -> list[int]:
    try:
        return [int(x) for x in (cg / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def move(pid: int, cg: Path) -> bool:
    try:
        (cg / "cgroup.procs").write_text(str(pid))
        return True
    except OSError:
        return False  # gone meanwhile, or the destination vanished


def _rmdir(cg: Path, timeout: float = 2.0) -> bool:
    # an exiting task keeps a cgroup busy for a moment after it left cgroup.procs
    deadline = time.monotonic() + timeout
    while True:
        try:
            cg.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)


def restore(child: Path, original: Path) -> list[int]:
    """Move every task of `child` back to `original` (or the nearest existing ancestor), remove `child`.

    Returns the pids it could not move (they keep the child alive)."""
    dest = original
    while not (dest / "cgroup.procs").exists() and dest != dest.parent:
        dest = dest.parent
    stuck = []
    for _ in range(3):  # a target may fork while we move it: its child lands in `child`
        procs = _procs(child)
        if not procs:
            break
        stuck = [p for p in procs if not move(p, dest)]
    _rmdir(child)
    return stuck


def _watch() -> int:
    """Watchdog: read (child, original) lines until EOF, then restore every one of them."""
    for s in STOP_SIGNALS:  # already ignored when qprof started it; also when started by hand
        signal.signal(s, signal.SIG_IGN)
    pairs = []
    for line in sys.stdin.buffer:
        try:
            child, original = json.loads(line)
        except ValueError:
            continue
        pairs.append((Path(child), Path(original)))
    for child, original in pairs:
        restore(child, original)
    return 0


if __name__ == "__main__":
    sys.exit(_watch())
