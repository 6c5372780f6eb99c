"""qprof's native folder (collectors/perffold, Rust): perf data to folded stacks in one process.

Why: `perf script` spends most of a fold formatting text that qprof then parses again; the folder reads
perf.data itself, unwinds DWARF copies with a caching unwinder (framehop) and names frames where perf
would, several times faster (bench/native_fold.py measures speed and agreement). It writes the stacks file's
records (archive.stacks) with each frame named once and then given by number: its output is
read by read_output alone.

It is built from the source shipped beside this module with the machine's cargo, once per source and
toolchain (`make setup` does it: `python -m qprof.collectors.nativefold`), cached under
~/.cache/qprof/perffold. Folding never builds it: where it is not built (no cargo, or a source edited
since) qprof folds with `perf script`. QPROF_FOLD=perf-script chooses `perf script` (comparisons);
QPROF_FOLD=native makes a missing folder an error; QPROF_FOLDER names another build of the folder.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
from functools import lru_cache
from itertools import chain
from pathlib import Path
from typing import IO, Iterable, cast

from qprof.archive.stacks import Frame, StackRecord
from qprof.cachefiles import CACHE_HOME
from qprof.collectors.perfscript import ParseStats, StackNeed
from qprof.errors import QprofError
from qprof.probes.children import cpu_seconds, die_with_parent, own_group
from qprof.probes.features import version_output

SOURCE = Path(__file__).resolve().parent / "perffold"
CACHE = CACHE_HOME / "perffold"
NAME = "qprof-perffold"
STATS_KEY = "qprof_perffold"
FAILED_KEY = "qprof_perffold_failed"  # --serve: a file it could not read at all
Window = tuple[int | None, int | None]


class FolderUnavailable(QprofError):
    """The native folder cannot be built or run here; the message says what is missing."""


def cargo() -> str | None:
    """The machine's cargo: on PATH, else rustup's (~/.cargo/bin, not on root's PATH by default)."""
    found = shutil.which("cargo")
    if found is None:
        home = Path(os.environ.get("CARGO_HOME", Path.home() / ".cargo"))
        if os.access(home / "bin" / "cargo", os.X_OK):
            found = str(home / "bin" / "cargo")
    return found


def _env(cargo_path: str) -> dict[str, str]:
    """cargo's own directory first on PATH: its rustc, not another toolchain's."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(cargo_path).parent}:{env.get('PATH', '/usr/bin:/bin')}"
    env["CARGO_TARGET_DIR"] = str(CACHE / "target")
    return env


def _sources() -> list[Path]:
    return [SOURCE / "Cargo.toml", SOURCE / "Cargo.lock", *sorted((SOURCE / "src").glob("*.rs"))]


@lru_cache(maxsize=1)
def source_key() -> str:
    """The source's identity: what the folder does (read once a process: every fold asks)."""
    h = hashlib.sha256()
    for p in _sources():
        h.update(p.name.encode() + b"\0" + p.read_bytes())
    return h.hexdigest()[:16]


def toolchain_key(cargo_path: str) -> str:
    """The toolchain's identity: a new one builds the source again."""
    rustc = shutil.which("rustc", path=_env(cargo_path)["PATH"]) or "rustc"
    return hashlib.sha256(version_output(cargo_path).encode() + version_output(rustc).encode()).hexdigest()[:8]


def built() -> Path | None:
    """The folder built from this source, by any toolchain: found without running one (an attach would
    pay rustup's proxies, ~25 ms of CPU, to ask versions)."""
    if not SOURCE.is_dir():
        return None
    found = sorted(CACHE.glob(f"{NAME}-{source_key()}-*"), key=lambda p: p.stat().st_mtime)
    return next((p for p in reversed(found) if os.access(p, os.X_OK) and not p.name.endswith(".part")), None)


def build(jobs: int | None = None) -> Path:
    """Build the folder (once per source and toolchain: ~15 s on 2 CPUs, plus the crates' download the
    first time); the cached binary."""
    c = cargo()
    if c is None:
        raise FolderUnavailable("cargo not found: install Rust 1.88 or later (Debian 12: apt-get install "
                                "rustc-web cargo-web) to build qprof's native folder")
    path = CACHE / f"{NAME}-{source_key()}-{toolchain_key(c)}"
    if os.access(path, os.X_OK):
        return path
    CACHE.mkdir(mode=0o700, parents=True, exist_ok=True)
    cmd = [c, "build", "--release", "--locked", "--quiet", "-j", str(jobs or os.cpu_count() or 1),
           "--manifest-path", str(SOURCE / "Cargo.toml")]
    r = subprocess.run(cmd, env=_env(c), capture_output=True, text=True)
    if r.returncode != 0:
        first = next((ln for ln in r.stderr.splitlines() if ln.startswith("error")), r.stderr.strip()[-300:])
        raise FolderUnavailable(f"building qprof's native folder failed ({c}): {first}")
    part = path.with_name(path.name + ".part")
    shutil.copyfile(CACHE / "target" / "release" / NAME, part)
    part.chmod(0o755)
    os.replace(part, path)
    return path


def chosen() -> Path | None:
    """The folder to fold with, or None for `perf script` (QPROF_FOLD, else the native one if built;
    QPROF_FOLDER names another build of it, or a program that runs it)."""
    want = os.environ.get("QPROF_FOLD", "")
    if want not in ("", "native", "perf-script"):
        raise QprofError(f"QPROF_FOLD={want!r}: use native or perf-script")
    if want == "perf-script":
        return None
    other = os.environ.get("QPROF_FOLDER")
    if other:
        if not os.access(other, os.X_OK):
            raise FolderUnavailable(f"QPROF_FOLDER={other} is not an executable file: unset it, or name the "
                                    f"{NAME} program")
        return Path(other)
    found = built()
    if want == "native" and found is None:
        raise FolderUnavailable("QPROF_FOLD=native but qprof's native folder is not built for this source: "
                                "run `make setup` (or python -m qprof.collectors.nativefold)")
    return found


def command(folder: Path, files: list[Path], pids: list[int], buildid_dir: Path, window: Window = (None, None),
            kallsyms: Path | None = None, context: Path | None = None) -> list[str]:
    """`kallsyms`: the attach's snapshot (probes.kallsyms) instead of /proc/kallsyms. `context`: the
    recorder's file before `files[0]`, whose mappings name the samples of a process that exited while
    perf wrote the switch's (README's `--context`)."""
    cmd = [str(folder), "--pids", ",".join(map(str, pids)), "--buildid-dir", str(buildid_dir)]
    if kallsyms is not None:
        cmd += ["--kallsyms", str(kallsyms)]
    if context is not None:
        cmd += ["--context", str(context)]
    if window != (None, None):
        cmd += ["--time", ",".join("" if t is None else str(t) for t in window)]
    return cmd + [str(f) for f in files]


class Running:
    """A folder process over consecutive perf data files of one recorder (a run's chunks, in order)."""

    def __init__(self, folder: Path, files: list[Path], pids: list[int], buildid_dir: Path, log: Path,
                 window: Window = (None, None), nice: int = 0, kallsyms: Path | None = None,
                 context: Path | None = None) -> None:
        self.files, self.log = files, log
        with open(log, "ab") as logf:  # its diagnostics, as perf script's
            self.proc = subprocess.Popen(command(folder, files, pids, buildid_dir, window, kallsyms, context),
                                         stdin=subprocess.DEVNULL,
                                         stdout=subprocess.PIPE, stderr=logf,
                                         preexec_fn=die_with_parent(signal.SIGKILL, nice))

    def collect(self) -> tuple[list[StackRecord], ParseStats]:
        """Its records and what it met, once it ends."""
        proc, files = self.proc, self.files
        assert proc.stdout is not None
        recs: list[StackRecord] = []
        stats = ParseStats(folder=NAME)
        try:
            end = read_output(proc.stdout, files[0].name, recs, stats)
        except BaseException:  # a bad line, or an interrupt (a second Ctrl-C): it is not waited for
            proc.kill()
            raise
        finally:
            proc.stdout.close()
            _, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = rc = os.waitstatus_to_exitcode(status)
        stats.script_cpu_s = usage.ru_utime + usage.ru_stime
        if rc != 0 or end != "":
            raise QprofError(f"{NAME} failed on {', '.join(f.name for f in files)} (exit {rc}): {_last_line(self.log)}")
        return recs, stats

    def kill(self) -> None:
        """Gone, whatever happened (a no-op once collected)."""
        if self.proc.returncode is None:
            self.proc.kill()
            if self.proc.stdout is not None:
                self.proc.stdout.close()
            self.proc.wait()


def _last_line(log: Path) -> str:
    """The folder's last word in its log (its diagnostics go to the recorder's log, as perf script's)."""
    try:
        lines = log.read_text(errors="replace").strip().splitlines()
    except OSError:
        lines = []
    return lines[-1] if lines else "no output"


FrameTable = dict[int, Frame]  # the folder's frame ids -> (symbol, object), as its "f" lines named them


def read_output(lines: Iterable[bytes], name: str, recs: list[StackRecord], stats: ParseStats,
                frames: FrameTable | None = None) -> str | None:
    """The folder's lines up to its statistics line (`name`: the file they fold, for errors): records into
    `recs`, statistics into `stats`, frame names into `frames` (a served folder names each frame once in
    its life: the table is the Server's). "" once the statistics are read; a served file's reason when it
    could not be read; None when the lines end before either (the folder is gone)."""
    table: FrameTable = {} if frames is None else frames
    for lineno, line in enumerate(lines, 1):
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise QprofError(f"{NAME} wrote an unreadable line {lineno} on {name}: {e}") from None
        if type(obj) is list:
            if obj and obj[0] == "f":
                _name_frame(obj, table, name, lineno)
            else:
                recs.append(_record(obj, table, name, lineno))
            continue
        if isinstance(obj, dict) and STATS_KEY in obj:
            s = obj[STATS_KEY]
            stats.samples, stats.bad_lines = int(s["samples"]), int(s["errors"])
            stats.bad_examples = [str(e)[:200] for e in s.get("error_examples", [])][:5]
            stats.stack_need = {int(pid): StackNeed.parse(n) for pid, n in s.get("stack_need", {}).items()}
            return ""
        if isinstance(obj, dict) and FAILED_KEY in obj:
            return str(obj[FAILED_KEY])
        raise QprofError(f"{NAME} wrote line {lineno} on {name} in no form qprof reads (a folder built from "
                         "another source? run `make setup`)")
    return None


def _name_frame(obj: list[object], table: FrameTable, name: str, lineno: int) -> None:
    if len(obj) != 4 or type(obj[1]) is not int or type(obj[2]) is not str or type(obj[3]) is not str:
        raise QprofError(f"{NAME} wrote a frame name that is not [\"f\", id, symbol, object] on {name}, line {lineno}")
    table[obj[1]] = (obj[2], obj[3])


def _record(obj: list[object], table: FrameTable, name: str, lineno: int) -> StackRecord:
    """A record line: [pid, tid, comm, samples, period, [frame ids], [bin, period, ...], first ns, last ns]. Its
    frames are the table's own tuples (shared by every stack that has them); its numbers checked by C-level maps."""
    try:
        pid, tid, comm, samples, period, ids, flat, first, last = obj
        assert type(comm) is str and type(ids) is list and type(flat) is list and len(flat) % 2 == 0
        numbers = cast("list[int]", [pid, tid, samples, period, first, last])
        assert set(map(type, chain(numbers, flat))) <= {int}
        frames = tuple(map(table.__getitem__, ids))  # an id no line named: KeyError
    except (AssertionError, KeyError, TypeError, ValueError):
        raise QprofError(f"{NAME} wrote line {lineno} on {name}, which is not a stack record of named frames") from None
    periods = cast("list[int]", flat[1::2])
    pid, tid, samples, period, first, last = numbers
    if min(samples, period, *periods) < 0 or first > last:
        raise QprofError(f"{NAME} wrote line {lineno} on {name} with a negative count or a first sample after its last")
    return StackRecord(pid, tid, comm, samples, period, frames, tuple(zip(cast("list[int]", flat[::2]), periods)),
                       (first, last))


class FolderGone(QprofError):
    """A serving folder exited (or stopped answering); the file it was given is not folded."""


class Server:
    """One folder process kept for a recorder's chunks (`--serve`), each folded as it is given: kallsyms,
    the objects' tables and the processes' mappings are read once for all of them, where a process per
    chunk read them again each time (~50 ms of CPU a chunk here, more than folding a 64 MiB chunk's
    samples), and a process that exited as perf switched files keeps its names without a context file."""

    def __init__(self, folder: Path, pids: list[int], buildid_dir: Path, log: Path, nice: int = 0,
                 kallsyms: Path | None = None, context: Path | None = None) -> None:
        self.pids, self.log, self.nice = list(pids), log, nice
        self._reported = 0.0  # CPU seconds given out with the files' statistics
        self._frames: FrameTable = {}  # every frame it named so far: it names each once in its life
        with open(log, "ab") as logf:
            self.proc = subprocess.Popen([*command(folder, [], pids, buildid_dir, kallsyms=kallsyms, context=context),
                                          "--serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=logf,
                                         preexec_fn=own_group(nice))  # ends when its stdin closes

    def fold(self, path: Path) -> tuple[list[StackRecord], ParseStats]:
        """One file's records and what the folder met in it, with the CPU it used since the last file;
        QprofError when it cannot read the file, FolderGone when the folder is gone."""
        proc = self.proc
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(os.fsencode(path) + b"\n")
            proc.stdin.flush()
        except OSError:
            raise FolderGone(f"{NAME} (serving) is gone: {_last_line(self.log)}") from None
        recs: list[StackRecord] = []
        stats = ParseStats(folder=NAME)
        stdout: IO[bytes] = proc.stdout
        end = read_output(iter(stdout.readline, b""), path.name, recs, stats, self._frames)
        if end is None:
            raise FolderGone(f"{NAME} (serving) is gone: {_last_line(self.log)}")
        cpu = cpu_seconds(proc.pid)
        if cpu is not None:
            stats.script_cpu_s, self._reported = max(0.0, cpu - self._reported), max(cpu, self._reported)
        if end:
            raise QprofError(f"{NAME} failed on {path.name}: {end}")
        return recs, stats

    def renice(self, nice: int) -> None:
        """Its priority from now on (the last pass folds at the targets' own); left as it is where the
        system refuses."""
        if nice != self.nice:
            try:
                os.setpriority(os.PRIO_PROCESS, self.proc.pid, nice)
                self.nice = nice
            except OSError:
                pass

    def close(self) -> float:
        """End it; the CPU seconds it used that no file's statistics gave (its exit, the ticks' rounding)."""
        proc = self.proc
        if proc.returncode is not None:
            return 0.0
        try:
            if proc.stdin is not None:
                proc.stdin.close()
        except OSError:
            pass
        if proc.stdout is not None:
            proc.stdout.close()
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        return max(0.0, usage.ru_utime + usage.ru_stime - self._reported)

    def kill(self) -> None:
        """Gone, whatever happened (a no-op once closed)."""
        if self.proc.returncode is None:
            self.proc.kill()
            self.close()


def main() -> int:
    """`make setup`: build the folder now, so that no attach falls back to perf script."""
    try:
        path = build()
    except FolderUnavailable as e:
        print(f"qprof: {e}", file=sys.stderr)
        return 1
    print(f"qprof: native folder {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
