"""`qprof report --format pprof`: the profile read back by protobuf and by the real reader, `go tool pprof`.

The Go toolchain is not a Python dependency: the reader test looks for `go` on PATH and in
/usr/local/go/bin (the Makefile installs Debian's golang-go when neither exists) and skips, saying
so, without it.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from conftest import qprof
from qprof.attribution.categories import CATEGORIES
from qprof.viewer.pprof import profile_class

pytestmark = [pytest.mark.root, pytest.mark.slow]


def go_binary() -> str:
    found = shutil.which("go") or next((p for p in ("/usr/local/go/bin/go", "/usr/lib/go/bin/go")
                                        if os.access(p, os.X_OK)), None)
    if found is None:
        pytest.skip("no Go toolchain for `go tool pprof` (make test installs golang-go when no go is found)")
    return found


def pprof_text(profile: Path, *args: str) -> str:
    r = subprocess.run([go_binary(), "tool", "pprof", *args, str(profile)], capture_output=True, text=True,
                       timeout=300, env={**os.environ, "PPROF_TMPDIR": str(profile.parent)})
    assert r.returncode == 0, r.stderr
    return r.stdout


_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "mins": 60.0, "hrs": 3600.0}


class Printed(float):
    """A duration as pprof prints it (327.33ms, 1.87s, 950us), with the rounding its digits allow."""

    half_digit: float

    def __new__(cls, text: str) -> "Printed":
        m = re.fullmatch(r"(\d+)(?:\.(\d+))?(ns|us|µs|ms|s|mins|hrs)", text)
        assert m, text
        unit = _UNITS[m.group(3)]
        self = super().__new__(cls, float(f"{m.group(1)}.{m.group(2) or 0}") * unit)
        self.half_digit = 0.5 * 10 ** -len(m.group(2) or "") * unit
        return self

    def matches(self, want: float) -> bool:
        """Equal to `want` up to the printed rounding (and float noise)."""
        return abs(self - want) <= self.half_digit + 1e-9


def seconds(text: str) -> Printed:
    return Printed(text)


def shown_total(top: str) -> Printed:
    """The CPU time `pprof -top -nodefraction=0` accounts for (everything the filters kept)."""
    m = re.search(r"Showing nodes accounting for (\S+), [\d.]+% of (\S+) total", top)
    assert m, top
    return seconds(m.group(1))


def tag_values(tags: str, key: str) -> dict[str, Printed]:
    """`pprof -tags` lines of one key: value -> seconds."""
    out: dict[str, Printed] = {}
    block = re.search(rf"^ {key}: Total .*?\n((?:\s+\S+ \(\s*[\d.]+%\): .*\n?)+)", tags, re.M)
    assert block, tags
    for m in re.finditer(r"^\s+(\S+) \(\s*[\d.]+%\): (.*)$", block.group(1), re.M):
        out[m.group(2).strip()] = seconds(m.group(1))
    return out


@pytest.fixture(scope="module")
def exported(ngtcp2_capture: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    run = ngtcp2_capture("gso")
    out = tmp_path_factory.mktemp("pprof") / "run.pb.gz"
    qprof("report", str(run), "--format", "pprof", "-o", str(out))
    return out, json.loads(qprof("report", str(run), "--format", "json", "--top", "100000").stdout)


def test_profile_reads_back_with_the_reports_totals(exported: tuple[Path, dict[str, Any]]) -> None:
    """Decoded with protobuf: one sample type (cpu nanoseconds), ids that resolve, build-ids on the
    targets' binaries, and per process and category the report's CPU time to the nanosecond's rounding."""
    out, report = exported
    prof = profile_class()()
    prof.ParseFromString(gzip.decompress(out.read_bytes()))
    s = prof.string_table
    assert s[0] == "" and [(s[v.type], s[v.unit]) for v in prof.sample_type] == [("cpu", "nanoseconds")]
    locs = {loc.id for loc in prof.location}
    funcs = {f.id for f in prof.function}
    maps = {m.id: m for m in prof.mapping}
    assert all(loc.mapping_id in maps and loc.line[0].function_id in funcs for loc in prof.location)
    assert all(set(sample.location_id) <= locs for sample in prof.sample)
    exes = {p["pid"]: p for p in report["processes"]}
    assert s[prof.mapping[0].filename].endswith(("gtlsserver", "gtlsclient"))
    assert all(s[m.build_id] for m in prof.mapping if s[m.filename].endswith(("gtlsserver", "gtlsclient")))
    got: dict[tuple[int, str], int] = {}
    for sample in prof.sample:
        labels = {s[lb.key]: (s[lb.str] if lb.str else lb.num) for lb in sample.label}
        assert {"category", "role", "stack", "pid", "tid", "comm"} <= set(labels)
        assert labels["stack"] == "ngtcp2" and labels["role"] == exes[labels["pid"]]["role"]
        key = (labels["pid"], labels["category"])
        got[key] = got.get(key, 0) + sample.value[0]
    for pid, p in exes.items():
        for cat in CATEGORIES:
            assert got.get((pid, cat), 0) / 1e9 == pytest.approx(p["category_cpu_seconds"][cat], abs=1e-5)


def test_go_tool_pprof_gives_the_reports_shares(exported: tuple[Path, dict[str, Any]]) -> None:
    """The real reader: -top's total, -tags per category and role, and -tagfocus=category=Crypto give
    the report's CPU seconds up to pprof's printed rounding (half its last digit), and the hottest
    function is the report's hottest symbol."""
    out, report = exported
    procs = report["processes"]
    total = sum(p["cpu_seconds"] for p in procs)
    top = pprof_text(out, "-top", "-nodefraction=0")
    print("\n" + "\n".join(top.splitlines()[:16]))
    assert shown_total(top).matches(total)
    tags = pprof_text(out, "-tags")
    cats = tag_values(tags, "category")
    for cat in CATEGORIES:
        want = sum(p["category_cpu_seconds"][cat] for p in procs)
        assert (cats[cat].matches(want) if cat in cats else want == 0), (cat, cats.get(cat), want)
    roles = tag_values(tags, "role")
    assert all(roles[p["role"]].matches(p["cpu_seconds"]) for p in procs), roles
    crypto = pprof_text(out, "-top", "-nodefraction=0", "-tagfocus=category=Crypto")
    print("\n".join(crypto.splitlines()[6:14]))
    want = sum(p["category_cpu_seconds"]["Crypto"] for p in procs)
    assert want > 0 and shown_total(crypto).matches(want)
    server = next(p for p in procs if p["role"] == "server")
    per_pid = tag_values(pprof_text(out, "-tags", f"-tagfocus=pid={server['pid']}"), "category")
    for cat in CATEGORIES:
        want = server["category_cpu_seconds"][cat]
        assert (per_pid[cat].matches(want) if cat in per_pid else want == 0), (cat, per_pid.get(cat), want)
    # pprof's hottest function of the server is the report's hottest symbol (self time, summed over the
    # categories it appears in, unnamed frames by their object as both name them)
    srv_top = pprof_text(out, "-top", "-nodefraction=0", f"-tagfocus=pid={server['pid']}")
    first = next(ln for ln in srv_top.splitlines() if re.match(r"^\s*[\d.]+\w*\s+[\d.]+%", ln)).split()
    selfs: dict[str, float] = {}
    for sym in (x for syms in server["top_symbols"].values() for x in syms):
        name = sym["symbol"] if sym["symbol"] != "[unknown]" else f"[{Path(sym['dso']).name}]"
        selfs[name] = selfs.get(name, 0.0) + sym["cpu_seconds"]
    assert seconds(first[0]).matches(max(selfs.values())) and seconds(first[0]).matches(selfs[first[-1]]), first
