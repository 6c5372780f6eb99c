"""Run a bpftrace program beside perf and keep its output, whatever happens to qprof.

Why bpftrace: probe programs stay readable scripts under probes/ that users can
extend, and on BTF kernels they need no kernel headers (bcc would).

How it runs, and why:
- in a private mount namespace where tracefs is mounted if the host has it
  unmounted: bpftrace needs tracefs for tracepoint formats, and the host's
  mounts stay exactly as they were (nothing to restore, even after SIGKILL);
- with `-f json` on stdout redirected to a file in the run archive, the
  script printing its maps every second: if qprof or bpftrace is killed, the
  last complete snapshot is still on disk;
- with PR_SET_PDEATHSIG: bpftrace dies with qprof, and the kernel frees its
  programs and perf events when its file descriptors close; no leftovers.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Callable, Iterable

from qprof.errors import QprofError
from qprof.probes.children import die_with_parent, interrupt_and_wait

TRACEFS = "/sys/kernel/tracing"
# The shell step mounts tracefs only inside the new mount namespace (unshare -m).
_MOUNT_AND_EXEC = (
    f'if [ ! -e {TRACEFS}/events ]; then mount -t tracefs nodev {TRACEFS} || exit 97; fi; exec "$@"'
)


# Appended to every program. bpftrace prints "attached_probes" before it attaches them, and
# attaches in script order: once this last probe fires for qprof's own getppid(), every
# probe above it is live.
READY_PROBE = """
// qprof readiness marker (added by qprof): attached last
tracepoint:syscalls:sys_enter_getppid /pid == {pid}/ {{ printf("qprof-ready\\n"); }}
"""


def script_text(name: str) -> str:
    """A shipped probe script (probes/<name>.bt)."""
    return resources.files("qprof.probes").joinpath(f"{name}.bt").read_text(encoding="utf-8")


def render(template: str, values: dict[str, str]) -> str:
    """Fill `{{NAME}}` placeholders; a placeholder left unfilled is a bug, not a probe."""
    out = template
    for k, v in values.items():
        out = out.replace("{{" + k + "}}", v)
    if "{{" in out:
        missing = out[out.index("{{"):].split("}}", 1)[0] + "}}"
        raise ValueError(f"probe template placeholder {missing} not filled")
    return out


def pid_predicate(pids: Iterable[int], var: str = "pid") -> str:
    """`(pid == 1 || pid == 2)`: bpftrace 0.17 has no sets, and positional params are single values."""
    parts = [f"{var} == {int(p)}" for p in pids]
    return "(" + " || ".join(parts) + ")" if parts else "0"


@dataclass
class BpftraceProcess:
    """One running bpftrace program writing JSON lines to `output`."""

    name: str
    program: Path
    output: Path
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    started_at: float | None = None

    def spawn(self, bpftrace: str) -> None:
        """Start bpftrace; it compiles for about a second before its probes are live."""
        with open(self.program, "a", encoding="utf-8") as f:
            f.write(READY_PROBE.format(pid=os.getpid()))
        out = open(self.output, "ab")  # O_APPEND: compact() may empty the file under bpftrace
        out.truncate(0)
        log = open(self.log, "wb")
        cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c", _MOUNT_AND_EXEC, "sh",
               bpftrace, "-f", "json", str(self.program)]
        env = {**os.environ, "BPFTRACE_STRLEN": "64", "BPFTRACE_NO_USER_SYMBOLS": "1"}
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=log,
                                     preexec_fn=lambda: die_with_parent(signal.SIGTERM), env=env)
        out.close()
        log.close()

    def wait_attached(self, timeout: float = 60.0, should_stop: Callable[[], bool] = lambda: False) -> bool:
        """True once every probe is attached (the readiness probe has fired); False if
        `should_stop` said to give up first (bpftrace is then stopped with the rest)."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if should_stop():
                return False
            if self.proc.poll() is not None:
                raise QprofError(f"bpftrace ({self.name}) failed to start: {self.log_tail()}")
            os.getppid()  # fires the readiness probe once it is attached
            if self._attached():
                self.started_at = time.monotonic()
                return True
            time.sleep(0.01)
        self.stop()
        raise QprofError(f"bpftrace ({self.name}) did not attach within {timeout:.0f}s: {self.log_tail()}")

    def start(self, bpftrace: str, timeout: float = 60.0) -> None:
        self.spawn(bpftrace)
        self.wait_attached(timeout)

    def _attached(self) -> bool:
        try:
            with open(self.output, "rb") as f:
                head = f.read(8192)
        except OSError:
            return False
        return b"qprof-ready" in head

    def log_tail(self) -> str:
        lines: list[str] = []
        for p in (self.log, self.output):
            try:
                lines += [ln.strip() for ln in p.read_text(errors="replace").splitlines()
                          if ln.strip() and '"type": "map"' not in ln and '"type":"map"' not in ln]
            except OSError:
                pass
        if self.proc is not None and self.proc.returncode == 97:
            return f"could not mount tracefs at {TRACEFS}"
        return " | ".join(lines[-3:]) or "no output"

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def compact(self) -> None:
        """Keep the streamed output small on long runs (the maps are printed in full every
        second: it grows by KiB/s): the last value of every map goes to last_path(output)
        atomically, then the stream starts again empty. bpftrace appends (O_APPEND), so its next
        print lands at the start; a print cut by the truncation is superseded a second later."""
        maps = read_maps(self.output)
        if not maps:
            return
        last = last_path(self.output)
        tmp = last.with_name(last.name + ".tmp")
        tmp.write_text(json.dumps({"type": "map", "data": maps}) + "\n", encoding="utf-8")
        tmp.replace(last)
        os.truncate(self.output, 0)

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGINT: bpftrace prints its maps a last time and detaches."""
        if self.proc is None:
            return None
        return interrupt_and_wait(self.proc, timeout)


def last_path(output: Path) -> Path:
    """Where compact() keeps the last value of every map: probe-<group>.last.json."""
    return output.with_name(output.name.removesuffix(".jsonl") + ".last.json")


def read_maps(output: Path) -> dict[str, Any]:
    """The last value printed for each map (a line cut off by a kill is ignored), after
    what compact() kept of the stream's earlier part.

    bpftrace 0.17 JSON: {"type": "map", "data": {"@name": {"k1,k2": v}}} for
    counters; "hist" entries are lists of {min, max, count}; an empty map may
    be printed as {} or not at all.
    """
    maps: dict[str, Any] = {}
    for path in (last_path(output), output):
        try:
            f = open(path, encoding="utf-8", errors="replace")
        except OSError:
            continue
        with f:
            _read_lines(f, maps)
    return maps


def _read_lines(f: Any, maps: dict[str, Any]) -> None:
    for line in f:
        try:
            obj = json.loads(line)
        except (json.JSONDecodeError, RecursionError):
            continue
        if isinstance(obj, dict) and obj.get("type") in ("map", "hist", "stats") and \
                isinstance(obj.get("data"), dict):
            maps.update(obj["data"])
