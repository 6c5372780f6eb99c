"""Probe groups as units: the registry, the C layouts read back from the compiled object, and the
direction of imports between the layers (probes -> collectors -> attribution -> viewer)."""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import pytest

from conftest import ROOT
from qprof.attribution import packetio as packetio_analysis
from qprof.probes import btf, layout, libbpf
from qprof.probes.group import BpftraceGroup
from qprof.probes.packetio import MAX_TARGETS
from qprof.probes.packetio.record import PacketioRecord
from qprof.probes.registry import DEFAULT_GROUPS, GROUPS

LAYERS = ("probes", "collectors", "attribution", "viewer")  # each may import only from those before it


def test_registry_names_and_defaults() -> None:
    assert all(name == g.name for name, g in GROUPS.items())
    assert DEFAULT_GROUPS == ("packetio",)
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


def test_packetio_layouts_come_from_the_object(packetio_object: Path) -> None:
    """Python decodes what the C defines: every counter of struct counts is one the analysis knows,
    and the configuration, control block and histograms have the fields the sampler writes."""
    lay = layout.read(packetio_object)
    counts = lay.struct("counts")
    assert set(counts.fields) == set(packetio_analysis._COUNTERS)
    assert all(f.size == 8 and f.count == 1 for f in counts.fields.values())
    cfg = lay.struct("config")
    assert cfg.field("targets").count == MAX_TARGETS and cfg.field("ntargets").size == 4
    assert lay.variable("cfg").section == ".rodata" and lay.variable("ctl").section == ".bss"
    control = lay.struct("control")
    assert control.field("gate").size == 4 and control.field("ports").count * 64 == 65536
    steps = lay.initial("steps", "hist_steps")
    assert set(steps) == set(lay.struct("hists").fields) and all(int(v) > 0 for v in steps.values())
    # the analysis reads the histograms under these names (PacketioRecord.from_maps)
    rec = PacketioRecord.from_maps({f"@{name}": {"1": [{"min": 0, "max": 3, "count": 2}]} for name in steps})
    assert set(rec.hists) == {f"@{name}" for name in steps}
    # the configuration the sampler loads with lands where the C reads it
    rodata = lay.section_with(".rodata", "cfg", "config", {"targets": [7, 9], "ntargets": 2, "gro_bit": 3})
    back = cfg.decode(rodata, lay.variable("cfg").offset)
    assert back["targets"][:3] == [7, 9, 0] and back["ntargets"] == 2 and back["gro_bit"] == 3
    assert lay.initial("steps", "hist_steps") == steps, "setting the config keeps the other read-only data"


def _imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.append(node.module)
        elif isinstance(node, ast.Import):
            out += [a.name for a in node.names]
    return out


def test_no_module_imports_against_the_flow() -> None:
    """A layer imports only from the layers before it (and qprof.errors); none imports the CLI,
    the demo or the test labs."""
    bad = []
    for i, layer in enumerate(LAYERS):
        allowed = set(LAYERS[:i + 1])
        for path in sorted((ROOT / layer).rglob("*.py")):
            for mod in _imports(path):
                parts = mod.split(".")
                if parts[0] != "qprof" or len(parts) < 2 or parts[1] == "errors":
                    continue
                if parts[1] not in allowed:
                    bad.append(f"{path.relative_to(ROOT)} imports {mod}")
    assert not bad, "\n".join(bad)
