//! quiche-bulk: one-stream bulk transfer over quiche (BoringSSL), for qprof's tests.
//!
//!   quiche-bulk server ADDR CERT KEY   serve until killed (one connection at a time)
//!   quiche-bulk client ADDR BYTES      download BYTES on one bidirectional stream
//!
//! quiche leaves the network to the application: this program owns a plain
//! non-blocking std::net::UdpSocket, waits with ppoll(2) until a datagram
//! arrives or quiche's next timeout, and sends one datagram per sendto (no
//! GSO, no pacing). The client sends an 8-byte big-endian count; the server
//! answers with that many bytes written from one reused buffer, then the
//! stream's FIN. The client reads to the end, checks the count, prints
//! `bytes=N seconds=S` and closes the connection.
//!
//! QLOGDIR=DIR makes both ends write each connection's qlog (quiche's own
//! JSON-SEQ streamer) to DIR/server-ODCID.sqlog and DIR/client-ODCID.sqlog.

use std::fs::File;
use std::io::{BufWriter, ErrorKind, Read, Write};
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const ALPN: &[u8] = b"qprof-bulk";
const CHUNK: usize = 1 << 20;
const STREAM_WINDOW: u64 = 64 << 20;
const CONN_WINDOW: u64 = 128 << 20;
const MAX_DATAGRAM: usize = 1472; // an Ethernet MTU's worth of UDP payload
const RCVBUF: libc::c_int = 4 << 20;

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn usage() -> ! {
    eprintln!("usage: quiche-bulk server ADDR CERT KEY | quiche-bulk client ADDR BYTES");
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
        eprintln!("quiche-bulk: {e}");
        std::process::exit(1);
    }
}

fn config() -> Res<quiche::Config> {
    let mut c = quiche::Config::new(quiche::PROTOCOL_VERSION)?;
    c.set_application_protos(&[ALPN])?;
    c.set_max_idle_timeout(30_000);
    c.set_max_recv_udp_payload_size(MAX_DATAGRAM);
    c.set_max_send_udp_payload_size(MAX_DATAGRAM);
    c.set_initial_max_data(CONN_WINDOW);
    c.set_initial_max_stream_data_bidi_local(STREAM_WINDOW);
    c.set_initial_max_stream_data_bidi_remote(STREAM_WINDOW);
    c.set_initial_max_streams_bidi(16);
    c.set_initial_max_streams_uni(16);
    c.set_disable_active_migration(true);
    Ok(c)
}

fn socket(addr: SocketAddr) -> Res<UdpSocket> {
    let s = UdpSocket::bind(addr)?;
    s.set_nonblocking(true)?;
    // a larger receive buffer (capped by net.core.rmem_max) keeps bursts from being dropped
    unsafe {
        libc::setsockopt(s.as_raw_fd(), libc::SOL_SOCKET, libc::SO_RCVBUF, &RCVBUF as *const _ as *const libc::c_void,
                         std::mem::size_of::<libc::c_int>() as libc::socklen_t);
    }
    Ok(s)
}

/// One connection's qlog file (QLOGDIR), shared between quiche, which writes it, and the loop, which
/// flushes it before each wait: the file is whole whenever the endpoint is idle, also when it is
/// killed then (the server runs until killed). Buffered: quiche writes each event in many pieces.
#[derive(Clone)]
struct QlogFile(Arc<Mutex<BufWriter<File>>>);

impl QlogFile {
    /// Attach a qlog file to `conn` when QLOGDIR is set; None (nothing opened, nothing logged) when not.
    fn attach(conn: &mut quiche::Connection, role: &str, odcid: &[u8]) -> Option<QlogFile> {
        let dir = std::env::var_os("QLOGDIR")?;
        let cid: String = odcid.iter().map(|b| format!("{b:02x}")).collect();
        let path = Path::new(&dir).join(format!("{role}-{cid}.sqlog"));
        let file = std::fs::create_dir_all(&dir).and_then(|_| File::create(&path)).unwrap_or_else(|e| {
            eprintln!("quiche-bulk: qlog {}: {e}", path.display());
            std::process::exit(1)
        });
        let q = QlogFile(Arc::new(Mutex::new(BufWriter::with_capacity(1 << 20, file))));
        conn.set_qlog(Box::new(q.clone()), format!("quiche-bulk {role}"), String::new());
        Some(q)
    }

    fn flush_now(&self) {
        if let Ok(mut w) = self.0.lock() {
            let _ = w.flush();
        }
    }
}

impl Write for QlogFile {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().map_err(|_| ErrorKind::Other)?.write(b)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.lock().map_err(|_| ErrorKind::Other)?.flush()
    }
}

/// Wait until the socket is readable or `timeout` passes (None: forever).
fn wait_readable(sock: &UdpSocket, timeout: Option<Duration>) {
    // ppoll to the nanosecond: poll's milliseconds would round a sub-millisecond timer
    // down to 0 and spin until it expires
    let wait = timeout.map(|t| {
        let t = t.min(Duration::from_secs(60));
        libc::timespec { tv_sec: t.as_secs() as libc::time_t, tv_nsec: t.subsec_nanos() as libc::c_long }
    });
    let mut pfd = libc::pollfd { fd: sock.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    unsafe { libc::ppoll(&mut pfd, 1, wait.as_ref().map_or(std::ptr::null(), |w| w as *const _), std::ptr::null()) };
}

/// Send everything quiche has queued, one datagram per sendto.
fn flush(sock: &UdpSocket, conn: &mut quiche::Connection, out: &mut [u8]) -> Res<()> {
    loop {
        let (len, info) = match conn.send(out) {
            Ok(v) => v,
            Err(quiche::Error::Done) => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        loop {
            match sock.send_to(&out[..len], info.to) {
                Ok(_) => break,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    // socket send buffer full: wait until writable
                    let mut pfd = libc::pollfd { fd: sock.as_raw_fd(), events: libc::POLLOUT, revents: 0 };
                    unsafe { libc::poll(&mut pfd, 1, 100) };
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
}

fn random_cid() -> Res<[u8; quiche::MAX_CONN_ID_LEN]> {
    let mut cid = [0u8; quiche::MAX_CONN_ID_LEN];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut cid)?;
    Ok(cid)
}

/// The server's side of one stream: the requested count, then bytes still to send.
struct Job {
    stream: u64,
    header: Vec<u8>,
    left: Option<u64>,
    fin_sent: bool,
}

fn server(addr: &str, cert: &str, key: &str) -> Res<()> {
    let addr: SocketAddr = addr.parse()?;
    let mut cfg = config()?;
    cfg.load_cert_chain_from_pem_file(cert)?;
    cfg.load_priv_key_from_pem_file(key)?;
    let sock = socket(addr)?;
    let local = sock.local_addr()?;
    let mut buf = vec![0u8; 65535];
    let mut out = vec![0u8; MAX_DATAGRAM];
    let data = vec![0x5au8; CHUNK];
    let mut conn: Option<quiche::Connection> = None;
    let mut qlog: Option<QlogFile> = None;
    let mut jobs: Vec<Job> = Vec::new();
    loop {
        if let Some(q) = &qlog {
            q.flush_now();
        }
        wait_readable(&sock, conn.as_ref().and_then(|c| c.timeout()));
        let mut got_any = false;
        loop {
            let (len, from) = match sock.recv_from(&mut buf) {
                Ok(v) => v,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) => return Err(e.into()),
            };
            got_any = true;
            if conn.is_none() {
                let hdr = match quiche::Header::from_slice(&mut buf[..len], quiche::MAX_CONN_ID_LEN) {
                    Ok(h) => h,
                    Err(_) => continue,
                };
                if hdr.ty != quiche::Type::Initial || !quiche::version_is_supported(hdr.version) {
                    continue;
                }
                let scid = random_cid()?;
                let mut c = quiche::accept(&quiche::ConnectionId::from_ref(&scid), None, local, from, &mut cfg)?;
                qlog = QlogFile::attach(&mut c, "server", &hdr.dcid);
                conn = Some(c);
                jobs.clear();
            }
            let c = conn.as_mut().expect("connection");
            // packets of other (old) connections are refused here and ignored
            let _ = c.recv(&mut buf[..len], quiche::RecvInfo { from, to: local });
        }
        let Some(c) = conn.as_mut() else { continue };
        if !got_any {
            c.on_timeout();
        }
        if c.is_established() {
            for sid in c.readable() {
                let idx = match jobs.iter().position(|j| j.stream == sid) {
                    Some(i) => i,
                    None => {
                        jobs.push(Job { stream: sid, header: Vec::with_capacity(8), left: None, fin_sent: false });
                        jobs.len() - 1
                    }
                };
                let mut tmp = [0u8; 64];
                while let Ok((n, _fin)) = c.stream_recv(sid, &mut tmp) {
                    let job = &mut jobs[idx];
                    if job.left.is_none() {
                        job.header.extend_from_slice(&tmp[..n]);
                        if job.header.len() >= 8 {
                            job.left = Some(u64::from_be_bytes(job.header[..8].try_into()?));
                        }
                    }
                }
            }
            for job in jobs.iter_mut().filter(|j| j.left.is_some() && !j.fin_sent) {
                let mut left = job.left.unwrap_or(0);
                while left > 0 {
                    let n = left.min(CHUNK as u64) as usize;
                    match c.stream_send(job.stream, &data[..n], false) {
                        Ok(0) | Err(quiche::Error::Done) => break,
                        Ok(w) => left -= w as u64,
                        Err(e) => return Err(e.into()),
                    }
                }
                job.left = Some(left);
                if left == 0 && c.stream_send(job.stream, b"", true).is_ok() {
                    job.fin_sent = true;
                }
            }
        }
        flush(&sock, c, &mut out)?;
        if c.is_closed() {
            conn = None; // its qlog file is flushed and closed with it
            qlog = None;
            jobs.clear();
        }
    }
}

fn client(addr: &str, bytes: &str) -> Res<()> {
    let peer: SocketAddr = addr.parse()?;
    let want: u64 = bytes.parse()?;
    let mut cfg = config()?;
    cfg.verify_peer(false); // test-only: the server's certificate is self-signed
    let bind: SocketAddr = if peer.is_ipv6() { "[::]:0" } else { "0.0.0.0:0" }.parse()?;
    let sock = socket(bind)?;
    let local = sock.local_addr()?;
    let mut buf = vec![0u8; 65535];
    let mut out = vec![0u8; MAX_DATAGRAM];
    let mut data = vec![0u8; CHUNK];
    let scid = random_cid()?;
    let start = Instant::now();
    let mut conn = quiche::connect(Some("localhost"), &quiche::ConnectionId::from_ref(&scid), local, peer, &mut cfg)?;
    let odcid = conn.destination_id().to_vec(); // the server names its file by the same ID
    let qlog = QlogFile::attach(&mut conn, "client", &odcid);
    flush(&sock, &mut conn, &mut out)?;
    let stream = 0u64;
    let mut requested = false;
    let mut got: u64 = 0;
    let mut done: Option<f64> = None;
    loop {
        if let Some(q) = &qlog {
            q.flush_now();
        }
        wait_readable(&sock, conn.timeout());
        let mut got_any = false;
        loop {
            let (len, from) = match sock.recv_from(&mut buf) {
                Ok(v) => v,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) => return Err(e.into()),
            };
            got_any = true;
            let _ = conn.recv(&mut buf[..len], quiche::RecvInfo { from, to: local });
        }
        if !got_any {
            conn.on_timeout();
        }
        if conn.is_closed() {
            break;
        }
        if conn.is_established() && !requested {
            conn.stream_send(stream, &want.to_be_bytes(), true)?;
            requested = true;
        }
        if done.is_none() {
            while let Ok((n, fin)) = conn.stream_recv(stream, &mut data) {
                got += n as u64;
                if fin {
                    done = Some(start.elapsed().as_secs_f64());
                    conn.close(true, 0, b"done")?;
                    break;
                }
            }
        }
        flush(&sock, &mut conn, &mut out)?;
        if conn.is_closed() {
            break;
        }
    }
    let Some(secs) = done else {
        return Err(format!("connection closed after {got} of {want} bytes: {:?}", conn.peer_error()).into());
    };
    if got != want {
        return Err(format!("received {got} bytes, expected {want}").into());
    }
    println!("bytes={got} seconds={secs:.3}");
    Ok(())
}
