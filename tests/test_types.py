"""The whole package type-checks strictly (mypy --strict, configured in pyproject.toml): qprof/*.py and
every folder installed as part of it (probes, collectors, archive, attribution, mappings, viewer).

The typed records between the layers are what keeps a field's meaning in one place; a checker is what
keeps callers honest about them (None where a figure may be unknown, a list where one was written).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import ROOT

# the packages installed from the folders (setup.py)
FOLDERS = ("probes", "collectors", "archive", "attribution", "mappings", "viewer")
STRICT = ["-p", "qprof"]


def test_package_type_checks_strictly(tmp_path: Path) -> None:
    pkg = tmp_path / "qprof"
    pkg.mkdir()
    for f in (ROOT / "qprof").glob("*.py"):
        (pkg / f.name).symlink_to(f)
    for folder in FOLDERS:
        (pkg / folder).symlink_to(ROOT / folder, target_is_directory=True)
    r = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
                        "--cache-dir", str(ROOT / ".cache" / "mypy"), *STRICT],
                       cwd=tmp_path, env={**os.environ, "MYPYPATH": str(tmp_path)}, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Success: no issues found" in r.stdout
