"""Facts about the host and the tools, recorded in every run archive."""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
from typing import Any


def tool_version(tool: str) -> str | None:
    """`tool --version`'s version number, or None when the tool is absent or broken."""
    path = shutil.which(tool)
    if path is None:
        return None
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"v?(\d+\.\d+(?:\.\d+)?)", out)
    return m.group(1) if m else None


def cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def host_info() -> dict[str, Any]:
    u = os.uname()
    return {
        "kernel": u.release,
        "kernel_build": u.version,
        "machine": u.machine,
        "cpu_model": cpu_model(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
    }
