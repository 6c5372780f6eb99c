"""`qprof record`: run a benchmark's commands under qprof, one run archive per repetition.

What a careful user does by hand, for every repetition: start the server and
the client held right after exec (qprof.endpoints.StoppedProcess), attach to
both, release the server once sampling and probes are live, release the
client once the server is ready (qprof.ready), stop when the client exits,
then stop the server. `qprof record -- CMD` does the same for one process.

A command that cannot start, exits before it is ready, never gets ready or
fails (non-zero exit) is one line naming it, its exit status and its last
output lines; the series stops there and the archives written before stay as
they are. A repetition that failed before its client ran measured nothing:
its directory is removed. Each archive holds the commands' output
(`output-<role>.log`), a `record` entry in meta.json (the repetition, the
commands, their exit statuses, the ready condition and when it was met) and
its `configuration` (archive.model.Configuration): what tables pool it by.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from qprof import runfiles
from qprof import archive
from qprof.archive.model import Configuration, LiveData, RecordEntry
from qprof.collectors.session import AttachOptions, AttachSession, harness_cpu_done
from qprof.endpoints import Placement, StoppedProcess
from qprof.errors import QprofError
from qprof.probes.children import die_with_parent
from qprof.ready import Ready, ReadyCheck

STOP_GRACE_S = 5.0  # a server gets this long to exit on SIGTERM before SIGKILL
OUTPUT_TAIL_LINES = 3


class RecordFailure(QprofError):
    """One command failed: the one line `qprof record` prints for it."""


@dataclass(frozen=True)
class Command:
    """One process to run: its role ("server", "client", or None alone) and argv, and where it runs."""

    role: str | None
    argv: tuple[str, ...]
    placement: Placement | None = None
    env: tuple[tuple[str, str], ...] = ()  # set on top of qprof's environment (`qprof study` settings)

    @property
    def label(self) -> str:
        return self.role or "command"

    def shown(self) -> str:
        return shlex.join(self.argv)


def parse_command(role: str | None, text: str) -> Command:
    """A --server/--client value (one shell-quoted string) as argv."""
    try:
        argv = tuple(shlex.split(text))
    except ValueError as e:
        raise QprofError(f"--{role} {text!r}: cannot split into words ({e}); check the quotes") from None
    if not argv:
        raise QprofError(f"--{role} is empty: give the command to run")
    return Command(role, argv)


def repetition_name(index: int, total: int) -> str:
    """`rep-NN`, padded to the width of `total` (at least 2), so a listing sorts in the runs' order."""
    return f"rep-{index:0{max(2, len(str(total)))}d}"


@dataclass
class RecordOptions:
    commands: list[Command]  # one alone, or a server and a client
    out: Path
    repeat: int = 1
    ready: Ready = field(default_factory=Ready)
    attach: AttachOptions = field(default_factory=lambda: AttachOptions(pids=[], out=Path()))  # a template
    role: str | None = None  # the one command's role in the archive (`--role`), so diff pairs it by role
    # what every repetition measures, recorded in its meta.json; default: the series named after -o's
    # directory, its commands and the environment they set
    configuration: Configuration | None = None
    # (repetition, of how many) when the caller runs its series one record at a time (a study)
    series: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        roles = [c.role for c in self.commands]
        if roles not in ([None], ["server", "client"]):
            raise QprofError("give --server CMD and --client CMD together, or one command after `--`")
        if self.role is not None and roles != [None]:
            raise QprofError("--role is for one command after `--`; --server and --client name their roles")
        if not 1 <= self.repeat <= 10_000:
            raise QprofError(f"--repeat {self.repeat} is out of range: give 1 to 10000")
        if self.configuration is None:
            self.configuration = Configuration(Path(os.path.abspath(self.out)).name,
                                               commands={c.label: list(c.argv) for c in self.commands},
                                               env={k: v for c in self.commands for k, v in c.env})

    def run_dir(self, index: int) -> Path:
        """The archive of repetition `index` (1-based): DIR itself for one repetition, DIR/rep-NN for many."""
        if self.repeat == 1:
            return self.out
        return self.out / repetition_name(index, self.repeat)


@dataclass
class Repetition:
    """What one repetition left: its archive (None when removed) and the failures, one line each."""

    index: int
    path: Path | None
    failures: list[str] = field(default_factory=list)
    interrupted: bool = False

    @property
    def ok(self) -> bool:
        return not self.failures and not self.interrupted


class _Process:
    """A command started held, with its output in a log file."""

    def __init__(self, cmd: Command, log: Path) -> None:
        self.cmd, self.log = cmd, log
        self.released_at: float | None = None
        place = cmd.placement
        die = die_with_parent(signal.SIGKILL)  # and a process group of its own: Ctrl-C reaches qprof only

        def before_exec() -> None:
            die()
            if place is not None:
                place.preexec()

        with open(log, "wb") as out:
            try:
                self.proc = StoppedProcess(list(cmd.argv), preexec_fn=before_exec, stdin=subprocess.DEVNULL,
                                           stdout=out, stderr=subprocess.STDOUT,
                                           env={**os.environ, **dict(cmd.env)} if cmd.env else None)
            except OSError as e:
                raise RecordFailure(f"{cmd.label} `{cmd.shown()}` could not start: {e.strerror or e}") from None
            except QprofError as e:
                raise RecordFailure(f"{cmd.label} `{cmd.shown()}` {_after_colon(e)}{self.tail()}") from None
        if place is not None:
            place.check(self.proc.pid)

    @property
    def pid(self) -> int:
        """The program's pid (a shell's child when `sh -c` started it in one)."""
        return int(self.proc.held_pid)

    def release(self) -> None:
        self.released_at = time.monotonic()
        self.proc.release()

    def exited(self) -> bool:
        return self.proc.poll() is not None

    def tail(self) -> str:
        try:
            lines = [ln.strip() for ln in self.log.read_text(errors="replace").splitlines() if ln.strip()]
        except OSError:
            return ""
        return (": " + " | ".join(lines[-OUTPUT_TAIL_LINES:])) if lines else " (no output)"

    def stop(self) -> int | None:
        """Release if held, SIGTERM, then SIGKILL after STOP_GRACE_S; the exit status (None: unknown)."""
        with contextlib.suppress(QprofError):
            self.proc.release()  # a traced, stopped process would not see SIGTERM
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def failure(self, what: str) -> str:
        return f"{self.cmd.label} `{self.cmd.shown()}` {what}{self.tail()}"


def _after_colon(e: QprofError) -> str:
    """StoppedProcess says '<argv0> exited before it could be attached (exit N)': keep what follows argv0."""
    text = str(e)
    return text.split(" ", 1)[1] if " " in text else text


class _Conductor:
    """The order of events in one repetition, driven by the attach session's poll loop (main thread:
    ptrace releases must come from the thread that started the processes)."""

    def __init__(self, procs: list[_Process], ready: Ready) -> None:
        self.procs = procs
        self.server = next((p for p in procs if p.cmd.role == "server"), None)
        self.client = next((p for p in procs if p.cmd.role == "client"), None)
        self.ready = ready
        self.check: ReadyCheck | None = None
        self.ready_after_s: float | None = None
        self.client_s: float | None = None  # client released to seen exited (within a poll tick)
        self.failures: list[str] = []
        self.failed: set[str] = set()

    def start(self) -> None:
        """Sampling and probes are live: release the server (or the one command)."""
        first = self.server or self.procs[0]
        first.release()
        if self.server is not None:
            assert first.released_at is not None
            self.check = ReadyCheck(self.ready, first.pid, first.log, first.released_at)

    def step(self) -> str | None:
        """Every poll tick: release the client once the server is ready; the reason to stop, if any."""
        if self.server is None:
            return "the command exited" if self.procs[0].exited() else None
        assert self.client is not None and self.check is not None
        now = time.monotonic()
        if self.client.released_at is None:
            if self.server.exited():
                self._fail(self.server, f"exited before it was ready (exit {self.server.proc.returncode})")
                return "the server exited before it was ready"
            if self.check.met(now):
                self.ready_after_s = round(now - (self.server.released_at or now), 3)
                self.client.release()
                return None
            if self.check.timed_out(now):
                self._fail(self.server, f"was not ready after {self.ready.timeout_s:g} s (waited for "
                                        f"{self.ready.describe()}; set --ready or --ready-timeout)")
                return "the server never got ready"
            return None
        if self.client.exited():
            self.client_s = round(now - self.client.released_at, 6)
            return "the client exited"
        return None

    def _fail(self, p: _Process, what: str) -> None:
        self.failed.add(p.cmd.label)
        self.failures.append(p.failure(what))

    def ended(self, codes: dict[str, int | None]) -> None:
        """After the run, with each command's exit status if it ended by itself (None: qprof stopped
        it): a non-zero status is a failure."""
        for p in self.procs:
            code = codes.get(p.cmd.label)
            if code and p.cmd.label not in self.failed:
                self._fail(p, f"exited with status {code}")


def _start_all(commands: list[Command], logs: Path) -> list[_Process]:
    started: list[_Process] = []
    try:
        for cmd in commands:
            started.append(_Process(cmd, logs / runfiles.record_output(cmd.label)))
    except BaseException:
        for p in started:
            p.stop()
        raise
    return started


def run_repetition(opts: RecordOptions, index: int, status: Callable[[str], None],
                   on_tick: Callable[[LiveData], None] | None = None) -> Repetition:
    """Run one repetition into opts.run_dir(index); failures of the commands are returned, not raised."""
    out = opts.run_dir(index)
    logs = Path(tempfile.mkdtemp(prefix="qprof-record-"))
    rep = Repetition(index, None)
    try:
        try:
            procs = _start_all(opts.commands, logs)
        except RecordFailure as e:
            rep.failures.append(str(e))
            return rep
        conductor = _Conductor(procs, opts.ready)
        roles = {p.pid: role for p in procs if (role := p.cmd.role or opts.role)}
        attach = dataclasses.replace(opts.attach, pids=[p.pid for p in procs], out=out, roles=roles)
        try:
            harness_cpu_done()  # the observer's line counts what qprof did to observe, from here
            session = AttachSession(attach, on_ready=conductor.start, stop_when=conductor.step, status=status,
                                    on_tick=on_tick)
            rep.path = session.run()
        finally:
            by_itself = {p.cmd.label: p.proc.poll() for p in procs}
            exits = {p.cmd.label: p.stop() for p in procs}
        conductor.ended(by_itself)
        rep.failures = conductor.failures
        rep.interrupted = (session.meta is not None and (session.meta.stop_reason or "").startswith("interrupted"))
        if conductor.client is not None and conductor.client.released_at is None and not rep.interrupted:
            shutil.rmtree(out, ignore_errors=True)  # the client never ran: nothing was measured
            rep.path = None
            return rep
        _describe(rep.path, opts, index, procs, exits, conductor, logs)
        return rep
    finally:
        shutil.rmtree(logs, ignore_errors=True)


def _describe(path: Path, opts: RecordOptions, index: int, procs: list[_Process], exits: dict[str, int | None],
              conductor: _Conductor, logs: Path) -> None:
    """Add the commands' output and the `record` entry to the archive."""
    for p in procs:
        with contextlib.suppress(OSError):
            shutil.copyfile(p.log, path / p.log.name)
            (path / p.log.name).chmod(0o600)
    run = archive.Run.open(path)
    repetition, repetitions = opts.series or (index, opts.repeat)
    run.meta.record = RecordEntry(repetition, repetitions, {p.cmd.label: list(p.cmd.argv) for p in procs}, exits,
                                  conductor.ready.describe() if conductor.server else None,
                                  conductor.ready_after_s, conductor.client_s, list(conductor.failures))
    run.meta.configuration = opts.configuration
    run.save_meta()


def record(opts: RecordOptions, status: Callable[[str], None],
           on_tick: Callable[[LiveData], None] | None = None) -> list[Repetition]:
    """Run every repetition in turn; stops at the first failure or interruption."""
    if opts.repeat > 1:
        archive.create_run_dir(opts.out)
    done: list[Repetition] = []
    for i in range(1, opts.repeat + 1):
        if opts.repeat > 1:
            status(f"repetition {i} of {opts.repeat}: {opts.run_dir(i)}")
        rep = run_repetition(opts, i, status, on_tick)
        done.append(rep)
        if not rep.ok:
            break
    return done


def recorded_runs(reps: list[Repetition]) -> list[Path]:
    """The archives of the repetitions that ran to the end without a failure."""
    return [r.path for r in reps if r.ok and r.path is not None]


def outcome_lines(reps: list[Repetition], opts: RecordOptions) -> list[str]:
    """What `qprof record` prints after the runs: one line per failure, then where the series stopped."""
    lines = [f"qprof: error: repetition {r.index}: {f}" if opts.repeat > 1 else f"qprof: error: {f}"
             for r in reps for f in r.failures]
    last = reps[-1] if reps else None
    if last is not None and not last.ok and opts.repeat > 1:
        kept = [str(r.path) for r in reps if r.path is not None]
        why = "interrupted" if last.interrupted and not last.failures else "failed"
        lines.append(f"qprof: record {why} at repetition {last.index} of {opts.repeat}; "
                     f"archives kept: {', '.join(kept) or 'none'}")
    return lines


def commands_of(server: str | None, client: str | None, alone: tuple[str, ...]) -> list[Command]:
    """The CLI's --server/--client strings or the words after `--`, as commands."""
    if alone and (server or client):
        raise QprofError("give either --server CMD --client CMD, or one command after `--`, not both")
    if alone:
        return [Command(None, tuple(alone))]
    if server is None or client is None:
        raise QprofError("give --server CMD and --client CMD together, or one command after `--` "
                         "(qprof record -- CMD ARGS...)")
    return [parse_command("server", server), parse_command("client", client)]

