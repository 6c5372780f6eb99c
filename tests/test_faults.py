"""Faults, each a real run of `qprof attach` on a real process with real perf and bpftrace
(qprof.faultlab injects them; bench/faults.py prints the same cases as a table).

Every case: qprof survives (exits cleanly with the expected status and at most one error
line, or is killed as intended), leaves no process, BPF program, perf event or uprobe
behind, and keeps what it collected readable by `qprof report` (complete, or marked
incomplete and readable, maybe after --refold).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from qprof.faultlab import CASES, EXPECTED_DATA, CaseSkipped, run_case

pytestmark = [pytest.mark.root, pytest.mark.slow]


@pytest.mark.parametrize("case", list(CASES))
def test_fault(probes_available: None, tmp_path: Path, case: str) -> None:
    try:
        o = run_case(case, tmp_path)
    except CaseSkipped as e:
        pytest.skip(str(e))
    print(f"\n{case}: survived={o.survived} leftovers={o.leftovers.describe()} data={o.data}\n  {o.detail}")
    assert o.survived, o.detail
    assert o.leftovers.total == 0, f"left behind: {o.leftovers.describe()} {o.leftovers.processes}"
    assert o.data in EXPECTED_DATA[case], o.detail
