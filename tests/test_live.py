"""The live panel of `qprof attach`: rates from counters (unit), and the real panel on a terminal."""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import QPROF, examples
from qprof.attribution.live import LiveMonitor
from qprof.archive import schema
from qprof.archive.model import LiveData, ProcReading, Target
from qprof.probes.packetio import windows

TARGETS = (Target(10, "srv", "server"),)


def _data(mono: float, on_cpu: dict[int, float], tx: int, txb: int, skbs: int, rx: int, sirq: float) -> LiveData:
    reading = schema.decode(ProcReading, {"mono": mono, "threads": {"10": [
        {"tid": t, "comm": "srv", "on_cpu_s": s, "utime_s": 0, "stime_s": 0} for t, s in on_cpu.items()]}})
    maps = {"@tx_dgrams": {"10,11": tx}, "@tx_bytes": {"10,11": txb}, "@tx_skbs": {"10,11": skbs},
            "@rx_msgs": {"10,12,4433": rx}, "@rx_bytes": {"10,12": rx * 100}, "@udp_drops": {"2,4433": 7}}
    return LiveData(mono, 30.0, reading, maps, {"0": sirq, "1": sirq}, TARGETS)


def test_rates_are_counter_differences_over_the_reading_interval() -> None:
    m = LiveMonitor()
    first = m.update(_data(100.0, {11: 5.0, 12: 1.0}, 1000, 1_200_000, 100, 50, 2.0))
    assert first.targets[0].cpu is None and first.targets[0].drops == 7  # no rates before a second tick
    f = m.update(_data(102.0, {11: 6.8, 12: 1.2}, 21000, 25_200_000, 1100, 250, 2.2))
    r = f.targets[0]
    assert r.cpu == pytest.approx(1.0) and r.busiest_tid == 11 and r.busiest_cpu == pytest.approx(0.9)
    assert r.tx_dgrams_s == pytest.approx(10000) and r.tx_gbit_s == pytest.approx(24_000_000 * 8 / 2 / 1e9)
    assert r.gso == pytest.approx(20.0) and r.rx_dgrams_s == pytest.approx(100) and r.gro == pytest.approx(1.0)
    assert f.softirq_share == pytest.approx(0.4 / 4)  # 0.4 CPU s of softirq in 2 s on 2 CPUs
    assert f.probes


def test_without_probes_packet_columns_stay_empty() -> None:
    m = LiveMonitor()
    for mono in (1.0, 2.0):
        d = _data(mono, {11: mono}, 0, 0, 0, 0, 0.0)
        d.maps = {}
        f = m.update(d)
    assert not f.probes and f.targets[0].tx_dgrams_s is None and f.targets[0].cpu == pytest.approx(1.0)


COUNTERS = ("tx_msgs", "tx_bytes", "tx_errors", "tx_gso_sockopt_msgs", "tx_skbs", "tx_gso_skbs", "tx_dgrams",
            "rx_msgs", "rx_bytes", "rx_empty", "rx_gro_socket_msgs", "rx_gro_skbs", "rx_gro_dgrams")


def _printed(stats: windows.WindowStats) -> dict:
    """What the probe loader prints of its windows (probes/packetio/sampler.py, Sampler.snapshot)."""
    return {"@windows": {**stats.to_json(), "netns": {"ns": {"pids": [10], "mib_in": 0, "mib_out": 0,
                                                            "ip_out_octets": 0}},
                         "final": False, "events": {}, "budget": {}}}


def test_packet_rates_follow_the_loaders_prints_not_the_ticks() -> None:
    """The loader prints on its own clock: a tick that finds no new print keeps the last rates (not
    zero), and a print's rates are over the periods it added (not the ticks' interval)."""
    stats = windows.WindowStats(COUNTERS)

    def period(stats: windows.WindowStats, length: float, dgrams: int) -> None:  # one whole period's sends
        y = [0] * len(COUNTERS)
        y[COUNTERS.index("tx_msgs")] = y[COUNTERS.index("tx_skbs")] = y[COUNTERS.index("tx_dgrams")] = dgrams
        y[COUNTERS.index("tx_bytes")] = dgrams * 1200
        stats.add_window(length, length, {"10": ("ns", y)}, {"ns": (0.0, float(dgrams), dgrams * 1228.0)})

    m = LiveMonitor()
    rates = []
    for mono, new_periods in ((100.0, [(0.5, 500)] * 2), (101.0, [(0.5, 1000)] * 2), (102.0, []),
                              (103.0, [(0.5, 1500)] * 3)):
        for length, n in new_periods:
            period(stats, length, n)
        d = _data(mono, {11: mono}, 0, 0, 0, 0, 0.0)
        f = m.update(LiveData(mono, 30.0, d.reading, _printed(stats), {}, d.targets))
        rates.append(f.targets[0].tx_dgrams_s)
    assert rates[0] is None
    assert rates[1] == pytest.approx(2000 / 1.0)  # 2000 datagrams in 1 s of periods
    assert rates[2] == pytest.approx(2000)  # no new print: the last rate, not zero
    assert rates[3] == pytest.approx(4500 / 1.5)  # over the 1.5 s of periods the print added
    # one print seen by two ticks (the loader's second print can come 2 s after its first): the
    # second tick shows the first print's averages since the probes started, not nothing
    first = windows.WindowStats(COUNTERS)
    period(first, 0.5, 300)
    period(first, 0.5, 700)
    m = LiveMonitor()
    for mono in (100.0, 101.0):
        d = _data(mono, {11: mono}, 0, 0, 0, 0, 0.0)
        f = m.update(LiveData(mono, 30.0, d.reading, _printed(first), {}, d.targets))
    assert f.targets[0].tx_dgrams_s == pytest.approx(1000 / 1.0)


def test_packet_rates_start_at_the_first_windows_print_after_another_groups_print() -> None:
    """Every group's maps reach the view together: a tick that sees another loader's print before
    packetio's first one has no windows yet, and the first windows print still gives rates."""
    stats = windows.WindowStats(COUNTERS)
    y = [0] * len(COUNTERS)
    y[COUNTERS.index("tx_msgs")] = y[COUNTERS.index("tx_skbs")] = y[COUNTERS.index("tx_dgrams")] = 3000
    m = LiveMonitor()
    rates = []
    for mono, printed in ((5000.0, False), (5001.0, False), (5002.0, True), (5003.0, True)):
        d = _data(mono, {11: mono}, 0, 0, 0, 0, 0.0)
        maps: dict = {"@offcpu_ns": {"10,11": 5}}  # another group's map
        if printed:
            stats.add_window(1.0, 1.0, {"10": ("ns", y)}, {"ns": (0.0, 3000.0, 3000 * 1228.0)})
            maps |= _printed(stats)
        f = m.update(LiveData(mono, 30.0, d.reading, maps, {}, d.targets))
        rates.append(f.targets[0].tx_dgrams_s)
    assert rates[2] == pytest.approx(3000) and rates[3] == pytest.approx(3000), rates


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=8),
                     lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
                     max_leaves=20)


@settings(max_examples=examples(200), deadline=None)
@given(st.dictionaries(st.text(max_size=12), _json, max_size=6))
def test_garbage_maps_never_raise(maps: dict) -> None:
    """The maps come as a probe printed them, unchecked (the /proc reading is typed by then)."""
    m = LiveMonitor()
    for mono in (1.0, 2.0):
        d = _data(mono, {11: mono}, 0, 0, 0, 0, 0.0)
        m.update(LiveData(mono, None, d.reading, maps, {}, d.targets))


@pytest.mark.root
def test_panel_draws_on_a_terminal_with_real_rates(kernel_facing: None, tmp_path: Path) -> None:
    loop = ("import socket\n"
            "a, b = socket.socket(socket.AF_INET, socket.SOCK_DGRAM), socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
            "b.bind(('127.0.0.1', 0))\n"
            "while True:\n    a.sendto(b'x' * 1200, b.getsockname()); b.recv(2048)\n")
    target = subprocess.Popen([sys.executable, "-c", loop])
    master, slave = pty.openpty()
    try:
        att = subprocess.Popen([*QPROF, "attach", str(target.pid), "-d", "4", "-o", str(tmp_path / "run")],
                               stdout=slave, stderr=subprocess.DEVNULL, env={**os.environ, "COLUMNS": "160"})
        os.close(slave)
        out = b""
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            r, _, _ = select.select([master], [], [], 1.0)
            if r:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # the terminal closed: qprof exited
                    break
                if not chunk:
                    break
                out += chunk
            elif att.poll() is not None:
                break
        assert att.wait(60) == 0
    finally:
        os.close(master)
        target.kill()
        target.wait()
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.decode(errors="replace"))
    assert "tx dgram/s" in text and "busiest thread" in text and "of 4 s" in text
    rows = [ln for ln in text.splitlines() if f" {target.pid}" in ln and "%" in ln]
    assert rows, text[-2000:]
    numbers = [int(x.replace(",", "")) for x in re.findall(r"\b\d{1,3}(?:,\d{3})+\b|\b\d{4,}\b", rows[-1])
               if int(x.replace(",", "")) != target.pid]
    assert numbers and max(numbers) >= 1000, f"datagrams/s in the last frame: {rows[-1]}"
    assert str(tmp_path / "run") in text  # the run directory is still printed at the end
