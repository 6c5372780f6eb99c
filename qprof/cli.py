"""The `qprof` command line."""

from __future__ import annotations

import json
import sys
from datetime import datetime
from pathlib import Path
from typing import Any, Callable

import click
from rich.console import Console

from qprof.errors import QprofError

_stderr = Console(stderr=True, highlight=False)


def _fail(msg: str) -> None:
    click.echo(f"qprof: error: {msg}", err=True)
    sys.exit(2)


def _guard(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn QprofError into one line on stderr and exit 2: no tracebacks for bad input."""
    import functools

    @functools.wraps(fn)
    def wrapper(*a: Any, **kw: Any) -> Any:
        try:
            return fn(*a, **kw)
        except QprofError as e:
            _fail(str(e))
        except KeyboardInterrupt:
            _fail("interrupted")
        except BrokenPipeError:
            sys.exit(1)

    return wrapper


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="qprof")
def main() -> None:
    """Profile QUIC endpoints and attribute their CPU time: Packet I/O, Crypto,
    Connection Mgmt, I/O, Uncategorized.

    \b
    qprof attach PID...      sample running endpoints, write a run archive
    qprof report RUN         attribute and print (or --format json)
    qprof demo               profile a real ngtcp2 transfer on loopback
    """


def _default_out() -> Path:
    return Path(f"qprof-run-{datetime.now().strftime('%Y%m%d-%H%M%S')}")


@main.command()
@click.argument("pids", nargs=-1, required=True, type=int)
@click.option("-d", "--duration", type=float, default=None,
              help="Seconds to sample; default: until Ctrl-C or every target exits.")
@click.option("-o", "--output", "out", type=click.Path(path_type=Path), default=None,
              help="Run directory to create (default: ./qprof-run-DATE-TIME).")
@click.option("-F", "--frequency", type=int, default=999, show_default=True, help="Samples per second per thread.")
@click.option("--unwind", type=click.Choice(["auto", "fp", "dwarf"]), default="auto", show_default=True,
              help="Stack unwinding: auto picks frame pointers when the binary keeps them, DWARF otherwise.")
@click.option("--probes", "probes", default="default", show_default=True,
              help="eBPF probe groups beside sampling: default (packetio), none, or a comma list of "
                   "packetio, syscalls (opt-in: per-call syscall durations).")
@click.option("-q", "--quiet", is_flag=True, help="Print only the run directory.")
@_guard
def attach(pids: tuple[int, ...], duration: float | None, out: Path | None, frequency: int,
           unwind: str, probes: str, quiet: bool) -> None:
    """Sample running QUIC endpoints (all threads, kernel and user stacks) and write a run archive.

    Stops at --duration, on Ctrl-C, or when every target has exited; the
    archive keeps whatever was collected. Needs root (perf sampling of other
    processes' kernel stacks).
    """
    from qprof.collectors.probes import parse_groups
    from qprof.collectors.session import AttachOptions, AttachSession

    opts = AttachOptions(pids=list(pids), out=out or _default_out(), duration=duration,
                         frequency=frequency, unwind=unwind, probes=parse_groups(probes))
    status = (lambda m: None) if quiet else (lambda m: _stderr.print(f"[dim]qprof: {m}[/dim]"))
    path = AttachSession(opts, status=status).run()
    click.echo(str(path))
    if not quiet:
        _stderr.print(f"qprof: run archive written; read it with: qprof report {path}")


@main.command()
@click.argument("run", type=click.Path(path_type=Path))
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("-m", "--mapping", "mappings", multiple=True, type=click.Path(),
              help="Extra mapping file (TOML), taking precedence over shipped ones; repeatable.")
@click.option("--top", type=int, default=5, show_default=True, help="Top symbols shown per category.")
@click.option("--refold", is_flag=True,
              help="Re-run perf script on the run's perf data (on the host that recorded it).")
@_guard
def report(run: Path, fmt: str, mappings: tuple[str, ...], top: int, refold: bool) -> None:
    """Attribute a run's samples to categories and print them."""
    print_report(run, fmt, list(mappings), top, refold)


def print_report(run_path: Path, fmt: str, mappings: list[str], top: int, refold: bool = False) -> None:
    from qprof.attribution.analysis import analyse_run
    from qprof.attribution.mapping import MappingSet
    from qprof.collectors.archive import Run

    if top < 1:
        raise QprofError("--top must be at least 1")
    run = Run.open(run_path)
    if refold:
        _refold(run)
    if not run.has_stacks():
        raise QprofError(f"{run_path} has no folded stacks (collection was cut short: {run.meta.get('status')}); "
                         f"run `qprof report --refold {run_path}` on the host that recorded it")
    analysis = analyse_run(run, MappingSet.load(mappings))
    if fmt == "json":
        from qprof.viewer.json_report import to_dict

        click.echo(json.dumps(to_dict(analysis, top), indent=1))
    else:
        from qprof.viewer.terminal import render

        render(analysis, Console(highlight=False), top)


def _refold(run: Any) -> None:
    from qprof.collectors import archive
    from qprof.collectors.session import fold_run
    from qprof.probes.features import require_perf

    stats = fold_run(require_perf(), run.path, run.meta)
    run.meta["parse"] = {"samples": stats.samples, "bad_lines": stats.bad_lines,
                         "bad_examples": stats.bad_examples}
    archive.write_json_atomic(run.path / archive.META, run.meta)
    _stderr.print(f"qprof: refolded {stats.samples} samples")


@main.command()
@click.option("--size", default="1G", show_default=True, help="Bytes to transfer (e.g. 256M, 1G).")
@click.option("-o", "--output", "out", type=click.Path(path_type=Path), default=None,
              help="Keep the run archive here (default: ./qprof-run-DATE-TIME).")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@_guard
def demo(size: str, out: Path | None, fmt: str) -> None:
    """Profile a real QUIC transfer: ngtcp2 server and client on loopback, both attached."""
    from qprof.demo import run_demo

    path = run_demo(size, out or _default_out(), status=lambda m: _stderr.print(f"[dim]qprof demo: {m}[/dim]"))
    print_report(path, fmt, [], 5)


if __name__ == "__main__":
    main()
