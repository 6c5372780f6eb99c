"""Mapping files: TOML data that sends stack frames to categories.

A file is a `[mapping]` header and an ordered list of `[[rule]]` tables:

    [mapping]
    name = "ngtcp2"            # unique; user files of the same name replace shipped ones
    version = "1"
    kind = "stack"             # common | library | stack | user
    description = "..."
    verified = true            # backed by a real run
    [mapping.detect]           # library/stack files load only for processes that match
    dso = ['libngtcp2\\.so']
    symbol = []
    go = false                 # true: every process that runs a Go binary (whatever its stacks show)

    [[rule]]
    symbol = '^ngtcp2_conn_'   # regex, searched in the frame's symbol
    dso = 'libngtcp2\\.so'     # regex, searched in the frame's object path
    kernel = true              # frame is in the kernel (or, false, in user space)
    within = '^udp_sendmsg$'   # this frame or one of its callers has a matching symbol
    leaf = true                # only as the sample's leaf (where it was taken), never as a caller
    category = "Connection Mgmt"
    subcategory = "ack processing"

    [[pool]]                   # threads a runtime runs its work on, grouped in the thread view
    name = "tokio workers"
    symbol = '^<?tokio::runtime::scheduler::multi_thread::worker::run'

A thread belongs to the pool whose `symbol` the frames of most of its CPU time match
(in each sample, the first pool in precedence order that one of its frames matches);
threads no pool matches are grouped by name.

A rule needs at least one of symbol/dso/kernel/within, and exactly one outcome:
a `category` (with an optional `subcategory`); `transparent = true` (the frame
is generic, like memcpy or a lock, and its caller decides); or a `subcategory`
alone (a tag: the frame keeps this subcategory, its caller decides the category;
used for scheduler code so that it stays visible in whatever category it runs).

Files are data: they are parsed with tomllib and regexes compiled, never run.
Regexes are matched at a bounded cost (attribution.patterns): catastrophic
shapes are refused at load time, and every search has a timeout.
"""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Iterable, TypeVar

from qprof.attribution.categories import CATEGORIES
from qprof.attribution import patterns
from qprof.attribution.patterns import BoundedPattern, PatternError
from qprof.errors import QprofError
from qprof.jsonvalue import JsonObject
from qprof.readlimits import read_text

KINDS = ("common", "library", "stack", "user")
# Precedence when rules of several files could match a frame: first wins.
_KIND_ORDER = {"user": 0, "stack": 1, "library": 2, "common": 3}
_RULE_KEYS = {"symbol", "dso", "kernel", "within", "leaf", "category", "subcategory", "transparent", "note"}
_HEADER_KEYS = {"name", "version", "kind", "description", "verified", "detect", "uses"}
_DETECT_KEYS = {"dso", "symbol", "go"}
_POOL_KEYS = {"name", "symbol", "note", "works"}
MAX_PATTERN = 2000
MAX_FILE_BYTES = 4 << 20  # the shipped files are tens of KiB


class MappingError(QprofError):
    """An invalid mapping file; the message starts with file:line."""


@dataclass(frozen=True)
class Rule:
    source: str  # "file:line" for reports and errors
    mapping: str
    symbol: BoundedPattern | None
    dso: BoundedPattern | None
    kernel: bool | None
    within: BoundedPattern | None
    category: str | None
    subcategory: str | None
    transparent: bool
    leaf: bool = False  # matches only the sample's leaf frame (where the sample was taken)


@dataclass(frozen=True)
class Pool:
    """Threads that run a runtime's work interchangeably (Go's Ms, tokio's workers), named by a frame
    their stacks run through."""

    source: str  # "file:line"
    name: str
    symbol: BoundedPattern
    note: str = ""  # what the pool's threads do, shown with it
    # false: a runtime's monitor (Go's sysmon), whose threads run none of the program's work: the verdict
    # never counts them among a side's working threads, whose waits for CPUs and one another may bind it
    works: bool = True


@dataclass
class MappingFile:
    path: str
    name: str
    version: str
    kind: str
    description: str
    verified: bool
    detect_dso: list[BoundedPattern] = field(default_factory=list)
    detect_symbol: list[BoundedPattern] = field(default_factory=list)
    detect_go: bool = False  # loads for any process running a Go binary: its frames may not show it
    rules: list[Rule] = field(default_factory=list)
    pools: list["Pool"] = field(default_factory=list)

    def evidence(self, dsos: Iterable[str], symbols: Iterable[str], go_binary: str | None = None) -> str | None:
        """Why this file applies to a process: the Go binary it runs (`go = true`: the runtime's root
        frames, which its symbols would show, are lost wherever unwinding stops early), or the first
        object or symbol its detect patterns match."""
        if self.kind in ("common", "user"):
            return self.kind
        if self.detect_go and go_binary is not None:
            return f"Go binary {go_binary}"
        for d in dsos:
            if any(p.search(d) for p in self.detect_dso):
                return f"object {d}"
        for sym in symbols:
            if any(p.search(sym) for p in self.detect_symbol):
                return f"symbol {sym}"
        return None

    def use(self, evidence: str | None = None) -> "MappingUse":
        """This file as a process was read with it (`evidence`: what chose it)."""
        return MappingUse(self.name, self.version, self.kind, self.path, self.verified, evidence)


@dataclass(frozen=True)
class MappingUse:
    """A mapping file a process was read with, and what chose it: the report's `mappings` entries."""

    name: str
    version: str
    kind: str
    path: str
    verified: bool
    detected_by: str | None = None

    def to_json(self) -> JsonObject:
        d: JsonObject = {"name": self.name, "version": self.version, "kind": self.kind, "path": self.path,
                         "verified": self.verified}
        if self.detected_by is not None:
            d["detected_by"] = self.detected_by
        return d


def stack_name(uses: Iterable[MappingUse]) -> str | None:
    """The QUIC stack(s) whose mapping files these are (auto-detected or --stack), joined by "+"."""
    return "+".join(m.name for m in uses if m.kind == "stack") or None


def _rule_lines(text: str, table: str = "rule") -> list[int]:
    """Line number of each `[[rule]]` (or `[[table]]`) header, so errors can point at it."""
    return [i for i, ln in enumerate(text.splitlines(), 1) if re.match(rf"^\s*\[\[\s*{table}\s*\]\]", ln)]


def _key_line(text: str, header: int, key: str) -> int:
    """1-based line of `key` inside the table whose header is at 0-based index `header`."""
    lines = text.splitlines()
    pat = re.compile(rf"""^\s*(?:{re.escape(key)}|"{re.escape(key)}"|'{re.escape(key)}')\s*[=.]""")
    for i in range(header, len(lines)):
        if i > header and re.match(r"^\s*\[", lines[i]):
            break
        if pat.match(lines[i]):
            return i + 1
    return header + 1


def _regex(value: object, where: str, key: str) -> BoundedPattern:
    if not isinstance(value, str):
        raise MappingError(f"{where}: `{key}` must be a string (a regular expression)")
    if len(value) > MAX_PATTERN:
        raise MappingError(f"{where}: `{key}` is longer than {MAX_PATTERN} characters")
    try:
        return BoundedPattern(value, f"{where}: `{key}`")
    except PatternError as e:
        raise MappingError(f"{where}: `{key}` is refused: {e}") from None
    except (re.error, OverflowError, RecursionError, ValueError) as e:
        raise MappingError(f"{where}: `{key}` is not a valid regular expression ({e})") from None


def _header_line(text: str) -> int:
    for i, ln in enumerate(text.splitlines(), 1):
        if re.match(r"^\s*\[\s*mapping\s*\]", ln):
            return i
    return 1


T = TypeVar("T")


class _Table:
    """One table of a mapping file as tomllib gives it, each key read as the type it must have: a key
    of another type is an error naming the file and line (the key's own, or the table's where
    `locate` is off) and the fix."""

    def __init__(self, fields: dict[str, object], text: str, path: str, line: int, locate: bool = True) -> None:
        self.fields, self.text, self.path, self.line, self.locate = fields, text, path, line, locate

    def at(self, key: str | None = None) -> str:
        """path:line of `key` (None: of the table's header)."""
        line = _key_line(self.text, self.line - 1, key) if key is not None and self.locate else self.line
        return f"{self.path}:{line}"

    def has(self, key: str) -> bool:
        return key in self.fields

    def value(self, key: str, typ: type[T], default: T, error: str) -> T:
        """`key`'s value, `default` when absent; `error` when it is not a `typ`."""
        if key not in self.fields:
            return default
        return self.required(key, typ, error)

    def required(self, key: str, typ: type[T], error: str) -> T:
        """`key`'s value; `error` when it is absent or not a `typ`."""
        v = self.fields.get(key)
        if not isinstance(v, typ):
            raise MappingError(f"{self.at(key)}: {error}")
        return v

    def optional(self, key: str, typ: type[T], error: str) -> T | None:
        """`key`'s value; None when absent."""
        return self.required(key, typ, error) if key in self.fields else None

    def regex(self, key: str) -> BoundedPattern | None:
        """`key`'s regular expression, compiled; None when absent."""
        return _regex(self.fields[key], self.at(key), key) if key in self.fields else None

    def keys(self, what: str, allowed: set[str]) -> "_Table":
        """This table, checked for keys it may not have."""
        bad = set(self.fields) - allowed
        if bad:
            k = sorted(bad)[0]
            raise MappingError(f"{self.at(k)}: unknown {what} key `{k}`; allowed: {', '.join(sorted(allowed))}")
        return self


def parse_mapping(text: str, path: str, default_kind: str = "user") -> MappingFile:
    """Validate and compile one mapping file's text; errors name path:line and the fix."""
    try:
        parsed = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        m = re.search(r"line (\d+)", str(e))
        # "at end of document" (e.g. an unclosed quote): point at the last line
        line = m.group(1) if m else max(1, len(text.splitlines()))
        raise MappingError(f"{path}:{line}: not valid TOML ({e})") from None
    except RecursionError:
        raise MappingError(f"{path}:1: not valid TOML (nested too deeply)") from None
    hl = _header_line(text)
    doc = _Table(parsed, text, path, 1, locate=False)  # its errors point at line 1
    unknown_top = set(parsed) - {"mapping", "rule", "pool"}
    if unknown_top:
        raise MappingError(f"{path}:1: unknown table(s) {sorted(unknown_top)}: only [mapping], [[rule]] and "
                           "[[pool]] are allowed")
    head = _Table(doc.required("mapping", dict, "missing [mapping] header with at least `name`"), text, path, hl)
    bad = set(head.fields) - _HEADER_KEYS
    if bad:
        raise MappingError(f"{path}:{hl}: unknown [mapping] key(s) {sorted(bad)}; allowed: {sorted(_HEADER_KEYS)}")
    name_error = "`name` must be a short identifier (letters, digits, _.+-)"
    name = head.value("name", str, "", name_error)
    if not re.fullmatch(r"[A-Za-z0-9_.+-]{1,64}", name):
        raise MappingError(f"{head.at('name')}: {name_error}")
    kind_error = f"`kind` must be one of {', '.join(KINDS)}"
    kind = head.value("kind", str, default_kind, kind_error)
    if kind not in KINDS:
        raise MappingError(f"{head.at('kind')}: {kind_error}")
    mf = MappingFile(path, name, head.value("version", str, "0", "`version` must be a str"), kind,
                     head.value("description", str, "", "`description` must be a str"),
                     head.value("verified", bool, False, "`verified` must be a bool"))
    header = _Table(head.fields, text, path, hl, locate=False)  # [mapping.detect]'s errors point at [mapping]
    detect = _Table(header.value("detect", dict, {}, _DETECT_ERROR), text, path, hl, locate=False)
    if set(detect.fields) - _DETECT_KEYS:
        raise MappingError(f"{path}:{hl}: {_DETECT_ERROR}")
    mf.detect_go = detect.value("go", bool, False, "[mapping.detect] `go` must be true or false")
    for key, dest in (("dso", mf.detect_dso), ("symbol", mf.detect_symbol)):
        vals = detect.value(key, list, [], f"[mapping.detect] `{key}` must be a list of regexes")
        dest.extend(_regex(v, f"{path}:{hl}", f"detect.{key}") for v in vals)
    if kind in ("library", "stack") and not (mf.detect_dso or mf.detect_symbol or mf.detect_go):
        raise MappingError(f"{path}:{hl}: a {kind} mapping needs [mapping.detect] patterns so it loads "
                           "only for matching processes")
    rules = doc.value("rule", list, [], "`rule` must be an array of tables: write [[rule]]")
    lines = _rule_lines(text)
    for i, r in enumerate(rules):
        line = lines[i] if i < len(lines) else 1
        mf.rules.append(_parse_rule(_table(r, "rule", _RULE_KEYS, text, path, line), name))
    pools = doc.value("pool", list, [], "`pool` must be an array of tables: write [[pool]]")
    lines = _rule_lines(text, "pool")
    for i, pool in enumerate(pools):
        mf.pools.append(_parse_pool(_table(pool, "pool", _POOL_KEYS, text, path, lines[i] if i < len(lines) else 1)))
    return mf


_DETECT_ERROR = "[mapping.detect] takes lists `dso` and `symbol` of regexes and `go` (true or false)"


def _table(t: object, what: str, allowed: set[str], text: str, path: str, line: int) -> _Table:
    """A [[rule]] or [[pool]] table, checked for being one and for keys it may have."""
    if not isinstance(t, dict):
        raise MappingError(f"{path}:{line}: a {what} must be a table")
    return _Table(t, text, path, line).keys(what, allowed)


def _parse_pool(p: _Table) -> Pool:
    where = p.at()
    name_error = "a pool needs a `name` (a short label, at most 64 characters)"
    name = p.value("name", str, "", name_error)
    if not name.strip() or len(name) > 64:
        raise MappingError(f"{p.at('name')}: {name_error}")
    if not p.has("symbol"):
        raise MappingError(f"{where}: pool {name!r} needs `symbol`, a frame its threads' stacks run through")
    note = p.value("note", str, "", "`note` must be a string")
    works = p.value("works", bool, True, "`works` must be true or false")
    return Pool(where, name, _regex(p.fields["symbol"], p.at("symbol"), "symbol"), note, works)


def _parse_rule(r: _Table, mapping: str) -> Rule:
    where = r.at()
    symbol, dso, within = r.regex("symbol"), r.regex("dso"), r.regex("within")
    kernel = r.optional("kernel", bool, "`kernel` must be true or false")
    leaf = r.value("leaf", bool, False, "`leaf` must be true or false")
    if symbol is None and dso is None and within is None and kernel is None:
        raise MappingError(f"{where}: rule matches everything: give `symbol`, `dso`, `kernel` or `within`")
    transparent = r.value("transparent", bool, False, "`transparent` must be true or false")
    category = r.optional("category", str, f"`category` must be a string; {_CATEGORIES}")
    if category is not None and category not in CATEGORIES:
        raise MappingError(f"{r.at('category')}: unknown category {category!r}; {_CATEGORIES}")
    sub = r.optional("subcategory", str, "`subcategory` must be a non-empty string")
    if sub is not None and not sub.strip():
        raise MappingError(f"{r.at('subcategory')}: `subcategory` must be a non-empty string")
    if transparent and (category is not None or sub is not None):
        raise MappingError(f"{where}: a transparent rule cannot also set a category or subcategory")
    if not transparent and category is None and sub is None:
        raise MappingError(f"{where}: rule has no outcome: set `category`, `subcategory` or `transparent = true`")
    return Rule(where, mapping, symbol, dso, kernel, within, category, sub, transparent, leaf)


_CATEGORIES = "use one of: " + ", ".join(CATEGORIES)


def load_file(path: str | os.PathLike[str], default_kind: str = "user") -> MappingFile:
    p = Path(path)
    try:
        text = read_text(p, MAX_FILE_BYTES)
    except FileNotFoundError:
        raise MappingError(f"{p}: mapping file not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise MappingError(f"{p}: cannot read mapping file ({e})") from None
    return parse_mapping(text, str(p), default_kind)


def shipped() -> list[MappingFile]:
    """The mapping files installed with qprof."""
    out = []
    for entry in sorted(resources.files("qprof.mappings").iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".toml"):
            out.append(parse_mapping(entry.read_text(encoding="utf-8"), f"mappings/{entry.name}", "common"))
    return out


def user_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "qprof" / "mappings"


def user_files(extra: Iterable[str] = ()) -> list[MappingFile]:
    """`--mapping` files (first = highest precedence), then the per-user folder."""
    files = [load_file(p, "user") for p in extra]
    d = user_dir()
    if d.is_dir():
        files += [load_file(p, "user") for p in sorted(d.glob("*.toml"))]
    return files


@dataclass
class MappingSet:
    """All candidate files; `for_process` picks and orders those that apply."""

    files: list[MappingFile]

    @classmethod
    def load(cls, extra: Iterable[str] = ()) -> "MappingSet":
        users = user_files(extra)
        replaced = {f.name for f in users}
        files = cls(users + [f for f in shipped() if f.name not in replaced])
        patterns.passed().save()  # the patterns that passed their check, for the next load
        return files

    def names(self, kind: str) -> list[str]:
        return sorted(f.name for f in self.files if f.kind == kind)

    def for_process(self, dsos: Iterable[str], symbols: Iterable[str],
                    stack: str | None = None, go_binary: str | None = None) -> list[tuple[MappingFile, str]]:
        """The files that apply, highest precedence first, each with the evidence that chose it.

        `stack` forces one stack file (and no other) whatever the detection says. `go_binary`: the
        Go binary the process runs, if any.
        """
        if stack is not None and stack not in self.names("stack"):
            raise QprofError(f"unknown stack {stack!r} for --stack: choose one of {', '.join(self.names('stack'))}")
        dsos, symbols = sorted(dsos), sorted(symbols)  # the same evidence named every time (sets come unordered)
        chosen = []
        for f in self.files:
            if f.kind == "stack" and stack is not None:
                why = "--stack" if f.name == stack else None
            else:
                why = f.evidence(dsos, symbols, go_binary)
            if why is not None:
                chosen.append((f, why))
        # stable: user files keep their command-line order
        return sorted(chosen, key=lambda fw: _KIND_ORDER[fw[0].kind])
