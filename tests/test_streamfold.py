"""The block folder must give exactly what the line parser and `fold` give, for any text and any chunking."""

from __future__ import annotations

import io

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qprof.collectors.perfscript import KERNEL_DSO, ParseStats, parse_samples
from qprof.archive.stacks import StackRecord, fold
from qprof.collectors.streamfold import StreamFolder
from conftest import examples

SAMPLE = ("      gtlsserver  9926/9926     1001001 \n"
          "\tffffffff8e0a1234 udp_sendmsg ([kernel.kallsyms])\n"
          "\t    7f5d1c2a3b4c __libc_sendmsg (/usr/lib/x86_64-linux-gnu/libc.so.6)\n"
          "\n")


def reference(text: str) -> tuple[list[StackRecord], ParseStats]:
    stats = ParseStats()
    return fold(parse_samples(io.StringIO(text), stats)), stats


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


def test_repeated_stacks_are_counted_and_periods_summed() -> None:
    text = SAMPLE + SAMPLE.replace("1001001", "5") + SAMPLE.replace("9926/9926", "9926/9927")
    recs, stats = streamed(text, [7, 100])
    assert [(r.tid, r.samples, r.period) for r in recs] == [(9926, 2, 1001006), (9927, 1, 1001001)]
    assert recs[0].frames[0] == ("udp_sendmsg", KERNEL_DSO) and stats.samples == 3
    same((recs, stats), reference(text))


def test_bad_frame_lines_counted_per_occurrence() -> None:
    bad = SAMPLE.replace("\n\n", "\n\tnot a frame\n\n")
    recs, stats = streamed(bad * 3, [])
    assert stats.bad_lines == 3 and stats.bad_examples == ["\tnot a frame"] * 3
    assert recs[0].samples == 3
    same((recs, stats), reference(bad * 3))


def test_odd_shapes_take_the_line_parser() -> None:
    # two headers without a blank line, a whitespace-only separator, an event tail, no frames
    text = ("  a 1/1 10\n  a 1/1 20\n\tffffffff81000000 f ([kernel.kallsyms])\n   \n"
            "  b c 2/3 7 cpu-clock:\n\t 7f g (/x)\n\n  d 4/4 9\n")
    same(streamed(text, [3, 30]), reference(text))


def test_header_inside_a_sample_starts_the_next() -> None:
    # perf never writes this, but a space-led line that reads as a header is one, not a frame
    text = "  a 1/1 10\n  a 1/1 20\n\tffffffff81000000 f ([kernel.kallsyms])\n\n" * 2
    recs, stats = streamed(text, [])
    assert [(r.samples, r.period, len(r.frames)) for r in recs] == [(2, 20, 0), (2, 40, 1)]
    same((recs, stats), reference(text))


def test_period_must_be_a_number_the_header_parser_reads() -> None:
    # after a good sample of the same text, "1_0" and "²" (int() reads one, isdigit() the other)
    # make a line the header parser rejects: frames become unreadable lines, as in the line parser
    for odd in ("1_0", "²", "٣"):
        text = SAMPLE + SAMPLE.replace("1001001", odd)
        same(streamed(text, []), reference(text))


def test_long_sample_is_read_line_by_line() -> None:
    frames = "".join(f"\t {i:x} f{i} (/lib/x.so)\n" for i in range(200))
    text = "  srv 5/5 100\n" + frames + "\n" + SAMPLE
    same(streamed(text, list(range(0, len(text), 97)), max_block=256), reference(text))


def test_bounded_number_of_texts() -> None:
    texts = [SAMPLE.replace("udp_sendmsg", f"f{i}") for i in range(50)]
    text = "".join(texts * 3)
    folder = StreamFolder(ParseStats(), max_texts=8)
    for i in range(0, len(text), 500):
        folder.feed(text[i:i + 500])
        assert len(folder._texts) < 8  # the distinct texts are folded away before they pile up
    recs = folder.finish()
    assert recs == reference(text)[0] and all(r.samples == 3 for r in recs)


# ---------------------------------------------------------------- properties

# Few distinct values, so that texts repeat and the fast path's look-ups hit, with every odd case
# of the header: tab-led lines (frames to the line parser), comm with spaces and digits,
# non-ASCII digits and other non-numbers as period, an event tail, trailing whitespace.
_header = st.builds(
    lambda lead, comm, pid, tid, period, tail, ws: f"{lead}{comm:>8} {pid}/{tid} {period}{tail}{ws}",
    st.sampled_from(["", "", "", "\t", " "]), st.sampled_from(["a", "b c", "x:", "1/2", "", "\x1c"]),
    st.sampled_from([1, 2, -1]), st.sampled_from([1, 2]),
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
def test_same_as_line_parser(text: str, cuts: list[int], max_texts: int, max_block: int) -> None:
    same(streamed(text, cuts, max_texts, max_block), reference(text))


@settings(max_examples=examples(300), suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=300), st.lists(st.integers(0, 300), max_size=6), st.integers(1, 4), st.integers(4, 200))
def test_same_as_line_parser_on_any_text(text: str, cuts: list[int], max_texts: int, max_block: int) -> None:
    # io.StringIO splits on "\n" only, as the folder does (perf's pipe is decoded with universal newlines first)
    same(streamed(text, cuts, max_texts, max_block), reference(text))


def test_sample_times_are_kept_per_bin() -> None:
    """With times in the headers (perf script -F ...,time,...), each record keeps its period per 100 ms
    bin, identically on the fast path and the line parser's, wherever the text is cut."""
    timed = [SAMPLE.replace("9926/9926 ", f"9926/9926  {t}: ").replace("1001001", str(p))
             for t, p in (("100.01", 10), ("100.09", 20), ("100.10", 40), ("101.95", 80))]
    odd = timed[1].replace("\n\n", "\n \n")  # a whitespace-only separator: the line parser's path
    text = "".join([timed[0], odd, timed[2], timed[3]])
    recs, stats = streamed(text, [30, 200, 333])
    assert [(r.samples, r.period, r.bins) for r in recs] == [(4, 150, ((1000, 30), (1001, 40), (1019, 80)))]
    assert recs[0].span_ns == (100_010_000_000, 101_950_000_000), "its first and last sample's times, exact"
    same((recs, stats), reference(text))
    for n in (1, 2, 3):  # flushed every n distinct texts: bins merge across flushes
        same(streamed(text, [50], max_texts=n), reference(text))
