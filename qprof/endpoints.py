"""The QUIC endpoints qprof runs by itself (`qprof demo`) and how a held process starts (`qprof record`).

ngtcp2's example server and client (Debian packages ngtcp2-server and
ngtcp2-client, GnuTLS): the server serves a file from tmpfs (`make_payload`),
the client downloads it. A process is started held right after exec
(StoppedProcess), so a profiler can attach before its first packet and release
it once sampling runs; a `Placement` is the network namespace, cgroups and CPUs
it enters between fork and exec (qprof.netlab builds them), so the program
itself, and nothing in between, is what runs there and what a profiler sees.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from qprof.collectors.netns import CLONE_NEWNET, setns
from qprof.errors import QprofError

NGTCP2_SERVER = "gtlsserver"
NGTCP2_CLIENT = "gtlsclient"
_CHUNK = 1 << 20


def which_or_fail(tool: str, package: str) -> str:
    path = shutil.which(tool)
    if path is None:
        raise QprofError(f"{tool} not found: install it (Debian: apt-get install {package})")
    return path


def free_udp_port() -> int:
    """A UDP port free right now on 127.0.0.1 (gtlsserver sets SO_REUSEADDR: never share one)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_certificate(directory: Path, ips: tuple[str, ...] = ()) -> tuple[Path, Path]:
    """A leaf certificate (CA:FALSE, SAN localhost/127.0.0.1 and `ips`): rustls and webpki reject a CA as leaf."""
    openssl = which_or_fail("openssl", "openssl")
    key, cert = directory / "key.pem", directory / "cert.pem"
    san = ",".join(["DNS:localhost"] + [f"IP:{ip}" for ip in dict.fromkeys(("127.0.0.1", *ips))])
    cmd = [openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
           "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", "/CN=localhost",
           "-addext", "basicConstraints=critical,CA:FALSE",
           "-addext", f"subjectAltName={san}"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise QprofError(f"openssl could not make a test certificate: {r.stderr.strip().splitlines()[-1:]}")
    return key, cert


def make_payload(directory: Path, size: int, name: str = "payload") -> Path:
    """A real (not sparse) file: a sparse one made the first transfer after idle 3x slower."""
    path = directory / name
    block = os.urandom(_CHUNK)
    with open(path, "wb") as f:
        left = size
        while left > 0:
            n = min(left, _CHUNK)
            f.write(block[:n])
            left -= n
    return path


PTRACE_TRACEME = 0
PTRACE_DETACH = 17


@dataclass(frozen=True)
class Placement:
    """Where one role's process runs: a network namespace, a cgroup and CPUs, entered before exec.

    `netns` is a namespace file (e.g. /run/netns/NAME, what `ip netns add`
    makes); `cgroups` are cgroup directories (one per hierarchy) the process
    joins; `cpus` its CPU affinity (empty: any CPU). `preexec()` runs in the
    child between fork and exec, so the program starts there, capped from its
    first instruction; `check(pid)` confirms it from the parent.
    """

    netns: str | None = None
    cgroups: tuple[str, ...] = ()
    cpus: tuple[int, ...] = ()

    def preexec(self) -> None:
        if self.netns:
            fd = os.open(self.netns, os.O_RDONLY | os.O_CLOEXEC)
            try:
                setns(fd, CLONE_NEWNET)
            finally:
                os.close(fd)
        for cg in self.cgroups:
            fd = os.open(os.path.join(cg, "cgroup.procs"), os.O_WRONLY)
            try:
                os.write(fd, b"0")  # 0: the writing process itself
            finally:
                os.close(fd)
        if self.cpus:  # after the cgroups: joining a v1 cpuset resets the affinity to its CPUs
            os.sched_setaffinity(0, self.cpus)

    def check(self, pid: int) -> None:
        if self.netns and os.stat(f"/proc/{pid}/ns/net").st_ino != os.stat(self.netns).st_ino:
            raise QprofError(f"pid {pid} is not in network namespace {self.netns}")
        for cg in self.cgroups:
            with open(os.path.join(cg, "cgroup.procs"), encoding="ascii") as f:
                if str(pid) not in f.read().split():
                    raise QprofError(f"pid {pid} is not in cgroup {cg}")
        if self.cpus and os.sched_getaffinity(pid) != set(self.cpus):
            raise QprofError(f"pid {pid} is not bound to CPUs {list(self.cpus)}")


def _trace_me() -> None:
    """In the child: stop right after exec (SIGTRAP), before the program's first instruction."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.ptrace(PTRACE_TRACEME, 0, None, None) != 0:
        os._exit(127)


class StoppedProcess(subprocess.Popen):  # type: ignore[type-arg]
    """A child held right after exec, so a profiler can attach before it runs.

    Why ptrace and not a shell that SIGSTOPs itself before exec: perf keeps the
    pre-exec mappings, and perf 6.1's DWARF unwinder then used the old libc's
    unwind tables for the new libc (callers lost in 2 of 3 runs). Stopping
    after exec means perf only ever sees the real program. `release()` must be
    called from the thread that started the process (the ptrace tracer).
    A `preexec_fn` (e.g. Placement.preexec) runs in the child before the trace
    request: namespaces and cgroups are entered by the child itself, no helper
    program is exec'd, and the stop comes at the real program.
    """

    def __init__(self, cmd: list[str], preexec_fn: Callable[[], None] | None = None, **kw: Any) -> None:
        def child() -> None:
            if preexec_fn is not None:
                preexec_fn()
            _trace_me()

        super().__init__(cmd, preexec_fn=child, **kw)
        _, status = os.waitpid(self.pid, 0)
        if not os.WIFSTOPPED(status):
            self.returncode = os.waitstatus_to_exitcode(status)
            raise QprofError(f"{cmd[0]} exited before it could be attached (exit {self.returncode})")
        self._held = True

    def release(self) -> None:
        if self._held:
            self._held = False
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.ptrace(PTRACE_DETACH, self.pid, None, None) != 0:
                raise QprofError(f"could not release pid {self.pid} (ptrace detach: errno {ctypes.get_errno()})")


def work_dir() -> Path:
    """A fresh directory for a transfer's payload and certificate, on tmpfs where there is one."""
    return Path(tempfile.mkdtemp(prefix="qprof-xfer-", dir=_tmpfs()))


def ngtcp2_server_command(workdir: Path, host: str, port: int, key: Path, cert: Path) -> list[str]:
    """gtlsserver on host:port serving the files of `workdir` (make_payload writes `payload`)."""
    srv = which_or_fail(NGTCP2_SERVER, "ngtcp2-server")
    return [srv, "-q", "--no-quic-dump", "--no-http-dump", "-d", str(workdir), host, str(port), str(key), str(cert)]


def ngtcp2_client_command(host: str, port: int, requests: int = 1) -> list[str]:
    """gtlsclient downloading `payload` from host:port `requests` times (streams of one connection)."""
    cli = which_or_fail(NGTCP2_CLIENT, "ngtcp2-client")
    url = f"https://{host}:{port}/payload"
    return [cli, "-q", "--no-quic-dump", "--no-http-dump", "--exit-on-all-streams-close",
            "--max-data=64M", "--max-stream-data-bidi-local=64M", "--max-window=128M",
            "--max-stream-window=128M", "-n", str(requests), host, str(port), url]


def _tmpfs() -> str | None:
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
