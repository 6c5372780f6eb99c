"""Recommendations drawn from evidence in the run, each with the numbers behind it.

Only what the run measured triggers advice; thresholds are stated in the text
so a reader can disagree with them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from qprof.attribution.packetio import PacketIO
from qprof.jsonvalue import JsonObject

DEFAULT_RCVBUF_HINT = 16  # the founding study: 16x the 208 KiB default stopped the drops
ONE_PER_CALL = 1.2  # datagrams per syscall below this count as "one at a time"
MIN_DATAGRAMS = 1000  # ignore directions that hardly moved anything


@dataclass(frozen=True)
class Recommendation:
    pid: int
    topic: str
    finding: str
    advice: str

    def to_json(self) -> JsonObject:
        return asdict(self)


def _kib(n: int | None) -> str:
    return "?" if n is None else f"{n / 1024:.0f} KiB"


def _first_int(value: object) -> int:
    """A sysctl's (first) number; 0 when the archive holds something else."""
    parts = str(value).split()
    return int(parts[0]) if parts and parts[0].isdigit() else 0


def _one_at_a_time(per_call: float | None) -> bool:
    return per_call is not None and per_call < ONE_PER_CALL


def recommend(pio: PacketIO, comms: dict[int, str],
              mmsg_seen: dict[int, set[str]] | None = None) -> list[Recommendation]:
    """`mmsg_seen`: batching calls seen in each process's samples (counted only by opt-in probes)."""
    mmsg_seen = mmsg_seen or {}
    out: list[Recommendation] = []
    rmem_default = _first_int(pio.sysctl.get("net.core.rmem_default"))
    rmem_max = _first_int(pio.sysctl.get("net.core.rmem_max"))
    for pid, p in sorted(pio.processes.items()):
        who = f"{comms.get(pid, '?')} ({pid})"
        dropped = sum(p.drops.values())
        if dropped:
            bufs = sorted({int(b) for sk in p.sockets if (b := sk.last.get("rcvbuf")) is not None})
            buf = _kib(bufs[0]) if bufs else "unknown"
            share = f" ({dropped / (dropped + p.rx.dgrams):.2%} of datagrams for it)" if p.rx.dgrams else ""
            at_default = bool(bufs) and rmem_default and bufs[0] <= 2 * rmem_default
            target = max(DEFAULT_RCVBUF_HINT * (bufs[0] if bufs else rmem_default or 212992), 4 << 20)
            out.append(Recommendation(
                pid, "receive buffer",
                f"{who}: the kernel dropped {dropped} datagrams at its sockets{share}: "
                + ", ".join(f"{n} {r}" for r, n in sorted(p.drops.items(), key=lambda x: -x[1]))
                + f"; SO_RCVBUF {buf}" + (" (the system default)" if at_default else ""),
                f"raise the receive buffer to {_kib(target)} or more (setsockopt SO_RCVBUF; the kernel caps it "
                f"at net.core.rmem_max = {_kib(rmem_max)}, raise that too or use SO_RCVBUFFORCE)"))
        rx, tx = p.rx, p.tx
        # batching advice only for the direction that carries the data, not for ACKs, and only when
        # the calls were counted (a damaged archive can hold datagrams without calls)
        if rx.bytes >= tx.bytes and rx.dgrams >= MIN_DATAGRAMS and _one_at_a_time(rx.per_syscall()) \
                and not rx.offload_socket_msgs and not rx.mmsg_calls and "recvmmsg" not in mmsg_seen.get(pid, set()):
            out.append(Recommendation(
                pid, "receive batching",
                f"{who}: {rx.syscalls} receive calls for {rx.dgrams} datagrams "
                f"({rx.per_syscall():.2f} per call), no UDP_GRO and no recvmmsg",
                "enable UDP_GRO (setsockopt SOL_UDP, UDP_GRO) or receive with recvmmsg to move many datagrams "
                "per system call"))
        if tx.bytes >= rx.bytes and tx.dgrams >= MIN_DATAGRAMS and _one_at_a_time(tx.per_syscall()) \
                and not tx.offload_skbs and not tx.mmsg_calls and "sendmmsg" not in mmsg_seen.get(pid, set()):
            out.append(Recommendation(
                pid, "send batching",
                f"{who}: {tx.syscalls} send calls for {tx.dgrams} datagrams ({tx.per_syscall():.2f} per call), "
                "no GSO and no sendmmsg",
                "send with UDP GSO (UDP_SEGMENT socket option or cmsg) or sendmmsg"))
        calls = rx.syscalls + rx.empty
        if calls >= MIN_DATAGRAMS and rx.empty / calls >= 0.3:
            out.append(Recommendation(
                pid, "empty receives",
                f"{who}: {rx.empty} of {calls} receive calls ({rx.empty / calls:.0%}) returned no datagram",
                "read until EAGAIN only after readiness, or batch with recvmmsg/GRO so fewer calls come back empty"))
    return out
