"""quic-go and aioquic: a real profiled bulk transfer per stack, both ends attached.

The endpoints are built from tests/endpoints/ into a cache outside the
repository (tests/endpoints/build.py) and reused while their sources are
unchanged. Each test checks the JSON report's contract, that auto-detection
loaded the stack's mapping file for both processes, and that the mappings
leave at most 5% of either side Uncategorized.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import qprof
from qprof.attribution.categories import CATEGORIES, UNCATEGORIZED

pytestmark = [pytest.mark.root, pytest.mark.slow]
# Mapping coverage is measured on sampling alone (probes=()): probe handlers'
# own cost is Uncategorized ("eBPF probes") and would blur what the mappings miss.

# endpoint name -> the runtime/library files that must load beside the stack file
STACKS = {"quicgo": ("go-runtime",), "aioquic": ("python",)}
# qprof's automatic unwinding choice: Go keeps frame pointers; CPython does not
UNWIND = {"quicgo": "fp", "aioquic": "dwarf"}
# share decided by rules naming only an object: none for Go (one static binary);
# for aioquic, cryptography's Rust/OpenSSL extension and aioquic's _buffer extension
MAX_DSO_ONLY = {"quicgo": 0.0, "aioquic": 0.05}
MAX_UNCATEGORIZED = 0.05


@pytest.mark.parametrize("name", sorted(STACKS))
def test_profiled_transfer_is_attributed(name: str, kernel_facing: None, endpoint_build, tmp_path: Path) -> None:
    from endpoints.transfer import profile

    built = endpoint_build(name)
    run, xfer = profile(built, out=tmp_path / "run", probes=())
    report = json.loads(qprof("report", str(run), "--format", "json").stdout)
    by_role = {p["role"]: p for p in report["processes"]}
    assert set(by_role) == {"server", "client"}, [p["role"] for p in report["processes"]]
    print(f"\n{name}: {xfer.client_output}, {xfer.goodput_gbps() or 0:.2f} Gbit/s profiled")
    unwinding = report["run"]["unwinding"]
    for role, p in sorted(by_role.items()):
        shares = p["categories"]
        print(f"  {role:6s} " + "  ".join(f"{c} {shares[c]:5.1%}" for c in CATEGORIES)
              + f"  (dso-only {p['dso_only_share']:.1%}, {p['samples']} samples)")
        # the report's contract
        assert set(shares) == set(CATEGORIES)
        assert abs(sum(shares.values()) - 1.0) < 0.001
        assert p["cpu_seconds"] > 0 and p["samples"] > 100
        assert unwinding[str(p["pid"])]["mode"] == UNWIND[name], unwinding
        # auto-detection: the stack file and its runtime file, named in the report
        loaded = {m["name"] for m in p["mappings"]}
        assert {built.spec.mapping, *STACKS[name]} <= loaded, loaded
        # the mappings cover the run
        top_unknown = [(s["symbol"], s["share"]) for s in p["top_symbols"][UNCATEGORIZED][:5]]
        assert shares[UNCATEGORIZED] <= MAX_UNCATEGORIZED, (role, shares[UNCATEGORIZED], top_unknown)
        assert shares["Packet I/O"] > 0.02 and shares["Crypto"] > 0.02, (role, shares)
        assert shares["Connection Mgmt"] > 0.05, (role, shares)
        assert p["dso_only_share"] <= MAX_DSO_ONLY[name], "no rule may cover a whole application binary"
        subs = p["subcategories"]["Crypto"]
        assert subs.get("aead", 0) > 0 and subs.get("header protection", 0) > 0, subs


@pytest.mark.parametrize("name", sorted(STACKS))
def test_cached_build_is_reused(name: str, endpoint_build) -> None:
    from endpoints.build import build

    first = endpoint_build(name)
    again = build(name)
    assert again.directory == first.directory and again.build_seconds == 0.0
    assert first.directory.is_dir() and not str(first.directory).startswith(str(Path(__file__).parent.parent))
