"""`qprof doctor`: one line per facility, a fix where there is one, a documented exit status."""

from __future__ import annotations

import os
from pathlib import Path


from conftest import as_nobody, qprof


def test_full_host(kernel_facing: None) -> None:
    r = qprof("doctor", "--pid", str(os.getpid()), check=False)
    print("\n" + r.stdout)
    assert r.returncode in (0, 1), r.stdout  # as root with perf: sampling always works
    for name in ("privileges", "perf:", "bpftrace", "kernel BTF", "uprobes", "kprobes", "probes: packetio"):
        assert name in r.stdout
    assert "unwinding:" in r.stdout and "libc.so.6" in r.stdout, "the pid's binaries are checked"
    assert "Traceback" not in r.stderr


def test_without_perf_attach_cannot_run(kernel_facing: None, tmp_path: Path) -> None:
    env = {**os.environ, "PATH": str(tmp_path)}
    r = qprof("doctor", check=False, env=env)
    assert r.returncode == 2
    assert "NO  perf: not found  (fix: apt-get install linux-perf)" in r.stdout


def test_not_root(kernel_facing: None, tmp_path: Path) -> None:
    r = as_nobody(["doctor"], tmp_path)
    assert r.returncode == 2
    assert "NO  privileges" in r.stdout and "fix: run as root" in r.stdout
