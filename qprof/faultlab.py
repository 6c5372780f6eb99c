"""Fault injection for `qprof attach`: each case is a real run of the real command line against a
real process, with real perf and bpftrace; faults are injected from outside, never mocked.

How faults are made: signals sent to qprof or its target at a chosen moment (read from the run
directory as qprof writes it), small wrapper executables placed first on PATH (a perf that prints
an old version, or execs the real perf and is then killed with SIGSEGV; a bpftrace that adds a
probe the kernel does not have), PATHs without a tool (a directory of links to everything but it),
and small or read-only tmpfs mounts. After each case: what of qprof's is left (probes.leftovers:
processes, BPF programs, perf events, uprobes) and what data `qprof report` can still read.

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
    return subprocess.Popen([sys.executable, "-c", BUSY.format(secs=secs)])


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


def probes_attached(run: Path) -> bool:
    return "attach_seconds" in json.dumps(_json(run / "probes.json"))


def chunks_folded(run: Path) -> int:
    from qprof.collectors.stacks import read_header

    try:
        return len((read_header(run / "stacks.jsonl.gz") or {}).get("folded", []))
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


class Lab:
    """A scratch directory, wrapper tools, and what each case started (cleaned up on close)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.real = {t: shutil.which(t) for t in ("perf", "bpftrace")}
        self.procs: list[subprocess.Popen] = []
        self.mounts: list[Path] = []

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
               quiet: bool = True) -> subprocess.Popen[str]:
        env = {**os.environ, **({"PATH": path} if path else {})}
        cmd = [*QPROF, "attach", *map(str, pids), "-o", str(run), *(["-q"] if quiet else []), *args]
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        self.procs.append(p)
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
# Each returns (survived, detail, run dir or None, pids that are gone: qprof, targets).

CaseFn = Callable[[Lab], tuple[bool, str, "Path | None", set[int]]]


def _expect(rc: int, err: str, want_rc: int, needle: str = "") -> tuple[bool, str]:
    ok, detail = clean_stderr(err, rc)
    ok = ok and rc == want_rc and needle in err
    return ok, detail if ok else f"expected exit {want_rc} with {needle!r}; got {detail}"


def case_target_exits(lab: Lab) -> tuple[bool, str, Path | None, set[int]]:
    t = lab.target(secs=6)
    run = lab.root / "run"
    att = lab.attach([t.pid], run, "-d", "60")
    rc, err = _finish(att)
    ok, detail = _expect(rc, err, 0)
    meta = _json(run / "meta.json")
    ok = ok and meta.get("stop_reason") == "every target exited" and meta.get("status") == "complete"
    return ok, f"{detail}; stop: {meta.get('stop_reason')}", run, {att.pid, t.pid}


def case_target_sigkill(lab: Lab) -> tuple[bool, str, Path | None, set[int]]:
    t = lab.target()
    run = lab.root / "run"
    att = lab.attach([t.pid], run, "-d", "60")
    _wait(lambda: probes_attached(run) or att.poll() is not None, 60, "probes")
    time.sleep(1)
    t.kill()
    rc, err = _finish(att)
    ok, detail = _expect(rc, err, 0)
    meta = _json(run / "meta.json")
    ok = ok and meta.get("exited") == [t.pid] and meta.get("status") == "complete"
    return ok, f"{detail}; stop: {meta.get('stop_reason')}", run, {att.pid, t.pid}


def case_one_of_two_exits(lab: Lab) -> tuple[bool, str, Path | None, set[int]]:
    short, long = lab.target(secs=5), lab.target()
    run = lab.root / "run"
    att = lab.attach([short.pid, long.pid], run, "-d", "8")
    rc, err = _finish(att)
    ok, detail = _expect(rc, err, 0)
    meta = _json(run / "meta.json")
    ok = ok and meta.get("stop_reason") == "duration reached" and meta.get("exited") == [short.pid]
    rep = subprocess.run([*QPROF, "report", str(run), "--format", "json"], capture_output=True, text=True)
    pids = {p["pid"]: p["samples"] for p in json.loads(rep.stdout or "{}").get("processes", [])}
    ok = ok and pids.get(short.pid, 0) > 0 and pids.get(long.pid, 0) > pids.get(short.pid, 0)
    return ok, f"{detail}; samples per target {pids}", run, {att.pid, short.pid}


def _signal_case(sig: signal.Signals, when: str, *, crypto: bool = False
                 ) -> Callable[[Lab], tuple[bool, str, Path | None, set[int]]]:
    def case(lab: Lab) -> tuple[bool, str, Path | None, set[int]]:
        run = lab.root / "run"
        if crypto:
            if shutil.which("openssl") is None:
                raise CaseSkipped("openssl is not installed (the uprobe target)")
            t = subprocess.Popen(["openssl", "speed", "-evp", "aes-128-gcm", "-seconds", "120"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            lab.procs.append(t)
            time.sleep(0.5)
        else:
            t = lab.target()
        args = ["-d", "60", "--unwind", "dwarf"]
        if crypto:
            args += ["--probes", "packetio,crypto", "--chunk-size", "4M"]
        if when == "writing":
            args = ["-d", "4", "-F", "2999", "--unwind", "dwarf", "--chunk-size", "1G"]
        att = lab.attach([t.pid], run, *args, quiet=when != "writing")
        lines, reader = _stderr_reader(att)
        if when == "start-up":
            _wait(lambda: (run / "probe-packetio.bpf.c").exists() or att.poll() is not None, 60, "probe spawn")
            started_early = not probes_attached(run)
        elif when == "collection":
            _wait(lambda: probes_attached(run) or att.poll() is not None, 60, "probes")
            if crypto:  # kill once a chunk is folded: that part must stay readable
                _wait(lambda: chunks_folded(run) > 0 or att.poll() is not None, 60, "a folded chunk")
            time.sleep(0.5)
        else:
            _wait(lambda: any("folding stacks" in ln for ln in lines) or att.poll() is not None, 60,
                  "the final fold")
        att.send_signal(sig)
        try:
            att.wait(180)
        except subprocess.TimeoutExpired:
            att.kill()
            att.wait()
            return False, "hung after the signal", run, {att.pid, t.pid}
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
            ok = ok and _json(run / "meta.json").get("status") == "complete"
        if when == "start-up":
            detail += "; signalled before probes attached" if started_early else "; probes had attached"
        return ok, detail, run, {att.pid}
    return case


def _perf_refused(make_path: Callable[[Lab], str],
                  needle: str) -> Callable[[Lab], tuple[bool, str, Path | None, set[int]]]:
    """perf unusable before sampling starts: attach refuses in one line and writes no archive."""
    def case(lab: Lab) -> tuple[bool, str, Path | None, set[int]]:
        t = lab.target()
        run = lab.root / "run"
        att = lab.attach([t.pid], run, "-d", "3", path=make_path(lab))
        rc, err = _finish(att)
        ok, detail = _expect(rc, err, 2, needle)
        return ok and not run.exists(), detail, run, {att.pid}
    return case


case_perf_missing = _perf_refused(lambda lab: lab.path_without("perf"), "perf not found")
case_perf_too_old = _perf_refused(
    lambda lab: lab.wrapper_path("perf-old", "perf",
                                 'case "$1" in --version|version) echo "perf version 4.19.0"; exit 0;; esac'),
    "too old")


def case_perf_crashes(lab: Lab) -> tuple[bool, str, Path | None, set[int]]:
    # the real perf record, killed with SIGSEGV 3 s in (the killer's command line names no run dir)
    path = lab.wrapper_path("perf-crash", "perf",
                            '[ "$1" = record ] && sh -c \'sleep 3; kill -SEGV "$1"\' killer $$ &')
    t = lab.target()
    run = lab.root / "run"
    att = lab.attach([t.pid], run, "-d", "60", "--unwind", "dwarf", "--chunk-size", "4M", path=path)
    rc, err = _finish(att)
    ok, detail = _expect(rc, err, 2, "perf record ended before qprof stopped it")
    return ok, detail, run, {att.pid}


def _probe_case(kind: str) -> Callable[[Lab], tuple[bool, str, Path | None, set[int]]]:
    def case(lab: Lab) -> tuple[bool, str, Path | None, set[int]]:
        last_bt = 'for a in "$@"; do last="$a"; done; case "$last" in *.bt) BT=1;; *) BT=0;; esac'
        if kind == "missing":
            path, needle = lab.path_without("bpftrace"), "bpftrace not found"
        elif kind == "too old":
            path = lab.wrapper_path("bt-old", "bpftrace",
                                    'case "$1" in --version|-V) echo "bpftrace v0.9.4"; exit 0;; esac')
            needle = "too old"
        elif kind == "crashes":
            path = lab.wrapper_path("bt-crash", "bpftrace", last_bt + "\n"
                                    '[ $BT = 1 ] && sh -c \'sleep 3; kill -SEGV "$1"\' killer $$ &')
            needle = ""
        else:  # a probe on a tracepoint this kernel does not have: a real attach failure
            path = lab.wrapper_path("bt-noattach", "bpftrace", last_bt + "\n"
                                    '[ $BT = 1 ] && printf "\\ntracepoint:qprof_fault:no_such_event { }\\n" '
                                    '>> "$last"')
            needle = "syscalls"
        t = lab.target()
        run = lab.root / "run"
        # the default packetio group is libbpf (no bpftrace): add a bpftrace group to fault
        att = lab.attach([t.pid], run, "-d", "6", "--probes", "packetio,syscalls", path=path)
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
        return ok and _json(run / "meta.json").get("status") == "complete", detail, run, {att.pid}
    return case


def case_disk_full(lab: Lab) -> tuple[bool, str, Path | None, set[int]]:
    run = lab.tmpfs("small", "size=24m,mode=0700") / "run"
    t = lab.target()
    # --keep-raw: without it, folding keeps the raw data within 4 MiB chunks and this disk never fills
    att = lab.attach([t.pid], run, "-d", "60", "--unwind", "dwarf", "--chunk-size", "4M", "--keep-raw")
    rc, err = _finish(att)
    ok, detail = _expect(rc, err, 2, "No space left on device")
    return ok, detail, run, {att.pid}


def _output_case(kind: str) -> Callable[[Lab], tuple[bool, str, Path | None, set[int]]]:
    def case(lab: Lab) -> tuple[bool, str, Path | None, set[int]]:
        t = lab.target()
        if kind == "exists":
            run = lab.root / "full"
            run.mkdir()
            (run / "precious").write_text("keep me")
            needle = "not empty"
        elif kind == "symlink":
            run = lab.root / "link"
            run.symlink_to(lab.root / "elsewhere")
            needle = "symbolic link"
        else:
            run = lab.tmpfs("ro", "ro,size=1m") / "run"
            needle = "cannot write"
        att = lab.attach([t.pid], run, "-d", "3")
        rc, err = _finish(att)
        ok, detail = _expect(rc, err, 2, needle)
        if kind == "exists":
            ok = ok and (run / "precious").read_text() == "keep me" and len(list(run.iterdir())) == 1
        if kind == "symlink":
            ok = ok and not (lab.root / "elsewhere").exists()
        return ok, detail, None, {att.pid}
    return case


def case_not_root(lab: Lab) -> tuple[bool, str, Path | None, set[int]]:
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        raise CaseSkipped("setpriv (util-linux) is missing: cannot drop root")
    lab.root.chmod(0o777)
    t = lab.target()
    r = subprocess.run([setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all",
                        *QPROF, "attach", str(t.pid), "-d", "1", "-o", str(lab.root / "run")],
                       capture_output=True, text=True, env={**os.environ, "HOME": str(lab.root)}, timeout=60)
    ok, detail = _expect(r.returncode, r.stderr, 2, "CAP_PERFMON")
    return ok, detail, None, set()


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
    "output path is a symlink": _output_case("symlink"),
    "not root": case_not_root,
}
# What a case must keep: nothing is collected when attach refuses to start.
EXPECTED_DATA = {name: {"yes"} for name in CASES}
EXPECTED_DATA.update({n: {"no"} for n in ("perf missing", "perf too old", "output path exists",
                                          "output path not writable", "output path is a symlink", "not root")})
EXPECTED_DATA.update({n: {"partial"} for n in ("qprof SIGKILL during collection (uprobes on)",
                                               "qprof SIGINT while writing", "qprof SIGKILL while writing",
                                               "qprof SIGTERM while writing",
                                               "perf crashes mid-run", "disk full while writing (tmpfs)")})
EXPECTED_DATA["qprof SIGINT during probe start-up"] = {"yes", "partial"}
# killed before perf sampled anything: the archive says what was attempted, and nothing more
EXPECTED_DATA["qprof SIGKILL during probe start-up"] = {"no", "partial"}


def run_case(name: str, root: Path | None = None) -> Outcome:
    """Run one case in a scratch directory; CaseSkipped when a facility is absent."""
    made = root is None
    root = Path(tempfile.mkdtemp(prefix="qprof-fault-")) if root is None else root
    lab = Lab(root)
    progs0 = bpf_programs()
    try:
        survived, detail, run, gone = CASES[name](lab)
        left = leftovers(run if run is not None else root, progs0, gone)
        data, why = data_kept(run) if run is not None else ("no", "nothing collected")
    finally:
        lab.close()
        if made:
            shutil.rmtree(root, ignore_errors=True)
    return Outcome(name, survived, left, data, f"{detail}; data: {why}")
