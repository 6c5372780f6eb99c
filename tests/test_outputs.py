"""The one table of outputs (viewer.outputs): picked by name or suffix, every output of a command rendered
from one attribution pass, and each the same bytes whichever command asked for it."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from conftest import qprof
from test_archive import _fake_run
from qprof.attribution.mapping import MappingSet
from qprof.archive import Run
from qprof.errors import QprofError
from qprof.viewer import outputs as O


def test_names_and_suffixes_are_unique_per_command() -> None:
    for kind in {o.kind for o in O.OUTPUTS}:
        outs = O.of_kind(kind)
        assert len({o.name for o in outs}) == len(outs)
        suffixes = [s for o in outs for s in o.suffixes]
        assert len(set(suffixes)) == len(suffixes), kind
        assert all(s.startswith(".") and s == s.lower() for s in suffixes)


@pytest.mark.parametrize("name, want", [
    ("r.json", "json"), ("r.speedscope.json", "speedscope"), ("R.SVG", "svg"), ("p.pb.gz", "pprof"),
    ("p.gz", "pprof"), ("stacks.folded", "folded"), ("r.txt", "text"), ("f.html", "html"),
])
def test_longest_suffix_picks(tmp_path: Path, name: str, want: str) -> None:
    assert O.by_suffix(tmp_path / name, O.of_kind("report")).name == want


def test_choosing_refuses_with_one_line(tmp_path: Path) -> None:
    report = O.of_kind("report")
    with pytest.raises(QprofError, match="unknown format 'svgz'; choose one of text, json"):
        O.choose("svgz", None, report)
    with pytest.raises(QprofError, match="writes a file: give -o FILE"):
        O.choose("pprof", None, report)
    with pytest.raises(QprofError, match=r"end the file name with \.txt, \.json"):
        O.choose(None, tmp_path / "x.png", report)
    with pytest.raises(QprofError, match="does not exist"):
        O.choose("json", tmp_path / "no" / "x.json", report)
    assert O.choose(None, None, report).name == "text"
    assert O.choose("json", tmp_path / "anything", report).name == "json"  # a name wins over the suffix


def test_one_attribution_pass_feeds_every_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run = Run.open(_fake_run(tmp_path))
    calls: list[str] = []
    real = O.analyse_run
    monkeypatch.setattr(O, "analyse_run", lambda *a, **kw: calls.append("pass") or real(*a, **kw))
    asked = [(o, O.Request()) for o in O.of_kind("report")]
    rendered = O.render(asked, [run], MappingSet.load([]), None)
    assert calls == ["pass"]
    by = {o.name: r for (o, _), r in zip(asked, rendered)}
    assert json.loads(by["json"].data)["processes"]
    assert gzip.decompress(by["pprof"].data)  # type: ignore[arg-type]
    assert by["svg"].data.startswith("<?xml")  # type: ignore[union-attr]
    assert json.loads(by["speedscope"].data)["$schema"].startswith("https://www.speedscope.app")
    # each output alone is the same bytes as in company
    for o, _ in asked:
        (alone,) = O.render([(o, O.Request())], [run], MappingSet.load([]), None)
        assert alone.data == by[o.name].data, o.name


def test_report_and_flamegraph_write_the_same_file(tmp_path: Path) -> None:
    run = _fake_run(tmp_path)
    qprof("report", str(run), "-o", str(tmp_path / "a.speedscope.json"))
    qprof("flamegraph", str(run), "-o", str(tmp_path / "b.speedscope.json"))
    assert (tmp_path / "a.speedscope.json").read_bytes() == (tmp_path / "b.speedscope.json").read_bytes()
    r = qprof("report", str(run), "-o", str(tmp_path / "r.json"))
    assert r.stdout.strip() == str(tmp_path / "r.json") and "qprof: json written" in r.stderr
    assert json.loads((tmp_path / "r.json").read_text()) == json.loads(qprof("report", str(run), "--format",
                                                                             "json").stdout)
