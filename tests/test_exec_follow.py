"""A target that execs after qprof attached (a wrapper becoming the real program) is followed, and
one that `qprof record` starts through wrappers is the program from its first sample.

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

from conftest import ROOT, attach_held, build_c, build_go, own_samples, qprof, share_difference_sd, share_of

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


GCM_ROUNDS = "3000000"  # ~1.5 s of AES-GCM seal/open: ~700 samples


def _recorded(run: Path, argv: list[str], *options: str) -> tuple[dict, dict]:
    qprof("record", "-o", str(run), *options, "--", *argv)
    meta = json.loads((run / "meta.json").read_text())
    (p,) = json.loads(qprof("report", str(run), "--format", "json", "--top", "100000").stdout)["processes"]
    return meta, p


def test_a_program_started_through_wrappers_is_attributed_as_started_directly(kernel_facing: None,
                                                                               tmp_path: Path) -> None:
    """`sh -c 'taskset ... env ... prog'` (dash forks the command, taskset and env exec it) is held at
    the Go program's exec: the same unwinding, mapping files and categories as the program started
    directly; and under DWARF unwinding, which loses a Go stack's root frames, the Go mappings still
    load (the binary is Go) and a leaf in Go's AES-GCM is still Crypto."""
    binary = build_go(ROOT / "tests" / "workloads" / "gcm_go", "gcm_go")
    out = str(tmp_path / "out.json")
    direct = _recorded(tmp_path / "direct", [str(binary), GCM_ROUNDS, out])
    wrapped = _recorded(tmp_path / "wrapped",
                        ["sh", "-c", f"taskset -c 0 env QPROF_TEST=1 {binary} {GCM_ROUNDS} {out}"])
    dwarf = _recorded(tmp_path / "dwarf", [str(binary), GCM_ROUNDS, out], "--unwind", "dwarf")
    (t,) = wrapped[0]["targets"]
    assert t["exe"] == str(binary) and t["comm"] == "gcm_go" and not t["images"], t
    assert t["unwind"] == "fp" == direct[0]["targets"][0]["unwind"]
    names = lambda p: [m["name"] for m in p["mappings"]]  # noqa: E731
    assert names(wrapped[1]) == names(direct[1]) and "go-runtime" in names(direct[1])
    assert "go-runtime" in names(dwarf[1])
    assert next(m for m in dwarf[1]["mappings"] if m["name"] == "go-runtime")["detected_by"].startswith("Go binary")
    # Crypto's share of the binary's own samples: CI once read 91.7% against 98.8% of all samples, the
    # direct run with ~110 more outside Crypto (1,487 samples against 1,304: more CPU, not other names)
    crypto = {k: share_of(own_samples(p, binary), "Crypto")
              for k, (_, p) in (("direct", direct), ("wrapped", wrapped), ("dwarf", dwarf))}
    print("\nCrypto share of the binary's samples, samples:", crypto)
    base, n0 = crypto["direct"]
    assert base > 0.5, "the workload is mostly AES-GCM"
    for k in ("wrapped", "dwarf"):
        share, n = crypto[k]
        sd = share_difference_sd(share, n, base, n0)  # 4 standard deviations of their difference
        assert abs(share - base) <= 4 * sd + 0.005, (k, share, base)
    # diff says when two runs were unwound differently, and only then
    same = qprof("diff", str(tmp_path / "direct"), str(tmp_path / "wrapped"), "--pair",
                 f"{direct[1]['pid']}:{wrapped[1]['pid']}").stdout
    assert "warning:" not in same
    other = json.loads(qprof("diff", str(tmp_path / "direct"), str(tmp_path / "dwarf"), "--pair",
                             f"{direct[1]['pid']}:{dwarf[1]['pid']}", "--format", "json").stdout)
    (m,) = other["method_differences"]
    assert (m["what"], m["values"]) == ("unwinding", ["fp", "dwarf"]), m
