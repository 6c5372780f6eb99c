//! qprof-perffold: the folded stacks of some processes' samples in one perf.data file, as qprof's
//! StackRecord holds them, read in-process instead of through `perf script`'s text.
//!
//! What it reproduces of `perf script -F comm,pid,tid,time,period,ip,sym,dso --no-inline` (perf 6.1)
//! and qprof's reading of it (collectors/perfscript.py): the kernel part of the callchain named
//! from /proc/kallsyms; the user part unwound from the sample's registers and stack copy with the
//! objects' DWARF CFI (framehop; perf uses libunwind) or, for frame-pointer captures, the
//! callchain itself; caller frames looked up at their return address - 1; symbols from the file
//! perf would read (symbols.rs); a stack perf could not finish ends in `[unknown]`.
//!
//! Output: one JSON array a line per folded stack, in first-occurrence order: [pid, tid, comm,
//! samples, period, [frame ids leaf first], [bin, period, bin, period...], first ns, last ns], each
//! frame named by a line ["f", id, symbol, object] before its first use, then one line
//! {"qprof_perffold": {statistics}}. Several files (a run's chunks, in order) fold into one
//! output: kallsyms and the objects' tables are read once. See README.md.

mod symbols;

use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64};
use framehop::{ExplicitModuleSectionInfo, FrameAddress, Module, Unwinder};
use linux_perf_data::{PerfFileReader, PerfFileRecord};
use linux_perf_data::linux_perf_event_reader::{EventRecord, Mmap2FileId};
use std::collections::{HashMap as StdHashMap, HashSet as StdHashSet};
use std::hash::{BuildHasherDefault, Hasher};

/// A multiply-rotate hasher for the folder's own keys (integers, short vectors of them): SipHash's
/// defence against chosen keys costs several percent here and guards nothing.
#[derive(Default, Clone, Copy)]
struct FastHasher(u64);

impl Hasher for FastHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(b));
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(5) ^ v).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    fn write_u32(&mut self, v: u32) {
        self.write_u64(v as u64)
    }
    fn write_i32(&mut self, v: i32) {
        self.write_u64(v as u32 as u64)
    }
    fn write_usize(&mut self, v: usize) {
        self.write_u64(v as u64)
    }
}

type HashMap<K, V> = StdHashMap<K, V, BuildHasherDefault<FastHasher>>;
type HashSet<K> = StdHashSet<K, BuildHasherDefault<FastHasher>>;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use symbols::{Bytes, ObjectInfo, Slice, SymTab};

const BIN_NS: u64 = 100_000_000; // archive.stacks.BIN_S
const KERNEL_DSO: &str = "[kernel.kallsyms]";
const UNKNOWN: &str = "[unknown]";
const KERNEL_START: u64 = 0xffff_8000_0000_0000;
const PERF_CONTEXT_MAX: u64 = -4095i64 as u64;
const PERF_CONTEXT_KERNEL: u64 = -128i64 as u64;
const PERF_CONTEXT_USER: u64 = -512i64 as u64;
const PERF_CONTEXT_HV: u64 = -32i64 as u64;
const MAX_STACK: usize = 127; // perf's default max stack (kernel.perf_event_max_stack)
// x86-64 perf register numbers
const REG_BP: u64 = 6;
const REG_SP: u64 = 7;
const REG_IP: u64 = 8;

struct Args {
    pids: HashSet<i32>,
    root: PathBuf,
    window: (Option<u64>, Option<u64>),
    kallsyms: PathBuf,
    files: Vec<PathBuf>,
    each: bool,
    copy_limit: Option<u64>, // unwind as if perf had copied at most this many bytes of each stack
    context: Option<PathBuf>, // the recorder's file before the first: its mappings, not its samples
    serve: bool,              // files named on stdin, one a line, each folded and written as it comes
}

fn usage() -> ! {
    eprintln!("usage: qprof-perffold --pids PID[,PID...] [--buildid-dir ROOT] [--time START_NS,END_NS] [--kallsyms FILE] [--each] [--copy-limit BYTES] [--context PERF_DATA] (PERF_DATA... | --serve)");
    std::process::exit(2)
}

fn parse_args() -> Args {
    let mut a = Args {
        pids: HashSet::default(),
        root: std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| "/root".into()).join(".cache/qprof/symbols"),
        window: (None, None),
        kallsyms: "/proc/kallsyms".into(),
        files: Vec::new(),
        each: false,
        copy_limit: None,
        context: None,
        serve: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--pids" => {
                for p in it.next().unwrap_or_else(|| usage()).split(',').filter(|s| !s.is_empty()) {
                    a.pids.insert(p.parse().unwrap_or_else(|_| usage()));
                }
            }
            "--buildid-dir" => a.root = it.next().unwrap_or_else(|| usage()).into(),
            "--kallsyms" => a.kallsyms = it.next().unwrap_or_else(|| usage()).into(),
            "--time" => {
                let w = it.next().unwrap_or_else(|| usage());
                let (s, e) = w.split_once(',').unwrap_or_else(|| usage());
                let num = |x: &str| if x.is_empty() { None } else { Some(x.parse::<u64>().unwrap_or_else(|_| usage())) };
                a.window = (num(s), num(e));
            }
            "--each" => a.each = true, // one line per sample (time, tid, frames), not folded: for comparisons
            // what a smaller DWARF copy would have given (the stack copy's sizing is checked by it)
            "--copy-limit" => a.copy_limit = Some(it.next().and_then(|x| x.parse().ok()).unwrap_or_else(|| usage())),
            // a chunk's processes that exited while perf wrote the switch's mappings: the file before has them
            "--context" => a.context = Some(it.next().unwrap_or_else(|| usage()).into()),
            // a recorder's chunks as they finish: kallsyms, the objects' tables and the processes'
            // mappings are read once for all of them
            "--serve" => a.serve = true,
            "-h" | "--help" => usage(),
            _ if !arg.starts_with("--") => a.files.push(PathBuf::from(arg)),
            _ => usage(),
        }
    }
    if a.pids.is_empty() || a.files.is_empty() != a.serve || (a.serve && a.each) {
        usage();
    }
    a
}

/// One object as perf knows it: its name and build-id.
struct Dso {
    name: String,
    build_id: Option<String>,
    kind: DsoKind,
    info: Option<ObjectInfo>, // loaded on first use
}

#[derive(Clone, Copy, PartialEq)]
enum DsoKind {
    File,
    Vdso,
    Jit(i32), // /tmp/perf-PID.map: an executable anonymous mapping
    NoSymbols,
}

#[derive(Clone)]
struct Mapping {
    start: u64,
    end: u64,
    pgoff: u64,
    dso: usize,
    exec: bool,
    id: u32,
}

#[derive(Default)]
struct Process {
    maps: Vec<Mapping>, // sorted by start, not overlapping
    unwinder: Option<UnwinderX86_64<Slice>>,
    added: HashSet<u32>, // mappings whose module the unwinder has
    stale: bool,
}

impl Process {
    fn insert(&mut self, m: Mapping) {
        // perf's maps__fixup_overlappings: what the new mapping covers of older ones goes
        let lo = self.maps.partition_point(|x| x.end <= m.start);
        let hi = self.maps.partition_point(|x| x.start < m.end);
        let mut pieces = Vec::new();
        for old in &self.maps[lo..hi.max(lo)] {
            if old.start < m.start {
                pieces.push(Mapping { end: m.start, ..old.clone() });
            }
            if old.end > m.end {
                pieces.push(Mapping { start: m.end, pgoff: old.pgoff + (m.end - old.start), ..old.clone() });
            }
        }
        let at = pieces.iter().filter(|p| p.start < m.start).count();
        pieces.insert(at, m);
        self.maps.splice(lo..hi.max(lo), pieces);
        self.stale = true;
    }

    fn find(&self, addr: u64) -> Option<&Mapping> {
        let i = self.maps.partition_point(|m| m.start <= addr);
        if i == 0 {
            return None;
        }
        let m = &self.maps[i - 1];
        (addr < m.end).then_some(m)
    }
}

#[derive(Default)]
struct Stats {
    samples: u64,
    user_stacks: u64,
    truncated: u64,
    no_user_stack: u64,
    discarded: u64,
    errors: u64,
    records: u64,
    error_examples: Vec<String>,
    stack_need: std::collections::BTreeMap<i32, StackNeed>,
}

/// How much of its DWARF stack copies a process's unwinding read: how often the copy fell short (the
/// callers past it are lost), and what a smaller copy would have cut.
#[derive(Default)]
struct StackNeed {
    copied: u64,         // the largest copy seen (the kernel copies less near the stack's top)
    truncated: u64,      // unwinding went past the copy's end: the need is more than `copied`
    buckets: Vec<u64>,   // finished stacks by bytes read, NEED_BUCKET each: [0] up to NEED_BUCKET
}

const NEED_BUCKET: u64 = 256;

struct Slot {
    samples: u64,
    period: u64,
    bins: Vec<(u64, u64)>,
    first: u64,
    last: u64,
    key: usize,
}

struct Folder {
    args: Args,
    dsos: Vec<Dso>,
    dso_ids: HashMap<(String, Option<String>), usize>,
    build_ids: HashMap<String, String>, // path -> build-id from the header
    procs: HashMap<i32, Process>,
    comms: HashMap<i32, String>,
    kallsyms: Option<std::thread::JoinHandle<(SymTab, StdHashMap<String, SymTab>)>>,
    ktabs: (SymTab, StdHashMap<String, SymTab>),
    kpending: Vec<(u32, u64)>,
    kernel_maps: Vec<(u64, u64, String)>, // module mappings: start, end, module name
    vdso: Option<Bytes>,
    frames: Vec<(String, String)>,
    frames_sent: Vec<bool>, // frames whose names were written (write)
    frame_ids: HashMap<(String, String), u32>,
    addr_cache: HashMap<(u32, u64), u32>,
    kaddr_cache: HashMap<u64, u32>,
    unknown: u32,
    next_map_id: u32,
    stacks: HashMap<(i32, i32, u32, Vec<u32>), usize>,
    slots: Vec<Slot>,
    keys: Vec<(i32, i32, u32, Vec<u32>)>,
    comm_ids: HashMap<String, u32>,
    comm_names: Vec<String>,
    cache: CacheX86_64,
    fde_cache: HashMap<(u32, u64), bool>,
    ends: HashSet<(u32, u64)>,
    pid_offset: Option<usize>, // where a sample record's pid is, when every event has one layout
    context: bool,             // reading the --context file: its samples are not this fold's
    stats: Stats,
    seen: HashSet<i32>, // processes with records in the file being read (--serve: the others are gone)
}

fn clean_symbol(s: &str) -> String {
    // qprof's _strip_symoff's version half: `name@GLIBC_2.2.5` / `name@@GLIBC_2.17` -> name
    if let Some(at) = s.rfind('@') {
        let head = s[..at].trim_end_matches('@');
        let ver = &s[at + 1..];
        let mut parts = ver.rsplitn(2, '_');
        let num = parts.next().unwrap_or("");
        let tag = parts.next().unwrap_or("");
        let tag_ok = !tag.is_empty()
            && tag.chars().next().is_some_and(|c| c.is_ascii_uppercase())
            && tag.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
        let num_ok = num.chars().next().is_some_and(|c| c.is_ascii_digit()) && num.chars().all(|c| c.is_ascii_digit() || c == '.');
        if tag_ok && num_ok {
            return head.to_string();
        }
    }
    s.to_string()
}

impl Folder {
    fn error(&mut self, what: String) {
        if self.context {
            // the context file was (or will be) folded itself: its damage is counted there
            return;
        }
        self.stats.errors += 1;
        if self.stats.error_examples.len() < 5 {
            self.stats.error_examples.push(what);
        }
    }

    fn frame_id(&mut self, sym: &str, dso: &str) -> u32 {
        let key = (sym.to_string(), dso.to_string());
        if let Some(&id) = self.frame_ids.get(&key) {
            return id;
        }
        let id = self.frames.len() as u32;
        self.frames.push(key.clone());
        self.frame_ids.insert(key, id);
        id
    }

    fn dso_for(&mut self, path: &str, build_id: Option<String>, pid: i32, exec: bool) -> usize {
        let anon = path == "//anon" || path.starts_with("/dev/zero") || path.starts_with("/anon_hugepage");
        let no_dso = path.starts_with("[stack") || path.starts_with("/SYSV") || path == "[heap]";
        let (name, kind) = if (anon || no_dso) && exec {
            (format!("/tmp/perf-{pid}.map"), DsoKind::Jit(pid))
        } else if anon || no_dso || path.starts_with("[vsyscall") {
            (path.to_string(), DsoKind::NoSymbols)
        } else if path == "[vdso]" {
            (path.to_string(), DsoKind::Vdso)
        } else {
            (path.to_string(), DsoKind::File)
        };
        let build_id = if kind == DsoKind::File { build_id.or_else(|| self.build_ids.get(path).cloned()) } else { None };
        let key = (name.clone(), build_id.clone());
        if let Some(&i) = self.dso_ids.get(&key) {
            return i;
        }
        self.dsos.push(Dso { name, build_id, kind, info: None });
        self.dso_ids.insert(key, self.dsos.len() - 1);
        self.dsos.len() - 1
    }

    fn load(&mut self, d: usize, with_symbols: bool) {
        if let Some(info) = &self.dsos[d].info {
            if info.symbols.is_some() || !with_symbols {
                return;
            }
        }
        let dso = &self.dsos[d];
        let info = match dso.kind {
            DsoKind::File => {
                // perf's data file: the build-id cache's copy, else the file at its path (its build-id
                // read from its note when the records gave none)
                let mut build_id = dso.build_id.clone();
                let path = dso.name.trim_end_matches(" (deleted)").to_string();
                if build_id.is_none() {
                    build_id = symbols::file_build_id(Path::new(&path));
                }
                let cached = build_id.as_ref().and_then(|id| {
                    symbols::map_file(&self.args.root.join(".build-id").join(&id[..2]).join(&id[2..]).join("elf"))
                });
                let data = cached.or_else(|| {
                    let b = symbols::map_file(Path::new(&path))?;
                    match (&build_id, object::File::parse(&*b).ok().and_then(|f| object::Object::build_id(&f).ok().flatten().map(symbols::hex))) {
                        (Some(want), Some(have)) if *want != have => None, // another file at that path
                        _ => Some(b),
                    }
                });
                symbols::load_object(&path, data, build_id.as_deref(), &self.args.root, with_symbols)
            }
            DsoKind::Vdso => symbols::load_object("[vdso]", self.vdso.clone(), None, &self.args.root, true),
            DsoKind::Jit(pid) => ObjectInfo { symbols: Some(jit_map(pid)), loads: vec![], unwind: None, symbol_source: String::new() },
            DsoKind::NoSymbols => ObjectInfo { symbols: Some(SymTab::default()), loads: vec![], unwind: None, symbol_source: String::new() },
        };
        self.dsos[d].info = Some(info);
    }

    /// The object's own address (SVMA) of `addr` in mapping `m`.
    fn svma(&self, m: &Mapping, addr: u64) -> u64 {
        let info = self.dsos[m.dso].info.as_ref().unwrap();
        match self.dsos[m.dso].kind {
            DsoKind::Jit(_) | DsoKind::NoSymbols => return addr,
            _ => {}
        }
        let off = addr - m.start + m.pgoff; // file offset
        for &(p_off, p_vaddr, p_filesz) in &info.loads {
            if off >= p_off && off < p_off + p_filesz.max(1) {
                return off - p_off + p_vaddr;
            }
        }
        for &(p_off, p_vaddr, _) in &info.loads {
            if p_off & !0xfff == m.pgoff {
                return off.wrapping_sub(p_off).wrapping_add(p_vaddr);
            }
        }
        off
    }

    fn user_frame(&mut self, pid: i32, addr: u64) -> u32 {
        let m = match self.procs.get(&pid).and_then(|p| p.find(addr)) {
            Some(m) => m.clone(),
            None => return self.unknown,
        };
        if let Some(&id) = self.addr_cache.get(&(m.id, addr)) {
            return id;
        }
        self.load(m.dso, true);
        let svma = self.svma(&m, addr);
        let dso = &self.dsos[m.dso];
        let sym = dso.info.as_ref().unwrap().symbols.as_ref().and_then(|t| t.find(svma)).map(|s| clean_symbol(&symbols::demangle(s))).unwrap_or_else(|| UNKNOWN.to_string());
        let name = dso.name.clone();
        let id = self.frame_id(&sym, &name);
        self.addr_cache.insert((m.id, addr), id);
        id
    }

    /// A kernel address's frame. /proc/kallsyms takes tens of milliseconds to read (the kernel writes
    /// it), so it is read by another thread while the samples are; until it is in, a kernel address
    /// gets a provisional frame of its own, named and merged by `resolve_kernel`.
    fn kernel_frame(&mut self, addr: u64) -> u32 {
        if let Some(&id) = self.kaddr_cache.get(&addr) {
            return id;
        }
        let id = if self.args.each || self.kallsyms.is_none() {
            // kallsyms is in (a file served after the first): named now
            let (sym, dso) = self.kernel_name(addr);
            self.frame_id(&sym, &dso)
        } else {
            let id = self.frames.len() as u32;
            self.frames.push((String::new(), String::new()));
            self.kpending.push((id, addr));
            id
        };
        self.kaddr_cache.insert(addr, id);
        id
    }

    fn kernel_name(&mut self, addr: u64) -> (String, String) {
        if let Some(h) = self.kallsyms.take() {
            self.ktabs = h.join().unwrap_or_default();
        }
        let module = self.kernel_maps.iter().find(|(s, e, _)| *s <= addr && addr < *e).map(|x| x.2.clone());
        match module {
            Some(name) => {
                let sym = self.ktabs.1.get(&name).and_then(|t| t.find(addr)).map(|s| s.to_string());
                (sym.unwrap_or_else(|| UNKNOWN.into()), format!("[{name}]"))
            }
            None => (self.ktabs.0.find(addr).map(|s| s.to_string()).unwrap_or_else(|| UNKNOWN.into()), KERNEL_DSO.to_string()),
        }
    }

    /// Name the provisional kernel frames and merge the stacks that became one.
    fn resolve_kernel(&mut self) {
        if self.kpending.is_empty() {
            return;
        }
        let mut remap: Vec<u32> = (0..self.frames.len() as u32).collect();
        for (id, addr) in std::mem::take(&mut self.kpending) {
            let (sym, dso) = self.kernel_name(addr);
            remap[id as usize] = self.frame_id(&sym, &dso);
        }
        for id in self.kaddr_cache.values_mut() {
            // a provisional frame's address is named from now on (--serve: the next files)
            if let Some(&to) = remap.get(*id as usize) {
                *id = to;
            }
        }
        let slots = std::mem::take(&mut self.slots);
        let keys = std::mem::take(&mut self.keys);
        self.stacks.clear();
        for mut slot in slots {
            let (pid, tid, comm, frames) = &keys[slot.key];
            let key = (*pid, *tid, *comm, frames.iter().map(|f| remap[*f as usize]).collect::<Vec<u32>>());
            match self.stacks.get(&key) {
                Some(&i) => {
                    let into = &mut self.slots[i];
                    into.samples += slot.samples;
                    into.period += slot.period;
                    into.first = into.first.min(slot.first);
                    into.last = into.last.max(slot.last);
                    for (b, p) in slot.bins {
                        match into.bins.iter_mut().find(|x| x.0 == b) {
                            Some(x) => x.1 += p,
                            None => into.bins.push((b, p)),
                        }
                    }
                }
                None => {
                    let i = self.slots.len();
                    slot.key = i;
                    self.keys.push(key.clone());
                    self.stacks.insert(key, i);
                    self.slots.push(slot);
                }
            }
        }
    }

    /// After a served file is written: its counts go, and so do the processes it had no record of
    /// (perf writes every live process's mappings into each new file), targets but for: one that
    /// exited as perf switched files still has samples in the file after.
    fn next_file(&mut self) {
        self.slots.clear();
        self.keys.clear();
        self.stacks.clear();
        self.stats = Stats::default();
        let seen = std::mem::take(&mut self.seen);
        let pids = &self.args.pids;
        self.procs.retain(|pid, _| seen.contains(pid) || pids.contains(pid));
    }

    /// Give the process's unwinder the module of the mapping at `addr`, when it does not have it:
    /// modules are added as the unwinding meets them, so that the objects a process maps but never
    /// runs in (a parent's before exec) are never read.
    fn ensure_module(&mut self, pid: i32, addr: u64) {
        let Some(p) = self.procs.get_mut(&pid) else { return };
        if p.stale || p.unwinder.is_none() {
            p.unwinder = Some(UnwinderX86_64::new());
            p.added.clear();
            p.stale = false;
        }
        let Some(m) = p.find(addr).cloned() else { return };
        if !m.exec || !p.added.insert(m.id) {
            return;
        }
        self.load(m.dso, false);
        // the module's bias from a point inside the mapping: its first page can also lie in the
        // file range of the segment before (lld puts .text at a vaddr 0x1000 above its offset)
        let mid = m.start + (m.end - m.start) / 2;
        let base = mid.wrapping_sub(self.svma(&m, mid));
        let dso = &self.dsos[m.dso];
        let Some(u) = dso.info.as_ref().and_then(|i| i.unwind.as_ref()) else { return };
        let info = ExplicitModuleSectionInfo {
            base_svma: 0,
            text_svma: u.text_svma.clone(),
            text: u.text.clone(),
            got_svma: u.got_svma.clone(),
            eh_frame_svma: u.eh_frame_svma.clone(),
            eh_frame: u.eh_frame.clone(),
            eh_frame_hdr_svma: u.eh_frame_hdr_svma.clone(),
            eh_frame_hdr: u.eh_frame_hdr.clone(),
            debug_frame: u.debug_frame.clone(),
            ..Default::default()
        };
        let module = Module::new(dso.name.clone(), m.start..m.end, base, info);
        if let Some(unwinder) = self.procs.get_mut(&pid).and_then(|p| p.unwinder.as_mut()) {
            unwinder.add_module(module);
        }
    }

    fn comm_id(&mut self, tid: i32) -> u32 {
        let name = self.comms.get(&tid).cloned().unwrap_or_else(|| format!(":{tid}"));
        if let Some(&i) = self.comm_ids.get(&name) {
            return i;
        }
        self.comm_names.push(name.clone());
        self.comm_ids.insert(name, self.comm_names.len() as u32 - 1);
        self.comm_names.len() as u32 - 1
    }

    fn sample(&mut self, s: &linux_perf_data::linux_perf_event_reader::SampleRecord) {
        let (Some(pid), Some(tid)) = (s.pid, s.tid) else { return };
        if !self.args.pids.contains(&pid) {
            return;
        }
        let time = s.timestamp.unwrap_or(0);
        if self.args.window.0.is_some_and(|t| time < t) || self.args.window.1.is_some_and(|t| time > t) {
            return;
        }
        self.stats.samples += 1;
        let period = s.period.unwrap_or(1);
        let mut frames: Vec<u32> = Vec::with_capacity(32);
        let mut kernel = true;
        if let Some(chain) = &s.callchain {
            for i in 0..chain.len() {
                let a = chain.get(i).unwrap();
                if a >= PERF_CONTEXT_MAX {
                    match a {
                        PERF_CONTEXT_KERNEL | PERF_CONTEXT_HV => kernel = true,
                        PERF_CONTEXT_USER => kernel = false,
                        _ => {
                            // perf 6.1 takes any other context (a -1 the kernel ends a user chain
                            // with, a guest's) for a corrupted chain and discards all of it
                            frames.clear();
                            self.stats.discarded += 1;
                            break;
                        }
                    }
                    continue;
                }
                if frames.len() >= MAX_STACK {
                    break;
                }
                let f = if kernel || a >= KERNEL_START { self.kernel_frame(a) } else { self.user_frame(pid, a) };
                frames.push(f);
            }
        } else if let Some(ip) = s.ip {
            let f = if ip >= KERNEL_START { self.kernel_frame(ip) } else { self.user_frame(pid, ip) };
            frames.push(f);
        }
        match (&s.user_regs, &s.user_stack) {
            (Some(regs), Some((stack, dyn_size))) if *dyn_size > 0 => {
                self.stats.user_stacks += 1;
                self.unwind(pid, regs, stack, *dyn_size, &mut frames);
            }
            (Some(_), _) | (_, Some(_)) => self.stats.no_user_stack += 1,
            _ => {}
        }
        let comm = self.comm_id(tid);
        if self.args.each {
            let mut line = format!("{{\"time\":{time},\"tid\":{tid},\"frames\":[");
            for (i, f) in frames.iter().enumerate() {
                let (s, d) = &self.frames[*f as usize];
                line += &format!("{}[{:?},{:?}]", if i > 0 { "," } else { "" }, s, d);
            }
            println!("{line}]}}");
            return;
        }
        let key = (pid, tid, comm, frames);
        let t = time / 1000 * 1000; // perf script prints microseconds
        let idx = match self.stacks.get(&key) {
            Some(&i) => i,
            None => {
                let i = self.slots.len();
                self.slots.push(Slot { samples: 0, period: 0, bins: Vec::new(), first: t, last: t, key: i });
                self.keys.push(key.clone());
                self.stacks.insert(key, i);
                i
            }
        };
        let slot = &mut self.slots[idx];
        slot.samples += 1;
        slot.period += period;
        slot.first = slot.first.min(t);
        slot.last = slot.last.max(t);
        let bin = t / BIN_NS;
        match slot.bins.iter_mut().rev().find(|b| b.0 == bin) {
            Some(b) => b.1 += period,
            None => slot.bins.push((bin, period)),
        }
    }

    fn unwind(&mut self, pid: i32, regs: &linux_perf_data::linux_perf_event_reader::Regs, stack: &linux_perf_data::linux_perf_event_reader::RawData, size: u64, frames: &mut Vec<u32>) {
        let (Some(ip), Some(sp), Some(bp)) = (regs.get(REG_IP), regs.get(REG_SP), regs.get(REG_BP)) else {
            self.stats.errors += 1;
            return;
        };
        let bytes = stack.as_slice();
        let size = (size as usize).min(bytes.len()).min(self.args.copy_limit.map_or(usize::MAX, |l| l as usize));
        let bytes = &bytes[..size];
        // perf's access_mem: a word is readable when it lies in [sp, sp + size) and is not the last one
        let missed = std::cell::Cell::new(false); // a read outside the stack copy since the last frame
        let deepest = std::cell::Cell::new(0u64); // the copy size this stack's reads needed so far
        let mut read = |addr: u64| -> Result<u64, ()> {
            let off = addr.checked_sub(sp).ok_or(())?;
            if off.checked_add(8).ok_or(())? >= size as u64 {
                missed.set(true);
                return Err(());
            }
            deepest.set(deepest.get().max(off + 16)); // readable when off + 8 < size: size >= off + 16
            let o = off as usize;
            Ok(u64::from_le_bytes(bytes[o..o + 8].try_into().unwrap()))
        };
        let mut addrs: Vec<u64> = Vec::with_capacity(32);
        let mut truncated = false;
        // every register of the sample in DWARF numbering (rax, rdx, rcx, rbx, rsi, rdi, rbp, rsp,
        // r8..r15, ra): what a CFA rule on another register than rsp/rbp reads (libunwind keeps a
        // register it has no rule for at its value in the sample)
        let mut dregs = [0u64; 17];
        for (d, r) in [(0u64, 0u64), (1, 3), (2, 2), (3, 1), (4, 4), (5, 5), (6, 6), (7, 7)].into_iter()
            .chain((8..16).map(|d| (d, d + 8)))
        {
            dregs[d as usize] = regs.get(r).unwrap_or(0);
        }
        {
            let mut uregs = UnwindRegsX86_64::new(ip, sp, bp);
            let mut at = FrameAddress::InstructionPointer(ip);
            addrs.push(ip);
            while addrs.len() < MAX_STACK {
                self.ensure_module(pid, at.address_for_lookup());
                let Some(p) = self.procs.get(&pid) else { break };
                let Some(unwinder) = p.unwinder.as_ref() else { break };
                // perf's libunwind stops at an address of an object whose CFI has no entry for it
                // (hand-written assembly); framehop would go on by its heuristics
                if !has_fde(p, &self.dsos, at, &mut self.fde_cache) {
                    break;
                }
                let before = uregs.clone();
                let step = match unwinder.unwind_frame(at, &mut uregs, &mut self.cache, &mut read) {
                    Ok(Some(r)) => Ok(Some(r)),
                    Ok(None) => {
                        // framehop ends a stack it cannot follow on as its end (a CFA on r11 where
                        // rbp is 0); libunwind follows the CFI: so does one full step here
                        dregs[6] = before.bp();
                        dregs[7] = before.sp();
                        let key = p.find(at.address_for_lookup()).map(|m| (m.id, at.address_for_lookup()));
                        if key.is_some_and(|k| self.ends.contains(&k)) {
                            Ok(None)
                        } else {
                            match cfi_step(p, &self.dsos, at, &mut dregs, &mut read) {
                                Some(ra) => {
                                    uregs = UnwindRegsX86_64::new(ra, dregs[7], dregs[6]);
                                    Ok(Some(ra))
                                }
                                None => {
                                    if let (Some(k), false) = (key, missed.get()) {
                                        self.ends.insert(k); // the CFI's own end (_start's): no need to ask again
                                    }
                                    Ok(None)
                                }
                            }
                        }
                    }
                    Err(e) => {
                        // a rule framehop does not follow (a CFA on rax, as OpenSSL-style assembly
                        // writes): one step of the CFI with every register, then framehop again
                        uregs = before;
                        dregs[6] = uregs.bp();
                        dregs[7] = uregs.sp();
                        match cfi_step(p, &self.dsos, at, &mut dregs, &mut read) {
                            Some(ra) => {
                                uregs = UnwindRegsX86_64::new(ra, dregs[7], dregs[6]);
                                Ok(Some(ra))
                            }
                            None => Err(e),
                        }
                    }
                };
                match step {
                    Ok(Some(ra)) if ra != 0 => {
                        addrs.push(ra - 1);
                        at = FrameAddress::from_return_address(ra).unwrap();
                        missed.set(false);
                    }
                    // a step that fails without reading outside the stack copy (a return address
                    // of 0, a stack pointer going back) ends the stack, as libunwind's error does;
                    // a read outside the copy (perf reads it as 0) is perf's `[unknown]`
                    Err(_) | Ok(Some(_)) if !missed.get() => break,
                    Ok(Some(_)) | Err(_) => {
                        truncated = true;
                        break;
                    }
                    Ok(None) => break,
                }
            }
        }
        if truncated {
            self.stats.truncated += 1;
        }
        let need = self.stats.stack_need.entry(pid).or_default();
        need.copied = need.copied.max(size as u64);
        if truncated {
            need.truncated += 1;
        } else {
            let b = (deepest.get().saturating_sub(1) / NEED_BUCKET) as usize;
            if need.buckets.len() <= b {
                need.buckets.resize(b + 1, 0);
            }
            need.buckets[b] += 1;
        }
        for a in addrs {
            let f = if a >= KERNEL_START { self.kernel_frame(a) } else { self.user_frame(pid, a) };
            frames.push(f);
        }
        if truncated {
            frames.push(self.unknown);
        }
    }

    fn mmap(&mut self, pid: i32, start: u64, len: u64, pgoff: u64, path: &[u8], build_id: Option<String>, exec: bool, kernel: bool) {
        let path = String::from_utf8_lossy(path).into_owned();
        if kernel || pid == -1 {
            if !path.starts_with("[kernel.kallsyms]") && !path.starts_with("[guest.kernel") {
                let name = Path::new(&path).file_stem().map(|s| s.to_string_lossy().replace('-', "_")).unwrap_or(path.clone());
                let name = name.split('.').next().unwrap_or(&name).to_string();
                let map = (start, start + len, name);
                if !self.kernel_maps.contains(&map) {
                    self.kernel_maps.push(map);
                }
            }
            return;
        }
        self.seen.insert(pid);
        let dso = self.dso_for(&path, build_id, pid, exec);
        if let Some(m) = self.procs.get(&pid).and_then(|p| p.find(start)) {
            if m.start == start && m.end == start + len && m.pgoff == pgoff && m.dso == dso && m.exec == exec {
                // perf writes every live process's mappings again at each switch: the same mapping keeps
                // its id, and the addresses named in it stay named (--serve)
                return;
            }
        }
        let id = self.next_map_id;
        self.next_map_id += 1;
        self.procs.entry(pid).or_default().insert(Mapping { start, end: start + len, pgoff, dso, exec, id });
    }

    fn write(&mut self, out: &mut impl Write) -> std::io::Result<()> {
        for slot in &self.slots {
            let (pid, tid, comm, frames) = &self.keys[slot.key];
            for f in frames {
                // each frame's name once in the folder's life (--serve: the next files' records use its id)
                let i = *f as usize;
                if self.frames_sent.len() <= i {
                    self.frames_sent.resize(self.frames.len().max(i + 1), false);
                }
                if !self.frames_sent[i] {
                    self.frames_sent[i] = true;
                    let (s, d) = &self.frames[i];
                    write!(out, "[\"f\",{f},")?;
                    json_str(out, s)?;
                    out.write_all(b",")?;
                    json_str(out, d)?;
                    out.write_all(b"]\n")?;
                }
            }
            write!(out, "[{pid},{tid},")?;
            json_str(out, &self.comm_names[*comm as usize])?;
            write!(out, ",{},{},[", slot.samples, slot.period)?;
            for (i, f) in frames.iter().enumerate() {
                write!(out, "{}{f}", if i > 0 { "," } else { "" })?;
            }
            let mut bins = slot.bins.clone();
            bins.sort();
            out.write_all(b"],[")?;
            for (i, (b, p)) in bins.iter().enumerate() {
                write!(out, "{}{b},{p}", if i > 0 { "," } else { "" })?;
            }
            writeln!(out, "],{},{}]", slot.first, slot.last)?;
        }
        let s = &self.stats;
        write!(out, "{{\"qprof_perffold\":{{\"samples\":{},\"user_stacks\":{},\"truncated\":{},\"no_user_stack\":{},\"discarded_chains\":{},\"errors\":{},\"records\":{},\"stacks\":{},\"objects\":[",
            s.samples, s.user_stacks, s.truncated, s.no_user_stack, s.discarded, s.errors, s.records, self.slots.len())?;
        let mut first = true;
        for d in &self.dsos {
            if let Some(info) = &d.info {
                if d.kind != DsoKind::File || info.symbols.is_none() {
                    continue;
                }
                out.write_all(if first { b"[" } else { b",[" })?;
                first = false;
                json_str(out, &d.name)?;
                out.write_all(b",")?;
                json_str(out, &info.symbol_source)?;
                write!(out, ",{},{}]", info.symbols.as_ref().map_or(0, |t| t.len()), info.unwind.as_ref().is_some_and(|u| u.eh_frame_hdr.is_some() || u.debug_frame.is_some()))?;
            }
        }
        out.write_all(b"],\"stack_need\":{")?;
        for (i, (pid, n)) in s.stack_need.iter().enumerate() {
            write!(out, "{}\"{pid}\":{{\"copied\":{},\"truncated\":{},\"needed\":[", if i > 0 { "," } else { "" },
                n.copied, n.truncated)?;
            let mut first = true;
            for (b, c) in n.buckets.iter().enumerate().filter(|(_, c)| **c > 0) {
                write!(out, "{}[{},{c}]", if first { "" } else { "," }, (b as u64 + 1) * NEED_BUCKET)?;
                first = false;
            }
            out.write_all(b"]}")?;
        }
        out.write_all(b"},\"error_examples\":[")?;
        for (i, e) in s.error_examples.iter().enumerate() {
            if i > 0 {
                out.write_all(b",")?;
            }
            json_str(out, e)?;
        }
        writeln!(out, "]}}}}")?;
        Ok(())
    }
}

/// Whether the CFI of the object at `at` covers it: false only for an address in an object with an
/// `.eh_frame_hdr` index that has no entry for it (no CFI at all, or no object: true, framehop's way).
fn has_fde(p: &Process, dsos: &[Dso], at: FrameAddress, memo: &mut HashMap<(u32, u64), bool>) -> bool {
    use gimli::{BaseAddresses, EhFrame, EhFrameHdr, LittleEndian, UnwindSection};
    let lookup = at.address_for_lookup();
    let Some(m) = p.find(lookup) else { return true };
    if let Some(&v) = memo.get(&(m.id, lookup)) {
        return v;
    }
    let found = (|| -> Option<bool> {
        let info = dsos[m.dso].info.as_ref()?;
        let u = info.unwind.as_ref()?;
        let (h, hs) = (u.eh_frame_hdr.as_ref()?, u.eh_frame_hdr_svma.as_ref()?);
        let (eh, eh_svma) = (u.eh_frame.as_ref()?, u.eh_frame_svma.as_ref()?);
        let off = lookup - m.start + m.pgoff;
        let &(p_off, p_vaddr, _) = info.loads.iter().find(|(o, _, sz)| off >= *o && off < o + sz)?;
        let svma = off - p_off + p_vaddr;
        let eh = EhFrame::new(&eh[..], LittleEndian);
        let bases = BaseAddresses::default().set_eh_frame(eh_svma.start).set_eh_frame_hdr(hs.start);
        let hdr = EhFrameHdr::new(&h[..], LittleEndian).parse(&bases, 8).ok()?;
        let Some(table) = hdr.table() else { return Some(false) };
        Some(table.fde_for_address(&eh, &bases, svma, EhFrame::cie_from_offset).is_ok())
    })()
    .unwrap_or(true);
    memo.insert((m.id, lookup), found);
    found
}

/// One frame unwound from its DWARF CFI (.eh_frame) with all registers, for the rules framehop
/// does not follow; `regs` in DWARF numbering, updated to the caller's. The return address, or None.
fn cfi_step(p: &Process, dsos: &[Dso], at: FrameAddress, regs: &mut [u64; 17], read: &mut impl FnMut(u64) -> Result<u64, ()>) -> Option<u64> {
    use gimli::{BaseAddresses, CfaRule, EhFrame, EhFrameHdr, LittleEndian, Register, RegisterRule, UnwindContext, UnwindSection};
    let lookup = at.address_for_lookup();
    let m = p.find(lookup)?;
    let dso = &dsos[m.dso];
    let info = dso.info.as_ref()?;
    let u = info.unwind.as_ref()?;
    let off = lookup - m.start + m.pgoff;
    let &(p_off, p_vaddr, _) = info.loads.iter().find(|(o, _, sz)| off >= *o && off < o + sz)?;
    let svma = off - p_off + p_vaddr;
    let (eh, eh_svma) = (u.eh_frame.as_ref()?, u.eh_frame_svma.as_ref()?);
    let eh = EhFrame::new(&eh[..], LittleEndian);
    let mut bases = BaseAddresses::default().set_eh_frame(eh_svma.start);
    if let Some(t) = &u.text_svma {
        bases = bases.set_text(t.start);
    }
    if let Some(g) = &u.got_svma {
        bases = bases.set_got(g.start);
    }
    let fde = match (&u.eh_frame_hdr, &u.eh_frame_hdr_svma) {
        (Some(h), Some(hs)) => {
            bases = bases.set_eh_frame_hdr(hs.start);
            let hdr = EhFrameHdr::new(&h[..], LittleEndian).parse(&bases, 8).ok()?;
            hdr.table()?.fde_for_address(&eh, &bases, svma, EhFrame::cie_from_offset).ok()?
        }
        _ => eh.fde_for_address(&bases, svma, EhFrame::cie_from_offset).ok()?,
    };
    let mut ctx = UnwindContext::new();
    let row = fde.unwind_info_for_address(&eh, &bases, &mut ctx, svma).ok()?;
    let cfa = match row.cfa() {
        CfaRule::RegisterAndOffset { register, offset } => {
            regs.get(register.0 as usize)?.wrapping_add(*offset as u64)
        }
        _ => return None,
    };
    let ra = match row.register(Register(16)) {
        Some(RegisterRule::Offset(o)) => read(cfa.wrapping_add(o as u64)).ok()?,
        _ => return None,
    };
    for r in [3usize, 6, 12, 13, 14, 15] {
        if let Some(RegisterRule::Offset(o)) = row.register(Register(r as u16)) {
            if let Ok(v) = read(cfa.wrapping_add(o as u64)) {
                regs[r] = v;
            }
        }
    }
    regs[7] = cfa;
    regs[16] = ra;
    Some(ra)
}

fn json_str(out: &mut impl Write, s: &str) -> std::io::Result<()> {
    out.write_all(b"\"")?;
    let mut start = 0;
    let b = s.as_bytes();
    for (i, &c) in b.iter().enumerate() {
        let esc: Option<&[u8]> = match c {
            b'"' => Some(b"\\\""),
            b'\\' => Some(b"\\\\"),
            b'\n' => Some(b"\\n"),
            b'\t' => Some(b"\\t"),
            b'\r' => Some(b"\\r"),
            _ => None,
        };
        if esc.is_some() || c < 0x20 {
            out.write_all(&b[start..i])?;
            match esc {
                Some(e) => out.write_all(e)?,
                None => write!(out, "\\u{:04x}", c)?,
            }
            start = i + 1;
        }
    }
    out.write_all(&b[start..])?;
    out.write_all(b"\"")
}

/// A JIT's symbol map, /tmp/perf-PID.map: "START SIZE name" lines, hex without 0x.
fn jit_map(pid: i32) -> SymTab {
    let text = std::fs::read_to_string(format!("/tmp/perf-{pid}.map")).unwrap_or_default();
    let mut lines = Vec::new();
    for line in text.lines() {
        let mut it = line.splitn(3, ' ');
        let (Some(a), Some(s), Some(n)) = (it.next(), it.next(), it.next()) else { continue };
        let a = u64::from_str_radix(a.trim_start_matches("0x"), 16);
        let s = u64::from_str_radix(s.trim_start_matches("0x"), 16);
        if let (Ok(a), Ok(s)) = (a, s) {
            lines.push((a, s, n.trim().to_string()));
        }
    }
    SymTab::from_ranges(lines)
}

/// One record's effect on the folder.
fn handle(f: &mut Folder, record: &linux_perf_data::linux_perf_event_reader::RawEventRecord) {
    if f.context {
        if record.record_type.0 == 9 {
            return;
        }
    } else {
        f.stats.records += 1;
    }
    match record.parse() {
        Ok(EventRecord::Sample(s)) => f.sample(&s),
        Ok(EventRecord::Mmap2(m)) => {
            let build_id = match &m.file_id {
                Mmap2FileId::BuildId(b) => Some(symbols::hex(b)),
                _ => None,
            };
            let exec = m.protection & 4 != 0;
            let kernel = matches!(m.cpu_mode, linux_perf_data::linux_perf_event_reader::CpuMode::Kernel);
            f.mmap(m.pid, m.address, m.length, m.page_offset, &m.path.as_slice(), build_id, exec, kernel);
        }
        Ok(EventRecord::Mmap(m)) => {
            let kernel = matches!(m.cpu_mode, linux_perf_data::linux_perf_event_reader::CpuMode::Kernel);
            f.mmap(m.pid, m.address, m.length, m.page_offset, &m.path.as_slice(), None, m.is_executable, kernel);
        }
        Ok(EventRecord::Comm(c)) => {
            f.comms.insert(c.tid, String::from_utf8_lossy(&c.name.as_slice()).into_owned());
        }
        Ok(EventRecord::Fork(e)) => {
            f.seen.insert(e.pid);
            if let Some(c) = f.comms.get(&e.ptid).cloned() {
                f.comms.entry(e.tid).or_insert(c);
            }
            if e.pid != e.ppid && !f.procs.contains_key(&e.pid) {
                if let Some(parent) = f.procs.get(&e.ppid) {
                    let maps = parent.maps.clone();
                    f.procs.insert(e.pid, Process { maps, unwinder: None, added: HashSet::default(), stale: true });
                }
            }
        }
        Ok(_) => {}
        Err(e) => f.error(format!("{:?}: {e}", record.record_type)),
    }
}

const PERF_RECORD_FINISHED_ROUND: u32 = 68;

/// The records of a mapped perf.data file in perf's order, when every event has the same record
/// layout (qprof's captures): perf's ordered events, without copying a record. A file at each
/// FINISHED_ROUND gives the records up to the newest time of the round before (perf's
/// OE_FLUSH__ROUND); at the end, the rest. None: the file needs the general reader.
fn fold_mapped(f: &mut Folder, data: &[u8], perf_file: &linux_perf_data::PerfFile) -> Option<()> {
    use linux_perf_data::linux_perf_event_reader::{get_record_timestamp, RawData, RawEventRecord, RecordParseInfo, RecordType};
    let endian = perf_file.endian();
    if !matches!(endian, linux_perf_data::Endianness::LittleEndian) {
        return None;
    }
    let infos: Vec<RecordParseInfo> = perf_file.event_attributes().iter().map(|a| RecordParseInfo::new(&a.attr, endian)).collect();
    let info = *infos.first()?;
    if infos.iter().any(|i| *i != info) {
        return None;
    }
    let u64_at = |o: usize| data.get(o..o + 8).map(|b| u64::from_le_bytes(b.try_into().unwrap()));
    let (start, size) = (u64_at(40)? as usize, u64_at(48)? as usize);
    let end = (start + size).min(data.len());
    let mut pending: Vec<(u64, usize)> = Vec::new();
    let mut next_flush = 0u64;
    let mut max_ts = 0u64;
    {
        use linux_perf_data::linux_perf_event_reader::SampleFormat;
        let sf = info.sample_format;
        f.pid_offset = sf.contains(SampleFormat::TID).then(|| {
            8 + 8 * (sf.contains(SampleFormat::IDENTIFIER) as usize + sf.contains(SampleFormat::IP) as usize)
        });
    }
    let emit = |f: &mut Folder, at: usize| {
        let rtype = u32::from_le_bytes(data[at..at + 4].try_into().unwrap());
        if rtype == 9 {
            if f.context {
                return;
            }
            // another process's sample: not parsed
            if let Some(o) = f.pid_offset {
                if let Some(b) = data.get(at + o..at + o + 4) {
                    if !f.args.pids.contains(&i32::from_le_bytes(b.try_into().unwrap())) {
                        f.stats.records += 1;
                        return;
                    }
                }
            }
        }
        let misc = u16::from_le_bytes(data[at + 4..at + 6].try_into().unwrap());
        let rsize = u16::from_le_bytes(data[at + 6..at + 8].try_into().unwrap()) as usize;
        let rec = RawEventRecord::new(RecordType(rtype), misc, RawData::Single(&data[at + 8..at + rsize]), info);
        handle(f, &rec);
    };
    let mut pos = start;
    while pos + 8 <= end {
        let rtype = u32::from_le_bytes(data[pos..pos + 4].try_into().unwrap());
        let rsize = u16::from_le_bytes(data[pos + 6..pos + 8].try_into().unwrap()) as usize;
        if rsize < 8 || pos + rsize > end {
            f.error(format!("damaged record at offset {pos}"));
            break;
        }
        if rtype == PERF_RECORD_FINISHED_ROUND {
            pending.sort_unstable();
            let cut = pending.partition_point(|&(t, _)| t <= next_flush);
            for &(_, at) in &pending[..cut] {
                emit(f, at);
            }
            pending.drain(..cut);
            next_flush = max_ts;
        } else if rtype < 64 {
            let ts = get_record_timestamp::<byteorder::LittleEndian>(RecordType(rtype), RawData::Single(&data[pos + 8..pos + rsize]), &info).unwrap_or(0);
            max_ts = max_ts.max(ts);
            pending.push((ts, pos));
        }
        pos += rsize;
    }
    pending.sort_unstable();
    for &(_, at) in &pending {
        emit(f, at);
    }
    Some(())
}

/// Fold one file's records in; a context file (`--context`) gives its mappings and names only, and
/// one that cannot be read is left out (the fold is the same as without it). Err: why the file could
/// not be read at all (nothing of it was folded).
fn fold_file(f: &mut Folder, path: &Path) -> Result<(), String> {
    let Some(bytes) = symbols::map_file(path) else {
        return Err("cannot read".into());
    };
    let perf_file = match PerfFileReader::parse_file(std::io::Cursor::new(&bytes[..])) {
        Ok(r) => r.perf_file,
        Err(e) => return Err(format!("not a readable perf.data file ({e})")),
    };
    if let Ok(ids) = perf_file.build_ids() {
        for (_key, info) in ids {
            f.build_ids.insert(String::from_utf8_lossy(&info.path).into_owned(), symbols::hex(&info.build_id));
        }
    }
    if fold_mapped(f, &bytes, &perf_file).is_some() {
        return Ok(());
    }
    // events of different layouts (or a big-endian file): linux-perf-data's own reader
    let PerfFileReader { mut perf_file, mut record_iter } = match PerfFileReader::parse_file(std::io::Cursor::new(&bytes[..])) {
        Ok(r) => r,
        Err(_) => return Ok(()),
    };
    loop {
        match record_iter.next_record(&mut perf_file) {
            Ok(Some(PerfFileRecord::EventRecord { record, .. })) => handle(f, &record),
            Ok(Some(_)) => {}
            Ok(None) => break,
            Err(e) => {
                f.error(format!("reading records: {e}"));
                break;
            }
        }
    }
    Ok(())
}

/// `--serve`: each file named on stdin folded and written (its records, then its statistics line) as it
/// comes, or one line {"qprof_perffold_failed": why} when it cannot be read at all; until stdin closes.
/// What one file counted is not carried into the next; what names them (kallsyms, the objects' tables,
/// the processes' mappings and names) is, so a process that exited as perf switched files keeps its names.
fn serve(f: &mut Folder, out: &mut impl Write) -> std::io::Result<()> {
    use std::io::BufRead;
    for line in std::io::stdin().lock().lines() {
        let line = line?;
        if line.is_empty() {
            continue;
        }
        match fold_file(f, Path::new(&line)) {
            Ok(()) => {
                f.resolve_kernel();
                f.write(out)?;
            }
            Err(why) => {
                out.write_all(b"{\"qprof_perffold_failed\":")?;
                json_str(out, &why)?;
                out.write_all(b"}\n")?;
            }
        }
        out.flush()?;
        f.next_file();
    }
    Ok(())
}

fn main() {
    let args = parse_args();
    let kpath = args.kallsyms.clone();
    let kallsyms = std::thread::spawn(move || symbols::load_kallsyms(&kpath));
    let files = args.files.clone();
    let mut f = Folder {
        args,
        dsos: Vec::new(),
        dso_ids: HashMap::default(),
        build_ids: HashMap::default(),
        procs: HashMap::default(),
        comms: HashMap::default(),
        kallsyms: Some(kallsyms),
        ktabs: Default::default(),
        kpending: Vec::new(),
        kernel_maps: Vec::new(),
        vdso: symbols::own_vdso(),
        frames: Vec::new(),
        frames_sent: Vec::new(),
        frame_ids: HashMap::default(),
        addr_cache: HashMap::default(),
        kaddr_cache: HashMap::default(),
        unknown: 0,
        next_map_id: 0,
        stacks: HashMap::default(),
        slots: Vec::new(),
        keys: Vec::new(),
        comm_ids: HashMap::default(),
        comm_names: Vec::new(),
        cache: CacheX86_64::new(),
        fde_cache: HashMap::default(),
        ends: HashSet::default(),
        pid_offset: None,
        context: false,
        stats: Stats::default(),
        seen: HashSet::default(),
    };
    f.unknown = f.frame_id(UNKNOWN, UNKNOWN);
    if let Some(path) = f.args.context.clone() {
        f.context = true;
        if let Err(why) = fold_file(&mut f, &path) {
            eprintln!("qprof-perffold: {}: {why} (context: left out)", path.display());
        }
        f.context = false;
    }
    let stdout = std::io::stdout();
    let mut out = BufWriter::with_capacity(1 << 16, stdout.lock());
    if f.args.serve {
        if let Err(e) = serve(&mut f, &mut out) {
            eprintln!("qprof-perffold: serving: {e}");
            std::process::exit(1);
        }
        return;
    }
    for path in &files {
        if let Err(why) = fold_file(&mut f, path) {
            eprintln!("qprof-perffold: {}: {why}", path.display());
            std::process::exit(1);
        }
    }
    f.resolve_kernel();
    if let Err(e) = f.write(&mut out).and_then(|_| out.flush()) {
        eprintln!("qprof-perffold: writing: {e}");
        std::process::exit(1);
    }
}
