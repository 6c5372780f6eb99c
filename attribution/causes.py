"""The verdict's causes: a closed vocabulary, each cause defined once with what it means and how it is proven.

Why one place: a cause used to be a string spelled in the verdict's checks, its
ranking texts, the qlog agreement table, the table rows (`startswith("cpu")`),
the lab's scenarios and the docs. A `Cause` is a `StrEnum` member, so it is its
string wherever text or JSON shows it (reports and archives stay as they were),
and its `About` carries everything else code asks of it. Adding a cause is a
member here, the check in attribution/verdict.py that names it, and its proof
(docs/attribution.md, "Adding a verdict cause").
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


@dataclass(frozen=True)
class About:
    """What the code and the docs need to know of a cause besides its name."""

    meaning: str  # what binds, in a line (docs/attribution.md lists them)
    cpu: bool = False  # a side's CPU binds (the table's cpu_limited; a CPU-limited sender cannot fill its window)
    # what the sender's own record (qlog, attribution.qlog) should say dominated: its reasons; None where it
    # depends on which side limits (the CPU causes) or the stack cannot say (no-traffic)
    qlog: tuple[str, ...] | None = None
    second_to: str | None = None  # why its met checks are not a side's cause when another binds (the report says)
    waited_for: str | None = None  # the sender waited longest for this (causes read off its waits)
    pinning: str | None = None  # what binding the endpoints to CPUs of their own does to goodput: raise or lower
    scenario: str | None = None  # the lab scenario whose verdict must name it (lab/scenarios.py SCENARIOS)
    proof: str = ""  # where it is proven when no lab scenario names it


_WAITING = "threads waiting for one another count only when no CPU, buffer or queue binds"


class Cause(StrEnum):
    """What limits a side, or the run. Each member's `about` says what the rest of qprof needs of it."""

    about: About

    def __new__(cls, value: str, about: About) -> Cause:
        member = str.__new__(cls, value)
        member._value_ = value
        member.about = about
        return member

    CPU_BUSY = "cpu-busy", About(
        "on a CPU most of what it may use, or its busiest thread nearly all the time", cpu=True,
        second_to="cpu-starved decides over it: the CPU it got was bounded by other work",
        proof="tests/test_verdict.py (a single-threaded side on a CPU 95%); `qprof demo`'s ngtcp2 pair")
    CPU_STARVED = "cpu-starved", About(
        "throttled by its cgroup, or stalled for a CPU while the CPUs it may use were busy", cpu=True,
        second_to="cpu-busy decides over it", scenario="server-quota")
    RECEIVE_BUFFER = "receive-buffer", About(
        "datagrams dropped at its sockets for lack of buffer", qlog=("congestion_control",),
        second_to="a CPU-limited side's own drops follow from its CPU", scenario="receive-buffer")
    LINK = "link", About(
        "a queue on the way out of a side's namespace held back or dropped the packets", qlog=("congestion_control",),
        second_to="a queue that held packets back is the link's limit, the verdict's, not a side's", scenario="link")
    SCHEDULING = "scheduling", About(
        "a multi-threaded side's threads queue for busy CPUs", qlog=("application",), second_to=_WAITING,
        pinning="raise", scenario="scheduling")
    HANDOFFS = "handoffs", About(
        "a multi-threaded side's threads wait for one another's wakeups while CPUs sit idle", qlog=("application",),
        second_to=_WAITING, pinning="lower", scenario="scheduling")
    PATH = "path", About(
        "the path's round trip and loss hold the sender through congestion control (its qlog says so)",
        qlog=("congestion_control",),
        waited_for="its peer's acknowledgements: the path's round-trip time and loss hold it through congestion "
                   "control (the stack's qlog says so)", scenario="path-50ms-2%")
    FLOW_CONTROL = "flow-control", About(
        "the receiver's flow-control credit holds the sender (its qlog says so)", qlog=("flow_control",),
        waited_for="credit from its peer: the receiver's flow control holds it (the stack's qlog says so)",
        scenario="flow-control")
    PATH_OR_FLOW_CONTROL = "path/flow-control", About(
        "the sender waited for its peer's packets; no qlog tells the path and flow control apart",
        qlog=("congestion_control", "flow_control"),
        waited_for="its peer's packets (acknowledgements or flow-control credit): the path's round-trip time and "
                   "loss, or the receiver's window; the stack's qlog tells them apart (qprof report --qlog)",
        proof="tests/test_wall_verdict.py (a sender waiting on the network, no qlog)")
    APPLICATION = "application", About(
        "the sender waited on a timer or on its own input: a paced or idle application", qlog=("application",),
        scenario="application")
    UNMEASURED_WAITS = "flow-control/application", About(
        "nothing binds and the threads' waits were not measured (no waits probes): flow control or the application",
        qlog=("application", "flow_control"), proof="tests/test_verdict.py (runs without the waits probes)")
    NO_TRAFFIC = "no-traffic", About(
        "no side moved enough traffic to be judged", proof="tests/test_verdict.py (a busy process that sent nothing)")


def causes_of(joined: str | None) -> tuple[Cause, ...]:
    """The causes of a verdict's cause as reports show it (two joined by "+" when the sides differ);
    none for None or a word qprof does not know (a report written by another version)."""
    known = {c.value: c for c in Cause}
    return tuple(known[part] for part in (joined or "").split("+") if part in known)
