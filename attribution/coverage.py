"""What the mappings miss: the hottest Uncategorized symbols, each with a rule to start from.

The founding study shared its mappings "so that they can be refined"; this
is the loop that refines them: run, see what fell through, add a rule.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from qprof.attribution.categories import CONNECTION, CRYPTO, IO, PACKET_IO, UNCATEGORIZED
from qprof.attribution.engine import is_kernel_dso
from qprof.attribution.profile import Profile
from qprof.collectors.stacks import UNKNOWN

# Name fragments that suggest a category; a suggestion, to be checked against the code.
_HINTS = (
    (CRYPTO, re.compile(r"(?i)aes|gcm|ghash|chacha|poly1305|crypt|seal|open_in_place|cipher|aead|hkdf|sha\d|x25519|tls")),
    (PACKET_IO, re.compile(r"(?i)send|recv|sock|udp|gso|gro|poll|epoll|datagram")),
    (CONNECTION, re.compile(r"(?i)ack|stream|frame|conn|packet|recovery|congest|cubic|bbr|pacer|timer|flow|cid")),
    (IO, re.compile(r"(?i)file|fread|fwrite|mmap|disk")),
)


@dataclass(frozen=True)
class Gap:
    pid: int
    comm: str
    symbol: str
    dso: str
    share: float  # of the process's sampled CPU time
    cpu_seconds: float
    suggestion: str  # a [[rule]] table in TOML


def _suggest(symbol: str, dso: str) -> str:
    base = dso.rsplit("/", 1)[-1]
    lib = re.sub(r"\.so(\.\d+)*$", ".so", base)
    hint = next((cat for cat, pat in _HINTS if pat.search(symbol)), None) if symbol != UNKNOWN else None
    cat = f'category = "{hint}"  # guessed from the name: check it' if hint else \
        'category = "Connection Mgmt"  # unknown: choose one of the five'
    if symbol == UNKNOWN:
        if is_kernel_dso(dso):
            return "# kernel frame without a symbol: check /proc/kallsyms access (root, kptr_restrict)"
        return (f"# {base} has no symbol here (stripped?); a rule on the whole object is only right if\n"
                f"# everything in it is one job (a library, never an application or interpreter):\n"
                f"[[rule]]\ndso = '/{re.escape(lib)}'\n{cat}")
    if is_kernel_dso(dso):
        where = "kernel = true"
    elif dso.startswith("["):
        where = f"dso = '^{re.escape(dso)}$'"
    else:
        where = f"dso = '/{re.escape(lib)}'"
    return f"[[rule]]\nsymbol = '^{re.escape(symbol)}$'\n{where}\n{cat}"


def gaps(profile: Profile, top: int = 20) -> list[Gap]:
    """Hottest Uncategorized leaf symbols per process, hottest first."""
    out: list[Gap] = []
    for p in profile.processes:
        total = p.breakdown.period or 1
        rows = [(sym, dso, per) for (cat, sym, dso), per in p.breakdown.symbols.most_common()
                if cat == UNCATEGORIZED][:top]
        out += [Gap(p.pid, p.comm, sym, dso, per / total, profile.cpu_seconds(per), _suggest(sym, dso))
                for sym, dso, per in rows]
    return out
