"""A process's sockets as /proc shows them: the one reader of its file descriptor table, shared
by the probe loaders (which ports to watch), leftover detection (which paths a process holds) and
the collectors (who owns a socket). Low in the layers so that probes and collectors both use it."""

from __future__ import annotations

import os


def fd_table(pid: int) -> dict[int, str]:
    """What each of the process's open file descriptors points to (a path, "socket:[N]", "pipe:[N]"...);
    empty when the process is gone or not ours to read."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return {}
    out = {}
    for fd in fds:
        try:
            out[int(fd)] = os.readlink(f"/proc/{pid}/fd/{fd}")
        except (OSError, ValueError):  # closed meanwhile
            continue
    return out


def fd_targets(pid: int) -> list[str]:
    return list(fd_table(pid).values())


def socket_fds(pid: int) -> dict[str, list[int]]:
    """The process's sockets: inode -> the descriptors holding it."""
    out: dict[str, list[int]] = {}
    for fd, t in sorted(fd_table(pid).items()):
        if t.startswith("socket:["):
            out.setdefault(t[8:-1], []).append(fd)
    return out


def socket_inodes(pid: int) -> set[str]:
    """Inodes of the sockets a process holds open."""
    return set(socket_fds(pid))


def udp_ports(pid: int) -> dict[str, int]:
    """The process's UDP sockets: inode -> local port (its sockets' inodes in its namespace's tables)."""
    inodes = socket_inodes(pid)
    found = {}
    for table in ("udp", "udp6"):
        try:
            with open(f"/proc/{pid}/net/{table}", encoding="ascii") as f:
                next(f, None)
                for ln in f:
                    cols = ln.split()
                    if len(cols) > 9 and cols[9] in inodes:
                        found[cols[9]] = int(cols[1].rsplit(":", 1)[1], 16)
        except OSError:
            continue
    return found


def snmp_table(text: str, prefix: str) -> dict[str, str]:
    """One table of /proc/net/snmp or /proc/net/netstat ("Udp:", "IpExt:"...): a row of names
    followed by a row of values, both starting with the prefix. Empty when absent."""
    rows = [ln.split() for ln in text.splitlines() if ln.startswith(prefix)]
    return dict(zip(rows[0][1:], rows[1][1:])) if len(rows) == 2 else {}
