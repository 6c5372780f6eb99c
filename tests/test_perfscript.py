"""Parsing of `perf script -F comm,pid,tid,period,ip,sym,dso --no-inline` text."""

from __future__ import annotations

import io

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import examples
from qprof.collectors.perfscript import (
    KERNEL_DSO,
    UNKNOWN,
    ParseStats,
    Sample,
    parse_frame,
    parse_header,
    time_bin,
    time_ns,
    parse_samples,
    split_symbol_dso,
)

LIBC = "/usr/lib/x86_64-linux-gnu/libc.so.6"
NGTCP2 = "/usr/lib/x86_64-linux-gnu/libngtcp2.so.9.0.1"

REAL = (
    "      gtlsserver  9926/9926     1001001 \n"
    "\tffffffff8e0a1234 udp_sendmsg ([kernel.kallsyms])\n"
    f"\t    7f5d1c2a3b4c __libc_sendmsg ({LIBC})\n"
    f"\t    7f5d1c000000 [unknown] ({NGTCP2})\n"
    "\n"
)


def parse(text: str) -> tuple[list[Sample], ParseStats]:
    stats = ParseStats()
    return list(parse_samples(io.StringIO(text), stats)), stats


# ---------------------------------------------------------------- examples


def test_real_sample() -> None:
    samples, stats = parse(REAL)
    assert samples == [Sample(9926, 9926, "gtlsserver", 1001001, (
        ("udp_sendmsg", KERNEL_DSO),
        ("__libc_sendmsg", LIBC),
        (UNKNOWN, NGTCP2),
    ))]
    assert stats.samples == 1 and stats.bad_lines == 0


def test_unknown_symbol_and_dso_in_user_space_stay_unknown() -> None:
    samples, stats = parse("  x 1/2 3\n\t    7f0000001000 [unknown] ([unknown])\n\n")
    assert samples[0].frames == ((UNKNOWN, UNKNOWN),)
    assert stats.bad_lines == 0


def test_kernel_ip_with_unknown_dso_becomes_kallsyms() -> None:
    text = ("  x 1/2 3\n"
            "\tffffffff8e0a1234 [unknown] ([unknown])\n"
            "\tffff800000000000 some_func ([unknown])\n"
            "\tffff7fffffffffff user_func ([unknown])\n\n")
    samples, _ = parse(text)
    assert samples[0].frames == ((UNKNOWN, KERNEL_DSO), ("some_func", KERNEL_DSO), ("user_func", UNKNOWN))


def test_perf_context_markers_are_not_kernel_addresses() -> None:
    # e.g. ffffffffffffffff ends a truncated DWARF user stack
    assert parse_frame("\tffffffffffffffff [unknown] ([unknown])") == (UNKNOWN, UNKNOWN)
    assert parse_frame("\tfffffffffffff000 [unknown] ([unknown])") == (UNKNOWN, UNKNOWN)
    assert parse_frame("\tffffffffffffefff [unknown] ([unknown])") == (UNKNOWN, KERNEL_DSO)


def test_kernel_module_dso_kept() -> None:
    assert parse_frame("\tffffffffc0a01234 nf_hook_slow ([nf_tables])") == ("nf_hook_slow", "[nf_tables]")


def test_deleted_mapping() -> None:
    assert parse_frame("\t    7f5d1c2a3b4c foo (/tmp/x.so (deleted))") == ("foo", "/tmp/x.so (deleted)")
    assert parse_frame("\t    7f5d1c2a3b4c foo(int) (/tmp/x.so (deleted))") == ("foo(int)", "/tmp/x.so (deleted)")


@pytest.mark.parametrize("sym", [
    "std::vector<int, std::allocator<int> >::push_back(int const&)",
    "(anonymous namespace)::foo()",
    "std::function<void ()>::operator()() const",
    "operator new(unsigned long)",
    "void ngtcp2::(anonymous namespace)::f<(lambda at x.cc:3:5)>(int (*)(char))",
    "[unknown]",
])
def test_demangled_cpp_symbols(sym: str) -> None:
    assert parse_frame(f"\t    55d0c0ffee00 {sym} (/usr/bin/server)") == (sym, "/usr/bin/server")


def test_symbol_offset_stripped() -> None:
    assert parse_frame(f"\t    7f5d1c2a3b4c __libc_sendmsg+0x1a ({LIBC})") == ("__libc_sendmsg", LIBC)
    assert parse_frame("\tffffffff8e0a1234 udp_sendmsg+0xFF0 ([kernel.kallsyms])") == ("udp_sendmsg", KERNEL_DSO)
    assert parse_frame("\t    7f5d1c2a3b4c foo(int)+0x10 (/x.so)") == ("foo(int)", "/x.so")


def test_no_dso_group() -> None:
    assert split_symbol_dso("just_a_symbol") == ("just_a_symbol", UNKNOWN)
    assert split_symbol_dso("(/lib/x.so)") == (UNKNOWN, "/lib/x.so")
    assert split_symbol_dso("foo ()") == ("foo", UNKNOWN)


@pytest.mark.parametrize("comm", [
    "gtlsserver", "Web Content", "kworker/u8:2", "worker 1/2", "a 1/2 3", "1/2", "1234",
    "tokio-runtime-w", "x 12/34 56 ev:", "quic server #3",
])
@pytest.mark.parametrize("stamp, bin_", [("", None), ("  9146.799116:", 91467)])
def test_comm_names(comm: str, stamp: str, bin_: int | None) -> None:
    line = f"{comm:>16}  9926/9927{stamp}     1001001 "
    assert parse_header(line) == (comm, 9926, 9927, 1001001, bin_)
    samples, stats = parse(line + "\n" + f"\t    7f5d1c2a3b4c sendmsg ({LIBC})\n\n")
    assert [(s.comm, s.pid, s.tid, s.period, s.bin) for s in samples] == [(comm, 9926, 9927, 1001001, bin_)]
    assert stats.bad_lines == 0


@pytest.mark.parametrize("stamp, bin_", [("0.000001:", 0), ("12.3:", 123), ("12.399999999", 123),
                                          ("123456789.987654:", 1234567899), ("12:", None), ("x.1:", None),
                                          ("12.:", None), ("١٢.3:", None)])
def test_time_bins(stamp: str, bin_: int | None) -> None:
    """Tenths of a second from the text itself: no float rounding near a bin's edge."""
    assert time_bin(stamp) == bin_


@pytest.mark.parametrize("stamp, ns", [("0.000001:", 1000), ("12.3:", 12_300_000_000), ("12.399999999", 12_399_999_999),
                                       ("5.1234567891:", 5_123_456_789), ("12:", None), ("12.:", None), ("x.1:", None)])
def test_time_ns(stamp: str, ns: int | None) -> None:
    """Nanoseconds from the text itself (digits past the ninth dropped): a sample's exact time."""
    assert time_ns(stamp) == ns


def test_header_with_event_tail() -> None:
    assert parse_header("  server 1/2 250000 cpu-clock:") == ("server", 1, 2, 250000, None)
    assert parse_header("  server 1/2 250000 cpu-clock:ppp:") == ("server", 1, 2, 250000, None)
    assert parse_header("  server 1/2  5.25:  250000 cpu-clock:") == ("server", 1, 2, 250000, 52)


def test_header_rejects() -> None:
    assert parse_header("no numbers here") is None
    assert parse_header("  server 1/2") is None
    assert parse_header("  server 1/2 3 4") is None


def test_kernel_only_and_user_only_stacks() -> None:
    text = ("  ksoftirqd/0    15/15   250000 \n"
            "\tffffffff8e0a1234 net_rx_action ([kernel.kallsyms])\n"
            "\tffffffff8e0a2234 __do_softirq ([kernel.kallsyms])\n"
            "\n"
            "  server 20/21   250000 \n"
            f"\t    7f5d1c2a3b4c memcpy ({LIBC})\n"
            "\t    55d0c0ffee00 main (/usr/bin/server)\n"
            "\n")
    samples, stats = parse(text)
    assert [s.comm for s in samples] == ["ksoftirqd/0", "server"]
    assert all(d == KERNEL_DSO for _, d in samples[0].frames)
    assert samples[1].frames == (("memcpy", LIBC), ("main", "/usr/bin/server"))
    assert stats.samples == 2 and stats.bad_lines == 0


def test_sample_without_frames() -> None:
    text = "  server 1/2 100\n\n  server 1/2 200\n\tffffffff8e0a1234 f ([kernel.kallsyms])\n\n"
    samples, _ = parse(text)
    assert [(s.period, s.frames) for s in samples] == [(100, ()), (200, (("f", KERNEL_DSO),))]


def test_consecutive_headers_without_blank_line() -> None:
    samples, stats = parse("  a 1/1 10\n  b 2/2 20\n\tffffffff8e0a1234 f ([kernel.kallsyms])\n")
    assert [(s.comm, len(s.frames)) for s in samples] == [("a", 0), ("b", 1)]
    assert stats.samples == 2


def test_last_sample_without_trailing_blank_line() -> None:
    samples, stats = parse(REAL.rstrip("\n"))
    assert len(samples) == 1 and len(samples[0].frames) == 3
    assert stats.samples == 1


def test_multiple_and_whitespace_only_blank_lines() -> None:
    samples, _ = parse("\n\n" + REAL + "\n   \n" + REAL)
    assert len(samples) == 2


def test_garbage_counted_not_raised() -> None:
    text = ("Warning: Processed 123 events and lost 4 chunks!\n"   # before any header
            "\tffffffff8e0a1234 orphan ([kernel.kallsyms])\n"       # frame without header
            + REAL.rstrip("\n") + "\n"
            "this is not a frame\n"                                  # inside a sample
            "\tzz not hex\n"
            "\n")
    samples, stats = parse(text)
    assert len(samples) == 1 and len(samples[0].frames) == 3
    assert stats.bad_lines == 4
    assert stats.bad_examples[0].startswith("Warning:")


def test_bad_examples_bounded() -> None:
    stats = ParseStats()
    list(parse_samples((f"garbage {i}" + "x" * 500 for i in range(50)), stats))
    assert stats.bad_lines == 50
    assert len(stats.bad_examples) == 5 and all(len(e) <= 200 for e in stats.bad_examples)


def test_stats_optional() -> None:
    assert len(list(parse_samples(REAL.splitlines()))) == 1


# ---------------------------------------------------------------- properties

_no_ctl = st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp"))


@settings(max_examples=examples(200), suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=400))
def test_arbitrary_text_never_raises(text: str) -> None:
    stats = ParseStats()
    samples = list(parse_samples(io.StringIO(text), stats))
    assert stats.samples == len(samples)
    nonblank = [ln for ln in io.StringIO(text) if ln.rstrip("\n").strip()]
    assert stats.bad_lines <= len(nonblank)
    assert len(samples) + stats.bad_lines <= len(nonblank)
    assert stats.bad_lines + sum(1 + len(s.frames) for s in samples) == len(nonblank)


@settings(max_examples=examples(200))
@given(st.lists(st.sampled_from([
    "  server 1/2 100", "\tffffffff8e0a1234 f ([kernel.kallsyms])", "\t    7f00 g (/x.so (deleted))",
    "", "   ", "garbage", "\t", "\tabc", "  a b 1/2 3 ev:", "\t 7f [unknown] ([unknown])",
]), max_size=30))
def test_arbitrary_line_mixes(lines: list[str]) -> None:
    stats = ParseStats()
    samples = list(parse_samples(lines, stats))
    assert stats.samples == len(samples)
    assert all(s.comm in ("server", "a b") for s in samples)


def _clean(s: str) -> bool:
    return s == s.strip() and "\t" not in s


_comm = st.text(_no_ctl, min_size=1, max_size=24).filter(_clean)
# Symbols: anything printable except parentheses, plus balanced C++-looking groups.
_plain = st.text(st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp"), blacklist_characters="()"),
                 min_size=1, max_size=20)
_sym = st.one_of(
    st.just(UNKNOWN),
    _plain,
    st.builds(lambda a, b: f"{a}({b})", _plain, st.text(st.sampled_from("int const&*, <>"), max_size=12)),
    st.builds(lambda a: f"(anonymous namespace)::{a}()", _plain),
).filter(lambda s: _clean(s) and not split_symbol_dso_is_offset(s))
_dso = st.one_of(
    st.sampled_from([UNKNOWN, KERNEL_DSO, LIBC, NGTCP2, "[vdso]", "/tmp/x.so (deleted)"]),
    st.text(st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp", "Zs"), blacklist_characters="()"),
            min_size=1, max_size=20).map(lambda s: "/" + s),
)
KSTART, MARKERS = 0xFFFF800000000000, 0xFFFFFFFFFFFFF000  # kernel half; perf context markers on top
_ip = st.one_of(st.integers(0, 0x7FFFFFFFFFFF), st.integers(KSTART, MARKERS - 1),
                st.integers(MARKERS, 2**64 - 1))


def _kernel_ip(ip: int) -> bool:
    return KSTART <= ip < MARKERS


def split_symbol_dso_is_offset(s: str) -> bool:
    import re
    return re.search(r"\+0x[0-9a-fA-F]+$", s) is not None


_sample = st.tuples(_comm, st.integers(-1, 2**22), st.integers(-1, 2**22), st.integers(0, 2**40),
                    st.lists(st.tuples(_ip, _sym, _dso), max_size=6), st.none() | st.integers(0, 10**10))


def _render(comm: str, pid: int, tid: int, period: int, frames: list[tuple[int, str, str]],
            micros: int | None = None) -> str:
    when = "" if micros is None else f" {micros // 10**6:5}.{micros % 10**6:06d}:"
    out = [f"{comm:>16} {pid:5}/{tid:<5}{when} {period:>10} "]
    out += [f"\t{ip:16x} {sym} ({dso})" for ip, sym, dso in frames]
    return "\n".join(out) + "\n"


@settings(max_examples=examples(200), suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_sample, max_size=6), st.booleans())
def test_round_trip(samples: list, trailing_blank: bool) -> None:
    text = "\n".join(_render(*s) for s in samples)
    if trailing_blank:
        text += "\n"
    stats = ParseStats()
    got = list(parse_samples(io.StringIO(text), stats))
    expected = [
        Sample(pid, tid, comm, period, tuple(
            (sym, KERNEL_DSO if dso == UNKNOWN and _kernel_ip(ip) else dso) for ip, sym, dso in frames),
            None if micros is None else micros // 100_000, None if micros is None else micros * 1000)
        for comm, pid, tid, period, frames, micros in samples
    ]
    assert got == expected
    assert stats.bad_lines == 0 and stats.samples == len(samples)


def test_symbol_versions_are_dropped_but_plt_kept() -> None:
    assert parse_frame("\t 12 cfree@GLIBC_2.2.5 (/lib/libc.so.6)") == ("cfree", "/lib/libc.so.6")
    assert parse_frame("\t 12 clock_gettime@@GLIBC_2.17 (/lib/libc.so.6)") == ("clock_gettime", "/lib/libc.so.6")
    assert parse_frame("\t 12 memcpy@plt (/bin/x)") == ("memcpy@plt", "/bin/x")


def test_a_function_named_by_its_object_and_start_keeps_its_name() -> None:
    """qprof names a stripped object's internal functions `object+0xSTART` (collectors.debuginfo): that is a
    name, not an offset perf appended; an offset after any other name still goes."""
    lib = "/usr/lib/x86_64-linux-gnu/libgnutls.so.30.34.3"
    assert split_symbol_dso(f"libgnutls.so.30.34.3+0x13d800 ({lib})") == ("libgnutls.so.30.34.3+0x13d800", lib)
    assert split_symbol_dso(f"gnutls_cipher_encrypt2+0x13 ({lib})") == ("gnutls_cipher_encrypt2", lib)
    assert split_symbol_dso("libother.so+0x10 (/usr/lib/libgnutls.so.30)") == ("libother.so", "/usr/lib/libgnutls.so.30")
