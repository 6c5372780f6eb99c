"""Helpers forked without exec (probes.children.fork_child), as the probe loaders start: what the child
gets (its output, no parent's files), how it ends, and when fork is refused. Each case runs in a fresh
interpreter of one thread (a test before it may have left a thread in pytest's process, and then
fork_child rightly refuses)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

import pytest

from qprof.probes.children import Forked, fork_child, interrupt_and_wait, single_threaded


def _noop() -> None:
    pass


def in_fresh_interpreter(case: Callable[[Path], None], tmp_path: Path) -> None:
    """Run `case(tmp_path)` in a new Python process (this module's source, the case called by name)."""
    code = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
            f"from pathlib import Path\nimport test_children as t\nt.{case.__name__}(Path({str(tmp_path)!r}))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def case_the_child_writes_to_its_files_and_holds_none_of_the_parents(tmp_path: Path) -> None:
    assert single_threaded()
    out, log = tmp_path / "out", tmp_path / "log"
    r, w = os.pipe()  # a parent's pipe: the child must not keep its write end open

    def run() -> int:
        print("hello from", os.getpid())
        print("to the log", file=__import__("sys").stderr)
        try:
            os.fstat(w)
            print("parent fd open")
        except OSError:
            print("parent fd closed")
        print("stdin:", repr(__import__("sys").stdin.read()))
        return 7

    with open(out, "wb") as o, open(log, "wb") as lg:
        child = fork_child(run, o.fileno(), lg.fileno(), _noop)
    assert isinstance(child, Forked)
    os.close(w)
    assert os.read(r, 1) == b"", "the child held the parent's pipe open"
    os.close(r)
    assert child.wait(10) == 7 and child.poll() == 7
    text = out.read_text()
    assert f"hello from {child.pid}" in text and "parent fd closed" in text and "stdin: ''" in text
    assert "to the log" in log.read_text()


def case_an_exception_is_logged_and_exits_1(tmp_path: Path) -> None:
    def run() -> int:
        raise RuntimeError("the loader broke")

    with open(tmp_path / "out", "wb") as o, open(tmp_path / "log", "wb") as lg:
        child = fork_child(run, o.fileno(), lg.fileno(), _noop)
    assert child is not None and child.wait(10) == 1
    assert "RuntimeError: the loader broke" in (tmp_path / "log").read_text()


def case_a_stop_before_the_child_handles_it_ends_the_child(tmp_path: Path) -> None:
    """qprof's own SIGINT handler only notes a stop; a child still running with it would miss the
    stop and run on until killed. The child starts with the default action instead."""
    old = signal.signal(signal.SIGINT, lambda *_: None)
    try:
        with open(tmp_path / "out", "wb") as o, open(tmp_path / "log", "wb") as lg:
            child = fork_child(lambda: time.sleep(30) or 0, o.fileno(), lg.fileno(), _noop)
        assert child is not None
        time.sleep(0.2)
        rc, cpu = interrupt_and_wait(child, 5.0)
    finally:
        signal.signal(signal.SIGINT, old)
    assert rc == -signal.SIGINT and cpu is not None


def case_wait_times_out_and_kill_ends_it(tmp_path: Path) -> None:
    with open(tmp_path / "out", "wb") as o, open(tmp_path / "log", "wb") as lg:
        child = fork_child(lambda: time.sleep(30) or 0, o.fileno(), lg.fileno(), _noop)
    assert child is not None
    with pytest.raises(Exception, match="timed out"):
        child.wait(0.05)
    child.kill()
    assert child.wait(5) == -signal.SIGKILL
    child.send_signal(signal.SIGINT)  # gone: nothing to signal, no error


def test_no_fork_beside_another_thread(tmp_path: Path) -> None:
    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    try:
        assert not single_threaded()
        with open(tmp_path / "out", "wb") as o, open(tmp_path / "log", "wb") as lg:
            assert fork_child(lambda: 0, o.fileno(), lg.fileno(), _noop) is None
    finally:
        stop.set()
        t.join()


def test_the_child_writes_to_its_files_and_holds_none_of_the_parents(tmp_path: Path) -> None:
    in_fresh_interpreter(case_the_child_writes_to_its_files_and_holds_none_of_the_parents, tmp_path)


def test_an_exception_is_logged_and_exits_1(tmp_path: Path) -> None:
    in_fresh_interpreter(case_an_exception_is_logged_and_exits_1, tmp_path)


def test_a_stop_before_the_child_handles_it_ends_the_child(tmp_path: Path) -> None:
    in_fresh_interpreter(case_a_stop_before_the_child_handles_it_ends_the_child, tmp_path)


def test_wait_times_out_and_kill_ends_it(tmp_path: Path) -> None:
    in_fresh_interpreter(case_wait_times_out_and_kill_ends_it, tmp_path)
