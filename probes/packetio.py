"""The `packetio` probe group (probes/packetio.bpf.c): its configuration and how its maps print.

The maps are printed under the names and key shapes of bpftrace's `@maps`
(`@tx_msgs` keyed "pid,tid,port", lhist buckets as {min, max, count}), the
format every probe group's output shares and attribution.packetio reads.
"""

from __future__ import annotations

import struct
from typing import Any

from qprof.probes.libbpf import Group, Loaded

MAX_TARGETS = 16  # as in packetio.bpf.c
# its BTF tracepoints
TRACEPOINTS = ("sock_send_length", "sock_recv_length", "net_dev_start_xmit", "skb_copy_datagram_iovec",
               "kfree_skb", "udp_fail_queue_rcv_skb")

# struct thread_counts, field by field (all __u64)
THREAD_FIELDS = ("tx_bytes", "tx_errors", "tx_gso_sockopt_msgs", "rx_bytes", "rx_empty", "rx_gro_socket_msgs",
                 "tx_skbs", "tx_gso_skbs", "tx_dgrams", "rx_gro_skbs", "rx_gro_dgrams")
# hist index -> (bpftrace name, bucket width, buckets before the overflow bucket)
HISTS = {0: ("@tx_gso_segs", 4, 20), 1: ("@tx_gso_size", 250, 36), 2: ("@rx_gro_segs", 4, 20)}
SHARED = {"drops": "@drops", "udp_drops": "@udp_drops", "udp_queue_fail": "@udp_queue_fail"}


def rodata(config: dict[str, Any]) -> bytes:
    """struct config: targets[16], ntargets, gro_bit (all __u32)."""
    pids = [int(p) for p in config["pids"]]
    if not 1 <= len(pids) <= MAX_TARGETS:
        raise ValueError(f"the packetio probes follow 1 to {MAX_TARGETS} targets, not {len(pids)}")
    return struct.pack(f"<{MAX_TARGETS}III", *pids, *[0] * (MAX_TARGETS - len(pids)), len(pids),
                       int(config["gro_bit"]))


def _sum_u64(values: list[bytes], n: int) -> tuple[int, ...]:
    totals = [0] * n
    for v in values:
        for i, x in enumerate(struct.unpack_from(f"<{n}Q", v)):
            totals[i] += x
    return tuple(totals)


def snapshot(loaded: Loaded) -> list[dict[str, Any]]:
    """Every map, one JSON object per bpftrace-named map (summed over CPUs)."""
    maps: dict[str, dict[str, Any]] = {}
    for key, vals in loaded.entries("threads"):
        pid, tid = struct.unpack_from("<II", key)
        for name, v in zip(THREAD_FIELDS, _sum_u64(vals, len(THREAD_FIELDS))):
            if v:
                maps.setdefault(f"@{name}", {})[f"{pid},{tid}"] = v
    for key, vals in loaded.entries("msgs"):
        pid, tid, port, direction = struct.unpack_from("<IIII", key)
        maps.setdefault("@rx_msgs" if direction else "@tx_msgs", {})[f"{pid},{tid},{port}"] = _sum_u64(vals, 1)[0]
    hists: dict[str, dict[str, dict[int, int]]] = {}
    for key, vals in loaded.entries("hists"):
        pid, which, bucket, _ = struct.unpack_from("<IIII", key)
        if which in HISTS:
            hists.setdefault(HISTS[which][0], {}).setdefault(str(pid), {})[bucket] = _sum_u64(vals, 1)[0]
    for m, name in SHARED.items():
        for key, vals in loaded.entries(m):
            a, b = struct.unpack_from("<iI", key)
            maps.setdefault(name, {})[f"{a},{b}"] = _sum_u64(vals, 1)[0]
    out: list[dict[str, Any]] = [{"type": "map", "data": {name: m}} for name, m in sorted(maps.items())]
    for which, (name, width, n) in HISTS.items():
        by_pid = hists.get(name, {})
        out.append({"type": "hist", "data": {name: {pid: [
            {"min": b * width, "max": (b + 1) * width - 1 if b < n else b * width, "count": c}
            for b, c in sorted(buckets.items())] for pid, buckets in by_pid.items()}}})
    return out


GROUP = Group("packetio", rodata, snapshot)
