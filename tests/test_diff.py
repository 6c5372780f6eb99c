"""`qprof diff`: small hand-made archives with known answers (matching, shares, CPU per GB, the
differential flame graph's colours, what it says when nothing matches or bytes are unknown), and two real
ngtcp2 transfers, the server's default GSO sends against GSO off (--max-gso-dgrams=1: one datagram per
sendmsg), where it must find the server's Packet I/O grown.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from conftest import qprof, shell_mode
from test_bad_input import one_line_error
from test_flamegraph import SVG
from test_flamegraph_real import report_of, role_of
from qprof import runfiles
from qprof.attribution.categories import PACKET_IO
from qprof import archive
from qprof.archive.model import STATUS_COMPLETE, Meta, Sampling, Target
from qprof.archive.stacks import Sample, fold, write_stacks

K = "[kernel.kallsyms]"
LIBC = "/usr/lib/x86_64-linux-gnu/libc.so.6"
GNUTLS = "/usr/lib/x86_64-linux-gnu/libgnutls.so.30.36.0"
NGTCP2 = "/usr/lib/x86_64-linux-gnu/libngtcp2.so.16.0.0"
SEND = (("ip_output", K), ("udp_sendmsg", K), ("__sys_sendmsg", K), ("__libc_sendmsg", LIBC),
        ("ngtcp2_conn_write_pkt", NGTCP2))
SEAL = (("gnutls_cipher_encrypt2", GNUTLS), ("ngtcp2_conn_write_pkt", NGTCP2))
MS = 1_000_000  # one sample's period: 1 ms of CPU


pytestmark = pytest.mark.usefixtures("user_config")


def make_run(path: Path, procs: list[dict[str, Any]]) -> Path:
    """A run archive: each proc has pid, comm, role, `send`/`seal` sample counts and `bytes` (UDP bytes sent,
    as the packetio probes count them; None: no probes ran)."""
    path.mkdir()
    archive.write_meta(path, Meta(status=STATUS_COMPLETE, sampling=Sampling(frequency=999),
                                  targets=[Target(p["pid"], p["comm"], p.get("role")) for p in procs]))
    samples = [Sample(p["pid"], p["pid"], p["comm"], MS, stack)
               for p in procs for stack, n in ((SEND, p["send"]), (SEAL, p["seal"])) for _ in range(n)]
    write_stacks(path / runfiles.STACKS, fold(samples))
    counted = [p for p in procs if p.get("bytes") is not None]
    if counted:
        maps = {"@tx_bytes": {f"{p['pid']},{p['pid']},4433": p["bytes"] for p in counted}}
        archive.write_json_atomic(path / runfiles.PROBES, {"programs": {"packetio": {"maps": maps}}})
    return path


def server(pid: int, send: int, seal: int, nbytes: int | None = 10**9, comm: str = "gtlsserver",
           role: str | None = "server") -> dict[str, Any]:
    return {"pid": pid, "comm": comm, "role": role, "send": send, "seal": seal, "bytes": nbytes}


def test_shares_cpu_per_gb_and_symbols(tmp_path: Path) -> None:
    a = make_run(tmp_path / "a", [server(10, send=4, seal=4, nbytes=2 * 10**9)])
    b = make_run(tmp_path / "b", [server(20, send=8, seal=4)])
    d = json.loads(qprof("diff", str(a), str(b), "--format", "json").stdout)
    assert d["match_by"] == "role" and d["notes"] == [] and d["unmatched"] == {"a": [], "b": []}
    (p,) = d["pairs"]
    assert p["key"] == "server" and (p["a"]["pid"], p["b"]["pid"]) == (10, 20)
    assert (p["a"]["udp_bytes"], p["b"]["udp_bytes"]) == (2 * 10**9, 10**9)
    cats = {c["category"]: c for c in p["categories"]}
    pio, crypto = cats["Packet I/O"], cats["Crypto"]
    assert (pio["share_a"], pio["share_b"]) == (0.5, pytest.approx(2 / 3, abs=1e-6))
    assert pio["delta_pp"] == pytest.approx(100 / 6, abs=1e-4)
    assert (pio["cpu_seconds_a"], pio["cpu_seconds_b"]) == (0.004, 0.008)
    # 4 ms over 2 GB, 8 ms over 1 GB
    assert (pio["cpu_seconds_per_gb_a"], pio["cpu_seconds_per_gb_b"]) == (0.002, 0.008)
    assert pio["delta_cpu_seconds_per_gb"] == pytest.approx(0.006)
    assert crypto["delta_pp"] == pytest.approx(-100 / 6, abs=1e-4)
    assert crypto["cpu_seconds_per_gb_a"] == 0.002 and crypto["cpu_seconds_per_gb_b"] == 0.004
    assert [(s["symbol"], round(s["delta_pp"], 3)) for s in p["symbols"]] == \
        [("ip_output", 16.667), ("gnutls_cipher_encrypt2", -16.667)]
    text = qprof("diff", str(a), str(b)).stdout
    assert "server" in text and "50.0 → 66.7" in text and "+16.7" in text and "0.002 → 0.008" in text


def test_differential_flame_graph_colours(tmp_path: Path) -> None:
    a = make_run(tmp_path / "a", [server(10, send=4, seal=4)])
    b = make_run(tmp_path / "b", [server(20, send=8, seal=4)])
    out = tmp_path / "d.svg"
    qprof("diff", str(a), str(b), "-o", str(out))
    assert out.stat().st_mode & 0o777 == shell_mode()  # made to be shared, as the shell makes files
    doc = ET.parse(out).getroot()
    frames = {g.get("data-name"): g for g in doc.iter(f"{SVG}g") if g.get("class") == "f"}
    fill = {n: g.find(f"{SVG}rect").get("fill") for n, g in frames.items()}  # type: ignore[union-attr]
    # the send path grew 16.7 pp, the AEAD call shrank as much: the largest changes, full red and blue
    assert fill["ip_output_[k]"] == fill["__libc_sendmsg"] == "#ff0000"
    assert fill["gnutls_cipher_encrypt2"] == "#0000ff"
    assert fill["ngtcp2_conn_write_pkt"] == fill["server"] == "#e8e8e8"  # all of both runs: unchanged
    width = {n: float(g.find(f"{SVG}rect").get("width"))  # type: ignore[union-attr,arg-type]
             for n, g in frames.items()}
    assert width["ip_output_[k]"] == pytest.approx(2 * width["gnutls_cipher_encrypt2"], abs=0.02)  # run B's time
    tip = frames["ip_output_[k]"].find(f"{SVG}title").text  # type: ignore[union-attr]
    assert "B: 8 samples, 66.67%" in tip and "A: 50.00%" in tip and "change: +16.67 pp" in tip  # type: ignore[operator]


def test_matching_by_comm_duplicates_and_unknown_bytes(tmp_path: Path) -> None:
    a = make_run(tmp_path / "a", [server(10, 2, 2, role=None), server(11, 1, 1, role=None, comm="other")])
    b = make_run(tmp_path / "b", [server(20, 3, 1, nbytes=None), server(21, 1, 3, nbytes=None),
                                  server(22, 1, 1, comm="third", nbytes=None)])
    d = json.loads(qprof("diff", str(a), str(b), "--format", "json").stdout)
    assert d["match_by"] == "comm"  # A has no roles
    assert [(p["key"], p["a"]["pid"], p["b"]["pid"]) for p in d["pairs"]] == [("gtlsserver", 10, 20)]
    assert d["unmatched"] == {"a": ["other"], "b": ["gtlsserver #2", "third"]}
    (p,) = d["pairs"]
    assert p["b"]["udp_bytes"] is None
    assert all(c["cpu_seconds_per_gb_b"] is None and c["delta_cpu_seconds_per_gb"] is None for c in p["categories"])
    assert any("no byte counts for gtlsserver" in n for n in d["notes"])
    assert any("only in" in n and "gtlsserver #2" in n for n in d["notes"])
    text = qprof("diff", str(a), str(b)).stdout
    assert "Δ s/GB" not in text and "no byte counts" in text  # no per-GB columns without both byte counts


def test_nothing_to_compare_and_bad_arguments(tmp_path: Path) -> None:
    a = make_run(tmp_path / "a", [server(10, 1, 1, role=None, comm="alpha")])
    b = make_run(tmp_path / "b", [server(20, 1, 1, role=None, comm="beta")])
    one_line_error(qprof("diff", str(a), str(b), check=False), "nothing to compare", "alpha", "beta", "comm name")
    one_line_error(qprof("diff", str(a), str(a), "--top", "0", check=False), "--top must be at least 1")
    one_line_error(qprof("diff", str(a), str(a), "-o", str(tmp_path / "d.html"), check=False),
                   "unknown output format '.html'", ".svg")
    one_line_error(qprof("diff", str(a), str(tmp_path / "nope"), check=False), "not a run directory")


@pytest.mark.root
@pytest.mark.slow
def test_diff_finds_the_cost_of_turning_gso_off(ngtcp2_capture: Any, tmp_path: Path) -> None:
    a, b = ngtcp2_capture("gso"), ngtcp2_capture("no-gso")
    ra, rb = report_of(a), report_of(b)
    sa, sb = role_of(ra, "server"), role_of(rb, "server")
    # the setting took effect, as the probes saw it
    assert ra["packet_io"]["processes"][str(sa["pid"])]["gso"]["gso_sends"] > 0
    assert rb["packet_io"]["processes"][str(sb["pid"])]["gso"]["gso_sends"] == 0
    svg = tmp_path / "diff.svg"
    d = json.loads(qprof("diff", str(a), str(b), "--format", "json", "-o", str(svg)).stdout)
    assert d["match_by"] == "role" and [p["key"] for p in d["pairs"]] == ["server", "client"]
    srv = d["pairs"][0]
    assert (srv["a"]["pid"], srv["b"]["pid"]) == (sa["pid"], sb["pid"])
    cats = {c["category"]: c for c in srv["categories"]}
    pio = cats[PACKET_IO]
    print(f"\nserver Packet I/O: {pio['share_a']:.1%} -> {pio['share_b']:.1%} ({pio['delta_pp']:+.1f} pp), "
          f"{pio['cpu_seconds_per_gb_a']:.3f} -> {pio['cpu_seconds_per_gb_b']:.3f} CPU s/GB")
    assert pio["share_a"] == pytest.approx(sa["categories"][PACKET_IO], abs=1e-6)
    assert pio["share_b"] == pytest.approx(sb["categories"][PACKET_IO], abs=1e-6)
    assert pio["delta_pp"] > 5, "one datagram per sendmsg costs the server a larger share in Packet I/O"
    assert pio["cpu_seconds_per_gb_b"] > 1.5 * pio["cpu_seconds_per_gb_a"] > 0
    assert srv["a"]["udp_bytes"] >= 512 << 20 and srv["b"]["udp_bytes"] >= 512 << 20
    assert sum(c["delta_pp"] for c in srv["categories"]) == pytest.approx(0, abs=1e-3)
    # the differential flame graph: the server's send path is red (grew)
    doc = ET.parse(svg).getroot()
    frames = [g for g in doc.iter(f"{SVG}g") if g.get("class") == "f"]
    sends = [g for g in frames if g.get("data-name") == "__sys_sendmsg_[k]"]
    fills = [g.find(f"{SVG}rect").get("fill") for g in sends]  # type: ignore[union-attr]
    print("__sys_sendmsg_[k] frames:", fills)
    top = max(sends, key=lambda g: float(g.find(f"{SVG}rect").get("width")))  # type: ignore[union-attr,arg-type]
    rgb = top.find(f"{SVG}rect").get("fill")  # type: ignore[union-attr]
    assert rgb is not None and rgb.startswith("#ff") and rgb[3:5] == rgb[5:7] != "ff", rgb
    assert "change: +" in (top.find(f"{SVG}title").text or "")  # type: ignore[union-attr]
    text = qprof("diff", str(a), str(b), "--top", "3").stdout
    assert "server" in text and "Packet I/O" in text and "CPU s/GB" in text
