"""One bulk transfer between a built endpoint's server and client on 127.0.0.1, optionally profiled.

The server is started and waited for (its UDP port bound); the client is
started held right after exec (qprof.endpoints.StoppedProcess), or, for stacks
whose spec names a `client_stop_env`, lets it start up and stop itself right
before connecting (SelfStoppedProcess): either way a profiler attaches before
its first packet. `profile()` attaches qprof to both, releases
the client once sampling runs and stops when the client exits.

    python -m endpoints.transfer NAME [BYTES] [-o RUN]   (from tests/) build, transfer, profile
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from qprof.endpoints import StoppedProcess, free_udp_port, make_certificate, udp_port_bound
from qprof.errors import QprofError

from .build import Built, build


class SelfStoppedProcess(subprocess.Popen):  # type: ignore[type-arg]
    """A child that stops itself (SIGSTOP) once ready; `release()` continues it.

    Same interface as qprof.endpoints.StoppedProcess, for programs whose start-up
    (an interpreter importing its modules) should stay out of the profile.
    """

    def __init__(self, cmd: list[str], stop_env: str, timeout: float = 60.0, **kw: object) -> None:
        env = dict(kw.pop("env", None) or os.environ)  # type: ignore[call-overload]
        env[stop_env] = "1"
        super().__init__(cmd, env=env, **kw)  # type: ignore[call-overload]
        deadline = time.monotonic() + timeout
        while True:
            pid, status = os.waitpid(self.pid, os.WUNTRACED | os.WNOHANG)
            if pid and os.WIFSTOPPED(status):
                break
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
                raise QprofError(f"{cmd[0]} exited before it stopped for attaching (exit {self.returncode})")
            if time.monotonic() > deadline:
                self.kill()
                self.wait()
                raise QprofError(f"{cmd[0]} did not stop itself within {timeout:.0f}s")
            time.sleep(0.01)
        self._held = True

    def release(self) -> None:
        if self._held:
            self._held = False
            os.kill(self.pid, signal.SIGCONT)


def _tmpfs() -> str | None:
    return "/dev/shm" if Path("/dev/shm").is_dir() else None


@dataclass
class BulkTransfer:
    built: Built
    nbytes: int
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="qprof-bulk-", dir=_tmpfs())))
    port: int = field(default_factory=free_udp_port)
    server: subprocess.Popen[bytes] | None = None
    client: StoppedProcess | SelfStoppedProcess | None = None
    released_at: float | None = None
    finished_at: float | None = None
    client_output: str = ""

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start_server(self, timeout: float = 30.0) -> int:
        key, cert = make_certificate(self.workdir)
        with open(self.workdir / "server.err", "wb") as err:
            self.server = subprocess.Popen(self.built.server(self.addr, cert, key), stdin=subprocess.DEVNULL,
                                           stdout=subprocess.DEVNULL, stderr=err)
        deadline = time.monotonic() + timeout
        while not udp_port_bound(self.port):
            if self.server.poll() is not None:
                raise QprofError(f"{self.built.name} server exited at start (exit {self.server.returncode}): "
                                 f"{self._tail('server.err')}")
            if time.monotonic() > deadline:
                raise QprofError(f"{self.built.name} server did not bind UDP port {self.port}")
            time.sleep(0.02)
        return self.server.pid

    def start_client_stopped(self) -> int:
        cmd = self.built.client(self.addr, self.nbytes)
        with open(self.workdir / "client.out", "wb") as out, open(self.workdir / "client.err", "wb") as err:
            if self.built.client_stop_env:
                self.client = SelfStoppedProcess(cmd, self.built.client_stop_env, stdin=subprocess.DEVNULL,
                                                 stdout=out, stderr=err)
            else:
                self.client = StoppedProcess(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=err)
        return self.client.pid

    def release_client(self) -> None:
        assert self.client is not None
        self.released_at = time.monotonic()
        self.client.release()

    def client_done(self) -> bool:
        if self.client is None or self.client.poll() is None:
            return False
        if self.finished_at is None:
            self.finished_at = time.monotonic()
            self.client_output = (self.workdir / "client.out").read_text(errors="replace").strip()
        return True

    def check_client(self) -> None:
        """Raise unless the client exited 0 having received every byte."""
        assert self.client is not None
        if self.client.returncode != 0 or f"bytes={self.nbytes} " not in self.client_output + " ":
            raise QprofError(f"{self.built.name} client failed (exit {self.client.returncode}): "
                             f"{self.client_output!r} {self._tail('client.err')}")

    def goodput_gbps(self) -> float | None:
        if self.released_at is None or self.finished_at is None:
            return None
        return self.nbytes * 8 / (self.finished_at - self.released_at) / 1e9

    def _tail(self, name: str) -> str:
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
        for p in (self.client, self.server):
            if p is not None:
                self.built.cleanup(p.pid)
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> "BulkTransfer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def profile(built: Built, nbytes: int | None = None, out: Path | None = None,
            status: Callable[[str], None] = lambda msg: None,
            **attach: Any) -> tuple[Path, BulkTransfer]:
    """One profiled transfer (server and client attached, AttachOptions `**attach`); returns (run dir, transfer).

    Raises QprofError when the client did not receive every byte.
    """
    from qprof.collectors.session import AttachOptions, AttachSession

    n = nbytes or built.spec.test_bytes
    out = out or Path(tempfile.mkdtemp(prefix=f"qprof-run-{built.name}-")) / "run"
    with BulkTransfer(built, n) as xfer:
        server = xfer.start_server()
        client = xfer.start_client_stopped()
        opts = AttachOptions(pids=[server, client], out=out, roles={server: "server", client: "client"}, **attach)
        run = AttachSession(opts, on_ready=xfer.release_client, stop_when=xfer.client_done, status=status).run()
        assert xfer.client is not None
        xfer.client.wait(30)
        xfer.client_done()
        xfer.check_client()
    return run, xfer


def main(argv: list[str]) -> int:
    import argparse

    from qprof.endpoints import parse_size

    ap = argparse.ArgumentParser(prog="python -m endpoints.transfer")
    ap.add_argument("name")
    ap.add_argument("size", nargs="?")
    ap.add_argument("-o", "--out", type=Path)
    args = ap.parse_args(argv)
    run, xfer = profile(build(args.name), parse_size(args.size) if args.size else None, args.out,
                        status=lambda m: print(m, file=sys.stderr))
    print(f"{run}  {xfer.client_output}  goodput {xfer.goodput_gbps() or 0:.2f} Gbit/s (profiled)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
