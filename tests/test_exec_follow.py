"""A target that execs after qprof attached (a wrapper becoming the real program) is followed.

A shell (dynamic, no frame pointers: DWARF unwinding) sleeps, then execs a static
program built with frame pointers. qprof must notice the exec, describe the target
by its new image (name, binary), read its samples from a frame-pointer recorder
from then on, and count every sample once (sampled CPU against /proc's).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import ROOT, attach_held, build_c, qprof

pytestmark = [pytest.mark.root, pytest.mark.slow]


def test_exec_after_attach_takes_the_new_image(kernel_facing: None, tmp_path: Path) -> None:
    spin = build_c(ROOT / "tests" / "workloads" / "spin.c", "spin", ["-static", "-nostdlib", "-O0"])
    sh = shutil.which("sh")
    assert sh is not None
    run = tmp_path / "run"
    proc = attach_held([sh, "-c", f"sleep 1; exec {spin} 2"], run)
    meta = json.loads((run / "meta.json").read_text())
    (t,) = meta["targets"]
    print("\n", t["images"], meta["sampling"]["groups"])
    assert [i["comm"] for i in t["images"]] == [Path(sh).name, "spin"]
    assert t["comm"] == "spin" and t["exe"] == str(spin)
    assert [i["unwind"] for i in t["images"]] == ["dwarf", "fp"] and t["unwind"] == "fp"
    groups = {g["unwind"]: g for g in meta["sampling"]["groups"]}
    assert proc.pid in groups["fp"]["pids"] and proc.pid in groups["dwarf"]["pids"]
    (old,) = groups["dwarf"]["windows"][str(proc.pid)]
    (new,) = groups["fp"]["windows"][str(proc.pid)]
    assert old[0] is None and new[1] is None and old[1] < new[0]
    report = json.loads(qprof("report", str(run), "--format", "json").stdout)
    (p,) = report["processes"]
    assert p["comm"] == "spin"
    spun = sum(s["share"] for c in p["top_symbols"].values() for s in c if s["symbol"] == "qprof_spin_work")
    assert spun > 0.8, p["top_symbols"]
    # one recorder's samples at a time: sampled CPU matches the kernel's accounting (both recorders
    # sample every CPU after the move: reading both would double it). The target exits, so /proc's last
    # reading (every 0.25 s) may precede its last samples.
    sampled, proc_cpu = p["cpu_seconds"], p["proc_cpu_seconds"]
    print(f"sampled {sampled:.3f} s, /proc {proc_cpu:.3f} s")
    assert 0.9 * proc_cpu <= sampled <= 1.1 * proc_cpu + 0.3
