"""Probe groups as units: the registry, the C layouts read back from the compiled object, and the
direction of imports between the layers (probes -> collectors -> archive -> attribution -> viewer -> qprof)."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import ROOT
from qprof.attribution import packetio as packetio_analysis
from qprof.probes import btf, layout, libbpf
from qprof.probes.group import BpftraceGroup
from qprof.probes.packetio import MAX_TARGETS
from qprof.probes.packetio.maps import PacketioMaps
from qprof.probes.registry import DEFAULT_GROUPS, GROUPS



def test_registry_names_and_defaults() -> None:
    assert all(name == g.name for name, g in GROUPS.items())
    assert DEFAULT_GROUPS == ("packetio", "waits")
    for g in GROUPS.values():
        assert g.summary and isinstance(g.tracepoints, tuple)
        if type(g) is BpftraceGroup:  # a shipped script (crypto writes its own for each run)
            assert (ROOT / "probes" / g.name / f"{g.name}.bt").is_file(), g.name


def test_every_groups_tracepoints_exist_on_this_kernel(kernel_facing: None) -> None:
    for g in GROUPS.values():
        missing = [tp for tp in g.tracepoints if not btf.tracepoint_exists(tp)]
        assert not missing, (g.name, missing)


@pytest.fixture(scope="module")
def packetio_object(kernel_facing: None) -> Path:
    for tool in ("clang", "bpftool"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} missing (make test installs it)")
    return libbpf.build("qprof.probes.packetio", "packetio")


def _field_by_field(s: layout.Struct, buf: bytes, base: int) -> dict[str, int | list[int]]:
    return {n: f.decode(buf, base) for n, f in s.fields.items()}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([1, 2, 4, 8]), st.integers(1, 3), st.booleans(), st.integers(0, 5)),
                min_size=1, max_size=6), st.binary(min_size=256, max_size=256), st.integers(0, 16))
def test_a_struct_decoded_in_one_unpack_is_decoded_field_by_field(
        spec: list[tuple[int, int, bool, int]], buf: bytes, base: int) -> None:
    """Any layout, gaps and arrays included; fields that overlap (a union's) are read one at a time."""
    fields, at = {}, 0
    for i, (size, count, signed, gap) in enumerate(spec):
        fields[f"f{i}"] = layout.Field(f"f{i}", at + gap, size, count, signed)
        at += gap + size * count
    s = layout.Struct("s", at, dict(reversed(list(fields.items()))))  # the dict's order is not the offsets'
    assert s.decode(buf, base) == _field_by_field(s, buf, base) and list(s.decode(buf, base)) == list(s.fields)
    union = layout.Struct("u", 8, {"a": layout.Field("a", 0, 8, 1, False), "b": layout.Field("b", 4, 4, 1, True)})
    assert union.decode(buf, base) == _field_by_field(union, buf, base)


def test_packetio_layouts_come_from_the_object(packetio_object: Path) -> None:
    """Python decodes what the C defines: every counter of struct counts is one the analysis knows,
    and the configuration, control block and histograms have the fields the sampler writes."""
    lay = layout.read(packetio_object)
    counts = lay.struct("counts")
    assert set(counts.fields) == set(packetio_analysis._COUNTERS)
    assert all(f.size == 8 and f.count == 1 for f in counts.fields.values())
    cfg = lay.struct("config")
    assert lay.initial("limits", "limits")["targets"] == MAX_TARGETS and cfg.field("ntargets").size == 4
    assert lay.variable("cfg").section == ".rodata" and lay.variable("ctl").section == ".bss"
    control = lay.struct("control")
    assert control.field("gate").size == 4 and control.field("ports").count * 64 == 65536
    steps = lay.initial("steps", "hist_steps")
    assert set(steps) == set(lay.struct("hists").fields) and all(int(v) > 0 for v in steps.values())
    # the analysis reads the histograms under these names (PacketioMaps.from_maps)
    rec = PacketioMaps.from_maps({f"@{name}": {"1": [{"min": 0, "max": 3, "count": 2}]} for name in steps})
    assert set(rec.hists) == {f"@{name}" for name in steps}
    # the configuration the sampler loads with lands where the C reads it
    rodata = lay.section_with(".rodata", "cfg", "config", {"ntargets": 2, "gro_bit": 3, "nnetns": 1})
    back = cfg.decode(rodata, lay.variable("cfg").offset)
    assert back["ntargets"] == 2 and back["gro_bit"] == 3 and back["nnetns"] == 1
    # the targets' bits, where the sampler sets them
    assert lay.variable("watch").section == ".bss" and lay.struct("watch").field("tgids").count * 64 == 1 << 22
    assert lay.initial("steps", "hist_steps") == steps, "setting the config keeps the other read-only data"
    for name in ("counts", "hists", "config", "control"):
        st_ = lay.struct(name)
        raw = bytes(range(256)) * (st_.size // 256 + 2)
        assert st_.decode(raw, 3) == _field_by_field(st_, raw, 3), name
    # where the globals sit: as pyelftools reads the object's symbol table
    from elftools.elf.elffile import ELFFile
    from elftools.elf.sections import SymbolTableSection

    with open(packetio_object, "rb") as f:
        e = ELFFile(f)
        symtab = e.get_section_by_name(".symtab")
        assert isinstance(symtab, SymbolTableSection)
        want = {s.name: (e.get_section(s["st_shndx"]).name, s["st_value"], s["st_size"]) for s in symtab.iter_symbols()
                if s["st_info"]["type"] == "STT_OBJECT" and isinstance(s["st_shndx"], int)
                and e.get_section(s["st_shndx"]).name in (".rodata", ".data", ".bss")}
    assert {v.name: (v.section, v.offset, v.size) for v in lay.variables.values()} == want and len(want) >= 5


# Product modules by layer, in the order data flows, and the layers each may import. The archive
# (archive/) is the contract between collection and analysis: the collectors write it, attribution and
# the viewer read it, and neither side imports the other. identity sits with it: the one live /proc
# question the archive reader asks (whether a run's collector still lives); every other /proc read is
# a collector's (collectors.procfs).
SHARED = {"qprof.cachefiles", "qprof.errors", "qprof.jsonvalue", "qprof.readlimits", "qprof.runfiles", "qprof.version"}  # leaves every layer uses
LAYERS = ("probes", "collectors", "archive", "attribution", "viewer", "qprof")
MAY_IMPORT = {
    "probes": {"probes"},
    "collectors": {"probes", "collectors", "archive"},
    "archive": {"probes", "archive"},
    "attribution": {"probes", "archive", "attribution"},  # mappings/ is data of the attribution layer
    "viewer": {"archive", "attribution", "viewer"},  # what the probes measured comes through attribution
    "qprof": set(LAYERS),  # the command line, API, demo and record drive every layer
}
FOLDERS = ("probes", "collectors", "archive", "attribution", "mappings", "viewer", "qprof")  # as qprof.<folder>
FOREIGN = ("lab", "tests", "conftest", "endpoints")  # the labs and tests: never imported by the product


def layer_of(module: str) -> str | None:
    """The layer of a product module (None: a shared leaf)."""
    if module in SHARED:
        return None
    part = module.split(".")[1] if module.count(".") else ""
    return {"mappings": "attribution"}.get(part, part) if part in FOLDERS[:-1] else "qprof"


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = [p for p in rel.parts if p != "__init__"]
    return ".".join(parts if parts[0] == "qprof" else ["qprof", *parts])


def imported(path: Path) -> list[str]:
    """Every module `path` imports, at any depth of the file (`from qprof.archive import schema`
    counts as qprof.archive.schema)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            base = node.module if node.level == 0 else \
                ".".join(module_name(path).split(".")[:-node.level] + [node.module])
            out += [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        elif isinstance(node, ast.Import):
            out += [a.name for a in node.names]
    return out


def product_modules() -> list[Path]:
    return sorted(p for folder in FOLDERS for p in (ROOT / folder).rglob("*.py"))


MODULES = {module_name(p) for p in product_modules()}


def against_the_flow(edges: list[tuple[str, str]]) -> list[str]:
    """The (importer, imported) pairs that point against the flow or out of the product."""
    bad = []
    for src, mod in edges:
        if mod.split(".")[0] in FOREIGN:
            bad.append(f"{src} imports {mod} (a lab or test module)")
            continue
        if not (mod == "qprof" or mod.startswith("qprof.")) or layer_of(mod) is None:
            continue  # the standard library, third parties, the shared leaves
        have, want = layer_of(src), layer_of(mod)
        if have is not None and want not in MAY_IMPORT[have]:
            bad.append(f"{src} ({have}) imports {mod} ({want})")
    return bad


def test_the_rule_catches_arrows_against_the_flow() -> None:
    """The check itself: each kind of wrong arrow is found, the right ones pass."""
    assert against_the_flow([("qprof.attribution.verdict", "qprof.archive"),
                             ("qprof.collectors.session", "qprof.archive.model"),
                             ("qprof.viewer.terminal", "qprof.mappings"),
                             ("qprof.probes.group", "qprof.runfiles"),
                             ("qprof.cli", "qprof.viewer.terminal")]) == []
    wrong = [("qprof.attribution.live", "qprof.collectors.session"),  # analysis from a collector
             ("qprof.archive", "qprof.collectors.chunks"),  # the archive from a collector
             ("qprof.probes.doctor", "qprof.archive.identity"),
             ("qprof.archive", "qprof.collectors.procfs"),
             ("qprof.viewer.terminal", "qprof.cli"),
             ("qprof.demo", "lab.scenarios"),
             ("qprof.collectors.session", "qprof.api"),
             ("qprof.collectors.session", "qprof")]  # the package: it imports the API
    assert len(against_the_flow(wrong)) == len(wrong)


def test_no_module_imports_against_the_flow() -> None:
    """Every product module, function-level imports included: none imports a later layer, the labs
    or the tests, so data flows probes -> collectors -> archive -> attribution -> viewer -> qprof."""
    modules = product_modules()
    assert len(modules) > 80 and all(layer_of(module_name(p)) or module_name(p) in SHARED for p in modules)
    edges = [(module_name(p), mod) for p in modules for mod in imported(p)]
    bad = against_the_flow(edges)
    assert not bad, "\n".join(bad)


def test_every_group_is_packaged_and_in_the_help() -> None:
    """A group is its folder plus its registry line: setup.py packages the folder, `--probes` lists it."""
    import runpy

    packaged = runpy.run_path(str(ROOT / "setup.py"), run_name="setup")["packages"]()
    helped = subprocess.run([sys.executable, "-m", "qprof.cli", "attach", "--help"], capture_output=True,
                            text=True, check=True).stdout
    flat = "".join(helped.split())  # click wraps (and breaks at hyphens): compare without whitespace
    for name, group in GROUPS.items():
        assert f"qprof.probes.{name}" in packaged
        assert f"{name}{'' if group.default else '(opt-in)'}:" in flat


def test_one_list_of_installed_folders() -> None:
    """setup.py installs the folders; the unprivileged runner replicates the same packages."""
    import runpy

    from qprof.unprivileged import PACKAGES

    assert set(runpy.run_path(str(ROOT / "setup.py"), run_name="setup")["FOLDERS"]) == set(PACKAGES)
    assert {f"qprof.{f}" for f in FOLDERS if f != "qprof"} | {"qprof"} == set(PACKAGES)
