"""Send a run's profiles to an OpenTelemetry Collector (OTLP/HTTP, protobuf), retrying as OTLP says.

A collector restarts, sheds load and sits behind proxies: OTLP/HTTP clients
retry 429, 502, 503 and 504 and a refused or cut connection, waiting the
server's Retry-After when it gives one, else backing off exponentially; any
other status is final. The request is built once and sent as is each time.
Nothing here touches the run directory: an export that fails leaves the
archive whole, to be sent again with `qprof export`.
"""

from __future__ import annotations

import email.utils
import http.client
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from qprof.errors import QprofError

PROFILES_PATH = "/v1development/profiles"  # OTLP/HTTP's path of the profiles signal
RETRYABLE = frozenset({429, 502, 503, 504})
TRIES = 5
FIRST_WAIT_S = 0.5
MAX_WAIT_S = 30.0  # a Retry-After longer than this is cut to it


@dataclass(frozen=True)
class Sent:
    url: str
    status: int
    tries: int
    bytes: int
    rejected: int  # profiles the collector refused in a partial success
    message: str  # the collector's partial-success message, if any


def endpoint(url: str) -> str:
    """The profiles URL of a collector given as `http://host:4318` (the path added) or in full."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise QprofError(f"--otlp {url!r}: give the collector's OTLP/HTTP address, e.g. http://127.0.0.1:4318")
    if parts.path in ("", "/"):
        parts = parts._replace(path=PROFILES_PATH)
    return urllib.parse.urlunsplit(parts)


def _retry_after(value: str | None) -> float | None:
    """The wait a Retry-After header asks for (seconds or an HTTP date); None when absent or unreadable,
    so a proxy's malformed header means the usual backoff, not a failed export."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _status_message(body: bytes) -> str:
    """The message of a google.rpc.Status body (field 2), or the body's text."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    fdp = descriptor_pb2.FileDescriptorProto(name="qprof_status.proto", package="qprof_status")
    m = fdp.message_type.add(name="Status")
    m.field.add(name="code", number=1, type=descriptor_pb2.FieldDescriptorProto.TYPE_INT32, label=1)
    m.field.add(name="message", number=2, type=descriptor_pb2.FieldDescriptorProto.TYPE_STRING, label=1)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    status = message_factory.GetMessageClass(pool.FindMessageTypeByName("qprof_status.Status"))()
    try:
        status.ParseFromString(body)
        if status.message:
            return str(status.message)
    except Exception:  # noqa: BLE001 (not a Status: show the text)
        pass
    return body.decode("utf-8", "replace").strip()[:200]


def send(url: str, body: bytes, tries: int = TRIES, first_wait_s: float = FIRST_WAIT_S,
         timeout_s: float = 10.0) -> Sent:
    """POST `body` (an ExportProfilesServiceRequest) to the collector at `url`; QprofError with one
    line when it refuses, or cannot be reached after `tries` (the waits between them: 0.5, 1, 2, 4 s)."""
    from opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2 import (
        ExportProfilesServiceResponse)

    target = endpoint(url)
    wait = first_wait_s
    last = ""
    for attempt in range(1, tries + 1):
        req = urllib.request.Request(target, data=body, method="POST",
                                     headers={"Content-Type": "application/x-protobuf"})
        pause: float | None = None
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as r:
                answer = ExportProfilesServiceResponse()
                answer.ParseFromString(r.read())
                part = answer.partial_success
                return Sent(target, r.status, attempt, len(body), part.rejected_profiles, part.error_message)
        except urllib.error.HTTPError as e:
            text = _status_message(e.read() or b"")
            last = f"HTTP {e.code}" + (f": {text}" if text else "")
            if e.code not in RETRYABLE:
                raise QprofError(f"OTLP export to {target} refused ({last}); the run archive is kept") from None
            pause = _retry_after(e.headers.get("Retry-After"))
        except (urllib.error.URLError, http.client.HTTPException, ConnectionError, socket.timeout) as e:
            reason = getattr(e, "reason", e)
            last = str(reason.strerror if isinstance(reason, OSError) and reason.strerror else reason)
        if attempt < tries:
            time.sleep(min(pause if pause is not None else wait, MAX_WAIT_S))
            wait *= 2
    raise QprofError(f"OTLP export to {target} failed after {tries} tries ({last}); is the collector up, with "
                     "an OTLP/HTTP receiver there? The run archive is kept: `qprof export RUN --otlp URL` "
                     "sends it again")
