"""Network namespaces: enter one for a thread, or make a socket that lives in a target's namespace.

A socket belongs to the network namespace it was created in, for life; setns
changes only the calling thread's namespace. So a socket in a target's
namespace is made by a short-lived thread that enters it first: the rest of
qprof never leaves its own.
"""

from __future__ import annotations

import ctypes
import os
import threading
from typing import Callable, TypeVar

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)
T = TypeVar("T")


def netns_id(pid: int) -> str | None:
    """The network namespace `pid` lives in (its /proc link text), None once it is gone."""
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None


def by_netns(pids: list[int]) -> dict[str, list[int]]:
    """The pids grouped by the network namespace they live in, namespaces in the order first seen;
    pids already gone are left out."""
    out: dict[str, list[int]] = {}
    for p in pids:
        ns = netns_id(p)
        if ns is not None:
            out.setdefault(ns, []).append(p)
    return out


def setns(fd: int, nstype: int = CLONE_NEWNET) -> None:
    """setns(2) for the calling thread (os.setns needs Python 3.12)."""
    if _libc.setns(fd, nstype) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


def in_netns_of(pid: int, fn: Callable[[], T]) -> T:
    """Run `fn` in a thread that entered `pid`'s network namespace (in this thread when it is ours)."""
    if netns_id(pid) == netns_id(os.getpid()):
        return fn()
    box: dict[str, object] = {}

    def run() -> None:
        try:
            fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
            try:
                setns(fd)
            finally:
                os.close(fd)
            box["value"] = fn()
        except BaseException as e:  # handed to the caller's thread
            box["error"] = e

    t = threading.Thread(target=run, name="qprof-netns")
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["value"]  # type: ignore[return-value]
