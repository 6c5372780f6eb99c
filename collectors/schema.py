"""The shapes of meta.json and probes.json, checked once when a run is opened.

An archive is data from another machine or an older qprof, possibly cut or edited:
reports must not crash deep in the analysis on a field of the wrong type. Each
document is checked against the shape qprof writes (fields may be absent; when
present they have this type), and a mismatch is one line naming the file and the
field: `meta.json: targets[0].pid must be an integer`. NaN and Infinity, which
Python's json accepts but JSON does not, are refused while parsing (`loads`).
"""

from __future__ import annotations

import json
import math
from typing import Any

from qprof.errors import QprofError


class Of:
    """A spec node: `check(value, where)` returns a complaint or None."""

    desc = "?"

    def check(self, value: Any, where: str) -> str | None:  # pragma: no cover - interface
        raise NotImplementedError


class T(Of):
    """A scalar type: int (not bool), float (any finite number), str, bool; or None when `null`."""

    def __init__(self, *types: type | None) -> None:
        self.types = types
        names = {int: "an integer", float: "a number", str: "a string", bool: "true or false", None: "null"}
        self.desc = " or ".join(names[t] for t in types)

    def check(self, value: Any, where: str) -> str | None:
        for t in self.types:
            if t is None and value is None:
                return None
            if t is bool and isinstance(value, bool):
                return None
            if t is int and isinstance(value, int) and not isinstance(value, bool):
                return None
            if t is float and isinstance(value, (int, float)) and not isinstance(value, bool) and \
                    math.isfinite(value):
                return None
            if t is str and isinstance(value, str):
                return None
        return f"{where} must be {self.desc}"


ANY = T(int, float, str, bool, None)


class Anything(Of):
    desc = "anything"

    def check(self, value: Any, where: str) -> str | None:
        return None


class List(Of):
    def __init__(self, item: Any) -> None:
        self.item = spec(item)
        self.desc = "a list"

    def check(self, value: Any, where: str) -> str | None:
        if not isinstance(value, list):
            return f"{where} must be a list"
        for i, v in enumerate(value):
            bad = self.item.check(v, f"{where}[{i}]")
            if bad:
                return bad
        return None


class Obj(Of):
    """A JSON object with known fields (each optional; others allowed)."""

    def __init__(self, fields: dict[str, Any], required: tuple[str, ...] = ()) -> None:
        self.fields = {k: spec(v) for k, v in fields.items()}
        self.required = required
        self.desc = "an object"

    def check(self, value: Any, where: str) -> str | None:
        if not isinstance(value, dict):
            return f"{where} must be an object"
        for k in self.required:
            if k not in value:
                return f"{where} lacks `{k}`"
        for k, s in self.fields.items():
            if k in value:
                bad = s.check(value[k], f"{where}.{k}" if where else k)
                if bad:
                    return bad
        return None


class MapOf(Of):
    """A JSON object with free keys whose values all have one shape; `numbered`: the keys are
    decimal numbers (CPUs, pids, thread ids), which readers turn into ints."""

    def __init__(self, item: Any, numbered: bool = False) -> None:
        self.item = spec(item)
        self.numbered = numbered
        self.desc = "an object"

    def check(self, value: Any, where: str) -> str | None:
        if not isinstance(value, dict):
            return f"{where} must be an object"
        for k, v in value.items():
            if self.numbered and not (isinstance(k, str) and k.isascii() and k.isdigit()):
                return f"{where} keys must be decimal numbers, not {k!r}"
            bad = self.item.check(v, f"{where}[{k!r}]")
            if bad:
                return bad
        return None


class Either(Of):
    def __init__(self, *options: Any) -> None:
        self.options = [spec(o) for o in options]
        self.desc = " or ".join(o.desc for o in self.options)

    def check(self, value: Any, where: str) -> str | None:
        if any(o.check(value, where) is None for o in self.options):
            return None
        return f"{where} must be {self.desc}"


def spec(s: Any) -> Of:
    if isinstance(s, Of):
        return s
    if isinstance(s, dict):
        return Obj(s)
    if isinstance(s, list):
        return List(s[0])
    if s is Any:
        return Anything()
    return T(s)


INT, NUM, STR, BOOL = T(int), T(float), T(str), T(bool)
OPT_INT, OPT_NUM, OPT_STR = T(int, None), T(float, None), T(str, None)

_OBJECT = Obj({"path": STR, "build_id": OPT_STR, "symbols": OPT_STR, "go": T(bool, None),
               "frame_pointers": T(bool, None), "dynamic": T(bool, None)}, required=("path",))
META = Obj({
    "format": STR, "version": ANY, "status": STR, "incomplete_reason": OPT_STR, "qprof_version": OPT_STR,
    "host": Obj({"kernel": OPT_STR, "kernel_build": OPT_STR, "machine": OPT_STR, "cpu_model": OPT_STR,
                 "cpus": OPT_INT, "python": OPT_STR, "cpu_nodes": MapOf(INT, numbered=True),
                 "nics": [Obj({"name": STR, "numa_node": OPT_INT}, required=("name", "numa_node"))]}),
    "tools": MapOf(OPT_STR), "kernel_features": MapOf(ANY),
    "sampling": Obj({"event": STR, "frequency": INT, "chunk_bytes": INT, "keep_raw": BOOL, "clock": STR,
                     "groups": [{"unwind": STR, "pids": [INT], "perf_data": STR,
                                 "windows": MapOf([[OPT_INT]], numbered=True)}]}),
    "targets": [Obj({"pid": INT, "comm": STR, "cmdline": [STR], "exe": OPT_STR, "objects": [_OBJECT],
                     "threads": MapOf(STR, numbered=True), "cgroup": [STR], "role": OPT_STR, "unwind": OPT_STR,
                     "unwind_reason": OPT_STR,
                     "images": [Obj({"exe": OPT_STR, "comm": STR, "unwind": OPT_STR, "since_s": NUM})]},
                    required=("pid",))],
    "requested_duration_s": OPT_NUM, "probes": [STR], "collector": MapOf(ANY),
    "pressure": Obj({"hierarchy": OPT_STR, "unavailable": OPT_STR}),
    "symbols": [Obj({"path": STR, "build_id": OPT_STR, "how": STR, "source": OPT_STR, "note": STR},
                    required=("path", "how"))],
    "start_time": OPT_STR, "end_time": OPT_STR, "duration_s": OPT_NUM, "stop_reason": OPT_STR,
    "exited": [INT], "perf_exit": MapOf(OPT_INT), "perf_cpu_s": MapOf(OPT_NUM),
    "parse": {"samples": INT, "bad_lines": INT, "bad_examples": [STR]},
    "chunks": {"folded": INT, "dropped": [MapOf(ANY)], "unreadable": [MapOf(ANY)]},
})

_HIST = [{"min": OPT_NUM, "max": OPT_NUM, "count": NUM}]
_MAP = MapOf(Either(NUM, _HIST, MapOf(Either(NUM, _HIST))))
# the packetio sampler's window statistics (probes/packetio/windows.py), printed as "@windows"
_WINDOWS = Obj({"series": [STR], "periods": INT, "full_periods": INT, "span_s": NUM, "counted_s": NUM,
                "expansion": NUM,
                "groups": MapOf(Obj({"netns": STR, "sum": [NUM], "counted": [NUM], "seen": [INT], "q": [NUM]},
                                    required=("sum", "counted", "q"))),
                "netns": MapOf({"pids": [INT], "mib_in": NUM, "mib_out": NUM, "ip_out_octets": NUM}), "final": BOOL,
                "events": MapOf(NUM), "budget": MapOf(NUM)},
               required=("series", "periods", "full_periods", "groups"))
_SNAPSHOT = {"softirq_seconds": MapOf(NUM, numbered=True), "softirqs": MapOf([NUM]), "sysctl": MapOf(Either(STR, NUM)),
             "time": NUM, "udp_mib": MapOf({"pids": [INT], "udp": MapOf(NUM)})}
_COUNTERS = MapOf(OPT_NUM)
_QDISC = Obj({"dev": OPT_STR, "kind": OPT_STR, "handle": OPT_STR, "bytes": OPT_NUM, "packets": OPT_NUM,
              "drops": OPT_NUM, "overlimits": OPT_NUM, "requeues": OPT_NUM, "backlog": OPT_NUM, "qlen": OPT_NUM})
PROBES = Obj({
    "groups": [STR], "unavailable": [Obj({"probe": STR, "reason": STR}, required=("probe", "reason"))],
    "bpftrace_version": OPT_STR,
    "programs": MapOf({"maps": MapOf(Either(_MAP, _WINDOWS)), "output": STR, "script": STR, "exit": OPT_INT,
                       "log_tail": OPT_STR, "attach_seconds": OPT_NUM, "started": OPT_NUM, "cpu_s": OPT_NUM}),
    "before": _SNAPSHOT, "after": _SNAPSHOT,
    "cost": Obj({"bpf_run_cnt": NUM, "bpf_run_time_ns": NUM, "measured_run_cnt": NUM,
                 "measured_run_time_ns": NUM, "probes_s": NUM, "stats_on_s": NUM, "method": STR,
                 "programs": [{"id": OPT_INT, "name": OPT_STR, "type": OPT_STR, "run_cnt": OPT_NUM,
                               "run_time_ns": OPT_NUM}],
                 "by_group": MapOf({"bpf_run_cnt": NUM, "bpf_run_time_ns": NUM})},
                required=("bpf_run_cnt", "bpf_run_time_ns")),
    "drop_reason_names": MapOf(STR, numbered=True), "sockets_error": OPT_STR,
    "sockets": [{"fds": [INT], "pids": [INT], "port": OPT_INT, "local": STR, "peer": STR,
                 "first": _COUNTERS, "last": _COUNTERS, "first_time": NUM, "last_time": NUM}],
    "crypto": MapOf(Any),
    "qdiscs": MapOf(Obj({"pids": [INT], "first": [_QDISC], "last": [_QDISC], "first_time": NUM, "last_time": NUM})),
})

_TCP_COUNTERS = Obj({"payload_sent": INT, "bytes_received": INT, "bytes_acked": INT, "bytes_sent": INT,
                     "bytes_retrans": INT, "segs_out": INT, "segs_in": INT},
                    required=("payload_sent", "bytes_received"))
TCP = Obj({
    "source": STR, "polls": INT, "dumps": INT, "namespaces": [STR], "errors": [STR], "lost_destroy_events": INT,
    "unowned_closed": MapOf(INT),
    "sockets": [Obj({"pid": INT, "cookie": INT, "family": INT, "local": STR, "peer": STR, "first": _TCP_COUNTERS,
                     "last": _TCP_COUNTERS, "first_time": NUM, "last_time": NUM, "closed": BOOL},
                    required=("pid", "first", "last"))],
}, required=("sockets",))
# cumulative bytes [sent, received] per target pid since the run started (collectors.traffic)
_TRAFFIC = MapOf([NUM], numbered=True)

# fields that readers index: a reading lacking one is damaged, and skipped
_THREAD = ("tid", "comm", "utime_s", "stime_s")
_CGROUP = ("nr_periods", "nr_throttled", "throttled_s")
PROC_READING = Obj({
    "t": NUM, "mono": NUM, "tcp": _TRAFFIC, "udp": _TRAFFIC,
    "threads": MapOf([Obj({"tid": INT, "comm": STR, "state": STR, "utime_s": NUM, "stime_s": NUM,
                           "on_cpu_s": OPT_NUM, "run_delay_s": OPT_NUM, "syscall": OPT_STR, "cpu": INT,
                           "voluntary": OPT_INT, "involuntary": OPT_INT},
                          required=_THREAD)],
                     numbered=True),
    "cgroups": MapOf(Either(T(None), Obj({"version": STR, "path": STR, "quota_cores": OPT_NUM,
                                          "nr_periods": NUM, "nr_throttled": NUM, "throttled_s": NUM},
                                         required=_CGROUP)),
                     numbered=True),
    "limits": MapOf(Obj({"cpus_allowed": Either(T(None), [INT]), "cpuset": Either(T(None), [INT]),
                         "pressure": Either(T(None), MapOf(NUM)), "pressure_procs": OPT_INT}), numbered=True),
    "pressure": Either(T(None), MapOf(NUM)),
    "cpu_idle": MapOf(NUM, numbered=True),
}, required=("mono", "threads"))


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def loads(text: str) -> Any:
    """json.loads without NaN/Infinity (ValueError like any other malformed JSON)."""
    return json.loads(text, parse_constant=_no_constant)


def validate(doc: Any, shape: Of, name: str) -> None:
    """Raise one line naming `name` and the first field that has the wrong shape."""
    bad = shape.check(doc, "")
    if bad:
        raise QprofError(f"{name}: {bad.lstrip() if not bad.startswith(' must') else 'the document' + bad}; "
                         "the archive is damaged or from an incompatible qprof")


def conforms(doc: Any, shape: Of) -> bool:
    return shape.check(doc, "") is None


def probe_maps(maps: Any) -> dict[str, Any]:
    """The maps of one probe snapshot that have a map's shape; for readers that go on without
    the others (the live view), where an archive's reader refuses the whole document."""
    if not isinstance(maps, dict):
        return {}
    return {k: v for k, v in maps.items() if isinstance(k, str) and
            (_MAP.check(v, "") is None or (k == "@windows" and _WINDOWS.check(v, "") is None))}
