"""Shared fixtures: real tools, real kernel. Kernel-facing tests need root and perf;
they skip only when the facility is truly absent, and say which."""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

from qprof.archive import Run
from qprof.archive.model import Meta
from qprof.collectors.procfs import CLK_TCK, cpu_ticks

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".cache" / "tests"
QPROF = [sys.executable, "-m", "qprof.cli"]
# QPROF_FUZZ_SCALE=20 multiplies every property test's example count, for a deeper hunt than CI's
FUZZ_SCALE = int(os.environ.get("QPROF_FUZZ_SCALE", "1"))


def examples(n: int) -> int:
    """A property test's example count under QPROF_FUZZ_SCALE."""
    return n * FUZZ_SCALE


def bytes_for_samples(nbytes_at_999_hz: int) -> int:
    """A transfer size chosen for its sample count at 999 Hz, scaled to the default frequency
    (whole MiB): a test's statistical tolerance rests on the samples, not on the bytes."""
    from qprof.collectors.perf import DEFAULT_FREQUENCY
    return round(nbytes_at_999_hz * 999 / DEFAULT_FREQUENCY) >> 20 << 20


def at_least(share: float, floor: float, samples: int) -> bool:
    """Whether a sampled share is consistent with a true share of at least `floor`: it may fall under it
    by 3 binomial standard deviations at the side's sample count (aioquic's ~1,100 samples: 1.2 pp at 2%;
    the 1 GiB transfers' ~4,000: 0.7 pp), never to zero."""
    return share > max(0.0, floor - 3 * _binomial_sd(floor, samples))


def at_most(share: float, limit: float, samples: int) -> bool:
    """Whether a sampled share is consistent with a true share of at most `limit`: it may pass it by 3
    binomial standard deviations at the side's sample count (~800 samples: 1.5 pp at 2%). The report
    flags the share itself past its limit; a test asks whether the samples show the limit broken."""
    return share <= limit + 3 * _binomial_sd(limit, samples)


def _binomial_sd(p: float, samples: int) -> float:
    return math.sqrt(p * (1 - p) / max(samples, 1))


def steal_s() -> float:
    """Seconds the host has taken from all of this VM's CPUs since boot (/proc/stat's steal column): what a
    thread's sched_clock-based clocks (task-clock, perf's cpu-clock samples) count and its CPU clock does not."""
    return sum(v[7] for v in cpu_ticks().values() if len(v) > 7) / CLK_TCK


def stolen_since(start: float, end: float | None = None) -> float:
    """What the host took from `start` to `end` (steal_s() readings; `end` now), at most: a tick per CPU is the
    counters' rounding."""
    return (steal_s() if end is None else end) - start + len(cpu_ticks()) / CLK_TCK


def past_the_clock(sampled_s: float, clock_s: float, stolen: float) -> float:
    """The share of a process's samples that may have landed anywhere: perf's cpu-clock samples count what the
    host took from the vCPU while a thread ran (steal), a thread's CPU clock does not, so the sampled seconds
    past the workload's own clock, up to the steal measured around the run, were taken where the vCPU resumed."""
    return min(max(0.0, sampled_s - clock_s), stolen) / sampled_s if sampled_s > 0 else 0.0


def own_samples(p: dict[str, Any], binary: Path) -> dict[tuple[str, str], int]:
    """A report's samples per (category, function) whose leaf is in `binary` itself (its JSON made with a
    large --top): the kernel's share (where a sample that waited for the host or for interrupts to be
    enabled lands) varies from run to run, the binary's work does not."""
    return {(c, s["symbol"]): s["samples"] for c, syms in p["top_symbols"].items() for s in syms
            if s["dso"] == str(binary)}


def share_of(own: dict[tuple[str, str], int], category: str) -> tuple[float, int]:
    """`category`'s share of own_samples' samples, and their count."""
    n = sum(own.values())
    return sum(v for (c, _), v in own.items() if c == category) / n, n


def share_difference_sd(share: float, n: int, share0: float, n0: int) -> float:
    """The standard deviation of the difference of two binomial shares of the same p, from the two samples
    pooled (the two-proportion test's): from one share alone a run at 100% (895 of 895 samples Crypto, CI
    2026-11-30) gave 0, and 893 of 899 in the other run read as 0.7 pp beyond it."""
    pooled = (share * n + share0 * n0) / (n + n0)
    return math.sqrt(pooled * (1 - pooled) * (1 / n + 1 / n0))


def shell_mode() -> int:
    """The mode a new file of the user's shell gets (0666 less the umask): what qprof's outputs take."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def qprof(*args: str, check: bool = True, env: dict[str, str] | None = None,
          timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """Run the real `qprof` command line."""
    r = subprocess.run([*QPROF, *args], capture_output=True, text=True, env=env, timeout=timeout)
    if check and r.returncode != 0:
        raise AssertionError(f"qprof {' '.join(args)} failed ({r.returncode}):\n{r.stderr}")
    return r


@contextlib.contextmanager
def edited_meta(run: Path) -> Iterator[Meta]:
    """A run's metadata to change, written back through the archive's model when the block ends: how
    tests make an archive into one that was cut short, recorded elsewhere or by an older qprof."""
    opened = Run.open(run)
    yield opened.meta
    opened.save_meta()


def as_nobody(args: list[str], home: Path) -> subprocess.CompletedProcess[str]:
    """`qprof ARGS` as uid 65534 without capabilities (qprof.unprivileged), HOME=`home`; skips
    where root cannot be dropped."""
    from qprof import unprivileged

    try:
        return unprivileged.run(args, home)
    except unprivileged.Unavailable as e:
        pytest.skip(str(e))


@pytest.fixture
def user_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty XDG_CONFIG_HOME of the test's own (inherited by the qprof it runs), so that no
    developer's per-user mapping files take part."""
    cfg = tmp_path / "xdg"
    cfg.mkdir()
    monkeypatch.setenv("XDG_CONFIG_HOME", str(cfg))
    return cfg


@pytest.fixture(scope="session")
def kernel_facing() -> None:
    """Root and perf: what sampling other processes' kernel stacks needs."""
    if os.geteuid() != 0:
        pytest.skip("kernel-facing test needs root (perf sampling of other processes)")
    if shutil.which("perf") is None:
        pytest.skip("perf is not installed (make test installs linux-perf)")


@pytest.fixture(scope="session")
def probes_available(kernel_facing: None) -> None:
    """What running qprof's bpftrace probes needs beside root and perf."""
    for tool in ("bpftrace", "bpftool", "unshare"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} missing (make test installs bpftrace, bpftool, util-linux)")


@pytest.fixture(scope="session")
def ngtcp2_tools(kernel_facing: None) -> None:
    for tool, pkg in (("gtlsserver", "ngtcp2-server"), ("gtlsclient", "ngtcp2-client")):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} missing (make test installs {pkg})")


def build_c(source: Path, name: str, libs: list[str]) -> Path:
    """Compile a test workload once; rebuilt only when its source changes."""
    CACHE.mkdir(parents=True, exist_ok=True)
    out = CACHE / name
    if not out.exists() or out.stat().st_mtime < source.stat().st_mtime:
        cc = shutil.which("cc") or shutil.which("gcc")
        if cc is None:
            pytest.skip("no C compiler (make test installs gcc)")
        subprocess.run([cc, "-O2", "-g", "-fno-omit-frame-pointer", "-Wall", "-Wextra", "-Werror",
                        "-o", str(out), str(source), *libs], check=True)
    return out


def build_go(source: Path, name: str) -> Path:
    """Build a Go test workload (a directory) once; rebuilt only when a file of it changes."""
    go = shutil.which("go") or ("/usr/local/go/bin/go" if os.path.exists("/usr/local/go/bin/go") else None)
    if go is None:
        pytest.skip("no Go toolchain (make test installs golang-go)")
    CACHE.mkdir(parents=True, exist_ok=True)
    out = CACHE / name
    if not out.exists() or out.stat().st_mtime < max(f.stat().st_mtime for f in source.iterdir()):
        subprocess.run([go, "build", "-o", str(out), "."], cwd=source, check=True,
                       env={**os.environ, "CGO_ENABLED": "0", "GOFLAGS": "-mod=mod"})
    return out


@pytest.fixture(scope="session")
def endpoint_build():
    """Build a lab/endpoints stack by name, once per session (cached across runs); skip without its toolchain."""
    from lab.endpoints.build import BuildUnavailable, build

    done: dict = {}

    def get(name: str):  # -> lab.endpoints.build.Built
        if name not in done:
            try:
                done[name] = build(name)
            except BuildUnavailable as e:
                done[name] = e
        if isinstance(done[name], BuildUnavailable):
            pytest.skip(f"{name} endpoint: {done[name]}")
        return done[name]

    return get


def attach_held(cmd: list[str], run: Path, **options: Any) -> Any:
    """Start `cmd` held right after exec, attach qprof (AttachOptions `**options`), release it once
    sampling runs, stop when it exits; returns the finished process (exit status checked)."""
    from qprof.collectors.session import AttachOptions, AttachSession
    from qprof.endpoints import StoppedProcess

    proc = StoppedProcess(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        AttachSession(AttachOptions(pids=[proc.pid], out=run, **options),
                      on_ready=proc.release, stop_when=lambda: proc.poll() is not None).run()
    finally:
        proc.release()
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    assert proc.returncode == 0, proc.stderr.read() if proc.stderr else ""
    return proc


# Real ngtcp2 transfers for the flame graph and diff tests: name -> gtlsserver options.
NGTCP2_CAPTURES = {"gso": (), "no-gso": ("--max-gso-dgrams=1",)}
# ... with server and client on one CPU. Left to the scheduler, each arm of the diff is bimodal
# (the server's Packet I/O at ~25% or ~48% with GSO, ~43% or ~60% without: where the loopback
# receive path runs) and 5 of 13 paired runs failed the diff test; on one CPU, 14 of 14 passed
# (+14 to +22 pp, 3.1-4.3x the CPU s/GB).
NGTCP2_CAPTURE_CPUS = (0,)


def capture_ngtcp2(run: Path, size: int = 128 << 20, server_args: tuple[str, ...] = (), cpus: tuple[int, ...] = (),
                   **options: Any) -> Path:
    """Attach qprof (AttachOptions `**options`) to a real ngtcp2 server (started with `server_args`) and
    client, both with roles and bound to `cpus` (empty: any), from the client's first packet until it has
    downloaded `size` bytes."""
    from qprof.collectors.session import AttachOptions, AttachSession
    from lab.transfers import Ngtcp2Transfer
    from qprof.endpoints import Placement

    class Transfer(Ngtcp2Transfer):
        def server_command(self, key: Path, cert: Path) -> list[str]:
            cmd = super().server_command(key, cert)
            return [cmd[0], *server_args, *cmd[1:]]

    placement = {role: Placement(cpus=cpus) for role in ("server", "client")} if cpus else {}
    with Transfer(size, placement=placement) as xfer:
        server = xfer.start_server()
        client = xfer.start_client_stopped()
        AttachSession(AttachOptions(pids=[server, client], out=run, roles={server: "server", client: "client"},
                                    **options),
                      on_ready=xfer.release_client, stop_when=xfer.client_done).run()
        assert xfer.client is not None and xfer.client.wait(60) == 0, xfer.tail("client.err")
    return run


@pytest.fixture(scope="session")
def ngtcp2_capture(ngtcp2_tools: None, probes_available: None, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Run archives of real 512 MiB ngtcp2 transfers, each made once per session on first use: "gso" as the
    server runs by default (GSO: many datagrams per send), "no-gso" with --max-gso-dgrams=1 (one per send)."""
    made: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in made:
            made[name] = capture_ngtcp2(tmp_path_factory.mktemp(f"ngtcp2-{name}") / "run", 512 << 20,
                                        NGTCP2_CAPTURES[name], NGTCP2_CAPTURE_CPUS)
        return made[name]

    return get


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_terminal_summary(terminalreporter: Any) -> Any:
    """One line at the end of every run, after pytest's own summary: what was skipped and why."""
    result = yield
    reasons: dict[str, int] = {}
    for rep in terminalreporter.stats.get("skipped", []):
        longrepr = rep.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
        reason = reason.removeprefix("Skipped: ")
        reasons[reason] = reasons.get(reason, 0) + 1
    total = sum(reasons.values())
    terminalreporter.write_line(
        f"qprof: skipped {total} test(s)" + (": " + "; ".join(f"{n} x {r}" for r, n in sorted(
            reasons.items(), key=lambda kv: -kv[1])) if total else ": none"))
    return result
