"""What the mappings miss: the hottest unplaced Uncategorized symbols, each with a rule to start from.

The founding study shared its mappings "so that they can be refined"; this
is the loop that refines them: run, see what fell through, add a rule.

A suggestion never names a category qprof does not know. It comes from the
stack: what the frames above the symbol decide in its samples (its callers,
as the engine reads them: a symbol whose callers agree is a generic helper,
and `transparent = true` lets them decide); where they do not agree, or no
caller is known, the rule is written commented out with the candidates (a
name that looks like one, the callers' mix) for a person to choose. Time the
report already names as overhead (a runtime's work, thread handoffs, eBPF
programs) and interrupt skid (a sampling artefact no rule places:
attribution.skid) are not gaps; the application's own code is.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from qprof.attribution.categories import (CONNECTION, CRYPTO, HANDOFF, IO, OTHER_BPF, PACKET_IO, PROBE_COST,
                                          RUNTIME, SKID, UNCATEGORIZED, is_named_other)
from qprof.attribution.engine import Decision, is_kernel_dso
from qprof.attribution.profile import Profile
from qprof.archive.stacks import UNKNOWN, Frame, StackRecord

# Name fragments that suggest a category; a guess shown beside a commented-out rule, never a rule.
_HINTS = (
    (CRYPTO, re.compile(r"(?i)aes|gcm|ghash|chacha|poly1305|crypt|seal|open_in_place|cipher|aead|hkdf|sha\d|x25519|tls")),
    (PACKET_IO, re.compile(r"(?i)send|recv|sock|udp|gso|gro|poll|epoll|datagram")),
    (CONNECTION, re.compile(r"(?i)ack|stream|frame|conn|packet|recovery|congest|cubic|bbr|pacer|timer|flow|cid")),
    (IO, re.compile(r"(?i)file|fread|fwrite|mmap|disk")),
)
AGREE = 0.8  # the callers' share of one category past which they decide for the symbol
# named parts of Uncategorized that no rule should move: sampling artefacts, eBPF programs, handoffs (and
# the "runtime: " parts); the application's own code is a gap: its functions are what users add rules for
_NOT_GAPS = {SKID, PROBE_COST, OTHER_BPF, HANDOFF}


@dataclass
class CoverageVisitor:
    """profile.Visitor: the unplaced Uncategorized samples, per process and leaf, with their stacks."""

    stacks: dict[tuple[int, Frame], list[tuple[tuple[Frame, ...], int]]] = field(
        default_factory=lambda: defaultdict(list))
    now: dict[tuple[int, Frame], str] = field(default_factory=dict)  # what decides the leaf now

    def __call__(self, rec: StackRecord, d: Decision) -> None:
        if d.category == UNCATEGORIZED and d.subcategory not in _NOT_GAPS and rec.frames \
                and not (d.subcategory or "").startswith(RUNTIME):
            self.stacks[(rec.pid, rec.frames[0])].append((rec.frames, rec.period))
            self.now.setdefault((rec.pid, rec.frames[0]), label(d))


@dataclass(frozen=True)
class Gap:
    pid: int
    comm: str
    symbol: str
    dso: str
    share: float  # of the process's sampled CPU time
    cpu_seconds: float
    suggestion: str  # a [[rule]] table in TOML, commented out where a person must choose
    callers: dict[str, float]  # what its callers decide: category -> share of its time


def _pattern(regex: str) -> str:
    """A regex as a TOML string: a literal one ('...', no escapes to read) when it can be, else a basic
    one with \\uXXXX escapes for what TOML refuses raw (a quote, a backslash, a control character)."""
    if "'" not in regex and regex.isprintable():
        return f"'{regex}'"
    return '"' + "".join(f"\\u{ord(c):04x}" if ord(c) < 0x20 or ord(c) == 0x7F or c in '"\\' else c
                         for c in regex) + '"'


def _where(symbol: str, dso: str) -> str:
    lib = re.sub(r"\.so(\.\d+)*$", ".so", dso.rsplit("/", 1)[-1])
    if is_kernel_dso(dso):
        return "kernel = true"
    if dso.startswith("["):
        return f"dso = {_pattern('^' + re.escape(dso) + '$')}"
    return f"dso = {_pattern('/' + re.escape(lib))}"


def _commented(lines: list[str]) -> str:
    return "\n".join("# " + ln for ln in lines)


def label(d: Decision) -> str:
    """A decision as the callers' mix names it: a category, or Uncategorized with its part."""
    return d.category if d.category != UNCATEGORIZED else f"{UNCATEGORIZED} / {d.subcategory or 'no subcategory'}"


def suggest(symbol: str, dso: str, callers: dict[str, float], now: str = UNCATEGORIZED) -> str:
    """A rule for one gap from its callers' decisions (label -> share of its time); `now`: its own label
    (callers deciding the same as its own rule tell nothing new)."""
    base = dso.rsplit("/", 1)[-1]
    if symbol == UNKNOWN and is_kernel_dso(dso):
        return "# kernel frame without a symbol: check /proc/kallsyms access (root, kptr_restrict)"
    top, share = max(callers.items(), key=lambda kv: kv[1], default=(None, 0.0))
    mix = ", ".join(f"{c} {s:.0%}" for c, s in sorted(callers.items(), key=lambda kv: -kv[1])) or "none known"
    if symbol == UNKNOWN:
        head = [f"{base} has no symbol here (stripped?); a rule on the whole object is only right if",
                "everything in it is one job (a library, never an application or interpreter)"]
        rule = ["[[rule]]", _where(symbol, dso)]
    else:
        head, rule = [], ["[[rule]]", f"symbol = {_pattern('^' + re.escape(symbol) + '$')}", _where(symbol, dso)]
    # callers that place it somewhere: a category, or a part of Uncategorized the report names (a runtime's)
    placed = top is not None and top != now and \
        (not top.startswith(UNCATEGORIZED) or is_named_other(top.split(" / ", 1)[1]))
    if placed and share >= AGREE:
        return "\n".join(["# " + h for h in head]
                         + [f"# its callers decide {top} for {share:.0%} of its time: a helper they call",
                            *rule, "transparent = true"])
    hint = next((cat for cat, pat in _HINTS if pat.search(symbol)), None) if symbol != UNKNOWN else None
    choice = [f'category = "{hint}"  # a guess from the name: check the code' if hint else
              'category = "..."  # one of: Packet I/O, Crypto, Connection Mgmt, I/O, Uncategorized']
    said = ("no caller a rule knows" if not callers else
            f"its callers decide {mix}" + (f", none for {AGREE:.0%} of its time" if share < AGREE else ""))
    return "\n".join(["# " + h for h in head] + [f"# {said}: choose a category, then uncomment"]
                     + [_commented(rule + choice)])


def gaps(profile: Profile, seen: CoverageVisitor, top: int = 20) -> list[Gap]:
    """Hottest unplaced Uncategorized leaf symbols per process, hottest first, from `seen` (the visitor
    that watched `profile`'s attribution pass)."""
    per_pid: dict[int, Counter[Frame]] = defaultdict(Counter)
    for (pid, leaf), stacks in seen.stacks.items():
        per_pid[pid][leaf] += sum(period for _, period in stacks)
    out: list[Gap] = []
    for p in profile.processes:
        total = p.breakdown.period or 1
        clf = profile.classifiers.get(p.pid)
        for (sym, dso), per in per_pid[p.pid].most_common(top):
            callers: Counter[str] = Counter()
            for frames, period in seen.stacks[(p.pid, (sym, dso))]:
                if clf is not None and len(frames) > 1:
                    d = clf.classify(frames[1:])
                    if d.rule is not None:
                        callers[label(d)] += period
            known = sum(callers.values()) or 1
            shares = {c: v / known for c, v in callers.items()}
            out.append(Gap(p.pid, p.comm, sym, dso, per / total, profile.cpu_seconds(per),
                           suggest(sym, dso, shares, seen.now[(p.pid, (sym, dso))]), shares))
    return out
