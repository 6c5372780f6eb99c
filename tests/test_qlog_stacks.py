"""The qlog the Rust endpoints write (quiche, tquic, quinn with QLOGDIR), read by the one qlog parser.

Each stack writes its own dialect: quiche qlog's draft 12 (`quic:` names, `initiator`, stream lengths
in `raw`, its congestion states and its own app-limited flag), tquic older names and no congestion
states, quinn-proto no vantage point and its RTTs in seconds. The fast tests read a few events of each,
copied from files the endpoints wrote (long headers shortened); the slow one runs a small transfer per
stack and reads what both ends wrote. The transfers are not profiled: no root or perf is needed.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from qprof.attribution.qlog import read_dir, read_qlog, sender

QLOG_STACKS = ("quiche", "tquic", "quinn")
SIZE = 16 << 20  # under a second on loopback, yet thousands of packets each way


def write(path: Path, *records: str) -> Path:
    """A JSON-SEQ file of the records as given (one per line, each after an RS)."""
    path.write_text("".join(f"\x1e{r}\n" for r in records))
    return path


QUICHE_HEAD = ('{"file_schema":"urn:ietf:params:qlog:file:sequential","serialization_format":"JSON-SEQ",'
               '"title":"quiche-bulk server","description":"","trace":{"title":"quiche-bulk server",'
               '"description":"","vantage_point":{"type":"server"},'
               '"event_schemas":["urn:ietf:params:qlog:events:quic-12","urn:ietf:params:qlog:events:http3-12"]}}')
QUICHE_SENT = ('{{"time":{t},"name":"quic:packet_sent","data":{{"header":{{"packet_type":"1RTT","packet_number":{n}}},'
               '"raw":{{"length":1472,"payload_length":1434}},"send_at_time":{t},'
               '"frames":[{{"frame_type":"stream","stream_id":0,"offset":{off},"raw":{{"payload_length":1428}}}}]}}}}')


def test_quiche_states_and_its_app_limited_flag(tmp_path: Path) -> None:
    """quiche logs slow_start / conservative_slow_start and never application_limited: its own flag
    (`cf_app_limited`, its last packet left the window open) says when the window was not the limit."""
    rec = read_qlog(write(
        tmp_path / "server-fb4d13ce.sqlog", QUICHE_HEAD,
        '{"time":0.013,"name":"quic:recovery_metrics_updated","data":{"cf_app_limited":false,"cf_lost_bytes":'
        '{"total":0,"delta":0},"cf_lost_packets":{"total":0,"delta":0},"min_rtt":333.0,"smoothed_rtt":333.0,'
        '"rtt_variance":166.5,"pto_count":0,"congestion_window":14720,"ssthresh":18446744073709551615}}',
        '{"time":0.013,"name":"quic:congestion_state_updated","data":{"new":"slow_start"}}',
        '{"time":0.211,"name":"quic:packet_sent","data":{"header":{"packet_type":"initial","packet_number":0,'
        '"version":"1"},"raw":{"length":1200,"payload_length":1133},"send_at_time":0.211768,'
        '"frames":[{"frame_type":"crypto","offset":0,"raw":{"payload_length":1129}}]}}',
        '{"time":0.211,"name":"quic:recovery_metrics_updated","data":{"cf_app_limited":true,"bytes_in_flight":1200}}',
        '{"time":0.657,"name":"quic:recovery_metrics_updated","data":{"min_rtt":0.44593897,"smoothed_rtt":0.44593897,'
        '"latest_rtt":0.44593897,"rtt_variance":0.222969,"bytes_in_flight":844}}',
        '{"time":0.671,"name":"quic:recovery_metrics_updated","data":{"min_rtt":0.391287,"smoothed_rtt":0.439106,'
        '"latest_rtt":0.391287,"rtt_variance":0.180889,"bytes_in_flight":718}}',
        '{"time":0.676,"name":"quic:recovery_metrics_updated","data":{"smoothed_rtt":0.433793,"latest_rtt":0.396615,'
        '"rtt_variance":0.14628801,"bytes_in_flight":0}}',
        QUICHE_SENT.format(t=0.788, n=4, off=1023),
        QUICHE_SENT.format(t=0.811, n=5, off=2451),
        '{"time":0.904,"name":"quic:recovery_metrics_updated","data":{"cf_app_limited":false,"bytes_in_flight":14720}}',
        '{"time":15.554,"name":"quic:congestion_state_updated","data":{"new":"conservative_slow_start"}}',
        '{"time":15.9,"name":"quic:congestion_state_updated","data":{"new":"slow_start"}}',
        '{"time":708.708,"name":"quic:connection_closed","data":{"initiator":"remote","application_error":"unknown",'
        '"error_code":0,"reason":"done"}}'))
    assert rec.role == "server" and rec.packets_sent == 3 and rec.states_seen
    assert rec.rtt_ms == pytest.approx(0.44593897)
    assert rec.span_s == pytest.approx(0.708695)
    assert rec.seconds["application"] == pytest.approx((0.904 - 0.211) / 1e3)  # the flag set, whatever the state
    assert rec.seconds["congestion_control"] == pytest.approx((0.211 - 0.013 + 708.708 - 0.904) / 1e3)
    assert sum(rec.seconds.values()) == pytest.approx(rec.span_s)


def test_quiche_credit_counts_stream_lengths_from_raw(tmp_path: Path) -> None:
    """qlog's draft 12: the peer's parameters name their `initiator`, a STREAM frame's length is its raw
    payload length. (The peer's initial_max_data is cut from 128 MiB to 5000 to be used up here.)"""
    rec = read_qlog(write(
        tmp_path / "server-fb4d13ce.sqlog", QUICHE_HEAD,
        '{"time":0.013,"name":"quic:congestion_state_updated","data":{"new":"slow_start"}}',
        '{"time":0.676,"name":"quic:parameters_set","data":{"initiator":"remote","tls_cipher":"AES128_GCM",'
        '"max_udp_payload_size":1472,"initial_max_data":5000,"initial_max_stream_data_bidi_local":67108864}}',
        QUICHE_SENT.format(t=0.788, n=4, off=1023),
        QUICHE_SENT.format(t=0.811, n=5, off=2451),  # 3879 bytes sent: less than a packet of credit left
        '{"time":1.811,"name":"quic:packet_received","data":{"header":{"packet_type":"1RTT","packet_number":9},'
        '"raw":{"length":54,"payload_length":33},"frames":[{"frame_type":"ack","ack_delay":0.004,'
        '"acked_ranges":[[4,5]]},{"frame_type":"max_data","maximum":75749479}]}}',
        '{"time":2.0,"name":"quic:connection_closed","data":{"initiator":"remote"}}'))
    assert rec.seconds["flow_control"] == pytest.approx(1.0 / 1e3)
    assert rec.seconds["congestion_control"] == pytest.approx((2.0 - 0.013 - 1.0) / 1e3)


TQUIC_SENT = ('{{"time":{t},"name":"quic:packet_sent","data":{{"header":{{"packet_type":"1RTT","packet_number":{n}}},'
              '"frames":[{{"frame_type":"stream","stream_id":0,"offset":{off},"length":1438,"fin":false}}],'
              '"raw":{{"length":1472,"payload_length":1446}}}}}}')


def test_tquic_window_from_the_metrics_that_changed(tmp_path: Path) -> None:
    """tquic logs no congestion states and, per metrics update, only the fields that changed: the
    congestion window logged once holds while bytes in flight grow to fill it."""
    rec = read_qlog(write(
        tmp_path / "server-0f6ab8c9fc7ba029.sqlog",
        '{"qlog_format":"JSON-SEQ","qlog_version":"0.4","title":"tquic-bulk server","description":"",'
        '"trace":{"title":"tquic-bulk server","description":"","vantage_point":{"type":"server"}}}',
        '{"time":0.269144,"name":"quic:parameters_set","data":{"owner":"remote","tls_cipher":"Some(Aes128Gcm)",'
        '"max_udp_payload_size":1472,"initial_max_data":15728640,"initial_max_stream_data_bidi_local":6291456}}',
        '{"time":1.339831,"name":"recovery:metrics_updated","data":{"min_rtt":0.147962,"smoothed_rtt":0.38265002,'
        '"latest_rtt":0.147962,"rtt_variance":0.188699,"congestion_window":28192,"bytes_in_flight":0,'
        '"pacing_rate":1469210544}}',
        TQUIC_SENT.format(t=1.4327999, n=28, off=35695),
        '{"time":1.434643,"name":"recovery:metrics_updated","data":{"bytes_in_flight":25024}}',
        TQUIC_SENT.format(t=1.4370159, n=29, off=37133),
        '{"time":1.4388089,"name":"recovery:metrics_updated","data":{"bytes_in_flight":26496}}',
        TQUIC_SENT.format(t=1.441213, n=30, off=38571),
        '{"time":1.442985,"name":"recovery:metrics_updated","data":{"bytes_in_flight":27968}}',
        '{"time":1.645589,"name":"quic:packet_received","data":{"header":{"packet_type":"1RTT","packet_number":3},'
        '"frames":[{"frame_type":"ack","ack_delay":0.002,"acked_ranges":[[0,30]]}],'
        '"raw":{"length":31,"payload_length":21}}}',
        '{"time":1.648764,"name":"recovery:metrics_updated","data":{"smoothed_rtt":0.354696,"latest_rtt":0.159019,'
        '"rtt_variance":0.19743201,"congestion_window":57632,"bytes_in_flight":0,"pacing_rate":2836053312}}',
        '{"time":1.650797,"name":"quic:stream_data_moved","data":{"stream_id":0,"offset":11241,"length":1440,'
        '"from":"transport","to":"dropped"}}'))
    assert rec.role == "server" and rec.packets_sent == 3 and rec.states_seen
    assert rec.rtt_ms == pytest.approx(0.38265002)
    assert rec.seconds["congestion_control"] == pytest.approx((1.648764 - 1.442985) / 1e3)
    assert rec.seconds["application"] == pytest.approx((1.442985 - 1.339831 + 1.650797 - 1.648764) / 1e3)
    assert rec.seconds["flow_control"] == 0.0


@pytest.mark.parametrize("offset,blocked_ms", [(3368514, 0.0), (9463002, 51.965477 - 28.559692)])
def test_tquic_stream_data_blocked_counts_once_its_packets_reach_the_limit(tmp_path: Path, offset: int,
                                                                          blocked_ms: float) -> None:
    """tquic sends STREAM_DATA_BLOCKED when its application has written up to the peer's limit, with 6 MB
    of that still to send (the real offset, 3368514): no block. Its packets at the limit (the offset
    moved to 9464434 - 1432) are one, until the next MAX_STREAM_DATA."""
    rec = read_qlog(write(
        tmp_path / "server-0f6ab8c9fc7ba029.sqlog",
        '{"qlog_format":"JSON-SEQ","qlog_version":"0.4","title":"tquic-bulk server","description":"",'
        '"trace":{"title":"tquic-bulk server","description":"","vantage_point":{"type":"server"}}}',
        '{"time":28.24016,"name":"quic:packet_received","data":{"header":{"packet_type":"1RTT","packet_number":158},'
        '"frames":[{"frame_type":"ack","ack_delay":0.001,"acked_ranges":[[2187,2209]]},{"frame_type":"max_stream_data",'
        '"stream_id":0,"maximum":9464434},{"frame_type":"max_data","maximum":18901618}],'
        '"raw":{"length":43,"payload_length":33}}}',
        '{"time":28.244238,"name":"recovery:metrics_updated","data":{"smoothed_rtt":0.261265,"latest_rtt":0.312039,'
        '"rtt_variance":0.069057,"congestion_window":232755,"bytes_in_flight":200192,"pacing_rate":1698972040}}',
        '{"time":28.559692,"name":"quic:packet_sent","data":{"header":{"packet_type":"1RTT","packet_number":2346},'
        '"frames":[{"frame_type":"stream_data_blocked","stream_id":0,"limit":9464434},{"frame_type":"stream",'
        f'"stream_id":0,"offset":{offset},"length":1432,"fin":false}}],'
        '"raw":{"length":1472,"payload_length":1446}}}',
        '{"time":51.965477,"name":"quic:packet_received","data":{"header":{"packet_type":"1RTT","packet_number":319},'
        '"frames":[{"frame_type":"ack","ack_delay":0.0,"acked_ranges":[[3936,4411]]},{"frame_type":"max_stream_data",'
        '"stream_id":0,"maximum":12630439},{"frame_type":"max_data","maximum":22067623}],'
        '"raw":{"length":44,"payload_length":34}}}'))
    assert rec.seconds["flow_control"] == pytest.approx(blocked_ms / 1e3)
    assert sum(rec.seconds.values()) == pytest.approx((51.965477 - 28.244238) / 1e3)  # from its first metrics


def quinn(t: float, name: str, data: str) -> str:
    return f'{{"time":{t},"name":"{name}","data":{data},"group_id":"a3052263f39054ec"}}'


def test_quinn_side_from_the_file_name_and_rtts_in_seconds(tmp_path: Path) -> None:
    """quinn-proto 0.11 writes vantage point "unknown" (the endpoint names its file by its side) and
    its RTTs in seconds: its first update, before any packet could be acknowledged, holds RFC 9002's
    initial RTT as 0.333."""
    rec = read_qlog(write(
        tmp_path / "server-6f1fbeb95248427b.sqlog",
        '{"qlog_version":"0.3","qlog_format":"JSON-SEQ","title":"quinn-bulk","trace":{"vantage_point":'
        '{"type":"unknown"},"title":"quinn-bulk","configuration":{"time_offset":0.0}}}',
        quinn(0.0, "transport:packet_received", '{"header":{"packet_type":"initial","packet_number":0}}'),
        quinn(0.0, "recovery:metrics_updated", '{"min_rtt":0.333,"smoothed_rtt":0.333,"latest_rtt":0.333,'
              '"rtt_variance":0.1665,"pto_count":0,"congestion_window":12000,"bytes_in_flight":0,'
              '"ssthresh":18446744073709551615,"packets_in_flight":0}'),
        quinn(0.272524, "transport:packet_sent", '{"header":{"packet_type":"initial","packet_number":0,"length":145}}'),
        quinn(0.272524, "recovery:metrics_updated", '{"bytes_in_flight":1200,"packets_in_flight":2}'),
        quinn(0.57291, "transport:packet_received", '{"header":{"packet_type":"initial","packet_number":1}}'),
        quinn(0.57291, "recovery:metrics_updated", '{"min_rtt":0.000300386,"smoothed_rtt":0.000300386,'
              '"latest_rtt":0.000300386,"rtt_variance":0.000112644,"bytes_in_flight":138,"packets_in_flight":1}'),
        quinn(24.552605, "transport:packet_sent", '{"header":{"packet_type":"1RTT","packet_number":16,"length":1452}}'),
        quinn(24.552605, "recovery:metrics_updated", '{"bytes_in_flight":11616,"packets_in_flight":8}'),
        quinn(24.78239, "transport:packet_received", '{"header":{"packet_type":"1RTT","packet_number":11}}'),
        quinn(24.78239, "recovery:metrics_updated", '{"smoothed_rtt":0.000193377,"latest_rtt":0.000229789,'
              '"rtt_variance":0.000140526,"congestion_window":23616,"bytes_in_flight":0,"packets_in_flight":0}'),
        quinn(33.953705, "recovery:packet_lost", '{"header":{"packet_type":"1RTT","packet_number":2351,'
              '"length":1452},"trigger":"reordering_threshold"}')))
    assert rec.role == "server" and rec.packets_sent == 2 and rec.packets_lost == 1
    assert sorted(rec.rtts_ms) == pytest.approx([0.193377, 0.300386, 333.0])
    assert rec.seconds["congestion_control"] == pytest.approx((24.78239 - 24.552605) / 1e3)  # 11616 of 12000
    assert sum(rec.seconds.values()) == pytest.approx(rec.span_s)


def test_a_first_rtt_sample_of_0_333_ms_is_not_taken_for_seconds(tmp_path: Path) -> None:
    """Only an RTT logged before any packet could be acknowledged is the initial RTT: a real sample of
    333 µs (loopback) after the first exchange stays in milliseconds."""
    rec = read_qlog(write(
        tmp_path / "c_client.qlog",
        '{"qlog_version":"0.3","qlog_format":"JSON-SEQ","trace":{"vantage_point":{"type":"client"}}}',
        '{"time":0.1,"name":"transport:packet_sent","data":{"header":{"packet_type":"initial"}}}',
        '{"time":0.5,"name":"transport:packet_received","data":{"header":{"packet_type":"initial"}}}',
        '{"time":0.5,"name":"recovery:metrics_updated","data":{"min_rtt":0.333,"smoothed_rtt":0.333,'
        '"latest_rtt":0.333}}'))
    assert rec.role == "client" and rec.rtts_ms == [0.333]


@pytest.mark.slow
@pytest.mark.parametrize("name", QLOG_STACKS)
def test_both_ends_write_a_qlog_the_parser_reads(name: str, endpoint_build: Any, tmp_path: Path) -> None:
    from lab.endpoints.transfer import BulkTransfer

    built = endpoint_build(name)
    option = built.spec.env_options.get("qlog_dir")
    assert option, f"{name} declares no qlog_dir option"
    qlog_dir = tmp_path / "qlog"  # the endpoints make it
    x = BulkTransfer(SIZE, built=built, env={role: {option: str(qlog_dir)} for role in ("server", "client")})
    with x:
        x.start_server()
        x.start_client_stopped()
        x.release_client()
        deadline = time.monotonic() + 60
        while not x.client_done():
            assert time.monotonic() < deadline, f"{name} client did not finish within 60 s"
            time.sleep(0.02)
        x.check_client()
    files = sorted(p.name for p in qlog_dir.iterdir())
    assert len(files) == 2 and files[0].startswith("client-") and files[1].startswith("server-"), files
    records = read_dir(qlog_dir)
    for rec in records:
        assert rec.role == rec.file.split("-")[0], rec.to_json()
        assert rec.packets_sent > 0 and rec.states_seen, rec.to_json()
        # loopback: well under a millisecond to a few tens (a busy sender's queues); a unit taken wrong is 1000x off
        assert rec.rtt_ms is not None and 0.01 < rec.rtt_ms < 1000, rec.to_json()
        assert rec.span_s > 0 and sum(rec.seconds.values()) == pytest.approx(rec.span_s, rel=0.05), rec.to_json()
    top = sender(records)
    assert top is not None and top.role == "server" and top.packets_sent >= SIZE // 1500, top and top.to_json()
