"""A tool's `--version` is asked once per binary, across qprof processes, and again when the file changes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from qprof.cachefiles import read_json
from qprof.probes import features


def tool(path: Path, version: str) -> Path:
    """An executable that prints `version` and counts how often it was asked."""
    path.write_text(f"#!/bin/sh\necho x >> {path}.asked\necho '{version}'\n")
    path.chmod(0o755)
    return path


def asked(path: Path) -> int:
    return len(Path(f"{path}.asked").read_text().splitlines()) if Path(f"{path}.asked").exists() else 0


def test_version_is_remembered_by_the_files_identity(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(features, "VERSIONS", tmp_path / "cache" / "versions.json")
    t = tool(tmp_path / "tool", "tool 1.0")
    assert features.version_output(str(t)) == "tool 1.0\n" and asked(t) == 1
    features._version_output.cache_clear()  # as a new qprof process
    assert features.version_output(str(t)) == "tool 1.0\n" and asked(t) == 1
    tool(t, "tool 2.0")  # upgraded in place: another size and mtime
    os.utime(t, ns=(1, 1))
    features._version_output.cache_clear()
    assert features.version_output(str(t)) == "tool 2.0\n" and asked(t) == 2
    assert len(read_json(features.VERSIONS)) == 1, "the older identity is forgotten"


def test_a_damaged_cache_is_asked_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "versions.json"
    cache.write_text("{not json")
    monkeypatch.setattr(features, "VERSIONS", cache)
    features._version_output.cache_clear()
    t = tool(tmp_path / "tool", "tool 3")
    assert features.version_output(str(t)) == "tool 3\n" and asked(t) == 1
    assert features.version_output(str(tmp_path / "absent")) == ""
