"""Write a `qprof study` file for the stacks the tests build: `python -m lab.endpoints.studyfile DIR STACK...`.

The test endpoints live in the build cache under content-hashed names, and the
ngtcp2 pair (Debian's gtlsserver/gtlsclient) needs a payload file and a
certificate; this builds (or reuses) each named stack, makes the certificate
and payload in DIR and prints a study file naming them, one [stacks.NAME] per
stack, `ngtcp2` for the Debian pair. Settings are left to the caller
(`--setting NAME` repeated: empty settings; edit the file for variations).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from qprof.endpoints import make_certificate, make_payload

from .build import build

NGTCP2_SERVER = ("gtlsserver -q --no-quic-dump --no-http-dump {server_args} -d {dir} 127.0.0.1 {port} "
                 "{key} {cert}")
NGTCP2_CLIENT = ("gtlsclient -q --no-quic-dump --no-http-dump --exit-on-all-streams-close {client_args} "
                 "127.0.0.1 {port} https://127.0.0.1:{port}/payload")


def _quoted(argv: list[str]) -> str:
    return shlex.join(argv).replace("PORT", "{port}")


def study_text(directory: Path, stacks: list[str], nbytes: int, reps: int, seed: int, settings: list[str]) -> str:
    directory.mkdir(parents=True, exist_ok=True)
    key, cert = make_certificate(directory)
    lines = [f"seed = {seed}", f"repetitions = {reps}", "", "[vars]", f'dir = "{directory}"',
             f'key = "{key}"', f'cert = "{cert}"', "", "[record]", 'ready = "udp:{port}"', ""]
    for name in stacks:
        if name == "ngtcp2":
            make_payload(directory, nbytes)
            server, client = NGTCP2_SERVER, NGTCP2_CLIENT
        else:
            b = build(name)
            server = _quoted(b.server("127.0.0.1:PORT", cert, key)) + " {server_args}"
            client = _quoted(b.client("127.0.0.1:PORT", nbytes)) + " {client_args}"
        lines += [f"[stacks.{name}]", f"server = {_toml(server)}", f"client = {_toml(client)}", ""]
    for s in settings:
        lines += [f"[settings.{s}]", ""]
    return "\n".join(lines)


def _toml(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.endpoints.studyfile", description=__doc__.splitlines()[0])
    ap.add_argument("dir", type=Path, help="where the certificate and the ngtcp2 payload go")
    ap.add_argument("stacks", nargs="+")
    ap.add_argument("--bytes", type=int, default=512 << 20)
    ap.add_argument("--repetitions", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--setting", action="append", default=[])
    a = ap.parse_args(argv)
    sys.stdout.write(study_text(a.dir.resolve(), a.stacks, a.bytes, a.repetitions, a.seed, a.setting or ["default"]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
