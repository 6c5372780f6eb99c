"""A followed service's processes as one side (attach --cgroup/--unit): each worker and their sum.

A server with a worker per core spreads one workload over many processes; what a user asks of it
is first what the service spent, then whether one worker differs (a hot flow hashed to it, a
replacement that started late). The sum merges the workers' breakdowns sample by sample, so its
shares weigh each worker by the CPU time it used.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from qprof.archive.model import Meta, Service
from qprof.attribution.profile import Breakdown, Profile


@dataclass
class Member:
    """One process of the service: when it joined (None: there at the start), whether it exited during
    the run, and its sampled CPU time (empty when it was never sampled)."""

    pid: int
    comm: str
    joined_s: float | None
    exited: bool
    breakdown: Breakdown


@dataclass
class ServiceView:
    service: Service
    members: list[Member] = field(default_factory=list)
    total: Breakdown = field(default_factory=Breakdown)

    @property
    def joined(self) -> int:
        return sum(m.joined_s is not None for m in self.members)

    @property
    def exited(self) -> int:
        return sum(m.exited for m in self.members)


def services(meta: Meta, profile: Profile) -> list[ServiceView]:
    """One view per followed cgroup, its processes in the order they were found."""
    procs = {p.pid: p for p in profile.processes}
    exited = set(meta.exited)
    views = []
    for svc in meta.services:
        view = ServiceView(svc)
        for t in meta.targets:
            if t.service != svc.name:
                continue
            p = procs.get(t.pid)
            b = p.breakdown if p is not None else Breakdown()
            view.members.append(Member(t.pid, t.comm, t.joined_s, t.pid in exited, b))
            view.total.merge(b)
        views.append(view)
    return views
