"""Folded stacks file, run archive, cmdline redaction, and run dir -> attribute -> JSON report."""

from __future__ import annotations

import gzip
import json
import os
import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qprof import runfiles
from qprof.attribution.categories import CATEGORIES, CONNECTION, CRYPTO, IO, PACKET_IO, UNCATEGORIZED
from qprof.attribution.mapping import MappingSet
from qprof.attribution.analysis import analyse_run
from qprof import archive
from qprof.archive import schema
from qprof.archive import Run, create_run_dir
from qprof.collectors import procfs
from qprof.collectors.procfs import REDACTED, redact_cmdline
from qprof.archive.model import (STATUS_COMPLETE, ChunkSummary, Configuration, Host, Image, MappedObject, Meta, Nic,
                                     ObjectSymbols, ParseSummary, PressureSource, ProcessIdentity, ProcReading,
                                     RecordEntry, SampleGroup, Sampling, SamplingScope, Target, CgroupReading, Limits,
                                     Pressure, ThreadReading, Traffic)
from qprof.archive.stacks import Sample, StackRecord, fold, read_stacks, write_stacks
from qprof.errors import QprofError
from qprof.viewer.json_report import to_dict
from qprof.viewer.report import report_of
from conftest import ROOT, edited_meta, examples

DATA = ROOT / "tests" / "data"

K = "[kernel.kallsyms]"
LIBC = "/usr/lib/x86_64-linux-gnu/libc.so.6"
NGTCP2 = "/usr/lib/x86_64-linux-gnu/libngtcp2.so.16.0.0"
GNUTLS = "/usr/lib/x86_64-linux-gnu/libgnutls.so.30.36.0"
APP = "/usr/bin/gtlsserver"


pytestmark = pytest.mark.usefixtures("user_config")


ODD = [
    ("std::vector<int, std::allocator<int> >::push_back(int const&)", "/usr/bin/x"),
    ("(anonymous namespace)::foo()", "/tmp/x.so (deleted)"),
    ('quote " backslash \\ tab \t newline \n', "[unknown]"),
    ("ünïcødé ✓ 漢字", "/opt/ä/lib.so"),
    ("", ""),
]


def test_round_trip_odd_symbols(tmp_path: Path) -> None:
    recs = [StackRecord(1, 2, "comm with space", 3, 4_000_000, tuple(ODD)),
            StackRecord(-1, -1, "", 0, 0, ()),
            StackRecord(2**40, 7, "k/u8:2", 1, 2**62, ((K, K),))]
    p = tmp_path / runfiles.STACKS
    assert write_stacks(p, recs) == 3
    assert list(read_stacks(p)) == recs
    assert not (tmp_path / (runfiles.STACKS + ".tmp")).exists()
    with gzip.open(p, "rt", encoding="utf-8") as f:
        lines = f.read().splitlines()
    assert len(lines) == 3 and all(isinstance(json.loads(ln), dict) for ln in lines)


_txt = st.text(max_size=30)
_rec = st.builds(StackRecord, st.integers(-1, 2**31), st.integers(-1, 2**31), _txt,
                 st.integers(0, 2**40), st.integers(0, 2**62),
                 st.lists(st.tuples(_txt, _txt), max_size=5).map(tuple))


@settings(max_examples=examples(100), suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(_rec, max_size=8))
def test_round_trip_property(tmp_path: Path, recs: list[StackRecord]) -> None:
    p = tmp_path / "s.jsonl.gz"
    write_stacks(p, recs)
    assert list(read_stacks(p)) == recs


def test_fold_aggregates_counts_and_periods() -> None:
    a = (("f", K), ("main", APP))
    b = (("g", K),)
    samples = [Sample(1, 1, "x", 10, a), Sample(1, 1, "x", 15, a), Sample(1, 2, "x", 7, a),
               Sample(1, 1, "x", 1, b), Sample(1, 1, "y", 2, a), Sample(2, 2, "x", 3, a), Sample(1, 1, "x", 5, ())]
    got = {(r.pid, r.tid, r.comm, r.frames): (r.samples, r.period) for r in fold(samples)}
    assert got == {(1, 1, "x", a): (2, 25), (1, 2, "x", a): (1, 7), (1, 1, "x", b): (1, 1),
                   (1, 1, "y", a): (1, 2), (2, 2, "x", a): (1, 3), (1, 1, "x", ()): (1, 5)}
    assert fold([]) == []


@settings(max_examples=examples(100))
@given(st.lists(st.builds(Sample, st.integers(1, 3), st.integers(1, 3), st.sampled_from(["a", "b"]),
                          st.integers(0, 10**9), st.sampled_from([(), (("f", K),), (("g", APP), ("f", K))]))))
def test_fold_preserves_totals(samples: list[Sample]) -> None:
    recs = fold(samples)
    assert sum(r.samples for r in recs) == len(samples)
    assert sum(r.period for r in recs) == sum(s.period for s in samples)
    assert len({(r.pid, r.tid, r.comm, r.frames) for r in recs}) == len(recs)


def _stacks_file(tmp_path: Path, n: int = 300) -> Path:
    p = tmp_path / "s.jsonl.gz"
    recs = [StackRecord(1, 2, "c", 1, 10, tuple((f"sym{i}_{j}", "/lib/x.so") for j in range(20))) for i in range(n)]
    write_stacks(p, recs)
    return p


def _one_line_error(p: Path) -> str:
    with pytest.raises(QprofError) as ei:
        list(read_stacks(p))
    msg = str(ei.value)
    assert "\n" not in msg and str(p) in msg
    return msg


def test_truncated_stacks_file(tmp_path: Path) -> None:
    p = _stacks_file(tmp_path)
    data = p.read_bytes()
    for cut in (len(data) // 2, len(data) - 4, 5):
        p.write_bytes(data[:cut])
        _one_line_error(p)


def test_not_gzip_and_empty(tmp_path: Path) -> None:
    p = tmp_path / "s.jsonl.gz"
    p.write_bytes(b"this is not gzip at all\n")
    _one_line_error(p)
    p.write_bytes(b"")
    assert list(read_stacks(p)) == []


def test_crc_mismatch(tmp_path: Path) -> None:
    p = _stacks_file(tmp_path)
    data = bytearray(p.read_bytes())
    data[-8] ^= 0xFF  # CRC32 in the gzip trailer
    p.write_bytes(bytes(data))
    _one_line_error(p)


def test_corrupted_deflate_stream(tmp_path: Path) -> None:
    p = _stacks_file(tmp_path)
    data = bytearray(p.read_bytes())
    for i in range(20, 40):
        data[i] ^= 0xFF
    p.write_bytes(bytes(data))
    _one_line_error(p)


@pytest.mark.parametrize("line", [
    "{not json", '"a string"', "[1, 2]", '{"pid": 1}',
    '{"pid":1,"tid":1,"comm":"x","samples":1,"period":1,"frames":[["only-one"]]}',
    '{"pid":1,"tid":1,"comm":"x","samples":1,"period":1,"frames":null}',
    '{"pid":"x","tid":1,"comm":"x","samples":1,"period":1,"frames":[]}',
    '{"pid":1,"tid":1,"comm":"x","samples":-1,"period":1,"frames":[]}',
    '{"pid":1,"tid":1,"comm":"x","samples":1,"period":-5,"frames":[]}',
    '{"pid":NaN,"tid":1,"comm":"x","samples":1,"period":1,"frames":[]}',
])
def test_bad_records(tmp_path: Path, line: str) -> None:
    p = tmp_path / "s.jsonl.gz"
    good = '{"pid":1,"tid":1,"comm":"x","samples":1,"period":1,"frames":[]}'
    with gzip.open(p, "wt", encoding="utf-8") as f:
        f.write(good + "\n\n" + line + "\n")
    msg = _one_line_error(p)
    if line.startswith("{") and line != "{not json":
        assert f"{p}:3:" in msg


def test_bad_utf8_record(tmp_path: Path) -> None:
    p = tmp_path / "s.jsonl.gz"
    with gzip.open(p, "wb") as f:
        f.write(b'{"pid":1,"tid":1,"comm":"\xff","samples":1,"period":1,"frames":[]}\n')
    _one_line_error(p)


def test_infinite_number_record(tmp_path: Path) -> None:
    p = tmp_path / "s.jsonl.gz"
    with gzip.open(p, "wt", encoding="utf-8") as f:
        f.write('{"pid":1e400,"tid":1,"comm":"x","samples":1,"period":1,"frames":[]}\n')
    _one_line_error(p)


# ---------------------------------------------------------------- Run.open, create_run_dir


def _meta(**over: object) -> dict:
    """A complete run's meta.json as the model writes it, with fields changed: damaged on purpose."""
    return {**schema.encode(Meta(status=STATUS_COMPLETE)), **over}


def test_run_open_ok(tmp_path: Path) -> None:
    archive.write_meta(tmp_path, Meta(status=STATUS_COMPLETE))
    run = Run.open(tmp_path)
    assert run.meta.status == "complete" and not run.has_stacks()
    assert list(run.proc_readings()) == []


def test_meta_round_trips_through_its_model(tmp_path: Path) -> None:
    """What the session writes is what readers get back: every record of meta.json, nested ones too."""
    meta = Meta(status=STATUS_COMPLETE, host=Host(hostname="h", cpus=2, cpu_nodes={0: 0, 1: 1}, nics=[Nic("eth0", 1)]),
                sampling=Sampling(frequency=999, clock="monotonic",
                                  groups=[SampleGroup("fp", [7], "perf-fp.data", {7: [[None, 5], [9, None]]})],
                                  scope=SamplingScope("cgroup", "auto", ["a/b"])),
                targets=[Target(7, "srv", "server", "/bin/srv", ["srv", "-q"], [MappedObject("/bin/srv", "ab", "symtab")],
                                {7: "srv", 8: "worker"}, ["0::/x"], "fp", "frame pointers",
                                [Image("/bin/sh", "sh", "dwarf", 0.0), Image("/bin/srv", "srv", "fp", 0.25)])],
                collector=ProcessIdentity(1, 2, "boot"), pressure=PressureSource("v2 /sys/fs/cgroup"),
                symbols=[ObjectSymbols("/bin/srv", "ab", "symtab")], duration_s=1.5, exited=[7],
                perf_exit={"fp": 0}, perf_cpu_s={"fp": 0.25}, parse=ParseSummary(10, 1, ["x"]),
                chunks=ChunkSummary(2, [{"chunk": "perf-fp.data.1", "bytes": 5}]),
                record=RecordEntry(1, 3, {"client": ["c"]}, {"client": 0}, "UDP port 1 bound", 0.1, 0.5, []),
                configuration=Configuration("gso-off", "ngtcp2", {"client": ["c", "{port}"]}, {"X": "1"}))
    archive.write_meta(tmp_path, meta)
    assert Run.open(tmp_path).meta == meta
    assert Run.open(tmp_path).meta.client_s == 0.5
    assert Run.open(tmp_path).meta.configuration.key() == meta.configuration.key()  # type: ignore[union-attr]


def test_meta_shape_comes_from_the_model() -> None:
    """The checker refuses what the model cannot hold, naming the field; it accepts what it writes."""
    shape = archive.META_SHAPE
    assert schema.conforms(schema.encode(Meta()), shape)
    bad = schema.encode(Meta(targets=[Target(7)]))
    bad["targets"][0]["threads"] = {"x": "y"}
    assert shape.check(bad, "") == "targets[0].threads keys must be decimal numbers, not 'x'"
    bad = schema.encode(Meta(sampling=Sampling(groups=[SampleGroup("fp")])))
    bad["sampling"]["groups"][0]["windows"] = {"7": [["a", None]]}
    assert shape.check(bad, "") == "sampling.groups[0].windows['7'][0][0] must be an integer or null"
    assert shape.check({"targets": [{"comm": "x"}]}, "") == "targets[0] lacks `pid`"
    for bad in ({"stack": "a"}, {"setting": "s", "env": {"X": 1}}):  # no setting; an env value not a string
        assert shape.check({"configuration": bad}, "") == "configuration must be an object or null"
    assert schema.conforms(schema.encode(Meta(configuration=Configuration("s"))), shape)
    # a field older archives lack may be absent, never null: the writer leaves it out when unset
    written = schema.encode(Meta(sampling=Sampling(frequency=99)))
    assert "clock" not in written["sampling"] and schema.conforms(written, shape)
    for name in ("frequency", "clock", "chunk_bytes", "keep_raw"):
        bad = schema.encode(Meta(sampling=Sampling(frequency=99)))
        bad["sampling"][name] = None
        assert shape.check(bad, "").startswith(f"sampling.{name} must be")


@pytest.mark.parametrize("content,match", [
    (None, "no meta.json"),
    ("{bad json", "unreadable metadata"),
    (b"\xff\xfe", "unreadable metadata"),
    ("[1, 2]", "not a qprof run archive"),
    (json.dumps(_meta(format="other")), "not a qprof run archive"),
    (json.dumps({k: v for k, v in _meta().items() if k != "format"}), "not a qprof run archive"),
    (json.dumps(_meta(version=2)), "version 2 is not supported"),
    (json.dumps(_meta(version="1")), "version '1' is not supported"),
    (json.dumps({k: v for k, v in _meta().items() if k != "targets"}), "no target list"),
])
def test_run_open_errors(tmp_path: Path, content: str | bytes | None, match: str) -> None:
    if isinstance(content, str):
        (tmp_path / runfiles.META).write_text(content)
    elif isinstance(content, bytes):
        (tmp_path / runfiles.META).write_bytes(content)
    with pytest.raises(QprofError, match=match) as ei:
        Run.open(tmp_path)
    assert "\n" not in str(ei.value)


def test_run_open_missing_dir_and_file(tmp_path: Path) -> None:
    with pytest.raises(QprofError, match="not a run directory"):
        Run.open(tmp_path / "missing")
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(QprofError, match="not a run directory"):
        Run.open(f)


def test_typed_records_of_an_archive_with_only_required_fields() -> None:
    """Older archives lack fields newer ones have: the typed records fill in what readers assume
    (tests/data/minimal-run: only the fields every qprof wrote)."""
    run = Run.open(DATA / "minimal-run")
    info = run.meta
    assert (info.status, info.sampling.frequency, info.sampling.clock, info.sampling.scope_mode) == \
        ("complete", 99, None, "system")
    assert info.configuration is None and info.record is None  # tables place it by its path, and say so
    (t,) = info.targets
    assert (t.pid, t.comm, t.role, t.objects[0].path, t.objects[0].go, t.images[0].since_s) == \
        (7, "?", None, "/bin/a", False, 0.0)
    (r,) = run.proc_readings()
    (th,) = r.threads[7]
    assert (r.mono, th.tid, th.on_cpu_s, th.cpu, r.cgroups, r.limits, r.tcp) == (1.5, 8, None, -1, {}, {}, {})
    probes = run.probes()
    assert probes is not None and probes.maps("packetio") == {} and probes.maps("softirq") == {}
    assert probes.programs["packetio"].cpu_s is None and probes.packetio().windows is None


def test_a_live_reading_is_written_and_read_back_as_the_same_record(tmp_path: Path) -> None:
    """proc.jsonl is one model both ways: what the live reader builds (this process, its threads,
    cgroup, limits, the CPUs' idle time) with the session's byte totals is what a report reads."""
    archive.write_meta(tmp_path, Meta(status=STATUS_COMPLETE))
    me = os.getpid()
    live = replace(procfs.reading([me, 4194303]), traffic=Traffic({me: (10, 20)}, {me: (1200, 0)}, 5.5))
    assert live.threads[me] and live.threads[4194303] == [] and 4194303 not in live.cgroups
    assert live.cpu_idle and live.limits[me].cpus_allowed
    (tmp_path / runfiles.PROC).write_text(archive.proc_line(live) + archive.proc_line(ProcReading(2.0, {})))
    back = list(Run.open(tmp_path).proc_readings())
    assert back == [live, ProcReading(2.0, {})]
    assert (back[0].tcp, back[0].udp, back[0].udp_through) == ({me: (10.0, 20.0)}, {me: (1200.0, 0.0)}, 5.5)


def test_proc_lines_as_earlier_qprof_wrote_them_still_read(tmp_path: Path) -> None:
    """The byte totals at the top level of a reading, a cgroup of a process gone written as null,
    a PSI file with only its `some` line, threads without state, CPU or switches."""
    archive.write_meta(tmp_path, Meta(status=STATUS_COMPLETE))
    line = ('{"t":7.5,"mono":3,"threads":{"5":[{"tid":5,"comm":"s","state":"R","utime_s":1,"stime_s":0.5,'
            '"on_cpu_s":1.6,"run_delay_s":null,"syscall":"running","cpu":1}],"6":[]},'
            '"cgroups":{"5":{"version":"v2","path":"/a","quota_cores":null,"nr_periods":4,"nr_throttled":1,'
            '"throttled_s":0.25},"6":null},"limits":{"5":{"cpus_allowed":[0,1],"cpuset":null,'
            '"pressure":{"some_s":0.5},"pressure_procs":1}},"pressure":{"some_s":2.0,"full_s":1.0},'
            '"cpu_idle":{"0":10.5,"1":11},"tcp":{"5":[100,200]},"udp":{"5":[7,8]},"udp_through":2.5}')
    (tmp_path / runfiles.PROC).write_text(line + "\n")
    (r,) = Run.open(tmp_path).proc_readings()
    assert r == ProcReading(
        3.0, {5: [ThreadReading(5, "s", 1.0, 0.5, "R", 1.6, None, "running", 1)], 6: []}, t=7.5,
        cgroups={5: CgroupReading(4.0, 1.0, 0.25, "/a", None, "v2")},
        limits={5: Limits([0, 1], None, Pressure(0.5), 1)}, pressure=Pressure(2.0, 1.0),
        cpu_idle={0: 10.5, 1: 11.0}, traffic=Traffic({5: (100.0, 200.0)}, {5: (7.0, 8.0)}, 2.5))
    # written again, it is the same document but for the null cgroup, left out, and the switches
    # this older line lacks, written as unknown
    again = json.loads(archive.proc_line(r))
    old = json.loads(line)
    del old["cgroups"]["6"]
    old["threads"]["5"][0].update(voluntary=None, involuntary=None)
    assert again == old
    for bad in ('"tcp":{"5":[100,200,300]}', '"tcp":{"x":[1,2]}', '"cgroups":{"5":{"path":"/a"}}',
                '"limits":{"5":{"pressure":{"some_s":null}}}'):
        (tmp_path / runfiles.PROC).write_text(line[:-1] + "," + bad + "}\n" + line + "\n")
        with pytest.raises(QprofError, match=r"proc.jsonl:1: not a /proc reading"):
            list(Run.open(tmp_path).proc_readings())


def test_proc_readings_skip_a_cut_last_line_and_name_any_other_bad_one(tmp_path: Path) -> None:
    """A kill cuts the last line only: that one is left out; a bad line before it means the file was
    changed, and every figure from the readings could be off."""
    archive.write_meta(tmp_path, Meta(status=STATUS_COMPLETE))
    whole = {"t": 1, "mono": 1, "threads": {}}
    (tmp_path / runfiles.PROC).write_text(json.dumps(whole) + '\n{"t": 2, "mono": 2, "thr')
    assert list(Run.open(tmp_path).proc_readings()) == [ProcReading(1.0, {}, t=1.0)]
    for bad in ("[1]", '{"t": 1}', "\x00garbage"):
        (tmp_path / runfiles.PROC).write_text(json.dumps(whole) + f"\n{bad}\n" + json.dumps(whole) + "\n")
        with pytest.raises(QprofError, match=r"proc.jsonl:2: not a /proc reading .*sed -i 2d"):
            list(Run.open(tmp_path).proc_readings())
    (tmp_path / runfiles.PROC).write_text(json.dumps(whole) + '\n{"t": 1}\n')  # a whole last line, not cut
    with pytest.raises(QprofError, match="proc.jsonl:2"):
        list(Run.open(tmp_path).proc_readings())


def test_create_run_dir(tmp_path: Path) -> None:
    new = tmp_path / "a" / "b"
    assert create_run_dir(new) == new
    assert new.is_dir() and (new.stat().st_mode & 0o777) == 0o700 and list(new.iterdir()) == []
    empty = tmp_path / "empty"
    empty.mkdir()
    assert create_run_dir(empty) == empty


def test_create_run_dir_refuses(tmp_path: Path) -> None:
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("")
    with pytest.raises(QprofError, match="not empty"):
        create_run_dir(full)
    f = tmp_path / "file"
    f.write_text("")
    with pytest.raises(QprofError, match="not a directory"):
        create_run_dir(f)
    target = tmp_path / "target"
    target.mkdir()
    for name, dest in (("link", target), ("dangling", tmp_path / "nowhere")):
        link = tmp_path / name
        link.symlink_to(dest)
        with pytest.raises(QprofError, match="symbolic link"):
            create_run_dir(link)
    assert not (tmp_path / "nowhere").exists()


# ---------------------------------------------------------------- redact_cmdline


@pytest.mark.parametrize("argv,expected", [
    (["srv", "--token=abc", "--port", "443"], ["srv", f"--token={REDACTED}", "--port", "443"]),
    (["srv", "--api-key", "abc", "x"], ["srv", "--api-key", REDACTED, "x"]),
    (["srv", "--password=hunter2"], ["srv", f"--password={REDACTED}"]),
    (["srv", "-secret", "s3", "-v"], ["srv", "-secret", REDACTED, "-v"]),
    (["srv", "--API_KEY=a=b"], ["srv", f"--API_KEY={REDACTED}"]),
    (["srv", "--passwd", "p", "--auth-token", "t", "--client-secret=c"],
     ["srv", "--passwd", REDACTED, "--auth-token", REDACTED, f"--client-secret={REDACTED}"]),
    (["srv", "--token", "--verbose", "file"], ["srv", "--token", "--verbose", "file"]),
    (["srv", "--token"], ["srv", "--token"]),
    (["srv", "127.0.0.1", "4433", "--cert=/etc/c.pem", "-q", "--htdocs", "/var/www", "token"],
     ["srv", "127.0.0.1", "4433", "--cert=/etc/c.pem", "-q", "--htdocs", "/var/www", "token"]),
    (["env", "API_KEY=abc", "Password=p", "SSLKEYLOGFILE=/tmp/k", "PORT=443", "srv"],
     ["env", f"API_KEY={REDACTED}", f"Password={REDACTED}", f"SSLKEYLOGFILE={REDACTED}", "PORT=443", "srv"]),
    (["srv", "--key", "/etc/k.pem", "-auth-token=t", "--secret", "-"],
     ["srv", "--key", REDACTED, f"-auth-token={REDACTED}", "--secret", "-"]),
    (["srv", "x=token", "--level=key"], ["srv", "x=token", "--level=key"]),
    ([], []),
])
def test_redact_cmdline(argv: list[str], expected: list[str]) -> None:
    assert redact_cmdline(argv) == expected


@settings(max_examples=examples(200))
@given(st.lists(st.text(st.characters(blacklist_categories=("Cs",)), max_size=12), max_size=8))
def test_redact_keeps_shape(argv: list[str]) -> None:
    out = redact_cmdline(argv)
    assert len(out) == len(argv)
    for a, b in zip(argv, out):
        assert b == a or b == REDACTED or (b.endswith("=" + REDACTED) and a.startswith(b[: -len(REDACTED)]))


# ---------------------------------------------------------------- end to end (pure)


def _objects(*paths: str) -> list[MappedObject]:
    return [MappedObject(p, "ab" * 20, "dynsym") for p in paths]


SERVER, CLIENT, IDLE = 4242, 4343, 4444


def _fake_run(root: Path) -> Path:
    out = create_run_dir(root / "run")
    targets = [
        Target(SERVER, "gtlsserver", "server", APP, ["gtlsserver", f"--token={REDACTED}"],
               _objects(APP, LIBC, NGTCP2, GNUTLS), {SERVER: "gtlsserver"}, [], "fp", "frame pointers present"),
        Target(CLIENT, "client", "client", "/usr/bin/client", ["client"], _objects("/usr/bin/client", LIBC),
               unwind="dwarf", unwind_reason="no frame pointers"),
        Target(IDLE, "idle", None, "/usr/bin/idle", ["idle"], unwind="fp", unwind_reason="x"),
    ]
    archive.write_meta(out, Meta(
        status=STATUS_COMPLETE, qprof_version="0.1.0",
        host=Host(kernel="6.1.0", kernel_build="#1 SMP", machine="x86_64", cpu_model="cpu", cpus=8, python="3.11.7"),
        tools={"perf": "perf version 6.1", "bpftrace": None},
        sampling=Sampling(frequency=999, groups=[SampleGroup("fp", [SERVER, IDLE], "perf-fp.data"),
                                                 SampleGroup("dwarf", [CLIENT], "perf-dwarf.data")]),
        targets=targets, requested_duration_s=10, start_time="2026-01-01T00:00:00Z",
        end_time="2026-01-01T00:00:10Z", duration_s=10.0, stop_reason="duration reached",
        perf_exit={"fp": 0, "dwarf": 0}, parse=ParseSummary(100)))
    send = [("ip_output", K), ("udp_sendmsg", K), ("__sys_sendmsg", K), ("__libc_sendmsg", LIBC),
            ("ngtcp2_conn_write_pkt", NGTCP2)]
    samples = (
        [Sample(SERVER, SERVER, "gtlsserver", 1_000_000, tuple(send))] * 4
        + [Sample(SERVER, SERVER, "gtlsserver", 1_000_000, (("gnutls_cipher_encrypt2", GNUTLS),
                                                            ("ngtcp2_conn_write_pkt", NGTCP2)))] * 3
        + [Sample(SERVER, SERVER + 1, "worker", 1_000_000, (("ngtcp2_conn_read_pkt", NGTCP2),))] * 2
        + [Sample(SERVER, SERVER + 1, "worker", 500_000, (("vfs_write", K), ("__libc_write", LIBC)))] * 2
        + [Sample(SERVER, SERVER + 1, "worker", 1_000_000, ())]
        + [Sample(CLIENT, CLIENT, "client", 2_000_000, (("main", "/usr/bin/client"),))]
        # a process that was not a target (e.g. forked): still reported, comm from its samples
        + [Sample(5555, 5555, "child", 3_000_000, (("recvmsg", LIBC),))]
    )
    write_stacks(out / runfiles.STACKS, fold(samples))
    with open(out / runfiles.PROC, "w", encoding="utf-8") as f:
        for t, cpu in ((0.0, 1.0), (1.0, 1.005)):
            f.write(json.dumps({"t": t, "mono": t, "threads": {str(SERVER): [
                {"tid": SERVER, "comm": "gtlsserver", "state": "R", "utime_s": cpu, "stime_s": cpu,
                 "run_delay_s": 0.0, "cpu": 1}]}}) + "\n")
    return out


def test_end_to_end_json_contract(tmp_path: Path) -> None:
    run = Run.open(_fake_run(tmp_path))
    report = to_dict(report_of(analyse_run(run, MappingSet.load())))
    report = json.loads(json.dumps(report))  # it must be plain JSON
    assert report["categories"] == list(CATEGORIES)
    procs = {p["pid"]: p for p in report["processes"]}
    assert set(procs) == {SERVER, CLIENT, 5555}
    assert report["targets_without_samples"] == [{"pid": IDLE, "comm": "idle"}]
    assert report["run"]["unwinding"][str(CLIENT)] == {"mode": "dwarf", "reason": "no frame pointers"}
    for p in procs.values():
        assert isinstance(p["pid"], int) and isinstance(p["comm"], str)
        assert set(p["categories"]) == set(CATEGORIES)
        assert all(0.0 <= v <= 1.0 for v in p["categories"].values())
        assert abs(sum(p["categories"].values()) - 1.0) < 0.001
        assert p["threads"]
        for t in p["threads"]:
            assert isinstance(t["tid"], int) and isinstance(t["comm"], str)
            assert set(t["categories"]) == set(CATEGORIES)
            assert abs(sum(t["categories"].values()) - 1.0) < 0.001
            assert 0 < t["cpu_seconds"] <= p["cpu_seconds"]
        assert abs(sum(t["cpu_seconds"] for t in p["threads"]) - p["cpu_seconds"]) < 1e-6

    srv = procs[SERVER]
    assert (srv["comm"], srv["role"], srv["samples"]) == ("gtlsserver", "server", 12)
    assert srv["cpu_seconds"] == pytest.approx(11e6 / 1e9)
    cats = srv["categories"]
    assert cats[PACKET_IO] == pytest.approx(4 / 11, abs=1e-6)
    assert cats[CRYPTO] == pytest.approx(3 / 11, abs=1e-6)
    assert cats[CONNECTION] == pytest.approx(2 / 11, abs=1e-6)
    assert cats[IO] == pytest.approx(1 / 11, abs=1e-6)
    assert cats[UNCATEGORIZED] == pytest.approx(1 / 11, abs=1e-6)
    assert srv["category_cpu_seconds"][PACKET_IO] == pytest.approx(0.004)
    assert srv["subcategories"][PACKET_IO] == {"tx syscall": pytest.approx(4 / 11, abs=1e-6)}
    assert [m["name"] for m in srv["mappings"]] == ["ngtcp2", "crypto", "common"]
    assert srv["proc_cpu_seconds"] == pytest.approx(0.01)
    assert srv["top_symbols"][PACKET_IO][0]["symbol"] == "ip_output"
    assert srv["top_symbols"][UNCATEGORIZED][0]["symbol"] == "[no stack]"
    assert srv["dso_only_share"] == pytest.approx(5 / 11, abs=1e-6)  # gnutls + ngtcp2 whole-library rules
    threads = {t["tid"]: t for t in srv["threads"]}
    assert [t["tid"] for t in srv["threads"]] == [SERVER, SERVER + 1]  # by CPU time, largest first
    assert threads[SERVER]["comm"] == "gtlsserver" and threads[SERVER + 1]["comm"] == "worker"
    assert threads[SERVER]["cpu_seconds"] == pytest.approx(0.007)
    assert threads[SERVER]["categories"][PACKET_IO] == pytest.approx(4 / 7, abs=1e-6)
    assert threads[SERVER + 1]["categories"][CONNECTION] == pytest.approx(0.5, abs=1e-6)

    cli = procs[CLIENT]
    assert cli["categories"][UNCATEGORIZED] == 1.0 and cli["cpu_seconds"] == pytest.approx(0.002)
    assert [m["name"] for m in cli["mappings"]] == ["common"]
    assert cli["proc_cpu_seconds"] is None
    child = procs[5555]
    assert child["comm"] == "child" and child["role"] is None
    assert child["categories"][PACKET_IO] == 1.0


def test_end_to_end_non_time_event(tmp_path: Path) -> None:
    out = _fake_run(tmp_path)
    with edited_meta(out) as meta:
        meta.sampling.event = "cycles"
    report = to_dict(report_of(analyse_run(Run.open(out), MappingSet.load())))
    total = sum(p["cpu_seconds"] for p in report["processes"])
    assert total == pytest.approx(14 / 999, rel=1e-3)  # samples / frequency
    for p in report["processes"]:
        assert abs(sum(p["categories"].values()) - 1.0) < 0.001


def test_probes_json_round_trips_through_its_record(tmp_path: Path) -> None:
    """probes.json as the collector writes it (a typed ProbeRecord, schema.encode) reads back as the same
    record; raw maps stay as written, `@windows` becomes the sampler's typed record."""
    from qprof.archive.model import (CryptoCost, CryptoFindings, CryptoSlot, Follow, FollowedPid, GroupCost,
                                     HostSnapshot, LoaderConfig, NamespaceQueues, ProbeCost, ProbeRecord,
                                     ProgramCost, ProgramRecord, Qdisc, UdpMib, UdpSocket, UnavailableProbe)
    from qprof.probes.packetio.maps import GroupWindows, NetnsTotals, Windows

    run = create_run_dir(tmp_path / "r")
    archive.write_meta(run, Meta(status=STATUS_COMPLETE))
    windows = Windows(("tx_msgs", "rx_msgs"), 4, 4, {"7": GroupWindows((3.0, 5.0), (3.0, 5.0), (1.0, 2.0, 3.0))},
                      span_s=0.4, netns={"net:[1]": NetnsTotals((7,), mib_in=5.0)}, events={"send": 3})
    record = ProbeRecord(
        groups=["packetio", "crypto"],
        programs={"packetio": ProgramRecord(maps={"@windows": windows, "@ports": {"7,443": 1},
                                                  "@tx_gso_size": {"7": [{"min": 0, "max": 1, "count": 2}]}},
                                            output="probe-packetio.jsonl", config=LoaderConfig(pids=[7], gro_bit=3),
                                            exit=0, cpu_s=0.25),
                  "crypto": ProgramRecord(maps={"@calls": {"7,7,0": 12}}, exit=None)},
        unavailable=[UnavailableProbe("softirq", "not asked")],
        qdiscs={"net:[1]": NamespaceQueues((7,), (Qdisc("eth0", "fq", drops=2),), (Qdisc("eth0", "fq", drops=5),),
                                           1.0, 2.0)},
        sockets=[UdpSocket(fds=[3], first={"drops": 0}, last={"drops": 4}, local="1.2.3.4:443", pids=[7], port=443)],
        drop_reason_names={6: "SOCKET_RCVBUFF"},
        before=HostSnapshot(softirq_seconds={0: 1.5}, udp_mib={"net:[1]": UdpMib([7], {"InDatagrams": 3})}),
        cost=ProbeCost(10, 2000, by_group={"packetio": GroupCost(10, 2000)},
                       programs=[ProgramCost(id=1, name="p", run_cnt=10, run_time_ns=2000, type="tracing")]),
        crypto=CryptoFindings(slots=[CryptoSlot(0, "EVP_EncryptUpdate", part="aad", bytes=True)],
                              cost=CryptoCost(target_hits=12, summary="cheap")),
        follow=Follow("probe-targets.pids", [FollowedPid(9, 3.5)]))
    archive.write_probes(run, record)
    back = Run.open(run).probes()
    assert back == record
    assert dict(back.programs["packetio"].maps or {})["@tx_gso_size"] == {"7": [{"min": 0, "max": 1, "count": 2}]}
    assert back.packetio().windows is not None and back.packetio().windows.mib_totals == {"net:[1]": {"mib_in": 5.0}}
    assert [tuple(u) for u in back.unavailable] == [("softirq", "not asked")]


def test_probes_json_of_older_qprof_reads(tmp_path: Path) -> None:
    """Fields older qprof wrote differently: a qdisc counter tc did not give was null (reads as 0), a
    program still running had no maps (read from its raw output), drop reasons keyed by strings."""
    run = create_run_dir(tmp_path / "r")
    archive.write_meta(run, Meta(status=STATUS_COMPLETE))
    (run / "probe-packetio.jsonl").write_text(json.dumps({"type": "map", "data": {"@ports": {"7,443": 1}}}) + "\n")
    (run / "probes.json").write_text(json.dumps({
        "groups": ["packetio"], "unavailable": [], "drop_reason_names": {"6": "SOCKET_RCVBUFF"},
        "programs": {"packetio": {"output": "probe-packetio.jsonl", "script": "probe-packetio.bpf.c"}},
        "qdiscs": {"net:[1]": {"pids": [7], "first": [{"dev": "eth0", "kind": "fq", "drops": None, "qlen": 3}],
                               "last": [{"dev": "eth0", "kind": "fq", "drops": 4}]}}}))
    back = Run.open(run).probes()
    assert back is not None
    assert back.maps("packetio") == {"@ports": {"7,443": 1}}
    assert back.packetio().ports == {7: {443}}
    q = back.queues["net:[1]"]
    assert (q.first[0].drops, q.first[0].qlen, q.last[0].drops) == (0, 3, 4)
    assert back.drop_reason_names == {6: "SOCKET_RCVBUFF"}
    doc = json.loads((run / "probes.json").read_text())
    doc["qdiscs"]["net:[1]"]["last"][0]["drops"] = "4"
    (run / "probes.json").write_text(json.dumps(doc))
    with pytest.raises(QprofError, match=r"qdiscs\['net:\[1\]'\]\.last\[0\]\.drops"):
        Run.open(run).probes()


# values a damaged document holds where another was written: each kind a shape tells apart
_LEAVES = [None, True, False, 0, -1, 7, 1.5, float("nan"), float("inf"), "", "7", [], [1], {}, {"7": 1}]


def _damaged(doc: Any, rng: random.Random) -> Any:
    """A copy of `doc` damaged at one place: a value replaced, or a key dropped or renamed (one damage, so
    that what the shape answers turns on it alone)."""
    doc = json.loads(json.dumps(doc))
    places: list[tuple[Any, Any]] = []  # (container, key or index)
    todo = [doc]
    while todo:
        node = todo.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for k, v in items:
            places.append((node, k))
            todo.append(v)
    node, k = rng.choice(places)
    how = rng.randrange(3) if isinstance(node, dict) else 0
    if how == 0:
        node[k] = rng.choice(_LEAVES)
    elif how == 1:
        del node[k]
    else:
        node["x" + k] = node.pop(k)
    return doc


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**32))
def test_a_shape_answers_ok_exactly_when_it_has_no_complaint(seed: int) -> None:
    """`ok` (asked of every reading a report reads) and `check` (asked for the complaint) never disagree."""
    reading = json.loads(archive.proc_line(procfs.reading([os.getpid()])))  # as a reader gets it: string keys
    meta = json.loads(json.dumps(schema.encode(Meta(targets=[Target(7, threads={7: "t"})],
                                                    sampling=Sampling(frequency=99)))))
    rng = random.Random(seed)
    for doc, shape in ((reading, schema.PROC_READING), (meta, archive.META_SHAPE)):
        bad = _damaged(doc, rng)
        assert shape.ok(bad) == (shape.check(bad, "") is None)


def test_exit_watch_tells_a_live_target_from_an_exited_one() -> None:
    """The session's per-tick liveness (pidfds): alive while it runs; not once it exits, as a zombie and
    once reaped; a pid gone before it was first asked is not alive even if reused later."""
    import subprocess
    import sys
    import time

    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    with procfs.ExitWatch() as watch:
        assert watch.alive(child.pid)
        assert child.stdin is not None
        child.stdin.close()
        deadline = time.monotonic() + 10
        while watch.alive(child.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not watch.alive(child.pid), "an exited child (a zombie until reaped) counted as alive"
        child.wait()
        assert not watch.alive(child.pid)
        gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True, check=True)
        assert not watch.alive(int(gone.stdout))
