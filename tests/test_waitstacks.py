"""The wait stacks named at report time (attribution.waitstacks), `where` a wait blocked, the off-CPU flame
graph (viewer.offcpu, `qprof flamegraph --off-cpu`) and the terminal's line per wait kind.

Naming runs on a small program compiled here (its symbol table, a stripped copy, a debug file, the debug file
collectors.debuginfo makes from the unwind table); `where` and the tree on synthetic paths and maps; the rest
on a real run of tests/workloads/waits.c recorded once (root, perf and the probes).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from elftools.elf.elffile import ELFFile

from conftest import ROOT, build_c, qprof
from qprof.archive import Run
from qprof.archive.model import DEBUG_FILE, DYNSYM, SYMTAB, UNWIND, MappedObject, Meta, ObjectSymbols, Target
from qprof.attribution.waits import LABELS, STATES, wall_clock
from qprof.attribution.waitstacks import NO_STACK, named, where
from qprof.probes.elf import build_id, function_starts
from qprof.errors import QprofError
from qprof.probes.waits.maps import WaitMaps
from qprof.viewer.flamegraph_svg import PAD, WIDTH, flame_svg
from qprof.viewer.flametree import ROOT as ROOT_FRAME, Selection
from qprof.viewer.offcpu import offcpu_flame
from qprof.viewer.palette import WAIT_FAMILIES, category_colour
from test_flamegraph import hls

SVG = "{http://www.w3.org/2000/svg}"
SCHED = "entry_SYSCALL_64_after_hwframe_[k];do_syscall_64_[k];__x64_sys_{call}_[k];schedule_[k];__schedule_[k]"
PROGRAM = r"""
__attribute__((noinline)) int alpha(int x) { volatile int y = x; for (int i = 0; i < 100; i++) y += i; return y; }
__attribute__((noinline)) int beta(int x) { volatile int y = x; for (int i = 0; i < 50; i++) y *= 3; return y + alpha(x); }
int main(int argc, char **argv) { (void)argv; return beta(argc) & 1; }
"""


def in_wait_family(colour: str, state: str) -> bool:
    f = WAIT_FAMILIES[state]
    h, light, s = hls(colour)
    if f.saturation == 0:
        return s < 0.02 and f.lightness[0] - 0.01 <= light <= f.lightness[1] + 0.01
    return f.hue[0] - 1.5 <= h <= f.hue[1] + 1.5 and abs(s - f.saturation) < 0.03 \
        and f.lightness[0] - 0.01 <= light <= f.lightness[1] + 0.01


# -- where


@pytest.mark.parametrize("path, want", [
    ("[libc.so.6+0x2724a];main;epoll_wait;" + SCHED.format(call="epoll_wait"), "epoll_wait <- main"),
    ("recvfrom;" + SCHED.format(call="recvfrom"), "recvfrom"),  # only the wrapper: the call alone
    ("net_loop;__libc_recvfrom;" + SCHED.format(call="recvfrom"), "recvfrom <- net_loop"),
    ("worker;pthread_cond_wait;__futex_abstimed_wait_common;" + SCHED.format(call="futex"),
     "futex <- pthread_cond_wait"),
    ("reader;__libc_pread;" + SCHED.format(call="pread64"), "pread64 <- reader"),
    ("pacer;__nanosleep;__GI___clock_nanosleep;" + SCHED.format(call="clock_nanosleep"), "clock_nanosleep <- pacer"),
    ("thread_main;__libc_read;" + SCHED.format(call="read"), "read <- thread_main"),  # not read's wrapper
    ("main;[unknown];" + SCHED.format(call="ppoll"), "ppoll <- main"),
    ("main;poll;el0t_64_sync_[k];el0_svc_[k];do_el0_svc_[k];invoke_syscall_[k];__arm64_sys_ppoll_[k];"
     "do_sys_poll_[k];schedule_[k];__schedule_[k]", "ppoll <- main"),
    # the entry inlined: the frame the dispatcher called
    ("main;wait4;entry_SYSCALL_64_after_hwframe_[k];do_syscall_64_[k];kernel_wait4_[k];do_wait_[k];schedule_[k];"
     "__schedule_[k]", "wait4 <- main"),
    ("main;memcpy;asm_exc_page_fault_[k];exc_page_fault_[k];do_user_addr_fault_[k];handle_mm_fault_[k];"
     "io_schedule_[k];schedule_[k];__schedule_[k]", "page fault <- memcpy"),
    ("ret_from_fork_[k];kthread_[k];worker_thread_[k];schedule_[k];__schedule_[k]", "worker_thread"),
    ("main;loop", "loop"),
    ("[libngtcp2.so.16+0x1c2d0];" + SCHED.format(call="sendmsg"), "sendmsg <- [libngtcp2.so.16+0x1c2d0]"),
    ("", NO_STACK),
    ("[unknown]", NO_STACK),
])
def test_where_names_the_call_and_the_innermost_user_frame_that_is_not_its_wrapper(path: str, want: str) -> None:
    assert where(path) == want


def test_where_cuts_long_names() -> None:
    got = where("x" * 200 + ";" + SCHED.format(call="epoll_wait"))
    assert got.startswith("epoll_wait <- xxx") and got.endswith("...") and len(got) < 80


# -- named: a program compiled here


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The program, a stripped copy, its functions' starts and the file offset of an address in each."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None or shutil.which("strip") is None or shutil.which("objcopy") is None:
        pytest.skip("needs a C compiler and binutils (make test installs them)")
    d = tmp_path_factory.mktemp("waitstacks")
    (d / "prog.c").write_text(PROGRAM)
    prog, stripped = d / "prog", d / "prog-stripped"
    subprocess.run([cc, "-O1", "-Wl,--build-id", "-o", str(prog), str(d / "prog.c")], check=True)
    subprocess.run(["strip", "-o", str(stripped), str(prog)], check=True)
    starts = {f: function_starts(str(prog))[f] for f in ("alpha", "beta", "main")}
    bid = build_id(str(prog))[0]
    with open(prog, "rb") as f:
        elf = ELFFile(f)
        segs = [(s["p_offset"], s["p_vaddr"], s["p_filesz"]) for s in elf.iter_segments()
                if s["p_type"] == "PT_LOAD" and s["p_flags"] & 1]
        data = [s["p_offset"] + s["p_filesz"] // 2 for s in elf.iter_segments()
                if s["p_type"] == "PT_LOAD" and not s["p_flags"] & 1 and s["p_filesz"]]

    def offset(vaddr: int) -> int:
        off, va, _ = next(s for s in segs if s[1] <= vaddr < s[1] + s[2])
        return vaddr - va + off

    assert bid is not None
    return {"prog": prog, "stripped": stripped, "starts": starts, "build_id": bid, "offset": offset, "dir": d,
            "data": data}


def run_of(path: Path, how: str, build_id: str | None, source: str | None = None, pid: int = 1,
           more: list[Target] | None = None) -> Any:
    meta = Meta(targets=[Target(pid, "prog", str(path), objects=[MappedObject(str(path), build_id)]), *(more or [])],
                symbols=[ObjectSymbols(str(path), build_id, how, source)])
    return SimpleNamespace(meta=meta)


def frame(program: dict[str, Any], obj: str, function: str, into: int) -> str:
    return f"[{obj}+{program['offset'](program['starts'][function] + into):#x}]"


def test_named_names_user_frames_from_the_symbol_table_and_merges_what_becomes_equal(program: dict[str, Any]) -> None:
    kernel = SCHED.format(call="clock_nanosleep")
    stacks = {"timer": {
        ";".join([frame(program, "prog", "main", 2), frame(program, "prog", "beta", 3), kernel]): 1.0,
        ";".join([frame(program, "prog", "main", 3), frame(program, "prog", "beta", 5), kernel]): 0.5,
        # a return address right after a call that ends its function: that function, not the next one
        ";".join([frame(program, "prog", "beta", 0), kernel]): 0.125,
        f"[unknown];[libgone.so+0x10];{kernel}": 0.25},
        "network": {frame(program, "prog", "alpha", 4): 2.0}}
    got = named(stacks, run_of(program["prog"], SYMTAB, program["build_id"]), pid=1)
    starts = function_starts(str(program["prog"]))
    before = max((a, n) for n, a in starts.items() if a < program["starts"]["beta"])[1]
    assert got == {"timer": {f"main;beta;{kernel}": 1.5, f"[unknown];[libgone.so+0x10];{kernel}": 0.25,
                             f"{before};{kernel}": 0.125},
                   "network": {"alpha": 2.0}}


def test_a_stripped_object_is_named_from_its_debug_file_or_the_unwind_table_else_left_as_written(
        program: dict[str, Any], tmp_path: Path) -> None:
    from qprof.collectors.debuginfo import unwind_symbols

    stripped, bid = program["stripped"], program["build_id"]
    raw = ";".join([frame(program, stripped.name, "main", 2), frame(program, stripped.name, "alpha", 2)])
    stacks = {"thread": {raw: 1.0}}
    # exported functions only: an address after one may be in an internal function: not named
    assert named(stacks, run_of(stripped, DYNSYM, bid)) == stacks
    assert named(stacks, run_of(stripped, DEBUG_FILE, bid, str(program["prog"]))) == {"thread": {"main;alpha": 1.0}}
    debug = tmp_path / "unwind.debug"
    unwind_symbols(str(stripped), debug)  # what collectors.debuginfo records as the object's source
    starts = program["starts"]
    assert named(stacks, run_of(stripped, UNWIND, bid, str(debug))) == {"thread": {
        f"{stripped.name}+{starts['main']:#x};{stripped.name}+{starts['alpha']:#x}": 1.0}}


def test_frames_stay_as_written_when_the_object_is_not_the_one_the_run_mapped(program: dict[str, Any]) -> None:
    stacks = {"disk": {frame(program, "prog", "alpha", 2): 1.0}}
    assert named(stacks, run_of(program["prog"], SYMTAB, "00" * 20)) == stacks  # rebuilt since
    assert named(stacks, run_of(program["dir"] / "gone" / "prog", SYMTAB, program["build_id"])) == stacks
    # another target maps a file of the same name: a pid's own objects only, when it recorded one of that name
    other = Target(2, "prog", "/gone/prog", objects=[MappedObject("/gone/prog", "11" * 20)])
    run = run_of(program["prog"], SYMTAB, program["build_id"], more=[other])
    assert named(stacks, run, pid=2) == stacks
    assert named(stacks, run, pid=1) == {"disk": {"alpha": 1.0}}


def test_an_offset_outside_the_code_is_unknown(program: dict[str, Any]) -> None:
    """A frame-pointer walk through code built without them reads data as return addresses."""
    if not program["data"]:
        pytest.skip("the linker put no data segment apart from the code")
    kernel = SCHED.format(call="clock_nanosleep")
    stacks = {"timer": {f"[prog+{program['data'][0]:#x}];{frame(program, 'prog', 'alpha', 2)};{kernel}": 1.0}}
    got = named(stacks, run_of(program["prog"], SYMTAB, program["build_id"]))
    assert got == {"timer": {f"[unknown];alpha;{kernel}": 1.0}}
    assert where(next(iter(got["timer"]))) == "clock_nanosleep <- alpha"


# -- the off-CPU tree, on synthetic maps


def waits(pid: int, shares: dict[str, float], stacks: dict[str, int], seconds: float = 4.0) -> WaitMaps:
    doc: dict[str, Any] = {"@wait_ns": {}, "@wait_n": {}, "@wait_comm": {f"{pid},{pid},t": 1},
                           "@wait_span": {"start_ns": 0, "end_ns": int(seconds * 1e9)},
                           "@wait_config": {"stack_interval_ms": 10}, "@wait_stacks": stacks}
    for state, share in shares.items():
        doc["@wait_ns"][f"{pid},{pid},{state}"] = int(share * seconds * 1e9)
        doc["@wait_n"][f"{pid},{pid},{state}"] = 5
    return WaitMaps.from_maps(doc)


def analysis_of(walls: dict[int, Any], targets: list[Target]) -> Any:
    run = SimpleNamespace(meta=Meta(targets=targets), path=Path("/runs/synthetic"), probes=lambda: None)
    return SimpleNamespace(profile=SimpleNamespace(run=run, processes=[]), wall=walls)


SHARES = {"on_cpu": 0.25, "runnable": 0.05, "network": 0.4, "timer": 0.3}


def test_the_off_cpu_tree_is_the_wall_time_with_each_kind_over_its_call_paths() -> None:
    net = f"main;[libx.so+0x10];{SCHED.format(call='recvmsg')}"
    maps = waits(7, SHARES, {f"7;network;{net}": 3, "7;network;main": 1, "7;timer;main;sleep": 1})
    wall = wall_clock(maps, 7, None)
    assert wall is not None
    flame = offcpu_flame(analysis_of({7: wall}, [Target(7, "srv", role="server")]), Selection())
    root = flame.root
    assert root.name == "srv (pid 7, server)"
    assert abs(root.period - 4e9) <= 4, "the widths add up to the thread's window"
    assert sorted(root.children) == sorted(SHARES)
    for state, share in SHARES.items():
        node = root.children[state]
        assert abs(node.period - share * 4e9) <= 4 and node.category == state
        assert in_wait_family(node.colour, state)
    network = root.children["network"]
    path = network.find(["main", "[libx.so+0x10]", "entry_SYSCALL_64_after_hwframe_[k]"])
    assert path is not None and path.dso == "[kernel.kallsyms]"
    assert abs(network.children["main"].period - 1.6e9) <= 4
    assert abs(path.period - 1.2e9) <= 4, "a kind's sampled paths scaled to its exact total"
    assert root.children["on_cpu"].children == {} and root.children["runnable"].children == {}
    assert [s for s, _ in flame.legend()] == ["on_cpu", "runnable", "network", "timer"]
    assert dict(flame.legend())["network"] == f"{LABELS['network']} 40.0%"
    tip = flame.describe(network)
    assert "1.600 s, 40.00% of the wall time shown" in tip and LABELS["network"] in tip


def test_several_processes_each_have_a_frame_and_bad_selections_are_refused() -> None:
    w1 = wall_clock(waits(7, SHARES, {}), 7, None)
    w2 = wall_clock(waits(8, {"on_cpu": 0.5, "disk": 0.5}, {}, 2.0), 8, None)
    a = analysis_of({7: w1, 8: w2}, [Target(7, "srv", role="server"), Target(8, "cli", role="client")])
    flame = offcpu_flame(a, Selection())
    assert flame.root.name == ROOT_FRAME and abs(flame.root.period - 6e9) <= 8
    assert set(flame.root.children) == {"srv (pid 7, server)", "cli (pid 8, client)"}
    assert set(flame.root.children["cli (pid 8, client)"].children) == {"on_cpu", "disk"}
    assert offcpu_flame(a, Selection(role="client")).root.name == "cli (pid 8, client)"
    with pytest.raises(QprofError, match="per process"):
        offcpu_flame(a, Selection(tid=7))
    with pytest.raises(QprofError, match="no wall-clock record of pid 9.*7, 8"):
        offcpu_flame(a, Selection(pid=9))
    with pytest.raises(QprofError, match="waits probes did not run"):
        offcpu_flame(analysis_of({}, []), Selection())


# -- a real run


@pytest.fixture(scope="module")
def waits_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """tests/workloads/waits.c for 2 s under `qprof record` (default probes: waits among them), with its
    JSON report and its own record of the waits."""
    import os

    if os.geteuid() != 0 or shutil.which("perf") is None:
        pytest.skip("needs root and perf for the probes and sampling")
    binary = build_c(ROOT / "tests" / "workloads" / "waits.c", "waits", ["-pthread"])
    d = tmp_path_factory.mktemp("waits-run")
    (d / "work").mkdir()
    qprof("record", "-o", str(d / "run"), "--", str(binary), "2", str(d / "truth.json"), str(d / "work"))
    truth = json.loads((d / "truth.json").read_text())
    report = json.loads(qprof("report", str(d / "run"), "--format", "json").stdout)
    wall = next(p for p in report["processes"] if p["pid"] == truth["pid"])["wall_clock"]
    assert wall is not None, "no wall clock: the waits probes did not run"
    return {"run": d / "run", "wall": wall, "pid": truth["pid"], "truth": truth, "dir": d}


@pytest.mark.root
def test_a_real_runs_wait_stacks_are_named_and_say_where_they_blocked(waits_run: dict[str, Any]) -> None:
    run = Run.open(waits_run["run"])
    wall, pid = waits_run["wall"], waits_run["pid"]
    got = named(wall["stacks"], run, pid)
    for kind, paths in wall["stacks"].items():
        assert sum(got[kind].values()) == pytest.approx(sum(paths.values()), rel=1e-9), "no time lost in merging"
    readable = {s.path.rsplit("/", 1)[-1] for s in run.meta.symbols
                if s.how in (SYMTAB, DEBUG_FILE, UNWIND) and Path(s.source or s.path).is_file()}
    left = {f for paths in got.values() for p in paths for f in p.split(";")
            if re.fullmatch(r"\[(.+)\+0x[0-9a-f]+\]", f) and f[1:].split("+")[0] in readable}
    assert not left, f"frames of objects with function names left unnamed: {sorted(left)[:5]}"
    assert "waits" in readable, "the workload is built with its symbol table"
    funcs = {f for paths in got.values() for p in paths for f in p.split(";")}
    assert funcs & {"net_main", "timer_main", "cond_main", "signal_main", "disk_main", "main"}, sorted(funcs)[:20]

    def top(kind: str) -> str:
        spots: dict[str, float] = {}
        for p, s in got[kind].items():
            spots[where(p)] = spots.get(where(p), 0.0) + s
        return max(spots, key=lambda k: spots[k])

    assert top("network").startswith("recvfrom"), top("network")  # w-net in recvfrom
    assert top("thread").startswith("futex"), top("thread")  # w-cond in pthread_cond_wait
    assert any(where(p).startswith(("clock_nanosleep", "epoll_wait")) for p in got["timer"])
    text = qprof("report", str(waits_run["run"])).stdout
    line = next(ln for ln in text.splitlines() if ln.strip().startswith("waiting: network"))
    assert re.fullmatch(r"\s+waiting: network \d+\.\d\d s, most in recvfrom.* \(\d+%\)", line), line


def svg_frames(path: Path) -> list[dict[str, Any]]:
    doc = ET.parse(path).getroot()
    out = []
    for g in doc.iter(f"{SVG}g"):
        if g.get("class") == "f":
            rect = g.find(f"{SVG}rect")
            assert rect is not None
            out.append({"name": g.get("data-name"), "depth": int(g.get("data-d") or 0),
                        "width": float(rect.get("width") or 0), "fill": rect.get("fill"),
                        "tip": (g.findtext(f"{SVG}title") or "")})
    return out


@pytest.mark.root
def test_a_real_runs_off_cpu_flame_graph_shows_its_wall_time_by_kind(waits_run: dict[str, Any]) -> None:
    out = waits_run["dir"] / "off.svg"
    r = qprof("flamegraph", str(waits_run["run"]), "--off-cpu", "-o", str(out))
    assert "off-CPU flame graph of" in r.stderr
    wall = waits_run["wall"]["total"]
    window, seconds = wall["window_s"], wall["seconds"]
    frames = svg_frames(out)
    root = next(f for f in frames if f["depth"] == 0)
    assert root["name"].endswith(f"(pid {waits_run['pid']})")
    graph_w = WIDTH - 2 * PAD
    kinds = {f["name"]: f for f in frames if f["depth"] == 1}
    assert set(kinds) <= set(STATES)
    shown = sum(f["width"] for f in kinds.values()) / graph_w * window
    assert shown == pytest.approx(window, rel=0.01), "the kinds' widths add up to the process's wall time"
    assert float(re.search(r"([\d,.]+) s,", root["tip"]).group(1).replace(",", "")) == pytest.approx(window, rel=0.01)
    doc = out.read_text()
    for state, secs in seconds.items():
        if secs / window < 0.005:
            continue
        assert state in kinds, f"{state}: {secs:.2f} s of {window:.2f} s not drawn"
        assert kinds[state]["width"] / graph_w * window == pytest.approx(secs, abs=0.01 * window)
        assert in_wait_family(kinds[state]["fill"], state), (state, kinds[state]["fill"])
        assert f'fill="{category_colour(state)}"' in doc, f"{state}'s legend swatch"
        assert LABELS[state] in doc
    for state in ("network", "thread", "timer"):  # the workload blocks in each, with sampled call paths
        assert any(f["depth"] > 1 and in_wait_family(f["fill"], state) for f in frames), state
    assert any(f["name"] == "recvfrom" for f in frames) and any(f["name"].endswith("_[k]") for f in frames)


@pytest.mark.root
def test_a_real_runs_off_cpu_page_and_what_the_option_refuses(waits_run: dict[str, Any]) -> None:
    run, d = str(waits_run["run"]), waits_run["dir"]
    out = d / "off.html"
    qprof("flamegraph", run, "--off-cpu", "-o", str(out))
    text = out.read_text()
    data = json.loads(re.search(r'<script type="application/json" id="qprof-data">(.*?)</script>', text, re.S)
                      .group(1))
    tree, window = data["tree"], waits_run["wall"]["total"]["window_s"]
    assert tree["value"] * 1e-9 == pytest.approx(window, rel=0.01)
    assert sum(c["value"] for c in tree["children"]) == tree["value"]
    for c in tree["children"]:
        assert in_wait_family(c["fill"], c["name"]) and c["category"] == c["name"]
    assert {i["category"] for i in data["legend"]} <= set(STATES)
    for args, why in ((["-o", str(d / "x.speedscope.json")], "svg or .html"),
                      (["--thread", "1", "-o", str(d / "x.svg")], "per process")):
        r = qprof("flamegraph", run, "--off-cpu", *args, check=False)
        assert r.returncode == 2 and why in r.stderr, r.stderr
    qprof("flamegraph", run, "--off-cpu")  # the default file, beside the run
    assert (d / "run-offcpu.svg").is_file()


def test_the_svg_writer_draws_it_in_the_kinds_colours() -> None:
    """Without a kernel: the one SVG writer (flame_svg) draws the off-CPU tree, each kind in its family."""
    wall = wall_clock(waits(7, SHARES, {"7;timer;main;sleep": 1}), 7, None)
    flame = offcpu_flame(analysis_of({7: wall}, [Target(7, "srv")]), Selection())
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "f.svg"
        path.write_text(flame_svg(flame))
        frames = svg_frames(path)
        doc = path.read_text()
    kinds = {f["name"]: f for f in frames if f["depth"] == 1}
    assert set(kinds) == set(SHARES)
    assert sum(f["width"] for f in kinds.values()) == pytest.approx(WIDTH - 2 * PAD, rel=0.001)
    for state, share in SHARES.items():
        assert kinds[state]["width"] == pytest.approx(share * (WIDTH - 2 * PAD), abs=0.02)
        assert in_wait_family(kinds[state]["fill"], state)
        assert f'fill="{category_colour(state)}"' in doc
    assert {f["name"] for f in frames if f["depth"] > 1} == {"main", "sleep"}
