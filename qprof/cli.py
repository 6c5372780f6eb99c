"""The `qprof` command line."""

from __future__ import annotations

import functools
import os
import sys
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import click

from qprof.collectors.perf import DEFAULT_FREQUENCY
from qprof.errors import QprofError

if TYPE_CHECKING:
    from qprof.archive import Run
    from rich.console import Console

    from qprof.archive.model import Service
    from qprof.attribution.mapping import MappingSet
    from qprof.collectors.session import AttachOptions
    from qprof.viewer.outputs import Output, Rendered, Request

@functools.lru_cache(maxsize=1)
def _stderr() -> "Console":
    """The rich console of stderr's messages, made at the first one: attach's status lines are plain
    text, and importing rich was ~25 ms of CPU in every attach."""
    from qprof.viewer.console import text_console

    return text_console(stderr=True)


def _fail(msg: str) -> None:
    click.echo(f"qprof: error: {msg}", err=True)
    sys.exit(2)


def _guard(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn QprofError into one line on stderr and exit 2: no tracebacks for bad input."""
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


class _OneLineGroup(click.Group):
    """Usage errors (a bad option, a pid that is not a number) in the same one-line form as
    every other error: `qprof: error: ...` and exit 2, instead of click's usage block."""

    def main(self, *args: Any, **kwargs: Any) -> Any:
        # numpy's OpenBLAS starts a thread per CPU that spins a while once loaded: ~0.07 CPU s of every
        # report, whose arrays are far too small for threaded BLAS. Set before anything loads numpy.
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
        kwargs["standalone_mode"] = False
        try:
            rv = super().main(*args, **kwargs)
        except click.ClickException as e:
            # a usage error knows its command (click sets ctx on UsageError and its subclasses only)
            where = f" (see `{e.ctx.command_path} --help`)" if isinstance(e, click.UsageError) and e.ctx is not None \
                else ""
            _fail(e.format_message() + where)
        except click.exceptions.Abort:
            _fail("interrupted")
        sys.exit(rv if isinstance(rv, int) else 0)


@click.group(cls=_OneLineGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="qprof")
def main() -> None:
    """Profile QUIC endpoints and attribute their CPU time: Packet I/O, Crypto,
    Connection Mgmt, I/O, Uncategorized.

    \b
    qprof attach PID...      sample running endpoints, write a run archive
    qprof record ...         run a benchmark's server and client under qprof, N times
    qprof report RUN         attribute and print (or --format json)
    qprof flamegraph RUN     flame graph coloured by category (SVG, HTML, speedscope);
                             --off-cpu: the wall time, by what the threads waited for
    qprof diff RUN_A RUN_B   what changed between two runs, per category and symbol
    qprof table RUN...       many runs side by side, CSV/parquet, median and CI, --chart
    qprof export RUN --otlp  send a run's profiles to an OpenTelemetry Collector
    qprof study STUDY.toml   stacks x settings x repetitions, interleaved, resumable
    qprof demo               profile a real ngtcp2 transfer (two namespaces)
    qprof doctor             what this host lets qprof do
    qprof mappings, coverage mapping files and what they miss
    """


def _default_out() -> Path:
    return Path(f"qprof-run-{datetime.now().strftime('%Y%m%d-%H%M%S')}")


def _probes_help() -> str:
    """`--probes`'s help, from the groups' registry: every group with what it measures and costs."""
    from qprof.probes.registry import DEFAULT_GROUPS, GROUPS

    listing = "; ".join(f"{g.name}{'' if g.default else ' (opt-in)'}: {g.summary}" for g in GROUPS.values())
    return (f"eBPF probe groups beside sampling: default ({', '.join(DEFAULT_GROUPS)}), none, or a comma "
            f"list of groups. {listing}.")


class _LazyHelpOption(click.Option):
    """An option whose help is made when help is shown: listing the outputs or the probe groups
    imports the viewer or the groups' registry, which cost every `attach` ~0.1 CPU s at start-up
    (bench/footprint.py) for a text it never printed."""

    def __init__(self, *args: Any, make_help: Callable[[], str], **kw: Any) -> None:
        super().__init__(*args, **kw)
        self._make_help = make_help

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        if self.help is None:
            self.help = self._make_help()
        return super().get_help_record(ctx)


def _sampling_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The options of `attach` that `record` shares: how to sample and what to keep."""
    options = [
        click.option("-d", "--duration", type=float, default=None,
                     help="Seconds to sample; default: until Ctrl-C or every target exits."),
        click.option("-F", "--frequency", type=int, default=DEFAULT_FREQUENCY, show_default=True,
                     help="Samples per second per busy CPU (each costs the task it interrupts ~20 us on a VM)."),
        click.option("--unwind", type=click.Choice(["auto", "fp", "dwarf"]), default="auto", show_default=True,
                     help="Stack unwinding: auto picks frame pointers when the binary keeps them, DWARF otherwise."),
        click.option("--scope", type=click.Choice(["auto", "cgroup", "system"]), default="auto", show_default=True,
                     help="cgroup: perf samples each target on its own CPU time (through a perf_event cgroup "
                          "qprof moves it into and back out of); system: perf samples every CPU on wall-clock "
                          "ticks and qprof keeps the targets' samples, which misplaces work that starts when a "
                          "target wakes; auto: cgroup when one can be set up, else system."),
        click.option("--probes", "probes", default="default", show_default=True, cls=_LazyHelpOption,
                     make_help=_probes_help),
        click.option("--keep-raw", is_flag=True,
                     help="Keep all raw perf data (by default each chunk is deleted once folded into stacks)."),
        click.option("--raw-budget", default="256M", show_default=True,
                     help="Unfolded perf data allowed on disk before the oldest chunk is dropped (e.g. 512M, 2G)."),
        click.option("--chunk-size", default="64M", show_default=True,
                     help="perf data is folded in chunks of this size while sampling goes on."),
        click.option("--otlp", "otlp", default=None, metavar="URL",
                     help="When the run ends, also send its profiles to this OpenTelemetry Collector (OTLP/HTTP, "
                          "e.g. http://127.0.0.1:4318), as `qprof export` does."),
        click.option("-q", "--quiet", is_flag=True,
                     help="Print only the run directory (no live panel; it also stays off when stdout is not a "
                          "terminal)."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _attach_options(pids: list[int], out: Path, roles: dict[int, str], duration: float | None, frequency: int,
                    unwind: str, scope: str, probes: str, keep_raw: bool, raw_budget: str,
                    chunk_size: str) -> "AttachOptions":
    from qprof.collectors.probing import parse_groups
    from qprof.collectors.session import AttachOptions
    from qprof.units import parse_size

    return AttachOptions(pids=pids, out=out, duration=duration, frequency=frequency, unwind=unwind,
                         probes=parse_groups(probes), roles=roles, scope=scope, keep_raw=keep_raw,
                         raw_budget=parse_size(raw_budget), chunk_bytes=parse_size(chunk_size))


def _watching(quiet: bool, run: Callable[[Callable[[str], None], Any], Any]) -> Any:
    """Run `run(status, on_tick)` with the live panel on a terminal, status lines on stderr otherwise."""
    if not quiet and sys.stdout.isatty():
        from qprof.viewer.console import text_console
        from qprof.viewer.live import LiveView

        with LiveView(text_console()) as view:
            return run(view.status, view.tick)
    # styles go only to a terminal (click strips them elsewhere)
    return run((lambda m: None) if quiet else (lambda m: click.echo(click.style(f"qprof: {m}", dim=True), err=True)),
               None)


@main.command()
@click.argument("pids", nargs=-1, type=int)
@click.option("--server", "servers", multiple=True, type=int, help="A server endpoint's pid (for the verdict).")
@click.option("--client", "clients", multiple=True, type=int, help="A client endpoint's pid (for the verdict).")
@click.option("--cgroup", "cgroups", multiple=True, metavar="PATH",
              help="Every process of this cgroup (a service's, a container's), followed as workers start and "
                   "exit; its directory or its path as /proc/PID/cgroup shows it. Nothing in it is moved.")
@click.option("--server-cgroup", "server_cgroups", multiple=True, metavar="PATH",
              help="As --cgroup, every process in it a server.")
@click.option("--client-cgroup", "client_cgroups", multiple=True, metavar="PATH",
              help="As --cgroup, every process in it a client.")
@click.option("--unit", "units", multiple=True, metavar="NAME",
              help="A systemd unit's cgroup, as --cgroup (where systemd runs).")
@click.option("--server-unit", "server_units", multiple=True, metavar="NAME", help="As --unit, a server.")
@click.option("--client-unit", "client_units", multiple=True, metavar="NAME", help="As --unit, a client.")
@click.option("-o", "--output", "out", type=click.Path(path_type=Path), default=None,
              help="Run directory to create (default: ./qprof-run-DATE-TIME).")
@click.option("--until-idle", "until_idle", type=float, default=None, metavar="SECONDS",
              help="Also stop once every target that worked has been idle this long (no bytes moved, under "
                   "2% of a core): a benchmark's end, when its endpoints stay up.")
@_sampling_options
@_guard
def attach(pids: tuple[int, ...], servers: tuple[int, ...], clients: tuple[int, ...], cgroups: tuple[str, ...],
           server_cgroups: tuple[str, ...], client_cgroups: tuple[str, ...], units: tuple[str, ...],
           server_units: tuple[str, ...], client_units: tuple[str, ...], until_idle: float | None,
           duration: float | None, out: Path | None, frequency: int, unwind: str, scope: str, probes: str,
           keep_raw: bool, raw_budget: str, chunk_size: str, otlp: str | None, quiet: bool) -> None:
    """Sample running QUIC endpoints (all threads, kernel and user stacks) and write a run archive.

    Give endpoints as PIDs, or as --server PID / --client PID so the report can
    judge which side limits the run; a service as the cgroup or systemd unit it
    runs in (--cgroup, --unit; with a role: --server-cgroup ...), whose
    processes are all followed, workers started during the run included.

    Stops at --duration, on Ctrl-C, when every target has exited, or (with
    --until-idle) when their work has ended; the archive keeps whatever was
    collected and says what stopped it. Needs root (perf sampling of other
    processes' kernel stacks).
    """
    from qprof.collectors.session import AttachSession

    if otlp is not None:
        from qprof.export import endpoint  # http.client and ssl: ~16 ms an attach that sends nothing

        endpoint(otlp)  # a bad URL is refused before the run, not after
    roles = {**{p: "server" for p in servers}, **{p: "client" for p in clients}}
    opts = _attach_options([*servers, *clients, *pids], out or _default_out(), roles, duration, frequency, unwind,
                           scope, probes, keep_raw, raw_budget, chunk_size)
    opts.until_idle = until_idle
    opts.services = _services({None: cgroups, "server": server_cgroups, "client": client_cgroups},
                              {None: units, "server": server_units, "client": client_units})
    path = _watching(quiet, lambda status, tick: AttachSession(opts, status=status, on_tick=tick).run())
    click.echo(str(path))
    if not quiet:
        click.echo(f"qprof: run archive written; read it with: qprof report {path}", err=True)  # rich: ~25 ms
    if otlp is not None:
        _export(path, otlp)


def _services(cgroups: dict[str | None, tuple[str, ...]], units: dict[str | None, tuple[str, ...]]
              ) -> "list[Service]":
    """The services to follow, each resolved to its cgroup now: a wrong name fails before the run."""
    from qprof.collectors.service import resolve_cgroup, resolve_unit, v2_hierarchy

    if not any(cgroups.values()) and not any(units.values()):
        return []
    h = v2_hierarchy()
    found = [resolve_cgroup(c, h, role) for role, cs in cgroups.items() for c in cs]
    found += [resolve_unit(u, h, role) for role, us in units.items() for u in us]
    names = [s.name for s in found]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise QprofError(f"cgroup {', '.join(twice)} is named twice: give each service once, with one role")
    return found


@main.command(context_settings={"allow_interspersed_args": False})
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@click.option("--server", default=None, metavar="'CMD ARGS'",
              help="The server command, one quoted string; started held, released once sampling runs.")
@click.option("--client", default=None, metavar="'CMD ARGS'",
              help="The client command, one quoted string; released once the server is ready.")
@click.option("--ready", "ready_spec", default="auto", show_default=True,
              help="When the server is ready: auto (a listening TCP or bound UDP socket), udp:PORT, tcp:PORT, "
                   "line:REGEX (its output) or delay:SECONDS.")
@click.option("--ready-timeout", type=float, default=30.0, show_default=True,
              help="Seconds the server gets to be ready.")
@click.option("-n", "--repeat", type=int, default=1, show_default=True,
              help="Repetitions; each is one run archive (DIR/rep-NN when more than one).")
@click.option("-o", "--output", "out", type=click.Path(path_type=Path), default=None,
              help="Directory to create (default: ./qprof-run-DATE-TIME, ./qprof-record-DATE-TIME when repeated).")
@click.option("--role", type=click.Choice(["server", "client"]), default=None,
              help="With one command after `--`: its role, so `qprof diff` pairs it with another run's same side.")
@_sampling_options
@_guard
def record(command: tuple[str, ...], server: str | None, client: str | None, ready_spec: str, ready_timeout: float,
           repeat: int, out: Path | None, role: str | None, duration: float | None, frequency: int, unwind: str,
           scope: str, probes: str, keep_raw: bool, raw_budget: str, chunk_size: str, otlp: str | None,
           quiet: bool) -> None:
    """Run a benchmark under qprof: --server 'CMD' --client 'CMD', or one command after `--`.

    \b
    Each command starts held right after exec; the server is released once
    sampling and probes are live, the client once the server is ready
    (--ready); the run stops when the client exits, then the server is
    stopped. With --repeat N, one archive per repetition, then the `qprof
    table` summary over them. A command that cannot start, exits before it is
    ready, never gets ready or fails stops the series with one line; the
    archives written before stay.
    """
    from qprof.ready import parse_ready
    from qprof.benchmark import RecordOptions, commands_of, outcome_lines, record as run_record, recorded_runs

    default = Path(f"qprof-record-{datetime.now().strftime('%Y%m%d-%H%M%S')}") if repeat > 1 else _default_out()
    opts = RecordOptions(commands_of(server, client, command), out or default, repeat,
                         parse_ready(ready_spec, ready_timeout) if server else parse_ready("auto"),
                         _attach_options([], Path(), {}, duration, frequency, unwind, scope, probes, keep_raw,
                                         raw_budget, chunk_size), role)
    if ready_spec != "auto" and not server:
        raise QprofError("--ready needs --server and --client: one command alone is released at once")
    if otlp is not None:
        from qprof.export import endpoint

        endpoint(otlp)
    reps = _watching(quiet, lambda status, tick: run_record(opts, status, tick))
    runs = recorded_runs(reps)
    for r in runs:
        click.echo(str(r))
    if runs:
        _print_summary(runs)
    if otlp is not None:
        for r in runs:
            _export(r, otlp)
    problems = outcome_lines(reps, opts)
    for line in problems:
        click.echo(line, err=True)
    if problems:
        sys.exit(2)


def _print_summary(runs: list[Path]) -> None:
    """`qprof table`'s view of runs just recorded: one line per run and process, then the summary."""
    from qprof.attribution.mapping import MappingSet

    _write_table([_open_run(r) for r in runs], MappingSet.load([]), None)


def _format_help(kind: str) -> str:
    from qprof.viewer.outputs import of_kind

    def one(o: "Output") -> str:
        return f"{o.name}: {o.summary}" + (f" (-o {', '.join('*' + x for x in o.suffixes)})" if o.suffixes else "")

    return "; ".join(one(o) for o in of_kind(kind))


@main.command()
@click.argument("runs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--format", "fmt", default=None, cls=_LazyHelpOption,
              make_help=lambda: "What to write, by name (default: from -o's suffix, else text): "
              + _format_help("report") + ".")
@click.option("-o", "--output", "out", type=click.Path(path_type=Path), default=None,
              help="Write to this file instead of stdout; its suffix picks the format when --format is not given.")
@click.option("-m", "--mapping", "mappings", multiple=True, type=click.Path(),
              help="Extra mapping file (TOML), taking precedence over shipped ones; repeatable.")
@click.option("--top", type=int, default=5, show_default=True, help="Top symbols shown per category.")
@click.option("--stack", default=None,
              help="Use this stack's mapping file instead of auto-detection (see `qprof mappings`).")
@click.option("--refold", is_flag=True,
              help="Re-run perf script on the run's perf data (on the host that recorded it).")
@click.option("--qlog", "qlog", type=click.Path(path_type=Path), default=None,
              help="Directory of the endpoints' qlog files (e.g. quic-go's QLOGDIR): the stack's own record of "
                   "why its sender waited, shown beside the verdict.")
@click.option("--timeline", is_flag=True,
              help="Also each target's CPU by category, goodput and (waits probes) its threads' wall clock by "
                   "state over the run (text: a table per target; json: a `timeline` object).")
@click.option("-v", "--verbose", is_flag=True,
              help="Text: also how interrupt skid was placed and each mapping file's path and version "
                   "(always in the JSON).")
@_guard
def report(runs: tuple[Path, ...], fmt: str | None, out: Path | None, mappings: tuple[str, ...], top: int,
           stack: str | None, refold: bool, timeline: bool, qlog: Path | None, verbose: bool) -> None:
    """Attribute runs' samples to categories and print them, with the verdict when the
    targets have roles. Give two runs (server and client recorded on two hosts) for one verdict."""
    print_report(list(runs), fmt, list(mappings), top, refold, stack, timeline, qlog, verbose, out)


def _open_run(run_path: Path, refold: bool = False) -> "Run":
    from qprof.archive import Run

    run = Run.open(run_path)
    if not refold and not run.has_stacks() and run.unfolded_chunks() and run.fold_refusal() is None:
        # killed before its first chunk was folded: the raw data is here, on the host that recorded it
        click.echo(f"qprof: {run_path} was cut short before any perf data was folded: folding it now "
                   "(as --refold does)", err=True)
        refold = True
    if refold:
        _refold(run)
    run.require_stacks()
    status, reason = run.status
    if status != "complete":
        click.echo(f"qprof: warning: {run_path} is {status}" + (f": {reason}" if reason else ""), err=True)
    unfolded = run.unfolded_chunks()
    if unfolded:
        click.echo(f"qprof: warning: {len(unfolded)} perf data chunk(s) of {run_path} are not folded yet; "
                   f"`qprof report --refold {run_path}` adds them", err=True)
    return run


def _emit(name: str, rendered: "Rendered", out: Path | None, path_on_stdout: bool = True) -> None:
    """An output (viewer.outputs.Rendered) to stdout, or written whole to `out` with one line saying
    what was written (and its path on stdout, unless stdout carries another output)."""
    from qprof.viewer.output import write_atomic

    data = rendered.data
    if out is None:
        assert isinstance(data, str)
        click.echo(data, nl=False)
        return
    write_atomic(out, data)
    if path_on_stdout:
        click.echo(str(out))
    size = len(data.encode()) if isinstance(data, str) else len(data)
    what = f" {rendered.what}" if rendered.what else ""
    _stderr().print(f"qprof: {name}{what} written to {out} ({size:,} bytes)", markup=False, highlight=False)


def print_report(run_paths: list[Path], fmt: str | None, mappings: list[str], top: int, refold: bool = False,
                 stack: str | None = None, timeline: bool = False, qlog: Path | None = None,
                 verbose: bool = False, out: Path | None = None) -> None:
    """`qprof report`: the output chosen by name or -o's suffix (viewer.outputs), attributed once."""
    from qprof.attribution.mapping import MappingSet
    from qprof.attribution.qlog import read_dir
    from qprof.viewer.outputs import Request, choose, of_kind, render

    if top < 1:
        raise QprofError("--top must be at least 1")
    output = choose(fmt, out, of_kind("report"))
    if timeline and output.name not in ("text", "json"):
        raise QprofError(f"--timeline goes with --format text or json, not {output.name}")
    request = Request(top=top, verbose=verbose, timeline=timeline, colour=out is None and sys.stdout.isatty())
    ms = MappingSet.load(mappings if output.attributed else [])
    (rendered,) = render([(output, request)], [_open_run(p, refold) for p in run_paths], ms, stack,
                         read_dir(qlog) if qlog is not None else [])
    _emit(output.name, rendered, out)


@main.command()
@click.argument("run", type=click.Path(path_type=Path))
@click.option("-o", "--output", "out", type=click.Path(path_type=Path), default=None,
              help="File to write; its suffix picks the format: .svg (static, for papers; zoom and search "
                   "in a browser), .html (d3-flame-graph page), .speedscope.json (speedscope). "
                   "Default: RUN-flamegraph.svg next to the run.")
@click.option("--pid", type=int, default=None, help="Only this process.")
@click.option("--role", type=click.Choice(["server", "client"]), default=None,
              help="Only the target attached with this role.")
@click.option("--thread", "tid", type=int, default=None, help="Only this thread (its tid).")
@click.option("-m", "--mapping", "mappings", multiple=True, type=click.Path(),
              help="Extra mapping file (TOML), as for `qprof report`; repeatable.")
@click.option("--stack", default=None, help="Use this stack's mapping file instead of auto-detection.")
@click.option("--off-cpu", "off_cpu", is_flag=True,
              help="Draw the processes' wall time instead: on a CPU, runnable, and each kind of wait (network, "
                   "timer, thread, disk, other) with the call paths it blocked in, coloured by kind (the waits "
                   "probes; .svg or .html). Default file: RUN-offcpu.svg.")
@_guard
def flamegraph(run: Path, out: Path | None, pid: int | None, role: str | None, tid: int | None,
               mappings: tuple[str, ...], stack: str | None, off_cpu: bool) -> None:
    """Draw a run's flame graph, each frame coloured by the category its samples were attributed to
    (the attribution `qprof report` prints), with a legend of the categories' shares; with --off-cpu,
    where the wall time went, coloured by what the threads waited for."""
    from qprof.attribution.mapping import MappingSet
    from qprof.viewer.flametree import Selection
    from qprof.viewer.outputs import Request, by_suffix, of_kind, render

    sel = Selection(pid=pid, role=role, tid=tid)
    if out is None:
        here = run.resolve()
        out = here.parent / f"{here.name}-{'offcpu' if off_cpu else 'flamegraph'}{sel.slug()}.svg"
    output = by_suffix(out, tuple(o for o in of_kind("report") if o.flame))
    if off_cpu and output.name not in ("svg", "html"):
        raise QprofError(f"--off-cpu draws .svg or .html, not {output.name} (its tree weighs seconds, not samples)")
    (rendered,) = render([(output, Request(selection=sel, off_cpu=off_cpu))], [_open_run(run)],
                         MappingSet.load(mappings), stack)
    _emit(output.name, rendered, out)


@main.command()
@click.argument("run_a", type=click.Path(path_type=Path))
@click.argument("run_b", type=click.Path(path_type=Path))
@click.option("-o", "--output", "out", type=click.Path(path_type=Path), default=None,
              help="Also write an output to this file, its suffix picking it: .svg the differential flame graph (red "
                   "grew, blue shrank, width by RUN_B), .json or .txt the comparison.")
@click.option("--top", type=int, default=10, show_default=True, help="Symbols shown per process.")
@click.option("--format", "fmt", default="text", show_default=True, cls=_LazyHelpOption,
              make_help=lambda: _format_help("diff") + ".")
@click.option("-m", "--mapping", "mappings", multiple=True, type=click.Path(),
              help="Extra mapping file (TOML), applied to both runs; repeatable.")
@click.option("--stack", default=None, help="Use this stack's mapping file for both runs.")
@click.option("--pair", "pairs", multiple=True, metavar="A_PID:B_PID",
              help="Pair these processes (run A's pid, run B's); repeatable. Default: by role, else by name.")
@_guard
def diff(run_a: Path, run_b: Path, out: Path | None, top: int, fmt: str, mappings: tuple[str, ...],
         stack: str | None, pairs: tuple[str, ...]) -> None:
    """Compare two runs: per process (paired as --pair says, else by role, else by name), each category's and
    symbol's change in share of CPU time (percentage points) and in CPU seconds per GB it moved."""
    from qprof.attribution.mapping import MappingSet
    from qprof.viewer.outputs import Request, by_suffix, choose, of_kind, render

    if top < 1:
        raise QprofError("--top must be at least 1")
    outputs = of_kind("diff")
    request = Request(top=top, pairs=tuple(_pid_pair(p) for p in pairs), colour=sys.stdout.isatty())
    asked = [(choose(fmt, None, outputs), request)]
    if out is not None:
        asked.append((by_suffix(out, outputs), request))
    shown, *written = render(asked, [_open_run(run_a), _open_run(run_b)], MappingSet.load(mappings), stack)
    _emit(asked[0][0].name, shown, None)
    if out is not None:
        _emit(asked[1][0].name, written[0], out, path_on_stdout=False)


def _pid_pair(text: str) -> tuple[int, int]:
    a, sep, b = text.partition(":")
    if not (sep and a.strip().isdigit() and b.strip().isdigit()):
        raise QprofError(f"--pair {text!r}: give two pids as A_PID:B_PID (run A's process, run B's), e.g. 1234:5678")
    return int(a), int(b)


def _refold(run: "Run") -> None:
    from qprof import runfiles
    from qprof.collectors import chunks, functions
    from qprof.probes.features import require_perf

    stats, written = chunks.refold(require_perf(), run.path, run.meta.sampling.groups)
    if written is not None:
        run.hold_stacks(written)  # what the file now holds: not parsed back
    run.meta.parse = chunks.parse_summary(stats)
    run.save_meta()
    if not (run.path / runfiles.FUNCTIONS).exists():  # a run cut before its end recorded them
        # from the files this host holds, each used only if its build-id is the one the run mapped
        functions.write(run.path, functions.stack_frames(run.path / runfiles.STACKS), run.meta, lambda pid, path: None)
    _stderr().print(f"qprof: refolded {stats.samples} samples")


@main.command()
@click.argument("runs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--csv", "csv_out", type=click.Path(path_type=Path), default=None,
              help="Write the table (one row per run x process x category) as CSV here instead of printing it.")
@click.option("--parquet", "parquet_out", type=click.Path(path_type=Path), default=None,
              help="Write the table as parquet here instead of printing it.")
@click.option("--summary-csv", "summary_csv", type=click.Path(path_type=Path), default=None,
              help="Also write the summary (per configuration, side and category, with each configuration's "
                   "goodput and verdicts) as CSV here.")
@click.option("--summary-parquet", "summary_parquet", type=click.Path(path_type=Path), default=None,
              help="Also write the summary as parquet here.")
@click.option("--chart", "chart_out", type=click.Path(path_type=Path), default=None,
              help="Also draw the comparison chart here (.svg, a figure as is; .html, figures on hover): a bar "
                   "per configuration (as each run's meta.json records it) and side, stacked by category, "
                   "the median over repetitions with 95% whiskers, a panel in CPU seconds per GB and one of "
                   "each configuration's goodput.")
@click.option("-m", "--mapping", "mappings", multiple=True, type=click.Path(),
              help="Extra mapping file (TOML), taking precedence over shipped ones; repeatable.")
@click.option("--stack", default=None, help="Use this stack's mapping file instead of auto-detection.")
@_guard
def table(runs: tuple[Path, ...], csv_out: Path | None, parquet_out: Path | None, summary_csv: Path | None,
          summary_parquet: Path | None, chart_out: Path | None, mappings: tuple[str, ...], stack: str | None) -> None:
    """Many runs in one table: one row per run x process x category with the run's configuration,
    setting and repetition and its metadata (start, duration, host, frequency, unwinding, probes,
    stack, bytes, goodput, verdict).

    \b
    Then a summary over the runs, per configuration (each run's meta.json says
    which it repeats; runs of two configurations never pool): its goodput and
    the verdicts seen, and per side and category the median share and CPU
    seconds, each median with a 95% distribution-free confidence interval
    (order statistics; below 6 runs none, and it says how many it needs).
    A warning names what pooled runs did not share in method.
    """
    from qprof.attribution.mapping import MappingSet

    outputs = _one_output(csv_out, parquet_out, "--csv", "--parquet")
    summary_out = _one_output(summary_csv, summary_parquet, "--summary-csv", "--summary-parquet")
    if outputs and summary_out and outputs[0].resolve() == summary_out[0].resolve():
        raise QprofError(f"the table and the summary would both be written to {outputs[0]}: give two files")
    seen: set[Path] = set()
    for r in runs:
        if r.resolve() in seen:
            raise QprofError(f"run {r} is given twice: list each run once")
        seen.add(r.resolve())
    _write_table([_open_run(r) for r in runs], MappingSet.load(mappings), stack, outputs, summary_out, chart_out)


def _write_table(runs: "list[Run]", mappings: "MappingSet", stack: str | None,
                 table_out: tuple[Path, str] | None = None, summary_out: tuple[Path, str] | None = None,
                 chart_out: Path | None = None, show_summary: bool = False) -> None:
    """The table of runs (to a file or printed), its summary over them (to a file, and printed when it
    is not written or `show_summary`, with several runs) and the chart, from one attribution pass
    (viewer.outputs). What the summary warns of goes to stderr when no printed summary said it."""
    from qprof.viewer.outputs import Request, by_suffix, choose, of_kind, render

    kinds = of_kind("table")
    colour = sys.stdout.isatty()
    asked: list[tuple[tuple[Path | None, Output], Request]] = []
    targets: list[tuple[tuple[Path, str] | None, bool]] = [(table_out, False)]
    if len(runs) > 1:  # one run has nothing to summarize over
        targets += [(summary_out, True)] if summary_out is not None else []
        targets += [(None, True)] if summary_out is None or show_summary else []
    for target, summary in targets:
        path, fmt = target or (None, "text")
        asked.append(((path, choose(fmt, path, kinds)), Request(summary=summary, colour=colour)))
    if chart_out is not None:
        asked.append(((chart_out, by_suffix(chart_out, tuple(o for o in kinds if o.chart))), Request()))
    rendered = render([(o, req) for (_, o), req in asked], runs, mappings, stack)
    said = {n for ((path, _), _), r in zip(asked, rendered) if path is None for n in r.notices}
    for ((path, o), _), r in zip(asked, rendered):
        _emit(o.name, r, path, path_on_stdout=False)
        for n in r.notices if path is not None else ():
            if n not in said:
                said.add(n)
                _stderr().print(f"qprof: {'warning' if n.warning else 'note'}: {n.text}", markup=False,
                              highlight=False, style="bold yellow" if n.warning else None)


def _one_output(csv_path: Path | None, parquet_path: Path | None, csv_opt: str, parquet_opt: str
                ) -> tuple[Path, str] | None:
    if csv_path is not None and parquet_path is not None:
        raise QprofError(f"both {csv_opt} and {parquet_opt} given: choose one format")
    if csv_path is not None:
        return csv_path, "csv"
    return (parquet_path, "parquet") if parquet_path is not None else None


@main.command()
@click.argument("study_file", metavar="STUDY.toml", type=click.Path(path_type=Path))
@click.option("-o", "--output", "out", type=click.Path(path_type=Path), required=True,
              help="The study's directory: created, or resumed when it holds this study's plan.")
@click.option("--dry-run", is_flag=True, help="Print the plan (the runs in their order) and run nothing.")
@click.option("-q", "--quiet", is_flag=True, help="No live panel, no progress lines.")
@_guard
def study(study_file: Path, out: Path, dry_run: bool, quiet: bool) -> None:
    """Run a study: every stack x setting x repetition of STUDY.toml as a `record` run, in an order
    shuffled by its seed; then DIR/table.csv, DIR/summary.csv, DIR/chart.svg and the summary per
    configuration (goodput, verdicts seen) and per side and category.

    \b
    Resumable: run the same command again after Ctrl-C or a crash; finished
    runs are kept and skipped, an unfinished one is moved to DIR/.partial and
    run again. The file's format is in `docs/usage.md` (and qprof/study.py).
    """
    from qprof import study as S

    st = S.load(study_file)
    runs = S.plan(st)
    if dry_run:
        for r in runs:
            click.echo(f"{r.order:4d}  {r.stack:14s} {r.setting:14s} rep {r.rep}  "
                       f"{r.directory(out, st.repetitions)}")
        return
    progress = _watching(quiet, lambda status, tick: S.run(st, out, status, tick))
    if progress.skipped:
        _stderr().print(f"qprof: resumed {out}: {progress.skipped} finished run(s) kept"
                      + (f", {len(progress.moved_aside)} unfinished moved to {out / S.PARTIAL}"
                         if progress.moved_aside else ""), markup=False, highlight=False)
    if progress.stopped is not None:
        _fail(f"study {progress.stopped}; {len(progress.done)} of {len(runs)} runs finished and kept; "
              f"resume with: qprof study {study_file} -o {out}")
    from qprof.attribution.mapping import MappingSet

    _write_table([_open_run(d) for d in progress.done], MappingSet.load([]), None, (out / "table.csv", "csv"),
                 (out / "summary.csv", "csv"), out / "chart.svg", show_summary=True)


@main.command()
@click.argument("run", type=click.Path(path_type=Path))
@click.option("--otlp", "otlp", required=True, metavar="URL",
              help="The OpenTelemetry Collector's OTLP/HTTP address (e.g. http://127.0.0.1:4318; the profiles "
                   "path /v1development/profiles is added) or the full URL.")
@click.option("-m", "--mapping", "mappings", multiple=True, type=click.Path(),
              help="Extra mapping file (TOML), as for `qprof report`; repeatable.")
@click.option("--stack", default=None, help="Use this stack's mapping file instead of auto-detection.")
@_guard
def export(run: Path, otlp: str, mappings: tuple[str, ...], stack: str | None) -> None:
    """Send a run's samples to an OpenTelemetry Collector as OTLP profiles, with qprof's attribution
    as sample attributes (qprof.category, qprof.subcategory, qprof.role, qprof.stack, thread.id,
    thread.name) and the host, kernel and run as resource attributes. A collector that is down or
    busy (429, 502, 503, 504) is tried 5 times over ~8 s; the run directory is never changed."""
    _export(run, otlp, mappings, stack)


def _export(run: Path, url: str, mappings: tuple[str, ...] = (), stack: str | None = None) -> None:
    from qprof.attribution.mapping import MappingSet
    from qprof.export import endpoint, send
    from qprof.viewer.outputs import Request, of_kind, render

    endpoint(url)
    otlp = next(o for o in of_kind("report") if o.name == "otlp")
    (rendered,) = render([(otlp, Request())], [_open_run(run)], MappingSet.load(mappings), stack)
    assert isinstance(rendered.data, bytes)
    sent = send(url, rendered.data)
    refused = f"; the collector rejected {sent.rejected} profiles: {sent.message}" if sent.rejected else ""
    _stderr().print(f"qprof: sent {rendered.what} of {run} ({sent.bytes:,} bytes) to {sent.url}: HTTP {sent.status}"
                  + (f" after {sent.tries} tries" if sent.tries > 1 else "") + refused, markup=False, highlight=False)


@main.command()
@click.option("--pid", type=int, default=None, help="Also check this process's binaries (symbols, unwinding).")
def doctor(pid: int | None) -> None:
    """Check what this host lets qprof do; changes nothing.

    \b
    Exit status: 0 attach can run fully, 1 partly (sampling works, some
    probes do not), 2 not at all.
    """
    from rich.text import Text

    from qprof.doctor import NONE, OK, run_checks, verdict
    from qprof.viewer.console import text_console

    out = text_console()
    checks = run_checks(pid)
    for c in checks:
        mark, style = ("ok", "green") if c.ok else (("--", "dim") if c.needed_for == "information" else ("NO", "red"))
        line = Text(f"{mark:3s} {c.name}: {c.detail}", style=style)
        if not c.ok and c.fix:
            line.append(f"  (fix: {c.fix})", style="yellow")
        out.print(line)
    code = verdict(checks)
    out.print(Text({OK: "attach can run fully", NONE: "attach cannot run"}.get(code, "attach can run partly: "
                                                                                  "sampling works, some probes do not"),
                   style="bold"))
    sys.exit(code)


@main.group(invoke_without_command=True)
@click.option("-m", "--mapping", "extra", multiple=True, type=click.Path(), help="Also list this file.")
@click.pass_context
@_guard
def mappings(ctx: click.Context, extra: tuple[str, ...]) -> None:
    """List the mapping files: shipped, per-user (~/.config/qprof/mappings) and --mapping ones."""
    if ctx.invoked_subcommand is not None:
        return
    from rich.table import Table

    from qprof.attribution.mapping import MappingSet, user_dir
    from qprof.viewer.console import text_console

    t = Table(show_edge=False, pad_edge=False)
    for col in ("name", "kind", "version", "verified", "rules", "detected by", "path"):
        t.add_column(col)
    for f in MappingSet.load(extra).files:
        detect = ", ".join(p.pattern for p in f.detect_dso + f.detect_symbol) or "always"
        t.add_row(f.name, f.kind, f.version, "yes" if f.verified else "no (unverified)", str(len(f.rules)),
                  detect, f.path)
    out = text_console()
    out.print(t)
    out.print(f"user folder: {user_dir()}", markup=False)


@mappings.command("check")
@click.argument("files", nargs=-1, required=True, type=click.Path())
@_guard
def mappings_check(files: tuple[str, ...]) -> None:
    """Validate mapping files; errors name file:line and the reason."""
    from qprof.attribution.mapping import load_file

    for path in files:
        f = load_file(path)
        click.echo(f"{path}: ok ({f.name} {f.version}, {f.kind}, {len(f.rules)} rules)")


@main.command()
@click.argument("run", type=click.Path(path_type=Path))
@click.option("-m", "--mapping", "extra", multiple=True, type=click.Path(), help="Extra mapping file; repeatable.")
@click.option("--stack", default=None, help="Force this stack's mapping file.")
@click.option("--top", type=int, default=15, show_default=True, help="Symbols per process.")
@_guard
def coverage(run: Path, extra: tuple[str, ...], stack: str | None, top: int) -> None:
    """The hottest symbols that fell into Uncategorized, with a rule to start from."""
    from qprof.attribution.coverage import CoverageVisitor, gaps
    from qprof.attribution.mapping import MappingSet
    from qprof.attribution.profile import attribute

    seen = CoverageVisitor()
    profile = attribute(_open_run(run), MappingSet.load(extra), stack, visit=seen)
    found = gaps(profile, seen, top)
    if not found:
        click.echo("nothing fell into Uncategorized that the report does not name")
    for g in found:
        click.echo(f"\n# pid {g.pid} {g.comm}: {g.share:.2%} ({g.cpu_seconds:.3f} CPU s) in {g.symbol} [{g.dso}]")
        click.echo(g.suggestion)


@main.command()
@click.option("--size", default="1G", show_default=True, help="Bytes to transfer (e.g. 256M, 1G).")
@click.option("-o", "--output", "out", type=click.Path(path_type=Path), default=None,
              help="Keep the run archive here (default: ./qprof-run-DATE-TIME).")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--loopback", is_flag=True, help="Run both ends on 127.0.0.1 instead of two network namespaces.")
@_guard
def demo(size: str, out: Path | None, fmt: str, loopback: bool) -> None:
    """Profile a real QUIC transfer: an ngtcp2 server and client in two network namespaces
    joined by a veth pair (made and removed by the demo), both attached; report and verdict."""
    from qprof.demo import run_demo

    path = run_demo(size, out or _default_out(), status=lambda m: _stderr().print(f"qprof demo: {m}", markup=False),
                    loopback=loopback)
    print_report([path], fmt, [], 5)


if __name__ == "__main__":
    main()
