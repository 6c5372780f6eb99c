"""`qprof demo`: qprof's main job on a real QUIC transfer, with nothing to set up.

An ngtcp2 server and client run in two network namespaces joined by a veth
pair (qprof.netlab: a real link between two hosts, built and removed by the
demo), recorded as `qprof record` runs any pair (qprof.benchmark): both held from
exec, the client released once the server's UDP port is bound, collection
stopped when the download ends; the report ends with the verdict.
Where namespaces cannot be made (not root, no `ip`), it says so and runs the
same transfer on loopback.
"""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path
from typing import Callable, Iterator

from qprof.archive import Run
from qprof.collectors.session import AttachOptions
from qprof.endpoints import (free_udp_port, make_certificate, make_payload, ngtcp2_client_command,
                             ngtcp2_server_command, work_dir)
from qprof.errors import QprofError
from qprof.netlab import Lab, LabError
from qprof.ready import Ready
from qprof.benchmark import Command, RecordOptions, outcome_lines, record
from qprof.units import parse_size


@contextlib.contextmanager
def _place(status: Callable[[str], None], loopback: bool) -> Iterator[Lab | None]:
    if loopback:
        yield None
        return
    if shutil.which("ip") is None:
        status("no `ip` (iproute2): running on loopback instead of two network namespaces")
        yield None
        return
    try:
        lab = Lab()
        lab.__enter__()
    except (LabError, OSError) as e:
        status(f"cannot build the network namespaces ({e}): running on loopback")
        yield None
        return
    try:
        yield lab
    finally:
        lab.close()


def run_demo(size: str, out: Path, status: Callable[[str], None], loopback: bool = False) -> Path:
    """`qprof record` of the ngtcp2 pair: the run archive of one transfer."""
    nbytes = parse_size(size)
    with _place(status, loopback) as lab:
        host = "127.0.0.1" if lab is None else lab.server_addr
        port, workdir = free_udp_port(), work_dir()
        try:
            where = "loopback" if lab is None else \
                f"two network namespaces ({lab.client_addr} -> {lab.server_addr}, veth)"
            status(f"ngtcp2 server on {host}:{port} serving {size}, client in {where}")
            make_payload(workdir, nbytes)
            key, cert = make_certificate(workdir, (host,))
            place = lab.placements() if lab is not None else {}
            commands = [Command("server", tuple(ngtcp2_server_command(workdir, host, port, key, cert)),
                                place.get("server")),
                        Command("client", tuple(ngtcp2_client_command(host, port)), place.get("client"))]
            opts = RecordOptions(commands, out, ready=Ready("udp", port=port),
                                 attach=AttachOptions(pids=[], out=out))
            (rep,) = record(opts, status)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        for line in outcome_lines([rep], opts):
            status(line.removeprefix("qprof: error: "))
        if rep.path is None or rep.failures:
            raise QprofError("the demo's transfer failed" +
                             (f"; run archive kept in {rep.path}" if rep.path else ""))
        took = Run.open(rep.path).meta.client_s
        if took:
            # its goodput is the report's (attribution.transfer): one figure, printed once
            status(f"transfer of {size} done: the client ran {took:.2f} s, start-up and handshake included")
    return rep.path
