"""The target's own code is "application": a library that calls it back does not make it the library's work.

Leaf-first walking lets the deepest claimed frame decide, and frames no rule
knows pass the decision to their caller. For code of the program itself that
is wrong when a library calls it: an ngtcp2 stream-data callback, a tquic
`TransportHandler::on_stream_readable`, a handler a runtime polls. Its work
would become the library's Connection Mgmt. So each process gets one more
rule, after every mapping file's: frames of its own code, that no rule claims,
decide Uncategorized / application. Deeper claimed frames (a library call made
from the callback: stream reads, crypto, a syscall) still decide first, and
deeper unknown helpers (a checksum routine from some other library) are the
application's too.

What is "its own code" depends on how the program is built:
- Go: package main (`main.`), the program's own package in every Go binary.
- Rust: the binary's crate (`<crate>::`, also `<crate::T as lib::Trait>::` for the
  callbacks it implements), named after the executable as cargo does, or by a
  `<crate>::main` frame.
- Python: functions of the script's own directory (`py::f:/dir/script.py`).
- C and C++: frames in the executable itself (the QUIC library is a shared
  library, or is matched by its own symbol rules first).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterable

from qprof.attribution.categories import APPLICATION, UNCATEGORIZED
from qprof.attribution.mapping import Rule
from qprof.attribution.patterns import BoundedPattern
from qprof.archive.model import Target

_RUST_MAIN = re.compile(r"^<?([A-Za-z_][A-Za-z0-9_]*)::main$")
_NOT_APP_CRATES = {"std", "core", "alloc", "tokio", "async_std", "futures", "smol"}
_PY_SCRIPT = re.compile(r"\.py$")


def application_rule(target: Target | None, files: Iterable[str], symbols: Iterable[str]) -> Rule | None:
    """The rule that names this process's own code, or None when it cannot be told apart.

    `target`: the profiled process (exe, cmdline, objects; None: a process the run did not
    attach to); `files`: the names of the mapping files chosen for the process; `symbols`: every
    symbol seen in its stacks."""
    names = set(files)
    exe = target.exe if target else None
    go = "go-runtime" in names or any(o.go and o.path == exe for o in (target.objects if target else ()))
    if go:
        return _rule(r"^main\.", None, "Go package main")
    if "rust-std" in names:
        crates = {m.group(1) for s in symbols if (m := _RUST_MAIN.match(s))} - _NOT_APP_CRATES
        if exe:
            crates.add(Path(exe).name.replace("-", "_"))
        crates = {c for c in crates if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", c)}
        if crates:
            alt = "|".join(sorted(map(re.escape, crates)))
            return _rule(rf"^<?({alt})::", None, f"Rust crate {', '.join(sorted(crates))}")
        return None
    if "python" in names:
        script = next((a for a in (target.cmdline if target else ())[1:] if _PY_SCRIPT.search(a)), None)
        if script and script.startswith("/"):
            d = re.escape(str(Path(script).parent))
            return _rule(rf"^py::[^:]*:{d}/[^/]+\.py$", None, f"Python files in {Path(script).parent}")
        return None
    if exe:
        return _rule(None, rf"^{re.escape(exe)}$", f"the executable {exe}")
    return None


def _rule(symbol: str | None, dso: str | None, what: str) -> Rule:
    where = f"own code: {what}"
    return Rule(where, "application", None if symbol is None else BoundedPattern(symbol, where),
                None if dso is None else BoundedPattern(dso, where), False, None, UNCATEGORIZED, APPLICATION,
                False)
