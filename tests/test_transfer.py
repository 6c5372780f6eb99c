"""One goodput, defined once (attribution.transfer), kept to in the timeline; attach's end of work
(--until-idle); coverage's suggestions, which never name a category they do not know."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import examples
from qprof.attribution.coverage import suggest
from qprof.attribution.mapping import parse_mapping
from qprof.attribution.packetio import PacketIO, ProcessPacketIO
from qprof.probes.packetio.estimate import Estimate
from qprof.attribution.tcp import ProcessTcp, TcpIO
from qprof.attribution.timeline import _rates, _within
from qprof.attribution.transfer import SPAN_FROM_PROC, SPAN_FROM_SAMPLES, transfer
from qprof.archive import schema
from qprof.archive.model import ProcReading, Traffic
from qprof.collectors.session import IdleWatch


def _reading(t: float, cpu: float = 0.0, udp: tuple[float, float] | None = None,
             tcp: tuple[float, float] | None = None, pid: int = 7) -> ProcReading:
    return schema.decode(ProcReading, {"mono": t, "threads": {str(pid): [
        {"tid": pid, "comm": "x", "utime_s": 0.0, "stime_s": 0.0, "on_cpu_s": cpu, "run_delay_s": 0.0}]},
        **({"udp": {str(pid): list(udp)}} if udp else {}), **({"tcp": {str(pid): list(tcp)}} if tcp else {})})


def test_idle_watch_dates_udp_bytes_by_when_the_probes_counted_them() -> None:
    """The probes print their UDP totals once a second: bytes that show up at a reading moved by the
    totals' own time, so the idle second starts there, not at the reading that first saw them."""
    w = IdleWatch([7], 1.0)
    w.see(_reading(0.0, 0.0, udp=(0, 0)))
    w.see(replace(_reading(0.25, 0.0, udp=(5e6, 0)), traffic=Traffic(udp={7: (5e6, 0)}, udp_through=0.1)))
    for t in (0.5, 0.75, 1.0):
        w.see(replace(_reading(t, 0.0, udp=(5e6, 0)), traffic=Traffic(udp={7: (5e6, 0)}, udp_through=0.1)))
        assert not w.ended(), t
    w.see(replace(_reading(1.1, 0.0, udp=(5e6, 0)), traffic=Traffic(udp={7: (5e6, 0)}, udp_through=1.05)))
    assert w.ended()  # idle since 0.1 s: taking the reading's time would wait until 1.25 s
    w.see(replace(_reading(1.35, 0.0, udp=(6e6, 0)), traffic=Traffic(udp={7: (6e6, 0)}, udp_through=1.3)))
    assert not w.ended()  # moved again by 1.3 s


def _udp(tx: int, rx: int, exact: bool = True) -> PacketIO:
    p = ProcessPacketIO(7)
    p.tx.bytes, p.rx.bytes = tx, rx
    if not exact:
        p.estimates["rx.bytes"] = Estimate(rx, rx * 0.98, rx * 1.02, False)
    return PacketIO({7: p}, {}, {}, {}, None, [])


def test_goodput_is_the_larger_direction_over_its_packet_span() -> None:
    t = transfer(7, _udp(3_000_000, 1_000_000_000, exact=False), None, (10_000_000_000, 12_500_000_000), [])
    assert (t.bytes, t.direction, t.protocol, t.counted) == (1_000_000_000, "received", "UDP", "estimated ±2.0%")
    assert t.seconds == pytest.approx(2.5) and t.gbps == pytest.approx(3.2)
    assert t.span_from == SPAN_FROM_SAMPLES and "QUIC headers and tags included" in t.describe()


def test_tcp_counts_and_old_archives_fall_back_to_the_proc_window() -> None:
    tcp = TcpIO({7: ProcessTcp(7, sent=268_800_000, received=40_000)}, {}, [], 0, "sock_diag")
    rs = [_reading(5.0), _reading(5.25), _reading(5.75)]
    t = transfer(7, None, tcp, None, rs)
    assert (t.bytes, t.direction, t.protocol, t.counted) == (268_800_000, "sent", "TCP", "exact")
    assert (t.start_s, t.end_s, t.span_from) == (5.0, 5.75, SPAN_FROM_PROC)
    assert t.gbps == pytest.approx(268_800_000 * 8 / 0.75 / 1e9)
    nothing = transfer(7, None, None, None, rs[:1])
    assert nothing.bytes is None and nothing.gbps is None and "no bytes" in nothing.describe()


def test_timeline_rates_are_kept_to_the_transfer_and_add_up_to_its_bytes() -> None:
    """UDP totals are printed about once a second, late: a 0.94 s transfer whose bytes show in two prints,
    the last after its end, is one average over its own span, summing to the report's estimate."""
    rs = [_reading(0.0), _reading(0.5), _reading(1.066, udp=(156e6, 0.5e6)), _reading(1.239, udp=(218.6e6, 0.8e6))]
    moved = transfer(7, _udp(279_772_680, 800_000), None, (176_000_000, 1_050_000_000), rs)
    rates, label = _rates(rs, 7, 0.0, (0.176, 1.05), moved)
    assert [(round(r.start_s, 3), round(r.end_s, 3)) for r in rates] == [(0.176, 1.05)]
    assert rates[0].sent_gbps == pytest.approx(moved.gbps) and label.startswith("UDP")
    # without a span, the printed intervals as they were
    rates, _ = _rates(rs, 7, 0.0)
    assert [(r.start_s, r.end_s) for r in rates] == [(0.0, 1.066), (1.066, 1.239)]


def test_final_totals_dated_before_the_transfers_end_still_reach_it() -> None:
    """A stop in the wait for the next sampling window dates the final UDP totals at the last sampled
    period's end, before the last packet: their bytes still run to the transfer's end, so the rates'
    mean over the timeline is the report's goodput (CI 2026-11-29 read it 1.6% high without this)."""
    rs = [_reading(0.0), replace(_reading(1.2, udp=(300e6, 0)), traffic=Traffic(udp={7: (300e6, 0)}, udp_through=1.0)),
          replace(_reading(2.4, udp=(500e6, 0)), traffic=Traffic(udp={7: (500e6, 0)}, udp_through=1.9))]
    moved = transfer(7, _udp(500_000_000, 0), None, (100_000_000, 2_200_000_000), rs)
    rates, _ = _rates(rs, 7, 0.0, (0.1, 2.2), moved)
    assert [(round(r.start_s, 3), round(r.end_s, 3)) for r in rates] == [(0.1, 1.0), (1.0, 2.2)]
    mean = sum((r.end_s - r.start_s) * r.sent_gbps for r in rates) / (2.2 - 0.1)
    assert mean == pytest.approx(moved.gbps)


@given(st.lists(st.tuples(st.floats(0.01, 2), st.floats(0, 1e9), st.floats(0, 1e9)), min_size=1, max_size=6),
       st.floats(0, 5), st.floats(0.01, 5))
@settings(max_examples=examples(300), deadline=None)
def test_kept_intervals_keep_every_byte(parts: list[tuple[float, float, float]], lo: float, width: float) -> None:
    moved, t = [], 0.0
    for dt, s, r in parts:
        moved.append([t, t + dt, s, r])
        t += dt
    kept = _within([list(m) for m in moved], lo, lo + width)
    assert sum(k[2] for k in kept) == pytest.approx(sum(m[2] for m in moved))
    assert sum(k[3] for k in kept) == pytest.approx(sum(m[3] for m in moved))
    assert all(k[1] > k[0] for k in kept)
    # one run of intervals from the first bytes (or lo) to hi: the rates' mean over them is the transfer's
    assert all(a[1] == b[0] for a, b in zip(kept, kept[1:])) and kept[-1][1] == lo + width
    assert kept[0][0] == lo  # the bytes count from 0 <= lo


def test_idle_watch_ends_after_the_work_not_before_it() -> None:
    w = IdleWatch([7, 8], 1.0)
    for t in (0.0, 0.25, 0.5):  # both idle from the start: nothing ended, nothing began
        w.see(schema.decode(ProcReading, {"mono": t, "threads": {"7": [], "8": []}}))
    assert not w.ended()
    cpu = {7: 0.0}
    for i in range(1, 13):  # pid 7 busy for 1 s, then idle; its bytes stop with it
        t = 0.5 + i * 0.25
        cpu[7] += 0.25 if i <= 4 else 0.001
        w.see(_reading(t, cpu[7], udp=(min(i, 4) * 1e6, 0)))
        assert w.ended() == (t - 1.5 >= 1.0), t


@given(st.text(min_size=1, max_size=30), st.sampled_from(["[kernel.kallsyms]", "/usr/lib/libx.so.1", "[unknown]"]),
       st.dictionaries(st.sampled_from(["Packet I/O", "Crypto", "Uncategorized / interrupts",
                                        "Uncategorized / runtime: tokio", "Uncategorized / application"]),
                       st.floats(0.01, 1), max_size=3))
@settings(max_examples=examples(300), deadline=None)
def test_coverage_never_names_a_category_it_does_not_know(symbol: str, dso: str, callers: dict[str, float]) -> None:
    """Whatever the symbol (quotes, control characters) and callers: no live `category =` line, and the
    rule, once a person uncomments it and picks a category, is valid TOML that matches the frame."""
    total = sum(callers.values()) or 1
    text = suggest(symbol, dso, {k: v / total for k, v in callers.items()})
    live = [ln for ln in text.split("\n") if not ln.startswith("#")]
    assert not any(re.match(r"\s*category\s*=", ln) for ln in live), text
    assert not live or live[0] == "[[rule]]" and live[-1] == "transparent = true", text
    if "kernel frame without a symbol" in text:
        return
    chosen = [ln.removeprefix("# ") for ln in text.split("\n")
              if ln.startswith("[[rule]]") or not ln.startswith("# ") or re.match(r"# (\[\[rule|symbol|dso|kernel|category)",
                                                                                   ln)]
    body = "\n".join(ln.replace('"..."', '"Crypto"') for ln in chosen)
    f = parse_mapping('[mapping]\nname = "t"\n' + body, "t.toml")
    (rule,) = f.rules
    assert rule.symbol is None or rule.symbol.search(symbol)


def test_coverage_lets_agreeing_callers_decide() -> None:
    text = suggest("_raw_spin_unlock_irqrestore", "[kernel.kallsyms]", {"Packet I/O": 0.93, "Crypto": 0.07})
    assert "its callers decide Packet I/O for 93% of its time" in text and text.endswith("transparent = true")
    mixed = suggest("handle_softirqs", "[kernel.kallsyms]", {"Packet I/O": 0.5, "Uncategorized / interrupts": 0.5})
    assert "none for 80% of its time" in mixed and "# category = " in mixed
    app = suggest("main", "/usr/bin/client", {"Uncategorized / application": 1.0}, "Uncategorized / application")
    assert "transparent" not in app, "callers that decide what it is now tell nothing new"
