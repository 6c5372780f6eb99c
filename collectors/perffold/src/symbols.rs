//! Where perf finds an object's symbols and unwind tables, and the symbol tables themselves.
//!
//! perf 6.1's order (dso__load): the first candidate file that has a `.symtab` gives the symbols,
//! a file with a `.dynsym` is kept as the fallback (and for PLT names); a candidate whose build-id
//! differs from the object's is refused. Candidates, in order: `.gnu_debuglink` (beside the file,
//! its .debug/ folder, /usr/lib/debug/<dir>/), the build-id cache's `elf` and `debug`
//! (--buildid-dir ROOT), /usr/lib/debug/.build-id/ab/cdef.debug, the file itself.
//! The unwinder reads the object's data file: the build-id cache's `elf`, else the path.

use memmap2::Mmap;
use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol, ObjectSymbolTable, SymbolKind};
use std::borrow::Cow;
use std::fs::File;
use std::ops::{Deref, Range};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Bytes of a mapped (or owned) file.
#[derive(Clone)]
pub enum Bytes {
    Mapped(Arc<Mmap>),
    Owned(Arc<Vec<u8>>),
}

impl Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Mapped(m) => m,
            Bytes::Owned(v) => v,
        }
    }
}

/// A part of a file's bytes: what framehop keeps of a section.
#[derive(Clone)]
pub struct Slice {
    bytes: Bytes,
    range: Range<usize>,
}

impl Default for Slice {
    fn default() -> Self {
        Slice { bytes: Bytes::Owned(Arc::new(Vec::new())), range: 0..0 }
    }
}

impl Deref for Slice {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.bytes[self.range.clone()]
    }
}

pub fn map_file(path: &Path) -> Option<Bytes> {
    let f = File::open(path).ok()?;
    if !f.metadata().ok()?.is_file() {
        return None;
    }
    // SAFETY: read-only mapping of a file perf's own tools read the same way; a file truncated
    // under us would fault, as it would for perf.
    let m = unsafe { Mmap::map(&f) }.ok()?;
    Some(Bytes::Mapped(Arc::new(m)))
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Bind {
    Local,
    Global,
    Weak,
}

struct RawSym<'a> {
    start: u64,
    end: u64,
    bind: Bind,
    name: Cow<'a, str>,
}

/// A sorted table of functions: [start, end) in the object's own addresses (SVMAs).
#[derive(Default)]
pub struct SymTab {
    starts: Vec<u64>,
    ends: Vec<u64>,
    blob: String,             // the names, one after the other
    spans: Vec<(u32, u32)>,   // each name's start and end in blob
}

fn underscores(s: &str) -> usize {
    s.bytes().take_while(|&b| b == b'_').count()
}

/// perf's choose_best_symbol: true when `a` wins over `b` (same start).
fn better(a: &RawSym<'_>, b: &RawSym<'_>) -> bool {
    let (la, lb) = (a.end - a.start, b.end - b.start);
    if lb == 0 && la > 0 {
        return true;
    }
    if la == 0 && lb > 0 {
        return false;
    }
    let (wa, wb) = (a.bind == Bind::Weak, b.bind == Bind::Weak);
    if wb && !wa {
        return true;
    }
    if wa && !wb {
        return false;
    }
    let (ga, gb) = (a.bind == Bind::Global, b.bind == Bind::Global);
    if ga && !gb {
        return true;
    }
    if gb && !ga {
        return false;
    }
    // perf compares the demangled names (it demangles as it reads the table); the table keeps
    // names as they are and demangles the ones looked up (SymTab::find's callers)
    let (da, db) = (demangle(&a.name), demangle(&b.name));
    let (ua, ub) = (underscores(&da), underscores(&db));
    if ub > ua {
        return true;
    }
    if ua > ub {
        return false;
    }
    da.len() >= db.len()
}

impl SymTab {
    /// perf's order: sort (stable: equal starts stay in table order), give zero-size symbols the
    /// next symbol's start as end (symbols__fixup_end), then keep one symbol per start
    /// (symbols__fixup_duplicate, which so prefers the last of equal starts: the one with a size).
    /// `extra` (PLT entries) is added after, as perf synthesizes them after both fix-ups.
    fn build(mut raw: Vec<RawSym<'_>>, kallsyms: bool, extra: Vec<RawSym<'_>>) -> SymTab {
        raw.sort_by_key(|s| s.start);
        let n = raw.len();
        for i in 0..n {
            if raw[i].end == raw[i].start {
                if i + 1 < n {
                    let next_start = raw[i + 1].start;
                    let mod_a = kallsyms && raw[i].name.contains('[');
                    let mod_b = kallsyms && raw[i + 1].name.contains('[');
                    raw[i].end = if mod_a != mod_b { (raw[i].end + 4096 + 4095) / 4096 * 4096 } else { next_start };
                } else {
                    raw[i].end = (raw[i].start + 4095) / 4096 * 4096 + 4096;
                }
            }
        }
        let mut kept: Vec<RawSym<'_>> = Vec::with_capacity(raw.len() + extra.len());
        for s in raw {
            if let Some(last) = kept.last_mut() {
                if last.start == s.start {
                    if better(&s, last) {
                        *last = s;
                    }
                    continue;
                }
            }
            kept.push(s);
        }
        if !extra.is_empty() {
            kept.extend(extra);
            kept.sort_by_key(|s| s.start);
        }
        let mut t = SymTab::default();
        for s in kept {
            t.starts.push(s.start);
            t.ends.push(s.end);
            let a = t.blob.len() as u32;
            t.blob.push_str(&s.name);
            t.spans.push((a, t.blob.len() as u32));
        }
        t
    }

    pub fn find(&self, addr: u64) -> Option<&str> {
        let i = self.starts.partition_point(|&s| s <= addr);
        if i == 0 {
            return None;
        }
        let i = i - 1;
        // perf's rbtree look-up: a symbol holds [start, end), a zero-size one its start
        if addr < self.ends[i] || addr == self.starts[i] {
            let (a, b) = self.spans[i];
            Some(&self.blob[a as usize..b as usize])
        } else {
            None
        }
    }

    pub fn len(&self) -> usize {
        self.starts.len()
    }
}

/// perf's demangling of user symbols: C++ without parameters, Rust legacy names without their hash.
pub fn demangle(name: &str) -> Cow<'_, str> {
    // Rust: v0 names (_R), and legacy names (_ZN...17h<hash>E, possibly with a .llvm. suffix),
    // printed without their hash as perf's rust_demangle_sym does
    if name.starts_with("_R") || name.starts_with("_ZN") {
        if let Ok(d) = rustc_demangle::try_demangle(name) {
            let plain = format!("{:#}", d);
            if name.starts_with("_R") || plain != format!("{}", d) {
                return Cow::Owned(plain);
            }
        }
    }
    if name.starts_with("_Z") {
        if let Ok(sym) = cpp_demangle::Symbol::new(name.as_bytes()) {
            let opts = cpp_demangle::DemangleOptions::new().no_params().no_return_type();
            if let Ok(s) = sym.demangle_with_options(&opts) {
                return Cow::Owned(s);
            }
        }
    }
    Cow::Borrowed(name)
}

fn symbols_of<'d>(file: &object::File<'d>, dynamic: bool) -> Vec<RawSym<'static>> {
    let mut out = Vec::new();
    let iter: Box<dyn Iterator<Item = object::Symbol<'d, '_>>> =
        if dynamic { Box::new(file.dynamic_symbols()) } else { Box::new(file.symbols()) };
    for s in iter {
        // perf's dso__load_sym: functions, and labels (STT_NOTYPE, default visibility) in a section
        // whose name says text (ld.so's _dl_start_user); never undefined or absolute symbols
        let object::SymbolSection::Section(sec) = s.section() else { continue };
        match s.kind() {
            SymbolKind::Text => {}
            SymbolKind::Unknown => {
                let default_vis = matches!(s.flags(), object::SymbolFlags::Elf { st_info, st_other }
                    if st_info.0 & 0xf == 0 && st_other.0 & 3 == 0);
                let text = file.section_by_index(sec).ok().and_then(|x| x.name().ok().map(|n| n.contains("text"))).unwrap_or(false);
                if !(default_vis && text) {
                    continue;
                }
            }
            _ => continue,
        }
        let name = match s.name() {
            Ok(n) if !n.is_empty() => n,
            _ => continue,
        };
        let bind = if s.is_weak() {
            Bind::Weak
        } else if s.is_global() {
            Bind::Global
        } else {
            Bind::Local
        };
        let start = s.address();
        out.push(RawSym { start, end: start + s.size(), bind, name: Cow::Owned(name.to_string()) });
    }
    out
}

/// perf's PLT names (dso__synthesize_plt_symbols): `.plt`'s header, then one `name@plt` entry per
/// `.rela.plt` relocation, each sh_entsize long (in `.plt.sec` when there is one).
fn plt_symbols(file: &object::File, out: &mut Vec<RawSym<'static>>) {
    let plt = match file.section_by_name(".plt") {
        Some(s) => s,
        None => return,
    };
    let rela = match file.section_by_name(".rela.plt") {
        Some(s) => s,
        None => return,
    };
    let dynsym = match file.dynamic_symbol_table() {
        Some(t) => t,
        None => return,
    };
    let entsize = match file {
        object::File::Elf64(f) => {
            let idx = plt.index();
            f.elf_section_table()
                .section(idx)
                .map(|h| object::read::elf::SectionHeader::sh_entsize(h, f.endian()))
                .unwrap_or(16)
        }
        _ => 16,
    };
    let entsize = if entsize == 0 { 16 } else { entsize };
    let data = match rela.data() {
        Ok(d) => d,
        Err(_) => return,
    };
    let (mut at, header) = match file.section_by_name(".plt.sec") {
        Some(sec) => (sec.address(), 0),
        None => (plt.address() + entsize, entsize),
    };
    if header > 0 {
        out.push(RawSym { start: plt.address(), end: plt.address() + header, bind: Bind::Global, name: ".plt".into() });
    }
    for rel in data.chunks_exact(24) {
        let info = u64::from_le_bytes(rel[8..16].try_into().unwrap());
        let idx = (info >> 32) as usize;
        let name = dynsym
            .symbol_by_index(object::SymbolIndex(idx))
            .ok()
            .and_then(|s| s.name().ok().map(|n| demangle(n).into_owned()))
            .unwrap_or_default();
        out.push(RawSym { start: at, end: at + entsize, bind: Bind::Global, name: Cow::Owned(format!("{name}@plt")) });
        at += entsize;
    }
}

/// What qprof needs of one object (a dso): its symbols and its unwind sections.
pub struct ObjectInfo {
    pub symbols: Option<SymTab>, // None: not loaded yet
    /// (p_offset, p_vaddr, p_filesz) of its PT_LOAD segments, from the data file
    pub loads: Vec<(u64, u64, u64)>,
    pub unwind: Option<UnwindSections>,
    pub symbol_source: String,
}

pub struct UnwindSections {
    pub text_svma: Option<Range<u64>>,
    pub text: Option<Slice>,
    pub eh_frame_svma: Option<Range<u64>>,
    pub eh_frame: Option<Slice>,
    pub eh_frame_hdr_svma: Option<Range<u64>>,
    pub eh_frame_hdr: Option<Slice>,
    pub debug_frame: Option<Slice>,
    pub got_svma: Option<Range<u64>>,
}

fn section_slice(bytes: &Bytes, file: &object::File, name: &str) -> Option<(Range<u64>, Slice)> {
    let s = file.section_by_name(name)?;
    let (off, size) = s.file_range()?;
    let range = off as usize..(off + size) as usize;
    if range.end > bytes.len() || size == 0 {
        return None;
    }
    Some((s.address()..s.address() + s.size(), Slice { bytes: bytes.clone(), range }))
}

fn build_id_of(file: &object::File) -> Option<Vec<u8>> {
    file.build_id().ok().flatten().map(|b| b.to_vec())
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Candidate symbol files for an object at `path` with `build_id`, in perf's order.
fn candidates(path: &str, build_id: Option<&str>, data: Option<&object::File>, root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Some(file) = data {
        if let Ok(Some((link, _crc))) = file.gnu_debuglink() {
            let link = String::from_utf8_lossy(link).into_owned();
            let dir = Path::new(path).parent().map(|p| p.to_string_lossy().into_owned()).unwrap_or_default();
            for c in [link.clone(), format!("{dir}/{link}"), format!("{dir}/.debug/{link}"), format!("/usr/lib/debug{dir}/{link}")] {
                if Path::new(&c).is_file() {
                    out.push(PathBuf::from(c));
                    break;
                }
            }
        }
    }
    if let Some(id) = build_id {
        if id.len() > 2 {
            let base = root.join(".build-id").join(&id[..2]).join(&id[2..]);
            out.push(base.join("elf"));
            out.push(base.join("debug"));
            out.push(PathBuf::from(format!("/usr/lib/debug/.build-id/{}/{}.debug", &id[..2], &id[2..])));
        }
    }
    out.push(PathBuf::from(path));
    out
}

/// Load an object as perf would: `data` is the file the process mapped (already chosen: the build-id
/// cache's copy or the path), `build_id` what perf knows of it.
/// `with_symbols` false: the unwind sections only (symbols None), unless the object has no
/// `.eh_frame_hdr` (the `.debug_frame` fallback comes from the symbol file).
pub fn load_object(path: &str, data: Option<Bytes>, build_id: Option<&str>, root: &Path, with_symbols: bool) -> ObjectInfo {
    let parsed = data.as_ref().and_then(|b| object::File::parse(&**b).ok());
    let mut loads = Vec::new();
    let mut unwind = None;
    if let (Some(bytes), Some(file)) = (data.as_ref(), parsed.as_ref()) {
        for seg in file.segments() {
            let (off, size) = seg.file_range();
            loads.push((off, seg.address(), size));
        }
        let text = section_slice(bytes, file, ".text");
        let eh = section_slice(bytes, file, ".eh_frame");
        let hdr = section_slice(bytes, file, ".eh_frame_hdr");
        let got = file.section_by_name(".got").map(|s| s.address()..s.address() + s.size());
        unwind = Some(UnwindSections {
            text_svma: text.as_ref().map(|t| t.0.clone()),
            text: text.map(|t| t.1),
            eh_frame_svma: eh.as_ref().map(|t| t.0.clone()),
            eh_frame: eh.map(|t| t.1),
            eh_frame_hdr_svma: hdr.as_ref().map(|t| t.0.clone()),
            eh_frame_hdr: hdr.map(|t| t.1),
            debug_frame: None,
            got_svma: got,
        });
    }
    if !with_symbols && unwind.as_ref().is_some_and(|u| u.eh_frame_hdr.is_some()) {
        return ObjectInfo { symbols: None, loads, unwind, symbol_source: String::new() };
    }
    // symbols: the first candidate with a .symtab; else the first with a .dynsym
    let mut syms: Option<(Vec<RawSym<'static>>, String, Bytes)> = None;
    let mut runtime: Option<(Bytes, String)> = None;
    let files: Vec<(PathBuf, Option<Bytes>)> = if path.starts_with('[') {
        vec![(PathBuf::from(path), data.clone())] // [vdso]: the image itself
    } else {
        candidates(path, build_id, parsed.as_ref(), root).into_iter().map(|c| (c, None)).collect()
    };
    for (cand, given) in files {
        let bytes = match given.or_else(|| map_file(&cand)) {
            Some(b) => b,
            None => continue,
        };
        let file = match object::File::parse(&*bytes) {
            Ok(f) => f,
            Err(_) => continue,
        };
        if let Some(id) = build_id {
            match build_id_of(&file) {
                Some(b) if hex(&b) == id => {}
                _ => continue, // perf refuses an image with another (or no) build-id
            }
        }
        let has_symtab = file.symbol_table().is_some() && file.symbols().any(|s| s.kind() == SymbolKind::Text);
        let has_dynsym = file.dynamic_symbol_table().is_some()
            && file.section_by_name(".dynsym").map(|s| s.file_range().is_some()).unwrap_or(false);
        let name = cand.to_string_lossy().into_owned();
        if syms.is_none() && has_symtab {
            syms = Some((symbols_of(&file, false), name.clone(), bytes.clone()));
        }
        if runtime.is_none() && has_dynsym {
            runtime = Some((bytes.clone(), name));
        }
        if syms.is_some() && runtime.is_some() {
            break;
        }
    }
    let mut source = String::from("none");
    let mut raw = Vec::new();
    let mut sym_bytes = None;
    if let Some((r, name, b)) = syms {
        raw = r;
        source = name;
        sym_bytes = Some(b);
    } else if let Some((b, name)) = runtime.as_ref() {
        if let Ok(file) = object::File::parse(&**b) {
            raw = symbols_of(&file, true);
        }
        source = format!("{name} (dynsym)");
    }
    let mut plt = Vec::new();
    if let Some((b, _)) = runtime.as_ref() {
        if let Ok(file) = object::File::parse(&**b) {
            plt_symbols(&file, &mut plt);
        }
    }
    // no .eh_frame_hdr: perf's libunwind reads .debug_frame from the symbol file
    if let Some(u) = unwind.as_mut() {
        if u.eh_frame_hdr.is_none() {
            let src = sym_bytes.or(data.clone());
            if let Some(b) = src {
                if let Ok(f) = object::File::parse(&*b) {
                    u.debug_frame = section_slice(&b, &f, ".debug_frame").map(|t| t.1);
                }
            }
        }
    }
    ObjectInfo { symbols: Some(SymTab::build(raw, false, plt)), loads, unwind, symbol_source: source }
}

/// Build-id of the ELF file at `path`, if it has one.
pub fn file_build_id(path: &Path) -> Option<String> {
    let b = map_file(path)?;
    let f = object::File::parse(&*b).ok()?;
    build_id_of(&f).map(|v| hex(&v))
}

/// Kernel symbols from a kallsyms file: (kernel's table, per module name its table).
pub fn load_kallsyms(path: &Path) -> (SymTab, std::collections::HashMap<String, SymTab>) {
    // "ADDR TYPE NAME[\t[MODULE]]" a line; parsed by hand (122k lines: the parse is half the cost)
    let text = std::fs::read(path).unwrap_or_default();
    let mut kernel = Vec::with_capacity(text.len() / 40);
    let mut modules: std::collections::HashMap<&str, Vec<RawSym<'_>>> = Default::default();
    for line in text.split(|&b| b == b'\n') {
        let Some(sp) = line.iter().position(|&b| b == b' ') else { continue };
        if line.len() < sp + 4 {
            continue;
        }
        let mut addr = 0u64;
        let mut ok = sp > 0 && sp <= 16;
        for &c in &line[..sp] {
            let d = match c {
                b'0'..=b'9' => c - b'0',
                b'a'..=b'f' => c - b'a' + 10,
                b'A'..=b'F' => c - b'A' + 10,
                _ => {
                    ok = false;
                    break;
                }
            };
            addr = addr << 4 | d as u64;
        }
        let ty = line[sp + 1];
        if !ok || !matches!(ty.to_ascii_uppercase(), b'T' | b'W' | b'D' | b'B') {
            continue;
        }
        let rest = &line[sp + 3..];
        let (name, module) = match rest.iter().position(|&b| b == b'\t') {
            Some(tab) => (&rest[..tab], Some(&rest[tab + 1..])),
            None => (rest, None),
        };
        let (Ok(name), module) = (std::str::from_utf8(name), module.and_then(|m| std::str::from_utf8(m).ok())) else { continue };
        let bind = match ty {
            b'W' | b'w' => Bind::Weak,
            c if c.is_ascii_uppercase() => Bind::Global,
            _ => Bind::Local,
        };
        let sym = RawSym { start: addr, end: addr, bind, name: Cow::Borrowed(name) };
        match module {
            Some(m) if m.starts_with('[') => modules.entry(m.trim().trim_matches(|c| c == '[' || c == ']')).or_default().push(sym),
            _ => kernel.push(sym),
        }
    }
    let mods = modules.into_iter().map(|(k, v)| (k.to_string(), SymTab::build(v, true, Vec::new()))).collect();
    (SymTab::build(kernel, true, Vec::new()), mods)
}

/// The vdso of this process (the same kernel's image perf reads for `[vdso]`).
pub fn own_vdso() -> Option<Bytes> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    for line in maps.lines() {
        if line.ends_with("[vdso]") {
            let range = line.split_whitespace().next()?;
            let (a, b) = range.split_once('-')?;
            let (a, b) = (u64::from_str_radix(a, 16).ok()?, u64::from_str_radix(b, 16).ok()?);
            // SAFETY: the vdso is mapped readable in every process for its whole range.
            let bytes = unsafe { std::slice::from_raw_parts(a as *const u8, (b - a) as usize) };
            return Some(Bytes::Owned(Arc::new(bytes.to_vec())));
        }
    }
    None
}

impl SymTab {
    /// A table from (start, size, name) ranges (a JIT's map), sized as given.
    pub fn from_ranges(ranges: Vec<(u64, u64, String)>) -> SymTab {
        let raw = ranges.into_iter().map(|(a, s, n)| RawSym { start: a, end: a + s, bind: Bind::Global, name: Cow::Owned(n) }).collect();
        SymTab::build(raw, false, Vec::new())
    }
}
