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

import os
import signal
from pathlib import Path
from typing import Iterable

from qprof.probes.children import ProbeProcess, die_with_parent

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


def render(template: str, values: dict[str, str]) -> str:
    """Fill `{{NAME}}` placeholders; a placeholder left unfilled is a bug, not a probe."""
    out = template
    for k, v in values.items():
        out = out.replace("{{" + k + "}}", v)
    if "{{" in out:
        missing = out[out.index("{{"):].split("}}", 1)[0] + "}}"
        raise ValueError(f"probe template placeholder {missing} not filled")
    return out


FOLLOW_MAP = "@qprof_follow"  # processes that became targets during the run: pid -> 1


def pid_predicate(pids: Iterable[int], var: str = "pid", follow: bool = False) -> str:
    """`(pid == 1 || pid == 2)`: bpftrace 0.17 has no sets, and positional params are single values.
    `follow`: or a process followed since the start (FOLLOW_MAP, filled by follow_probes)."""
    parts = [f"{var} == {int(p)}" for p in pids] + ([f"{FOLLOW_MAP}[{var}]"] if follow else [])
    return "(" + " || ".join(parts) + ")" if parts else "0"


def follow_probes(pids: Iterable[int]) -> str:
    """Put before a followed run's program (probes.group.Context.follow), so that it attaches first.

    A process a target forks is a target from its fork: the tracepoint runs in the parent and names
    the child only by its id, so a new thread's id is put in the map too; it never equals a
    process's pid while the thread lives, and is taken out when the thread exits (a later process
    given that number is not a target). A process qprof announces (`announce`) is one from then on."""
    who = pid_predicate(pids, follow=True)
    return (f"// qprof following (added by qprof): targets' new processes and the pids qprof announces\n"
            f"tracepoint:sched:sched_process_fork /{who}/ {{ {FOLLOW_MAP}[args->child_pid] = 1; }}\n"
            f"tracepoint:sched:sched_process_exit /tid != pid && {FOLLOW_MAP}[tid]/ {{ delete({FOLLOW_MAP}[tid]); }}\n"
            f"tracepoint:syscalls:sys_enter_getsid /pid == {os.getpid()}/ {{ {FOLLOW_MAP}[args->pid] = 1; }}\n\n")


def announce(pids: Iterable[int]) -> None:
    """Make these processes targets of every running followed bpftrace program: getsid(2) on each,
    which the program's follow_probes block sees (a read-only call; a gone pid is skipped)."""
    for pid in pids:
        try:
            os.getsid(int(pid))
        except OSError:
            pass


class BpftraceProcess(ProbeProcess):
    """One running bpftrace program writing JSON lines to `output`."""

    def __init__(self, name: str, program: Path, output: Path, log: Path) -> None:
        super().__init__(name, output, log)
        self.program = program

    def spawn(self, bpftrace: str, flags: tuple[str, ...] = ()) -> None:
        """Start bpftrace; it compiles for about a second before its probes are live. `flags`: the
        group's own options (crypto: --unsafe for uprobes at addresses only Go's table names)."""
        with open(self.program, "a", encoding="utf-8") as f:
            f.write(READY_PROBE.format(pid=os.getpid()))
        cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c", _MOUNT_AND_EXEC, "sh",
               bpftrace, *flags, "-f", "json", str(self.program)]
        env = {**os.environ, "BPFTRACE_STRLEN": "64", "BPFTRACE_NO_USER_SYMBOLS": "1"}
        self._start(cmd, die_with_parent(signal.SIGTERM), env)

    def start(self, bpftrace: str, timeout: float = 60.0) -> None:
        self.spawn(bpftrace)
        self.wait_attached(timeout)

    def log_tail(self) -> str:
        if self.proc is not None and self.proc.returncode == 97:
            return f"could not mount tracefs at {TRACEFS}"
        return super().log_tail()
