"""A network path with delay and loss for the lab: the forwarder (forwarder.c), built and started here.

This kernel has no netem (and no fq), so a `Lab(delay_ms=..., loss=...)` puts a third network
namespace between server and client and runs `forwarder` there: an Ethernet wire that holds each
frame for the delay and drops a seeded random fraction (qprof.netlab describes the topology; the
comment at the top of forwarder.c the forwarder). The product (qprof.netlab) never imports this
package: a lab is given the command maker,

    from lab.path import command, path_lab
    with Lab(delay_ms=15, loss=0.01, forwarder=command) as lab: ...
    with path_lab(delay_ms=15, loss=0.01) as lab: ...          # the same

`binary()` compiles forwarder.c with gcc -O2 once per content of this folder (the source and this
file, which holds the flags) and gcc's version, into the endpoints' build cache
(`$QPROF_CACHE`, default ~/.cache/qprof/endpoints/path-forwarder-<hash>/forwarder), under the same
lock and atomic landing as the QUIC endpoints (lab.endpoints.build.cached). `command(spec)` is the
forwarder's command line for a lab's PathSpec; the lab starts it inside the path namespace.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

from lab.endpoints.build import BuildError, BuildUnavailable, cached, tree_hash
from qprof.netlab import Lab, PathSpec

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "forwarder.c"
NAME = "path-forwarder"
CFLAGS = ["-O2", "-g", "-fno-omit-frame-pointer", "-Wall", "-Wextra", "-Werror"]

__all__ = ["BuildError", "BuildUnavailable", "binary", "command", "path_lab"]

_built: Path | None = None


def toolchain() -> str:
    """gcc's version line (part of the cache key); BuildUnavailable without gcc."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        raise BuildUnavailable("no C compiler for the path forwarder (make test installs gcc)")
    out = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout
    return f"{cc} {out.splitlines()[0] if out else '?'}"


def binary() -> Path:
    """The forwarder, built once per source content and compiler (cached across runs)."""
    global _built
    if _built is not None and _built.exists():
        return _built
    tool = toolchain()
    cc = tool.split(" ", 1)[0]

    def make(out: Path) -> None:
        r = subprocess.run([cc, *CFLAGS, "-o", str(out / "forwarder"), str(SOURCE)], capture_output=True, text=True)
        if r.returncode != 0:
            raise BuildError(f"building {SOURCE} failed:\n{r.stdout}{r.stderr}")

    directory, _ = cached(NAME, tree_hash(NAME, tool, HERE, []), make)
    _built = directory / "forwarder"
    return _built


def command(spec: PathSpec) -> list[str]:
    """The forwarder's command line for `spec` (interface a faces the server, b the client)."""
    return [str(binary()), "--a", spec.server_side, "--b", spec.client_side,
            "--delay-us", f"{spec.delay_ms * 1000:.3f}",
            "--loss-ab", repr(spec.loss_server_to_client), "--loss-ba", repr(spec.loss_client_to_server),
            "--seed", str(spec.seed), "--queue-bytes", str(spec.queue_bytes),
            "--interval-ms", str(spec.interval_ms), "--fifo", str(spec.fifo)]


def path_lab(**options: Any) -> Lab:
    """A Lab whose delay and loss (if asked) run through this forwarder."""
    return Lab(forwarder=command, **options)
