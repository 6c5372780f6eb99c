"""When a server is ready for its client: the `--ready` conditions of `qprof record`, and their checks.

A client released too early finds no server (connection refused, or QUIC
handshakes retried after a timeout that lands in the profile); released too
late, the run holds idle time. The conditions are what a benchmark script
would wait for:
  auto          any listening TCP socket or bound UDP socket of the server
                (or a process it started), in its own network namespace
  udp:PORT      UDP port PORT bound in the server's network namespace
  tcp:PORT      TCP port PORT listening there
  line:REGEX    a line of the server's output (stdout or stderr) matches
  delay:SECONDS that long after the server was released
Sockets are read from /proc (the server's fds, /proc/PID/net): no packet is
sent to the server to find out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from qprof.collectors import procfs
from qprof.probes.sockets import socket_inodes
from qprof.errors import QprofError

KINDS = ("auto", "udp", "tcp", "line", "delay")
TCP_LISTEN = "0A"  # /proc/net/tcp state column


@dataclass(frozen=True)
class Ready:
    """One condition; `timeout` is how long the server gets to meet it."""

    kind: str = "auto"
    port: int | None = None
    pattern: str | None = None
    delay_s: float = 0.0
    timeout_s: float = 30.0

    def describe(self) -> str:
        return {"auto": "a listening TCP or bound UDP socket", "udp": f"UDP port {self.port} bound",
                "tcp": f"TCP port {self.port} listening", "line": f"an output line matching {self.pattern!r}",
                "delay": f"{self.delay_s:g} s"}[self.kind]


def parse_ready(text: str, timeout_s: float = 30.0) -> Ready:
    """`--ready` value -> Ready; one line naming what is wrong otherwise."""
    if not 0 < timeout_s <= 3600:
        raise QprofError(f"--ready-timeout {timeout_s:g} is out of range: give seconds > 0 (at most 3600)")
    kind, sep, value = text.partition(":")
    kind = kind.strip().lower()
    usage = "use auto, udp:PORT, tcp:PORT, line:REGEX or delay:SECONDS"
    if kind == "auto" and not sep:
        return Ready(timeout_s=timeout_s)
    if kind in ("udp", "tcp") and sep:
        if not value.isdigit() or not 0 < int(value) < 65536:
            raise QprofError(f"--ready {text!r}: {value!r} is not a port (1-65535)")
        return Ready(kind, port=int(value), timeout_s=timeout_s)
    if kind == "line" and sep and value:
        try:
            re.compile(value)
        except re.error as e:
            raise QprofError(f"--ready {text!r}: not a regular expression ({e})") from None
        return Ready(kind, pattern=value, timeout_s=timeout_s)
    if kind == "delay" and sep:
        try:
            delay = float(value)
        except ValueError:
            delay = -1.0
        if not 0 <= delay <= timeout_s:
            raise QprofError(f"--ready {text!r}: give a delay in seconds, at most --ready-timeout")
        return Ready(kind, delay_s=delay, timeout_s=timeout_s)
    raise QprofError(f"--ready {text!r} is not a condition: {usage}")


def _sockets(pid: int, proto: str) -> list[tuple[int, str, str]]:
    """(local port, state, inode) of every `proto` socket of `pid`'s network namespace."""
    rows = []
    for table in (proto, proto + "6"):
        try:
            with open(f"/proc/{pid}/net/{table}", encoding="ascii") as f:
                next(f, None)
                for line in f:
                    parts = line.split()
                    if len(parts) > 9:
                        rows.append((int(parts[1].rsplit(":", 1)[1], 16), parts[3], parts[9]))
        except (OSError, ValueError):
            continue
    return rows


def port_bound(proto: str, port: int, pid: int) -> bool:
    """Is `port` bound (UDP) or listening (TCP) in `pid`'s network namespace?"""
    return any(p == port and (proto == "udp" or state == TCP_LISTEN) for p, state, _ in _sockets(pid, proto))


def serving(pid: int) -> bool:
    """Does `pid` or a process it started hold a listening TCP socket or a bound UDP socket?"""
    procs = procfs.descendants(pid)
    mine = set().union(*(socket_inodes(p) for p in procs))
    if not mine:
        return False
    return any(inode in mine and port and (proto == "udp" or state == TCP_LISTEN)
               for proto in ("tcp", "udp") for port, state, inode in _sockets(pid, proto))


class ReadyCheck:
    """Checks one condition against a released server, cheaply enough to call every 50 ms."""

    def __init__(self, ready: Ready, pid: int, output: Path, released_at: float) -> None:
        self.ready, self.pid, self.output, self.released_at = ready, pid, output, released_at
        self._regex = re.compile(ready.pattern) if ready.pattern else None
        self._offset = 0
        self._partial = b""

    def met(self, now: float) -> bool:
        r = self.ready
        if r.kind == "delay":
            return now - self.released_at >= r.delay_s
        if r.kind in ("udp", "tcp"):
            assert r.port is not None
            return port_bound(r.kind, r.port, self.pid)
        if r.kind == "line":
            return self._new_line_matches()
        return serving(self.pid)

    def timed_out(self, now: float) -> bool:
        return now - self.released_at > self.ready.timeout_s

    def _new_line_matches(self) -> bool:
        assert self._regex is not None
        try:
            with open(self.output, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except OSError:
            return False
        self._offset += len(data)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        # the unfinished last line too: a prompt printed without a newline is output all the same
        return any(self._regex.search(ln.decode("utf-8", "replace")) for ln in [*lines, self._partial])
