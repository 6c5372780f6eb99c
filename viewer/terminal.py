"""The terminal report (rich): per process and thread, category shares, CPU seconds, top symbols.

It renders the typed report (viewer.report) the JSON report and the tables render, and the analysis it was
made from for the detail only the terminal shows. Its figures are printed with fewer digits than the
report keeps, formatted from the exact value: rounding the report's 6-place figure again would move a
half-way value (a share of 0.0185004 kept as 0.0185 prints 1.8%, not 1.9%).
"""

from __future__ import annotations

from typing import Callable, Sequence

from rich.console import Console
from rich.table import Table
from rich.text import Text

from qprof.attribution.categories import CATEGORIES
from qprof.attribution.services import ServiceView
from qprof.attribution.skid import METHOD as SKID_METHOD
from qprof.attribution.verdict import Verdict
from qprof.attribution.cryptocalls import KINDS as CRYPTO_KINDS, Crypto, ProcessCrypto
from qprof.viewer.palette import TERMINAL
from qprof.attribution.packetio import PacketIO, ProcessPacketIO
from qprof.attribution.profile import PROBE_SHARE_LIMIT, Breakdown, ProcessProfile, Profile
from qprof.attribution.symbols import naming
from qprof.attribution.threads import ThreadView
from qprof.attribution.waits import CLOSURE, ON_CPU, STATES, WAIT_KINDS, WallClock, WallSplit
from qprof.archive.model import ObjectSymbols, Target
from qprof.attribution.tcp import ProcessTcp
from qprof.viewer.report import Report

# One colour per category, the flame graphs' hue families (viewer.palette).
COLOURS = TERMINAL
BAR = 24
WALL_THREADS = 8  # threads listed under a pool in the wall-clock table


def _bar(share: float, colour: str) -> Text:
    n = round(share * BAR)
    return Text("█" * n + "·" * (BAR - n), style=colour)


def _short_dso(dso: str) -> str:
    return dso.rsplit("/", 1)[-1]


def _process_table(p: ProcessProfile, profile: Profile) -> Table:
    """Categories with their subcategories; what no subcategory names is a row of its own, and the part
    placed by object name alone (a stripped library's frames) is said beside each category."""
    b = p.breakdown
    t = Table(title=Text(f"pid {p.pid} {p.comm}" + (f" ({p.role})" if p.role else ""), style="bold"),
              title_justify="left", show_edge=False, pad_edge=False)
    t.add_column("category")
    t.add_column("share", justify="right")
    t.add_column("CPU s", justify="right")
    t.add_column("", no_wrap=True)
    t.add_column("", style="dim")
    total = b.period or 1
    for cat in CATEGORIES:
        share = b.categories[cat] / total
        dso = p.dso_only[cat]
        t.add_row(Text(cat, style=f"bold {COLOURS[cat]}"), f"{share:.1%}",
                  f"{profile.cpu_seconds(b.categories[cat]):.2f}", _bar(share, COLOURS[cat]),
                  f"{dso / total:.1%} placed by object name only" if dso * 1000 >= total else "")
        subs = sorted(((s, per) for (c, s), per in b.subcategories.items() if c == cat), key=lambda x: -x[1])
        rest = b.categories[cat] - sum(per for _, per in subs)
        if subs and rest * 1000 >= total:
            subs.append(("(no subcategory: rules that name none)", rest))
        for sub, per in subs:
            t.add_row(Text(f"  {sub}", style="dim"), Text(f"{per / total:.1%}", style="dim"),
                      Text(f"{profile.cpu_seconds(per):.2f}", style="dim"), "", "")
    return t


def _service_table(view: ServiceView, profile: Profile) -> Table:
    """A followed service: each process's share of every category, then the service's sum."""
    svc = view.service
    title = (f"{svc.role + ' ' if svc.role else ''}service {svc.unit or svc.name}: {len(view.members)} processes"
             + (f", {view.joined} joined during the run" if view.joined else "")
             + (f", {view.exited} exited" if view.exited else ""))
    t = Table(title=title, title_justify="left", title_style="bold")
    t.add_column("pid", justify="right")
    t.add_column("process")
    t.add_column("joined", justify="right")
    t.add_column("CPU s", justify="right")
    for c in CATEGORIES:
        t.add_column(c, justify="right")

    def row(pid: str, comm: str, joined: str, b: Breakdown, style: str = "") -> None:
        shares = b.shares()
        t.add_row(pid, comm, joined, f"{profile.cpu_seconds(b.period):.2f}",
                  *(f"{shares[c]:.1%}" if b.period else "-" for c in CATEGORIES), style=style)

    for m in view.members:
        row(str(m.pid), m.comm + (" (exited)" if m.exited else ""),
            "start" if m.joined_s is None else f"{m.joined_s:.1f} s", m.breakdown)
    row("", "all", "", view.total, "bold")
    return t


def _symbols_table(p: ProcessProfile, top: int, verbose: bool = False) -> Table:
    """Top leaf symbols per category; verbose: the mapping rule (file:line) that placed each."""
    b = p.breakdown
    total = b.period or 1
    t = Table(title="top symbols per category (self time)", title_justify="left", show_edge=False,
              pad_edge=False)
    t.add_column("category")
    t.add_column("share", justify="right")
    t.add_column("symbol", overflow="fold")
    t.add_column("object", overflow="fold")
    if verbose:
        t.add_column("placed by", overflow="fold")
    for cat in CATEGORIES:
        rows = [(sym, dso, per) for (c, sym, dso), per in b.symbols.most_common() if c == cat][:top]
        for i, (sym, dso, per) in enumerate(rows):
            placed = [Text(", ".join(f"{r}" + (f" {x:.0%}" if x < 1 else "") for r, x in b.placed((cat, sym, dso))),
                           style="dim")] if verbose else []
            t.add_row(Text(cat if i == 0 else "", style=COLOURS[cat]), f"{per / total:.1%}",
                      Text(sym), Text(_short_dso(dso), style="dim"), *placed)
    return t


def _rate(n: int | None, seconds: float) -> str:
    return "–" if n is None or seconds <= 0 else f"{n / seconds:,.0f}"


def _threads_table(view: ThreadView, p: ProcessProfile, profile: Profile) -> Table:
    """Pools of threads (how the runtime runs them) with their threads: /proc figures over the window,
    categories from the samples."""
    secs = view.window_s
    t = Table(show_edge=False, pad_edge=False, title_justify="left",
              title=f"threads by pool (CPU and run queue from schedstat over {secs:.2f} s; categories from samples)")
    t.add_column("pool / thread")
    t.add_column("threads", justify="right")
    t.add_column("CPU s", justify="right")
    t.add_column("run-queue s", justify="right")
    t.add_column("voluntary/s", justify="right")
    t.add_column("preempted/s", justify="right")
    for cat in CATEGORIES:
        t.add_column(cat, justify="right", style=COLOURS[cat])
    busiest = view.busiest

    def shares(b: Breakdown) -> list[str]:
        sh = b.shares()
        return [f"{sh[c]:.0%}" if b.period else "–" for c in CATEGORIES]

    for pool in view.pools:
        t.add_row(Text(pool.name, style="bold"), str(len(pool.threads)), _fmt(pool.on_cpu_s, ".2f"),
                  _fmt(pool.run_delay_s, ".2f"), _rate(pool.voluntary, secs), _rate(pool.involuntary, secs),
                  *shares(pool.breakdown))
        if len(pool.threads) == 1 and pool.threads[0].stat.comm == pool.name and pool.threads[0] is not busiest:
            continue
        for th in pool.threads:
            st = th.stat
            mark = " (busiest)" if th is busiest else ""
            t.add_row(Text(f"  {st.tid} {st.comm}{mark}", style="" if mark else "dim"), "",
                      _fmt(st.on_cpu_s, ".2f"), _fmt(st.run_delay_s, ".2f"), _rate(st.voluntary, secs),
                      _rate(st.involuntary, secs), *shares(th.breakdown))
    return t


def _thread_notes(view: ThreadView, p: ProcessProfile, profile: Profile, say: "Callable[..., None]") -> None:
    """Parallelism, the runtime's own work and handoffs between threads, with the pools' notes."""
    for pool in view.pools:
        if pool.note:
            say(f"  {pool.name}: {pool.note}", "dim")
    h = view.handoffs
    if view.cores_mean is not None:
        per_gb = (f"; {h.gb_moved:.2f} GB moved, {view.cores_mean * view.window_s / h.gb_moved:.2f} CPU s per GB"
                  if h.gb_moved else "")
        say(f"  parallelism: {view.cores_mean:.2f} cores on a CPU on average, {_fmt(view.cores_peak, '.2f')} at peak "
            f"(per /proc interval){per_gb}")
    if view.runtime:
        say("  runtime's own work: " + ", ".join(f"{k.removeprefix('runtime: ')} {v:.1%}" for k, v in view.runtime.items()))
    if h.cpu_s:
        kinds = ", ".join(f"{k} {v:.2f}" for k, v in h.cpu_s.items())
        say(f"  handoffs between its threads: {sum(h.cpu_s.values()):.2f} CPU s ({h.share:.1%}: {kinds})"
            + (f", {h.cpu_s_per_gb:.2f} CPU s per GB moved" if h.cpu_s_per_gb is not None else "")
            + (f"; {h.wakeups_per_datagram:.2f} wakeups (voluntary switches) per datagram"
               if h.wakeups_per_datagram is not None else ""))


def _wall_table(wall: WallClock) -> Table:
    """Each pool's (and its threads') wall time: on a CPU, runnable, and waiting by kind, as shares of
    the threads' summed window (waits probes)."""
    t = Table(show_edge=False, pad_edge=False, title_justify="left",
              title=f"wall clock by pool (share of each thread's window, summed over the pool; the whole attach, "
                    f"{wall.span_s:.2f} s, traced at every context switch: the verdict's CPU shares cover the "
                    "transfer alone)")
    t.add_column("pool / thread")
    t.add_column("threads", justify="right")
    t.add_column("window s", justify="right")
    for state in STATES:
        t.add_column(state.replace("_", " "), justify="right", style="bold" if state == ON_CPU else "")

    def cells(split: WallSplit) -> list[str]:
        return [f"{split.share(k):.0%}" if split.seconds[k] else "–" for k in STATES]

    for pool in wall.pools:
        t.add_row(Text(pool.name, style="bold"), str(len(pool.threads)), f"{pool.split.window_s:.2f}", *cells(pool.split))
        if len(pool.threads) == 1 and pool.threads[0].comm == pool.name:
            continue
        for th in pool.threads[:WALL_THREADS]:
            t.add_row(Text(f"  {th.tid} {th.comm}", style="dim"), "", f"{th.split.window_s:.2f}", *cells(th.split))
        if len(pool.threads) > WALL_THREADS:
            t.add_row(Text(f"  ... {len(pool.threads) - WALL_THREADS} more", style="dim"), "", "", *[""] * len(STATES))
    return t


def _wall_notes(wall: WallClock, say: "Callable[..., None]", profile: Profile | None = None) -> None:
    """Where each kind of wait blocked most: its sampled call paths summed by where they blocked (the system
    call and the innermost user frame, attribution.waitstacks.where; user frames named with the objects of
    `profile`'s run), and the check that every thread's parts add up to its window."""
    from qprof.attribution.waitstacks import named, where

    stacks = named(wall.stacks, profile.run, wall.pid) if profile is not None else wall.stacks
    for kind in WAIT_KINDS:
        paths = stacks.get(kind)
        total = wall.total.seconds[kind]
        if not paths or total <= 0:
            continue
        spots: dict[str, float] = {}
        for path, secs in paths.items():
            spot = where(path)
            spots[spot] = spots.get(spot, 0.0) + secs
        spot, secs = min(spots.items(), key=lambda kv: (-kv[1], kv[0]))
        say(f"  waiting: {kind} {total:.2f} s, most in {spot} ({secs / total:.0%})", "dim")
    if wall.closure > CLOSURE:
        say(f"  note: a thread's parts differ from its window by {wall.closure:.1%} (probe events lost)", "yellow")


def _fmt(x: float | int | None, spec: str = ",") -> str:
    return "–" if x is None else format(x, spec)


def _packet_io_table(p: ProcessPacketIO) -> Table:
    t = Table(title="packet I/O (probes)", title_justify="left", show_edge=False, pad_edge=False)
    t.add_column("")
    t.add_column("syscalls", justify="right")
    t.add_column("datagrams", justify="right")
    t.add_column("per call", justify="right")
    t.add_column("MB", justify="right")
    t.add_column("offload")
    gso, gro = p.gso, p.gro
    gso_txt = (f"GSO ({gso.enabled}): {gso.gso_sends:,} sends x {_fmt(gso.segments_per_gso_send, '.1f')} "
               f"segs" if gso.gso_sends else f"no GSO (socket: {gso.enabled})")
    gro_txt = (f"GRO: {gro.coalesced_receives:,} receives x {_fmt(gro.datagrams_per_receive, '.1f')}"
               if gro.coalesced_receives else f"no GRO (socket: {gro.enabled})")
    for name, d, off in (("send", p.tx, gso_txt), ("receive", p.rx, gro_txt)):
        extra = f"; {d.mmsg_calls:,} mmsg calls" if d.mmsg_calls else ""
        t.add_row(name, f"{d.syscalls:,}", f"{d.dgrams:,}", _fmt(d.per_syscall(), ".2f"),
                  f"{d.bytes / 1e6:,.1f}", Text(off + extra))
    return t


def _tcp_line(t: ProcessTcp, say: "Callable[..., None]") -> None:
    closed = sum(s.closed for s in t.sockets)
    say(f"  TCP (kernel socket counters): sent {t.sent / 1e6:,.1f} MB, received {t.received / 1e6:,.1f} MB over "
        f"{len(t.sockets)} connection{'s' if len(t.sockets) != 1 else ''} ({closed} closed)"
        + (f"; {t.retransmitted / 1e6:,.2f} MB retransmitted" if t.retransmitted > 0 else ""))


def _estimates_note(p: ProcessPacketIO) -> str | None:
    """How sure the packet counts are: their 95% intervals, where they were sampled."""
    if not p.estimates or p.exact:
        return None
    parts = []
    for key, label in (("tx.datagrams", "sent"), ("rx.datagrams", "received")):
        e = p.estimates.get(key)
        half = e.relative_half_width() if e is not None else None
        if e is not None and e.value:
            parts.append(f"{label} ±{half:.1%}" if half is not None else f"{label} (no interval: one window)")
    for key, label in (("gso.segments_per_gso_send", "GSO segs/send"), ("ack_ratio", "ACK ratio")):
        e = p.estimates.get(key)
        if e is not None and e.value and e.low is not None and e.high is not None:
            parts.append(f"{label} {e.low:.3g}-{e.high:.3g}")
    return "counts estimated from sampling windows, 95% intervals: " + ", ".join(parts) if parts else None


def _packet_io_notes(p: ProcessPacketIO, say: "Callable[..., None]") -> None:
    est = _estimates_note(p)
    if est:
        say("  " + est)
    notes = [f"ACK ratio (datagrams received per sent) {_fmt(p.ack_ratio, '.3f')}"]
    if p.rx.empty:
        notes.append(f"{p.rx.empty:,} receive calls found nothing")
    if p.drops:
        notes.append("drops at its sockets: " + ", ".join(f"{n:,} {r}" for r, n in p.drops.items()))
    say("  " + "; ".join(notes))
    for name, st in sorted(p.syscall_time.items()):
        say(f"  {name}: {st.calls:,} calls, {st.total_s:.3f} s, mean {st.mean_us:.2f} us, "
            f"p50 ~{_fmt(st.p50_us, '.2f')} us, p99 ~{_fmt(st.p99_us, '.2f')} us")
    for sk in p.sockets:
        d = (sk.last.get("drops") or 0) - (sk.first.get("drops") or 0)
        seen = sk.last_time - sk.first_time
        say(f"  socket {sk.local}: SO_RCVBUF {_fmt(sk.last.get('rcvbuf'))} B, SO_SNDBUF "
            f"{_fmt(sk.last.get('sndbuf'))} B; its own drop counter rose by {d:,} in the {seen:.1f} s it was read "
            "(once a second while open; the drops above are the probes' count over the whole run)")


def _skid_note(p: ProcessProfile, say: "Callable[..., None]", verbose: bool) -> None:
    """Where samples that skidded to the end of an interrupt went (and, verbose, how that was decided)."""
    sk = p.skid
    if not sk.share:
        return
    parts = []
    for vec, v in sk.vectors.items():
        to = ", ".join(f"{c} {s:.1%}" for c, s in v.to.items())
        parts.append(f"{vec.removeprefix('asm_sysvec_')} {v.share:.1%} -> {to} "
                     f"(by {v.evidence_samples} samples of its follow-up work)")
    say(f"  interrupt skid: {sk.share:.1%} of samples, {sk.attributed:.1%} placed: " + "; ".join(parts))
    if verbose:
        say(f"    method: {SKID_METHOD}", "dim")


def _run_wide(pio: PacketIO, say: "Callable[..., None]") -> None:
    sq = pio.softirq
    if sq.total_s:
        share = sq.in_target_share
        say(f"softirq: {sq.total_s:.3f} CPU s on {len(sq.per_cpu)} CPU(s)"
            + (f", {share:.0%} of it in the targets' own threads" if share is not None else "")
            + f" [{sq.source}]")
    for ns, mib in pio.udp_mib.items():
        bad = {k: v for k, v in mib.items() if v and k not in ("InDatagrams", "OutDatagrams")}
        say(f"UDP counters ({ns}): in {mib.get('InDatagrams', 0):,}, out {mib.get('OutDatagrams', 0):,}"
            + ("; " + ", ".join(f"{k} {v:,}" for k, v in bad.items()) if bad else "; no errors"))
    if pio.sysctl:
        say("buffers: " + ", ".join(f"{k.split('.')[-1]}={v}" for k, v in pio.sysctl.items()
                                    if k.startswith("net.core")))
    if pio.sampling:
        sm = pio.sampling
        say("packet probes: " + ("counted the whole run" if sm.exact else
            f"counted in {sm.periods - sm.full_periods} sampling windows and {sm.full_periods} whole "
            f"periods, {sm.coverage or 0:.0%} of {sm.span_s:.1f} s (hook rate against a "
            f"{sm.budget.get('cpu_share', 0):.1%} CPU budget)"))
    if pio.cost:
        say(f"probe cost: {pio.cost.bpf_run_time_ns / 1e9:.3f} CPU s in BPF programs over "
            f"{pio.cost.bpf_run_cnt:,} probe hits")
    for u in pio.unavailable:
        say(f"probe {u.probe} unavailable: {u.reason}", "yellow")


def _crypto_section(c: ProcessCrypto, say: "Callable[..., None]", console: Console) -> None:
    """Crypto calls from the opt-in uprobes: per operation, bytes, per datagram, cipher, AES path."""
    t = Table(title="crypto (uprobes)", title_justify="left", show_edge=False, pad_edge=False)
    t.add_column("")
    t.add_column("calls", justify="right")
    t.add_column("MB", justify="right")
    t.add_column("per datagram", justify="right")
    per = c.per_datagram()
    per_kind = {"aead_seal": per["seal_per_datagram_sent"], "aead_open": per["open_per_datagram_received"],
                "header_protection": per["header_protection_per_datagram"]}
    for kind in (*CRYPTO_KINDS, "aad_update"):
        n = c.calls.get(kind, 0)
        if kind == "aad_update" and not n:
            continue
        b = c.bytes.get(kind)
        mb = "–" if b is None else f"{b / 1e6:,.1f}" + ("" if c.bytes_complete.get(kind, True) else "+")
        t.add_row(kind.replace("_", " "), f"{n:,}", mb, _fmt(per_kind.get(kind), ".2f"))
    console.print(t)
    per_dgram = (f"{per['calls_per_datagram']:.2f} crypto calls per datagram (sent + received)"
                 if per["calls_per_datagram"] is not None else "per-datagram figures need the packetio probes")
    say(f"  {per_dgram}; cipher: {c.cipher}; AES: {c.aes_path}")
    for line in c.basis + c.notes:
        say(f"  {line}", "dim")


def _crypto_cost(cr: Crypto, say: "Callable[..., None]") -> None:
    if cr.cost:
        line = cr.cost.summary or f"crypto probes: {cr.cost.target_hits:,} uprobe hits in the targets"
        say(line + f" [{cr.cost.basis}]")


def _symbols_line(p: ProcessProfile, sources: Sequence[ObjectSymbols], say: "Callable[..., None]",
                  verbose: bool) -> None:
    """Per object with samples, how its frames were named, and the share of samples with no function name."""
    objects = [o for o in naming(p.leaf_objects, p.unnamed, sources) if o.how != "kernel"]
    total = sum(p.unnamed.values()) / (p.breakdown.period or 1)
    parts = [f"{o.object.rsplit('/', 1)[-1]} {o.how}" + (f" ({o.unnamed_share:.1%} unnamed)" if o.unnamed_share >= 0.001
                                                        else "") + (f" [{o.note}]" if verbose and o.note else "")
             for o in objects]
    say(f"  symbols: {total:.1%} of samples in no named function; " + ", ".join(parts), "dim")


def _cpu_line(p: ProcessProfile, profile: Profile, say: "Callable[..., None]") -> None:
    """Sampled CPU, with /proc's over the span it was read: a process that starts or exits between two
    readings (every 0.25 s) has CPU there that its samples hold and its readings cannot."""
    line = f"  sampled CPU {profile.cpu_seconds(p.breakdown.period):.2f} s in {p.breakdown.samples} samples"
    if p.sample_span_ns is not None:
        line += f" over {(p.sample_span_ns[1] - p.sample_span_ns[0]) / 1e9:.2f} s"
    if p.proc_cpu_seconds is not None:
        line += f"; /proc says {p.proc_cpu_seconds:.2f} s"
        if p.proc_span_s is not None:
            line += f" between its first and last reading ({p.proc_span_s:.2f} s apart)"
    say(line)


def _cut_stacks(targets: list[Target], copy: dict[int, int]) -> str:
    """How many DWARF stacks went past the stack copy: their callers are [unknown] (the native folder
    counts them; an endpoint with a large buffer on its stack loses most of its callers)."""
    unwound = sum(t.stacks_unwound or 0 for t in targets)
    cut = sum(t.stacks_cut or 0 for t in targets)
    if not unwound or not cut:
        return ""
    size = max((copy.get(t.pid, 0) for t in targets), default=0)
    return (f"; {cut:,} of {unwound:,} stacks ({cut / unwound:.0%}) went past the "
            f"{f'{size:,} B ' if size else ''}stack copy: their outer callers are [unknown]")


def render(report: Report, console: Console, top: int = 5, verbose: bool = False) -> None:
    """The report; `verbose` adds the method notes and the mapping files each process was read with."""
    analysis = report.analysis
    profile, pio = analysis.profile, analysis.packet_io
    info = profile.run.meta
    s, host = info.sampling, info.host
    def say(text: str, style: str | None = None) -> None:  # no markup
        console.print(Text(text, style=style or ""))
    say(f"qprof report {profile.run.path}", "bold")
    say(f"  {s.event} at {s.frequency} Hz, {'?' if info.duration_s is None else info.duration_s} s "
        f"({info.stop_reason or 'no stop reason recorded'}); kernel {host.kernel}, {host.cpu_model}")
    if info.status != "complete":
        say(f"  archive is {info.status}: {info.incomplete_reason or 'collection did not finish'}; "
            "shown is what was collected", "yellow")
    # a service's workers share a program and its unwinding: one line for all of them
    alike: dict[tuple[str, str | None, str | None], list[Target]] = {}
    for t in info.targets:
        alike.setdefault((t.comm, t.unwind, t.unwind_reason), []).append(t)
    copy = {p: g.stack_bytes for g in s.groups if g.stack_bytes for p in g.pids}
    for t in info.targets:
        same = alike.pop((t.comm, t.unwind, t.unwind_reason), [])
        if same:
            who = f"pid {same[0].pid}" if len(same) == 1 else f"pids {', '.join(str(x.pid) for x in same)}"
            say(f"  {who} {t.comm}: {t.unwind} unwinding ({t.unwind_reason}){_cut_stacks(same, copy)}")
        if len(t.images) > 1:
            say("    exec'd: " + " -> ".join(f"{i.comm} ({i.exe}, {i.unwind}, from {i.since_s:g} s)"
                                            for i in t.images), "dim")
    if analysis.observer_cpu_s:
        spent, share = analysis.observer_share
        say(f"  what qprof ran beside the targets: {spent:.2f} CPU s"
            + (f", {share:.1%} of the targets' {analysis.targets_cpu_s:.2f}" if share is not None else "")
            + " (" + ", ".join(f"{k} {v:.2f}" for k, v in analysis.observer_cpu_s.items())
            + "; the probes' programs run in the targets and are in their samples)")
    if host.nics:
        say("  NICs: " + ", ".join(f"{n.name} (NUMA node {n.numa_node})" for n in host.nics))
    for view in analysis.services:
        console.print()
        console.print(_service_table(view, profile))
    for p in profile.processes:
        console.print()
        console.print(_process_table(p, profile))
        _cpu_line(p, profile, say)
        moved = analysis.transfers.get(p.pid)
        if moved is not None and (moved.bytes or moved.gbps):
            say(f"  {moved.describe()}")
        if p.probe_share > PROBE_SHARE_LIMIT:
            say(f"  warning: eBPF probes took {p.probe_share:.1%} of its samples (over {PROBE_SHARE_LIMIT:.0%}): "
                "every share here is off by about that much; fewer probe groups (--probes) cost less", "yellow")
        else:
            say(f"  eBPF probes: {p.probe_share:.2%} of its samples")
        if p.other_bpf_share > 0:
            say(f"  other eBPF programs: {p.other_bpf_share:.2%} of its samples (kprobes or BPF trampolines: "
                "not qprof's, it attaches neither; they cost the target without qprof too)")
        if p.cpu_note:
            say(f"  note: {p.cpu_note}", "yellow")
        if verbose:
            say("  mappings: " + ", ".join(f"{m.name} {m.version} ({m.path})" for m in p.mappings))
        else:
            say("  mappings: " + ", ".join(m.name for m in p.mappings) + " (files and versions: --verbose)", "dim")
        _symbols_line(p, info.symbols, say, verbose)
        _skid_note(p, say, verbose)
        console.print(_symbols_table(p, top, verbose))
        threads = analysis.threads.get(p.pid)
        if threads is not None and len(threads.threads) > 1:
            console.print(_threads_table(threads, p, profile))
            _thread_notes(threads, p, profile, say)
        wall = analysis.wall.get(p.pid)
        if wall is not None:
            console.print(_wall_table(wall))
            _wall_notes(wall, say, profile)
        rt = analysis.round_trips.get(p.pid)
        if rt is not None:
            say(f"  round trip {rt.ms:.2f} ms: what it received echoed what it sent that much later "
                f"(its datagrams' timing over {rt.span_s:.1f} s)")
        tcp = analysis.tcp.processes.get(p.pid) if analysis.tcp is not None else None
        udp = pio.processes.get(p.pid) if pio is not None else None
        if udp is not None and (udp.tx.msgs or udp.rx.msgs or tcp is None or not tcp.moved):
            console.print(_packet_io_table(udp))
            _packet_io_notes(udp, say)
        if tcp is not None and tcp.moved:
            _tcp_line(tcp, say)
        cr = analysis.crypto
        if cr is not None and p.pid in cr.processes:
            _crypto_section(cr.processes[p.pid], say, console)
    for e in profile.empty_targets:
        say(f"\npid {e.pid} {e.comm}: no samples (idle or exited before sampling)")
    if pio is not None:
        console.print()
        _run_wide(pio, say)
    if analysis.crypto is not None:
        _crypto_cost(analysis.crypto, say)
    if analysis.recommendations:
        console.print()
        say("recommendations", "bold")
        for r in analysis.recommendations:
            say(f"- {r.topic}: {r.finding}")
            say(f"  -> {r.advice}", "green")


def render_verdict(v: Verdict, console: Console) -> None:
    """The verdict, its cause, every criterion per side with its measured value and threshold, the
    stack's own record beside it, notes and the thresholds."""
    colour = {"neither": "cyan", "both": "red"}.get(v.limited_by, "yellow")
    console.print()
    console.print(Text(f"verdict: {v.limited_by} (cause: {v.cause})", style=f"bold {colour}"))
    console.print(Text(f"  {v.summary}"))
    for s in v.sides:
        state = s.cause or ("not judged: " + s.no_traffic if s.no_traffic else "not limiting")
        console.print(Text(f"  {s.role} {s.comm} ({s.pid}): {state}"
                           + (f"; binds: {s.binds}" if s.binds else ""), style="bold"))
        for group, findings, met in s.groups():
            verdict = "met" if met else "not met"
            why = s.not_its_cause(group) if met else None
            if why:  # a ticked group under another cause says why it is not it
                verdict += f"; not its cause: {why}"
            console.print(Text(f"    {group.cause}, when {group.combine} of these hold: {verdict}",
                               style="" if met else "dim"))
            for f in findings:
                console.print(Text(f"      [{'x' if f.met else ' '}] {f.text}", style="" if f.met else "dim"))
    word = v.stack_record
    if word is not None:
        rec = word.record  # its span and shares as the JSON report rounds them: both print the same figure
        split = ", ".join(f"{r} {x:.0%}" for r, x in sorted(rec.rounded_shares().items(), key=lambda kv: -kv[1]))
        said = {True: "agrees", False: "disagrees", None: "cannot say"}[word.agrees]
        want = " or ".join(word.expected) or "nothing for this cause"
        console.print(Text(f"  the stack's own record (qlog, {rec.role}, the sender): {split} of "
                           f"{round(rec.span_s, 3):.1f} s; {rec.packets_lost} of {rec.packets_sent} packets lost: "
                           f"{said} (a {v.cause} verdict expects {want})", style="bold"))
    for n in v.notes:
        console.print(Text(f"  - {n}", style="dim"))
    for s in v.sides:
        if s.cpus:
            console.print(Text(f"  - {s.role} busiest thread ran on CPU {' and '.join(map(str, s.cpus))} "
                               f"(NUMA node {', '.join(map(str, s.numa_nodes))}; {s.cpu_changes} change(s) "
                               "between readings)", style="dim"))
    console.print(Text("  thresholds: " + ", ".join(f"{k} {v_:.0%}" for k, v_ in v.thresholds.items()),
                       style="dim"))
