"""Helper processes (perf, bpftrace) that never outlive qprof and stop cleanly."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess

PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int) -> None:
    """Run in the child before exec: `sig` on parent death (so perf/bpftrace finish and exit),
    and a session of its own (Ctrl-C reaches qprof, which stops helpers in order)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
    os.setsid()


def interrupt_and_wait(proc: subprocess.Popen[bytes], timeout: float) -> int:
    """SIGINT (both write their final output on it), then SIGKILL if it hangs."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode
