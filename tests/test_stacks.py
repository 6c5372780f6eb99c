"""quinn, s2n-quic, quiche, tquic, quic-go and aioquic, and quinn and s2n-quic on tokio's multi-thread
runtime: a real profiled bulk transfer per stack, both ends attached.

The endpoints are small programs under lab/endpoints/ (specs_rust.py,
specs_go_python.py), built into a cache outside the repository and reused while
their sources and toolchain are unchanged. Each test checks the JSON report's
contract, that auto-detection loaded the stack's mapping file and its crypto and
runtime files for both processes (and no other stack's), that the mappings leave
at most 5% of either side Uncategorized beside what they name as the program's own
code or its language runtime (the Go scheduler, tokio, asyncio: Uncategorized /
"runtime: ...", "application"), and that packet I/O and crypto are both seen. Both ends are
attached as users attach them, default probes on: their handlers' frames
(Uncategorized / "eBPF probes") count against the 5% and may be at most 2% of
each side's samples on their own. On the multi-threaded stacks (quic-go with its default GOMAXPROCS,
the tokio multi-thread endpoints) the thread view must find the runtime's pools, name the same
busiest thread as the verdict, and measure the handoffs between the threads; their waits and
switches are placed (the 5% holds for them too).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import ROOT, at_least, at_most, qprof
from qprof.attribution.profile import PROBE_SHARE_LIMIT
from qprof.viewer.json_report import unplaced_share
from qprof.attribution.categories import CATEGORIES, UNCATEGORIZED, is_named_other

pytestmark = [pytest.mark.root, pytest.mark.slow]

MAX_UNCATEGORIZED = 0.05
CRYPTO_FILES = {"ring", "rustls", "aws-lc", "boringssl", "crypto"}


@dataclass(frozen=True)
class Expect:
    files: tuple[str, ...]  # the library/runtime mapping files that must load beside the stack file
    unwind: str  # qprof's automatic unwinding choice for both processes
    max_dso_only: float = 0.0  # share decided by rules naming only an object
    extra_crypto: frozenset[str] = frozenset()  # crypto files that may load beside `files`
    hp_both_sides: bool = True  # header protection seen on the sender too
    runtime: str | None = None  # the language runtime's named part of Uncategorized, seen on both sides
    pools: frozenset[str] = frozenset()  # thread pools the thread view must find on both sides (multi-threaded)


# The Rust endpoints are built with frame pointers but link glibc dynamically, whose
# malloc/free and memcpy have none: `auto` chooses DWARF so those samples keep their
# callers (with frame pointers, ~3% of quiche's client lost its callers). Their
# senders' header protection (one AES block per packet, 0.1-1.7%) is too small to be
# sure of a sample in a short run. Go keeps frame pointers; CPython does not.
STACKS = {
    "quinn": Expect(("ring", "rustls", "tokio", "rust-std"), "dwarf", hp_both_sides=False, runtime="runtime: tokio"),
    "s2nquic": Expect(("aws-lc", "tokio", "rust-std"), "dwarf", hp_both_sides=False, runtime="runtime: tokio"),
    # tokio's default multi-thread runtime: a worker per CPU, tasks handed between them
    "quinn-mt": Expect(("ring", "rustls", "tokio", "rust-std"), "dwarf", hp_both_sides=False,
                       runtime="runtime: tokio", pools=frozenset({"tokio workers"})),
    "s2nquic-mt": Expect(("aws-lc", "tokio", "rust-std"), "dwarf", hp_both_sides=False, runtime="runtime: tokio",
                         pools=frozenset({"tokio workers"})),
    "quiche": Expect(("boringssl", "rust-std"), "dwarf", hp_both_sides=False),
    # payload AEAD in BoringSSL; its header protection in ring is detected only when a sample
    # lands there (statically linked: detection reads the run's symbols), not in every short run
    "tquic": Expect(("boringssl", "rust-std"), "dwarf", extra_crypto=frozenset({"ring"}), hp_both_sides=False),
    "quicgo": Expect(("go-runtime",), "fp", runtime="runtime: go scheduler", pools=frozenset({"Go Ms"})),
    # OpenSSL's libcrypto through cryptography; its Rust extension and aioquic's _buffer
    # extension are matched by object
    "aioquic": Expect(("python", "crypto"), "dwarf", max_dso_only=0.05, runtime="runtime: asyncio"),
}


@pytest.mark.parametrize("name", sorted(STACKS))
def test_profiled_transfer_is_attributed(name: str, kernel_facing: None, endpoint_build, tmp_path: Path) -> None:
    from lab.endpoints.transfer import profile

    want = STACKS[name]
    built = endpoint_build(name)
    run, xfer = profile(built, out=tmp_path / "run", unwind="auto")
    report = json.loads(qprof("report", str(run), "--format", "json").stdout)
    by_role = {p["role"]: p for p in report["processes"]}
    assert set(by_role) == {"server", "client"}, [p["role"] for p in report["processes"]]
    print(f"\n{name}: {xfer.client_output}, {xfer.goodput_gbps() or 0:.2f} Gbit/s profiled")
    unwinding = report["run"]["unwinding"]
    hp: dict[str, float] = {}  # header protection samples per side
    for role, p in sorted(by_role.items()):
        shares = p["categories"]
        named = {s: v for s, v in p["subcategories"][UNCATEGORIZED].items() if is_named_other(s)}
        unplaced = unplaced_share(p)
        print(f"  {role:6s} " + "  ".join(f"{c} {shares[c]:5.1%}" for c in CATEGORIES)
              + f"  (unplaced {unplaced:.1%}, skid {p['interrupt_skid'].get('share', 0):.1%}; "
              + "".join(f"{s} {v:.1%}, " for s, v in named.items())
              + f"eBPF probes {p['probe_share']:.2%}, other eBPF programs {p['other_bpf_share']:.2%}, dso-only {p['dso_only_share']:.1%}, {p['samples']} samples, "
              f"unwind {unwinding[str(p['pid'])]['mode']})")
        # the report's contract
        assert set(shares) == set(CATEGORIES)
        assert abs(sum(shares.values()) - 1.0) < 0.001
        assert p["cpu_seconds"] > 0 and p["samples"] > 100
        assert unwinding[str(p["pid"])]["mode"] == want.unwind, unwinding
        # auto-detection: the stack file and its crypto/runtime files, named in the report
        loaded = {m["name"] for m in p["mappings"]}
        assert {built.spec.mapping, *want.files} <= loaded, loaded
        # ... and no other stack's or crypto library's file
        assert {m["name"] for m in p["mappings"] if m["kind"] == "stack"} == {built.spec.mapping}, loaded
        assert loaded & CRYPTO_FILES <= set(want.files) & CRYPTO_FILES | want.extra_crypto, loaded
        # the mappings cover the run; statically linked crypto is matched by symbols, not by the binary
        top_unknown = [(s["symbol"], s["share"]) for s in p["top_symbols"][UNCATEGORIZED][:5]]
        assert unplaced <= MAX_UNCATEGORIZED, (role, unplaced, top_unknown)
        n = p["samples"]
        assert at_most(p["probe_share"], PROBE_SHARE_LIMIT, n), (role, p["probe_share"], n)
        assert at_least(shares["Packet I/O"], 0.02, n) and at_least(shares["Crypto"], 0.02, n), (role, shares)
        assert at_least(shares["Connection Mgmt"], 0.05, n), (role, shares)
        if want.runtime:  # runtime overhead is named apart, not counted as connection management
            assert named.get(want.runtime, 0) > 0, (role, p["subcategories"][UNCATEGORIZED])
        assert p["dso_only_share"] <= want.max_dso_only, "no rule may cover a whole application binary"
        subs = p["subcategories"]["Crypto"]
        assert at_least(subs.get("aead", 0), 0.02, n), (n, subs)
        hp[role] = subs.get("header protection", 0) * n  # samples
        if role == "client" and not want.hp_both_sides:
            assert hp[role] > 0, subs
        if want.pools:
            _check_thread_view(role, p, report["verdict"]["evidence"][role], want)
    # header protection on both sides: 0.08-0.6% of each quic-go side (4 transfers today), 1-8
    # samples, and 0 on one side of 8 (fresh-clone run124: the server): seen in the two together
    assert not want.hp_both_sides or sum(hp.values()) > 0, hp


def _check_thread_view(role: str, p: dict, evidence: dict, want: Expect) -> None:
    """A multi-threaded side: its runtime's pools found, one busiest thread everywhere, handoffs measured."""
    view = p["thread_view"]
    pools = {pool["name"]: pool for pool in view["pools"]}
    # a thread born and gone between two /proc readings is in the samples only: its pool's CPU may be unknown
    print(f"    threads: " + "; ".join(f"{n} x{pool['threads']} {pool['on_cpu_s'] or 0:.2f} s" for n, pool in pools.items())
          + f"; cores {view['cores_mean']:.2f} (peak {view['cores_peak']:.2f}); handoffs "
          f"{view['handoffs']['cpu_s_per_gb']:.2f} CPU s/GB, {view['handoffs']['wakeups_per_datagram']:.2f} "
          "wakeups/datagram")
    assert want.pools <= set(pools), (role, sorted(pools))
    assert sum(pool["threads"] for pool in pools.values()) > 1
    assert view["busiest_tid"] == evidence["busiest_tid"] == view["threads"][0]["tid"], "one busiest thread"
    assert evidence["busiest_pool"] in pools
    assert view["handoffs"]["cpu_s_per_gb"] > 0 and view["handoffs"]["wakeups_per_datagram"] > 0


@pytest.mark.parametrize("name", sorted(STACKS))
def test_cached_build_is_reused(name: str, endpoint_build) -> None:
    from lab.endpoints.build import build

    first = endpoint_build(name)
    again = build(name)
    assert again.directory == first.directory and again.build_seconds == 0.0
    assert first.directory.is_dir() and not str(first.directory).startswith(str(ROOT))
