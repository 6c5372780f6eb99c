"""`qprof demo`: qprof's main job on a real QUIC transfer, with nothing to set up.

An ngtcp2 server and client run in two network namespaces joined by a veth
pair (qprof.netlab: a real link between two hosts, built and removed by the
demo), recorded as `qprof record` runs any pair (qprof.record): both held from
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

from qprof.collectors.archive import Run
from qprof.collectors.session import AttachOptions
from qprof.endpoints import Ngtcp2Transfer, make_certificate, parse_size
from qprof.errors import QprofError
from qprof.netlab import Lab, LabError
from qprof.ready import Ready
from qprof.record import Command, RecordOptions, outcome_lines, record


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
        xfer = Ngtcp2Transfer(nbytes) if lab is None else Ngtcp2Transfer(nbytes, host=lab.server_addr)
        with xfer:
            where = "loopback" if lab is None else \
                f"two network namespaces ({lab.client_addr} -> {lab.server_addr}, veth)"
            status(f"ngtcp2 server on {xfer.host}:{xfer.port} serving {size}, client in {where}")
            key, cert = make_certificate(xfer.workdir, (xfer.host,))
            place = lab.placements() if lab is not None else {}
            commands = [Command("server", tuple(xfer.server_command(key, cert)), place.get("server")),
                        Command("client", tuple(xfer.client_command()), place.get("client"))]
            opts = RecordOptions(commands, out, ready=Ready("udp", port=xfer.port),
                                 attach=AttachOptions(pids=[], out=out))
            (rep,) = record(opts, status)
            for line in outcome_lines([rep], opts):
                status(line.removeprefix("qprof: error: "))
            if rep.path is None or rep.failures:
                raise QprofError("the demo's transfer failed" +
                                 (f"; run archive kept in {rep.path}" if rep.path else ""))
            took = Run.open(rep.path).meta.get("record", {}).get("client_s")
            if took:
                status(f"transfer of {size} done: {nbytes * 8 / took / 1e9:.2f} Gbit/s goodput "
                       "(client wall time, profiled)")
    return rep.path
