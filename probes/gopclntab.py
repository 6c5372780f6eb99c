"""Go's own function table, `.gopclntab`: the names of a stripped Go binary's functions.

A Go binary built with `-ldflags=-s -w` (or run through `strip`) has no `.symtab`
and no DWARF, and Go code has no `.eh_frame` either: perf names its frames
`[unknown]` and the unwind table names nothing. What such a binary always keeps
is the table the Go runtime itself reads for tracebacks and stack growth: each
function's entry and name. Go's tools (`go tool nm` on a stripped binary), Parca
and the OpenTelemetry eBPF profiler name Go frames from it. qprof reads it twice:
collectors.debuginfo writes the names into a debug file perf reads, and the crypto
probes (probes.crypto.symbols) find Go's AES-GCM and ChaCha20 entry points by name in
it. It lives in the probes layer, the lowest one both may import.

Layouts read (runtime/symtab.go's pcHeader; the magic also gives the byte order):

- Go 1.16-1.17 (0xfffffffa): header words nfunc, nfiles, funcnameOffset, cuOffset,
  filetabOffset, pctabOffset, pclnOffset; the functab (at pclnOffset) holds
  pointer-sized pairs (entry address, _func offset);
- Go 1.18-1.19 (0xfffffff0) and 1.20+ (0xfffffff1): the same with a textStart word
  after nfiles, and uint32 pairs (entry offset from the text start, _func offset).

A _func offset is from pclnOffset; the _func starts with its entry (an address
before 1.18, an offset after, which must equal the functab's) and `nameOff`, an
index into funcnametab (NUL-terminated names). Go 1.2-1.15's layout is not read.

The text start (`runtime.text`) of a 1.18+ table: the `text` field of the
binary's moduledata (found by its first two fields, the table's address and its
funcnametab's), as the runtime reads it; else the header's textStart (Go 1.26
no longer stores it); else the `.text` section's start, as Go's own tools
assume. The first one that puts every function in an executable segment is used.

Damaged bytes (cut short, a wrong magic, offsets out of range, records that do
not match) are never raised: the result has no functions and a one-line reason.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

from elftools.common.exceptions import ELFError

if TYPE_CHECKING:
    from elftools.elf.elffile import ELFFile

SECTIONS = (".gopclntab", ".data.rel.ro.gopclntab")  # the latter: some PIE builds
MODULEDATA_SECTIONS = (".go.module", ".noptrdata", ".data.rel.ro", ".data")  # where the linker puts moduledata
_MODULEDATA_TEXT = 22  # moduledata's word `text`: after pcHeader, six slices, findfunctab, minpc, maxpc
LAYOUTS = {0xFFFFFFFA: "Go 1.16-1.17", 0xFFFFFFF0: "Go 1.18-1.19", 0xFFFFFFF1: "Go 1.20+"}
_GO12 = 0xFFFFFFFB
MAX_NAME = 1 << 16  # a longer "name" is a damaged table, not a function


@dataclass(frozen=True)
class GoFunctions:
    """A binary's Go functions, by entry address; none and a reason when the table was not read."""

    functions: tuple[tuple[int, str], ...] = ()  # (entry address, name), ascending
    end: int | None = None  # the address past the last function (the table's final entry)
    layout: str = ""  # LAYOUTS' value
    reason: str = ""  # why there are no functions; "" when there are

    def covers(self, address: int) -> bool:
        """Whether an address is in the code the table describes."""
        return bool(self.functions) and self.end is not None and self.functions[0][0] <= address < self.end

    def sized(self) -> Iterator[tuple[str, int, int]]:
        """(name, entry, size) of each function, a symbol table's triple: the table keeps no sizes, so a function
        runs to the next one's entry (the last to the table's end), padding between them included."""
        ends = [a for a, _ in self.functions[1:]] + [self.end if self.end is not None else self.functions[-1][0]]
        for (entry, name), end in zip(self.functions, ends):
            yield name, entry, end - entry


@dataclass(frozen=True)
class _Header:
    order: str  # struct's byte order: "<" or ">"
    ptr: int  # pointer size, 4 or 8
    new: bool  # 1.18+: uint32 functab entries relative to the text start
    layout: str
    nfunc: int
    text_start: int  # the header's own word (1.18+; 0 when not stored)
    funcnametab: int
    functab: int  # = pclnOffset, also the base of the _func offsets


def _header(data: bytes) -> _Header | str:
    """The table's header, or why it cannot be read."""
    if len(data) < 8:
        return f"only {len(data)} bytes"
    le, be = struct.unpack_from("<I", data)[0], struct.unpack_from(">I", data)[0]
    magic, order = (le, "<") if le in LAYOUTS or le == _GO12 else (be, ">")
    if magic == _GO12:
        return "Go 1.2-1.15 layout (magic 0xfffffffb), not read"
    if magic not in LAYOUTS:
        return f"unknown magic {le:#010x}"
    if data[4] or data[5] or data[6] not in (1, 2, 4) or data[7] not in (4, 8):
        return f"bad header (pad {data[4]},{data[5]}, instruction size {data[6]}, pointer size {data[7]})"
    ptr, new = data[7], magic != 0xFFFFFFFA
    words = 8 if new else 7
    if len(data) < 8 + words * ptr:
        return f"header cut short ({len(data)} bytes)"
    w = struct.unpack_from(f"{order}{words}{'Q' if ptr == 8 else 'I'}", data, 8)
    if new:
        nfunc, _, text_start, funcnametab, _, _, _, functab = w
    else:
        (nfunc, _, funcnametab, _, _, _, functab), text_start = w, 0
    for what, off in (("funcnametab", funcnametab), ("functab", functab)):
        if not 8 + words * ptr <= off < len(data):
            return f"{what} offset {off:#x} outside the table ({len(data):#x} bytes)"
    field = 4 if new else ptr
    if nfunc == 0:
        return "no functions listed"
    if functab + (2 * nfunc + 1) * field > len(data):
        return f"{nfunc} functions do not fit in the table ({len(data):#x} bytes)"
    return _Header(order, ptr, new, LAYOUTS[magic], nfunc, text_start, funcnametab, functab)


def parse(data: bytes, text_start: int = 0) -> GoFunctions:
    """The functions of one `.gopclntab`'s bytes; `text_start` (runtime.text) places a 1.18+ table's entries."""
    head = _header(data)
    if isinstance(head, str):
        return GoFunctions(reason=head)
    field = 4 if head.new else head.ptr
    word = f"{head.order}{'I' if field == 4 else 'Q'}"
    base = text_start if head.new else 0
    name_off = struct.Struct(f"{head.order}i")
    funcs: list[tuple[int, str]] = []
    last = -1
    for i in range(head.nfunc + 1):
        entry = struct.unpack_from(word, data, head.functab + 2 * i * field)[0]
        if entry < last:
            return GoFunctions(layout=head.layout, reason=f"function {i}'s entry {entry:#x} is before the previous one")
        last = entry
        if i == head.nfunc:
            break
        off = head.functab + struct.unpack_from(word, data, head.functab + (2 * i + 1) * field)[0]
        if off + field + 4 > len(data):
            return GoFunctions(layout=head.layout, reason=f"function {i}'s record at {off:#x} is outside the table")
        if struct.unpack_from(word, data, off)[0] != entry:
            return GoFunctions(layout=head.layout, reason=f"function {i}'s record does not match its table entry")
        (noff,) = name_off.unpack_from(data, off + field)
        start = head.funcnametab + noff
        stop = data.find(b"\0", start, start + MAX_NAME) if 0 <= noff and start < len(data) else -1
        if stop <= start:
            return GoFunctions(layout=head.layout, reason=f"function {i}'s name (offset {noff:#x}) is not in the table")
        if not funcs or funcs[-1][0] != base + entry:
            funcs.append((base + entry, data[start:stop].decode("utf-8", "replace")))
    return GoFunctions(tuple(funcs), base + last, head.layout)


def _moduledata_text(elf: ELFFile, table_addr: int, head: _Header) -> int | None:
    """moduledata.text: the runtime's own text start, found by moduledata's pcHeader and funcnametab fields."""
    fmt = f"{head.order}{'Q' if head.ptr == 8 else 'I'}"
    first = struct.pack(fmt, table_addr) + struct.pack(fmt, table_addr + head.funcnametab)
    for name in MODULEDATA_SECTIONS:
        sec = elf.get_section_by_name(name)
        if sec is None or sec["sh_type"] == "SHT_NOBITS":
            continue
        data = sec.data()
        at = data.find(first)
        while at >= 0:
            if at % head.ptr == 0 and at + (_MODULEDATA_TEXT + 1) * head.ptr <= len(data):
                return int(struct.unpack_from(fmt, data, at + _MODULEDATA_TEXT * head.ptr)[0])
            at = data.find(first, at + 1)
    return None


def _in(ranges: list[tuple[int, int]], lo: int, hi: int) -> bool:
    return any(a <= lo and hi <= b for a, b in ranges)


def read(elf: ELFFile) -> GoFunctions:
    """The Go functions of an ELF file (see the module docstring); never raises."""
    try:
        sec = next((s for s in map(elf.get_section_by_name, SECTIONS) if s is not None), None)
        if sec is None:
            return GoFunctions(reason="no .gopclntab section")
        if sec["sh_type"] == "SHT_NOBITS":
            return GoFunctions(reason=".gopclntab has no bytes in the file")
        data = sec.data()
        head = _header(data)
        if isinstance(head, str):
            return GoFunctions(reason=head)
        code = [(int(s["p_vaddr"]), int(s["p_vaddr"] + s["p_memsz"])) for s in elf.iter_segments()
                if s["p_type"] == "PT_LOAD" and s["p_flags"] & 1]
        if not head.new:
            got = parse(data)
            if got.functions and got.end is not None and not _in(code, got.functions[0][0], got.end):
                return GoFunctions(layout=got.layout, reason="its functions are outside the executable segments")
            return got
        text = elf.get_section_by_name(".text")
        candidates = [_moduledata_text(elf, int(sec["sh_addr"]), head), head.text_start or None,
                      int(text["sh_addr"]) if text is not None else None]
        got = GoFunctions(layout=head.layout, reason="no text start found")
        for start in dict.fromkeys(c for c in candidates if c is not None):
            got = parse(data, start)
            if not got.functions or got.end is None:
                return got
            if _in(code, got.functions[0][0], got.end):
                return got
        return GoFunctions(layout=head.layout, reason="no text start puts its functions in an executable segment") \
            if got.functions else got
    except (OSError, ELFError, ValueError, KeyError, struct.error) as e:
        return GoFunctions(reason=f"unreadable ({type(e).__name__}: {e})")
