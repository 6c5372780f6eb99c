"""Facts about the host, recorded in every run archive."""

from __future__ import annotations

import os
import platform

from qprof.archive.model import Host, Nic


def cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def cpu_nodes() -> dict[int, int]:
    """CPU -> NUMA node (from sysfs; one node when the kernel shows none)."""
    out: dict[int, int] = {}
    base = "/sys/devices/system/cpu"
    try:
        cpus = [d for d in os.listdir(base) if d.startswith("cpu") and d[3:].isdigit()]
    except OSError:
        return out
    for d in cpus:
        try:
            nodes = [n for n in os.listdir(f"{base}/{d}") if n.startswith("node") and n[4:].isdigit()]
        except OSError:
            continue
        out[int(d[3:])] = int(nodes[0][4:]) if nodes else 0
    return out


def nics() -> list[Nic]:
    """Network devices backed by hardware (not lo/veth/bridges) with their NUMA node."""
    out: list[Nic] = []
    try:
        names = sorted(os.listdir("/sys/class/net"))
    except OSError:
        return out
    for n in names:
        dev = f"/sys/class/net/{n}/device"
        if not os.path.exists(dev):
            continue
        try:
            with open(f"{dev}/numa_node", encoding="ascii") as f:
                node = int(f.read().strip())
        except (OSError, ValueError):
            node = -1
        out.append(Nic(n, node))
    return out


def host_info() -> Host:
    u = os.uname()
    return Host(hostname=u.nodename, kernel=u.release, kernel_build=u.version, machine=u.machine,
                cpu_model=cpu_model(), cpus=os.cpu_count(), python=platform.python_version(),
                cpu_nodes=cpu_nodes(), nics=nics())
