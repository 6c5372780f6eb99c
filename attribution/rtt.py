"""A path's round-trip time as the kernel shows it: in the timing of an endpoint's own datagrams.

What a sender sends comes back acknowledged one round trip later, and the acknowledgements clock out
its next sends; a receiver's acknowledgements are answered by data one round trip later. So the
messages a side receives repeat, delayed by the round trip, the pattern of those it sent. The counts
per ~0.13 ms bin (probes/packetio/timing.py) are cross-correlated with the phase transform
(GCC-PHAT: every frequency weighted alike): a plain correlation of a periodic series peaks at its
period as much as at its delay (a pacer's 1-4 ms timer read as a round trip of a 0.25 ms path),
the whitened one at the delay. Nothing of the packets is read: this works encrypted, on one side
alone, with or without a qdisc that delays, on any stack.

Its limits: the receive-process-send loop of the endpoint itself sits at lags <= 0 (it receives,
then sends), so only lags of at least one bin are searched, up to MAX_LAG_S or half a stretch; a
sender that spreads its packets perfectly evenly leaves no pattern to echo, and then no round trip
is claimed (`None`), never a guess. On the receiving side a paced sender's timer can stand in for the
echo: the sender's side is the one that reads the path (the verdict takes it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from qprof.probes.packetio.timing import Stretch, TimingFile

if TYPE_CHECKING:
    import numpy as np

MAX_LAG_S = 0.4
MIN_BINS = 256  # a stretch shorter than this (~34 ms) says nothing of a round trip
# A peak counts when it stands this many times the correlation's spread across lags (the median
# absolute deviation: robust to the echoes themselves) above zero.
PEAK_NOISE = 8.0
# The round trip is the first of the echoes: the smallest lag whose peak reaches this share of the
# highest (a bursty sender's second echo can correlate as much as its first).
FUNDAMENTAL = 0.75
SPREAD_S = 0.002  # one echo spreads over neighbouring bins (the path's jitter): peaks closer are one


@dataclass(frozen=True)
class RoundTrip:
    """The round trip read from one process's datagram timing."""

    seconds: float
    correlation: float  # the whitened correlation at that lag
    noise: float  # its spread across lags
    bins: int  # bins the estimate used
    bin_s: float

    @property
    def ms(self) -> float:
        return self.seconds * 1e3

    @property
    def span_s(self) -> float:
        """The time its bins cover."""
        return self.bins * self.bin_s

    def to_json(self) -> dict[str, float | int]:
        return {"ms": round(self.ms, 3), "correlation": self.correlation, "noise": self.noise,
                "seconds_of_bins": round(self.span_s, 3)}


def round_trips(timing: TimingFile | None, pids: Sequence[int]) -> dict[int, RoundTrip]:
    """Each process's round trip from the run's message timing (the ones without a clear echo left out)."""
    if timing is None:
        return {}
    return {pid: rt for pid in pids if (rt := round_trip(timing.stretches.get(pid, []), timing.bin_s)) is not None}


def _median(values: "np.ndarray") -> float:
    """np.median of a finite array, without the numpy.ma import np.median makes (~35 ms a report)."""
    import numpy as np

    s = np.sort(values)
    n = len(s)
    return float((s[(n - 1) // 2] + s[n // 2]) / 2)


def round_trip(stretches: Sequence[Stretch], bin_s: float) -> RoundTrip | None:
    """The lag at which the receive counts echo the send counts; None without a clear echo."""
    import numpy as np

    usable = [s for s in stretches if len(s.send) >= MIN_BINS and len(s.send) == len(s.recv)]
    if not usable:
        return None
    hi = min(int(MAX_LAG_S / bin_s), max(len(s.send) for s in usable) // 2)
    if hi < 4:
        return None
    corr = np.zeros(hi + 1)
    n_bins = 0
    for s in usable:
        x = np.asarray(s.send, dtype=float)
        y = np.asarray(s.recv, dtype=float)
        if not x.any() or not y.any():
            continue
        x -= x.mean()
        y -= y.mean()
        n = len(x)
        size = 1 << (2 * n - 1).bit_length()
        g = np.conj(np.fft.rfft(x, size)) * np.fft.rfft(y, size)
        g /= np.maximum(np.abs(g), 1e-12)
        c = np.fft.irfft(g, size)[: min(hi, n // 2) + 1]  # lag l: y (receives) l bins after x (sends)
        corr[: len(c)] += c * n  # a stretch weighs as its length
        n_bins += n
    if not n_bins:
        return None
    corr /= n_bins
    lags = corr[1:]
    noise = 1.4826 * _median(np.abs(lags - _median(lags)))
    if noise <= 0:
        return None
    spread = max(1, round(SPREAD_S / bin_s))
    peaks: list[tuple[int, float]] = []
    for lag in np.argsort(-lags) + 1:  # highest first; a lower one within `spread` of a kept one is its flank
        v = float(corr[lag])
        if v < PEAK_NOISE * noise:
            break
        if all(abs(int(lag) - k) > spread for k, _ in peaks):
            peaks.append((int(lag), v))
    if not peaks:
        return None
    best = peaks[0][1]
    lag, v = min((p for p in peaks if p[1] >= FUNDAMENTAL * best), key=lambda p: p[0])
    # the echo's centre: its bins weighted by their correlation (it spreads over a bin or two)
    lo_, hi_ = max(1, lag - 1), min(hi, lag + 1)
    w = np.clip(corr[lo_:hi_ + 1], 0, None)
    centre = float((np.arange(lo_, hi_ + 1) * w).sum() / w.sum())
    return RoundTrip(seconds=centre * bin_s, correlation=round(v, 4), noise=round(noise, 5), bins=n_bins, bin_s=bin_s)
