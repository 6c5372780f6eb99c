"""Every output of a report, in one table: picked by `--format NAME` or by the `-o` file's suffix.

Why one table: an output used to be a module plus one of three dispatch styles
in the CLI, and pprof, the flame graphs and the timeline each ran the
attribution again with a visitor of their own. Here an output is an `Output`:
its name, the suffixes that pick it, and a `Renderer` made per report, which
may look at each stack record with its decision while the runs are attributed
(`visitor`) and then renders the one attributed result (`Attributed`) to text
or bytes. `attribute_runs` attributes each run once for all the outputs asked
for. A new output is a renderer and one line in `OUTPUTS`.

Suffixes are matched longest first, so `.speedscope.json` picks speedscope and
a plain `.json` qprof's JSON report.
"""

from __future__ import annotations

import functools
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Protocol, Sequence

from qprof.attribution.analysis import Analysis, analyse_run, verdict_of
from qprof.attribution.engine import Decision
from qprof.attribution.mapping import MappingSet
from qprof.attribution.profile import Visitor
from qprof.attribution.qlog import SenderRecord
from qprof.attribution.symbols import FrameAddresses
from qprof.attribution.timeline import Timeline, TimelineBuilder, build as build_timeline
from qprof.archive import Run
from qprof.archive.stacks import StackRecord
from qprof.errors import QprofError
from qprof.viewer.console import text_console
from qprof.viewer.flametree import Flame, FlameBuilder, Selection, flame_of, selecting
from qprof.viewer.output import output_format

if TYPE_CHECKING:
    from rich.console import Console

    from qprof.viewer.rows import Notice, TableRow


@dataclass(frozen=True)
class Request:
    """What the user asked of the report besides its format."""

    top: int = 5  # symbols per category (text, JSON)
    verbose: bool = False  # text: how skid was placed, the mapping files' paths
    timeline: bool = False  # text and JSON: CPU by category, goodput and the wall clock over the run
    selection: Selection = Selection()  # flame graphs: one process, role or thread
    off_cpu: bool = False  # flame graphs: the wall time by state and wait call path (viewer.offcpu), not the CPU
    colour: bool = False  # text: ANSI colours (when it goes to a terminal)
    pairs: tuple[tuple[int, int], ...] = ()  # diff: processes to pair (run A's pid, run B's)
    summary: bool = False  # table: the summary over the runs instead of one row per run x process x category


@dataclass
class Attributed:
    """The one attributed result every output renders: each run with its analysis (none for the
    outputs that need only the folded stacks)."""

    runs: list[Run]
    analyses: list[Analysis]

    @functools.cached_property
    def table_rows(self) -> list["TableRow"]:
        """One row per run x process x category (viewer.rows), from each analysis's report (viewer.report) and each run's
        place among the runs (its recorded configuration): made once for the table, its summary and the
        chart alike."""
        from qprof.viewer import rows as R
        from qprof.viewer.report import report_of

        places = R.place_runs([(str(run.path), run.meta) for run in self.runs])
        return [row for a, place in zip(self.analyses, places) for row in R.table_rows(report_of(a, 1), place)]


@dataclass(frozen=True)
class Rendered:
    data: str | bytes
    what: str = ""  # for the line saying what was written, e.g. "of 1,234 samples"
    notices: tuple["Notice", ...] = ()  # what a summary or chart says besides (viewer.rows.summary_notices)


class Renderer(Protocol):
    def visitor(self, index: int, run: Run) -> Visitor | None:
        """What to call with each stack record of run `index` and its decision, or None."""

    def render(self, result: Attributed) -> Rendered:
        """The output, from the attributed runs (and what the visitors saw)."""


@dataclass(frozen=True)
class Output:
    kind: str  # the command it serves: report (flame graphs too), diff (two runs), table (many runs)
    name: str  # `--format NAME`
    suffixes: tuple[str, ...]  # `-o FILE` suffixes that pick it
    summary: str  # for --help
    make: Callable[[Request], Renderer]
    binary: bool = False  # bytes: written to a file only
    one_run: bool = False  # draws one run
    flame: bool = False  # a flame graph (`qprof flamegraph`)
    chart: bool = False  # a chart of many runs (`qprof table --chart`)
    attributed: bool = True  # False: needs only the folded stacks


# -- the outputs


class _Text:
    def __init__(self, request: Request) -> None:
        self.request = request
        self.timelines: dict[int, TimelineBuilder] = {}

    def visitor(self, index: int, run: Run) -> Visitor | None:
        if not self.request.timeline:
            return None
        return self.timelines.setdefault(index, TimelineBuilder())

    def lines(self, result: Attributed) -> list[Timeline | None]:
        return [build_timeline(a.profile, self.timelines[i], list(a.profile.run.proc_readings()),
                               transfers=a.transfers) if i in self.timelines else None
                for i, a in enumerate(result.analyses)]

    def render(self, result: Attributed) -> Rendered:
        from qprof.viewer.report import report_of
        from qprof.viewer.terminal import render, render_verdict
        from qprof.viewer.timeline import render_timeline

        buf = io.StringIO()
        console = _console(self.request, buf)
        for a, tl in zip(result.analyses, self.lines(result)):
            render(report_of(a, self.request.top, tl), console, self.request.top, self.request.verbose)
            if tl is not None:
                render_timeline(tl, console)
        v = verdict_of(result.analyses)
        if v is not None:
            render_verdict(v, console)
        return Rendered(buf.getvalue())


class _Json(_Text):
    def render(self, result: Attributed) -> Rendered:
        from qprof.viewer.json_report import merged_dict, to_dict
        from qprof.viewer.report import report_of

        lines = self.lines(result)
        analyses, top = result.analyses, self.request.top
        doc = to_dict(report_of(analyses[0], top, lines[0])) if len(analyses) == 1 else merged_dict(analyses, top, lines)
        return Rendered(json.dumps(doc, indent=1) + "\n")


class _Folded:
    def __init__(self, request: Request) -> None:
        pass

    def visitor(self, index: int, run: Run) -> Visitor | None:
        return None

    def render(self, result: Attributed) -> Rendered:
        from qprof.viewer.folded import folded_lines

        return Rendered("".join(f"{line}\n" for run in result.runs for line in folded_lines(run)))


class _Pprof:
    def __init__(self, request: Request) -> None:
        from qprof.viewer.pprof import PprofCollector

        self.seen = PprofCollector()

    def visitor(self, index: int, run: Run) -> Visitor | None:
        return self.seen

    def render(self, result: Attributed) -> Rendered:
        from qprof.viewer.pprof import pprof_bytes

        address = FrameAddresses(result.runs[0])
        data = pprof_bytes(result.analyses[0], self.seen, address)
        return Rendered(data, f"profile of {len(self.seen.seen):,} stacks{_noted(address)}")


class _Flame:
    """A flame graph of the selected part of one run; `draw` turns the tree into the file. Off-CPU
    (`request.off_cpu`): the tree of viewer.offcpu, from the analysis's wall clock, drawn the same way."""

    def __init__(self, request: Request, draw: Callable[[Flame], str]) -> None:
        self.selection = request.selection
        self.off_cpu = request.off_cpu
        self.draw = draw
        self.builders: tuple[FlameBuilder, TimelineBuilder] | None = None

    def visitor(self, index: int, run: Run) -> Visitor | None:
        if self.off_cpu:
            from qprof.viewer.offcpu import check

            check(run, self.selection)  # refused before the work
            return None
        self.builders = selecting(run, self.selection)
        return _fan_out(list(self.builders))

    def render(self, result: Attributed) -> Rendered:
        if self.off_cpu:
            from qprof.viewer.offcpu import offcpu_flame

            off = offcpu_flame(result.analyses[0], self.selection)
            return Rendered(self.draw(off), f"off-CPU flame graph of {off.total_s:,.2f} s of wall time")
        assert self.builders is not None
        flame = flame_of(result.analyses[0], self.selection, *self.builders)
        return Rendered(self.draw(flame), f"flame graph of {flame.root.samples:,} samples")


class _Otlp(_Pprof):
    def render(self, result: Attributed) -> Rendered:
        from qprof.viewer.otlp import otlp_request

        address = FrameAddresses(result.runs[0])
        req = otlp_request(result.analyses[0], self.seen, address)
        # an OTLP sample is one stack of one thread, valued in CPU ns: counted as stacks, as pprof's are
        stacks = sum(len(p.samples) for rp in req.resource_profiles for sp in rp.scope_profiles for p in sp.profiles)
        return Rendered(req.SerializeToString(), f"profiles of {len(req.resource_profiles)} processes, "
                                                 f"{stacks:,} stacks{_noted(address)}")


def _noted(address: FrameAddresses) -> str:
    """What the locations' addresses lack, for the line saying what was written."""
    note = address.note()
    return f" (note: {note})" if note else ""


def _svg(request: Request) -> Renderer:
    from qprof.viewer.flamegraph_svg import flame_svg

    return _Flame(request, flame_svg)


def _html(request: Request) -> Renderer:
    from qprof.viewer.flamegraph_html import flame_html

    return _Flame(request, flame_html)


def _speedscope(request: Request) -> Renderer:
    from qprof.viewer.speedscope import speedscope_json

    return _Flame(request, speedscope_json)


def _console(request: Request, buf: io.StringIO) -> "Console":
    """Text goes through a rich console: coloured to a terminal, unwrapped to a file (viewer.console)."""
    from rich.console import Console

    if request.colour:
        return Console(file=buf, highlight=False, force_terminal=True, width=text_console().width)
    return text_console(file=buf)


class _Diff:
    """Two runs compared (attribution.diff): text, JSON or the differential flame graph."""

    def __init__(self, request: Request, fmt: str) -> None:
        self.request = request
        self.fmt = fmt
        self.trees: list[FlameBuilder] = []

    def visitor(self, index: int, run: Run) -> Visitor | None:
        if self.fmt != "svg":
            return None
        self.trees.append(FlameBuilder(lambda rec: str(rec.pid)))
        return self.trees[-1]

    def render(self, result: Attributed) -> Rendered:
        from qprof.attribution.diff import diff_runs
        from qprof.viewer.diff import diff_svg, render_diff

        a, b = result.analyses
        d = diff_runs(a, b, self.request.top, list(self.request.pairs))
        if self.fmt == "json":
            return Rendered(json.dumps(d.to_json(), indent=1) + "\n")
        if self.fmt == "svg":
            ta, tb = self.trees
            return Rendered(diff_svg(d, ta.root, tb.root), "differential flame graph")
        buf = io.StringIO()
        render_diff(d, _console(self.request, buf))
        return Rendered(buf.getvalue())


class _Rows:
    """`qprof table`: one row per run x process x category (or the summary over the runs), as text,
    CSV or parquet (viewer.rows, viewer.table)."""

    def __init__(self, request: Request, fmt: str) -> None:
        self.request = request
        self.fmt = fmt

    def visitor(self, index: int, run: Run) -> Visitor | None:
        return None

    def render(self, result: Attributed) -> Rendered:
        from qprof.viewer import rows as R
        from qprof.viewer.frames import frame
        from qprof.viewer.table import render as render_rows, render_summary

        rows = result.table_rows
        summary = R.summary_rows(rows) if self.request.summary else []
        cells, columns = ([s.cells() for s in summary], R.SUMMARY_COLUMNS) if self.request.summary else \
            ([r.cells() for r in rows], R.TABLE_COLUMNS)
        notices = tuple(R.summary_notices(rows)) if self.request.summary else ()
        what = f"{'summary ' if self.request.summary else ''}({len(cells)} rows)"
        if self.fmt == "csv":
            return Rendered(frame(cells, columns).to_csv(index=False), what, notices)
        if self.fmt == "parquet":
            return Rendered(frame(cells, columns).to_parquet(None, index=False), what, notices)
        buf = io.StringIO()
        console = _console(self.request, buf)
        if self.request.summary:
            render_summary(summary, list(notices), console)
        else:
            render_rows(rows, console)
        return Rendered(buf.getvalue(), notices=notices)


class _Chart(_Rows):
    """The comparison chart of the runs (viewer.chart): a bar per configuration and side, and each
    configuration's goodput."""

    def render(self, result: Attributed) -> Rendered:
        from qprof.viewer.chart import bars, chart_html, chart_svg
        from qprof.viewer.rows import summary_notices

        drawn = bars(result.table_rows)
        notices = summary_notices(result.table_rows)
        draw = chart_html if self.fmt == "html" else chart_svg
        return Rendered(draw(drawn, notices=notices), f"chart of {len(drawn)} bars from {len(result.analyses)} runs",
                        tuple(notices))


def _chart(fmt: str) -> Callable[[Request], Renderer]:
    return lambda request: _Chart(request, fmt)


def _diff(fmt: str) -> Callable[[Request], Renderer]:
    return lambda request: _Diff(request, fmt)


def _rows(fmt: str) -> Callable[[Request], Renderer]:
    return lambda request: _Rows(request, fmt)


OUTPUTS: tuple[Output, ...] = (
    Output("report", "text", (".txt",), "tables for reading", _Text),
    Output("report", "json", (".json",), "machine-readable report", _Json),
    Output("report", "folded", (".folded",), "stacks for flamegraph.pl, inferno, speedscope", _Folded,
           attributed=False),
    Output("report", "pprof", (".pb.gz", ".pprof", ".pb", ".gz"),
           "gzipped protobuf for go tool pprof, Pyroscope, Parca", _Pprof, binary=True, one_run=True),
    Output("report", "otlp", (".otlp.pb",), "the OTLP profiles request `qprof export --otlp` sends, protobuf",
           _Otlp, binary=True, one_run=True),
    Output("report", "svg", (".svg",), "static flame graph for papers, zooms and searches in a browser", _svg,
           one_run=True, flame=True),
    Output("report", "html", (".html",), "flame graph page drawn by d3-flame-graph", _html, one_run=True, flame=True),
    Output("report", "speedscope", (".speedscope.json",), "flame graph for speedscope", _speedscope,
           one_run=True, flame=True),
    Output("diff", "text", (".txt",), "tables for reading", _diff("text")),
    Output("diff", "json", (".json",), "machine-readable comparison", _diff("json")),
    Output("diff", "svg", (".svg",), "differential flame graph: red grew, blue shrank", _diff("svg")),
    Output("table", "text", (".txt",), "one line per run x process", _rows("text")),
    Output("table", "csv", (".csv",), "one row per run x process x category", _rows("csv")),
    Output("table", "parquet", (".parquet",), "the CSV's rows as parquet", _rows("parquet"), binary=True),
    Output("table", "svg", (".svg",), "comparison chart: a bar per configuration and side", _chart("svg"),
           chart=True),
    Output("table", "html", (".html",), "the comparison chart with its figures on hover", _chart("html"),
           chart=True),
)


def of_kind(kind: str) -> tuple[Output, ...]:
    return tuple(o for o in OUTPUTS if o.kind == kind)


def by_suffix(path: Path, outputs: tuple[Output, ...]) -> Output:
    """The output a file name asks for (longest suffix first), checked writable (viewer.output);
    a one-line QprofError naming the suffixes otherwise."""
    name = path.name.lower()
    suffixes = sorted(((s, o) for o in outputs for s in o.suffixes), key=lambda x: -len(x[0]))
    for suffix, o in suffixes:
        if name.endswith(suffix) and len(name) > len(suffix):
            output_format(path, {path.suffix.lower(): o.name})
            return o
    output_format(path, {s: o.name for o in outputs for s in o.suffixes})  # raises: names every suffix
    raise AssertionError("unreachable")


def choose(name: str | None, out: Path | None, outputs: tuple[Output, ...], default: str = "text") -> Output:
    """The output from `--format` or else `-o`'s suffix; a binary one needs `-o`."""
    if name is not None:
        o = {o.name: o for o in outputs}.get(name)
        if o is None:
            raise QprofError(f"unknown format {name!r}; choose one of {', '.join(x.name for x in outputs)}")
        if out is not None:
            output_format(out, {out.suffix.lower() or "": o.name})
    else:
        o = by_suffix(out, outputs) if out is not None else {o.name: o for o in outputs}[default]
    if o.binary and out is None:
        raise QprofError(f"--format {o.name} writes a file: give -o FILE (e.g. -o profile{o.suffixes[0]})")
    return o


def attribute_runs(runs: list[Run], mappings: MappingSet, stack: str | None,
                   renderers: list[Renderer], attributed: bool = True) -> Attributed:
    """Attribute each run once, every renderer's visitor seeing each record with its decision."""
    analyses = []
    for i, run in enumerate(runs if attributed else []):
        visitors = [v for r in renderers for v in [r.visitor(i, run)] if v is not None]
        analyses.append(analyse_run(run, mappings, stack, visit=_fan_out(visitors)))
    return Attributed(runs, analyses)


def _fan_out(visitors: list[Visitor]) -> Visitor | None:
    """One visitor calling each of `visitors` (None when there are none)."""
    if len(visitors) <= 1:
        return visitors[0] if visitors else None

    def visit(rec: StackRecord, decision: Decision) -> None:
        for v in visitors:
            v(rec, decision)
    return visit


def render(asked: list[tuple[Output, Request]], runs: list[Run], mappings: MappingSet, stack: str | None,
           stack_records: Sequence[SenderRecord] = ()) -> list[Rendered]:
    """The outputs asked for (each with its request), from one attribution pass over `runs`;
    `stack_records`: the stacks' own qlog, set beside the verdict."""
    for output, _ in asked:
        if output.one_run and len(runs) != 1:
            raise QprofError(f"--format {output.name} draws one run: give one run directory")
    renderers = [output.make(request) for output, request in asked]
    result = attribute_runs(runs, mappings, stack, renderers, any(o.attributed for o, _ in asked))
    for a in result.analyses:
        a.stack_records = list(stack_records)
    return [r.render(result) for r in renderers]

