"""OTLP profiles export: the request qprof builds (decoded back, per category equal to the report), the round
trip through a real OpenTelemetry Collector built from its Go modules (what its file exporter wrote, per
category equal to the report, from `qprof export` and from `qprof record --otlp`), and the failures: a
collector that is down (retries, one line, the archive untouched) or that answers with an error status."""

from __future__ import annotations

import hashlib
import json
import socket
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import pytest

from conftest import qprof
from qprof.errors import QprofError
from qprof.export import PROFILES_PATH, endpoint, send


def _free_port() -> int:
    """A TCP port free right now on 127.0.0.1 (for a collector, or for nothing to listen on)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _digest(run: Path) -> dict[str, str]:
    return {str(p.relative_to(run)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(run.rglob("*")) if p.is_file()}


def _report_cpu(run: Path) -> dict[str, float]:
    """Each category's CPU seconds over the run's processes, as `qprof report --format json` gives them."""
    report = json.loads(qprof("report", str(run), "--format", "json").stdout)
    out: dict[str, float] = {}
    for p in report["processes"]:
        for cat, seconds in p["category_cpu_seconds"].items():
            out[cat] = out.get(cat, 0.0) + seconds
    return out


def test_endpoint_urls() -> None:
    assert endpoint("http://127.0.0.1:4318") == f"http://127.0.0.1:4318{PROFILES_PATH}"
    assert endpoint("https://otel.example:443/") == f"https://otel.example:443{PROFILES_PATH}"
    assert endpoint("http://h:1/custom/profiles") == "http://h:1/custom/profiles"
    for bad in ("127.0.0.1:4318", "ftp://h", "http://", ""):
        with pytest.raises(QprofError, match="OTLP/HTTP address"):
            endpoint(bad)


def test_request_decodes_to_the_reports_figures(ngtcp2_capture: Any, tmp_path: Path) -> None:
    """`report -o X.otlp.pb` writes the request `export` sends: decoded, each category's CPU time is the
    report's, every table starts with its zero value and every sample names its thread and category."""
    from opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2 import (
        ExportProfilesServiceRequest)

    from qprof.viewer.otlp import CATEGORY, THREAD_ID, category_nanos

    run = ngtcp2_capture("gso")
    out = tmp_path / "p.otlp.pb"
    qprof("report", str(run), "-o", str(out))
    req = ExportProfilesServiceRequest()
    req.ParseFromString(out.read_bytes())
    d = req.dictionary
    assert d.string_table[0] == "" and d.stack_table[0].location_indices == [] and not d.attribute_table[0].key_strindex
    got = {c: ns / 1e9 for c, ns in category_nanos(req).items()}
    want = _report_cpu(run)
    assert got.keys() <= want.keys()
    for cat, seconds in want.items():
        assert got.get(cat, 0.0) == pytest.approx(seconds, abs=2e-3), cat  # the report rounds to ms
    keys = {d.string_table[kv.key_strindex] for kv in d.attribute_table}
    assert {CATEGORY, THREAD_ID, "thread.name", "qprof.role", "qprof.stack"} <= keys
    roles = set()
    for rp in req.resource_profiles:
        res = {kv.key: kv.value for kv in rp.resource.attributes}
        assert res["host.name"].string_value and res["os.version"].string_value and res["process.pid"].int_value
        roles.add(res["qprof.role"].string_value)
        for prof in (p for sp in rp.scope_profiles for p in sp.profiles):
            assert d.string_table[prof.sample_type.type_strindex] == "cpu" and prof.period > 0
            assert all(0 < s.stack_index < len(d.stack_table) for s in prof.samples)
    assert roles == {"server", "client"}


@pytest.fixture(scope="module")
def collector_binary() -> Path:
    from lab.collector import binary
    from lab.endpoints.build import BuildUnavailable

    try:
        return binary()
    except BuildUnavailable as e:
        pytest.skip(str(e))


class Collector:
    def __init__(self, exe: Path, tmp: Path) -> None:
        from lab.collector import FEATURE_GATES, config

        self.port = _free_port()
        self.out = tmp / "received.jsonl"
        cfg = tmp / "otelcol.yaml"
        cfg.write_text(config(self.port, self.out))
        self.log = tmp / "otelcol.log"
        self.proc = subprocess.Popen([str(exe), f"--config={cfg}", f"--feature-gates={FEATURE_GATES}"],
                                     stdout=self.log.open("w"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while "Everything is ready" not in self.log.read_text():
            assert self.proc.poll() is None and time.monotonic() < deadline, self.log.read_text()[-2000:]
            time.sleep(0.1)
        self.url = f"http://127.0.0.1:{self.port}"

    def received(self, requests: int) -> list[dict[str, Any]]:
        """The documents the file exporter wrote, once `requests` of them are there."""
        deadline = time.monotonic() + 20
        while True:
            lines = self.out.read_text().splitlines() if self.out.exists() else []
            if len(lines) >= requests:
                return [json.loads(line) for line in lines]
            assert time.monotonic() < deadline, f"the collector wrote {len(lines)} of {requests} documents"
            time.sleep(0.1)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(20)


@pytest.fixture
def collector(collector_binary: Path, tmp_path: Path) -> Iterator[Collector]:
    c = Collector(collector_binary, tmp_path)
    try:
        yield c
    finally:
        c.stop()


def _received_cpu(doc: dict[str, Any]) -> dict[str, float]:
    """Each category's CPU seconds in one document the collector wrote (OTLP JSON, its own dictionary)."""
    d = doc["dictionary"]
    strings = d["stringTable"]

    def text(v: dict[str, Any]) -> str:
        return v["stringValue"] if "stringValue" in v else strings[int(v.get("stringValueStrindex", 0))]

    attrs = d["attributeTable"]
    out: dict[str, float] = {}
    for rp in doc["resourceProfiles"]:
        for sp in rp["scopeProfiles"]:
            for prof in sp["profiles"]:
                for s in prof.get("samples", []):
                    for i in s.get("attributeIndices", []):
                        kv = attrs[i]
                        if strings[int(kv.get("keyStrindex", 0))] == "qprof.category":
                            cat = text(kv["value"])
                            out[cat] = out.get(cat, 0.0) + sum(int(v) for v in s["values"]) / 1e9
    return out


def _same_as_report(received: dict[str, float], run: Path) -> dict[str, float]:
    want = _report_cpu(run)
    for cat, seconds in want.items():
        assert received.get(cat, 0.0) == pytest.approx(seconds, abs=2e-3), (cat, received, want)
    return want


@pytest.mark.root
@pytest.mark.slow
def test_round_trip_through_a_real_collector(ngtcp2_capture: Any, collector: Collector, tmp_path: Path) -> None:
    run = ngtcp2_capture("gso")
    before = _digest(run)
    r = qprof("export", str(run), "--otlp", collector.url)
    assert "HTTP 200" in r.stderr and f"{collector.url}{PROFILES_PATH}" in r.stderr
    (doc,) = collector.received(1)
    got = _received_cpu(doc)
    want = _same_as_report(got, run)
    assert _digest(run) == before
    print("\nOTLP round trip, CPU s per category, report / collector: "
          + ", ".join(f"{c} {s:.3f} / {got.get(c, 0.0):.4f}" for c, s in want.items()))


@pytest.mark.root
@pytest.mark.slow
def test_record_sends_when_the_run_ends(ngtcp2_tools: None, probes_available: None, collector: Collector,
                                        tmp_path: Path) -> None:
    from qprof.endpoints import free_udp_port, make_certificate, make_payload

    d = tmp_path / "srv"
    d.mkdir()
    make_payload(d, 32 << 20)
    key, cert = make_certificate(d)
    port = free_udp_port()
    server = f"gtlsserver -q --no-quic-dump --no-http-dump -d {d} 127.0.0.1 {port} {key} {cert}"
    client = (f"gtlsclient -q --no-quic-dump --no-http-dump --exit-on-all-streams-close 127.0.0.1 {port} "
              f"https://127.0.0.1:{port}/payload")
    out = tmp_path / "rec"
    r = qprof("record", "-q", "-o", str(out), "--ready", f"udp:{port}", "--server", server, "--client", client,
              "--otlp", collector.url)
    assert "HTTP 200" in r.stderr
    (doc,) = collector.received(1)
    _same_as_report(_received_cpu(doc), out)


@pytest.mark.root
def test_collector_down_retries_then_one_line(ngtcp2_capture: Any) -> None:
    run = ngtcp2_capture("gso")
    before = _digest(run)
    port = _free_port()  # nothing listens there
    t0 = time.monotonic()
    r = qprof("export", str(run), "--otlp", f"http://127.0.0.1:{port}", check=False)
    took = time.monotonic() - t0
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "failed after 5 tries (Connection refused)" in r.stderr and "archive is kept" in r.stderr
    assert took >= 0.5 + 1 + 2 + 4, "backed off between the tries"
    assert _digest(run) == before


class _Scripted(BaseHTTPRequestHandler):
    """Answers each POST with the next (status, headers) of `script`; counts what it received."""

    script: list[tuple[int, dict[str, str]]] = []
    bodies: list[int] = []
    ok_body = b""  # an ExportProfilesServiceResponse; empty: full success

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        n = int(self.headers.get("Content-Length", 0))
        self.rfile.read(n)
        type(self).bodies.append(n)
        status, headers = type(self).script.pop(0) if type(self).script else (200, {})
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        body = type(self).ok_body if status == 200 else b"\x10\x03\x12\x0bbad request"  # google.rpc.Status
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def scripted() -> Iterator[tuple[str, type[_Scripted]]]:
    handler = type("Handler", (_Scripted,), {"script": [], "bodies": [], "ok_body": b""})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler
    finally:
        server.shutdown()


def test_error_status_is_final_busy_is_retried(scripted: tuple[str, type[_Scripted]]) -> None:
    url, handler = scripted
    handler.script = [(400, {})]
    with pytest.raises(QprofError, match=r"refused \(HTTP 400: bad request\); the run archive is kept") as e:
        send(url, b"x", first_wait_s=0.01)
    assert "\n" not in str(e.value) and handler.bodies == [1]
    handler.bodies.clear()
    handler.script = [(503, {"Retry-After": "0"}), (429, {}), (200, {})]
    sent = send(url, b"abc", first_wait_s=0.01)
    assert (sent.status, sent.tries, sent.bytes, sent.rejected) == (200, 3, 3, 0) and handler.bodies == [3, 3, 3]
    handler.bodies.clear()
    # a past HTTP date is no wait; an unreadable one falls back to the backoff instead of failing the export
    handler.script = [(503, {"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}), (503, {"Retry-After": "soon"}),
                      (200, {})]
    sent = send(url, b"abc", first_wait_s=0.01)
    assert (sent.status, sent.tries) == (200, 3) and handler.bodies == [3, 3, 3]
    handler.bodies.clear()
    handler.script = [(503, {})] * 5
    with pytest.raises(QprofError, match="failed after 5 tries .HTTP 503"):
        send(url, b"abc", first_wait_s=0.01)
    assert len(handler.bodies) == 5


def test_partial_success_is_reported(scripted: tuple[str, type[_Scripted]]) -> None:
    """A collector that keeps some profiles and rejects others says how many in its answer."""
    from opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2 import (
        ExportProfilesServiceResponse)

    url, handler = scripted
    answer = ExportProfilesServiceResponse()
    answer.partial_success.rejected_profiles = 2
    answer.partial_success.error_message = "too many locations"
    handler.ok_body = answer.SerializeToString()
    sent = send(url, b"abc")
    assert (sent.status, sent.tries, sent.rejected, sent.message) == (200, 1, 2, "too many locations")
