"""`qprof demo`: qprof's main job on a real QUIC transfer, with nothing to set up.

An ngtcp2 server and a stopped client are started on loopback, both are
attached, the client is released once sampling runs, and collection stops when
the download ends; the server is then shut down.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from qprof.collectors.session import AttachOptions, AttachSession
from qprof.endpoints import Ngtcp2Transfer, parse_size
from qprof.errors import QprofError


def run_demo(size: str, out: Path, status: Callable[[str], None]) -> Path:
    nbytes = parse_size(size)
    with Ngtcp2Transfer(nbytes) as xfer:
        status(f"starting ngtcp2 server on 127.0.0.1:{xfer.port} serving {size}")
        server = xfer.start_server()
        client = xfer.start_client_stopped()
        opts = AttachOptions(pids=[server, client], out=out, roles={server: "server", client: "client"})
        path = AttachSession(opts, on_ready=xfer.release_client, stop_when=xfer.client_done,
                             status=status).run()
        if xfer.client is not None and xfer.client.returncode:
            raise QprofError(f"the ngtcp2 client failed (exit {xfer.client.returncode}); run archive kept in {path}")
        g = xfer.goodput_gbps()
        if g is not None:
            status(f"transfer of {size} done: {g:.2f} Gbit/s goodput (client wall time, profiled)")
    return path
