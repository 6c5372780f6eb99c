"""Rust QUIC stacks: quinn (rustls + ring), s2n-quic (aws-lc), quiche (BoringSSL), tquic (optional);
quinn-mt and s2nquic-mt are quinn and s2n-quic on tokio's multi-thread runtime.

Each of quinn, s2nquic, quiche and tquic is a small crate under tests/endpoints/<name>
(Cargo.lock committed) with one binary taking `server ADDR CERT KEY` and
`client ADDR BYTES`. Builds: `cargo build --release --locked -j 2`, profile
release with `debug = "line-tables-only"` and `strip = false` (Cargo.toml), and
RUSTFLAGS `-C force-frame-pointers=yes` plus CFLAGS/CXXFLAGS
`-fno-omit-frame-pointer` for the bundled C code (ring, aws-lc, BoringSSL), so
qprof's auto mode picks frame-pointer unwinding and stacks are complete. The
cargo target directory lives in the cache (`<cache>/.cargo-target/<name>`,
kept across source changes so a rebuild is incremental); only the binary is
copied into the endpoint's build directory.

tquic is a crate here too, not `cargo install tquic_tools`: its tools speak
HTTP/3 file serving and print their own statistics, not this contract.

quinn, quiche and tquic are built with their `qlog` feature: with QLOGDIR=DIR
(the `qlog_dir` option) both ends write each connection's qlog into DIR, as
quic-go does; without it they open no file and log nothing.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
from pathlib import Path

from qprof.collectors import nativefold

from .build import HERE, BuildError, BuildUnavailable, EndpointSpec, cache_root, register

RUSTFLAGS = "-C force-frame-pointers=yes"
CFLAGS = "-fno-omit-frame-pointer"
JOBS = "2"  # the machine has 2 cores shared with others: never more


def _run(cmd: list[str], cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        tail = "\n".join((r.stderr or r.stdout).strip().splitlines()[-25:])
        raise BuildError(f"{' '.join(cmd)} failed (exit {r.returncode}):\n{tail}")
    return r.stdout


def _cargo() -> str:
    cargo = nativefold.cargo()  # the one qprof builds its own folder with
    if cargo is None:
        raise BuildUnavailable("cargo not found: install Rust (rustup) or put cargo on PATH")
    return cargo


def _env(cargo: str, target: Path | None = None) -> dict[str, str]:
    env = dict(os.environ, RUSTFLAGS=RUSTFLAGS, CFLAGS=CFLAGS, CXXFLAGS=CFLAGS)
    env.pop("RUSTC_WRAPPER", None)
    env["PATH"] = f"{Path(cargo).parent}:{env.get('PATH', '/usr/bin:/bin')}"
    if target is not None:
        env["CARGO_TARGET_DIR"] = str(target)
    return env


def _libclang() -> bool:
    """bindgen (boring-sys) loads libclang and needs clang's own headers (stddef.h)."""
    if os.environ.get("LIBCLANG_PATH"):
        return True
    return bool(glob.glob("/usr/lib/llvm-*/lib/libclang*.so*")) and \
        bool(glob.glob("/usr/lib/llvm-*/lib/clang/*/include/stddef.h"))


def _rust_toolchain(*needs: tuple[str, str]) -> str:
    """cargo + rustc versions and the flags (part of the cache key); `needs`: (tool, apt package)."""
    cargo = _cargo()
    for tool, pkg in needs:
        found = _libclang() if tool == "libclang" else shutil.which(tool) is not None
        if not found:
            raise BuildUnavailable(f"{tool} not found: it is needed to build this stack (Debian: apt-get install {pkg})")
    env = _env(cargo)
    rustc = shutil.which("rustc", path=env["PATH"]) or "rustc"
    versions = _run([cargo, "--version"], env=env).strip() + "; " + _run([rustc, "--version"], env=env).strip()
    return f"{cargo} | {versions} | RUSTFLAGS={RUSTFLAGS} CFLAGS={CFLAGS}"


def _cargo_build(binary: str):  # type: ignore[no-untyped-def]
    def build(src: Path, out: Path, toolchain: str) -> None:
        cargo = toolchain.split(" | ")[0]
        target = cache_root() / ".cargo-target" / src.name
        target.mkdir(parents=True, exist_ok=True)
        _run([cargo, "build", "--release", "--locked", "-j", JOBS, "--manifest-path", str(src / "Cargo.toml")],
             env=_env(cargo, target))
        shutil.copy2(target / "release" / binary, out / binary)
    return build


def _rust_spec(name: str, binary: str, mapping: str, needs: tuple[tuple[str, str], ...] = (),
               test_bytes: int = 1 << 30, env_options: dict[str, str] | None = None,
               sources: str | None = None, flags: tuple[str, ...] = ()) -> EndpointSpec:
    """`sources`: another stack's crate (a variant of it, run with `flags` before the subcommand)."""
    return register(EndpointSpec(
        name=name,
        mapping=mapping,
        toolchain=lambda: _rust_toolchain(*needs),
        build=_cargo_build(binary),
        server=lambda out, addr, cert, key: [str(out / binary), *flags, "server", addr, str(cert), str(key)],
        client=lambda out, addr, n: [str(out / binary), *flags, "client", addr, str(n)],
        test_bytes=test_bytes,
        sources=HERE / sources if sources else None,
        env_options=env_options or {},
        notes={"unwind": "frame pointers (RUSTFLAGS -C force-frame-pointers=yes, CFLAGS -fno-omit-frame-pointer)",
               "profile": 'release, debug = "line-tables-only", strip = false'},
    ))


QUINN = _rust_spec("quinn", "quinn-bulk", "quinn", test_bytes=2 << 30,
                   env_options={"app_rate_mbit": "QPROF_BULK_RATE_MBIT", "qlog_dir": "QLOGDIR"})
S2NQUIC = _rust_spec("s2nquic", "s2n-quic-bulk", "s2n-quic", test_bytes=4 << 30)
# the same crates on tokio's default multi-thread runtime (a worker per CPU and the blocking pool):
# the runtime their users get from #[tokio::main]; one cargo build serves both variants
QUINN_MT = _rust_spec("quinn-mt", "quinn-bulk", "quinn", test_bytes=2 << 30, sources="quinn",
                      flags=("--multi-thread",),
                      env_options={"app_rate_mbit": "QPROF_BULK_RATE_MBIT", "qlog_dir": "QLOGDIR"})
S2NQUIC_MT = _rust_spec("s2nquic-mt", "s2n-quic-bulk", "s2n-quic", test_bytes=4 << 30, sources="s2nquic",
                        flags=("--multi-thread",))
# BoringSSL is built from boring-sys's bundled sources (cmake) and bound with bindgen (libclang)
QUICHE = _rust_spec("quiche", "quiche-bulk", "quiche", needs=(("cmake", "cmake"), ("libclang", "libclang-dev")),
                    test_bytes=512 << 20, env_options={"qlog_dir": "QLOGDIR"})
# optional stack: BoringSSL from tquic's bundled sources (cmake)
TQUIC = _rust_spec("tquic", "tquic-bulk", "tquic", needs=(("cmake", "cmake"),), test_bytes=512 << 20,
                   env_options={"qlog_dir": "QLOGDIR"})
