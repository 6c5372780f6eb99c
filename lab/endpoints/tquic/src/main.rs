//! tquic-bulk: one-stream bulk transfer over tquic (BoringSSL), for qprof's tests.
//!
//!   tquic-bulk server ADDR CERT KEY   serve until killed
//!   tquic-bulk client ADDR BYTES      download BYTES on one bidirectional stream
//!
//! tquic is driven through its Endpoint (callbacks for connection and stream
//! events, a send handler for outgoing packets); this program owns a plain
//! non-blocking UDP socket, waits with ppoll(2) until a datagram arrives or the
//! endpoint's next timeout, receives with recvmsg(2) and sends one datagram per
//! sendto. Each datagram's receive time is the kernel's stamp (SO_TIMESTAMPNS),
//! not a clock read per wake-up in this program.
//! The client sends an 8-byte big-endian count; the server answers with that
//! many bytes (slices of one reused buffer) and the stream's FIN. The client
//! reads to the end, checks the count, prints `bytes=N seconds=S` and closes.
//!
//! With QPROF_BULK_WORK=PASSES the client does work of its own inside tquic's
//! `on_stream_readable` callback: it reads the stream into 256 KiB blocks and
//! hashes each full block PASSES times (`checksum`), timing that with its
//! thread's CPU clock, and adds `work_seconds=W cpu_seconds=T` (T: the
//! process's CPU time) to its line.
//!
//! QLOGDIR=DIR makes both ends write each connection's qlog (tquic's own
//! JSON-SEQ writer) to DIR/server-SCID.sqlog and DIR/client-SCID.sqlog.

use std::cell::RefCell;
use std::collections::HashMap;
use std::cell::Cell;
use std::fs::File;
use std::io::{self, BufWriter, ErrorKind, Write};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6, UdpSocket};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::rc::Rc;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use tquic::{Config, Connection, Endpoint, PacketInfo, PacketSendHandler, TlsConfig, TransportHandler};

const ALPN: &[u8] = b"qprof-bulk";
const CHUNK: usize = 1 << 20;
const STREAM_WINDOW: u64 = 64 << 20;
const CONN_WINDOW: u64 = 128 << 20;
const MAX_DATAGRAM: usize = 1472; // an Ethernet MTU's worth of UDP payload
const RCVBUF: libc::c_int = 4 << 20;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn usage() -> ! {
    eprintln!("usage: tquic-bulk server ADDR CERT KEY | tquic-bulk client ADDR BYTES");
    std::process::exit(2)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let res = match args.get(1).map(String::as_str) {
        Some("server") if args.len() == 5 => server(&args[2], &args[3], &args[4]),
        Some("client") if args.len() == 4 => client(&args[2], &args[3]),
        _ => usage(),
    };
    if let Err(e) = res {
        eprintln!("tquic-bulk: {e}");
        std::process::exit(1);
    }
}

fn config(tls: TlsConfig) -> Res<Config> {
    let mut c = Config::new()?;
    c.set_max_idle_timeout(30_000);
    c.set_recv_udp_payload_size(MAX_DATAGRAM as u16);
    c.set_send_udp_payload_size(MAX_DATAGRAM);
    c.set_initial_max_data(CONN_WINDOW);
    c.set_initial_max_stream_data_bidi_local(STREAM_WINDOW);
    c.set_initial_max_stream_data_bidi_remote(STREAM_WINDOW);
    c.set_initial_max_streams_bidi(16);
    c.set_max_connection_window(CONN_WINDOW);
    c.set_max_stream_window(STREAM_WINDOW);
    c.set_tls_config(tls);
    Ok(c)
}

fn socket(addr: SocketAddr) -> Res<Rc<UdpSocket>> {
    let s = UdpSocket::bind(addr)?;
    s.set_nonblocking(true)?;
    // a larger receive buffer (capped by net.core.rmem_max) keeps bursts from being dropped
    setsockopt(&s, libc::SO_RCVBUF, RCVBUF)?;
    setsockopt(&s, libc::SO_TIMESTAMPNS, 1)?;
    Ok(Rc::new(s))
}

fn setsockopt(s: &UdpSocket, opt: libc::c_int, value: libc::c_int) -> io::Result<()> {
    let rc = unsafe {
        libc::setsockopt(s.as_raw_fd(), libc::SOL_SOCKET, opt, &value as *const _ as *const libc::c_void,
                         std::mem::size_of::<libc::c_int>() as libc::socklen_t)
    };
    if rc == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

/// One connection's qlog file (QLOGDIR). tquic owns the writer; `run` flushes every open file before
/// each wait, so the files are whole whenever the endpoint is idle, also when it is killed then (the
/// server runs until killed). Buffered: tquic writes each event in many pieces.
struct QlogFile(Arc<Mutex<BufWriter<File>>>);

thread_local! {
    // the open qlog files, for `flush_qlogs`; a file closes with its connection
    static QLOGS: RefCell<Vec<Weak<Mutex<BufWriter<File>>>>> = const { RefCell::new(Vec::new()) };
}

impl QlogFile {
    /// Attach a qlog file to `conn` when QLOGDIR is set; without it nothing is opened or logged.
    fn attach(conn: &mut Connection) {
        let Some(dir) = std::env::var_os("QLOGDIR") else { return };
        let role = if conn.is_server() { "server" } else { "client" };
        // trace_id: "SERVER-<scid>" / "CLIENT-<scid>"
        let scid = conn.trace_id().split_once('-').map_or(conn.trace_id(), |(_, id)| id).to_string();
        let path = Path::new(&dir).join(format!("{role}-{scid}.sqlog"));
        let file = std::fs::create_dir_all(&dir).and_then(|_| File::create(&path)).unwrap_or_else(|e| {
            eprintln!("tquic-bulk: qlog {}: {e}", path.display());
            std::process::exit(1)
        });
        let w = Arc::new(Mutex::new(BufWriter::with_capacity(1 << 20, file)));
        QLOGS.with(|q| q.borrow_mut().push(Arc::downgrade(&w)));
        conn.set_qlog(Box::new(QlogFile(w)), format!("tquic-bulk {role}"), String::new());
    }
}

impl Write for QlogFile {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.0.lock().map_err(|_| ErrorKind::Other)?.write(b)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.lock().map_err(|_| ErrorKind::Other)?.flush()
    }
}

/// Flush the open qlog files and forget the closed ones.
fn flush_qlogs() {
    QLOGS.with(|q| {
        q.borrow_mut().retain(|w| match w.upgrade() {
            Some(w) => {
                if let Ok(mut f) = w.lock() {
                    let _ = f.flush();
                }
                true
            }
            None => false,
        })
    });
}

/// Turns the kernel's receive stamps (CLOCK_REALTIME) into Instants, from one pair of
/// clock readings taken at start-up.
struct StampClock {
    mono: Instant,
    real: Duration,
}

impl StampClock {
    fn new() -> Self {
        let real = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        StampClock { mono: Instant::now(), real }
    }

    /// The stamp's Instant, or a clock reading when there is no stamp or it is before start-up
    /// (the wall clock was stepped back).
    fn instant(&self, stamp: Option<Duration>) -> Instant {
        stamp.and_then(|s| s.checked_sub(self.real)).map_or_else(Instant::now, |d| self.mono + d)
    }
}

/// One datagram into `buf`: its length, sender and kernel receive stamp.
fn recv_stamped(sock: &UdpSocket, buf: &mut [u8]) -> io::Result<(usize, SocketAddr, Option<Duration>)> {
    let mut addr: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr() as *mut libc::c_void, iov_len: buf.len() };
    let mut control = [0u64; 8]; // room for one aligned SCM_TIMESTAMPNS message
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_name = &mut addr as *mut _ as *mut libc::c_void;
    msg.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr() as *mut libc::c_void;
    msg.msg_controllen = std::mem::size_of_val(&control);
    let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut stamp = None;
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_TIMESTAMPNS {
                let ts = std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const libc::timespec);
                stamp = Some(Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32));
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    let from = match addr.ss_family as libc::c_int {
        libc::AF_INET => {
            let a = unsafe { *(&addr as *const _ as *const libc::sockaddr_in) };
            SocketAddr::from((Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)), u16::from_be(a.sin_port)))
        }
        libc::AF_INET6 => {
            let a = unsafe { *(&addr as *const _ as *const libc::sockaddr_in6) };
            SocketAddr::V6(SocketAddrV6::new(Ipv6Addr::from(a.sin6_addr.s6_addr), u16::from_be(a.sin6_port),
                                             a.sin6_flowinfo, a.sin6_scope_id))
        }
        f => return Err(io::Error::new(ErrorKind::InvalidData, format!("address family {f}"))),
    };
    Ok((n as usize, from, stamp))
}

/// Sends the endpoint's packets, one datagram per sendto.
struct Sender(Rc<UdpSocket>);

impl PacketSendHandler for Sender {
    fn on_packets_send(&self, pkts: &[(Vec<u8>, PacketInfo)]) -> tquic::Result<usize> {
        for (i, (buf, info)) in pkts.iter().enumerate() {
            match self.0.send_to(buf, info.dst) {
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(i),
                Err(e) => return Err(tquic::Error::IoError(e.to_string())),
            }
        }
        Ok(pkts.len())
    }
}

/// Run the endpoint until `stop()` says so: receive, time out, process, send.
fn run(ep: &mut Endpoint, sock: &UdpSocket, stop: impl Fn() -> bool) -> Res<()> {
    let local = sock.local_addr()?;
    let clock = StampClock::new();
    let mut buf = vec![0u8; 65535];
    let qlog = std::env::var_os("QLOGDIR").is_some();
    loop {
        ep.process_connections()?;
        if qlog {
            flush_qlogs();
        }
        if stop() {
            return Ok(());
        }
        // ppoll to the nanosecond: poll's milliseconds would round a sub-millisecond timer
        // down to 0 and spin until it expires
        let wait = ep.timeout().map(|t| {
            let t = t.min(Duration::from_secs(60));
            libc::timespec { tv_sec: t.as_secs() as libc::time_t, tv_nsec: t.subsec_nanos() as libc::c_long }
        });
        let mut pfd = libc::pollfd { fd: sock.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        unsafe { libc::ppoll(&mut pfd, 1, wait.as_ref().map_or(std::ptr::null(), |w| w as *const _), std::ptr::null()) };
        let mut got_any = false;
        loop {
            let (len, from, stamp) = match recv_stamped(sock, &mut buf) {
                Ok(v) => v,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) => return Err(e.into()),
            };
            got_any = true;
            let info = PacketInfo { src: from, dst: local, time: clock.instant(stamp) };
            // packets the endpoint cannot use (old connections) are dropped by it
            let _ = ep.recv(&mut buf[..len], &info);
        }
        if !got_any {
            ep.on_timeout(Instant::now());
        }
    }
}

/// The server's side of one stream: the requested count, then bytes still to send.
#[derive(Default)]
struct Job {
    header: Vec<u8>,
    left: Option<u64>,
    done: bool,
}

struct ServerHandler {
    data: Bytes,
    jobs: HashMap<(u64, u64), Job>,
}

impl ServerHandler {
    fn write(&mut self, conn: &mut Connection, sid: u64) {
        let key = (conn.index().unwrap_or(0), sid);
        let Some(job) = self.jobs.get_mut(&key) else { return };
        let Some(mut left) = job.left else { return };
        if job.done {
            return;
        }
        while left > 0 {
            let n = left.min(CHUNK as u64) as usize;
            match conn.stream_write(sid, self.data.slice(..n), false) {
                Ok(0) | Err(_) => break,
                Ok(w) => left -= w as u64,
            }
        }
        job.left = Some(left);
        if left == 0 && conn.stream_write(sid, Bytes::new(), true).is_ok() {
            job.done = true;
            let _ = conn.stream_want_write(sid, false);
        }
    }
}

impl TransportHandler for ServerHandler {
    fn on_conn_created(&mut self, conn: &mut Connection) {
        QlogFile::attach(conn);
    }
    fn on_conn_established(&mut self, _conn: &mut Connection) {}
    fn on_conn_closed(&mut self, conn: &mut Connection) {
        let idx = conn.index().unwrap_or(0);
        self.jobs.retain(|k, _| k.0 != idx);
    }
    fn on_stream_created(&mut self, _conn: &mut Connection, _sid: u64) {}
    fn on_stream_readable(&mut self, conn: &mut Connection, sid: u64) {
        let key = (conn.index().unwrap_or(0), sid);
        let mut tmp = [0u8; 64];
        while let Ok((n, _fin)) = conn.stream_read(sid, &mut tmp) {
            if n == 0 {
                break;
            }
            let job = self.jobs.entry(key).or_default();
            if job.left.is_none() {
                job.header.extend_from_slice(&tmp[..n]);
                if job.header.len() >= 8 {
                    job.left = Some(u64::from_be_bytes(job.header[..8].try_into().expect("8 bytes")));
                }
            }
        }
        if self.jobs.get(&key).is_some_and(|j| j.left.is_some() && !j.done) {
            let _ = conn.stream_want_write(sid, true);
            self.write(conn, sid);
        }
    }
    fn on_stream_writable(&mut self, conn: &mut Connection, sid: u64) {
        self.write(conn, sid);
    }
    fn on_stream_closed(&mut self, conn: &mut Connection, sid: u64) {
        self.jobs.remove(&(conn.index().unwrap_or(0), sid));
    }
    fn on_new_token(&mut self, _conn: &mut Connection, _token: Vec<u8>) {}
}

fn server(addr: &str, cert: &str, key: &str) -> Res<()> {
    let addr: SocketAddr = addr.parse()?;
    let tls = TlsConfig::new_server_config(cert, key, vec![ALPN.to_vec()], false)?;
    let sock = socket(addr)?;
    let handler = ServerHandler { data: Bytes::from(vec![0x5au8; CHUNK]), jobs: HashMap::new() };
    let mut ep = Endpoint::new(Box::new(config(tls)?), true, Box::new(handler), Rc::new(Sender(sock.clone())));
    run(&mut ep, &sock, || false)
}

#[derive(Default)]
struct ClientState {
    want: u64,
    got: u64,
    start: Option<Instant>,
    seconds: Option<f64>,
    closed: bool,
    error: Option<String>,
    work_seconds: f64, // the client's own work (QPROF_BULK_WORK), by its thread's CPU clock
}

struct ClientHandler {
    state: Rc<RefCell<ClientState>>,
    buf: Vec<u8>, // reused for every read
    work: Option<Work>,
}

/// The client's own work on what it receives (QPROF_BULK_WORK): whole blocks hashed PASSES times.
struct Work {
    passes: u32,
    fill: usize,
    sink: u64,
}

const WORK_BLOCK: usize = 256 << 10;

#[inline(never)]
fn checksum(b: &[u8], passes: u32) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for _ in 0..passes {
        for w in b.chunks_exact(8) {
            let mut x = u64::from_le_bytes(w.try_into().expect("8 bytes")) ^ h;
            x ^= x >> 29;
            x = x.wrapping_mul(0xbf58476d1ce4e5b9);
            h = h.wrapping_add(x ^ (x >> 32));
        }
    }
    h
}

fn cpu_seconds(clock: libc::clockid_t) -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

impl Work {
    /// Hash a block; returns the thread CPU time it took.
    fn block(&mut self, b: &[u8]) -> f64 {
        let t0 = cpu_seconds(libc::CLOCK_THREAD_CPUTIME_ID);
        self.sink = self.sink.wrapping_add(std::hint::black_box(checksum(b, self.passes)));
        self.fill = 0;
        cpu_seconds(libc::CLOCK_THREAD_CPUTIME_ID) - t0
    }
}

impl TransportHandler for ClientHandler {
    fn on_conn_created(&mut self, conn: &mut Connection) {
        QlogFile::attach(conn);
    }
    fn on_conn_established(&mut self, conn: &mut Connection) {
        let want = self.state.borrow().want;
        let res = conn.stream_bidi_new(0, false)
            .and_then(|sid| conn.stream_write(sid, Bytes::copy_from_slice(&want.to_be_bytes()), true));
        if let Err(e) = res {
            self.state.borrow_mut().error = Some(format!("cannot send the request: {e:?}"));
        }
    }
    fn on_conn_closed(&mut self, _conn: &mut Connection) {
        self.state.borrow_mut().closed = true;
    }
    fn on_stream_created(&mut self, _conn: &mut Connection, _sid: u64) {}
    fn on_stream_readable(&mut self, conn: &mut Connection, sid: u64) {
        let mut st = self.state.borrow_mut();
        loop {
            let res = match self.work.as_mut() {
                Some(w) => conn.stream_read(sid, &mut self.buf[w.fill..WORK_BLOCK]),
                None => conn.stream_read(sid, &mut self.buf),
            };
            let Ok((n, fin)) = res else { break };
            st.got += n as u64;
            if let Some(w) = self.work.as_mut() {
                w.fill += n;
                if w.fill == WORK_BLOCK || fin {
                    let filled = w.fill;
                    st.work_seconds += w.block(&self.buf[..filled]);
                }
            }
            if fin {
                st.seconds = st.start.map(|s| s.elapsed().as_secs_f64());
                let _ = conn.close(true, 0, b"done");
                break;
            }
            if n == 0 {
                break;
            }
        }
    }
    fn on_stream_writable(&mut self, _conn: &mut Connection, _sid: u64) {}
    fn on_stream_closed(&mut self, _conn: &mut Connection, _sid: u64) {}
    fn on_new_token(&mut self, _conn: &mut Connection, _token: Vec<u8>) {}
}

fn client(addr: &str, bytes: &str) -> Res<()> {
    let peer: SocketAddr = addr.parse()?;
    let want: u64 = bytes.parse()?;
    let mut tls = TlsConfig::new_client_config(vec![ALPN.to_vec()], false)?;
    tls.set_verify(false); // test-only: the server's certificate is self-signed
    let bind: SocketAddr = if peer.is_ipv6() { "[::]:0" } else { "0.0.0.0:0" }.parse()?;
    let sock = socket(bind)?;
    let local = sock.local_addr()?;
    let state = Rc::new(RefCell::new(ClientState { want, start: Some(Instant::now()), ..Default::default() }));
    let passes: u32 = std::env::var("QPROF_BULK_WORK").ok().and_then(|v| v.parse().ok()).unwrap_or(0);
    let work = (passes > 0).then(|| Work { passes, fill: 0, sink: 0 });
    let handler = ClientHandler { state: state.clone(), buf: vec![0u8; CHUNK], work };
    let mut ep = Endpoint::new(Box::new(config(tls)?), false, Box::new(handler), Rc::new(Sender(sock.clone())));
    ep.connect(local, peer, Some("localhost"), None, None, None)?;
    // stop once the last byte arrived (the close frame went out with it) or the connection ended
    let st = state.clone();
    let deadline = Instant::now() + Duration::from_secs(600);
    let turns = Cell::new(0u32); // the deadline is read every 4096 turns, not per wake-up
    run(&mut ep, &sock, move || {
        let s = st.borrow();
        turns.set(turns.get().wrapping_add(1));
        s.seconds.is_some() || s.closed || s.error.is_some() || (turns.get() % 4096 == 0 && Instant::now() > deadline)
    })?;
    let s = state.borrow();
    if let Some(e) = &s.error {
        return Err(e.clone().into());
    }
    let Some(secs) = s.seconds else {
        return Err(format!("connection ended after {} of {want} bytes", s.got).into());
    };
    if s.got != want {
        return Err(format!("received {} bytes, expected {want}", s.got).into());
    }
    if passes > 0 {
        println!("bytes={} seconds={secs:.3} work_seconds={:.6} cpu_seconds={:.6}", s.got, s.work_seconds,
                 cpu_seconds(libc::CLOCK_PROCESS_CPUTIME_ID));
    } else {
        println!("bytes={} seconds={secs:.3}", s.got);
    }
    Ok(())
}
