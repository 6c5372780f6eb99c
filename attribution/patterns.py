"""Regular expressions from mapping files, matched at a bounded cost.

Mapping files are data anyone may write; a pattern such as `(a+)+$` takes
exponential time on a symbol like "aaaa...b" in a backtracking engine, and
Python's `re` has no timeout. Two bounds, both real:

1. At load time, the classic catastrophic shapes are refused with a file:line
   error: backreferences, an unbounded repeat whose body is itself only an
   unbounded repeat plus optional parts (`(a+)+`, `(\\w+\\s?)*`, `(a*)*`). Nested
   repeats separated by a required literal (`(\\.\\w+\\.\\d+)*`, used by shipped
   files) are linear and allowed. Other exponential shapes, such as repeated
   overlapping alternatives (`(a|aa)+`), are not recognised reliably from the
   parse tree (the parser refactors them), so:
2. At match time every search runs with the `regex` engine's timeout
   (MATCH_TIMEOUT_S); a pattern that exceeds it on some symbol stops the report
   with one line naming the rule, the pattern and the symbol. Rules are matched
   once per distinct frame (attribution.engine caches), so a report makes at
   most one search per rule and distinct symbol; a symbol without the pattern's
   required literal (required_literal) is not searched at all (two thirds of a
   report's searches: a rule's symbol tested against frames it does not name).
The `regex` module's default (VERSION0) syntax is Python's `re` syntax.
"""

from __future__ import annotations

import hashlib
import re._constants as C  # noqa: N812  (sre opcodes: what a pattern parses into)
import re._parser as sre
import sys
from pathlib import Path
from typing import Any

import regex

from qprof.cachefiles import CACHE_HOME, read_json, write_json
from qprof.errors import QprofError

MATCH_TIMEOUT_S = 0.25
_REPEATS = (C.MAX_REPEAT, C.MIN_REPEAT)


class PatternError(ValueError):
    """A pattern refused at load time; the message says why and how to fix it."""


class PatternTimeout(QprofError):
    """A search exceeded MATCH_TIMEOUT_S: the report stops with the rule, pattern and symbol."""


def _min_width(items: list[tuple[Any, Any]]) -> int:
    """Fewest characters the sequence matches."""
    total = 0
    for op, av in items:
        if op in (C.LITERAL, C.NOT_LITERAL, C.IN, C.ANY):
            total += 1
        elif op == C.SUBPATTERN:
            total += _min_width(list(av[3]))
        elif op in _REPEATS or op == C.POSSESSIVE_REPEAT:
            total += av[0] * _min_width(list(av[2]))
        elif op == C.BRANCH:
            total += min(_min_width(list(b)) for b in av[1])
        elif op == C.ATOMIC_GROUP:
            total += _min_width(list(av))
    return total


def _unwrap(items: list[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
    """A body that is a single (capturing or not) group stands for its content."""
    while len(items) == 1 and items[0][0] == C.SUBPATTERN:
        items = list(items[0][1][3])
    return items


def _check(items: Any, pattern: str) -> None:
    for op, av in items:
        if op in (C.GROUPREF, C.GROUPREF_EXISTS):
            raise PatternError("backreferences are not allowed (their matching cost is unbounded)")
        if op in _REPEATS:
            _lo, hi, body = av
            if hi == C.MAXREPEAT:
                _check_repeat_body(list(body), pattern)
            _check(body, pattern)
        elif op == C.SUBPATTERN:
            _check(av[3], pattern)
        elif op == C.BRANCH:
            for b in av[1]:
                _check(b, pattern)
        elif op in (C.ASSERT, C.ASSERT_NOT):
            _check(av[1], pattern)
        elif op == C.ATOMIC_GROUP:
            _check(av, pattern)
        elif op == C.POSSESSIVE_REPEAT:
            _check(av[2], pattern)


def _check_repeat_body(body: list[tuple[Any, Any]], pattern: str) -> None:
    items = _unwrap(body)
    inner = [(op, av) for op, av in items if op in _REPEATS and av[1] > 1]
    required = [(op, av) for op, av in items if not (op in _REPEATS and av[1] > 1) and _min_width([(op, av)]) > 0]
    if inner and not required:
        raise PatternError("nested repeats such as (a+)+ or (\\w+\\s?)* backtrack exponentially: "
                           "drop the outer repeat or put a required literal between the repeats")


def check_pattern(pattern: str) -> str | None:
    """Refuse pattern shapes with catastrophic backtracking (raises PatternError); the pattern's
    required_literal."""
    parsed = sre.parse(pattern)
    _check(parsed, pattern)
    return required_literal(parsed)


def required_literal(parsed: Any) -> str | None:
    """The longest run of plain characters (two or more) that every match of the parsed pattern
    contains: consecutive literals of its top-level sequence, outside any group, class, repeat or
    alternative. None when it has none, or matches ignoring case. A subject without it cannot match:
    a search is skipped for the cost of `in` (most of a report's searches are rules' symbols tested
    against frames they do not name)."""
    if parsed.state.flags & C.SRE_FLAG_IGNORECASE:
        return None
    best, run = "", []
    for op, av in list(parsed) + [(None, None)]:
        if op == C.LITERAL:
            run.append(chr(av))
            continue
        if len(run) > len(best):
            best = "".join(run)
        run = []
    return best if len(best) >= 2 else None


def _held_part(literal: str | None, text: str) -> str | None:
    """The longest part of `literal` (two or more characters) that `text` holds: every part of a
    required run is required too."""
    if literal is None:
        return None
    best, start = "", 0
    for end in range(1, len(literal) + 1):
        while literal[start:end] not in text:
            start += 1
        if end - start > len(best):
            best = literal[start:end]
    return best if len(best) >= 2 else None


class _Passed:
    """Patterns that passed check_pattern before, with their required literals, kept in qprof's cache
    for this check and this Python's parser: the shipped mappings' ~450 patterns took ~70 ms to parse at
    every report, for the same answer. A pattern not in it (a user's new one) is checked, and remembered
    once it passes."""

    PATH = CACHE_HOME / "patterns.json"

    def __init__(self) -> None:
        self.key = hashlib.sha256(Path(__file__).read_bytes() + sys.version.encode()).hexdigest()[:16]
        doc = read_json(self.PATH)
        known = doc.get("passed") if doc.get("key") == self.key else None
        self.known: dict[str, str | None] = {p: lit for p, lit in known.items() if isinstance(p, str) and (
            lit is None or isinstance(lit, str) and lit in p)} if isinstance(known, dict) else {}
        self.new = False

    def check(self, pattern: str) -> str | None:
        """check_pattern's answer, remembered."""
        if pattern not in self.known:
            # the literal's longest part the pattern's own text holds (an escaped character is not
            # there as itself): what the file gives back is checked against the pattern the same way
            self.known[pattern] = _held_part(check_pattern(pattern), pattern)
            self.new = True
        return self.known[pattern]

    def save(self) -> None:
        if self.new:
            write_json(self.PATH, {"key": self.key, "passed": dict(sorted(self.known.items()))})
            self.new = False


_passed: _Passed | None = None


def passed() -> _Passed:
    global _passed
    if _passed is None:
        _passed = _Passed()
    return _passed


class BoundedPattern:
    """A compiled mapping pattern whose every search is bounded in time."""

    __slots__ = ("pattern", "where", "_rx", "_literal")

    def __init__(self, pattern: str, where: str = "") -> None:
        """`where` (file:line: `key`) names the pattern in a timeout error."""
        # the stdlib parser gives the usual syntax errors, and its tree the shape check (once per pattern)
        self._literal = passed().check(pattern)  # every match holds it (required_literal)
        self.pattern, self.where = pattern, where
        # compiled at its first search: the shipped mappings hold ~450 patterns and a run meets the few
        # of the stacks it has (compiling them all was half of loading the mappings, ~0.15 s a report)
        self._rx: Any = None

    def search(self, subject: str) -> Any:
        """The first match in `subject` or None; PatternTimeout past MATCH_TIMEOUT_S."""
        if self._literal is not None and self._literal not in subject:
            return None
        if self._rx is None:
            try:
                self._rx = regex.compile(self.pattern)
            except regex.error as e:  # what the stdlib's parser accepted at load and `regex` does not
                raise QprofError(f"{self.where or 'pattern'} {self.pattern!r}: {e}: rewrite the pattern") from None
        try:
            return self._rx.search(subject, timeout=MATCH_TIMEOUT_S)
        except TimeoutError:
            shown = subject if len(subject) <= 60 else subject[:57] + "..."
            raise PatternTimeout(f"{self.where or 'pattern'} {self.pattern!r} took more than "
                                 f"{MATCH_TIMEOUT_S:g} s on {shown!r} (catastrophic backtracking): "
                                 "simplify the pattern") from None

    def __repr__(self) -> str:
        return f"BoundedPattern({self.pattern!r})"
