"""`qprof study`: stacks x settings x repetitions from one file, interleaved, resumable.

A comparison is many `record` runs: every stack under every setting (GSO on
and off, a socket buffer, a CPU binding: any variation of the command lines
or the environment), repeated. Run in blocks, slow drift on the host (thermal,
a noisy neighbour, caches) lands on one configuration; so the runs go in a
random order fixed by the study's seed, the same order on every resume. The
plan is written first (DIR/study.json, with a hash of the study it came from)
and each run is an ordinary run archive at DIR/STACK/SETTING/rep-NN, so `qprof
table`, `report` and `diff` read them as they read any run. A run is finished
when its archive is complete and its commands succeeded; a study interrupted
(Ctrl-C, a crash, a power cut) is resumed with the same command: finished
runs are kept and skipped, an unfinished one is moved aside to DIR/.partial
(nothing collected is deleted) and run again. A study file changed since the
plan refuses to resume into the same directory. Each run's meta.json records
its configuration (stack and setting names, commands, environment) and its
repetition, so tables pool its runs by what they measured, not by their path.

The file (TOML):

    seed = 7                      # the order's seed
    repetitions = 3               # runs per stack x setting
    [vars]                        # {name} in the commands below (paths, hosts)
    payload = "/srv/payload"
    [record]                      # `qprof record` options for every run
    ready = "udp:{port}"          # the server is ready when this is true
    probes = "default"            # also: frequency, unwind, scope, duration, ready_timeout
    [stacks.ngtcp2]               # one table per stack: its two commands ({port}: a free port per run)
    server = "gtlsserver {server_args} -d {payload} 127.0.0.1 {port} KEY CERT"
    client = "gtlsclient {client_args} 127.0.0.1 {port} https://127.0.0.1:{port}/payload"
    env = {}                      # optional
    [settings.gso-on]             # one table per setting: env, server_args, client_args...
    [settings.gso-off.ngtcp2]     # ... for every stack, or per stack as here
    server_args = "--max-gso-dgrams=1"
    [settings.gso-off.quicgo]
    env = { QUIC_GO_DISABLE_GSO = "true" }
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import string
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from qprof import archive
from qprof.archive.model import Configuration, LiveData
from qprof.benchmark import Command, RecordOptions, parse_command, repetition_name, run_repetition
from qprof.collectors.probing import parse_groups
from qprof.collectors.session import AttachOptions
from qprof.endpoints import free_udp_port
from qprof.errors import QprofError
from qprof.ready import Ready, parse_ready

PLAN = "study.json"
PARTIAL = ".partial"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_VARIATION_KEYS = {"env", "server_args", "client_args"}
_RECORD_KEYS = {"ready", "ready_timeout", "duration", "frequency", "unwind", "scope", "probes"}
_PLACEHOLDERS = {"port", "server_args", "client_args"}


@dataclass(frozen=True)
class Variation:
    """What a setting changes: environment variables and words for {server_args} / {client_args}."""

    env: dict[str, str] = field(default_factory=dict)
    server_args: str = ""
    client_args: str = ""


@dataclass(frozen=True)
class StackSpec:
    name: str
    server: str
    client: str
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Setting:
    name: str
    common: Variation = Variation()
    per_stack: dict[str, Variation] = field(default_factory=dict)

    def of(self, stack: str) -> Variation:
        """The variation for one stack: the common one, with the stack's own on top."""
        own = self.per_stack.get(stack, Variation())
        return Variation({**self.common.env, **own.env}, " ".join(filter(None, (self.common.server_args,
                                                                                own.server_args))),
                         " ".join(filter(None, (self.common.client_args, own.client_args))))


@dataclass(frozen=True)
class Study:
    path: Path
    seed: int
    repetitions: int
    stacks: dict[str, StackSpec]
    settings: dict[str, Setting]
    record: dict[str, Any] = field(default_factory=dict)
    vars: dict[str, str] = field(default_factory=dict)
    digest: str = ""  # of the file's contents: a resumed study must be this one


@dataclass(frozen=True)
class PlannedRun:
    order: int  # its place in the interleaved order, from 1
    stack: str
    setting: str
    rep: int

    def directory(self, root: Path, repetitions: int) -> Path:
        return root / self.stack / self.setting / repetition_name(self.rep, repetitions)


def _fail(path: Path, where: str, what: str) -> QprofError:
    return QprofError(f"{path}: {where}: {what}")


def _table(doc: dict[str, Any], key: str, path: Path, where: str) -> dict[str, Any]:
    value = doc.get(key, {})
    if not isinstance(value, dict):
        raise _fail(path, where, f"`{key}` must be a table ([{key}])")
    return value


def _strings(value: Any, path: Path, where: str) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, (str, int, float))
                                              and not isinstance(v, bool) for k, v in value.items()):
        raise _fail(path, where, "must be a table of names to strings, e.g. { QUIC_GO_DISABLE_GSO = \"true\" }")
    return {k: str(v) for k, v in value.items()}


def _variation(d: dict[str, Any], path: Path, where: str) -> Variation:
    unknown = set(d) - _VARIATION_KEYS
    if unknown:
        raise _fail(path, where, f"unknown key {sorted(unknown)[0]!r}; a setting has env, server_args, client_args "
                                 "(or a table per stack with those)")
    for k in ("server_args", "client_args"):
        if k in d and not isinstance(d[k], str):
            raise _fail(path, f"{where}.{k}", "must be a string of words")
    return Variation(_strings(d.get("env", {}), path, f"{where}.env"), d.get("server_args", ""),
                     d.get("client_args", ""))


def _check_command(text: str, path: Path, where: str, names: set[str]) -> None:
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(text) if f is not None]
    except ValueError as e:
        raise _fail(path, where, f"{e}; write a literal brace as {{{{ or }}}}") from None
    for f in fields:
        if f not in names:
            raise _fail(path, where, f"unknown placeholder {{{f}}}; known: "
                                     f"{', '.join('{' + n + '}' for n in sorted(names))} (add others under [vars])")


def load(path: Path) -> Study:
    """The study file, checked whole: each problem is one line naming the file, the key and the fix."""
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise QprofError(f"cannot read study file {path}: {e.strerror or e}") from None
    try:
        doc = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise QprofError(f"{path}: not a TOML file ({e})") from None
    unknown = set(doc) - {"seed", "repetitions", "vars", "record", "stacks", "settings"}
    if unknown:
        raise _fail(path, sorted(unknown)[0], "unknown key; a study has seed, repetitions, [vars], [record], "
                                              "[stacks.NAME], [settings.NAME]")
    seed, reps = doc.get("seed", 1), doc.get("repetitions", 1)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise _fail(path, "seed", "must be an integer")
    if not isinstance(reps, int) or isinstance(reps, bool) or not 1 <= reps <= 1000:
        raise _fail(path, "repetitions", "must be an integer from 1 to 1000")
    variables = _strings(_table(doc, "vars", path, "vars"), path, "vars")
    clash = _PLACEHOLDERS & set(variables)
    if clash:
        raise _fail(path, f"vars.{sorted(clash)[0]}", "is set by qprof for each run; choose another name")
    record = _table(doc, "record", path, "record")
    bad = set(record) - _RECORD_KEYS
    if bad:
        raise _fail(path, f"record.{sorted(bad)[0]}", f"unknown option; known: {', '.join(sorted(_RECORD_KEYS))}")
    names = _PLACEHOLDERS | set(variables)
    stacks: dict[str, StackSpec] = {}
    for name, s in _table(doc, "stacks", path, "stacks").items():
        where = f"stacks.{name}"
        if not _NAME.fullmatch(name):
            raise _fail(path, where, "a stack's name becomes a directory: letters, digits, . _ -")
        if not isinstance(s, dict) or set(s) - {"server", "client", "env"}:
            raise _fail(path, where, "must be a table with server, client and optionally env")
        for role in ("server", "client"):
            if not isinstance(s.get(role), str) or not s[role].strip():
                raise _fail(path, f"{where}.{role}", "missing: give the command line as one string")
            _check_command(s[role], path, f"{where}.{role}", names)
        stacks[name] = StackSpec(name, s["server"], s["client"], _strings(s.get("env", {}), path, f"{where}.env"))
    if not stacks:
        raise _fail(path, "stacks", "no stack: add a [stacks.NAME] table with server and client")
    settings: dict[str, Setting] = {}
    for name, s in (_table(doc, "settings", path, "settings") or {"default": {}}).items():
        where = f"settings.{name}"
        if not _NAME.fullmatch(name):
            raise _fail(path, where, "a setting's name becomes a directory: letters, digits, . _ -")
        if not isinstance(s, dict):
            raise _fail(path, where, "must be a table")
        own = {k: v for k, v in s.items() if k in stacks}
        for k, v in own.items():
            if not isinstance(v, dict):
                raise _fail(path, f"{where}.{k}", "must be a table of env, server_args, client_args")
        settings[name] = Setting(name, _variation({k: v for k, v in s.items() if k not in stacks}, path, where),
                                 {k: _variation(v, path, f"{where}.{k}") for k, v in own.items()})
    if "ready" in record:
        _check_command(str(record["ready"]), path, "record.ready", names)
    return Study(path, seed, reps, stacks, settings, record, variables, hashlib.sha256(raw).hexdigest())


def plan(study: Study) -> list[PlannedRun]:
    """Every stack x setting x repetition, in the order the seed shuffles them into."""
    runs = [(st, se, r) for st in study.stacks for se in study.settings for r in range(1, study.repetitions + 1)]
    random.Random(study.seed).shuffle(runs)
    return [PlannedRun(i, st, se, r) for i, (st, se, r) in enumerate(runs, 1)]


def _expand(study: Study, run: PlannedRun, port: str) -> tuple[list[Command], dict[str, str]]:
    """The run's two commands with their environment, and the placeholders' values."""
    stack, var = study.stacks[run.stack], study.settings[run.setting].of(run.stack)
    values = {**study.vars, "port": port, "server_args": var.server_args, "client_args": var.client_args}
    env = tuple(sorted({**stack.env, **var.env}.items()))
    return [Command(role, parse_command(role, text.format(**values)).argv, env=env)
            for role, text in (("server", stack.server), ("client", stack.client))], values


def _commands(study: Study, run: PlannedRun, port: int) -> tuple[list[Command], Ready]:
    cmds, values = _expand(study, run, str(port))
    ready = str(study.record.get("ready", "auto")).format(**values)
    return cmds, parse_ready(ready, float(study.record.get("ready_timeout", 30.0)))


def configuration(study: Study, run: PlannedRun) -> Configuration:
    """What the run measures, recorded in its meta.json: its stack's and setting's names, the commands
    with `{port}` left a placeholder (every run has a port of its own) and their environment."""
    cmds, _ = _expand(study, run, "{port}")
    return Configuration(run.setting, run.stack, {c.label: list(c.argv) for c in cmds}, dict(cmds[0].env))


def _attach_template(study: Study) -> AttachOptions:
    r = study.record
    opts = AttachOptions(pids=[], out=Path(), probes=parse_groups(str(r.get("probes", "default"))))
    for key in ("frequency", "unwind", "scope", "duration"):
        if key in r:
            setattr(opts, key, r[key])
    return opts


def finished(run_dir: Path) -> bool:
    """A run is finished when its archive is complete, its client succeeded and nothing interrupted it."""
    try:
        run = archive.Run.open(run_dir)
    except QprofError:
        return False
    entry, stop = run.meta.record, run.meta.stop_reason or ""
    return (run.status[0] == "complete" and entry is not None and not entry.failures
            and entry.exit.get("client") == 0 and not stop.startswith("interrupted"))


@dataclass
class Progress:
    planned: list[PlannedRun]
    done: list[Path] = field(default_factory=list)  # finished runs, in the plan's order
    skipped: int = 0  # finished before this invocation
    moved_aside: list[Path] = field(default_factory=list)
    stopped: str | None = None  # why the study stopped before its end (one line)


def _plan_file(study: Study, runs: list[PlannedRun], out: Path) -> dict[str, Any]:
    return {"format": "qprof-study", "version": 1, "study": str(study.path.resolve()), "sha256": study.digest,
            "seed": study.seed, "repetitions": study.repetitions,
            "order": [{"order": r.order, "stack": r.stack, "setting": r.setting, "rep": r.rep,
                       "dir": str(r.directory(out, study.repetitions).relative_to(out))} for r in runs]}


def _start_or_resume(study: Study, out: Path, runs: list[PlannedRun]) -> None:
    plan_path = out / PLAN
    if plan_path.exists():
        try:
            old = json.loads(plan_path.read_text())
        except (OSError, ValueError) as e:
            raise QprofError(f"{plan_path} is unreadable ({e}); give another -o") from None
        if old.get("sha256") != study.digest:
            raise QprofError(f"{out} holds a study planned from another version of {old.get('study')}: the study "
                             "file changed since; restore it to resume, or give another -o for the new study")
        return
    archive.create_run_dir(out)
    shutil.copyfile(study.path, out / "study.toml")
    archive.write_json_atomic(plan_path, _plan_file(study, runs, out))


def run(study: Study, out: Path, status: Callable[[str], None],
        on_tick: Callable[[LiveData], None] | None = None) -> Progress:
    """Run the study's runs in its order, skipping finished ones; stops at the first failure or Ctrl-C."""
    runs = plan(study)
    _start_or_resume(study, out, runs)
    template = _attach_template(study)
    progress = Progress(runs)
    for r in runs:
        d = r.directory(out, study.repetitions)
        if finished(d):
            progress.done.append(d)
            progress.skipped += 1
            continue
        if d.exists():  # an earlier invocation stopped in this run: keep what it left, aside
            aside = out / PARTIAL / f"{r.stack}-{r.setting}-rep{r.rep}-{time.strftime('%Y%m%d-%H%M%S')}"
            aside.parent.mkdir(mode=0o700, exist_ok=True)
            os.replace(d, aside)
            progress.moved_aside.append(aside)
        d.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        status(f"run {r.order} of {len(runs)}: {r.stack} {r.setting} rep {r.rep}")
        commands, ready = _commands(study, r, free_udp_port())
        opts = RecordOptions(commands, d, 1, ready, template, configuration=configuration(study, r),
                             series=(r.rep, study.repetitions))
        try:
            rep = run_repetition(opts, 1, status, on_tick)
        except KeyboardInterrupt:
            rep = None
        if rep is None or rep.interrupted:
            progress.stopped = f"interrupted in run {r.order} of {len(runs)}"
            break
        if not rep.ok:
            progress.stopped = (f"run {r.order} of {len(runs)} ({r.stack} {r.setting} rep {r.rep}) failed: "
                                + "; ".join(rep.failures))
            break
        progress.done.append(d)
    return progress
