"""A probe group as one unit: what it needs from the kernel, how it starts, what it leaves.

Each group is a package under probes/ holding its kernel programs beside its
Python, and exports `GROUP`; probes/registry.py lists the groups. The collector
starts and stops groups only through this interface, `qprof doctor` checks
their `tracepoints`, and the analysis reads each group's maps back through the
group's own record type. Adding a group is its folder plus one registry line.

Two mechanisms exist: libbpf programs (C, BTF tracepoints; for the per-packet
default group, whose cost matters most) and bpftrace scripts (readable and
extendable by users; for the opt-in groups). `BpftraceGroup` does all a
bpftrace group needs but its script.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Protocol

from qprof import runfiles
from qprof.probes.bpftrace import BpftraceProcess, follow_probes, pid_predicate, render
from qprof.probes.children import ProbeProcess
from qprof.probes.features import bpftrace_problem, bpftrace_version

if TYPE_CHECKING:  # the groups import this module: their records are named for the checker only
    from qprof.probes.crypto.records import CryptoFindings
    from qprof.probes.libbpf import LoaderConfig
    from qprof.probes.packetio.maps import ProbeMaps


class Unavailable(Exception):
    """This host cannot run a group; the message says why and how to fix it."""


@dataclass(frozen=True)
class Context:
    """What a group is started with."""

    out: Path  # the run directory: a group writes its program and output there
    pids: list[int]  # the targets
    status: Callable[[str], None]  # one-line progress messages for the user
    mapped_objects: Callable[[int], list[str]]  # a target's mapped files (/proc/PID/maps)
    # Follow processes that appear during the run (`attach --cgroup`): each group takes up a target's
    # new processes at their birth, and the pids ProbeCollector.add_targets is given (probes.follow)
    follow: bool = False
    kallsyms: Path | None = None  # the attach's snapshot of /proc/kallsyms (probes.kallsyms); None: read that


@dataclass(frozen=True)
class ProgramFiles:
    """What a started group runs, as its entry in probes.json's `programs` records it (the collector's
    archive.model.ProgramRecord): its files in the run directory, and a libbpf loader's config."""

    output: str  # its printed maps (probes.mapsout)
    mechanism: str
    script: str | None = None  # the program: bpftrace script or C source
    object: str | None = None  # libbpf: the compiled object
    config: LoaderConfig | None = None
    series: str | None = None  # waits: its wall clock per 100 ms
    timing: str | None = None  # packetio: its messages' timing


@dataclass
class Findings:
    """A group's own parts of probes.json, at its top: the bpftrace that ran it, what the crypto group
    found to probe (its `cost` added by `finish`)."""

    bpftrace_version: str | None = None
    crypto: CryptoFindings | None = None


@dataclass(frozen=True)
class ProgramCost:
    """One BPF program's run-time statistics (bpftool prog show), scaled to the probes' lifetime."""

    id: int | None = None
    name: str | None = None
    run_cnt: int | float | None = None
    run_time_ns: int | float | None = None
    type: str | None = None


@dataclass
class Launch:
    """A started group: its helper process, its entry in probes.json's `programs`, and its own parts
    of probes.json (`finish` adds to them)."""

    process: ProbeProcess
    program: ProgramFiles
    findings: Findings = field(default_factory=Findings)
    follow_note: str | None = None  # following: what this group cannot follow, in one line


class ProbeGroup(Protocol):
    # read-only: the groups are frozen dataclasses, and nothing sets a group's description
    @property
    def name(self) -> str: ...

    @property
    def default(self) -> bool:
        """In `--probes default`."""

    @property
    def summary(self) -> str:
        """What it measures and what that costs, one line."""

    @property
    def tracepoints(self) -> tuple[str, ...]:
        """Kernel events it attaches to (doctor checks them)."""

    def start(self, ctx: Context) -> Launch:
        """Write its program into the run, start its helper (raise Unavailable when it cannot)."""

    def finish(self, findings: Findings, maps: ProbeMaps, programs: list[ProgramCost],
               status: Callable[[str], None]) -> None:
        """After its helper stopped: add what needs the final maps to its own parts of probes.json
        (`findings`, what `start` returned beside its program; `programs`: the kernel's run-time
        statistics of its BPF programs)."""


def program_text(package: str, name: str) -> str:
    """A group's shipped bpftrace script (<package>/<name>.bt)."""
    return resources.files(package).joinpath(f"{name}.bt").read_text(encoding="utf-8")


@dataclass(frozen=True)
class BpftraceGroup:
    """A group that is one bpftrace script with a {{TARGET}} pid predicate."""

    name: str
    package: str
    summary: str
    tracepoints: tuple[str, ...]
    default: bool = False

    def program(self, ctx: Context) -> tuple[str, Findings]:
        """The script to run for these targets, and what to record beside it in probes.json."""
        return render(program_text(self.package, self.name),
                      {"TARGET": pid_predicate(ctx.pids, follow=ctx.follow)}), Findings()

    def flags(self, findings: Findings) -> tuple[str, ...]:
        """bpftrace options this group's program needs, from what `program` recorded beside it."""
        return ()

    def start(self, ctx: Context) -> Launch:
        problem = bpftrace_problem()
        if problem is not None:
            raise Unavailable(problem)
        text, findings = self.program(ctx)
        path = ctx.out / runfiles.probe_file(self.name, "bt")
        path.write_text(follow_probes(ctx.pids) + text if ctx.follow else text, encoding="utf-8")
        proc = BpftraceProcess(self.name, path, ctx.out / runfiles.probe_file(self.name, "jsonl"),
                                ctx.out / runfiles.probe_file(self.name, "log"))
        ctx.status(f"starting probes: {self.name}")
        proc.spawn(shutil.which("bpftrace") or "bpftrace", self.flags(findings))
        return Launch(proc, ProgramFiles(proc.output.name, "bpftrace", script=path.name),
                      replace(findings, bpftrace_version=bpftrace_version()))

    def finish(self, findings: Findings, maps: ProbeMaps, programs: list[ProgramCost],
               status: Callable[[str], None]) -> None:
        return None

