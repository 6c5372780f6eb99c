"""Facts about the host, recorded in every run archive."""

from __future__ import annotations

import os
import platform
from typing import Any


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
