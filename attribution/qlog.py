"""What the QUIC stack itself recorded about why its sender waited (qlog), to set beside the verdict.

The verdict decides from what the kernel measured; a stack that writes qlog
(quic-go, quiche, tquic and quinn where the application turns it on, as the
lab's endpoints do with QLOGDIR; ngtcp2 with --qlog-dir: `qprof report --qlog DIR`)
says in its own words what held its sender back, and the report shows whether
the two agree. From each connection's qlog (JSON-SEQ, one file per connection
and vantage point; event names matched by their last part, whatever category
qlog's drafts put them in: `recovery:`, `transport:`, `quic:`):
- `congestion_state_updated`: slow_start (also quiche's conservative_slow_start),
  congestion_avoidance and recovery mean the sender filled its congestion
  window when an ACK came (`congestion_control`); application_limited means it
  did not, and so does quiche's own app-limited flag (`cf_app_limited` in its
  metrics: its last packet left the window open), whatever the state;
- DATA_BLOCKED / STREAM_DATA_BLOCKED frames it sent once its stream data
  reached the limit they name (tquic sends them as soon as its application
  has written up to the limit, data it has yet to send), or stream data sent
  up to within a packet of the peer's limit (its transport parameters, the
  MAX_DATA / MAX_STREAM_DATA frames it received: ngtcp2 sends no *_BLOCKED
  frame), until the MAX_DATA / MAX_STREAM_DATA it received next: blocked by
  the peer's flow control (`flow_control`);
- `application`: not filling its window and not flow-control blocked (nothing
  to send: the application, or a sender too slow to produce packets);
- `packet_lost`: packets it declared lost;
- `metrics_updated`: its smoothed RTT; for a stack that logs no congestion
  states (ngtcp2, tquic, quinn), whether bytes in flight filled its congestion
  window stands in for them. Stacks log only the fields that changed, so the
  last value of each holds until the next. RTTs are milliseconds, except
  quinn-proto 0.11.19's (seconds; quinn-rs/quinn#2631 fixed it upstream),
  told apart by the RTT it logs before any packet could have been
  acknowledged: RFC 9002's initial RTT of 333 ms, which reads 0.333.
The side is the trace's vantage point, or where that is "unknown" (quinn) the
file's name (`server-*.sqlog`, `*_client.qlog`).
Time is weighted between events, from the connection's first to last event.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Sequence

from qprof.attribution.causes import Cause
from qprof.errors import QprofError
from qprof.jsonvalue import JsonObject

REASONS = ("congestion_control", "flow_control", "application")
_CWND_STATES = {"slow_start", "conservative_slow_start", "congestion_avoidance", "recovery"}
# bytes in flight this close to the congestion window count as a full window (less than one more packet fits)
WINDOW_FULL_MARGIN = 1500
_TIME = re.compile(rb'"time":\s*([0-9.eE+-]+)')
# events parsed in full (the rest only give their time): state changes, losses, blocked and window frames
_WANTED = (b"congestion_state_updated", b"packet_lost", b"data_blocked", b"max_data", b"max_stream_data",
           b"metrics_updated", b"parameters_set", b'"stream"')
_RTT_FIELDS = ("smoothed_rtt", "min_rtt", "latest_rtt")
INITIAL_RTT_S = 0.333  # RFC 9002's initial RTT in seconds, as a stack that logs seconds logs it before any ACK
_RELEASES = {"max_data": "connection", "max_stream_data": "stream"}  # frames received -> the block they end
_ROLE_WORD = re.compile(r"(?:^|[^a-z])(server|client)(?:$|[^a-z])")


@dataclass
class SenderRecord:
    """One connection's qlog from one vantage point: how its sending time splits by reason."""

    file: str
    role: str | None  # vantage point: server or client
    span_s: float = 0.0
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(REASONS, 0.0))
    packets_sent: int = 0
    packets_lost: int = 0
    states_seen: bool = False  # the stack logs congestion states at all
    rtts_ms: list[float] = field(default_factory=list)  # smoothed RTT at each metrics update

    @property
    def rtt_ms(self) -> float | None:
        """The median smoothed RTT the stack reported; None when it logged none."""
        r = sorted(self.rtts_ms)
        return r[len(r) // 2] if r else None

    def shares(self) -> dict[str, float]:
        known = sum(self.seconds.values())
        return {r: (s / known if known else 0.0) for r, s in self.seconds.items()}

    @property
    def dominant(self) -> str | None:
        shares = self.shares()
        return max(shares, key=lambda r: shares[r]) if self.states_seen and any(shares.values()) else None

    def rounded_shares(self) -> dict[str, float]:
        return {r: round(s, 3) for r, s in self.shares().items()}

    def to_json(self) -> JsonObject:
        return {"file": self.file, "role": self.role, "span_s": round(self.span_s, 3),
                "seconds": {r: round(s, 3) for r, s in self.seconds.items()},
                "shares": self.rounded_shares(), "dominant": self.dominant,
                "packets_sent": self.packets_sent, "packets_lost": self.packets_lost,
                "rtt_ms": None if self.rtt_ms is None else round(self.rtt_ms, 3)}


def _number(v: object) -> float | None:
    """A finite, non-negative number from a qlog field; None for anything else."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < 1e15:
        return None
    return float(v)


StreamId = int | float | str | None  # a frame's stream_id as logged (None: not logged, or not a JSON scalar)


class _Fields:
    """A qlog object's fields, each read as the type it must have: a field of another type (a
    stack's own extension, a damaged record) reads as absent, so no record is fatal."""

    def __init__(self, value: object) -> None:
        self._d: dict[str, object] = value if isinstance(value, dict) else {}

    def has(self, key: str) -> bool:
        return key in self._d

    def number(self, key: str) -> float | None:
        return _number(self._d.get(key))

    def text(self, key: str) -> str | None:
        v = self._d.get(key)
        return v if isinstance(v, str) else None

    def flag(self, key: str) -> bool | None:
        v = self._d.get(key)
        return v if isinstance(v, bool) else None

    def scalar(self, key: str) -> StreamId:
        v = self._d.get(key)
        return v if isinstance(v, (int, float, str)) else None

    def object(self, key: str) -> "_Fields":
        return _Fields(self._d.get(key))

    def objects(self, key: str) -> list["_Fields"]:
        """A list field's objects (its other items skipped)."""
        v = self._d.get(key)
        return [_Fields(x) for x in v if isinstance(x, dict)] if isinstance(v, list) else []


@dataclass(frozen=True)
class Frame:
    """A frame of a packet event, as far as the sender's account reads it."""

    kind: str | None  # frame_type
    stream: StreamId = None
    offset: float = 0.0  # where its stream data starts (0 when not logged)
    length: float = 0.0  # its data length: `length`, or (qlog's draft 12 on: quiche) its raw payload length
    maximum: float | None = None  # MAX_DATA / MAX_STREAM_DATA: the new limit
    limit: float | None = None  # DATA_BLOCKED / STREAM_DATA_BLOCKED: the limit it names

    @classmethod
    def of(cls, f: _Fields) -> "Frame":
        length = f.number("length")
        if length is None:
            length = f.object("raw").number("payload_length")
        return cls(f.text("frame_type"), f.scalar("stream_id"), f.number("offset") or 0.0, length or 0.0,
                   f.number("maximum"), f.number("limit"))


@dataclass(frozen=True)
class Metrics:
    """A metrics_updated event: only the metrics that changed are logged (None: not logged)."""

    rtts: tuple[float, ...]  # smoothed, min and latest RTT, those logged, in that order
    smoothed_rtt: float | None
    congestion_window: float | None
    flight_logged: bool  # bytes_in_flight is there (a value that is no number: unknown from here on)
    bytes_in_flight: float | None
    app_limited: bool | None  # quiche's own flag (cf_app_limited, over app_limited)

    @classmethod
    def of(cls, data: _Fields) -> "Metrics":
        rtts = tuple(v for v in (data.number(k) for k in _RTT_FIELDS) if v is not None)
        flag = data.flag("cf_app_limited") if data.has("cf_app_limited") else data.flag("app_limited")
        return cls(rtts, data.number("smoothed_rtt"), data.number("congestion_window"),
                   data.has("bytes_in_flight"), data.number("bytes_in_flight"), flag)


@dataclass(frozen=True)
class Event:
    """One qlog event the account reads (its name's last part says which), its fields checked once."""

    name: str
    frames: tuple[Frame, ...] = ()  # packet_sent / packet_received
    new_state: str = ""  # congestion_state_updated: the state entered ("" when not logged)
    metrics: Metrics | None = None  # metrics_updated
    peer_max_data: float | None = None  # parameters_set: the peer's initial_max_data

    @classmethod
    def parse(cls, raw: bytes) -> "Event | None":
        """The event of one JSON-SEQ record; None for a record that is not a JSON object."""
        try:
            doc = json.loads(raw)
        except ValueError:
            return None
        if not isinstance(doc, dict):
            return None
        ev = _Fields(doc)
        name, data = ev.text("name") or "", ev.object("data")
        frames = tuple(Frame.of(f) for f in data.objects("frames"))
        metrics = Metrics.of(data) if name.endswith("metrics_updated") else None
        # "initiator" from qlog's draft 12 on
        remote = (data.text("owner") or data.text("initiator")) == "remote"
        return cls(name, frames, data.text("new") or "", metrics,
                   data.number("initial_max_data") if remote else None)


class _Credit:
    """The sender's flow-control credit as its qlog shows it: the peer's limits (its transport parameters,
    then MAX_DATA / MAX_STREAM_DATA frames received) against the stream data sent. Credit used up to
    within a packet is a block, also where the stack sends no DATA_BLOCKED frame to say so."""

    def __init__(self) -> None:
        self.connection: float | None = None
        self.streams: dict[StreamId, float] = {}
        self.offsets: dict[StreamId, float] = {}  # stream -> highest offset sent

    def parameters(self, ev: Event) -> None:
        self.connection = ev.peer_max_data or self.connection

    def received(self, ev: Event) -> None:
        for f in ev.frames:
            if f.maximum is None:
                continue
            if f.kind == "max_data":
                self.connection = max(f.maximum, self.connection or 0.0)
            elif f.kind == "max_stream_data":
                self.streams[f.stream] = max(f.maximum, self.streams.get(f.stream, 0.0))

    def sent(self, ev: Event) -> list[str]:
        """What this packet's stream data used up: "connection" and/or "stream"."""
        blocked = []
        for f in ev.frames:
            if f.kind != "stream":
                continue
            self.offsets[f.stream] = max(f.offset + f.length, self.offsets.get(f.stream, 0.0))
            limit = self.streams.get(f.stream)
            if limit is not None and self.offsets[f.stream] + WINDOW_FULL_MARGIN >= limit and "stream" not in blocked:
                blocked.append("stream")
        if self.connection is not None and sum(self.offsets.values()) + WINDOW_FULL_MARGIN >= self.connection:
            blocked.append("connection")
        return blocked

    def reached(self, frame: Frame) -> bool:
        """Whether the stream data sent reaches the limit a DATA_BLOCKED / STREAM_DATA_BLOCKED frame names
        (true where the frame names none): tquic sends one when its application's writes fill the credit,
        long before its packets do."""
        if frame.limit is None:
            return True
        if frame.kind == "data_blocked":
            used = sum(self.offsets.values())
        else:
            used = self.offsets.get(frame.stream, 0.0)
        return used + WINDOW_FULL_MARGIN >= frame.limit


def _records(path: Path) -> Iterator[bytes]:
    """JSON-SEQ records (RS-prefixed or one per line)."""
    with open(path, "rb") as f:
        for line in f:
            line = line.strip(b"\x1e \t\r\n")
            if line:
                yield line


def _role(raw: bytes, name: str) -> str | None:
    """The trace's vantage point (the file's header record); where it is missing or "unknown" (quinn),
    the file's name."""
    try:
        head = json.loads(raw)
    except ValueError:
        head = None
    role = _Fields(head).object("trace").object("vantage_point").text("type")
    if role in ("server", "client"):
        return role
    m = _ROLE_WORD.search(name.lower())
    return m.group(1) if m else (role or None)


def read_qlog(path: Path) -> SenderRecord:
    """The sending-time split of one qlog file (malformed records are skipped, the file is not)."""
    rec = SenderRecord(path.name, None)
    state: str | None = None
    app_limited = False  # the stack's own flag (quiche): its last packet left the window open
    cwnd: float | None = None  # last values logged: stacks log the metrics that changed
    flight: float | None = None
    rtt_scale: float | None = None  # ms per unit of the RTT fields, from the first one
    answerable = False  # a packet was received after one was sent: from here on an RTT may be a sample
    blocked_since: dict[str, float] = {}  # "connection"/"stream" -> ms when a *_BLOCKED frame went out
    first = last = None
    at = 0.0  # ms up to which time has been given a reason
    from_events = False  # the stack logs its congestion states: metrics do not stand in for them
    credit = _Credit()
    for raw in _records(path):
        if rec.role is None and b'"vantage_point"' in raw[:4096]:  # the file's header
            rec.role = _role(raw, path.name)
            continue
        m = _TIME.search(raw[:64])
        if not m:
            continue
        try:
            t = float(m.group(1))
        except ValueError:
            continue
        if first is None:
            first = at = t
        last = t
        if b'packet_sent"' in raw[:80]:  # "transport:packet_sent", "quic:packet_sent", "packet_sent"
            rec.packets_sent += 1
        elif rec.packets_sent and b'packet_received"' in raw[:80]:
            answerable = True
        if not any(w in raw for w in _WANTED):
            continue
        ev = Event.parse(raw)
        if ev is None:
            continue
        name = ev.name
        _account(rec, state, app_limited, blocked_since, at, t)
        at = t
        if name.endswith("congestion_state_updated"):
            rec.states_seen = from_events = True
            state = ev.new_state
        elif name.endswith("packet_lost"):
            rec.packets_lost += 1
        elif ev.metrics is not None:
            mt = ev.metrics
            if rtt_scale is None and mt.rtts:  # the initial RTT, where logged before any sample, gives the unit
                rtt_scale = 1e3 if not answerable and math.isclose(mt.rtts[0], INITIAL_RTT_S, rel_tol=1e-4) else 1.0
            if mt.smoothed_rtt is not None:
                rec.rtts_ms.append(mt.smoothed_rtt * (rtt_scale or 1.0))
            cwnd = mt.congestion_window or cwnd
            if mt.flight_logged:
                flight = mt.bytes_in_flight
            if mt.app_limited is not None:
                app_limited = mt.app_limited
            if not from_events and cwnd is not None and flight is not None:
                # a stack that logs no congestion states (ngtcp2, tquic, quinn): its window full or not when
                # the metrics change
                rec.states_seen = True
                state = "congestion_avoidance" if flight + WINDOW_FULL_MARGIN >= cwnd else "application_limited"
        elif name.endswith("packet_sent"):
            for what in credit.sent(ev):  # a stack that sends no *_BLOCKED frame (ngtcp2): its credit used up
                blocked_since.setdefault(what, t)
            for f in ev.frames:
                if f.kind in ("data_blocked", "stream_data_blocked") and credit.reached(f):
                    blocked_since.setdefault("connection" if f.kind == "data_blocked" else "stream", t)
        elif name.endswith("packet_received"):
            for f in ev.frames:
                if f.kind in _RELEASES:
                    blocked_since.pop(_RELEASES[f.kind], None)
            credit.received(ev)
        elif name.endswith("parameters_set"):
            credit.parameters(ev)
    if first is not None and last is not None:
        _account(rec, state, app_limited, blocked_since, at, last)
        rec.span_s = (last - first) / 1e3
    return rec


def _account(rec: SenderRecord, state: str | None, app_limited: bool, blocked: dict[str, float], start: float,
             end: float) -> None:
    """Give the time from `start` to `end` (ms) to the reason that held then (`app_limited`: the stack's
    own word that its window was open, over a congestion state that says otherwise)."""
    if end <= start or state is None:
        return
    s = (end - start) / 1e3
    if blocked:
        rec.seconds["flow_control"] += s
    elif state in _CWND_STATES and not app_limited:
        rec.seconds["congestion_control"] += s
    else:
        rec.seconds["application"] += s


def read_dir(directory: Path) -> list[SenderRecord]:
    """Every qlog in `directory` (*.sqlog, *.qlog); a missing directory is one clear error."""
    if not directory.is_dir():
        raise QprofError(f"--qlog {directory}: no such directory (give the directory the endpoints wrote "
                         "their qlog files into, e.g. their QLOGDIR)")
    files = sorted(p for p in directory.iterdir() if p.suffix in (".sqlog", ".qlog") and p.is_file())
    if not files:
        raise QprofError(f"--qlog {directory}: no .sqlog or .qlog files there")
    return [read_qlog(p) for p in files]


def sender(records: list[SenderRecord]) -> SenderRecord | None:
    """The record of the side that sent most (a bulk transfer's sender), among those with states."""
    with_states = [r for r in records if r.states_seen]
    return max(with_states, key=lambda r: r.packets_sent) if with_states else None


@dataclass(frozen=True)
class StackWord:
    """The sender's own record set beside a verdict: what the verdict's cause expects it to say, and
    whether it does (None: it cannot say)."""

    record: SenderRecord
    expected: tuple[str, ...]
    agrees: bool | None
    files: tuple[str, ...]  # every qlog read, the sender's among them

    def to_json(self) -> JsonObject:
        return {**self.record.to_json(), "expected": list(self.expected), "agrees": self.agrees,
                "files": list(self.files)}


def agreement(causes: Sequence[Cause], limiting_roles: list[str],
              record: SenderRecord) -> tuple[tuple[str, ...], bool | None]:
    """(reasons the stack should give, whether it does) for the verdict's cause (its About.qlog). A
    CPU-limited sender cannot fill its window (application, in the stack's words); a CPU-limited
    receiver holds the sender back by flow control or losses. None: the record cannot say (no
    congestion states), or the verdict names two causes or one the stack has no word for."""
    if len(causes) != 1:
        return (), None
    about = causes[0].about
    if about.qlog is not None:
        want = about.qlog
    elif about.cpu and record.role in limiting_roles:
        want = ("application",)
    elif about.cpu:
        want = ("congestion_control", "flow_control")
    else:
        return (), None
    dom = record.dominant
    return want, (None if dom is None else dom in want)
