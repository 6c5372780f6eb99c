"""An OpenTelemetry Collector for the OTLP tests, built from its Go modules and cached by content.

main.go assembles the collector's core at one release (v0.161.0: the OTLP
receiver, the service, the env and file config providers) with the contrib
file exporter, which writes what it received as JSON lines; go.mod and go.sum
pin every module. The build lands in the endpoints' cache
(lab.endpoints.build.cached), keyed by these sources and the Go toolchain, so
a test run builds it at most once (about a minute on 2 CPUs once the modules
are downloaded).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from lab.endpoints.build import BuildError, cached, go_command, tree_hash

HERE = Path(__file__).resolve().parent
FEATURE_GATES = "service.profilesSupport"  # the profiles signal is behind this gate at this release


def binary() -> Path:
    """The collector's executable (built now if these sources or the toolchain changed)."""
    go = go_command("the OTLP tests build an OpenTelemetry Collector from its Go modules (Go >= 1.26)")
    version = subprocess.run([go, "version"], capture_output=True, text=True).stdout.strip()

    def make(out: Path) -> None:
        r = subprocess.run([go, "build", "-trimpath", "-mod=readonly", "-buildvcs=false", "-o",
                            str(out / "qprof-otelcol"), "."], cwd=HERE, capture_output=True, text=True,
                           env=dict(os.environ, CGO_ENABLED="0"))
        if r.returncode != 0:
            raise BuildError(f"go build of the collector failed:\n{r.stderr[-3000:]}")

    out, _ = cached("otelcol", tree_hash("otelcol", version, HERE, []), make)
    return out / "qprof-otelcol"


def config(port: int, out: Path) -> str:
    """A collector configuration: OTLP/HTTP on 127.0.0.1:port, profiles written to `out` (JSON lines)."""
    return f"""receivers:
  otlp:
    protocols:
      http:
        endpoint: 127.0.0.1:{port}
exporters:
  file:
    path: {out}
    flush_interval: 100ms
service:
  telemetry:
    metrics:
      level: none
  pipelines:
    profiles:
      receivers: [otlp]
      exporters: [file]
"""
