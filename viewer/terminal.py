"""The terminal report (rich): per process and thread, category shares, CPU seconds, top symbols."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from qprof.attribution.categories import CATEGORIES
from qprof.attribution.profile import ProcessProfile, Profile

# One colour per category, shared with the flamegraph palette's hue families.
COLOURS = {
    "Packet I/O": "bright_red",
    "Crypto": "bright_magenta",
    "Connection Mgmt": "bright_blue",
    "I/O": "bright_green",
    "Uncategorized": "grey62",
}
BAR = 24


def _bar(share: float, colour: str) -> Text:
    n = round(share * BAR)
    return Text("█" * n + "·" * (BAR - n), style=colour)


def _short_dso(dso: str) -> str:
    return dso.rsplit("/", 1)[-1]


def _process_table(p: ProcessProfile, profile: Profile) -> Table:
    b = p.breakdown
    t = Table(title=Text(f"pid {p.pid} {p.comm}" + (f" ({p.role})" if p.role else ""), style="bold"),
              title_justify="left", show_edge=False, pad_edge=False)
    t.add_column("category")
    t.add_column("share", justify="right")
    t.add_column("CPU s", justify="right")
    t.add_column("", no_wrap=True)
    total = b.period or 1
    for cat in CATEGORIES:
        share = b.categories[cat] / total
        t.add_row(Text(cat, style=f"bold {COLOURS[cat]}"), f"{share:.1%}",
                  f"{profile.cpu_seconds(b.categories[cat]):.2f}", _bar(share, COLOURS[cat]))
        subs = sorted(((s, per) for (c, s), per in b.subcategories.items() if c == cat), key=lambda x: -x[1])
        for sub, per in subs:
            t.add_row(Text(f"  {sub}", style="dim"), Text(f"{per / total:.1%}", style="dim"),
                      Text(f"{profile.cpu_seconds(per):.2f}", style="dim"), "")
    return t


def _symbols_table(p: ProcessProfile, top: int) -> Table:
    b = p.breakdown
    total = b.period or 1
    t = Table(title="top symbols per category (self time)", title_justify="left", show_edge=False,
              pad_edge=False)
    t.add_column("category")
    t.add_column("share", justify="right")
    t.add_column("symbol", overflow="fold")
    t.add_column("object", overflow="fold")
    for cat in CATEGORIES:
        rows = [(sym, dso, per) for (c, sym, dso), per in b.symbols.most_common() if c == cat][:top]
        for i, (sym, dso, per) in enumerate(rows):
            t.add_row(Text(cat if i == 0 else "", style=COLOURS[cat]), f"{per / total:.1%}",
                      Text(sym), Text(_short_dso(dso), style="dim"))
    return t


def _threads_table(p: ProcessProfile, profile: Profile) -> Table:
    t = Table(show_edge=False, pad_edge=False, title="threads", title_justify="left")
    t.add_column("tid", justify="right")
    t.add_column("thread")
    t.add_column("CPU s", justify="right")
    for cat in CATEGORIES:
        t.add_column(cat, justify="right", style=COLOURS[cat])
    for th in sorted(p.threads.values(), key=lambda x: -x.breakdown.period):
        shares = th.breakdown.shares()
        t.add_row(str(th.tid), Text(th.comm), f"{profile.cpu_seconds(th.breakdown.period):.2f}",
                  *[f"{shares[c]:.1%}" for c in CATEGORIES])
    return t


def render(profile: Profile, console: Console, top: int = 5) -> None:
    meta = profile.run.meta
    s = meta.get("sampling", {})
    host = meta.get("host", {})
    status = meta.get("status")
    say = lambda text, style=None: console.print(Text(text, style=style or ""))  # noqa: E731  (no markup)
    say(f"qprof report {profile.run.path}", "bold")
    say(f"  {s.get('event')} at {s.get('frequency')} Hz, {meta.get('duration_s', '?')} s "
        f"({meta.get('stop_reason') or 'no stop reason recorded'}); kernel {host.get('kernel')}, "
        f"{host.get('cpu_model')}")
    if status != "complete":
        say(f"  archive is {status}: {meta.get('incomplete_reason') or 'collection did not finish'}; "
            "shown is what was collected", "yellow")
    for t in meta.get("targets", []):
        say(f"  pid {t['pid']} {t.get('comm')}: {t.get('unwind')} unwinding ({t.get('unwind_reason')})")
    for p in profile.processes:
        console.print()
        console.print(_process_table(p, profile))
        cross = "" if p.proc_cpu_seconds is None else f"; /proc says {p.proc_cpu_seconds:.2f} s"
        say(f"  sampled CPU {profile.cpu_seconds(p.breakdown.period):.2f} s in {p.breakdown.samples} samples{cross}")
        say("  mappings: " + ", ".join(f"{m['name']} {m['version']} ({m['path']})" for m in p.mappings))
        console.print(_symbols_table(p, top))
        if len(p.threads) > 1:
            console.print(_threads_table(p, profile))
    for e in profile.empty_targets:
        say(f"\npid {e['pid']} {e['comm']}: no samples (idle or exited before sampling)")
