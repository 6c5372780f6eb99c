"""One bulk transfer between a built endpoint's server and client (127.0.0.1 or `host`), optionally profiled.

The server is started and waited for (its UDP port bound); the client is
started held right after exec (qprof.endpoints.StoppedProcess), or, for stacks
whose spec names a `client_stop_env`, lets it start up and stop itself right
before connecting (SelfStoppedProcess): either way a profiler attaches before
its first packet. `profile()` attaches qprof to both, releases
the client once sampling runs and stops when the client exits.

    python -m lab.endpoints.transfer NAME [BYTES] [-o RUN]   (from the repository root) build, transfer, profile
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from lab.transfers import Transfer
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


@dataclass
class BulkTransfer(Transfer):
    """A built endpoint's server and client (lab/endpoints), moving `size` bytes on one stream."""

    built: Built | None = None
    client_output: str = ""

    @property
    def name(self) -> str:
        assert self.built is not None
        return self.built.name

    @property
    def nbytes(self) -> int:
        return self.size

    @property
    def addr(self) -> str:
        return f"{self.host}:{self.port}"

    def server_command(self, key: Path, cert: Path) -> list[str]:
        assert self.built is not None
        return self.built.server(self.addr, cert, key)

    def client_command(self) -> list[str]:
        assert self.built is not None
        return self.built.client(self.addr, self.size)

    def hold_client(self, cmd: list[str], **kw: Any) -> Any:
        assert self.built is not None
        if self.built.client_stop_env:
            return SelfStoppedProcess(cmd, self.built.client_stop_env, **kw)
        return super().hold_client(cmd, **kw)

    def client_done(self) -> bool:
        done = super().client_done()
        if done and not self.client_output:
            self.client_output = (self.workdir / "client.out").read_text(errors="replace").strip()
        return done

    def check_client(self) -> None:
        """Raise unless the client exited 0 having received every byte."""
        assert self.client is not None
        if self.client.returncode != 0 or f"bytes={self.size} " not in self.client_output + " ":
            raise QprofError(f"{self.name} client failed (exit {self.client.returncode}): "
                             f"{self.client_output!r} {self.tail('client.err')}")

    def close(self) -> None:
        pids = [p.pid for p in (self.client, self.server) if p is not None]
        super().close()
        assert self.built is not None
        for pid in pids:
            self.built.cleanup(pid)


def profile(built: Built, nbytes: int | None = None, out: Path | None = None,
            status: Callable[[str], None] = lambda msg: None,
            **attach: Any) -> tuple[Path, BulkTransfer]:
    """One profiled transfer (server and client attached, AttachOptions `**attach`); returns (run dir, transfer).

    Raises QprofError when the client did not receive every byte.
    """
    from qprof.collectors.session import AttachOptions, AttachSession

    n = nbytes or built.spec.test_bytes
    out = out or Path(tempfile.mkdtemp(prefix=f"qprof-run-{built.name}-")) / "run"
    with BulkTransfer(n, built=built) as xfer:
        server = xfer.start_server()
        client = xfer.start_client_stopped()
        opts = AttachOptions(pids=[server, client], out=out, roles={server: "server", client: "client"}, **attach)
        run = AttachSession(opts, on_ready=xfer.release_client, stop_when=xfer.client_done, stop_when_exits=[client],
                           status=status).run()
        assert xfer.client is not None
        xfer.client.wait(30)
        xfer.client_done()
        xfer.check_client()
    return run, xfer


def main(argv: list[str]) -> int:
    import argparse

    from qprof.units import parse_size

    ap = argparse.ArgumentParser(prog="python -m lab.endpoints.transfer")
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
