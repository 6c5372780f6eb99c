"""Helper processes (perf, bpftrace) that never outlive qprof and stop cleanly."""

from __future__ import annotations

import ctypes
import gc
import io
import os
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Callable, Protocol

from qprof.errors import QprofError

PR_SET_PDEATHSIG = 1
# Helpers whose work can wait for CPU the targets leave (folding finished perf chunks while the
# targets run): the lowest priority. A helper at the targets' own priority is scheduled against
# them on a host they fill, and its CPU is charged to their wall time.
BACKGROUND_NICE = 19


_SIG_DFL, _SIG_IGN = None, 1  # signal(2)'s handler arguments


def _libc() -> ctypes.CDLL:
    """libc with signal(2) declared: callable in a child between fork and exec, from any thread
    (Python's signal.signal works in the main thread only)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.signal.restype = ctypes.c_void_p
    libc.signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
    return libc


def born_ignoring(*sigs: int) -> Callable[[], None]:
    """What to run in a child before exec so that it starts with `sigs` ignored (an ignored signal
    stays ignored across exec), for a helper that must outlive a Ctrl-C: spawned without it, the
    child is in qprof's process group until it makes its own, and a Ctrl-C to that group in between
    kills it with the default action (half of 200 spawns under a flood of SIGINT to the group)."""
    def preexec() -> None:
        libc = _libc()
        for sig in sigs:
            libc.signal(sig, _SIG_IGN)

    return preexec


def die_with_parent(sig: int, nice: int = 0) -> Callable[[], None]:
    """What to run in a helper child before exec (made in qprof, run in the child): `sig` on
    qprof's death (so perf/bpftrace finish and exit), and a process group of its own: a
    terminal's Ctrl-C (or a kill of qprof's group, as `timeout` sends) reaches qprof only, which
    stops helpers in order. The helper stays in qprof's session, so everything qprof started is
    found by that session even after qprof is gone (probes.leftovers).

    Two ways a helper outlived a SIGKILLed qprof (a perf record left sampling, fault table):
    qprof dying before the child's prctl (no signal ever comes), and the signal arriving before
    exec, where the child still has qprof's Python handler, which only notes it. So the signal's
    default action is restored first, and a child whose parent is already gone exits.
    `nice`: added to the helper's niceness (BACKGROUND_NICE for work that can wait)."""
    parent = os.getpid()

    def preexec() -> None:
        libc = _libc()
        libc.signal(sig, _SIG_DFL)
        libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)
        os.setpgid(0, 0)
        if nice:
            os.nice(nice)

    return preexec


def own_group(nice: int = 0) -> Callable[[], None]:
    """die_with_parent for a helper that ends when qprof closes its stdin (a kept folder,
    collectors.nativefold.Server): no death signal, which the kernel sends when the thread that
    started the child ends, not its process (one started by the folding thread died at the last
    pass); qprof's death closes the pipe all the same."""

    def preexec() -> None:
        os.setpgid(0, 0)
        if nice:
            os.nice(nice)

    return preexec


_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process (a zombie's too: read before it is reaped)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])) / _TICK
    except (OSError, IndexError, ValueError):
        return None


class Child(Protocol):
    """What qprof calls on a helper it started: subprocess.Popen's calls, which Forked has too."""

    pid: int
    returncode: int | None

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def send_signal(self, sig: int) -> None: ...

    def kill(self) -> None: ...


class Forked:
    """A child forked from this process without exec, with Popen's calls (Child)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: its status is gone
                self.returncode = -signal.SIGKILL
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (rc := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0.0)
            time.sleep(0.005)
        return rc

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def single_threaded() -> bool:
    """Whether this process has one thread (the kernel's count: native threads too). Only then is a
    fork without exec safe: a lock another thread held at the fork stays held in the child."""
    try:
        return len(os.listdir("/proc/self/task")) == 1
    except OSError:
        return False


def fork_child(run: Callable[[], int], stdout: int, stderr: int, preexec: Callable[[], None]) -> Forked | None:
    """`run` in a child forked from this process, its stdout and stderr on these descriptors, its exit
    status what `run` returns; None when this process has more than one thread (start it with exec then).

    A helper written in Python starts this way with the interpreter and the modules qprof has loaded
    already: a fresh interpreter and its imports were ~0.1 CPU s of each probe loader's start. The child
    never returns into qprof's code: it ends in os._exit, whatever `run` does."""
    if not single_threaded():
        return None
    for f in (sys.stdout, sys.stderr):  # what the parent buffered is written once, by the parent
        f.flush()
    pid = os.fork()
    if pid:
        return Forked(pid)
    code = 1
    try:
        gc.freeze()  # what the parent made is never scanned here: its pages stay shared
        for sig in (signal.SIGINT, signal.SIGTERM):  # qprof's handlers only note a stop; this child must act
            signal.signal(sig, signal.SIG_DFL)
        signal.set_wakeup_fd(-1)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(stdout, 1)
        os.dup2(stderr, 2)
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))  # qprof's files and pipes: not held open by the helper
        sys.stdin = open(0, "r", closefd=False)
        sys.stdout = io.TextIOWrapper(open(1, "wb", closefd=False), encoding="utf-8")
        sys.stderr = io.TextIOWrapper(open(2, "wb", closefd=False), encoding="utf-8", line_buffering=True)
        preexec()
        code = run()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def interrupt_and_wait(proc: Child, timeout: float) -> tuple[int, float | None]:
    """SIGINT (both write their final output on it), then SIGKILL if it hangs. Returns the exit
    status and the CPU seconds the helper used (with its children), read once it has exited and
    before it is reaped: what observing the targets cost, told in the run archive."""
    cpu = None
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                done = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT | os.WNOHANG)
            except ChildProcessError:
                break
            if done is not None:
                cpu = cpu_seconds(proc.pid)
                break
            time.sleep(0.01)
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait(), cpu


class ProbeProcess:
    """A probe program running in a child process that writes JSON lines to `output`.

    The child prints READY_MARKER once its probes are live, then its maps every
    second and a last time on SIGINT; it dies with qprof (PR_SET_PDEATHSIG)."""

    READY_MARKER = b"qprof-ready"

    def __init__(self, name: str, output: Path, log: Path) -> None:
        self.name, self.output, self.log = name, output, log
        self.proc: Child | None = None
        self.started_at: float | None = None
        self.cpu_s: float | None = None  # CPU seconds it used, once stopped

    def _start(self, cmd: list[str], preexec: Callable[[], None], env: dict[str, str] | None = None,
               run: Callable[[], int] | None = None) -> None:
        """The child, its stdout the output and its stderr the log: `run` forked from this process where it
        can be (fork_child), else `cmd` executed."""
        # O_APPEND: MapTail.compact may empty the output under the child, whose next print then lands at 0
        with open(self.output, "ab") as out, open(self.log, "wb") as log:
            out.truncate(0)
            forked = fork_child(run, out.fileno(), log.fileno(), preexec) if run is not None else None
            self.proc = forked if forked is not None else subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=log, preexec_fn=preexec, env=env)

    def wait_attached(self, timeout: float = 60.0, should_stop: Callable[[], bool] = lambda: False) -> bool:
        """True once every probe is attached (the child printed its readiness line); False if
        `should_stop` said to give up first (the child is then stopped with the rest)."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if should_stop():
                return False
            if self.proc.poll() is not None:
                raise QprofError(f"probes {self.name} failed to start: {self.log_tail()}")
            os.getppid()  # fires bpftrace's readiness probe once it is attached
            if self._attached():
                self.started_at = time.monotonic()
                return True
            time.sleep(0.01)
        self.stop()
        raise QprofError(f"probes {self.name} did not attach within {timeout:.0f}s: {self.log_tail()}")

    def _attached(self) -> bool:
        try:
            with open(self.output, "rb") as f:
                head = f.read(8192)
        except OSError:
            return False
        return self.READY_MARKER in head

    def log_tail(self) -> str:
        lines: list[str] = []
        for p in (self.log, self.output):
            try:
                lines += [ln.strip() for ln in p.read_text(errors="replace").splitlines()
                          if ln.strip() and '"type": "map"' not in ln and '"type":"map"' not in ln
                          and '"type": "hist"' not in ln]
            except OSError:
                pass
        return " | ".join(lines[-3:]) or "no output"

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGINT: the child prints its maps a last time and detaches."""
        if self.proc is None:
            return None
        rc, cpu = interrupt_and_wait(self.proc, timeout)
        self.cpu_s = cpu if cpu is not None else self.cpu_s
        return rc
