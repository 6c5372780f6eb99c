"""The crypto group's bpftrace program: uprobes on per-packet AEAD and header-protection calls.

Generated at attach time, not shipped as a fixed script: the entry points and
their addresses come from the targets' own objects (symbols.py).
One uprobe per entry point (by address: Go and Rust names are not bpftrace
identifiers), each counting calls and, where a length argument exists, bytes
per (pid, tid, slot) of the targets; a slot is one entry point, or one part of
it (OpenSSL's EVP_EncryptUpdate: AAD-only calls, calls of <= 16 bytes, larger
ones). Every hit, whoever calls, is counted too (@host_calls per entry point):
what the probes cost the whole host, exactly, not scaled from BPF statistics.

Why opt-in: a uprobe is a breakpoint trap into the kernel on every call, and
QUIC makes two to four crypto calls per packet (seal or open, plus header
protection), 10^5-10^6 per second in a bulk transfer. Uprobes are also
installed per file, not per process: on a shared library (libcrypto, libgnutls)
every process on the host that calls the function traps, and the BPF program's
pid test only decides what is counted. uprobe only: never uretprobe (a Go
function's return probe corrupts goroutine stacks; counts and lengths are
read on entry everywhere).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from qprof.probes.bpftrace import pid_predicate
from qprof.probes.crypto.records import CryptoCost, CryptoFindings, CryptoObject, CryptoProbe, CryptoSlot
from qprof.probes.mapsout import RawMap, raw_map

if TYPE_CHECKING:
    from qprof.probes.group import ProgramCost
    from qprof.probes.packetio.maps import ProbeMaps

# Cost of one uprobe hit to the probed thread on the development host (Firecracker VM, Linux 6.18,
# 2 vCPUs shared), measured with bench/uprobe_cost.py: a C loop calling a non-inlined function
# 200k times, thread CPU time per call with and without a bpftrace uprobe whose action is qprof's
# `@calls[pid, tid, K] = count()`, medians of 5 runs, two sessions: 1.3-1.4 ns without, 2790 and
# 2890 ns with, of which the BPF program (BPF_ENABLE_STATS run time) was 76-79 ns; with a
# `sum(sarg1)` byte counter added, 2890-2920 ns (BPF 121 ns). Kernel selftests give 0.3-1.3 us
# on bare metal: the breakpoint trap is dearer in this VM.
UPROBE_HIT_NS = 2850
UPROBE_TRAP_NS = 2750  # the part not in BPF run time: breakpoint trap, uprobe dispatch, return
UPROBE_HIT_RANGE_NS = (300, 2950)  # bare metal (kernel selftests) .. this VM (measured)
HITS_PER_PACKET = (2, 4)  # seal or open, plus header protection; OpenSSL adds an AAD update

# EVP_EncryptUpdate/EVP_DecryptUpdate calls: AAD-only (out == NULL), <= 16 bytes (header-protection
# sized: a 16-byte AES-ECB block or a 5-byte ChaCha20 mask), larger (packet payload)
_EVP_PARTS = ("aad", "short", "payload")


_PROBE_PATH = re.compile(r"/[\w/.+-]+")


def _target(pids: list[int], follow: bool = False) -> str:
    return pid_predicate(sorted(set(pids)), follow=follow)


def build(discovery: CryptoFindings, follow: bool = False) -> tuple[str | None, list[CryptoSlot]]:
    """(bpftrace program, slot table) for the probes chosen in `discovery` (cryptosyms.discover);
    (None, []) when there is nothing to probe. `follow`: a process that became a target during the
    run counts at every probed entry point (probes.bpftrace.follow_probes)."""
    by_site: dict[tuple[str, str], list[int]] = {}
    for pid, proc in discovery.processes.items():
        for p in proc.probes:
            by_site.setdefault((p.object, p.address), []).append(int(pid))
    if not by_site:
        return None, []
    slots: list[CryptoSlot] = []
    blocks: list[str] = []
    # Go functions probed per object: (slot + 1, start, end, pids) for its runtime.morestack probe
    go_ranges: dict[str, list[tuple[int, int, int, list[int]]]] = {}
    for (obj_path, address), pids in sorted(by_site.items()):
        if not _PROBE_PATH.fullmatch(obj_path):  # bpftrace 0.17 cannot parse it in a probe name
            if discovery.skipped is None:
                discovery.skipped = []
            discovery.skipped.append(f"{obj_path}: path not usable in a bpftrace probe")
            continue
        obj = discovery.objects[obj_path]
        probe = next(p for p in obj.probes if p.address == address)
        length = probe.length
        # every process calling it traps: counted for the host, then the targets' calls in detail
        head = (f"// {probe.symbol} ({probe.kind}) in {obj_path}\nuprobe:{obj_path}:{_where(obj, address)}\n{{\n"
                f"\t@host_calls[{len(slots)}] = count();\n\tif ({_target(pids, follow)}) {{\n")
        if probe.split == "evp" and length:
            ids = {}
            for part in _EVP_PARTS:
                ids[part] = len(slots)
                slots.append(_slot(len(slots), part, obj_path, probe))
            body = (f"\t\t$n = {length};\n"
                    f"\t\tif (arg1 == 0) {{\n{_count(ids['aad'], '$n', 3)}\t\t}} else {{\n"
                    f"\t\t\tif ($n <= 16) {{\n{_count(ids['short'], '$n', 4)}\t\t\t}} else {{\n"
                    f"{_count(ids['payload'], '$n', 4)}\t\t\t}}\n\t\t}}\n")
        else:
            slot = len(slots)
            slots.append(_slot(slot, "all", obj_path, probe))
            body = _count(slot, length, 2)
            if probe.library == "go" and obj.go_morestack and probe.size:
                start = int(address, 16)
                go_ranges.setdefault(obj_path, []).append((slot + 1, start, start + probe.size, pids))
                # the second entry of a call whose stack check sent it through runtime.morestack
                body = (f"\t\tif (@reentry[pid, reg(\"r14\")] == {slot + 1}) {{\n"
                        f"\t\t\tdelete(@reentry[pid, reg(\"r14\")]);\n\t\t\t@reentries[pid] = count();\n"
                        "\t\t} else {\n"
                        + _count(slot, length, 3) + "\t\t}\n")
        blocks.append(head + body + "\t}\n}\n")
    for obj_path, ranges in sorted(go_ranges.items()):
        # runtime.morestack's return address is in the tail of the function whose stack check failed;
        # that function runs again from its entry on the same goroutine (R14 holds g in Go code)
        tests = "".join(f"\t\t{'else ' if i else ''}if ($ra >= {start:#x} && $ra < {end:#x}) "
                        f"{{ @reentry[pid, reg(\"r14\")] = {mark}; }}\n"
                        for i, (mark, start, end, _) in enumerate(ranges))
        who = _target([p for *_, pids in ranges for p in pids], follow)
        obj = discovery.objects[obj_path]
        blocks.append(f"// runtime.morestack in {obj_path}: a probed Go function re-entered after its stack "
                      f"check failed is one call\nuprobe:{obj_path}:{_where(obj, obj.go_morestack or '')}\n"
                      f"{{\n\tif ({who}) {{\n\t\t$ra = *(uint64 *)reg(\"sp\");\n{tests}\t}}\n}}\n")
    if not blocks:
        return None, []
    header = ("// qprof crypto probes (opt-in), generated by qprof.probes.crypto.program for this run.\n"
              "// @calls/@bytes[pid, tid, slot]: the slot table is in probes.json under crypto.slots.\n"
              "// uprobes only (no uretprobes): lengths are read on entry. bpftrace 0.17 syntax.\n\n")
    printed = ("print(@calls); print(@host_calls);" + (" print(@bytes);" if any(s.bytes for s in slots) else "")
               + (" print(@reentries);" if go_ranges else ""))
    footer = f"interval:s:1\n{{\n\t{printed}\n}}\n"  # an unused map is an error in bpftrace
    return header + "\n".join(blocks) + "\n" + footer, slots


def _slot(slot: int, part: str, obj_path: str, probe: CryptoProbe) -> CryptoSlot:
    """The slot table's entry of one counted part of an entry point."""
    return CryptoSlot(slot, probe.symbol, part, probe.kind, probe.cipher, probe.path, probe.length is not None,
                      obj_path, probe.address, probe.library, probe.table)


def _where(obj: CryptoObject, address: str) -> str:
    """A probe's location for bpftrace: the address, which it turns into a file offset through the
    object's symbols; where they are gone (Go's own table named it) the file offset itself."""
    delta = obj.probe_delta
    return address if delta is None else hex(int(address, 16) - int(delta))


def _count(slot: int, length: str | None, indent: int = 1) -> str:
    t = "\t" * indent
    out = f"{t}@calls[pid, tid, {slot}] = count();\n"
    if length:
        out += f"{t}@bytes[pid, tid, {slot}] = sum({length});\n"
    return out


def _file(slot: CryptoSlot) -> str:
    """The file name of a slot's object."""
    return (slot.object or "").rsplit("/", 1)[-1]


def follow_limit(slots: list[CryptoSlot]) -> str:
    """What a followed run's crypto probes cannot see, in one line: the uprobes are placed once, at
    the entry points found in the start targets' objects."""
    objects = sorted({_file(s) for s in slots})
    return (f"follows new processes only at the entry points probed at the start (in {', '.join(objects)}): "
            "a process that appears later is counted there, its calls into other objects are not")


def estimate_text(slots: list[CryptoSlot]) -> str:
    """What the user is told before the probes start (the rate cannot be known in advance)."""
    sites = {(s.object, s.address) for s in slots}
    shared = sorted({_file(s) for s in slots if ".so" in _file(s)})
    lo, hi = UPROBE_HIT_RANGE_NS
    text = (f"crypto probes (opt-in, expensive): {len(sites)} uprobes; each hit costs the calling thread "
            f"{lo / 1000:.1f}-{hi / 1000:.1f} us ({UPROBE_HIT_NS / 1000:.1f} us measured on qprof's test VM), "
            f"{HITS_PER_PACKET[0]}-{HITS_PER_PACKET[1]} hits per QUIC packet: at 100k packets/s that is "
            f"{100_000 * HITS_PER_PACKET[0] * lo / 1e9:.2f}-{100_000 * HITS_PER_PACKET[1] * hi / 1e9:.1f} CPU s "
            "per second")
    if shared:
        text += (f"; uprobes on shared libraries ({', '.join(shared)}) trap in every process on this host "
                 "that calls them, not only in the targets")
    return text


def cost(slots: list[CryptoSlot], maps: ProbeMaps, programs: list[ProgramCost]) -> CryptoCost:
    """The run's crypto probe cost: BPF run time as the kernel measured it, plus the trap overhead
    estimated as hits x the per-hit trap cost measured on qprof's test host (UPROBE_TRAP_NS).

    Two scopes: the targets (hits counted in their threads) and the whole host (every hit, counted
    by the programs: on a shared library, every process calling a probed function traps). BPF run
    time comes from BPF statistics scaled to the run (an estimate), hit counts from the maps (exact)."""
    target_hits, all_hits = _total(raw_map(maps, "@calls")), _total(raw_map(maps, "@host_calls"))
    reentries = _total(raw_map(maps, "@reentries"))  # Go re-entries: a trap each, not a call
    uprobe_progs = [p for p in programs if p.type == "kprobe"]  # uprobes load as kprobe programs
    run_cnt = sum(int(p.run_cnt or 0) for p in uprobe_progs)
    run_ns = sum(int(p.run_time_ns or 0) for p in uprobe_progs)
    measured = run_cnt > 0
    bpf_per_hit = run_ns / run_cnt if measured else None
    per_hit = UPROBE_TRAP_NS + (bpf_per_hit or 0.0)
    host = "@host_calls" in maps
    return CryptoCost(
        uprobes=len({(s.object, s.address) for s in slots}),
        target_hits=target_hits,
        target_reentries=reentries,
        all_hits=all_hits if host else None,
        bpf_run_time_ns=run_ns if measured else None,
        bpf_ns_per_hit=None if bpf_per_hit is None else round(bpf_per_hit, 1),
        trap_ns_per_hit=UPROBE_TRAP_NS,
        target_estimated_ns=round((target_hits + reentries) * per_hit),
        host_estimated_ns=round(all_hits * per_hit) if host else None,
        basis=(f"BPF run time measured (BPF_ENABLE_STATS); trap overhead = hits x {UPROBE_TRAP_NS} ns "
               "(bench/uprobe_cost.py on qprof's test VM)") if measured else
              f"no BPF statistics (no window of them opened in a short run, or none on this kernel): "
              f"hits x {UPROBE_TRAP_NS} ns trap only")


def _total(counts: RawMap) -> int:
    """Sum of a count map's values. A count is a whole number >= 0: anything else is a damaged
    record and counts nothing (a negative or fractional count would make the cost meaningless)."""
    return sum(v for v in counts.values() if isinstance(v, int) and not isinstance(v, bool) and v >= 0)


def cost_text(c: CryptoCost) -> str:
    """The cost in one line: told at the end of attach, and in the report."""
    if c.target_estimated_ns is None:
        return f"crypto probes: {c.target_hits:,} uprobe hits in the targets (no cost estimate)"
    traps = c.target_hits + c.target_reentries
    text = (f"crypto probes cost the targets ~{c.target_estimated_ns / 1e9:.3f} CPU s "
            f"({c.target_hits:,} uprobe hits"
            + (f" + {c.target_reentries:,} Go re-entries" if c.target_reentries else "") + ")")
    if c.all_hits is not None and c.host_estimated_ns is not None and c.all_hits > traps:
        text += (f"; host-wide ~{c.host_estimated_ns / 1e9:.3f} CPU s ({c.all_hits:,} hits: other "
                 "processes calling the probed library functions trap too)")
    return text
