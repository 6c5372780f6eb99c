"""`qprof report SRV CLI`: one side per archive (two hosts, no clock sync), one verdict."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import qprof
from qprof import runfiles
from qprof import archive
from qprof.archive.model import STATUS_COMPLETE, Host, Meta, Sampling, Target
from qprof.archive.stacks import Sample, fold, write_stacks


def one_side(root: Path, role: str, pid: int, on_cpu: float, t0: float) -> Path:
    """An archive holding one endpoint, its /proc readings in its own clock (starting at t0)."""
    out = archive.create_run_dir(root / role)
    archive.write_meta(out, Meta(status=STATUS_COMPLETE, host=Host(kernel="6.1", cpus=4,
                                                                    cpu_nodes={0: 0, 1: 0, 2: 1, 3: 1}),
                                 sampling=Sampling(frequency=999),
                                 targets=[Target(pid, f"{role}d", role, unwind="fp", unwind_reason="test")],
                                 duration_s=10.0))
    write_stacks(out / runfiles.STACKS, fold([Sample(pid, pid, f"{role}d", 1_000_000, (("udp_sendmsg", "[kernel.kallsyms]"),))] * 50))
    with open(out / runfiles.PROC, "w", encoding="utf-8") as f:
        for i in range(11):
            t = t0 + i
            f.write(json.dumps({"t": t, "mono": t, "threads": {str(pid): [
                {"tid": pid, "comm": f"{role}d", "state": "S", "utime_s": 0, "stime_s": 0, "on_cpu_s": i * on_cpu,
                 "run_delay_s": 0.0, "syscall": "232", "cpu": 2}]}, "cgroups": {str(pid): None}}) + "\n")
    return out


def test_two_archives_one_verdict(tmp_path: Path) -> None:
    srv = one_side(tmp_path, "server", 100, 0.97, t0=5000.0)  # the hosts' clocks differ: no sync assumed
    cli = one_side(tmp_path, "client", 100, 0.40, t0=17.0)    # and pids may even coincide across hosts
    doc = json.loads(qprof("report", str(srv), str(cli), "--format", "json").stdout)
    assert len(doc["runs"]) == 2 and {p["role"] for p in doc["processes"]} == {"server", "client"}
    v = doc["verdict"]
    assert v["limited_by"] == "server-limited"
    assert v["evidence"]["server"]["busiest_on_cpu"] == 0.97 and v["evidence"]["client"]["busiest_on_cpu"] == 0.4
    assert v["evidence"]["server"]["numa_nodes"] == [1]
    text = qprof("report", str(srv), str(cli)).stdout
    assert "verdict: server-limited" in text
