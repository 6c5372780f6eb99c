"""A qprof tree compiled to bytecode before a benchmark times it, as an installed qprof is.

Python writes a module's bytecode the first time it imports it, unless PYTHONDONTWRITEBYTECODE is
set (some shells and CI images set it): then a tree never run before, or a module just edited, is
compiled anew at every start of qprof and of each of its probe loaders (all of qprof's modules
compile in 0.16 CPU s here), a cost that
no user pays. A benchmark compiles each tree it times first, and runs without that variable.
"""

from __future__ import annotations

import os
import subprocess
import sys

PACKAGES = ("qprof", "qprof.archive", "qprof.attribution", "qprof.collectors", "qprof.mappings", "qprof.probes",
            "qprof.viewer")
_COMPILE = ("import compileall, importlib, sys\n"
            "ok = all(compileall.compile_dir(p, quiet=1) for n in sys.argv[1:]\n"
            "         for p in importlib.import_module(n).__path__)\n"
            "sys.exit(0 if ok else 1)")


def compile_tree(python: str = sys.executable) -> None:
    """The qprof tree `python` imports, compiled; this process's children write bytecode from now on."""
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    subprocess.run([python, "-c", _COMPILE, *PACKAGES], check=True)
