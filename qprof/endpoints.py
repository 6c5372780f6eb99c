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

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
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
PTRACE_CONT = 7
PTRACE_DETACH = 17
PTRACE_SETOPTIONS = 0x4200
PTRACE_GETEVENTMSG = 0x4201
PTRACE_O_TRACEFORK, PTRACE_O_TRACEVFORK, PTRACE_O_TRACEEXEC = 0x2, 0x4, 0x10
PTRACE_EVENT_FORK, PTRACE_EVENT_VFORK, PTRACE_EVENT_CLONE = 1, 2, 3
WALL = 0x40000000  # __WALL: wait for a tracee whatever its kind
WRAPPER_EXEC_S = 10.0  # a wrapper that has not exec'd its command by then is stopped, with an error
MAX_WRAPPERS = 8  # `env nice taskset ... prog`: more is a loop

# Programs that set something up (CPUs, memory policy, environment, priority, a namespace, limits)
# and then exec the command they were given, with the options that make them do something else
# instead (act on another pid, print). A process started through one is held at its command's exec.
_PID_OPTIONS = {"taskset": {"-p", "--pid"}, "chrt": {"-p", "--pid"}, "ionice": {"-p", "--pid", "-P", "--pgid",
                                                                               "-u", "--uid"},
                "numactl": {"-s", "--show", "-H", "--hardware"}, "nice": set(),
                "stdbuf": set(), "nohup": set(), "prlimit": {"-p", "--pid"}, "chroot": set(),
                "setpriv": set(), "cgexec": set()}
_SHELLS = {"sh", "dash", "bash", "zsh", "ksh", "mksh"}
_SHELL_SYNTAX = set(";&|<>()`\n")  # what makes a -c script more than one command (one exec)


def launches(exe: str, argv: list[str]) -> str | None:
    """How this image, run with `argv`, starts a command given on its command line: "exec" (it
    replaces itself by it), "child" (a shell that forks it and waits), or None (it is the program).

    The programs that exec (taskset, numactl, env, nice, ionice, chrt, stdbuf, nohup, prlimit, chroot,
    setpriv, cgexec, `ip netns exec`, a shell's `-c 'exec ...'`, bash's `-c` of one simple command)
    only set something up for the program; dash (Debian's sh) runs even one simple command in a child.
    Either way the run is profiled as the program itself."""
    name, args = Path(exe).name, argv[1:]
    if name in _SHELLS:
        script = args[1].split() if len(args) >= 2 and args[0] == "-c" else []
        if not script or _SHELL_SYNTAX & set(args[1]):
            return None  # a script of its own: the shell is the program
        return "exec" if script[0] == "exec" or name == "bash" else "child"  # bash execs a lone command itself
    return "exec" if _execs(name, args) else None


def _execs(name: str, args: list[str]) -> bool:
    """Whether the wrapper `name`, run with `args`, replaces itself by a command given among them."""
    if name in _PID_OPTIONS:
        opts = _PID_OPTIONS[name]
        for a in args:  # its own options come first; the command's own words are not looked at
            if not a.startswith("-") or a == "--":
                return True
            short = a[1:] if not a.startswith("--") else ""
            if a.split("=")[0] in opts or any(f"-{c}" in opts for c in short):  # grouped: taskset -ap
                return False
        return False  # no command: it acts or prints, and exits
    if name == "env":
        i = 0
        while i < len(args):
            a = args[i]
            if a == "--":
                i += 1
                break
            if a in ("-S", "--split-string") or a.startswith("--split-string=") or a.startswith("-S"):
                return True
            if a in ("-u", "--unset", "-C", "--chdir"):
                i += 2
            elif a.startswith("-") or "=" in a:
                i += 1
            else:
                break
        return i < len(args)
    if name == "ip":
        words = [a for a in args if not a.startswith("-")]
        return words[:2] == ["netns", "exec"] and len(words) > 3
    return False


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


def _image(pid: int) -> tuple[str, list[str]]:
    """What a held process runs: its executable and its argv."""
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [a.decode(errors="replace") for a in f.read().split(b"\0")[:-1]]
    except OSError:
        return "", []
    return exe, argv


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

    A command started through a wrapper (`taskset -c 0 prog`, `env`, `numactl`,
    `ip netns exec`, `sh -c 'prog ...'`: `launches`) is held at the program's
    exec instead, so it is described, unwound and attributed as the program
    started directly would be. dash runs a -c command in a child: that child is
    then the program (`held_pid`), signalled with the shell.
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
        self._name = cmd[0]
        self.held_pid = self.pid  # the process that runs the program
        self.wrappers: list[str] = []  # what it went through on the way (taskset, env, dash ...), outermost first
        try:
            for _ in range(MAX_WRAPPERS):
                exe, argv = _image(self.held_pid)
                how = launches(exe, argv)
                if how is None:
                    break
                self.wrappers.append(Path(exe).name)
                if how == "exec":
                    self._run_to_exec(self.held_pid, 0)
                else:
                    self.held_pid = self._follow_child(self.held_pid)
        except BaseException:
            self._held = False
            self.send_signal(signal.SIGKILL)
            self.wait()
            raise

    def _next_stop(self, pid: int, deadline: float) -> int:
        """The next stop of tracee `pid`; an error if it exits or takes too long."""
        while True:
            got, status = os.waitpid(pid, os.WNOHANG | WALL)
            if got:
                break
            if time.monotonic() > deadline:
                raise QprofError(f"{self._name}: {self.wrappers[-1]} did not start its command within "
                                 f"{WRAPPER_EXEC_S:g} s: give the program itself")
            time.sleep(0.002)
        if not os.WIFSTOPPED(status):
            code = os.waitstatus_to_exitcode(status)
            if pid == self.pid:
                self.returncode = code
            raise QprofError(f"{self._name} exited before it could be attached (exit {code}, "
                             f"in {self.wrappers[-1]})")
        return status

    def _run_to_exec(self, pid: int, sig: int) -> None:
        """Let a wrapper run until it execs its command (it stops again: SIGTRAP), passing on any
        other signal it gets and letting go of any process it forks meanwhile."""
        deadline = time.monotonic() + WRAPPER_EXEC_S
        while True:
            _ptrace(PTRACE_CONT, pid, sig)
            status = self._next_stop(pid, deadline)
            sig, event = os.WSTOPSIG(status), status >> 16
            if event in (PTRACE_EVENT_FORK, PTRACE_EVENT_VFORK, PTRACE_EVENT_CLONE):
                other = _event_pid(pid)
                self._next_stop(other, deadline)  # its first stop, then free
                _ptrace(PTRACE_DETACH, other, 0)
                sig = 0
            elif sig == signal.SIGTRAP:
                return

    def _follow_child(self, shell: int) -> int:
        """A shell that runs its command in a child: the child, held at the command's exec."""
        deadline = time.monotonic() + WRAPPER_EXEC_S
        _ptrace(PTRACE_SETOPTIONS, shell, PTRACE_O_TRACEFORK | PTRACE_O_TRACEVFORK | PTRACE_O_TRACEEXEC)
        sig = 0
        while True:
            _ptrace(PTRACE_CONT, shell, sig)
            status = self._next_stop(shell, deadline)
            sig = os.WSTOPSIG(status)
            if status >> 16 in (PTRACE_EVENT_FORK, PTRACE_EVENT_VFORK):
                child = _event_pid(shell)
                break
            if sig == signal.SIGTRAP:
                sig = 0
        _ptrace(PTRACE_DETACH, shell, 0)  # it waits for its child from here on
        self._next_stop(child, deadline)  # the child's first stop (SIGSTOP): not passed on
        self._run_to_exec(child, 0)
        return child

    def send_signal(self, sig: int) -> None:
        if self.held_pid != self.pid:  # the shell's child runs the program: it gets the signal too
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.held_pid, sig)
        super().send_signal(sig)

    def release(self) -> None:
        if self._held:
            self._held = False
            _ptrace(PTRACE_DETACH, self.held_pid, 0, f"could not release pid {self.held_pid} (ptrace detach")


def _ptrace(request: int, pid: int, data: int, failed: str | None = None) -> None:
    """ptrace(2) on a tracee; `failed` opens the error's text (default: the request and pid)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.ptrace(request, pid, None, ctypes.c_void_p(data)) != 0:
        raise QprofError(f"{failed or f'ptrace({request}) on pid {pid} (failed'}: errno {ctypes.get_errno()})")


def _event_pid(pid: int) -> int:
    """The pid a fork, vfork or clone event of tracee `pid` made."""
    msg = ctypes.c_ulong(0)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.ptrace(PTRACE_GETEVENTMSG, pid, None, ctypes.byref(msg)) != 0:
        raise QprofError(f"ptrace(GETEVENTMSG) on pid {pid} failed: errno {ctypes.get_errno()}")
    return int(msg.value)


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
