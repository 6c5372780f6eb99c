"""`qprof demo`: qprof's main job on a real QUIC transfer, with nothing to set up.

An ngtcp2 server and a held client run in two network namespaces joined by a
veth pair (qprof.netlab: a real link between two hosts, built and removed by
the demo); both are attached, the client is released once sampling runs,
collection stops when the download ends, and the report ends with the verdict.
Where namespaces cannot be made (not root, no `ip`), it says so and runs the
same transfer on loopback.
"""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path
from typing import Callable, Iterator

from qprof.collectors.session import AttachOptions, AttachSession
from qprof.endpoints import Ngtcp2Transfer, parse_size
from qprof.errors import QprofError
from qprof.netlab import Lab, LabError


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
    nbytes = parse_size(size)
    with _place(status, loopback) as lab:
        xfer = Ngtcp2Transfer(nbytes) if lab is None else \
            Ngtcp2Transfer(nbytes, host=lab.server_addr, placement=lab.placements())
        with xfer:
            where = "loopback" if lab is None else \
                f"two network namespaces ({lab.client_addr} -> {lab.server_addr}, veth)"
            status(f"ngtcp2 server on {xfer.host}:{xfer.port} serving {size}, client in {where}")
            server = xfer.start_server()
            client = xfer.start_client_stopped()
            opts = AttachOptions(pids=[server, client], out=out, roles={server: "server", client: "client"})
            path = AttachSession(opts, on_ready=xfer.release_client, stop_when=xfer.client_done,
                                 status=status).run()
            if xfer.client is not None:
                xfer.client.wait(60)
                if xfer.client.returncode:
                    raise QprofError(f"the ngtcp2 client failed (exit {xfer.client.returncode}); "
                                     f"run archive kept in {path}")
            xfer.client_done()
            g = xfer.goodput_gbps()
            if g is not None:
                status(f"transfer of {size} done: {g:.2f} Gbit/s goodput (client wall time, profiled)")
    return path
