"""The timeline: CPU by category per 100 ms and goodput, from a hand-made archive with known answers
(`report --timeline`, text and JSON), and from a real ngtcp2 transfer drawn in the HTML flame graph page
and checked in headless Chromium (the page's areas and line against the report's own timeline)."""

from __future__ import annotations

import json
import os
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from conftest import qprof
from qprof import runfiles
from qprof.attribution.categories import CATEGORIES, CRYPTO, PACKET_IO
from qprof import archive
from qprof.archive.model import STATUS_COMPLETE, Meta, Sampling, Target
from qprof.archive import schema
from qprof.collectors.traffic import udp_totals
from qprof.probes.packetio.maps import Windows
from qprof.archive.stacks import Sample, fold, write_stacks

K = "[kernel.kallsyms]"
GNUTLS = "/usr/lib/x86_64-linux-gnu/libgnutls.so.30.36.0"
SEND = (("udp_sendmsg", K), ("__sys_sendmsg", K))
SEAL = (("gnutls_cipher_encrypt2", GNUTLS),)
MS = 1_000_000
T0 = 5000.0  # the run's first /proc reading, CLOCK_MONOTONIC seconds


def _reading(t: float, sent: int) -> dict[str, Any]:
    return {"t": 1.7e9 + t, "mono": T0 + t, "threads": {"7": [{"tid": 7, "comm": "srv", "state": "R",
                                                                "utime_s": t, "stime_s": 0.0, "cpu": 0}]},
            "tcp": {"7": [sent, 100]}}


@pytest.fixture
def run(tmp_path: Path, user_config: Path) -> Path:
    """0.0-0.2 s: sending only (100 samples of 1 ms in each 100 ms bin: one core); 0.2-0.3 s: half a core of
    Crypto; 0.3-0.5 s: nothing. TCP: 125 MB sent in the first 0.25 s (4 Gbit/s), then 0."""
    path = tmp_path / "run"
    path.mkdir()
    archive.write_meta(path, Meta(status=STATUS_COMPLETE, sampling=Sampling(frequency=999, clock="monotonic"),
                                  targets=[Target(7, "srv", "server")]))
    first_bin = int(T0 * 10)
    samples = [Sample(7, 7, "srv", MS, SEND, first_bin + b) for b in (0, 1) for _ in range(100)]
    samples += [Sample(7, 7, "srv", MS, SEAL, first_bin + 2) for _ in range(50)]
    write_stacks(path / runfiles.STACKS, fold(samples))
    lines = [_reading(0.0, 0), _reading(0.25, 125_000_000), _reading(0.5, 125_000_000)]
    (path / runfiles.PROC).write_text("".join(json.dumps(r) + "\n" for r in lines))
    return path


def test_report_timeline_json_has_the_known_answer(run: Path) -> None:
    doc = json.loads(qprof("report", str(run), "--format", "json", "--timeline").stdout)
    tl = doc["timeline"]
    assert tl["aligned"] and tl["bin_s"] == 0.1 and tl["bins"] == 6
    (t,) = tl["targets"]
    assert (t["pid"], t["role"], t["traffic"]) == (7, "server", "TCP")
    assert t["cpu_cores"][PACKET_IO] == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    assert t["cpu_cores"][CRYPTO] == [0.0, 0.0, 0.5, 0.0, 0.0, 0.0]
    assert set(t["cpu_cores"]) == set(CATEGORIES)
    # the running totals changed once: 125 MB over 0.25 s is 4 Gbit/s sent; the receive total never moved
    assert t["rates"] == [{"start_s": 0.0, "end_s": 0.25, "sent_gbps": 4.0, "received_gbps": 0.0}]
    assert t["goodput_gbps"] == [[0.0, 0.25, 4.0]]
    # the bins add up to the report's CPU time per category
    proc = doc["processes"][0]
    for c in CATEGORIES:
        assert sum(t["cpu_cores"][c]) * tl["bin_s"] == pytest.approx(proc["category_cpu_seconds"][c])


def test_totals_start_at_zero_before_their_first_reading(run: Path) -> None:
    """UDP totals come with the probes' first print, ~1 s in: a short transfer may change them once,
    and that change is still a rate, from the run's first reading."""
    lines = [_reading(0.0, 0), _reading(0.25, 125_000_000), _reading(0.5, 125_000_000)]
    del lines[0]["tcp"]
    (run / runfiles.PROC).write_text("".join(json.dumps(r) + "\n" for r in lines))
    (t,) = json.loads(qprof("report", str(run), "--format", "json", "--timeline").stdout)["timeline"]["targets"]
    assert t["goodput_gbps"] == [[0.0, 0.25, 4.0]]


def test_udp_totals_are_placed_where_they_count_up_to(run: Path) -> None:
    """The probes' UDP totals count up to their last whole sampling period, up to ~1.5 s before the
    reading that sees them: their bytes belong there, not to the interval up to the reading."""
    lines = [_reading(0.0, 0), _reading(0.5, 125_000_000), _reading(0.75, 125_000_000)]
    for r in lines:
        r["udp"], r["udp_through"] = r.pop("tcp"), r["mono"] - 0.25
    lines[0].pop("udp_through")  # nothing printed yet: the run's first reading
    (run / runfiles.PROC).write_text("".join(json.dumps(r) + "\n" for r in lines))
    (t,) = json.loads(qprof("report", str(run), "--format", "json", "--timeline").stdout)["timeline"]["targets"]
    assert t["goodput_gbps"] == [[0.0, 0.25, 4.0]]  # 125 MB through 0.25 s, not over the 0.5 s to the reading


@pytest.mark.root
@pytest.mark.slow
def test_last_reading_holds_the_probes_final_totals(ngtcp2_capture: Any) -> None:
    """The run's last /proc reading is taken after the probes' last print (the final UDP totals), and
    the timeline's last goodput interval reads like the others: its bytes are those counted through
    the transfer's end, not a second's squeezed into the part of an interval before it."""
    run = ngtcp2_capture("gso")
    maps = json.loads((run / runfiles.PROBES).read_text())["programs"]["packetio"]["maps"]
    final, through = udp_totals(maps)
    # the totals read from the processes' groups alone are the whole map's, threads' groups included
    whole = schema.probe_maps(maps)["@windows"]
    assert isinstance(whole, Windows) and any("," in k for k in whole.groups)
    for pid, (sent, received) in final.items():
        sample = whole.sample(str(pid))
        assert sample is not None
        totals = sample.totals(list(sample.sum))
        assert (sent, received) == (round(max(0.0, totals["tx_bytes"])), round(max(0.0, totals["rx_bytes"])))
    last = json.loads((run / runfiles.PROC).read_text().splitlines()[-1])
    assert final and {int(p): tuple(v) for p, v in last["udp"].items()} == final
    assert through is not None and last["udp_through"] == through <= last["mono"]
    targets = json.loads(qprof("report", str(run), "--format", "json", "--timeline").stdout)["timeline"]["targets"]
    for t in targets:
        spans = t["goodput_gbps"]
        overall = sum(g * (b - a) for a, b, g in spans) / sum(b - a for a, b, _ in spans)
        print(f"pid {t['pid']}: {len(spans)} intervals, the last {spans[-1][2]:.2f} Gbit/s of {overall:.2f} overall:",
              spans)
        # The squeezed interval read a whole interval's bytes over the last one's d seconds: 1/d times its
        # rate. A transfer's one-second rates drift (CI, 2026-11-28: 1.17, 1.19, 1.51, then 2.13 over the
        # last 0.28 s, on a host taking the VM's CPUs away), and a short interval's rate varies more: the
        # bound is the geometric middle, sqrt(1/d) times the interval before it, and at least 1.5 times.
        # (CI, 2026-11-29: 1.19 then 1.83 over the last 0.67 s. The loader stretched the last sampled
        # period to the stop, weighing its window by time after the transfer's end, up to ~1.5x; it ends
        # at its own end now (probes/packetio/sampler.py, _commit). CI again that day: 1.10 then 1.80 over
        # the last 0.68 s. The running totals were the windows' plain sums, which follow the few windows of
        # each second: one run here read 1.64, 1.19, 1.86 Gbit/s while the namespace's exact counters read
        # 1.40, 1.56, 1.33 and the server's CPU was flat. They are the estimator's now, scaled to those
        # counters (collectors/traffic.py udp_totals): 6 captures here after, 12 targets, at most 1.27x.)
        assert len(spans) >= 2, spans
        (a, b, rate), before = spans[-1], spans[-2][2]
        assert rate <= max(1.5, (1 / (b - a)) ** 0.5) * before, spans


def test_report_timeline_text(run: Path) -> None:
    out = qprof("report", str(run), "--timeline", env={**os.environ, "COLUMNS": "200"}).stdout
    assert "timeline of srv (pid 7, server): CPU cores by category per 0.1 s; goodput from TCP" in out
    rows = [ln for ln in out.splitlines() if re.match(r"^\s+0\.[0-5]\s", ln)]
    assert len(rows) == 6
    cells = [[c.strip() for c in r.split("│")] for r in rows]
    assert cells[0][1] == "1.00" and cells[0][-1] == "4.00"  # Packet I/O one core, 4 Gbit/s
    assert cells[2][2] == "0.50" and cells[2][-1] == "2.00"  # Crypto half a core; 4 Gbit/s for half the slice
    assert cells[3][-2] == "0.00" and cells[3][-1] == ""  # no CPU, no rate


def test_timeline_needs_text_or_json_and_old_runs_say_why(run: Path) -> None:
    r = qprof("report", str(run), "--timeline", "--format", "folded", check=False)
    assert r.returncode == 2 and "--timeline goes with --format text or json" in r.stderr
    old = archive.Run.open(run)
    old.meta.sampling.clock = None  # a run recorded before sample times were on the readings' clock
    old.save_meta()
    doc = json.loads(qprof("report", str(run), "--format", "json", "--timeline").stdout)["timeline"]
    assert not doc["aligned"] and doc["bins"] == 3 and doc["targets"][0]["rates"] == []
    assert "no common clock" in qprof("report", str(run), "--timeline").stdout


class Timeline(HTMLParser):
    """The page's timeline after its scripts ran: per chart (data-pid) its areas by category (path data)
    and whether it drew a goodput line."""

    def __init__(self) -> None:
        super().__init__()
        self.charts: dict[str, dict[str, Any]] = {}
        self._cur: dict[str, Any] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        cls = (a.get("class") or "").split()
        if tag == "svg" and "tl-chart" in cls:
            self._cur = self.charts[str(a.get("data-pid"))] = {"areas": {}, "goodput": None}
        elif self._cur is not None and tag == "path" and "tl-area" in cls:
            self._cur["areas"][a.get("data-category")] = (a.get("d") or "", a.get("fill"))
        elif self._cur is not None and tag == "path" and "tl-goodput" in cls:
            self._cur["goodput"] = a.get("d") or ""


def _heights(d: str) -> list[float]:
    """The y coordinates an area's path visits (its top edge, then its bottom)."""
    return [float(y) for y in re.findall(r"[ML,][\d.e+-]+,([\d.e+-]+)", d.replace("Z", ""))]


@pytest.mark.root
@pytest.mark.slow
def test_html_timeline_in_chromium(ngtcp2_capture: Any, tmp_path: Path) -> None:
    from test_flamegraph_real import assert_not_blank, browse, family_pixels

    run = ngtcp2_capture("gso")
    page = tmp_path / "all.html"
    qprof("flamegraph", str(run), "-o", str(page))
    doc = json.loads(qprof("report", str(run), "--format", "json", "--timeline").stdout)
    tl = doc["timeline"]
    assert tl["aligned"] and tl["bins"] >= 10
    p = Timeline()
    p.feed(browse(page.as_uri(), tmp_path))
    assert set(p.charts) == {str(t["pid"]) for t in tl["targets"]}
    for t in tl["targets"]:
        chart = p.charts[str(t["pid"])]
        assert set(chart["areas"]) == set(CATEGORIES)
        # categories with at least 5% of the target's CPU in the timeline: server and client share one
        # CPU, and bins before and after the transfer are idle, so a share, not cores, says which are
        # busy (Crypto 14-20% of each side in 4 captures, 0.066-0.093 cores a bin: a 0.05-core floor
        # failed fresh-clone run112)
        total = sum(sum(t["cpu_cores"][c]) for c in CATEGORIES)
        busy = [c for c in CATEGORIES if sum(t["cpu_cores"][c]) >= 0.05 * total]
        assert PACKET_IO in busy and CRYPTO in busy, {c: sum(t["cpu_cores"][c]) / total for c in CATEGORIES}
        for c in busy:  # an area with CPU time spans a height; an empty one is flat
            ys = _heights(chart["areas"][c][0])
            assert ys and max(ys) - min(ys) > 1, c
        # the transfer moved bytes: the goodput line was drawn from the readings' totals
        assert t["goodput_gbps"] and chart["goodput"], t["traffic"]
        print(f"\n{t['comm']}: {tl['bins']} bins, goodput from {t['traffic']}, peak "
              f"{max(g for _, _, g in t['goodput_gbps']):.2f} Gbit/s, peak CPU "
              f"{max(sum(t['cpu_cores'][c][i] for c in CATEGORIES) for i in range(tl['bins'])):.2f} cores")
    shot = tmp_path / "timeline.png"
    browse(page.as_uri(), tmp_path, screenshot=shot)
    assert_not_blank(shot)
    from PIL import Image

    top = tmp_path / "top.png"
    Image.open(shot).crop((0, 0, 1400, 480)).save(top)  # the timeline sits above the flame graph
    assert family_pixels(top, PACKET_IO) > 1500 and family_pixels(top, CRYPTO) > 500
