"""The stack's own record of why its sender waited (qlog), and whether it agrees with the verdict."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qprof.attribution.causes import Cause
from qprof.attribution.qlog import Event, Frame, agreement, read_dir, read_qlog, sender
from qprof.errors import QprofError


def qlog(path: Path, role: str, events: list[tuple[float, str, dict]]) -> Path:
    """A JSON-SEQ qlog as quic-go writes it: a header record, then one event per record (times in ms)."""
    head = {"file_schema": "urn:ietf:params:qlog:file:sequential", "trace": {"vantage_point": {"type": role}}}
    lines = [json.dumps(head)] + [json.dumps({"time": t, "name": n, "data": d}) for t, n, d in events]
    path.write_text("".join(f"\x1e{line}\n" for line in lines))
    return path


def state(t: float, new: str) -> tuple[float, str, dict]:
    return t, "recovery:congestion_state_updated", {"new": new}


def sent(t: float, *frames: str) -> tuple[float, str, dict]:
    return t, "transport:packet_sent", {"frames": [{"frame_type": f} for f in frames]}


def received(t: float, *frames: str) -> tuple[float, str, dict]:
    return t, "transport:packet_received", {"frames": [{"frame_type": f} for f in frames]}


def test_time_split_by_reason(tmp_path: Path) -> None:
    """0-1000 ms cwnd-limited, 1000-1500 flow-control blocked, 1500-4000 application-limited."""
    events = [state(0, "slow_start"), sent(10, "stream"), state(400, "congestion_avoidance"),
              (600, "recovery:packet_lost", {}), state(1000, "application_limited"),
              sent(1000, "stream", "stream_data_blocked"), received(1500, "ack", "max_stream_data"),
              sent(2000, "stream"), (4000, "transport:connection_closed", {})]
    rec = read_qlog(qlog(tmp_path / "a_server.sqlog", "server", events))
    assert rec.role == "server" and rec.span_s == pytest.approx(4.0)
    assert rec.seconds == pytest.approx({"congestion_control": 1.0, "flow_control": 0.5, "application": 2.5})
    assert rec.packets_lost == 1 and rec.packets_sent == 3
    assert rec.dominant == "application"


def test_sender_is_the_side_that_sent_most(tmp_path: Path) -> None:
    qlog(tmp_path / "c_client.sqlog", "client", [state(0, "application_limited"), sent(1, "ack"), sent(2, "ack")])
    qlog(tmp_path / "c_server.sqlog", "server", [state(0, "slow_start")] + [sent(t, "stream") for t in range(1, 9)])
    (tmp_path / "notes.txt").write_text("not a qlog")
    recs = read_dir(tmp_path)
    assert len(recs) == 2
    s = sender(recs)
    assert s is not None and s.role == "server" and s.dominant == "congestion_control"


def test_agreement_per_cause(tmp_path: Path) -> None:
    app = read_qlog(qlog(tmp_path / "x_server.sqlog", "server", [state(0, "application_limited"), sent(900, "stream")]))
    assert agreement((Cause.UNMEASURED_WAITS,), [], app) == (("application", "flow_control"), True)
    assert agreement((Cause.LINK,), [], app) == (("congestion_control",), False)
    assert agreement((Cause.CPU_STARVED,), ["server"], app) == (("application",), True)  # a slow sender leaves its window
    assert agreement((Cause.CPU_STARVED,), ["client"], app)[1] is False
    silent = read_qlog(qlog(tmp_path / "y_server.sqlog", "server", [sent(0, "stream"), sent(5, "stream")]))
    assert silent.dominant is None and agreement((Cause.LINK,), [], silent)[1] is None
    # two causes, or one the stack has no word for: it cannot agree or disagree
    assert agreement((Cause.CPU_BUSY, Cause.CPU_STARVED), ["server", "client"], app) == ((), None)
    assert agreement((Cause.NO_TRAFFIC,), [], app) == ((), None)


def test_damaged_records_are_skipped_not_fatal(tmp_path: Path) -> None:
    p = qlog(tmp_path / "d_server.sqlog", "server", [state(0, "slow_start"), sent(1000, "stream")])
    p.write_text(p.read_text() + '\x1e{"time": 1500, "name": "recovery:congestion_state_upd\n\x1e[1, 2\n')
    rec = read_qlog(p)
    assert rec.seconds["congestion_control"] == pytest.approx(1.5)


def test_bad_directories_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(QprofError, match="no such directory"):
        read_dir(tmp_path / "nope")
    with pytest.raises(QprofError, match="no .sqlog or .qlog files"):
        read_dir(tmp_path)


def metrics(t: float, **data: float) -> tuple[float, str, dict]:
    return t, "recovery:metrics_updated", data


def stream(t: float, offset: int, length: int) -> tuple[float, str, dict]:
    return t, "transport:packet_sent", {"frames": [{"frame_type": "stream", "stream_id": 0, "offset": offset,
                                                    "length": length}]}


def test_a_stack_without_congestion_states_or_blocked_frames(tmp_path: Path) -> None:
    """ngtcp2's qlog: no congestion states (bytes in flight against the window stand in) and no
    STREAM_DATA_BLOCKED (its stream data reaching the peer's MAX_STREAM_DATA does); its smoothed RTT."""
    events = [(0, "transport:parameters_set", {"owner": "remote", "initial_max_data": 10**9}),
              (0, "transport:packet_received",
                                      {"frames": [{"frame_type": "max_stream_data", "stream_id": 0, "maximum": 100_000}]}),
              metrics(0, smoothed_rtt=30, congestion_window=50_000, bytes_in_flight=49_000),  # window full
              stream(100, 0, 50_000),
              metrics(1000, smoothed_rtt=31, congestion_window=500_000, bytes_in_flight=10_000),  # not full
              stream(1000, 50_000, 49_000),  # up to the peer's limit: blocked
              (1500, "transport:packet_received",
               {"frames": [{"frame_type": "max_stream_data", "stream_id": 0, "maximum": 400_000}]}),
              stream(2000, 99_000, 1_000), (3000, "transport:connection_closed", {})]
    rec = read_qlog(qlog(tmp_path / "n.sqlog", "server", events))
    assert rec.seconds == pytest.approx({"congestion_control": 1.0, "flow_control": 0.5, "application": 1.5})
    assert rec.rtt_ms == 31 and rec.states_seen


# any JSON value, where a qlog record's fields go: a stack's own extension or a damaged record
_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                     lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                     max_leaves=12)
_FIELDS = ("frame_type", "stream_id", "offset", "length", "raw", "maximum", "limit")


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(events=st.lists(st.tuples(
    st.sampled_from(["recovery:congestion_state_updated", "recovery:metrics_updated", "transport:packet_sent",
                     "transport:packet_received", "transport:parameters_set", "recovery:packet_lost"]),
    st.dictionaries(st.sampled_from(["new", "frames", "smoothed_rtt", "congestion_window", "bytes_in_flight",
                                     "cf_app_limited", "owner", "initial_max_data"]), _json, max_size=4),
    st.lists(st.dictionaries(st.sampled_from(_FIELDS), _json | st.sampled_from(["stream", "max_data"])),
             max_size=3)), max_size=12),
    head=_json)
def test_fields_of_any_type_are_read_as_absent_not_fatal(tmp_path: Path, events: list[tuple[str, dict, list]],
                                                         head: Any) -> None:
    """The parser turns each record into a typed event once: a field of the wrong type reads as absent,
    whatever the record holds; the header may be anything too."""
    lines = [json.dumps({"vantage_point": head}), json.dumps({"trace": head})]
    for i, (name, data, frames) in enumerate(events):
        lines.append(json.dumps({"time": i * 10, "name": name, "data": {**data, "frames": frames}}))
    p = tmp_path / "f_server.sqlog"
    p.write_text("".join(f"\x1e{line}\n" for line in lines))
    rec = read_qlog(p)
    assert rec.role == "server" and rec.packets_sent == sum(n.endswith("packet_sent") for n, _, _ in events)
    assert all(s >= 0 for s in rec.seconds.values())


@given(raw=st.binary(max_size=64) | _json.map(lambda v: json.dumps(v).encode()))
def test_a_record_is_an_event_or_none(raw: bytes) -> None:
    ev = Event.parse(raw)
    assert ev is None or isinstance(ev.name, str) and all(isinstance(f, Frame) for f in ev.frames)
