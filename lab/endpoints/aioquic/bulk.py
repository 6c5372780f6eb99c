"""Bulk-transfer QUIC endpoint on aioquic (asyncio), for qprof's tests.

    python -X perf bulk.py server ADDR CERT KEY   serve until killed
    python -X perf bulk.py client ADDR BYTES      download BYTES, print "bytes=N seconds=S", exit 0

Protocol (as the quic-go endpoint): the client opens one bidirectional stream,
writes the byte count (8 bytes, big-endian) and ends its side; the server
writes that many bytes from a reused random buffer and ends the stream; the
client reads until EOF and checks the count. `-X perf` (Python >= 3.12) makes
Python function names visible to perf as `py::function:file` frames.

With QPROF_BULK_SELF_STOP=1 the client stops itself (SIGSTOP) once the
interpreter has started and imported everything, right before connecting: a
profiler attaches then and sends SIGCONT, so the profile holds the transfer,
not the interpreter's start-up. The client leaves with os._exit once done,
skipping the interpreter's teardown for the same reason.
"""

from __future__ import annotations

import asyncio
import os
import signal
import ssl
import sys
import time

from aioquic.asyncio import QuicConnectionProtocol, connect, serve
from aioquic.quic import events
from aioquic.quic.configuration import QuicConfiguration

ALPN = ["qprof-bulk"]
CHUNK = 1 << 20
UNSENT_LOW = 2 << 20  # queue more once fewer bytes than this wait to be sent


def configuration(is_client: bool) -> QuicConfiguration:
    return QuicConfiguration(is_client=is_client, alpn_protocols=ALPN, idle_timeout=30.0,
                             max_data=128 << 20, max_stream_data=64 << 20)


def split_addr(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    return host.strip("[]"), int(port)


class BulkServer(QuicConnectionProtocol):
    """Answers each stream's 8-byte request with that many bytes, queued as the sender drains."""

    payload = os.urandom(CHUNK)

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self._requests: dict[int, bytearray] = {}
        self._left: dict[int, int] = {}
        self._queued: dict[int, int] = {}

    def quic_event_received(self, event: events.QuicEvent) -> None:
        if isinstance(event, events.StreamDataReceived) and event.stream_id not in self._left:
            req = self._requests.setdefault(event.stream_id, bytearray())
            req += event.data
            if len(req) >= 8:
                del self._requests[event.stream_id]
                self._left[event.stream_id] = int.from_bytes(req[:8], "big")
                self._queued[event.stream_id] = 0

    def transmit(self) -> None:
        for sid in list(self._left):
            self._refill(sid)
        super().transmit()

    def _refill(self, sid: int) -> None:
        stream = self._quic._streams.get(sid)
        if stream is None:
            del self._left[sid], self._queued[sid]
            return
        left = self._left[sid]
        while left > 0 and self._queued[sid] - stream.sender.highest_offset < UNSENT_LOW:
            n = min(left, CHUNK)
            left -= n
            self._quic.send_stream_data(sid, self.payload[:n], end_stream=left == 0)
            self._queued[sid] += n
        if left == 0:
            del self._left[sid], self._queued[sid]
        else:
            self._left[sid] = left


async def run_server(addr: str, cert: str, key: str) -> None:
    config = configuration(is_client=False)
    config.load_cert_chain(cert, key)
    host, port = split_addr(addr)
    await serve(host, port, configuration=config, create_protocol=BulkServer)
    await asyncio.Future()


async def run_client(addr: str, want: int) -> None:
    config = configuration(is_client=True)
    config.verify_mode = ssl.CERT_NONE
    host, port = split_addr(addr)
    if os.environ.get("QPROF_BULK_SELF_STOP") == "1":
        os.kill(os.getpid(), signal.SIGSTOP)
    start = time.monotonic()
    async with connect(host, port, configuration=config) as conn:
        reader, writer = await conn.create_stream()
        writer.write(want.to_bytes(8, "big"))
        writer.write_eof()
        got = 0
        while True:
            data = await reader.read(CHUNK)
            if not data:
                break
            got += len(data)
        secs = time.monotonic() - start
        conn.close()
    if got != want:
        sys.exit(f"bulk.py: received {got} bytes, expected {want}")
    print(f"bytes={got} seconds={secs:.3f}")


def main(argv: list[str]) -> None:
    if len(argv) == 5 and argv[1] == "server":
        asyncio.run(run_server(argv[2], argv[3], argv[4]))
    elif len(argv) == 4 and argv[1] == "client":
        want = int(argv[3])
        if want <= 0:
            sys.exit("bulk.py: BYTES must be a positive integer")
        asyncio.run(run_client(argv[2], want))
        # skip the interpreter's teardown (a full GC of every module): not part of the transfer
        sys.stdout.flush()
        os._exit(0)
    else:
        sys.exit("usage: bulk.py server ADDR CERT KEY | bulk.py client ADDR BYTES")


if __name__ == "__main__":
    try:
        main(sys.argv)
    except KeyboardInterrupt:
        pass
