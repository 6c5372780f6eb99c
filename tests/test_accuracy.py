"""Accuracy against ground truth: a workload that measures its own CPU time per category.

tests/workloads/accuracy.c spends known shares of one thread's CPU time
(CLOCK_THREAD_CPUTIME_ID) in UDP send/recv, AES-GCM in libcrypto, plain
computation and file writes. qprof's shares over the whole run must match
within 3 percentage points per category, for both unwinding modes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import ROOT, attach_held, build_c, qprof
from qprof.attribution.categories import CATEGORIES

pytestmark = [pytest.mark.root, pytest.mark.slow]
WORKLOAD = ROOT / "tests" / "workloads"
SECONDS = "6"


@pytest.mark.parametrize("unwind", ["auto", "fp"])
def test_shares_match_self_measured_cpu_time(kernel_facing: None, tmp_path: Path, unwind: str) -> None:
    binary = build_c(WORKLOAD / "accuracy.c", "accuracy", ["-lcrypto"])
    truth_file = tmp_path / "truth.json"
    run = tmp_path / "run"
    # sampling only: probe handlers would add their own cost to the phases they count
    attach_held([str(binary), SECONDS, str(truth_file), str(tmp_path)], run, unwind=unwind, probes=())
    truth = json.loads(truth_file.read_text())
    # the workload charges each nanosecond of its thread to one of the five categories
    assert set(CATEGORIES) <= set(truth)
    assert sum(truth[c] for c in CATEGORIES) == pytest.approx(truth["total"], abs=1e-5)  # 5 values rounded to 1 us
    expected = {c: truth[c] / truth["total"] for c in CATEGORIES}
    report = json.loads(qprof("report", str(run), "--format", "json",
                              "--mapping", str(WORKLOAD / "accuracy.toml")).stdout)
    (p,) = report["processes"]
    meta = json.loads((run / "meta.json").read_text())
    mode = meta["targets"][0]["unwind"]
    # built with frame pointers but dynamically linked (glibc, libcrypto): auto chooses DWARF
    assert mode == ("dwarf" if unwind == "auto" else "fp")
    errors = {c: p["categories"][c] - expected[c] for c in CATEGORIES}
    print(f"\nunwind={mode} samples={p['samples']} cpu={p['cpu_seconds']:.2f}s truth={truth['total']:.2f}s")
    for c in CATEGORIES:
        print(f"  {c:16s} qprof {p['categories'][c]:6.1%}  self-measured {expected[c]:6.1%}  "
              f"error {errors[c] * 100:+.2f} pp")
    assert p["samples"] >= 5 * 999 * 0.9, "at least 5 s at 999 Hz"
    # >= 5000 samples: a share's sampling error is at most sqrt(0.25 / 5000) = 0.7 pp, so 3 pp is
    # over 4 standard errors; what is left is attribution error, which is what this test bounds
    for c in CATEGORIES:
        assert abs(errors[c]) <= 0.03, f"{c}: {errors[c] * 100:+.2f} pp"
