"""The run archive: the contract between collection and analysis.

A run is a directory:
  meta.json        what was profiled, how, on what host; written at start with
                   status "collecting" and rewritten atomically at the end, so
                   an interrupted run is recognisable and still readable
  perf-<mode>.data raw perf samples, one file per unwinding mode used
  stacks.jsonl.gz  folded, symbolised stacks (archive.stacks)
  proc.jsonl       periodic per-thread CPU/scheduler readings from /proc
  probes.json      eBPF probe record (model.ProbeRecord): programs, their maps, socket/MIB/sysctl
                   readings, probe cost; probe-<group>.{bt,jsonl,log} the exact program and raw output;
                   probe-waits.series.jsonl the waits group's wall clock per 100 ms;
                   probe-packetio.timing.jsonl the targets' messages per 0.13 ms bin
  tcp.json         the targets' TCP sockets and their kernel byte counters (collectors.traffic)
Mappings are not applied here: reports apply them later, on any machine.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from qprof.archive import identity, schema
from qprof.archive.model import FunctionStarts
from qprof.archive.model import (TcpRecord, FORMAT, STATUS_COLLECTING, STATUS_INCOMPLETE, VERSION, Meta, ProbeRecord,
                                     ProcReading, SampleGroup)
from qprof.archive.stacks import NO_RAW, DamagedStacks, StackRecord, foldable_again, read_stacks, stacks_header
from qprof.errors import QprofError
from qprof.readlimits import lines, open_regular, read_text
from qprof.runfiles import META, PROBES, PROC, RESERVE, STACKS, TCP, chunk_files
from qprof.runfiles import FUNCTIONS
from qprof.jsonvalue import Json
from qprof.probes.mapsout import read_maps
from qprof.probes.packetio.timing import TimingFile, file_name as timing_file
from qprof.probes.waits.series import WaitSeries, file_name as wait_series_file

META_SHAPE = schema.shape_of(Meta)
RESERVE_BYTES = 1 << 20  # room kept for the last meta.json write when the disk fills up
# largest documents read back (qprof writes some KiB; an archive from elsewhere may be hostile)
MAX_META_BYTES, MAX_PROBES_BYTES = 64 << 20, 256 << 20


def _json_text(obj: Any) -> str:
    """A document as one line per top-level key, each value compact: json's C encoder writes only
    compact text (an indented dump runs its Python one, ~5x the CPU at every write of meta.json and
    probes.json), and a line per key still reads and greps by key."""
    if not isinstance(obj, dict) or not obj:
        return json.dumps(obj, sort_keys=True, separators=(",", ":"))
    return "{\n" + ",\n".join(json.dumps(k) + ":" + json.dumps(v, sort_keys=True, separators=(",", ":"))
                             for k, v in sorted(obj.items())) + "\n}"


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write JSON so a reader never sees half a file, even if we are killed mid-write."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(_json_text(obj))
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)


def write_meta(out: Path, meta: Meta) -> None:
    """meta.json from its record, atomically: the one way the archive's metadata is written."""
    write_json_atomic(out / META, schema.encode(meta))


def write_probes(out: Path, record: ProbeRecord) -> None:
    """probes.json from its record, atomically (collectors.probing, as the run goes and at its end)."""
    write_json_atomic(out / PROBES, schema.encode(record))


def proc_line(reading: ProcReading) -> str:
    """A reading as its line of proc.jsonl (what Run.proc_readings reads back), newline included."""
    return json.dumps(schema.encode(reading), separators=(",", ":")) + "\n"


def create_run_dir(path: Path) -> Path:
    """Make a fresh, owner-only run directory; refuse to reuse or follow anything."""
    if path.is_symlink():
        raise QprofError(f"output path {path} is a symbolic link; give a plain directory path")
    if path.exists():
        if not path.is_dir():
            raise QprofError(f"output path {path} exists and is not a directory; choose another -o")
        if any(path.iterdir()):
            raise QprofError(f"output directory {path} is not empty; choose another -o or remove it")
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(path, 0o700)
        probe = path / ".write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise QprofError(f"cannot write to output directory {path}: {e.strerror}") from None
    return path


def reserve_space(out: Path) -> None:
    """Hold RESERVE_BYTES in the run directory so that, if the disk fills up during the run,
    releasing them leaves room to mark the run incomplete."""
    try:
        with open(out / RESERVE, "wb") as f:
            f.write(b"\0" * RESERVE_BYTES)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        (out / RESERVE).unlink(missing_ok=True)
        raise QprofError(f"cannot write to output directory {out}: {e.strerror}") from None


def release_space(out: Path) -> None:
    (out / RESERVE).unlink(missing_ok=True)


def effective_status(meta: Meta) -> tuple[str, str | None]:
    """(status, reason) as a reader should see it: a run still marked "collecting" whose
    collector is gone (killed, or the machine rebooted) is incomplete."""
    if meta.status == STATUS_COLLECTING and not (meta.collector is not None and identity.identity_alive(meta.collector)):
        return STATUS_INCOMPLETE, "qprof stopped while collecting (killed?): what was written is kept"
    return meta.status, meta.incomplete_reason


def raw_chunks(path: Path, groups: list[SampleGroup]) -> list[str]:
    """The raw perf data files in a run, in time order (chunks not yet folded, or kept with --keep-raw)."""
    return [p.name for g in groups for p in chunk_files(path, g.perf_data, include_current=True)]


# a JSON record of the archive a report can do without (the probes', the TCP counters')
_ASIDE = ("; the file was changed after qprof wrote it: restore it, or move it aside (mv {p} {p}.bad) to "
          "report without what it holds")


@dataclass
class Run:
    """A run archive opened for reading: `meta` is its meta.json as the typed record."""

    path: Path
    meta: Meta
    _held: list[StackRecord] | None = field(default=None, repr=False, compare=False)

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> "Run":
        p = Path(path)
        meta_path = p / META
        if not p.is_dir():
            raise QprofError(f"{p} is not a run directory (made by `qprof attach -o DIR`)")
        try:
            doc = schema.loads(read_text(meta_path, MAX_META_BYTES))
        except FileNotFoundError:
            raise QprofError(f"{p} has no {META}: not a qprof run directory") from None
        except (OSError, ValueError, UnicodeDecodeError, RecursionError) as e:
            raise QprofError(f"{meta_path}: unreadable metadata ({e})") from None
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise QprofError(f"{meta_path}: not a qprof run archive")
        if doc.get("version") != VERSION:
            raise QprofError(f"{meta_path}: archive version {doc.get('version')!r} is not "
                             f"supported by this qprof (reads version {VERSION})")
        if not isinstance(doc.get("targets"), list):
            raise QprofError(f"{meta_path}: metadata has no target list")
        schema.validate(doc, META_SHAPE, str(meta_path))
        meta: Meta = schema.decode(Meta, doc)
        # its collector is gone: say so wherever the run is shown
        meta.status, meta.incomplete_reason = effective_status(meta)
        return cls(p, meta)

    def save_meta(self) -> None:
        """Write the (changed) metadata back: `--refold`, `qprof record` adding its entry."""
        write_meta(self.path, self.meta)

    @property
    def status(self) -> tuple[str, str | None]:
        """(status, reason why it is not complete)."""
        return self.meta.status, self.meta.incomplete_reason

    def raw_chunks(self) -> list[str]:
        return raw_chunks(self.path, self.meta.sampling.groups)

    def _damaged(self, e: DamagedStacks) -> QprofError:
        """A damaged stacks file, with what can re-create it: a fold of the raw data, when all of it is here."""
        if foldable_again(self.stacks_path, set(self.raw_chunks())):
            return QprofError(f"{e}; re-create it with `qprof report --refold {self.path}` on the host that "
                              "recorded the run (its raw perf data is here)")
        return QprofError(f"{e}; {NO_RAW}")

    def unfolded_chunks(self) -> list[str]:
        """Raw perf data chunks the stacks file does not hold (a run cut short)."""
        try:
            head = stacks_header(self.stacks_path)
        except DamagedStacks as e:
            raise self._damaged(e) from None
        if head is None and self.stacks_path.is_file():  # folded in one piece from all its raw data
            return []
        folded = set(head.folded if head is not None else ())
        return [name for name in self.raw_chunks() if name not in folded]

    @property
    def stacks_path(self) -> Path:
        return self.path / STACKS

    def has_stacks(self) -> bool:
        return self.stacks_path.is_file()

    def fold_refusal(self) -> str | None:
        """Why a reader here may not fold the run's raw perf data unasked (None: it may). Symbols,
        kernel ones too, resolve as they were only on the boot that recorded the run, and only its
        owner's perf data goes through `perf script` without being asked for."""
        collector = self.meta.collector
        recorded_boot = collector.boot_id if collector is not None else None
        if recorded_boot is None or recorded_boot != identity.boot_id():
            return "it was recorded on another host or before a reboot"
        owner = self.path.stat().st_uid
        if owner != os.geteuid():
            return f"it belongs to uid {owner}, not to you"
        return None

    def require_stacks(self) -> None:
        """Analysis reads the folded stacks: say how to make them when collection stopped before folding."""
        if not self.has_stacks():
            why = self.fold_refusal()
            if why is None and not self.unfolded_chunks():  # refolding here would find nothing
                raise QprofError(f"{self.path} has no folded stacks and no perf data to fold "
                                 f"(run {self.meta.status}): collection stopped before sampling "
                                 "wrote any, or the files were removed; record the run again")
            raise QprofError(f"{self.path} has no folded stacks (collection was cut short: "
                             f"{self.meta.status}" + (f"; not folded here: {why}" if why else "") +
                             f"); run `qprof report --refold {self.path}` on the host that recorded it")

    def hold_stacks(self, records: list[StackRecord]) -> None:
        """The records its stacks file holds, as the folder that just wrote it has them: read from here."""
        self._held = records

    def stacks(self) -> Iterator[StackRecord]:
        if self._held is not None:
            yield from self._held
            return
        try:
            yield from read_stacks(self.stacks_path)
        except DamagedStacks as e:
            raise self._damaged(e) from None

    def _record(self, name: str, what: str) -> dict[str, Json] | None:
        """One JSON document of the archive as an object; None when the run has none."""
        p = self.path / name
        try:
            data = schema.loads(read_text(p, MAX_PROBES_BYTES))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, UnicodeDecodeError, RecursionError) as e:
            raise QprofError(f"{p}: unreadable {what} ({e}){_ASIDE.format(p=p)}") from None
        if not isinstance(data, dict):
            raise QprofError(f"{p}: not a {what}{_ASIDE.format(p=p)}")
        return data

    def probes(self) -> ProbeRecord | None:
        """probes.json, with each program's maps re-read from its raw output if the run was cut short
        (written before its programs stopped), checked once as a whole."""
        p = self.path / PROBES
        data = self._record(PROBES, "probe record")
        if data is None:
            return None
        programs = data.get("programs")
        for prog in programs.values() if isinstance(programs, dict) else ():
            if isinstance(prog, dict) and "maps" not in prog:  # a program that had not stopped
                output = prog.get("output")
                if isinstance(output, str):
                    prog["maps"] = read_maps(self.path / Path(output).name)
        schema.validate(data, schema.PROBES, str(p))
        record: ProbeRecord = schema.decode(ProbeRecord, data)
        return record

    def wait_series(self) -> WaitSeries | None:
        """The waits group's wall clock per 100 ms (probe-waits.series.jsonl, probes.waits.series); None
        for a run without it (recorded before it existed, or without the waits group). Written line by
        line while the run goes on: a run cut short holds what was written until the cut."""
        return WaitSeries.read(self.path / wait_series_file())

    def message_timing(self) -> TimingFile | None:
        """The targets' messages sent and received per 0.13 ms bin (probe-packetio.timing.jsonl,
        probes.packetio.timing); None for a run without it. Written line by line: a run cut short
        holds what was written until the cut."""
        return TimingFile.read(self.path / timing_file())

    def tcp(self) -> TcpRecord | None:
        """tcp.json (collectors.traffic), or None for a run without it."""
        record: TcpRecord | None = self._typed(TCP, "TCP record", schema.TCP, TcpRecord)
        return record

    def function_starts(self) -> FunctionStarts | None:
        """functions.json (collectors.functions): where the sampled functions start in their objects; None
        for a run without it (recorded before it existed, or cut before its end). A file that is not one
        raises one line saying why."""
        starts: FunctionStarts | None = self._typed(FUNCTIONS, "function starts record", schema.FUNCTIONS,
                                                    FunctionStarts)
        return starts

    def _typed(self, name: str, what: str, shape: schema.Of, hint: Any) -> Any:
        """One JSON document of the archive written from a typed record, checked and decoded; None when absent."""
        data = self._record(name, what)
        if data is None:
            return None
        schema.validate(data, shape, str(self.path / name))
        return schema.decode(hint, data)

    def proc_readings(self) -> Iterator[ProcReading]:
        """Per-thread /proc readings in time order. The last line may be cut by a kill (skipped); any
        other line that is not a reading means the file was changed after it was written, and every
        figure from it could be off: one error naming the line."""
        p = self.path / PROC
        if not p.exists():
            return
        with open_regular(p) as f:
            held: tuple[int, str | bytes] | None = None
            for n, line in enumerate(lines(f, p), 1):
                if held is not None:
                    yield self._reading(p, *held)
                held = (n, line)
            if held is not None:
                try:
                    yield self._reading(p, *held)
                except QprofError:
                    last = held[1]
                    whole = last.endswith(b"\n") if isinstance(last, bytes) else last.endswith("\n")
                    if whole:  # written whole: not cut by a kill
                        raise

    @staticmethod
    def _reading(p: Path, n: int, line: str | bytes) -> ProcReading:
        try:
            obj = schema.loads(line)
            why = None if schema.conforms(obj, schema.PROC_READING) else "not shaped as qprof writes one"
        except (ValueError, RecursionError) as e:
            why = str(e)[:80]
        if why is not None:
            raise QprofError(f"{p}:{n}: not a /proc reading ({why}); the file was changed after qprof wrote it: "
                             f"restore it, or drop the line (sed -i {n}d {p}) to report without it")
        reading: ProcReading = schema.decode(ProcReading, obj)
        return reading
