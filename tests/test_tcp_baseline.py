"""TCP+TLS as a baseline: an HTTPS download (curl from `openssl s_server -WWW`) and the ngtcp2 download of the
same file, both run by `qprof record`, compared per GB by `qprof diff`.

Checked against what the kernel and /proc say, not against qprof itself:
- TCP bytes (kernel socket counters, collectors.tcpinfo) are the file plus TLS records' and HTTP's
  overhead: at least the file, at most 1% more (22-29 bytes per record of up to 16 KiB, headers);
- QUIC bytes (UDP, estimated from the probes' sampling windows) have a 95% interval that reaches the
  file size and starts below 6% over it (QUIC headers, AEAD tags and frames);
- each side's CPU s/GB in the diff is its sampled CPU per GB moved, and /proc's CPU time (schedstat's
  on-CPU nanoseconds: this kernel charges utime/stime per 4 ms tick) over the same bytes agrees with it
  within 20%, over the file's bytes within that and the overheads above. Why 20%: on this 2-vCPU VM,
  cpu-clock samples of the ngtcp2 client ran 5-16% over its schedstat time in repeated runs (a sample's
  period is wall time on its CPU, schedstat leaves out what the hypervisor stole); the TCP processes
  and the QUIC server stayed within 5% on a quiet host. On a loaded one the QUIC server's samples fell
  30% short once (timer-woken work between cpu-clock ticks): sampled CPU below /proc's by more than
  20% passes only when the report says so to the user (`cpu_note`), as the demo test requires.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import QPROF, bytes_for_samples, qprof
from qprof.attribution.profile import cpu_shortfall_note
from qprof.archive import Run
from qprof.endpoints import make_certificate, make_payload

pytestmark = [pytest.mark.root, pytest.mark.slow]
# 256 MiB at 999 Hz: ~500 samples of the QUIC server; held at the default frequency (a shortfall
# is told only beyond 3/sqrt(n), 13% there: the tolerance below must lie outside it)
SIZE = bytes_for_samples(256 << 20)
GB = 1e9
CPU_TOLERANCE = 0.20  # sampled CPU against schedstat's (see the module docstring)
READING_S = 0.25  # /proc reading interval (AttachOptions.proc_interval)
TCP_OVERHEAD = 0.01
QUIC_OVERHEAD = 0.06


def _free_port(kind: int) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def record(cwd: Path, out: Path, ready: str, server: str, client: str) -> None:
    r = subprocess.run([*QPROF, "record", "-q", "-o", str(out), "--ready", ready, "--server", server,
                        "--client", client], cwd=cwd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr


@pytest.fixture(scope="module")
def runs(ngtcp2_tools: None, probes_available: None, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    for tool, pkg in (("curl", "curl"), ("openssl", "openssl")):
        if subprocess.run(["sh", "-c", f"command -v {tool}"], capture_output=True).returncode:
            pytest.skip(f"{tool} missing (make test installs {pkg})")
    tmp = tmp_path_factory.mktemp("baseline")
    files = tmp / "files"
    files.mkdir()
    make_payload(files, SIZE)
    key, cert = make_certificate(files)
    udp, tcp = _free_port(socket.SOCK_DGRAM), _free_port(socket.SOCK_STREAM)
    quic, https = tmp / "quic", tmp / "tcp"
    record(files, quic, f"udp:{udp}",
           f"gtlsserver -q --no-quic-dump --no-http-dump -d {files} 127.0.0.1 {udp} {key} {cert}",
           f"gtlsclient -q --no-quic-dump --no-http-dump --exit-on-all-streams-close --max-data=64M "
           f"--max-stream-data-bidi-local=64M 127.0.0.1 {udp} https://127.0.0.1:{udp}/payload")
    # s_server -WWW serves files from its working directory; -naccept 1: it exits after the download
    record(files, https, f"tcp:{tcp}",
           f"openssl s_server -WWW -quiet -naccept 1 -accept 127.0.0.1:{tcp} -cert {cert} -key {key}",
           f"curl -sSk -o /dev/null https://127.0.0.1:{tcp}/payload")
    # the one-process form, as a user records a client against a server qprof does not run, given a role
    alone, port = tmp / "curl-alone", _free_port(socket.SOCK_STREAM)
    server = subprocess.Popen(["openssl", "s_server", "-WWW", "-quiet", "-naccept", "1", "-accept",
                               f"127.0.0.1:{port}", "-cert", str(cert), "-key", str(key)], cwd=files,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while subprocess.run(["sh", "-c", f"ss -ltn | grep -q ':{port} '"]).returncode:
            assert time.monotonic() < deadline, "openssl s_server did not listen"
            time.sleep(0.05)
        r = subprocess.run([*QPROF, "record", "-q", "--role", "client", "-o", str(alone), "--",
                            "curl", "-sSk", "-o", "/dev/null", f"https://127.0.0.1:{port}/payload"],
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr
    finally:
        server.kill()
        server.wait()
    return {"quic": quic, "tcp": https, "alone": alone}


def test_a_one_process_run_with_a_role_pairs_with_a_two_process_run(runs: dict[str, Path]) -> None:
    """`record --role client -- curl ...` against the ngtcp2 pair: diff pairs the clients by role, and the
    TCP run's table row has its goodput from the bytes its socket counters counted."""
    d = json.loads(qprof("diff", str(runs["quic"]), str(runs["alone"]), "--format", "json").stdout)
    assert d["match_by"] == "role" and [p["key"] for p in d["pairs"]] == ["client"], d
    (pair,) = d["pairs"]
    assert pair["b"]["tcp_bytes"] >= SIZE and pair["b"]["goodput_gbps"] > 0
    assert all(c["cpu_seconds_per_gb_b"] is not None for c in pair["categories"])
    table = qprof("table", str(runs["alone"])).stdout
    row = next(ln for ln in table.splitlines() if ln.startswith(runs["alone"].name))
    assert " client " in row and re.search(r"\s\d+\.\d\d\s+\S+\s*$", row), row
    assert "summary over runs" not in table
    # by pid, as a user pairs processes of runs without roles
    a_pid = by_role(report(runs["quic"]))["server"]["pid"]
    b_pid = report(runs["alone"])["processes"][0]["pid"]
    d = json.loads(qprof("diff", str(runs["quic"]), str(runs["alone"]), "--pair", f"{a_pid}:{b_pid}",
                         "--format", "json").stdout)
    assert d["match_by"] == "pid" and len(d["pairs"]) == 1
    r = qprof("diff", str(runs["quic"]), str(runs["alone"]), "--pair", "1:2", check=False)
    assert r.returncode == 2 and "--pair: no samples of pid 1" in r.stderr and len(r.stderr.splitlines()) == 1


def on_cpu_seconds(run: Path) -> dict[int, float]:
    """Per target, schedstat's on-CPU time over the run (first to last /proc reading of each thread)."""
    first: dict[tuple[int, int], float] = {}
    last: dict[tuple[int, int], float] = {}
    for line in (run / "proc.jsonl").read_text().splitlines():
        for pid, threads in json.loads(line)["threads"].items():
            for t in threads:
                if t.get("on_cpu_s") is not None:
                    first.setdefault((int(pid), t["tid"]), t["on_cpu_s"])
                    last[(int(pid), t["tid"])] = t["on_cpu_s"]
    out: dict[int, float] = {}
    for (pid, tid), v in last.items():
        out[pid] = out.get(pid, 0.0) + v - first[(pid, tid)]
    return out


def report(run: Path) -> dict[str, Any]:
    return json.loads(qprof("report", str(run), "--format", "json").stdout)


def by_role(rep: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {p["role"]: p for p in rep["processes"]}


def test_tcp_bytes_are_the_kernels_and_the_file(runs: dict[str, Path]) -> None:
    rep = report(runs["tcp"])
    procs = by_role(rep)
    tcp = rep["tcp"]["processes"]
    server, client = tcp[str(procs["server"]["pid"])], tcp[str(procs["client"]["pid"])]
    print(f"\nTCP: server sent {server['sent_bytes']:,} B, client received {client['received_bytes']:,} B "
          f"(file {SIZE:,} B)")
    for moved in (server["sent_bytes"], client["received_bytes"]):
        assert SIZE <= moved <= SIZE * (1 + TCP_OVERHEAD)
    assert server["received_bytes"] < 64 << 10 and client["sent_bytes"] < 64 << 10  # request, handshake, ACK-free
    assert server["sockets"] == client["sockets"] == 1 and server["closed"] == client["closed"] == 1
    # what the server sent is what the client received (and the server's FIN: one sequence number)
    assert 0 <= client["received_bytes"] - server["sent_bytes"] <= 1
    # the TCP baseline's categories mirror QUIC's: its record crypto is "tls record", its kernel path
    # Packet I/O's send and receive calls
    for role, call in (("server", "tx syscall"), ("client", "rx syscall")):
        subs = procs[role]["subcategories"]["Crypto"]
        assert max(subs, key=subs.get) == "tls record", (role, subs)
        assert subs["tls record"] > 0.5 * procs[role]["categories"]["Crypto"], (role, subs)
        # the call is the largest part of Packet I/O as far as the samples can tell (no other part above
        # it by 3 standard deviations of the two shares' difference), and more than chance: its share's
        # 3-sigma lower bound is above zero. Not a fixed share: with one busy process on the host the
        # server's Packet I/O fell from 42% to 10-14% (the loopback receive softirq ran elsewhere) while
        # its send call stayed 96% of it; and the client can be as small as 159 samples (fresh-clone
        # run94, busy: its softirq 36 samples, its receive call 35)
        pio = procs[role]["subcategories"]["Packet I/O"]
        share, n = pio.get(call, 0.0), procs[role]["samples"]
        top = max(pio.values())
        assert top - share <= 3 * ((top + share - (top - share) ** 2) / n) ** 0.5, (role, n, pio)
        assert share - 3 * (share * (1 - share) / n) ** 0.5 > 0, (role, n, pio)
        # at most 10% (server 1-6%, client 6-9% measured) plus four standard errors of a share
        # estimated from this side's samples (curl runs ~0.4 s: ~400 samples, 1.5 pp)
        n = procs[role]["samples"]
        assert procs[role]["categories"]["Uncategorized"] < 0.1 + 4 * (0.1 * 0.9 / n) ** 0.5, (role, n)


def test_diff_per_gb_against_proc_and_bytes(runs: dict[str, Path]) -> None:
    r = qprof("diff", str(runs["quic"]), str(runs["tcp"]))
    print("\n" + r.stdout)
    d = json.loads(qprof("diff", str(runs["quic"]), str(runs["tcp"]), "--format", "json").stdout)
    on_cpu = {"a": on_cpu_seconds(runs["quic"]), "b": on_cpu_seconds(runs["tcp"])}
    reports = {"a": report(runs["quic"]), "b": report(runs["tcp"])}
    quic_io = reports["a"]["packet_io"]["processes"]
    procs = {side: {p["pid"]: p for p in rep["processes"]} for side, rep in reports.items()}
    assert {p["key"] for p in d["pairs"]} == {"server", "client"}
    for pair in d["pairs"]:
        for side, overhead in (("a", QUIC_OVERHEAD), ("b", TCP_OVERHEAD)):
            s = pair[side]
            cpu = on_cpu[side][s["pid"]]
            assert (s["udp_bytes"] is None) == (side == "b") and (s["tcp_bytes"] is None) == (side == "a")
            per_gb = sum(c["cpu_seconds_per_gb_" + side] for c in pair["categories"])
            assert per_gb == pytest.approx(s["cpu_seconds"] / (s["bytes"] / GB), rel=1e-3)
            # /proc's CPU per GB, over the bytes the diff counted and over the file's bytes
            proc_per_gb = cpu / (s["bytes"] / GB)
            file_per_gb = cpu / (SIZE / GB)
            print(f"{pair['key']} {side}: {per_gb:.3f} CPU s/GB in the diff; /proc: {proc_per_gb:.3f} over the bytes "
                  f"counted, {file_per_gb:.3f} over the file")
            # above /proc only by the tolerance and what the /proc window can miss at its end: one
            # reading interval (0.25 s) of one CPU (an exiting client's last reading precedes its exit)
            tail = READING_S / (s["bytes"] / GB)
            assert per_gb <= proc_per_gb * (1 + CPU_TOLERANCE) + tail, (pair["key"], side)
            assert per_gb <= file_per_gb * (1 + CPU_TOLERANCE) + tail, (pair["key"], side)
            if per_gb < proc_per_gb / (1 + CPU_TOLERANCE) or per_gb < file_per_gb / (1 + overhead) / (1 + CPU_TOLERANCE):
                # sampled CPU short of the kernel's (system-wide cpu-clock sampling misses work that
                # starts when a process wakes on a timer, more so on a loaded host): the report must say so
                # (it does once the shortfall is beyond the samples' own error, by its /proc figure)
                p = procs[side][s["pid"]]
                run = runs["quic" if side == "a" else "tcp"]
                scope = Run.open(run).meta.sampling.scope_mode
                if cpu_shortfall_note(p["cpu_seconds"], p["samples"], p["proc_cpu_seconds"], scope):
                    assert p["cpu_note"] and ("--scope cgroup" in p["cpu_note"]) == (scope == "system"), \
                        (pair["key"], side, p)
                else:
                    print(f"  short of schedstat, within the report's sampling error ({p['samples']} samples)")
        # the QUIC estimate of the bytes moved holds the file and its QUIC overhead
        main = "tx" if pair["key"] == "server" else "rx"
        est = quic_io[str(pair["a"]["pid"])]["estimates"][f"{main}.bytes"]
        lo, hi = est["interval"] if est["interval"] else (est["value"], est["value"])
        assert (hi is None or hi >= SIZE) and (lo is None or lo <= SIZE * (1 + QUIC_OVERHEAD)), est
