"""The typed records read at a boundary: a libbpf loader's config (its argv, from the collector) and
the stacks file's header. What one side writes the other reads back equal; anything else is refused
in the one way each reader promises (ValueError, DamagedStacks), never a traceback from deeper in."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import examples
from qprof.archive.stacks import HEADER_KEY, DamagedStacks, StacksHeader, stacks_header, write_stacks
from qprof.probes.libbpf import LoaderConfig

_json = st.recursive(st.none() | st.booleans() | st.integers(-10**6, 10**6)
                     | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=6),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
                     max_leaves=12)
_opt = st.none

_configs = st.builds(LoaderConfig, pids=st.lists(st.integers(1, 2**22), max_size=5),
                     follow=_opt() | st.booleans(), added=_opt() | st.text(max_size=10),
                     gro_bit=_opt() | st.integers(0, 63), kfree_skb_has_socket=_opt() | st.booleans(),
                     netns=_opt() | st.lists(st.integers(1, 2**32), max_size=3),
                     stack_interval_ms=_opt() | st.floats(0.1, 1000), preempt_from_rq=_opt() | st.integers(-2**20, 2**20),
                     series=_opt() | st.text(max_size=10), timing=_opt() | st.text(max_size=10))


@settings(max_examples=examples(200), deadline=None)
@given(config=_configs)
def test_loader_config_reads_back_as_written(config: LoaderConfig) -> None:
    """The child reads the config its parent wrote, field for field (None: left out, read as None)."""
    assert LoaderConfig.from_argv(config.to_argv()) == config
    assert None not in json.loads(config.to_argv()).values()


@settings(max_examples=examples(300), deadline=None)
@given(doc=_json)
def test_loader_config_refuses_anything_else_with_value_error(doc: object) -> None:
    """Any other JSON: a config (its keys are the record's, its pids a list) or ValueError, which the
    loader turns into its usage error."""
    try:
        config = LoaderConfig.from_argv(json.dumps(doc))
    except ValueError:
        return
    assert isinstance(doc, dict) and set(doc) <= {f for f in LoaderConfig.__dataclass_fields__}
    assert isinstance(config.pids, list)


_scalar = st.none() | st.booleans() | st.integers(-10**9, 10**9) | st.text(max_size=8)
_headers = st.builds(StacksHeader, folded=st.lists(st.text(max_size=12), max_size=4),
                     dropped=st.lists(st.dictionaries(st.text(max_size=6), _scalar, max_size=3), max_size=2),
                     unreadable=st.lists(st.dictionaries(st.text(max_size=6), _scalar, max_size=3), max_size=2),
                     samples=st.integers(0, 10**9), bad_lines=st.integers(0, 10**6),
                     bad_examples=st.lists(st.text(max_size=12), max_size=5),
                     script_cpu_s=_opt() | st.floats(0, 10**6), bin_grain=st.integers(1, 64))


@settings(max_examples=examples(100), deadline=None)
@given(header=_headers)
def test_stacks_header_reads_back_as_written(tmp_path_factory: pytest.TempPathFactory, header: StacksHeader) -> None:
    p = tmp_path_factory.mktemp("h") / "stacks.jsonl.gz"
    write_stacks(p, [], header)
    assert stacks_header(p) == header


@settings(max_examples=examples(300), deadline=None)
@given(head=_json)
def test_any_other_stacks_header_is_a_damaged_file(tmp_path_factory: pytest.TempPathFactory, head: object) -> None:
    """A header line of any JSON: the header typed (its fields of the shape written), or DamagedStacks."""
    p: Path = tmp_path_factory.mktemp("h") / "stacks.jsonl.gz"
    with gzip.open(p, "wt", encoding="utf-8") as f:
        f.write(json.dumps({HEADER_KEY: head}) + "\n")
    try:
        got = stacks_header(p)
    except DamagedStacks:
        return
    assert isinstance(got, StacksHeader) and isinstance(head, dict)
    assert all(isinstance(x, str) for x in got.folded) and isinstance(got.bin_grain, int)
