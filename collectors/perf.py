"""Drive `perf record` and `perf script`.

Sampling uses per-CPU events (-a), kept in the kernel to the targets' cgroup
(the default scope: collectors.perfcgroup), so perf's timer runs on the
targets' own CPU time, or unfiltered with --scope system and filtered by pid
when folding. Per-task sampling (-p) keeps the same clock and was the first
choice, but perf 6.1 spins a whole core after any thread that existed at
attach time exits (tens of millions of wake-ups, measured here): that steals
the CPU the endpoints are measured on. Per-CPU events never hang up.

perf is started disabled (-D -1) with a control FIFO and enabled through it,
so qprof knows the moment sampling really runs (perf's ack), and a caller can
release a stopped target only then: no lost start of a transfer. perf runs in
its own process group (Ctrl-C reaches qprof, which stops perf in order) and gets
SIGINT if qprof dies, so it still finishes its data file.
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import IO

from qprof.collectors.perfscript import PERF_SCRIPT_FIELDS
from qprof.archive.stacks import SAMPLE_CLOCK
from qprof.errors import QprofError
from qprof.probes.children import die_with_parent, interrupt_and_wait
from qprof.probes.features import CAP_SYS_ADMIN, effective_capabilities

UNWIND_MODES = ("fp", "dwarf")
# Hz, off 500 so samples do not lock onto 2 and 4 ms timers (their phase drifts, once a second).
# A sample costs the task it interrupts 15-28 us on qprof's 2-vCPU test VM (timer exit, 8 KiB stack
# copy; two spin loops timed sampled and not): 1.5-2.8% of every busy CPU at 999 Hz, half that here.
# 499 Hz still gives ~1500 samples per busy CPU in a 3 s transfer: a category's share within ~1.3 pp
# (one standard error).
DEFAULT_FREQUENCY = 499
# Bytes of user stack copied per sample for DWARF unwinding (perf's default).
DWARF_STACK_BYTES = 8192


def record_command(perf: str, unwind: str, frequency: int, event: str,
                   output: Path, ctl: str, ack: str, cgroups: list[str] | None = None,
                   switch_output: int | None = None) -> list[str]:
    """`cgroups`: sample only while a task of these (perf_event) cgroups runs, one event each
    (collectors.perfcgroup); None: every task, filtered by pid when folding. `switch_output`:
    bytes per perf data chunk (collectors.chunks), None for one file."""
    if unwind not in UNWIND_MODES:
        raise ValueError(unwind)
    events = [a for cg in cgroups for a in ("-e", event, "-G", cg)] if cgroups else ["-e", event]
    cmd = [perf, "record", *events, "-F", str(frequency),
           # sample times on CLOCK_MONOTONIC, the clock of qprof's /proc and socket readings: the
           # timeline puts CPU by category and bytes moved on one axis, and a target that moved to
           # another recorder (it exec'd: collectors.session) is marked on the same clock
           "-k", SAMPLE_CLOCK,
           "--call-graph", "fp" if unwind == "fp" else f"dwarf,{DWARF_STACK_BYTES}",
           "-a", "-o", str(output),
           "-N",  # no build-id cache copies in ~/.debug: the archive records build-ids itself
           # qprof's own bpftrace loads programs meanwhile; perf 6.1 then recorded BPF ksymbol
           # events that its `perf script` refused ("failed to process type: 17")
           "--no-bpf-event",
           "-D", "-1", "--control", f"fifo:{ctl},{ack}"]
    if unwind == "dwarf":
        cmd += ["-m", "1024"]  # 4 MiB ring per CPU: DWARF samples are ~8 KiB each
    if switch_output:
        # finished chunks of this size are folded while sampling goes on (collectors.chunks);
        # -B: perf 6.1 reads each finished chunk back for build-ids and keeps it resident (its
        # RSS grew by the chunk size at every switch, measured); the archive records build-ids itself
        cmd += [f"--switch-output={switch_output // 1024}K", "-B"]
    return cmd


def _may_unshare_mounts() -> bool:
    """A mount namespace of its own can be made here: root with CAP_SYS_ADMIN (a container's root
    may lack it) and util-linux's unshare and mount."""
    return (os.geteuid() == 0 and bool(effective_capabilities() >> CAP_SYS_ADMIN & 1)
            and shutil.which("unshare") is not None and shutil.which("mount") is not None)


def with_kallsyms(cmd: list[str], snapshot: Path | None) -> list[str]:
    """`cmd` run in a private mount namespace in which `snapshot` (probes.kallsyms) is bound over
    /proc/kallsyms: perf record reads that file four times as it starts (the kernel's start and end,
    its maps), and the kernel formats it anew each time: ~0.1 s of CPU and of start-up delay here,
    against 5 ms for the namespace. Same bytes, same records (the kernel map perf writes is the
    same). Where no namespace can be made, or the bind fails, perf reads /proc/kallsyms itself."""
    if snapshot is None or not _may_unshare_mounts():
        return cmd
    return ["unshare", "--mount", "--propagation", "private", "--",
            "sh", "-c", 'mount --bind "$0" /proc/kallsyms 2>/dev/null; exec "$@"', str(snapshot), *cmd]


class PerfRecorder:
    """One system-wide `perf record` process whose samples of `pids` are unwound one way."""

    def __init__(self, perf: str, pids: list[int], unwind: str, frequency: int, event: str,
                 output: Path, log: Path, cgroups: list[str] | None = None,
                 switch_output: int | None = None, kallsyms: Path | None = None) -> None:
        """`kallsyms`: the attach's snapshot of /proc/kallsyms (probes.kallsyms), given to perf."""
        self.pids, self.unwind, self.output, self.log = pids, unwind, output, log
        # the control FIFOs live in the run directory: nothing is left elsewhere if qprof is killed
        self._fifodir = Path(tempfile.mkdtemp(prefix=".perfctl-", dir=output.parent))
        self._ctl_path = str(self._fifodir / "ctl")
        self._ack_path = str(self._fifodir / "ack")
        self.command = record_command(perf, unwind, frequency, event, output,
                                      self._ctl_path, self._ack_path, cgroups, switch_output)
        self.argv = with_kallsyms(self.command, kallsyms)  # what runs: perf, perhaps in a namespace
        self.proc: subprocess.Popen[bytes] | None = None
        self.cpu_s: float | None = None  # CPU seconds perf record used, once stopped
        self._ctl = self._ack = -1
        self._logf: IO[bytes] | None = None

    def start(self, timeout: float = 60.0) -> None:
        """Start perf and enable sampling; returns once perf acknowledged."""
        os.mkfifo(self._ctl_path, 0o600)
        os.mkfifo(self._ack_path, 0o600)
        # O_RDWR never blocks on a FIFO; the ack end is opened before perf so its open cannot block.
        self._ctl = os.open(self._ctl_path, os.O_RDWR | os.O_NONBLOCK)
        self._ack = os.open(self._ack_path, os.O_RDWR | os.O_NONBLOCK)
        self._logf = open(self.log, "ab")
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=self._logf,
                                     stderr=self._logf,
                                     # SIGINT on qprof's death lets perf close its file cleanly
                                     preexec_fn=die_with_parent(signal.SIGINT))
        self._command("enable", timeout)

    def _command(self, word: str, timeout: float) -> None:
        assert self.proc is not None
        os.write(self._ctl, word.encode() + b"\n")
        deadline = time.monotonic() + timeout
        buf = b""
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise QprofError(f"perf record exited at start-up: {self.log_tail()}")
            r, _, _ = select.select([self._ack], [], [], 0.1)
            if r:
                try:
                    buf += os.read(self._ack, 64)
                except BlockingIOError:
                    continue
                if b"ack" in buf:
                    return
        raise QprofError(f"perf record did not start sampling within {timeout:.0f}s: {self.log_tail()}")

    def log_tail(self) -> str:
        try:
            lines = [ln.strip() for ln in self.log.read_text(errors="replace").splitlines()
                     if ln.strip() and "perf record: Dump" not in ln]
        except OSError:
            return "no perf output"
        return " | ".join(lines[-3:]) or "no perf output"

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 120.0) -> int | None:
        """SIGINT perf and wait for it to write its file; escalate if it hangs."""
        if self.proc is None:
            return None
        rc, self.cpu_s = interrupt_and_wait(self.proc, timeout)
        self.close()
        return rc

    def close(self) -> None:
        for fd in (self._ctl, self._ack):
            if fd >= 0:
                os.close(fd)
        self._ctl = self._ack = -1
        if self._logf is not None:
            self._logf.close()
            self._logf = None
        for p in (self._ctl_path, self._ack_path):
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass
        try:
            self._fifodir.rmdir()
        except OSError:
            pass


def script_command(perf: str, data: Path, pids: list[int], window: tuple[int | None, int | None] = (None, None),
                   buildid_dir: Path | None = None) -> list[str]:
    """`perf script` for the targets' samples (symbols resolved on this host), trimmed to what the
    parser reads: the fixed field list, no inline expansion (addr2line per frame: slow, and the
    mappings match real functions). `window`: (first, last) sample time in ns, both included,
    None for open; perf skips samples outside it before unwinding them, so slices cost their share.
    `buildid_dir`: the build-id cache perf reads debug files from (collectors.debuginfo's: perf 6.1
    takes it as an option, not from PERF_BUILDID_DIR)."""
    cache = ["--buildid-dir", str(buildid_dir)] if buildid_dir is not None else []
    cmd = [perf, *cache, "script", "-i", str(data), "-F", PERF_SCRIPT_FIELDS, "--no-inline",
           "--pid", ",".join(map(str, pids))]
    start, end = window
    if start is not None or end is not None:
        cmd += ["--time", f"{_perf_time(start)},{_perf_time(end)}"]
    return cmd


def _perf_time(ns: int | None) -> str:
    """perf's --time syntax: seconds with up to nine decimals (ns); empty for an open end."""
    return "" if ns is None else f"{ns // 1_000_000_000}.{ns % 1_000_000_000:09d}"
