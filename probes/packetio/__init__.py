"""The default probe group: UDP packet I/O per thread, GSO/GRO, drops at the targets' ports.

packetio.bpf.c holds the programs and every struct they share with Python;
sampler.py loads them and runs the sampling windows (windows.py) in a child
process; record.py reads what it printed back as a typed record.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Callable

from qprof import runfiles
from qprof.probes import btf, libbpf
from qprof.probes.follow import targets_file
from qprof.probes.group import Context, Findings, Launch, ProgramCost, ProgramFiles, Unavailable
from qprof.probes.packetio import timing
from qprof.probes.packetio.maps import ProbeMaps

MAX_TARGETS = 4096  # packetio.bpf.c's limits.targets (the sampler checks it against the object)


def _netns(pid: int) -> int | None:
    """The inode number of a process's network namespace (None: gone, or not readable)."""
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None


@dataclass(frozen=True)
class PacketioGroup:
    name: str = "packetio"
    default: bool = True
    summary: str = ("UDP messages, datagrams and bytes per thread, GSO/GRO, drops at the targets' ports "
                    "(per-packet hooks counted in sampling windows within a CPU budget)")
    tracepoints: tuple[str, ...] = ("sock_send_length", "sock_recv_length", "net_dev_start_xmit",
                                    "skb_copy_datagram_iovec", "kfree_skb", "udp_fail_queue_rcv_skb")

    def config(self, pids: list[int], follow: bool = False) -> libbpf.LoaderConfig:
        """The programs' settings from this kernel's BTF; Unavailable names what is missing."""
        try:
            missing = [tp for tp in self.tracepoints if not btf.tracepoint_exists(tp)]
            gro_bit = btf.enumerator("UDP_FLAGS_GRO_ENABLED")
            kfree_skb_args = btf.tracepoint_arity("kfree_skb") or 0
        except btf.BTFUnavailable as e:
            raise Unavailable(str(e)) from None
        if missing:
            raise Unavailable(f"this kernel lacks tracepoint(s) {', '.join(missing)} "
                              "(sock_*_length need Linux 6.3+): run with --probes none")
        if gro_bit is None:
            raise Unavailable("this kernel's udp_sock has no UDP_FLAGS_GRO_ENABLED (Linux 6.5+ layout): "
                              "run with --probes none")
        if len(pids) > MAX_TARGETS:
            raise Unavailable(f"the packetio probes follow at most {MAX_TARGETS} targets")
        return libbpf.LoaderConfig(pids=pids, follow=follow, gro_bit=gro_bit,
                                   kfree_skb_has_socket=kfree_skb_args >= 4,
                                   netns=sorted({n for p in pids if (n := _netns(p)) is not None}))

    def start(self, ctx: Context) -> Launch:
        config = self.config(ctx.pids, ctx.follow)
        if ctx.follow:
            config = replace(config, added=str(targets_file(ctx.out)))
        ctx.status("starting probes: packetio (compiled first if this kernel is new to qprof)")
        obj = libbpf.build(__name__, self.name)
        source = ctx.out / runfiles.probe_file(self.name, "bpf.c")
        source.write_bytes(libbpf.source_text(__name__, self.name))
        timing_file = ctx.out / timing.file_name()  # the messages' times per bin (timing.py), beside the stream
        proc = libbpf.LibbpfProcess(self.name, f"{__name__}.sampler", obj, replace(config, timing=str(timing_file)),
                                    ctx.out / runfiles.probe_file(self.name, "jsonl"),
                                    ctx.out / runfiles.probe_file(self.name, "log"))
        proc.spawn()
        return Launch(proc, ProgramFiles(proc.output.name, "libbpf tp_btf, sampling windows", script=source.name,
                                         object=obj.name, config=config, timing=timing_file.name))

    def finish(self, findings: Findings, maps: ProbeMaps, programs: list[ProgramCost],
               status: Callable[[str], None]) -> None:
        return None


GROUP = PacketioGroup()
