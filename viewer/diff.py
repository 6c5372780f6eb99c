"""`qprof diff` for people: tables of what changed, and the differential flame graph.

The differential flame graph follows Brendan Gregg's difffolded.pl: frames
are drawn as in run B (width: B's CPU time), red where the frame's share of
its process's time grew from A to B, blue where it shrank, the deeper the
colour the larger the change (scaled to the largest change in the graph).
The change is inclusive (a frame's share counts everything above it), so a
red leaf explains a red caller. Frames that vanished in B have no width in B
and are not drawn; the symbol table lists them.
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from qprof.attribution.diff import Change, ProcessDiff, RunDiff, Side
from qprof.viewer.flamegraph_svg import render_svg
from qprof.viewer.flametree import FrameNode
from qprof.viewer.folded import frame_name
from qprof.viewer.palette import TERMINAL, diff_colour


def _pp(x: float) -> Text:
    return Text(f"{x:+.1f}", style="red" if x > 0.05 else "blue" if x < -0.05 else "")


def _num(x: float | None, spec: str = ".3f") -> str:
    return "–" if x is None else format(x, spec)


def _delta(x: float | None) -> Text:
    if x is None:
        return Text("–")
    return Text(f"{x:+.3f}", style="red" if x > 0 else "blue" if x < 0 else "")


def _side_line(p: ProcessDiff) -> str:
    a, b = p.a, p.b
    def moved(s: Side) -> str:
        kinds = [f"{kind} {n / 1e6:,.1f} MB" for kind, n in (("UDP", s.udp_bytes), ("TCP", s.tcp_bytes)) if n]
        return " + ".join(kinds) or "bytes not counted"

    def per(s: Side) -> str:
        return "" if s.gb is None else f", {s.cpu_seconds / s.gb:.3f} CPU s/GB"
    return "\n".join(f"  {n}: pid {s.pid} {s.comm}, {s.cpu_seconds:.3f} CPU s ({s.samples:,} samples), {moved(s)}"
                     f"{per(s)}" for n, s in (("A", a), ("B", b)))


def _arrow(a: float | None, b: float | None, spec: str) -> str:
    return f"{_num(a, spec)} → {_num(b, spec)}"


def _category_table(rows: list[Change], per_gb: bool) -> Table:
    t = Table(title="categories", title_justify="left", show_edge=False, pad_edge=False)
    t.add_column("category", no_wrap=True)
    t.add_column("share A → B", justify="right", no_wrap=True)
    t.add_column("Δ pp", justify="right")
    t.add_column("CPU s A → B", justify="right", no_wrap=True)
    if per_gb:
        t.add_column("CPU s/GB A → B", justify="right", no_wrap=True)
        t.add_column("Δ s/GB", justify="right")
    for c in rows:
        cells: list[str | Text] = [Text(c.category, style=TERMINAL[c.category]),
                                   _arrow(c.share_a * 100, c.share_b * 100, ".1f"), _pp(c.delta_pp),
                                   _arrow(c.cpu_a, c.cpu_b, ".3f")]
        if per_gb:
            cells += [_arrow(c.per_gb_a, c.per_gb_b, ".3f"), _delta(c.delta_per_gb)]
        t.add_row(*cells)
    return t


def _symbol_table(rows: list[Change], per_gb: bool) -> Table:
    t = Table(title="symbols with the largest change in share (self time)", title_justify="left", show_edge=False,
              pad_edge=False)
    t.add_column("Δ pp", justify="right")
    t.add_column("share A → B", justify="right", no_wrap=True)
    if per_gb:
        t.add_column("Δ s/GB", justify="right")
    t.add_column("category", no_wrap=True)
    t.add_column("symbol (object)", overflow="fold")
    for c in rows:
        cells: list[str | Text] = [_pp(c.delta_pp), _arrow(c.share_a * 100, c.share_b * 100, ".1f")]
        if per_gb:
            cells.append(_delta(c.delta_per_gb))
        shown = frame_name(c.symbol or "", c.dso or "")
        name = Text(shown)
        if not shown.endswith("_[k]") and not shown.startswith("["):  # else the name says where it is
            name.append(f" ({Path(c.dso or '').name})", style="dim")
        cells += [Text(c.category, style=TERMINAL[c.category]), name]
        t.add_row(*cells)
    return t


def render_diff(d: RunDiff, console: Console) -> None:
    def say(text: str, style: str = "") -> None:  # no markup
        console.print(Text(text, style=style))
    say(f"qprof diff  A: {d.path_a}  B: {d.path_b}", "bold")
    for m in d.method:  # first, before any figure it moves
        who = f" for {m.where[0]}" if m.where else ""
        say(f"warning: {m.what} differs{who} (A: {m.values[0]}; B: {m.values[1]}): {m.affects}", "bold yellow")
    per_gb_shown = any(p.a.bytes is not None and p.b.bytes is not None for p in d.pairs)
    say(f"  processes paired by {d.match_by}; shares (%) are of each process's sampled CPU time"
        + ("; CPU s/GB: per 10^9 payload bytes it sent and received (UDP and TCP)" if per_gb_shown else ""))
    for p in d.pairs:
        per_gb = p.a.bytes is not None and p.b.bytes is not None
        console.print()
        say(p.key, "bold")
        say(_side_line(p), "dim")
        console.print(_category_table(p.categories, per_gb))
        console.print(_symbol_table(p.symbols, per_gb))
    if d.notes:
        console.print()
    for n in d.notes:
        say(f"note: {n}", "yellow")


def diff_tree(d: RunDiff, tree_a: FrameNode, tree_b: FrameNode) -> tuple[FrameNode, dict[int, tuple[float, float]]]:
    """B's tree of the paired processes under their pair keys, and per frame (by id) its share of its
    process's time in A and in B. `tree_a`/`tree_b` hold each run's processes under `str(pid)`."""
    root = FrameNode("all")
    shares: dict[int, tuple[float, float]] = {}
    for p in d.pairs:
        pa, pb = tree_a.children.get(str(p.a.pid)), tree_b.children.get(str(p.b.pid))
        if pb is None or pb.period <= 0:
            continue
        top = FrameNode(p.key, "", pb.samples, pb.period, pb.categories, pb.children)
        root.children[p.key] = top
        root.samples += pb.samples
        root.period += pb.period
        root.categories.update(pb.categories)
        ta = pa.period if pa is not None and pa.period > 0 else 0
        stack: list[tuple[FrameNode, FrameNode | None]] = [(top, pa)]
        while stack:
            nb, na = stack.pop()
            share_a = (na.period / ta) if na is not None and ta else 0.0
            shares[id(nb)] = (share_a, nb.period / pb.period)
            for name, cb in nb.children.items():
                stack.append((cb, na.children.get(name) if na is not None else None))
    return root, shares


def diff_svg(d: RunDiff, tree_a: FrameNode, tree_b: FrameNode) -> str:
    """The differential flame graph (see the module's docstring)."""
    root, shares = diff_tree(d, tree_a, tree_b)
    deltas = {k: b - a for k, (a, b) in shares.items()}
    scale = max((abs(v) for v in deltas.values()), default=0.0)
    grew = max((v for v in deltas.values()), default=0.0)
    shrank = min((v for v in deltas.values()), default=0.0)

    def describe(n: FrameNode) -> str:
        if id(n) not in shares:
            return f"{n.name}\nB: {n.samples:,} samples (all paired processes)"
        a, b = shares[id(n)]
        lines = [n.name, f"B: {n.samples:,} samples, {b:.2%} of its process's time",
                 f"A: {a:.2%}", f"change: {(b - a) * 100:+.2f} pp", f"category in B: {n.category}"]
        return "\n".join(lines + ([n.dso] if n.dso else []))

    legend = [(f"grew from A to B (up to {grew * 100:+.1f} pp)", diff_colour(1, 1)),
              (f"shrank (down to {shrank * 100:+.1f} pp)", diff_colour(-1, 1)),
              ("unchanged", diff_colour(0, 1))]
    return render_svg(root, title=f"qprof differential flame graph: {Path(d.path_a).name} → {Path(d.path_b).name}",
                      subtitle=f"A: {d.path_a}, B: {d.path_b}; width: B's CPU time; colour: change in the "
                               "frame's share of its process's time (inclusive); frames gone in B are not drawn",
                      fill=lambda n: diff_colour(deltas.get(id(n), 0.0), scale), describe=describe, legend=legend)
