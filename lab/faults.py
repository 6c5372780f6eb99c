"""Fault injection for `qprof attach`: each case is a real run of the real command line against a
real process, with real perf and bpftrace; faults are injected from outside, never mocked.

How faults are made: signals sent to qprof or its target at a chosen moment (read from the run
directory as qprof writes it), small wrapper executables placed first on PATH (a perf that prints
an old version, or execs the real perf and is then killed with SIGSEGV; a bpftrace that adds a
probe the kernel does not have), PATHs without a tool (a directory of links to everything but it),
small, full or read-only tmpfs mounts, and files written by an untrusted user. qprof starts as
the leader of a session of its own, so after each case what of qprof's is left is found by what
it started (probes.leftovers: the session's processes and those naming the run directory, BPF
programs, perf events, uprobes), together with what data `qprof report` can still read.

Used by tests/test_faults.py (one test per case) and bench/faults.py (the table).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from qprof import unprivileged
from qprof import archive
from qprof.archive import Run
from qprof.archive.model import STATUS_COMPLETE, Meta, ProcessIdentity, SampleGroup
from qprof.errors import QprofError
from qprof.probes.children import die_with_parent
from qprof.probes.leftovers import Leftovers, bpf_programs, leftovers

QPROF = [sys.executable, "-m", "qprof.cli"]
BUSY = "import time\nend = time.time() + {secs}\nx = 0\nwhile time.time() < end:\n    x += 1\n"


class CaseSkipped(Exception):
    """A facility the case needs is truly absent here (the message says which)."""


@dataclass
class Outcome:
    """What one fault did: qprof's survival (clean exit or clean kill, expected result, no
    traceback or hang), what it left behind, and how much data `report` can read."""

    case: str
    survived: bool
    leftovers: Leftovers
    data: str  # "yes" (complete), "partial" (incomplete but readable, maybe after --refold), "no"
    detail: str


def _busy(secs: float = 120) -> subprocess.Popen[bytes]:
    """A CPU-bound target that dies with the thread that started it: a fault run stopped
    anywhere leaves no target spinning."""
    return subprocess.Popen([sys.executable, "-c", BUSY.format(secs=secs)],
                            preexec_fn=die_with_parent(signal.SIGKILL))


def _wait(pred: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.02)


def _json(path: Path) -> dict:
    try:
        obj = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return obj if isinstance(obj, dict) else {}


def _meta(run: Path) -> Meta:
    """A run's metadata through the archive's model; an empty record where there is none to read yet."""
    try:
        return Run.open(run).meta
    except QprofError:
        return Meta(status="unreadable")


def probes_attached(run: Path) -> bool:
    return "attach_seconds" in json.dumps(_json(run / "probes.json"))


def chunks_folded(run: Path) -> int:
    from qprof.archive.stacks import stacks_header

    try:
        return len(head.folded) if (head := stacks_header(run / "stacks.jsonl.gz")) else 0
    except Exception:  # noqa: BLE001  (a stacks file being replaced: try again)
        return 0


def data_kept(run: Path) -> tuple[str, str]:
    """("yes" | "partial" | "no", why): can `qprof report` read the run, and is it complete?"""
    if not (run / "meta.json").is_file():
        return "no", "no archive"
    r = subprocess.run([*QPROF, "report", str(run), "--format", "json"], capture_output=True, text=True,
                       timeout=300)
    if r.returncode == 0:
        rep = json.loads(r.stdout)
        samples = sum(p.get("samples", 0) for p in rep.get("processes", []))
        if rep["run"].get("status") == "complete" and "not folded" not in r.stderr:
            return "yes", f"complete, {samples} samples"
        return "partial", f"{rep['run'].get('status')}, {samples} samples readable"
    r2 = subprocess.run([*QPROF, "report", "--refold", str(run), "--format", "json"], capture_output=True,
                        text=True, timeout=300)
    if r2.returncode == 0:
        samples = sum(p.get("samples", 0) for p in json.loads(r2.stdout).get("processes", []))
        return "partial", f"readable after --refold, {samples} samples"
    return "no", (r2.stderr.strip().splitlines() or ["unreadable"])[-1]


def clean_stderr(err: str, rc: int) -> tuple[bool, str]:
    """No traceback; on failure exactly one `qprof: error:` line (status lines aside)."""
    if "Traceback" in err:
        return False, "traceback: " + err.strip().splitlines()[-1]
    errors = [ln for ln in err.splitlines() if ln.startswith("qprof: error:")]
    if rc == 0:
        return not errors, errors[0] if errors else "exit 0"
    if rc == 2 and len(errors) == 1:
        return True, errors[0]
    return False, f"exit {rc}: {err.strip()[-300:]}"


class FaultRig:
    """A scratch directory, wrapper tools, and what each case started (cleaned up on close)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.real = {t: shutil.which(t) for t in ("perf", "bpftrace")}
        self.procs: list[subprocess.Popen] = []
        self.mounts: list[Path] = []
        self.sessions: list[int] = []  # one per qprof started: everything it started is in it

    # -- tools
    def wrapper_path(self, name: str, tool: str, body: str) -> str:
        """PATH with a wrapper `tool` first: `body` is sh code; $REAL is the real tool."""
        real = self.real[tool]
        if real is None:
            raise CaseSkipped(f"{tool} is not installed")
        d = self.root / f"bin-{name}"
        d.mkdir(exist_ok=True)
        w = d / tool
        w.write_text(f"#!/bin/sh\nREAL={real}\n{body}\nexec \"$REAL\" \"$@\"\n")
        w.chmod(0o755)
        return f"{d}:{os.environ.get('PATH', '')}"

    def path_without(self, tool: str) -> str:
        """PATH of links to every executable on the current PATH except `tool`."""
        d = self.root / f"bin-no-{tool}"
        d.mkdir(exist_ok=True)
        for directory in os.environ.get("PATH", "").split(":"):
            if not os.path.isdir(directory):
                continue
            for name in os.listdir(directory):
                src, dst = os.path.join(directory, name), d / name
                if name != tool and not dst.exists() and os.access(src, os.X_OK):
                    dst.symlink_to(src)
        return str(d)

    def tmpfs(self, name: str, options: str) -> Path:
        """A tmpfs mounted for this case (unmounted at close)."""
        mnt = self.root / name
        mnt.mkdir()
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "qprof-fault", str(mnt)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise CaseSkipped(f"cannot mount a tmpfs: {r.stderr.strip()}")
        self.mounts.append(mnt)
        return mnt

    # -- processes
    def target(self, secs: float = 120) -> subprocess.Popen[bytes]:
        p = _busy(secs)
        self.procs.append(p)
        return p

    def attach(self, pids: list[int], run: Path, *args: str, path: str | None = None,
               quiet: bool = True, wrap: tuple[str, ...] = (), env: dict[str, str] | None = None
               ) -> subprocess.Popen[str]:
        """`qprof attach` (run by `wrap`, e.g. `timeout`, when given) as a session leader; `env`: more
        environment."""
        env = {**os.environ, **({"PATH": path} if path else {}), **(env or {})}
        cmd = [*wrap, *QPROF, "attach", *map(str, pids), "-o", str(run), *(["-q"] if quiet else []), *args]
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                             start_new_session=True)
        self.procs.append(p)
        self.sessions.append(p.pid)
        return p

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        for mnt in self.mounts:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def _finish(att: subprocess.Popen[str], timeout: float = 180) -> tuple[int, str]:
    try:
        _out, err = att.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        att.kill()
        _out, err = att.communicate()
        return -999, f"hung: killed after {timeout:.0f} s\n{err}"
    return att.returncode, err


def _wait_probes(run: Path, att: subprocess.Popen[str]) -> None:
    """Until the run's probes are attached (or qprof has exited)."""
    _wait(lambda: probes_attached(run) or att.poll() is not None, 60, "probes")


def _wait_final_fold(lines: list[str], att: subprocess.Popen[str]) -> None:
    """Until qprof (not quiet) says it folds the stacks at the end (or has exited)."""
    _wait(lambda: any("folding stacks" in ln for ln in lines) or att.poll() is not None, 60, "the final fold")


def _exits(att: subprocess.Popen[str], timeout: float = 180) -> bool:
    """Whether qprof exits within `timeout` (after a signal); killed if it hangs."""
    try:
        att.wait(timeout)
        return True
    except subprocess.TimeoutExpired:
        att.kill()
        att.wait()
        return False


def _stderr_reader(att: subprocess.Popen[str]) -> tuple[list[str], threading.Thread]:
    lines: list[str] = []

    def read() -> None:
        assert att.stderr is not None
        for line in att.stderr:
            lines.append(line)

    t = threading.Thread(target=read, daemon=True)
    t.start()
    return lines, t


# ---------------------------------------------------------------- the cases
# Each returns (survived, detail, run dir or None); what qprof left is found from the sessions
# the rig started it in and the run directory (probes.leftovers).

CaseResult = tuple[bool, str, "Path | None"]
CaseFn = Callable[[FaultRig], CaseResult]


def _expect(rc: int, err: str, want_rc: int, needle: str = "") -> tuple[bool, str]:
    ok, detail = clean_stderr(err, rc)
    ok = ok and rc == want_rc and needle in err
    return ok, detail if ok else f"expected exit {want_rc} with {needle!r}; got {detail}"


def _ends_complete(att: subprocess.Popen[str], run: Path, stop: str) -> CaseResult:
    """qprof exits 0 with its run complete and stopped for the reason `stop`."""
    rc, err = _finish(att)
    ok, detail = _expect(rc, err, 0)
    meta = _meta(run)
    ok = ok and meta.stop_reason == stop and meta.status == "complete"
    return ok, f"{detail}; stop: {meta.stop_reason}", run


def case_target_exits(rig: FaultRig) -> CaseResult:
    t = rig.target(secs=6)
    run = rig.root / "run"
    return _ends_complete(rig.attach([t.pid], run, "-d", "60"), run, "every target exited")


def case_target_sigkill(rig: FaultRig) -> CaseResult:
    t = rig.target()
    run = rig.root / "run"
    att = rig.attach([t.pid], run, "-d", "60")
    _wait_probes(run, att)
    time.sleep(1)
    t.kill()
    rc, err = _finish(att)
    ok, detail = _expect(rc, err, 0)
    meta = _meta(run)
    ok = ok and meta.exited == [t.pid] and meta.status == "complete"
    return ok, f"{detail}; stop: {meta.stop_reason}", run


def case_one_of_two_exits(rig: FaultRig) -> CaseResult:
    short, long = rig.target(secs=5), rig.target()
    run = rig.root / "run"
    att = rig.attach([short.pid, long.pid], run, "-d", "8")
    rc, err = _finish(att)
    ok, detail = _expect(rc, err, 0)
    meta = _meta(run)
    ok = ok and meta.stop_reason == "duration reached" and meta.exited == [short.pid]
    rep = subprocess.run([*QPROF, "report", str(run), "--format", "json"], capture_output=True, text=True)
    pids = {p["pid"]: p["samples"] for p in json.loads(rep.stdout or "{}").get("processes", [])}
    ok = ok and pids.get(short.pid, 0) > 0 and pids.get(long.pid, 0) > pids.get(short.pid, 0)
    return ok, f"{detail}; samples per target {pids}", run


def _signal_case(sig: signal.Signals, when: str, *, crypto: bool = False
                 ) -> Callable[[FaultRig], CaseResult]:
    def case(rig: FaultRig) -> CaseResult:
        run = rig.root / "run"
        if crypto:
            if shutil.which("openssl") is None:
                raise CaseSkipped("openssl is not installed (the uprobe target)")
            t = subprocess.Popen(["openssl", "speed", "-evp", "aes-128-gcm", "-seconds", "120"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            rig.procs.append(t)
            time.sleep(0.5)
        else:
            t = rig.target()
        args = ["-d", "60", "--unwind", "dwarf"]
        if crypto:
            args += ["--probes", "packetio,crypto", "--chunk-size", "4M"]
        if when == "writing":
            args = ["-d", "4", "-F", "2999", "--unwind", "dwarf", "--chunk-size", "1G"]
        att = rig.attach([t.pid], run, *args, quiet=when != "writing")
        lines, reader = _stderr_reader(att)
        if when == "start-up":
            _wait(lambda: (run / "probe-packetio.bpf.c").exists() or att.poll() is not None, 60, "probe spawn")
            started_early = not probes_attached(run)
        elif when == "collection":
            _wait_probes(run, att)
            if crypto:  # kill once a chunk is folded: that part must stay readable
                _wait(lambda: chunks_folded(run) > 0 or att.poll() is not None, 60, "a folded chunk")
            time.sleep(0.5)
        else:
            _wait_final_fold(lines, att)
        att.send_signal(sig)
        if not _exits(att):
            return False, "hung after the signal", run
        reader.join(10)
        rc, err = att.returncode, "".join(lines)
        if sig == signal.SIGKILL:
            ok, detail = rc == -signal.SIGKILL and "Traceback" not in err, f"killed (exit {rc})"
            if crypto:
                probes = _json(run / "probes.json")
                slots = len(((probes.get("crypto") or {}).get("slots")) or [])
                detail += f"; {slots} uprobe slot(s) were attached"
                ok = ok and slots > 0
        elif when == "writing":
            ok, detail = _expect(rc, err, 2, "interrupted while writing")
        else:
            ok, detail = _expect(rc, err, 0)
            ok = ok and _meta(run).status == "complete"
        if when == "start-up":
            detail += "; signalled before probes attached" if started_early else "; probes had attached"
        return ok, detail, run
    return case


def _perf_refused(make_path: Callable[[FaultRig], str],
                  needle: str) -> Callable[[FaultRig], CaseResult]:
    """perf unusable before sampling starts: attach refuses in one line and writes no archive."""
    def case(rig: FaultRig) -> CaseResult:
        t = rig.target()
        run = rig.root / "run"
        att = rig.attach([t.pid], run, "-d", "3", path=make_path(rig))
        rc, err = _finish(att)
        ok, detail = _expect(rc, err, 2, needle)
        return ok and not run.exists(), detail, run
    return case


case_perf_missing = _perf_refused(lambda rig: rig.path_without("perf"), "perf not found")
case_perf_too_old = _perf_refused(
    lambda rig: rig.wrapper_path("perf-old", "perf",
                                 'case "$1" in --version|version) echo "perf version 4.19.0"; exit 0;; esac'),
    "too old")


def case_perf_crashes(rig: FaultRig) -> CaseResult:
    # the real perf record, killed with SIGSEGV 3 s in (the killer's command line names no run dir)
    path = rig.wrapper_path("perf-crash", "perf",
                            '[ "$1" = record ] && sh -c \'sleep 3; kill -SEGV "$1"\' killer $$ &')
    t = rig.target()
    run = rig.root / "run"
    att = rig.attach([t.pid], run, "-d", "60", "--unwind", "dwarf", "--chunk-size", "4M", path=path)
    rc, err = _finish(att)
    ok, detail = _expect(rc, err, 2, "perf record ended before qprof stopped it")
    return ok, detail, run


def _probe_case(kind: str) -> Callable[[FaultRig], CaseResult]:
    def case(rig: FaultRig) -> CaseResult:
        last_bt = 'for a in "$@"; do last="$a"; done; case "$last" in *.bt) BT=1;; *) BT=0;; esac'
        if kind == "missing":
            path, needle = rig.path_without("bpftrace"), "bpftrace not found"
        elif kind == "too old":
            path = rig.wrapper_path("bt-old", "bpftrace",
                                    'case "$1" in --version|-V) echo "bpftrace v0.9.4"; exit 0;; esac')
            needle = "too old"
        elif kind == "crashes":
            path = rig.wrapper_path("bt-crash", "bpftrace", last_bt + "\n"
                                    '[ $BT = 1 ] && sh -c \'sleep 3; kill -SEGV "$1"\' killer $$ &')
            needle = ""
        else:  # a probe on a tracepoint this kernel does not have: a real attach failure
            path = rig.wrapper_path("bt-noattach", "bpftrace", last_bt + "\n"
                                    '[ $BT = 1 ] && printf "\\ntracepoint:qprof_fault:no_such_event { }\\n" '
                                    '>> "$last"')
            needle = "syscalls"
        t = rig.target()
        run = rig.root / "run"
        # the default packetio group is libbpf (no bpftrace): add a bpftrace group to fault
        att = rig.attach([t.pid], run, "-d", "6", "--probes", "packetio,syscalls", path=path)
        rc, err = _finish(att)
        ok, detail = _expect(rc, err, 0)
        probes = _json(run / "probes.json")
        unavailable = "; ".join(f"{u['probe']}: {u['reason']}" for u in probes.get("unavailable", [])
                                if u.get("probe") != "cost")
        if kind == "crashes":
            prog = (probes.get("programs") or {}).get("syscalls") or {}
            ok = ok and prog.get("exit") not in (0, None)
            detail += f"; bpftrace exit {prog.get('exit')}, sampling went on"
        else:
            ok = ok and needle in unavailable
            detail += f"; unavailable: {unavailable[:140]}"
        return ok and _meta(run).status == "complete", detail, run
    return case


def case_disk_full(rig: FaultRig) -> CaseResult:
    run = rig.tmpfs("small", "size=24m,mode=0700") / "run"
    t = rig.target()
    # --keep-raw: without it, folding keeps the raw data within 4 MiB chunks and this disk never fills
    att = rig.attach([t.pid], run, "-d", "60", "--unwind", "dwarf", "--chunk-size", "4M", "--keep-raw")
    rc, err = _finish(att)
    ok, detail = _expect(rc, err, 2, "No space left on device")
    return ok, detail, run


def _output_case(kind: str) -> Callable[[FaultRig], CaseResult]:
    def case(rig: FaultRig) -> CaseResult:
        t = rig.target()
        if kind == "exists":
            run = rig.root / "full"
            run.mkdir()
            (run / "precious").write_text("keep me")
            needle = "not empty"
        elif kind == "symlink":
            run = rig.root / "link"
            run.symlink_to(rig.root / "elsewhere")
            needle = "symbolic link"
        elif kind == "full":
            mnt = rig.tmpfs("full", "size=4m,mode=0700")
            with open(mnt / "filler", "wb", buffering=0) as f:
                try:
                    while True:
                        f.write(b"\0" * (1 << 16))
                except OSError:
                    pass
            run = mnt / "run"
            needle = "No space left on device"
        else:
            run = rig.tmpfs("ro", "ro,size=1m") / "run"
            needle = "cannot write"
        att = rig.attach([t.pid], run, "-d", "3")
        rc, err = _finish(att)
        ok, detail = _expect(rc, err, 2, needle)
        if kind == "exists":
            ok = ok and (run / "precious").read_text() == "keep me" and len(list(run.iterdir())) == 1
        if kind == "symlink":
            ok = ok and not (rig.root / "elsewhere").exists()
        if kind == "full":
            ok = ok and not run.exists()
        return ok, detail, None
    return case


def case_not_root(rig: FaultRig) -> CaseResult:
    rig.root.chmod(0o777)
    t = rig.target()
    try:
        r = unprivileged.run(["attach", str(t.pid), "-d", "1", "-o", str(rig.root / "run")], rig.root, 60)
    except unprivileged.Unavailable as e:
        raise CaseSkipped(str(e)) from None
    ok, detail = _expect(r.returncode, r.stderr, 2, "CAP_PERFMON")
    return ok, detail, None


def case_stop_delivered_twice(rig: FaultRig) -> CaseResult:
    """One stop delivered twice: `timeout` passes a SIGINT on to qprof and then to its whole process
    group (copies microseconds apart often merge into one), and a process-group kill 20 ms later
    (as a supervisor sends it) surely arrives apart. That is one stop: the archive is written whole."""
    if shutil.which("timeout") is None:
        raise CaseSkipped("timeout (coreutils) is missing")
    t = rig.target()
    run = rig.root / "run"
    att = rig.attach([t.pid], run, "-d", "60", "--unwind", "dwarf", wrap=("timeout", "-s", "INT", "600"))
    _wait_probes(run, att)
    time.sleep(0.5)
    att.send_signal(signal.SIGINT)  # to timeout, which signals qprof, then its process group
    time.sleep(0.02)
    os.killpg(att.pid, signal.SIGINT)
    return _ends_complete(att, run, "interrupted (SIGINT)")


# The final fold starts FOLD_DELAY_S late: the folder's process (qprof's native folder, or `perf script`
# where it is not built) sleeps, then execs the real one, so nothing outlives it when qprof kills it.
# A fold of real samples takes 0.1-0.5 s here, about when a person's second Ctrl-C may come
# (REPEAT_WINDOW_S): without the delay the case raced it.
FOLD_DELAY_S = 5
_SLEEP_EXEC = 'exec python3 -c "import os, sys, time; time.sleep(%d); os.execv(sys.argv[1], sys.argv[1:])"' % FOLD_DELAY_S
# The subcommand comes first or after `--buildid-dir DIR` (the fold reads qprof's symbol cache).
SLOW_SCRIPT = f'case " $1 $3 " in *" script "*) {_SLEEP_EXEC} "$REAL" "$@";; esac'


def slow_folder(rig: FaultRig) -> tuple[str, dict[str, str]]:
    """PATH and environment under which every fold starts FOLD_DELAY_S late, whichever folder runs."""
    from qprof.collectors import nativefold

    env = {}
    real = nativefold.built()
    if real is not None:
        w = rig.root / "slow-perffold"
        w.write_text(f'#!/bin/sh\n{_SLEEP_EXEC} "{real}" "$@"\n')
        w.chmod(0o755)
        env["QPROF_FOLDER"] = str(w)
    return rig.wrapper_path("perf-slow-fold", "perf", SLOW_SCRIPT), env


def case_second_ctrl_c(rig: FaultRig) -> CaseResult:
    """A person's second Ctrl-C, after qprof said it is stopping: it still aborts the writing."""
    from qprof.collectors.session import REPEAT_WINDOW_S

    t = rig.target()
    run = rig.root / "run"
    path, env = slow_folder(rig)
    att = rig.attach([t.pid], run, "-d", "60", "--unwind", "dwarf", "--chunk-size", "1G", quiet=False,
                     path=path, env=env)
    lines, reader = _stderr_reader(att)
    _wait_probes(run, att)
    time.sleep(2)  # samples, in one chunk folded at the end
    att.send_signal(signal.SIGINT)
    first = time.monotonic()
    _wait_final_fold(lines, att)
    time.sleep(max(0.0, first + REPEAT_WINDOW_S + 0.1 - time.monotonic()))
    att.send_signal(signal.SIGINT)
    if not _exits(att):
        return False, "hung after the second Ctrl-C", run
    reader.join(10)
    took = time.monotonic() - first
    ok, detail = _expect(att.returncode, "".join(lines), 2, "interrupted while writing")
    # ended by the second Ctrl-C, not by a fold that finished first
    return ok and took < FOLD_DELAY_S, f"{detail}; second Ctrl-C; qprof exited {took:.1f} s after the first", run


# busy until told to go on (the file argv[1] exists), busy 2 s more, then exec a busy shell
EXEC_LATER = ("import os, sys, time\nwhile not os.path.exists(sys.argv[1]):\n    pass\n"
              "end = time.time() + 2\nwhile time.time() < end:\n    pass\n"
              "os.execv('/bin/sh', ['sh', '-c', 'while :; do :; done'])\n")


def case_target_execs(rig: FaultRig) -> CaseResult:
    """The target replaces its program (exec) while attached: both programs' samples are kept,
    under the same pid, and the archive describes the program it ended as."""
    from qprof.archive.stacks import read_stacks

    go = rig.root / "go"
    t = subprocess.Popen([sys.executable, "-c", EXEC_LATER, str(go)])
    rig.procs.append(t)
    run = rig.root / "run"
    att = rig.attach([t.pid], run, "-d", "6")
    _wait_probes(run, att)
    go.touch()
    rc, err = _finish(att)
    ok, detail = _expect(rc, err, 0)
    by_comm: dict[str, int] = {}
    try:
        for r in read_stacks(run / "stacks.jsonl.gz"):
            if r.pid == t.pid:
                by_comm[r.comm] = by_comm.get(r.comm, 0) + r.samples
    except Exception as e:  # noqa: BLE001  (reported as the case's failure)
        return False, f"{detail}; stacks unreadable: {e}", run
    targets = _meta(run).targets
    ended_as = targets[0].comm if targets else None
    before = sum(n for c, n in by_comm.items() if c != "sh")
    ok = ok and before > 0 and by_comm.get("sh", 0) > 0 and ended_as == "sh"
    return ok, f"{detail}; samples by program {by_comm}; described as {ended_as!r}", run


def case_two_attach_one_pid(rig: FaultRig) -> CaseResult:
    """Two `qprof attach` on the same pid at once: each run is whole and independent."""
    t = rig.target()
    runs = [rig.root / "run-a", rig.root / "run-b"]
    atts = [rig.attach([t.pid], r, "-d", "5") for r in runs]
    results = [_finish(a) for a in atts]
    checks = [_expect(rc, err, 0) for rc, err in results]
    ok = all(c[0] for c in checks) and all(_meta(r).status == "complete" for r in runs)
    other, why = data_kept(runs[1])  # the first run is checked by run_case
    return ok and other == "yes", f"{checks[0][1]}; {checks[1][1]}; second run: {why}", runs[0]


def _bounded(cmd: list[str], mem_bytes: int = 2 << 30, timeout: float = 60) -> tuple[int, str, float, float]:
    """(exit status, stderr, seconds, peak RSS in MiB) of `cmd` run with its address space capped."""
    def limit() -> None:
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (mem_bytes, mem_bytes))

    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=limit)
    timer = threading.Timer(timeout, p.kill)
    timer.start()
    assert p.stderr is not None
    err = p.stderr.read().decode(errors="replace")
    _pid, status, usage = os.wait4(p.pid, 0)
    timer.cancel()
    p.returncode = os.waitstatus_to_exitcode(status)
    return p.returncode, err, time.monotonic() - t0, usage.ru_maxrss / 1024


def _as_untrusted(path: Path) -> None:
    """Hand `path` (and what is under it) to uid/gid 65534: written by someone else."""
    for p in [path, *(path.rglob("*") if path.is_dir() else ())]:
        os.chown(p, unprivileged.NOBODY, unprivileged.NOBODY, follow_symlinks=False)


def _write_gzip_lines(path: Path, line: bytes, count: int) -> None:
    import gzip

    with gzip.open(path, "wb", compresslevel=9) as f:
        block = line * 10_000
        for _ in range(count // 10_000):
            f.write(block)


def _minimal_run(root: Path, name: str, symbol: str = "main") -> Path:
    """A run archive of the smallest shape `report` reads (one stack of one sample)."""
    from qprof.archive.stacks import StackRecord, write_stacks

    run = root / name
    run.mkdir()
    archive.write_meta(run, Meta(status=STATUS_COMPLETE))
    write_stacks(run / "stacks.jsonl.gz", [StackRecord(7, 7, "x", 1, 1000, ((symbol, "/usr/bin/x"),))])
    return run


def _hostile_reads(rig: FaultRig, what: str, commands: dict[str, tuple[list[str], int, str]]) -> CaseResult:
    """Run each command (argv, expected exit status, text its error must name) as root on files
    owned by uid 65534: no traceback, at most one `qprof: error:` line, within 60 s and a 2 GiB
    address space, and nothing in them run (the canary file stays absent)."""
    worst_t, worst_mb, bad, slowest = 0.0, 0.0, [], (0.0, "")
    for name, (cmd, want_rc, needle) in commands.items():
        rc, err, secs, mb = _bounded(cmd)
        worst_t, worst_mb = max(worst_t, secs), max(worst_mb, mb)
        good, why = _expect(rc, err, want_rc, needle)
        if not good:
            bad.append(f"{name}: {why}")
        slowest = max(slowest, (secs, name))
    canary = not (rig.root / "canary").exists()
    ok = not bad and canary and worst_t < 30 and worst_mb < 512
    detail = (f"{len(commands)} hostile {what}: " + ("; ".join(bad) if bad else "one-line errors") +
              f"; slowest {worst_t:.1f} s ({slowest[1]}), peak RSS {worst_mb:.0f} MiB" +
              ("" if canary else "; CODE RAN"))
    return ok, detail, None


def case_untrusted_mapping(rig: FaultRig) -> CaseResult:
    """Mapping files written by another user: data, never code; bounded time and memory."""
    run = _minimal_run(rig.root, "run", "a" * 80 + "!")
    head = '[mapping]\nname = "x"\n\n[[rule]]\n'
    files = {
        "backtracking pattern": head + "symbol = '(a|aa)+$'\ncategory = \"Crypto\"\n",
        "nested repeats": head + "symbol = '(a+)+$'\ncategory = \"Crypto\"\n",
        "deep nesting": 'x = ' + "[" * 100_000 + "]" * 100_000 + "\n",
        "shell and Python in strings": ('[mapping]\nname = "x"\ndescription = "$(touch {c}) __import__(\'os\')'
                                        '.system(\'touch {c}\')"\n[[rule]]\nsymbol = "a"\n'
                                        'subcategory = "`touch {c}`"\ncategory = "Crypto"\n'
                                        ).format(c=rig.root / "canary"),
    }
    paths = {}
    for name, text in files.items():
        paths[name] = rig.root / (name.replace(" ", "-") + ".toml")
        paths[name].write_text(text)
    paths["a FIFO"] = rig.root / "fifo.toml"
    os.mkfifo(paths["a FIFO"])
    paths["a link to /dev/zero"] = rig.root / "zero.toml"
    paths["a link to /dev/zero"].symlink_to("/dev/zero")
    paths["1 GiB"] = rig.root / "huge.toml"
    with open(paths["1 GiB"], "wb") as f:
        f.truncate(1 << 30)
    for p in paths.values():
        _as_untrusted(p)
    expect = {"backtracking pattern": (2, "catastrophic backtracking"), "nested repeats": (2, "nested repeats"),
              "deep nesting": (2, "deep-nesting.toml"), "shell and Python in strings": (0, ""),
              "a FIFO": (2, "not a regular file"), "a link to /dev/zero": (2, "not a regular file"),
              "1 GiB": (2, "larger than")}
    cmds = {name: ([*QPROF, "report", str(run), "--mapping", str(p)], *expect[name]) for name, p in paths.items()}
    return _hostile_reads(rig, "mapping files", cmds)


def case_untrusted_archive(rig: FaultRig) -> CaseResult:
    """Run archives written by another user: read as data within bounds, never folded unasked."""
    runs: dict[str, Path] = {}
    r = runs["meta.json a FIFO"] = rig.root / "fifo"
    r.mkdir()
    os.mkfifo(r / "meta.json")
    r = runs["meta.json a link to /dev/zero"] = rig.root / "zero"
    r.mkdir()
    (r / "meta.json").symlink_to("/dev/zero")
    r = runs["meta.json of 1 GiB"] = rig.root / "huge"
    r.mkdir()
    with open(r / "meta.json", "wb") as f:
        f.truncate(1 << 30)
    r = runs["proc.jsonl a link to /dev/zero"] = _minimal_run(rig.root, "proc")
    (r / "proc.jsonl").symlink_to("/dev/zero")
    r = runs["stacks: one 200 MiB line"] = _minimal_run(rig.root, "longline")
    _write_gzip_lines(r / "stacks.jsonl.gz", b"a" * 1000, 200_000)
    r = runs["stacks: a gzip bomb"] = _minimal_run(rig.root, "bomb")
    _write_gzip_lines(r / "stacks.jsonl.gz", b'{"pid":1,"tid":1,"comm":"x","samples":1,"period":1,"frames":[]}\n',
                      4_000_000)
    r = runs["raw perf data, not folded"] = _minimal_run(rig.root, "raw")
    (r / "stacks.jsonl.gz").unlink()
    raw = Run.open(r)
    raw.meta.sampling.groups = [SampleGroup("fp", [1], "perf-fp.data")]
    raw.meta.collector = ProcessIdentity(os.getpid(), 0, Path("/proc/sys/kernel/random/boot_id").read_text().strip())
    raw.save_meta()
    (r / "perf-fp.data.2026010100000000").write_bytes(b"PERFILE2" + b"\0" * 4096)
    r = runs["names that look like code"] = _minimal_run(rig.root, "code", f"$(touch {rig.root / 'canary'})")
    for r in runs.values():
        _as_untrusted(r)
    expect = {"meta.json a FIFO": (2, "not a regular file"),
              "meta.json a link to /dev/zero": (2, "not a regular file"),
              "meta.json of 1 GiB": (2, "larger than"), "proc.jsonl a link to /dev/zero": (2, "not a regular file"),
              "stacks: one 200 MiB line": (2, "longer than"), "stacks: a gzip bomb": (2, "expands to more than"),
              "raw perf data, not folded": (2, f"belongs to uid {unprivileged.NOBODY}"),
              "names that look like code": (0, "")}
    cmds = {name: ([*QPROF, "report", str(r), "--format", "json"], *expect[name]) for name, r in runs.items()}
    return _hostile_reads(rig, "archives", cmds)


CASES: dict[str, CaseFn] = {
    "target exits normally mid-run": case_target_exits,
    "target SIGKILLed mid-run": case_target_sigkill,
    "one of two targets exits": case_one_of_two_exits,
    "qprof SIGINT during probe start-up": _signal_case(signal.SIGINT, "start-up"),
    "qprof SIGKILL during probe start-up": _signal_case(signal.SIGKILL, "start-up"),
    "qprof SIGTERM during collection": _signal_case(signal.SIGTERM, "collection"),
    "qprof SIGKILL during collection (uprobes on)": _signal_case(signal.SIGKILL, "collection", crypto=True),
    "qprof SIGINT while writing": _signal_case(signal.SIGINT, "writing"),
    "qprof SIGTERM while writing": _signal_case(signal.SIGTERM, "writing"),
    "qprof SIGKILL while writing": _signal_case(signal.SIGKILL, "writing"),
    "SIGINT delivered twice at once (timeout, process group)": case_stop_delivered_twice,
    "a second Ctrl-C while writing": case_second_ctrl_c,
    "target execs after attach": case_target_execs,
    "two attach on one pid at once": case_two_attach_one_pid,
    "perf missing": case_perf_missing,
    "perf too old": case_perf_too_old,
    "perf crashes mid-run": case_perf_crashes,
    "bpftrace missing": _probe_case("missing"),
    "bpftrace too old": _probe_case("too old"),
    "bpftrace crashes mid-run": _probe_case("crashes"),
    "a probe fails to attach": _probe_case("attach"),
    "disk full while writing (tmpfs)": case_disk_full,
    "output path exists": _output_case("exists"),
    "output path not writable": _output_case("read-only"),
    "output directory on a full filesystem": _output_case("full"),
    "output path is a symlink": _output_case("symlink"),
    "not root": case_not_root,
    "mapping files from an untrusted user": case_untrusted_mapping,
    "archives from an untrusted user": case_untrusted_archive,
}
# What a case must keep: nothing is collected when attach refuses to start.
EXPECTED_DATA = {name: {"yes"} for name in CASES}
EXPECTED_DATA.update({n: {"no"} for n in ("perf missing", "perf too old", "output path exists",
                                          "output path not writable", "output directory on a full filesystem",
                                          "output path is a symlink", "not root",
                                          "mapping files from an untrusted user", "archives from an untrusted user")})
EXPECTED_DATA.update({n: {"partial"} for n in ("qprof SIGKILL during collection (uprobes on)",
                                               "qprof SIGINT while writing", "qprof SIGKILL while writing",
                                               "qprof SIGTERM while writing", "a second Ctrl-C while writing",
                                               "perf crashes mid-run", "disk full while writing (tmpfs)")})
EXPECTED_DATA["qprof SIGINT during probe start-up"] = {"yes", "partial"}
# killed before perf sampled anything: the archive says what was attempted, and nothing more
EXPECTED_DATA["qprof SIGKILL during probe start-up"] = {"no", "partial"}


def run_case(name: str, root: Path | None = None) -> Outcome:
    """Run one case in a scratch directory; CaseSkipped when a facility is absent."""
    made = root is None
    root = Path(tempfile.mkdtemp(prefix="qprof-fault-")) if root is None else root
    rig = FaultRig(root)
    progs0 = bpf_programs()
    try:
        survived, detail, run = CASES[name](rig)
        left = leftovers(run if run is not None else root, progs0, rig.sessions)
        data, why = data_kept(run) if run is not None else ("no", "nothing collected")
    finally:
        rig.close()
        if made:
            shutil.rmtree(root, ignore_errors=True)
    return Outcome(name, survived, left, data, f"{detail}; data: {why}")
