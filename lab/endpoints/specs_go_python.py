"""quic-go (Go module) and aioquic (Python, asyncio) bulk endpoints.

quic-go: `go build` of tests/endpoints/quicgo (go.sum committed; modules from
the Go module proxy). Go keeps frame pointers and full symbols.

aioquic: tests/endpoints/aioquic/bulk.py in its own venv (requirements.txt
pinned, from PyPI) on a Python >= 3.12 run with `-X perf`, so perf sees
Python functions as `py::qualname:file` frames (perf maps in /tmp, removed
once a run is folded). Debian 12's python3 is 3.11: the build looks for
$QPROF_PYTHON, python3.12+ on PATH, then pyenv versions, and skips with the
reason when none has perf support.
"""

from __future__ import annotations

import functools
import glob
import os
import re
import shutil
import subprocess
from pathlib import Path

from .build import BuildError, BuildUnavailable, EndpointSpec, go_command, register


def _run(cmd: list[str], cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        tail = "\n".join((r.stderr or r.stdout).strip().splitlines()[-20:])
        raise BuildError(f"{' '.join(cmd)} failed (exit {r.returncode}):\n{tail}")
    return r.stdout


# ---- quic-go -----------------------------------------------------------------

def _go_toolchain() -> str:
    go = go_command("quic-go v0.65 needs Go >= 1.26")
    version = _run([go, "version"]).strip()  # "go version go1.26.8 linux/amd64"
    m = re.search(r"go(\d+)\.(\d+)", version)
    have = (int(m[1]), int(m[2])) if m else (0, 0)
    m = re.search(r"^go (\d+)\.(\d+)", (Path(__file__).parent / "quicgo" / "go.mod").read_text(), re.M)
    need = (int(m[1]), int(m[2])) if m else (1, 21)
    if have < need and have < (1, 21):  # from 1.21 on, go fetches the newer toolchain from the module proxy
        raise BuildUnavailable(f"{version} is too old: quic-go needs Go >= {need[0]}.{need[1]} "
                               "(Debian 12 ships 1.19; install a newer Go from go.dev or put it on PATH)")
    return f"{go} {version}"


def _go_build(src: Path, out: Path, toolchain: str) -> None:
    go = toolchain.split()[0]
    env = dict(os.environ, CGO_ENABLED="0")
    _run([go, "build", "-trimpath", "-mod=readonly", "-buildvcs=false", "-o", str(out / "quicgo"), "."],
         cwd=src, env=env)


register(EndpointSpec(
    name="quicgo",
    mapping="quic-go",
    toolchain=_go_toolchain,
    build=_go_build,
    server=lambda out, addr, cert, key: [str(out / "quicgo"), "server", addr, str(cert), str(key)],
    client=lambda out, addr, n: [str(out / "quicgo"), "client", addr, str(n)],
    test_bytes=1 << 30,
    env_options={"app_rate_mbit": "QPROF_BULK_RATE_MBIT", "qlog_dir": "QLOGDIR"},
))


# ---- aioquic -----------------------------------------------------------------

_PERF_CHECK = ("import sys; print(sys.version_info >= (3, 12) and sys.is_stack_trampoline_active(), "
               "sys.version.split()[0])")


def _python_candidates() -> list[str]:
    found: list[str] = []
    if os.environ.get("QPROF_PYTHON"):
        found.append(os.environ["QPROF_PYTHON"])
    for v in ("3.13", "3.12", "3.14"):
        p = shutil.which(f"python{v}")
        if p:
            found.append(p)
    pyenv = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")

    def version(p: str) -> tuple[int, ...]:
        return tuple(int(x) for x in re.findall(r"\d+", Path(p).parent.parent.name)[:3])

    for p in sorted(glob.glob(f"{pyenv}/versions/3.*/bin/python3"), key=version, reverse=True):
        if re.fullmatch(r"3\.(1[2-9]|[2-9]\d)\.\d+", Path(p).parent.parent.name):
            found.append(p)
    return found


def _perf_check(py: str) -> str | None:
    """The interpreter's version if `-X perf` activates its trampoline, else None."""
    try:
        proc = subprocess.Popen([py, "-X", "perf", "-c", _PERF_CHECK], stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True)
    except OSError:
        return None
    try:
        out, _ = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return None
    finally:
        _remove_perf_map(proc.pid)
    first, _, version = out.strip().partition(" ")
    return version if proc.returncode == 0 and first == "True" else None


@functools.lru_cache(maxsize=1)
def _python_toolchain() -> str:
    tried = []
    for py in _python_candidates():
        version = _perf_check(py)
        if version:
            return f"{os.path.realpath(py)} {version}"
        tried.append(py)
    raise BuildUnavailable(
        "aioquic endpoint needs a Python >= 3.12 with perf support (-X perf); found none"
        + (f" (tried {', '.join(tried)})" if tried else "")
        + ": install one (e.g. pyenv install 3.12) or set QPROF_PYTHON")


def _aioquic_build(src: Path, out: Path, toolchain: str) -> None:
    py = toolchain.split()[0]
    _run([py, "-m", "venv", str(out / "venv")])
    _run([str(out / "venv" / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
          "-r", str(src / "requirements.txt")])
    shutil.copy2(src / "bulk.py", out / "bulk.py")


def _aioquic_cmd(out: Path, *args: str) -> list[str]:
    # the venv's python resolves its site-packages from pyvenv.cfg beside it, so the
    # venv still works after the build directory was renamed into place
    return [str(out / "venv" / "bin" / "python"), "-X", "perf", str(out / "bulk.py"), *args]


def _remove_perf_map(pid: int) -> None:
    """`-X perf` leaves /tmp/perf-PID.map behind; remove it once the run is folded."""
    try:
        os.unlink(f"/tmp/perf-{pid}.map")
    except OSError:
        pass


register(EndpointSpec(
    name="aioquic",
    mapping="aioquic",
    toolchain=_python_toolchain,
    build=_aioquic_build,
    server=lambda out, addr, cert, key: _aioquic_cmd(out, "server", addr, str(cert), str(key)),
    client=lambda out, addr, n: _aioquic_cmd(out, "client", addr, str(n)),
    test_bytes=64 << 20,  # ~2 s profiled: ~1,000 samples per side
    cleanup=_remove_perf_map,
    client_stop_env="QPROF_BULK_SELF_STOP",
))
