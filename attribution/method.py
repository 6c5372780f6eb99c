"""How runs were measured, where two or more that are compared or pooled differ, and what each
difference moves: the figures a reader must not read as the system's change (`qprof diff`, the
summaries of `qprof table` and `qprof study`)."""

from __future__ import annotations

from dataclasses import dataclass

from qprof.jsonvalue import JsonObject

# what each way of measuring differently moves
EFFECTS = {
    "unwinding": "callers differ, so the categories a caller decides (`within` rules) and Uncategorized "
                 "move; compare leaf symbols' self time, or record the runs with the same --unwind",
    "mapping files": "the categories of the symbols those files place move; compare symbols, or give the "
                     "runs the same --mapping files",
    "sampling rate": "sample counts and every share's noise differ; shares and CPU seconds still compare",
    "sampling event": "samples count different things: shares and CPU seconds do not compare",
    "sampling scope": "in system scope work that starts when a target wakes is placed differently than in "
                      "cgroup scope, so shares and CPU seconds move",
    "probes": "the probes' own CPU is in some runs' samples and not in others', and what only probes "
              "measure (the wall clock split, bytes and CPU per GB, the round trip) exists only where they ran",
}


@dataclass(frozen=True)
class MethodDifference:
    """One respect in which runs compared or pooled together were measured differently."""

    what: str  # a key of EFFECTS
    where: tuple[str | None, ...]  # what it concerns: () the whole runs; a diff's pair; a summary's side
    values: tuple[str, ...]  # the runs' values (a diff's: A's, B's)
    affects: str

    @classmethod
    def of(cls, what: str, where: tuple[str | None, ...], values: tuple[str, ...]) -> "MethodDifference":
        return cls(what, where, values, EFFECTS[what])

    def to_json(self) -> JsonObject:
        return {"what": self.what, "where": list(self.where), "values": list(self.values), "affects": self.affects}
