"""Build the tests' real QUIC endpoints once, cache them outside the repository.

Each stack is an `EndpointSpec` in the registry (`register()`); the specs live
in `specs_*.py` modules of this package (one per group of stacks, so adding a
stack never edits another group's file) and are found by `registry()`.

`build(name)` returns a `Built` endpoint: its cache directory and the command
lines of its server (`server ADDR CERT KEY`) and client (`client ADDR BYTES`).
The directory is `$QPROF_CACHE/<name>-<hash>` (default cache root
`~/.cache/qprof/endpoints`), the hash covering the stack's sources and its
toolchain, so an endpoint is rebuilt only when either changes. Builds run
under a lock and land atomically: concurrent test runs never see half a build;
a new build removes the stack's builds from older sources.
A missing toolchain raises `BuildUnavailable` (tests skip with its reason); a
failing build raises `BuildError` with the tool's output.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib
import os
import pkgutil
import re
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent
# Never hashed: build products and editor or tool leftovers inside a source folder.
_IGNORED_PARTS = {"target", "__pycache__", ".git", "node_modules"}


class BuildUnavailable(Exception):
    """The toolchain this stack needs is absent: a reason to skip, not a failure."""


class BuildError(Exception):
    """The toolchain is there but the build failed."""


@dataclass(frozen=True)
class Built:
    spec: "EndpointSpec"
    directory: Path
    server: Callable[[str, Path, Path], list[str]]  # (addr "127.0.0.1:PORT", cert, key) -> argv
    client: Callable[[str, int], list[str]]  # (addr, bytes) -> argv
    build_seconds: float  # 0.0 when the cached build was reused
    cleanup: Callable[[int], None] = lambda pid: None  # after a process of this stack exited

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def client_stop_env(self) -> str | None:
        return self.spec.client_stop_env


@dataclass(frozen=True)
class EndpointSpec:
    """How to build one stack's bulk server/client and run it from its build directory.

    `toolchain()` finds what the build needs and returns a short description
    (part of the cache key, e.g. a compiler version) or raises BuildUnavailable.
    `build(src, out, toolchain)` fills `out`; `server(out, addr, cert, key)` and
    `client(out, addr, nbytes)` give argv lists.
    """

    name: str  # also the folder under lab/endpoints/ holding its sources
    mapping: str  # the stack mapping file auto-detection must load (its `name`)
    toolchain: Callable[[], str]
    build: Callable[[Path, Path, str], None]
    server: Callable[[Path, str, Path, Path], list[str]]
    client: Callable[[Path, str, int], list[str]]
    test_bytes: int = 256 << 20  # a transfer of a few seconds when profiled
    sources: Path | None = None  # default: lab/endpoints/<name>
    cleanup: Callable[[int], None] | None = None  # remove per-process leftovers (e.g. perf maps)
    # An environment variable that, set to "1", makes the client SIGSTOP itself once started
    # up, right before connecting (interpreted stacks: keeps start-up out of the profile).
    # Without it the client is held right after exec (qprof.endpoints.StoppedProcess).
    client_stop_env: str | None = None
    # Options a scenario may ask of this stack -> the environment variable that sets them, e.g.
    # {"app_rate_mbit": "QPROF_BULK_RATE_MBIT"} (the server paces its writes), {"qlog_dir": "QLOGDIR"}
    env_options: dict[str, str] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)

    @property
    def source_dir(self) -> Path:
        return self.sources or HERE / self.name


_REGISTRY: dict[str, EndpointSpec] = {}
_discovered = False


def register(spec: EndpointSpec) -> EndpointSpec:
    """Add a stack; a name registered twice is a mistake in the specs modules."""
    if spec.name in _REGISTRY and _REGISTRY[spec.name] is not spec:
        raise ValueError(f"endpoint {spec.name!r} is registered twice")
    _REGISTRY[spec.name] = spec
    return spec


def registry() -> dict[str, EndpointSpec]:
    """Every registered stack, after importing this package's `specs_*` modules."""
    global _discovered
    if not _discovered:
        _discovered = True
        for mod in sorted(pkgutil.iter_modules([str(HERE)]), key=lambda m: m.name):
            if mod.name.startswith("specs_"):
                importlib.import_module(f"{__package__}.{mod.name}")
    return _REGISTRY


def go_command(needed_by: str) -> str:
    """The go command (PATH, else /usr/local/go/bin, where go.dev's archive goes); BuildUnavailable
    saying what needs it when there is none."""
    go = shutil.which("go") or ("/usr/local/go/bin/go" if os.access("/usr/local/go/bin/go", os.X_OK) else None)
    if go is None:
        raise BuildUnavailable(f"go not found: {needed_by}; install it from go.dev or put it on PATH")
    return go


def cache_root() -> Path:
    env = os.environ.get("QPROF_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "qprof" / "endpoints"


def source_hash(spec: EndpointSpec, toolchain: str) -> str:
    """Hash of every source file (path and content), the spec's module (build flags) and the toolchain."""
    spec_file = getattr(sys.modules.get(spec.build.__module__), "__file__", None)
    return tree_hash(spec.name, toolchain, spec.source_dir, [Path(spec_file)] if spec_file else [])


def tree_hash(name: str, toolchain: str, root: Path, extra: list[Path]) -> str:
    """Hash of a build's name, toolchain, `extra` files (its build script) and every file under `root`."""
    h = hashlib.sha256(f"{name}\0{toolchain}\0".encode())
    for f in extra:
        h.update(f.read_bytes())
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root)
        if _IGNORED_PARTS.intersection(rel.parts) or path.suffix in (".pyc", ".swp"):
            continue
        h.update(str(rel).encode() + b"\0")
        h.update(path.read_bytes())
        h.update(b"\0")
    return h.hexdigest()[:16]


def _prune(root: Path, name: str, keep: Path) -> None:
    """Remove this stack's builds from older sources (a test run only ever uses the current one)."""
    stale = re.compile(re.escape(name) + r"-[0-9a-f]{16}")
    for d in root.iterdir():
        if d != keep and d.is_dir() and stale.fullmatch(d.name):
            shutil.rmtree(d, ignore_errors=True)


def cached(name: str, key: str, make: Callable[[Path], None]) -> tuple[Path, float]:
    """`make(dir)`'s build of `name` for this `key` (a tree_hash), from the cache when it was made
    before: (its directory, seconds the build took now, 0.0 when reused). One build per name at a
    time across processes; a build lands whole or not at all; older keys' builds are removed."""
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    out = root / f"{name}-{key}"
    took = 0.0
    if not (out / ".complete").exists():
        with open(root / f".{name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (out / ".complete").exists():
                t0 = time.monotonic()
                tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=root))
                try:
                    make(tmp)
                    (tmp / ".complete").write_text(f"{key}\n")
                    shutil.rmtree(out, ignore_errors=True)
                    tmp.rename(out)
                except BaseException:
                    shutil.rmtree(tmp, ignore_errors=True)
                    raise
                took = time.monotonic() - t0
                _prune(root, name, keep=out)
    return out, took


def build(name: str) -> Built:
    """The built endpoint, from the cache when its sources and toolchain are unchanged."""
    specs = registry()
    if name not in specs:
        raise KeyError(f"no endpoint {name!r}; known: {', '.join(sorted(specs))}")
    spec = specs[name]
    tool = spec.toolchain()
    out, took = cached(name, source_hash(spec, tool), lambda tmp: spec.build(spec.source_dir, tmp, tool))
    return Built(spec, out,
                 server=lambda addr, cert, key: spec.server(out, addr, cert, key),
                 client=lambda addr, nbytes: spec.client(out, addr, nbytes),
                 build_seconds=took,
                 cleanup=spec.cleanup or (lambda pid: None))


def main(argv: list[str]) -> int:
    """`python -m lab.endpoints.build [NAME...]` (from the repository root): build or reuse each stack, one line each."""
    names = argv or sorted(registry())
    failed = 0
    for name in names:
        try:
            b = build(name)
        except BuildUnavailable as e:
            print(f"{name}: skipped: {e}")
            continue
        except (BuildError, KeyError) as e:
            print(f"{name}: FAILED: {e}")
            failed += 1
            continue
        how = f"built in {b.build_seconds:.1f} s" if b.build_seconds else "cached"
        print(f"{name}: {how}: {b.directory}")
    return 1 if failed else 0


if __name__ == "__main__":
    # run through the package's module, where the specs modules register their stacks
    sys.exit(importlib.import_module(f"{__spec__.parent}.build").main(sys.argv[1:]))
