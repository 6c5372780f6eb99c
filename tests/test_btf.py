"""Answers about the running kernel's BTF, kept on disk per BTF digest (probes.btf.remembered)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from qprof.probes import btf

QUESTIONS = (
    lambda: btf.enumerator("UDP_FLAGS_GRO_ENABLED"),
    lambda: btf.tracepoint_arity("kfree_skb"),
    lambda: btf.enum("skb_drop_reason"),
    lambda: btf.tracepoint_exists("sched_switch"),
    lambda: btf.tracepoint_exists("qprof_no_such_tracepoint"),
)


@pytest.fixture
def facts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    if not os.path.exists(btf.VMLINUX_BTF):
        pytest.skip(f"the kernel exposes no BTF at {btf.VMLINUX_BTF}")
    monkeypatch.setattr(btf, "FACTS_DIR", tmp_path)
    btf._answers.cache_clear()
    yield tmp_path
    btf._answers.cache_clear()


def _no_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    def parse() -> btf.BTF:
        raise AssertionError("the kernel BTF was parsed again")
    monkeypatch.setattr(btf, "kernel", parse)


def test_answers_come_back_from_disk_without_a_parse(facts: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fresh = [q() for q in QUESTIONS]
    assert fresh[3] is True and fresh[4] is False and fresh[0] is not None and fresh[2]
    (stored,) = facts.iterdir()
    assert stored.name == f"{btf.digest()[:32]}.json"
    btf._answers.cache_clear()  # as a new process would start
    _no_parse(monkeypatch)
    assert [q() for q in QUESTIONS] == fresh


def test_a_damaged_file_is_answered_anew(facts: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fresh = [q() for q in QUESTIONS]
    (stored,) = facts.iterdir()
    for damage in (b"\x00garbage{", b"[1, 2]", b'{"enumerator UDP_FLAGS_GRO_ENABLED": '):
        stored.write_bytes(damage)
        btf._answers.cache_clear()
        assert [q() for q in QUESTIONS] == fresh
        assert json.loads(stored.read_text())["tracepoint sched_switch"] is True


def test_another_kernel_is_not_answered_from_this_ones_file(facts: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    QUESTIONS[0]()
    btf._answers.cache_clear()
    monkeypatch.setattr(btf, "digest", lambda: "f" * 64)  # a new kernel: another BTF
    _no_parse(monkeypatch)
    with pytest.raises(AssertionError, match="parsed again"):
        QUESTIONS[0]()
