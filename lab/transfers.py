"""One bulk transfer to profile, run by the tests and benches: a server, a client held right after exec.

`Transfer` owns the life cycle (certificate, server start until its UDP port is bound, the held
client, release, completion, goodput, clean-up); subclasses say how to run their server and
client: `Ngtcp2Transfer` (Debian's ngtcp2 pair, the one `qprof demo` runs) here, the stacks built
from lab/endpoints in lab.endpoints.transfer.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qprof.endpoints import (Placement, StoppedProcess, free_udp_port, make_certificate, make_payload,
                             ngtcp2_client_command, ngtcp2_server_command, work_dir)
from qprof.errors import QprofError
from qprof.probes.children import die_with_parent
from qprof.ready import port_bound


@dataclass
class Transfer:
    """A server on `host` (127.0.0.1) and a client held right after exec: one bulk transfer to profile.

    Subclasses say how to run their server and client (`server_command`,
    `client_command`, both using `host` and `port`); this class owns the life
    cycle: certificate (its SAN names `host`), server start until its UDP port
    is bound, the held client, release, completion, goodput, and clean-up of
    both processes and the work directory. `placement` maps a role ("server",
    "client") to the network namespace and cgroup its process starts in, `env`
    to variables added to its environment (a test endpoint's options).
    """

    size: int
    workdir: Path = field(default_factory=work_dir)
    port: int = field(default_factory=free_udp_port)
    host: str = "127.0.0.1"  # the server's address: it binds there, the client connects there
    placement: dict[str, Placement] = field(default_factory=dict)
    env: dict[str, dict[str, str]] = field(default_factory=dict)  # role -> variables added to its environment
    server: subprocess.Popen[bytes] | None = None
    client: Any = None  # a held process with .release() (StoppedProcess or alike)
    released_at: float | None = None
    finished_at: float | None = None

    @property
    def name(self) -> str:
        return type(self).__name__

    def server_command(self, key: Path, cert: Path) -> list[str]:
        raise NotImplementedError

    def client_command(self) -> list[str]:
        raise NotImplementedError

    def transferred_bytes(self) -> int:
        return self.size

    def hold_client(self, cmd: list[str], **kw: Any) -> Any:
        """Start the client held before its first packet (override for other ways of holding)."""
        return StoppedProcess(cmd, **kw)

    def _placed(self, role: str) -> dict[str, Any]:
        where = self.placement.get(role)
        kw: dict[str, Any] = {"preexec_fn": where.preexec} if where is not None else {}
        if self.env.get(role):
            kw["env"] = {**os.environ, **self.env[role]}
        return kw

    def _check_placed(self, role: str, pid: int) -> None:
        where = self.placement.get(role)
        if where is not None:
            where.check(pid)

    def start_server(self, timeout: float = 30.0) -> int:
        """Start the server and wait until its UDP port is bound. It dies with the thread that started
        it (PR_SET_PDEATHSIG): a test run killed or stopped by a second Ctrl-C in `close` leaves no server."""
        key, cert = make_certificate(self.workdir, (self.host,))
        kw = self._placed("server")
        placed, orphan_guard = kw.pop("preexec_fn", None), die_with_parent(signal.SIGKILL)

        def preexec() -> None:
            orphan_guard()
            if placed is not None:
                placed()

        with open(self.workdir / "server.err", "wb") as err:
            self.server = subprocess.Popen(self.server_command(key, cert), stdin=subprocess.DEVNULL,
                                           stdout=subprocess.DEVNULL, stderr=err, preexec_fn=preexec, **kw)
        self._check_placed("server", self.server.pid)
        deadline = time.monotonic() + timeout
        while not port_bound("udp", self.port, self.server.pid):
            if self.server.poll() is not None:
                raise QprofError(f"{self.name} server exited at start (exit {self.server.returncode}): "
                                 f"{self.tail('server.err')}")
            if time.monotonic() > deadline:
                raise QprofError(f"{self.name} server did not bind UDP port {self.port}")
            time.sleep(0.02)
        return self.server.pid

    def start_client_stopped(self) -> int:
        with open(self.workdir / "client.out", "wb") as out, open(self.workdir / "client.err", "wb") as err:
            self.client = self.hold_client(self.client_command(), stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                           **self._placed("client"))
        self._check_placed("client", int(self.client.pid))
        return int(self.client.pid)

    def release_client(self) -> None:
        assert self.client is not None
        self.released_at = time.monotonic()
        self.client.release()

    def client_done(self) -> bool:
        if self.client is None or self.client.poll() is None:
            return False
        if self.finished_at is None:
            self.finished_at = time.monotonic()
        return True

    def goodput_gbps(self) -> float | None:
        if self.released_at is None or self.finished_at is None or self.client is None or self.client.returncode:
            return None
        return self.transferred_bytes() * 8 / (self.finished_at - self.released_at) / 1e9

    def tail(self, name: str) -> str:
        try:
            return " | ".join((self.workdir / name).read_text(errors="replace").strip().splitlines()[-3:])
        except OSError:
            return ""

    def close(self) -> None:
        if self.client is not None:
            self.client.release()  # a traced child cannot be terminated while held
        for p in (self.client, self.server):
            if p is not None and p.poll() is None:
                p.terminate()
                try:
                    p.wait(5)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> "Transfer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class Ngtcp2Transfer(Transfer):
    """A gtlsserver serving one file from tmpfs and a gtlsclient downloading it (the demo's pair)."""

    requests: int = 1  # the client fetches the file this many times (streams of one connection)
    qlog_dir: Path | None = None  # both ends write their qlog there (--qlog-dir)
    client_window: int | None = None  # the client's flow-control windows, bytes (connection and stream)

    def server_command(self, key: Path, cert: Path) -> list[str]:
        make_payload(self.workdir, self.size)
        return ngtcp2_server_command(self.workdir, self.host, self.port, key, cert) + self._qlog()

    def client_command(self) -> list[str]:
        cmd = ngtcp2_client_command(self.host, self.port, self.requests)
        if self.client_window:
            w = self.client_window  # later flags win: the windows start and stay this small
            cmd[-3:-3] = [f"--max-data={w}", f"--max-stream-data-bidi-local={w}", f"--max-window={w}",
                          f"--max-stream-window={w}"]
        return cmd[:-3] + self._qlog() + cmd[-3:]

    def _qlog(self) -> list[str]:
        if self.qlog_dir is None:
            return []
        self.qlog_dir.mkdir(parents=True, exist_ok=True)
        return [f"--qlog-dir={self.qlog_dir}"]

    def transferred_bytes(self) -> int:
        return self.size * self.requests
