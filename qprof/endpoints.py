"""Real QUIC endpoints qprof can run by itself: the demo's and the tests' transfers.

ngtcp2's example server and client (Debian packages ngtcp2-server and
ngtcp2-client, GnuTLS) serve a file from tmpfs over loopback. A client is
started held right after exec (StoppedProcess), so a profiler can attach
before its first packet and release it once sampling runs.

A transfer runs on 127.0.0.1 unless given another server address (`host`) and
a `Placement` per role: the network namespace and cgroup the process enters
between fork and exec (qprof.netlab builds them), so the program itself, and
nothing in between, is what runs there and what a profiler sees.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from qprof.collectors.netns import CLONE_NEWNET, setns
from qprof.errors import QprofError

NGTCP2_SERVER = "gtlsserver"
NGTCP2_CLIENT = "gtlsclient"
_CHUNK = 1 << 20


def parse_size(text: str) -> int:
    """'1G', '512M', '64K' or bytes -> bytes."""
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    num, unit = (t[:-1], t[-1]) if t and t[-1] in units else (t, "")
    try:
        n = int(float(num) * units[unit])
    except (ValueError, OverflowError):
        raise QprofError(f"size {text!r} is not a size: write e.g. 1G, 256M or 65536") from None
    if not 0 < n <= 64 << 30:
        raise QprofError(f"size {text!r} is out of range: give 1 byte to 64G")
    return n


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


def udp_port_bound(port: int, pid: int | None = None) -> bool:
    """Is `port` bound in this process's network namespace, or in `pid`'s?"""
    want = f":{port:04X}"
    net = f"/proc/{pid}/net" if pid else "/proc/net"
    for table in (f"{net}/udp", f"{net}/udp6"):
        try:
            with open(table, encoding="ascii") as f:
                next(f, None)
                if any(line.split()[1].endswith(want) for line in f):
                    return True
        except OSError:
            continue
    return False


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


def _tmpdir() -> Path:
    return Path(tempfile.mkdtemp(prefix="qprof-xfer-", dir=_tmpfs()))


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
    workdir: Path = field(default_factory=_tmpdir)
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
        key, cert = make_certificate(self.workdir, (self.host,))
        with open(self.workdir / "server.err", "wb") as err:
            self.server = subprocess.Popen(self.server_command(key, cert), stdin=subprocess.DEVNULL,
                                           stdout=subprocess.DEVNULL, stderr=err, **self._placed("server"))
        self._check_placed("server", self.server.pid)
        deadline = time.monotonic() + timeout
        while not udp_port_bound(self.port, self.server.pid):
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
    """A gtlsserver serving one file from tmpfs and a gtlsclient downloading it."""

    requests: int = 1  # the client fetches the file this many times (streams of one connection)

    def server_command(self, key: Path, cert: Path) -> list[str]:
        srv = which_or_fail(NGTCP2_SERVER, "ngtcp2-server")
        make_payload(self.workdir, self.size)
        return [srv, "-q", "--no-quic-dump", "--no-http-dump", "-d", str(self.workdir), self.host,
                str(self.port), str(key), str(cert)]

    def client_command(self) -> list[str]:
        cli = which_or_fail(NGTCP2_CLIENT, "ngtcp2-client")
        url = f"https://{self.host}:{self.port}/payload"
        return [cli, "-q", "--no-quic-dump", "--no-http-dump", "--exit-on-all-streams-close",
                "--max-data=64M", "--max-stream-data-bidi-local=64M", "--max-window=128M",
                "--max-stream-window=128M", "-n", str(self.requests), self.host, str(self.port), url]

    def transferred_bytes(self) -> int:
        return self.size * self.requests


def _tmpfs() -> str | None:
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
