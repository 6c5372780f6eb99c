"""Function names for stripped objects (collectors.debuginfo), against the real thing: a library the test
builds, splits (`objcopy --only-keep-debug`) and strips as a distribution does, profiled under `qprof record`
while a real debuginfod server (elfutils) serves its debug file on a loopback port; then with the server
stopped (the unwind table's names), with the debug file installed by build-id as a -dbgsym package
does, and with one whose build-id does not match. Bad servers (404, garbage, too slow) are real HTTP
servers on loopback too."""

from __future__ import annotations

import http.server
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from conftest import ROOT, qprof
from qprof.collectors import debuginfo
from qprof.collectors.debuginfo import Debuginfod, check_debug_file, eh_frame_starts, symbols_for
from qprof.probes.elf import ElfObject

HERE = ROOT / "tests" / "workloads" / "stripped"
INTERNAL = ("mix_rounds", "table_walk")  # the library's static functions: in its debug file only


def _internal(frames: dict[str, float]) -> set[str]:
    """The internal functions among a run's frames (gcc may name a specialised copy `mix_rounds.constprop.0`)."""
    return {f for f in INTERNAL for s in frames if s == f or s.startswith(f + ".")}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _build(out: Path) -> tuple[Path, Path, str]:
    """libqwork.so (stripped), its debug file and the program using it, with a build-id of its own."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None or shutil.which("objcopy") is None:
        pytest.skip("gcc and binutils are needed (make test installs gcc; binutils comes with it)")
    build_id = secrets.token_hex(20)
    lib = out / "libqwork.so"
    subprocess.run([cc, "-O2", "-g", "-fPIC", "-shared", f"-Wl,--build-id=0x{build_id}", "-o", str(lib),
                    str(HERE / "libqwork.c")], check=True)
    subprocess.run(["objcopy", "--only-keep-debug", str(lib), str(out / "libqwork.debug")], check=True)
    subprocess.run(["strip", "--strip-all", str(lib)], check=True)
    subprocess.run([cc, "-O2", "-o", str(out / "qwork"), str(HERE / "qwork.c"), f"-L{out}", "-lqwork",
                    "-Wl,-rpath,$ORIGIN"], check=True)
    return lib, out / "libqwork.debug", build_id


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    return _build(tmp_path_factory.mktemp("qwork"))


def test_the_stripped_library_has_only_its_exports_and_an_unwind_table(built: tuple[Path, Path, str]) -> None:
    lib, debug, build_id = built
    with ElfObject.open(str(lib)) as obj:
        assert obj.section(".symtab") is None
        starts = eh_frame_starts(obj)
        text = obj.section(".text")
        in_text = [s for s in starts if text["sh_addr"] <= s < text["sh_addr"] + text["sh_size"]]
        assert starts == sorted(starts) and len(in_text) >= 3, (starts, text["sh_addr"], text["sh_size"])
    assert check_debug_file(debug, build_id) is None
    other = secrets.token_hex(20)
    assert check_debug_file(debug, other) == f"its build-id is {build_id}, not {other}"
    assert check_debug_file(lib, build_id) == "it has no symbol table"


def _report(run: Path) -> dict[str, Any]:
    return json.loads(qprof("report", str(run), "--format", "json", "--top", "30").stdout)


def _lib_frames(rep: dict[str, Any]) -> dict[str, float]:
    """The library's leaf symbols and their shares."""
    (p,) = rep["processes"]
    return {s["symbol"]: s["share"] for c in rep["categories"] for s in p["top_symbols"][c]
            if s["dso"].endswith("libqwork.so")}


def _naming(rep: dict[str, Any]) -> dict[str, Any]:
    (p,) = rep["processes"]
    return next(o for o in p["symbols"] if o["object"].endswith("libqwork.so"))


def _record(built: tuple[Path, Path, str], run: Path, env: dict[str, str]) -> dict[str, Any]:
    lib = built[0]
    r = subprocess.run([sys.executable, "-m", "qprof.cli", "record", "-q", "-o", str(run), "--probes", "none",
                        "--", str(lib.parent / "qwork"), "1.5"], env=env, cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    return _report(run)


@pytest.fixture
def debuginfod_server(built: tuple[Path, Path, str], tmp_path: Path) -> Iterator[str]:
    """elfutils' debuginfod serving the library's debug file from a directory, on a loopback port."""
    exe = shutil.which("debuginfod")
    if exe is None:
        pytest.skip("debuginfod is not installed (make test installs Debian's debuginfod)")
    served = tmp_path / "served"
    served.mkdir()
    shutil.copy(built[1], served / "libqwork.debug")
    port = _free_port()
    proc = subprocess.Popen([exe, "-F", str(served), "-p", str(port), "-d", str(tmp_path / "db.sqlite"), "-t", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:  # it scans the directory in the background: wait until it serves the file
            try:
                import urllib.request
                with urllib.request.urlopen(f"{url}/buildid/{built[2]}/debuginfo", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "debuginfod did not serve the file"
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.root
@pytest.mark.slow
def test_names_from_debuginfod_then_the_unwind_table(kernel_facing: None, built: tuple[Path, Path, str],
                                                     debuginfod_server: str, tmp_path: Path) -> None:
    env = {**os.environ, "DEBUGINFOD_URLS": debuginfod_server, "QPROF_SYMBOL_CACHE": str(tmp_path / "cache")}
    rep = _record(built, tmp_path / "served-run", env)
    frames, how = _lib_frames(rep), _naming(rep)
    print(f"\nwith debuginfod: {how['how']} ({how['note']}): {frames}")
    assert how["how"] == "debuginfod" and how["note"].startswith(f"fetched from {debuginfod_server}")
    assert _internal(frames) == set(INTERNAL) and how["unnamed_share"] == 0
    # the same cache again: no fetch (the server is not even asked)
    rep = _record(built, tmp_path / "cached-run", {**env, "DEBUGINFOD_URLS": "http://127.0.0.1:9"})
    assert _naming(rep)["how"] == "debuginfod" and _naming(rep)["note"] == "cached"

    # no server, a cold cache: the run still reports, its functions named by object and start
    env = {**os.environ, "DEBUGINFOD_URLS": f"http://127.0.0.1:{_free_port()}", "DEBUGINFOD_TIMEOUT": "2",
           "QPROF_SYMBOL_CACHE": str(tmp_path / "cold")}
    rep = _record(built, tmp_path / "no-server-run", env)
    frames, how = _lib_frames(rep), _naming(rep)
    print(f"server down: {how['how']} ({how['note']}): {frames}")
    assert how["how"] == "unwind table" and "debuginfod:" in how["note"]
    by_start = {s: v for s, v in frames.items() if s.startswith("libqwork.so+0x")}
    assert len(by_start) >= 2 and sum(v >= 0.1 for v in by_start.values()) >= 2, frames
    assert how["unnamed_share"] >= 0.5  # named by object and start only
    # pprof keeps each function's start and the build-id, for a backend to name them later
    from qprof.viewer.pprof import profile_class
    import gzip

    qprof("report", str(tmp_path / "no-server-run"), "--format", "pprof", "-o", str(tmp_path / "p.pb.gz"))
    prof = profile_class()()
    prof.ParseFromString(gzip.decompress((tmp_path / "p.pb.gz").read_bytes()))
    strings = list(prof.string_table)
    lib_map = next(m for m in prof.mapping if strings[m.filename].endswith("libqwork.so"))
    assert strings[lib_map.build_id] == built[2]
    addrs = {strings[f.system_name]: loc.address for loc in prof.location for f in prof.function
             if f.id == loc.line[0].function_id and loc.mapping_id == lib_map.id}
    assert all(addrs[s] == int(s.rsplit("+", 1)[1], 16) for s in by_start), addrs


@pytest.mark.root
@pytest.mark.slow
def test_a_debug_file_installed_by_build_id(kernel_facing: None, built: tuple[Path, Path, str], tmp_path: Path) -> None:
    """As a -dbgsym package installs it; and one whose build-id does not match is refused in one line."""
    lib, debug, build_id = built
    dest = Path("/usr/lib/debug/.build-id") / build_id[:2] / f"{build_id[2:]}.debug"
    env = {k: v for k, v in os.environ.items() if k != "DEBUGINFOD_URLS"}
    env["QPROF_SYMBOL_CACHE"] = str(tmp_path / "cache")
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        shutil.copy(debug, dest)
        rep = _record(built, tmp_path / "installed", env)
        assert _naming(rep)["how"] == "debug file" and _naming(rep)["source"] == str(dest)
        assert _internal(_lib_frames(rep)) == set(INTERNAL)
        wrong = _build(tmp_path)[1]  # the same source, another build-id
        shutil.copy(wrong, dest)
        got = symbols_for(str(lib), tmp_path / "cache2", None)
        assert got.how == "unwind table" and f"{dest} refused: its build-id is " in got.note, got
    finally:
        dest.unlink(missing_ok=True)


class _Bad(http.server.BaseHTTPRequestHandler):
    mode = "404"

    def do_GET(self) -> None:  # noqa: N802 (the base class's name)
        if self.mode == "slow":
            time.sleep(3)
        if self.mode == "404":
            self.send_error(404)
            return
        body = b"not an ELF file at all" * 100
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.mark.parametrize("mode, said, remembered", [
    ("404", "HTTP 404", True),
    ("garbage", "refused its answer: not a readable ELF file", False),
    ("slow", "timed out", False),
])
def test_bad_debuginfod_servers(built: tuple[Path, Path, str], tmp_path: Path, mode: str, said: str,
                                remembered: bool) -> None:
    handler = type("Handler", (_Bad,), {"mode": mode})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.handle_error = lambda request, address: None  # the slow one writes to a client that gave up
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        client = Debuginfod([url], tmp_path, timeout_s=1.0)
        t0 = time.monotonic()
        got, why = client.fetch(built[2])
        assert got is None and said in why, why
        assert time.monotonic() - t0 < 5, "a slow server never holds collection past its timeout"
        again = client.fetch(built[2])[1]
        assert ("within the last day" in again) == remembered, again
        # whatever the server did, the object is still named (by its unwind table)
        assert symbols_for(str(built[0]), tmp_path / "c", client).how == "unwind table"
    finally:
        server.shutdown()
        server.server_close()


def test_budget_and_cache_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QPROF_SYMBOL_CACHE", str(tmp_path))
    assert debuginfo.cache_root() == tmp_path
    assert debuginfo.cached_debug(tmp_path, "ab" + "c" * 38) == tmp_path / ".build-id" / "ab" / ("c" * 38) / "debug"
    spent = Debuginfod(["http://127.0.0.1:9"], tmp_path, 1.0, budget_s=0.0)
    assert spent.fetch("ab" * 20) == (None, "the run's debuginfod time budget is spent")
