"""Run the qprof command line as an unprivileged user (uid/gid 65534, no capabilities).

Used by the tests and the fault table to check what qprof says to a user who is not root.
That user must be able to read what it runs, and a checkout may sit under a directory only
root can enter (root's home is 0700 on Debian): so the interpreter, qprof's packages and
their dependencies are run from where they are when that user can reach them, and otherwise
from a copy (hard links where the filesystem allows) in a world-readable scratch directory,
made once per process and removed at exit.
"""

from __future__ import annotations

import atexit
import importlib
import os
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

NOBODY = 65534
# qprof's top-level packages as installed (setup.py's FOLDERS put the top-level folders under qprof)
PACKAGES = ("qprof", "qprof.probes", "qprof.collectors", "qprof.archive", "qprof.attribution", "qprof.mappings",
            "qprof.viewer")
_tree: Path | None = None


class Unavailable(Exception):
    """What this host lacks to drop root (the message says which)."""


def reachable(path: Path, uid: int = NOBODY) -> bool:
    """Can a user with no group in common with the owners open `path`: every directory above it
    searchable by others (or owned by `uid`), and the file itself readable by others."""
    path = Path(os.path.realpath(path))
    for d in list(reversed(path.parents)):
        st = os.stat(d)
        if st.st_uid != uid and not st.st_mode & stat.S_IXOTH:
            return False
    st = os.stat(path)
    return st.st_uid == uid or bool(st.st_mode & stat.S_IROTH)


def _replicate(src: Path, dst: Path, skip: tuple[str, ...] = ("__pycache__",)) -> None:
    """`src` into `dst`, world-readable: files hard-linked when others may read them already (and the
    filesystem allows), copied otherwise."""
    for root, dirs, files in os.walk(src):
        dirs[:] = [d for d in dirs if d not in skip]
        out = dst / os.path.relpath(root, src)
        out.mkdir(mode=0o755, parents=True, exist_ok=True)
        for name in files:
            s, d = os.path.join(root, name), out / name
            st = os.lstat(s)
            if stat.S_ISLNK(st.st_mode):
                d.symlink_to(os.readlink(s))
                continue
            if st.st_mode & stat.S_IROTH:
                try:
                    os.link(s, d)
                    continue
                except OSError:
                    pass
            shutil.copy2(s, d)
            os.chmod(d, 0o755 if st.st_mode & stat.S_IXUSR else 0o644)


def _scratch() -> Path:
    global _tree
    if _tree is None:
        _tree = Path(tempfile.mkdtemp(prefix="qprof-unprivileged-"))
        _tree.chmod(0o755)
        atexit.register(shutil.rmtree, _tree, True)
    return _tree


def _interpreter() -> tuple[str, dict[str, str]]:
    """A Python of this version the user can run, and the environment it needs."""
    base = Path(getattr(sys, "_base_executable", sys.executable))
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in (base, Path("/usr/bin") / version):
        if candidate.is_file() and reachable(candidate):
            return str(candidate), {}
    # copy the base installation (relocatable CPython: its library and stdlib found from PYTHONHOME)
    prefix = Path(sys.base_prefix)
    home = _scratch() / "python"
    if not home.exists():
        for part in ("bin", "lib"):
            _replicate(prefix / part, home / part, skip=("__pycache__", "site-packages", "test", "tests"))
    return str(home / "bin" / base.name), {"PYTHONHOME": str(home), "LD_LIBRARY_PATH": str(home / "lib")}


def _pythonpath() -> list[str]:
    """qprof's packages in their installed layout, then the environment's installed packages."""
    src = _scratch() / "src"
    if not src.exists():
        subpackages = tuple(n.rsplit(".", 1)[1] for n in PACKAGES if "." in n)
        for name in PACKAGES:  # each from where it is imported (a checkout maps folders to subpackages)
            pkg = Path(importlib.import_module(name).__path__[0])
            _replicate(pkg, src / name.replace(".", "/"),
                       skip=("__pycache__", *subpackages) if name == "qprof" else ("__pycache__",))
    site = Path(sysconfig.get_paths()["purelib"])
    if not reachable(site):
        copy = _scratch() / "site-packages"
        if not copy.exists():
            _replicate(site, copy)
        site = copy
    return [str(src), str(site)]


def command(args: list[str], module: str = "qprof.cli") -> tuple[list[str], dict[str, str]]:
    """(argv, extra environment) running `python -m MODULE ARGS` as uid/gid 65534, no capabilities."""
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        raise Unavailable("setpriv (util-linux) is missing: cannot drop root")
    if os.geteuid() != 0:
        raise Unavailable("dropping to another user needs root")
    python, env = _interpreter()
    env["PYTHONPATH"] = os.pathsep.join(_pythonpath())
    env["PYTHONNOUSERSITE"] = "1"
    return [setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--inh-caps=-all",
            python, "-s", "-m", module, *args], env


def run(args: list[str], home: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`qprof ARGS` as the unprivileged user with HOME=`home` (which it must be able to write)."""
    argv, extra = command(args)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONHOME", "PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                          env={**env, **extra, "HOME": str(home)}, cwd="/")
