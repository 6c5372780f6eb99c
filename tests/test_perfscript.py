"""Reading `perf script -F comm,pid,tid,time,period,ip,sym,dso --no-inline` text into folded stacks
(collectors.perfscript): the grammar on real shapes, and the folder against a plain line reader on any text
and any cutting of it into pieces."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import examples
from qprof.archive.stacks import Sample, StackRecord, fold
from qprof.collectors.perfscript import (
    BIN_NS,
    KERNEL_DSO,
    UNKNOWN,
    Header,
    ParseStats,
    StreamFolder,
    fold_text,
    parse_frame,
    parse_header,
    split_symbol_dso,
    time_ns,
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


def parse(text: str) -> tuple[list[StackRecord], ParseStats]:
    stats = ParseStats()
    return fold_text(text, stats), stats


def reference(text: str) -> tuple[list[StackRecord], ParseStats]:
    """The grammar of collectors.perfscript's docstring read a line at a time, as plainly as it is
    written there, and folded: what the folder must give."""
    stats = ParseStats()
    samples: list[Sample] = []
    open_: tuple[Header, list[tuple[str, str]]] | None = None

    def close() -> None:
        nonlocal open_
        if open_ is not None:
            h, frames = open_
            when = None if h.time_ns is None else h.time_ns // BIN_NS
            samples.append(Sample(h.pid, h.tid, h.comm, h.period, tuple(frames), when, h.time_ns))
            stats.samples += 1
            open_ = None

    for line in text.split("\n"):
        header = None if line[:1] == "\t" else parse_header(line)
        if not line.strip():
            close()
        elif header is not None:
            close()
            open_ = (header, [])
        else:
            frame = parse_frame(line)
            if frame is None or open_ is None:
                stats.bad(line)
            else:
                open_[1].append(frame)
    close()
    return fold(samples), stats


def streamed(text: str, cuts: list[int], max_texts: int = 16384, max_block: int = 1 << 20
             ) -> tuple[list[StackRecord], ParseStats]:
    stats = ParseStats()
    folder = StreamFolder(stats, max_texts=max_texts, max_block=max_block)
    prev = 0
    for c in sorted(set(cuts)):
        folder.feed(text[prev:c])
        prev = c
    folder.feed(text[prev:])
    return folder.finish(), stats


def same(a: tuple[list[StackRecord], ParseStats], b: tuple[list[StackRecord], ParseStats]) -> None:
    assert a[0] == b[0]  # same records in the same (first-occurrence) order
    assert (a[1].samples, a[1].bad_lines, a[1].bad_examples) == (b[1].samples, b[1].bad_lines, b[1].bad_examples)


# ---------------------------------------------------------------- examples


def test_real_sample() -> None:
    recs, stats = parse(REAL)
    assert recs == [StackRecord(9926, 9926, "gtlsserver", 1, 1001001, (
        ("udp_sendmsg", KERNEL_DSO),
        ("__libc_sendmsg", LIBC),
        (UNKNOWN, NGTCP2),
    ))]
    assert stats.samples == 1 and stats.bad_lines == 0


def test_unknown_symbol_and_dso_in_user_space_stay_unknown() -> None:
    recs, stats = parse("  x 1/2 3\n\t    7f0000001000 [unknown] ([unknown])\n\n")
    assert recs[0].frames == ((UNKNOWN, UNKNOWN),)
    assert stats.bad_lines == 0


def test_kernel_ip_with_unknown_dso_becomes_kallsyms() -> None:
    text = ("  x 1/2 3\n"
            "\tffffffff8e0a1234 [unknown] ([unknown])\n"
            "\tffff800000000000 some_func ([unknown])\n"
            "\tffff7fffffffffff user_func ([unknown])\n\n")
    recs, _ = parse(text)
    assert recs[0].frames == ((UNKNOWN, KERNEL_DSO), ("some_func", KERNEL_DSO), ("user_func", UNKNOWN))


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
@pytest.mark.parametrize("stamp, ns", [("", None), ("  9146.799116:", 9146_799_116_000)])
def test_comm_names(comm: str, stamp: str, ns: int | None) -> None:
    line = f"{comm:>16}  9926/9927{stamp}     1001001 "
    assert parse_header(line) == (comm, 9926, 9927, 1001001, ns)
    text = line + "\n" + f"\t    7f5d1c2a3b4c sendmsg ({LIBC})\n\n"
    recs, stats = parse(text)
    assert [(r.comm, r.pid, r.tid, r.period, r.span_ns) for r in recs] == [
        (comm, 9926, 9927, 1001001, None if ns is None else (ns, ns))]
    assert stats.bad_lines == 0
    same((recs, stats), reference(text))


@pytest.mark.parametrize("stamp, bin_", [("0.000001:", 0), ("12.3:", 123), ("12.399999999:", 123),
                                          ("123456789.987654:", 1234567899), ("12:", None), ("x.1:", None),
                                          ("12.:", None), ("١٢.3:", None), ("12.3::", None)])
def test_time_bins(stamp: str, bin_: int | None) -> None:
    """Tenths of a second from the text itself: no float rounding near a bin's edge; a stamp that is
    not one leaves the sample without a time (the header reads without it) or makes no header."""
    text = f"  srv 1/1  {stamp}  10\n\t 7f f (/x)\n\n"
    recs, stats = parse(text)
    assert [r.bins for r in recs] == ([((bin_, 10),)] if bin_ is not None else [()] if recs else [])
    same((recs, stats), reference(text))


@pytest.mark.parametrize("stamp, ns", [("0.000001", 1000), ("12.3", 12_300_000_000), ("12.399999999", 12_399_999_999),
                                       ("5.1234567891", 5_123_456_789), ("12", None), ("12.", None), ("x.1", None),
                                       ("12.3:", None), ("١٢.3", None)])
def test_time_ns(stamp: str, ns: int | None) -> None:
    """Nanoseconds from the text itself (digits past the ninth dropped): a sample's exact time."""
    assert time_ns(stamp) == ns


def test_header_with_event_tail() -> None:
    assert parse_header("  server 1/2 250000 cpu-clock:") == ("server", 1, 2, 250000, None)
    assert parse_header("  server 1/2 250000 cpu-clock:ppp:") == ("server", 1, 2, 250000, None)
    assert parse_header("  server 1/2  5.25:  250000 cpu-clock:") == ("server", 1, 2, 250000, 5_250_000_000)


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
    recs, stats = parse(text)
    assert [r.comm for r in recs] == ["ksoftirqd/0", "server"]
    assert all(d == KERNEL_DSO for _, d in recs[0].frames)
    assert recs[1].frames == (("memcpy", LIBC), ("main", "/usr/bin/server"))
    assert stats.samples == 2 and stats.bad_lines == 0


def test_sample_without_frames() -> None:
    text = "  server 1/2 100\n\n  server 1/2 200\n\tffffffff8e0a1234 f ([kernel.kallsyms])\n\n"
    recs, _ = parse(text)
    assert [(r.period, r.frames) for r in recs] == [(100, ()), (200, (("f", KERNEL_DSO),))]


def test_consecutive_headers_without_blank_line() -> None:
    recs, stats = parse("  a 1/1 10\n  b 2/2 20\n\tffffffff8e0a1234 f ([kernel.kallsyms])\n")
    assert [(r.comm, len(r.frames)) for r in recs] == [("a", 0), ("b", 1)]
    assert stats.samples == 2


def test_last_sample_without_trailing_blank_line() -> None:
    recs, stats = parse(REAL.rstrip("\n"))
    assert len(recs) == 1 and len(recs[0].frames) == 3
    assert stats.samples == 1


def test_multiple_and_whitespace_only_blank_lines() -> None:
    recs, stats = parse("\n\n" + REAL + "\n   \n" + REAL)
    assert [r.samples for r in recs] == [2] and stats.samples == 2


def test_garbage_counted_not_raised() -> None:
    text = ("Warning: Processed 123 events and lost 4 chunks!\n"   # before any header
            "\tffffffff8e0a1234 orphan ([kernel.kallsyms])\n"       # frame without header
            + REAL.rstrip("\n") + "\n"
            "this is not a frame\n"                                  # inside a sample
            "\tzz not hex\n"
            "\n")
    recs, stats = parse(text)
    assert len(recs) == 1 and len(recs[0].frames) == 3
    assert stats.bad_lines == 4
    assert stats.bad_examples[0].startswith("Warning:")


def test_bad_examples_bounded() -> None:
    stats = ParseStats()
    fold_text("".join(f"garbage {i}" + "x" * 500 + "\n" for i in range(50)), stats)
    assert stats.bad_lines == 50
    assert len(stats.bad_examples) == 5 and all(len(e) <= 200 for e in stats.bad_examples)


def test_stats_optional() -> None:
    assert [r.samples for r in fold_text(REAL)] == [1]


def test_repeated_stacks_are_counted_and_periods_summed() -> None:
    text = REAL + REAL.replace("1001001", "5") + REAL.replace("9926/9926", "9926/9927")
    recs, stats = streamed(text, [7, 100])
    assert [(r.tid, r.samples, r.period) for r in recs] == [(9926, 2, 1001006), (9927, 1, 1001001)]
    assert recs[0].frames[0] == ("udp_sendmsg", KERNEL_DSO) and stats.samples == 3
    same((recs, stats), reference(text))


def test_bad_frame_lines_counted_per_occurrence() -> None:
    bad = REAL.replace("\n\n", "\n\tnot a frame\n\n")
    recs, stats = streamed(bad * 3, [])
    assert stats.bad_lines == 3 and stats.bad_examples == ["\tnot a frame"] * 3
    assert recs[0].samples == 3
    same((recs, stats), reference(bad * 3))


def test_odd_shapes_are_read_a_line_at_a_time() -> None:
    # two headers without a blank line, a whitespace-only separator, an event tail, no frames,
    # a space-led frame line
    text = ("  a 1/1 10\n  a 1/1 20\n\tffffffff81000000 f ([kernel.kallsyms])\n   \n"
            "  b c 2/3 7 cpu-clock:\n\t 7f g (/x)\n 7f h (/y)\n\n  d 4/4 9\n")
    recs, stats = streamed(text, [3, 30])
    assert [(r.comm, r.period, len(r.frames)) for r in recs] == [("a", 10, 0), ("a", 20, 1), ("b c", 7, 2),
                                                               ("d", 9, 0)]
    same((recs, stats), reference(text))


def test_header_inside_a_sample_starts_the_next() -> None:
    # perf never writes this, but a space-led line that reads as a header is one, not a frame
    text = "  a 1/1 10\n  a 1/1 20\n\tffffffff81000000 f ([kernel.kallsyms])\n\n" * 2
    recs, stats = streamed(text, [])
    assert [(r.samples, r.period, len(r.frames)) for r in recs] == [(2, 20, 0), (2, 40, 1)]
    same((recs, stats), reference(text))


def test_period_must_be_a_number_the_header_parser_reads() -> None:
    # after a good sample of the same text, "1_0" and "²" (int() reads one, isdigit() the other)
    # make a line the header parser rejects: frames become unreadable lines
    for odd in ("1_0", "²", "٣"):
        text = REAL + REAL.replace("1001001", odd)
        same(streamed(text, []), reference(text))


def test_long_sample_is_read_a_line_at_a_time() -> None:
    frames = "".join(f"\t {i:x} f{i} (/lib/x.so)\n" for i in range(200))
    text = "  srv 5/5 100\n" + frames + "\n" + REAL
    recs, stats = streamed(text, list(range(0, len(text), 97)), max_block=256)
    assert [len(r.frames) for r in recs] == [200, 3]
    same((recs, stats), reference(text))


def test_bounded_number_of_texts() -> None:
    texts = [REAL.replace("udp_sendmsg", f"f{i}") for i in range(50)]
    text = "".join(texts * 3)
    folder = StreamFolder(ParseStats(), max_texts=8)
    for i in range(0, len(text), 500):
        folder.feed(text[i:i + 500])
        assert len(folder._texts) < 8  # the distinct texts are folded away before they pile up
    recs = folder.finish()
    assert recs == reference(text)[0] and all(r.samples == 3 for r in recs)


def test_sample_times_are_kept_per_bin() -> None:
    """With times in the headers, each record keeps its period per 100 ms bin and its first and last
    sample's time, identically on the fast path and a line at a time, wherever the text is cut."""
    timed = [REAL.replace("9926/9926 ", f"9926/9926  {t}: ").replace("1001001", str(p))
             for t, p in (("100.01", 10), ("100.09", 20), ("100.10", 40), ("101.95", 80))]
    odd = timed[1].replace("\n\n", "\n \n")  # a whitespace-only separator: read a line at a time
    text = "".join([timed[0], odd, timed[2], timed[3]])
    recs, stats = streamed(text, [30, 200, 333])
    assert [(r.samples, r.period, r.bins) for r in recs] == [(4, 150, ((1000, 30), (1001, 40), (1019, 80)))]
    assert recs[0].span_ns == (100_010_000_000, 101_950_000_000), "its first and last sample's times, exact"
    same((recs, stats), reference(text))
    for n in (1, 2, 3):  # flushed every n distinct texts: bins merge across flushes
        same(streamed(text, [50], max_texts=n), reference(text))


# ---------------------------------------------------------------- properties

_no_ctl = st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp"))


@settings(max_examples=examples(300), suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=400), st.lists(st.integers(0, 400), max_size=6), st.integers(1, 4), st.integers(4, 200))
def test_any_text_reads_as_the_line_reader_reads_it(text: str, cuts: list[int], max_texts: int, max_block: int
                                                    ) -> None:
    """Never raises; every non-blank line is a header, a frame or counted unreadable."""
    recs, stats = streamed(text, cuts, max_texts, max_block)
    same((recs, stats), reference(text))
    assert stats.samples == sum(r.samples for r in recs)
    nonblank = [ln for ln in text.split("\n") if ln.strip()]
    assert stats.bad_lines + sum(r.samples * (1 + len(r.frames)) for r in recs) == len(nonblank)


@settings(max_examples=examples(200))
@given(st.lists(st.sampled_from([
    "  server 1/2 100", "\tffffffff8e0a1234 f ([kernel.kallsyms])", "\t    7f00 g (/x.so (deleted))",
    "", "   ", "garbage", "\t", "\tabc", "  a b 1/2 3 ev:", "\t 7f [unknown] ([unknown])",
]), max_size=30), st.lists(st.integers(0, 600), max_size=6))
def test_arbitrary_line_mixes(lines: list[str], cuts: list[int]) -> None:
    text = "\n".join(lines)
    recs, stats = streamed(text, cuts)
    same((recs, stats), reference(text))
    assert stats.samples == sum(r.samples for r in recs)
    assert all(r.comm in ("server", "a b") for r in recs)


# Few distinct values, so that texts repeat and the fast path's look-ups hit, with every odd case
# of the header: tab-led lines, comm with spaces and digits, odd times, non-ASCII digits and other
# non-numbers as period, an event tail, trailing whitespace.
_header = st.builds(
    lambda lead, comm, pid, tid, stamp, period, tail, ws: f"{lead}{comm:>8} {pid}/{tid}{stamp} {period}{tail}{ws}",
    st.sampled_from(["", "", "", "\t", " "]), st.sampled_from(["a", "b c", "x:", "1/2", "", "\x1c"]),
    st.sampled_from([1, 2, -1]), st.sampled_from([1, 2]),
    st.sampled_from(["", "", "  5.25:", " 0.099999:", " 12.3::", " ٣.1:", " 1.1٣:", " 7:", " 1.5: "]),
    st.one_of(st.integers(0, 10**12).map(str), st.sampled_from(["7", "٣", "²", "1_0", "-5", "+5"])),
    st.sampled_from(["", "", " cpu-clock:", " x"]), st.sampled_from(["", " ", "  ", "\t", "\x0b"]))
_frame = st.one_of(
    st.builds(lambda ip, sym, dso: f"\t{ip:16x} {sym} ({dso})",
              st.sampled_from([0x7F00, 0xFFFFFFFF81000000, 2**64 - 1]),
              st.sampled_from(["f", "g(int)", "[unknown]", "h+0x10", "cfree@GLIBC_2.2.5"]),
              st.sampled_from(["[kernel.kallsyms]", "[unknown]", "/lib/x.so", "/lib/y.so (deleted)"])),
    st.sampled_from(["\t", "\tgarbage", "\t 7f", " 7f00 f (/x)", "  a 1/1 10", "garbage", "  ", ""]))
_block = st.builds(lambda h, fs: "\n".join([h, *fs]), _header, st.lists(_frame, max_size=5))
_sep = st.sampled_from(["\n", "\n\n", "\n\n\n", "\n \n", "\n\t\n"])
_text = st.builds(lambda blocks, seps: "".join(b + s for b, s in zip(blocks, seps)),
                  st.lists(_block, max_size=12), st.lists(_sep, min_size=12, max_size=12))


@settings(max_examples=examples(300), suppress_health_check=[HealthCheck.too_slow])
@given(_text, st.lists(st.integers(0, 600), max_size=8), st.integers(1, 6), st.integers(8, 400))
def test_sample_shaped_text_reads_as_the_line_reader_reads_it(text: str, cuts: list[int], max_texts: int,
                                                              max_block: int) -> None:
    same(streamed(text, cuts, max_texts, max_block), reference(text))


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
    recs, stats = parse(text)
    expected = [
        Sample(pid, tid, comm, period, tuple(
            (sym, KERNEL_DSO if dso == UNKNOWN and _kernel_ip(ip) else dso) for ip, sym, dso in frames),
            None if micros is None else micros // 100_000, None if micros is None else micros * 1000)
        for comm, pid, tid, period, frames, micros in samples
    ]
    assert recs == fold(expected)
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
