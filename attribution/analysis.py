"""Everything a report shows, computed once from a run archive: the shared entry for viewers and the API."""

from __future__ import annotations

from dataclasses import dataclass

from qprof.attribution.crypto import Crypto, analyse as analyse_crypto
from qprof.attribution.mapping import MappingSet
from qprof.attribution.packetio import PacketIO, analyse
from qprof.attribution.profile import Profile, attribute
from qprof.attribution.recommend import Recommendation, recommend
from qprof.collectors.archive import Run


@dataclass
class Analysis:
    profile: Profile
    packet_io: PacketIO | None
    recommendations: list[Recommendation]
    crypto: Crypto | None = None  # the opt-in crypto probes (attribution.crypto)


def analyse_run(run: Run, mappings: MappingSet, stack: str | None = None) -> Analysis:
    """`stack` forces one stack mapping file instead of auto-detection (`--stack`)."""
    profile = attribute(run, mappings, stack)
    targets = run.meta.get("targets", [])
    pio = analyse(run.probes() or {}, [int(t["pid"]) for t in targets])
    comms = {int(t["pid"]): str(t.get("comm", "?")) for t in targets}
    recs = recommend(pio, comms) if pio is not None else []
    crypto = analyse_crypto(run.probes() or {}, [int(t["pid"]) for t in targets], pio)
    return Analysis(profile, pio, recs, crypto)
