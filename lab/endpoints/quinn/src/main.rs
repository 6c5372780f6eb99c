//! quinn-bulk: one-stream bulk transfer over quinn (rustls + ring), for qprof's tests.
//!
//!   quinn-bulk [--multi-thread] server ADDR CERT KEY   serve until killed
//!   quinn-bulk [--multi-thread] client ADDR BYTES      download BYTES on one bidirectional stream
//!
//! The client sends an 8-byte big-endian count; the server answers with that
//! many bytes written from one reused buffer and finishes the stream. The
//! client reads to the end, checks the count and prints `bytes=N seconds=S`.
//!
//! QPROF_BULK_RATE_MBIT=R makes the server pace its own writes to R Mbit/s (an
//! application-limited sender). QLOGDIR=DIR makes both ends write each
//! connection's qlog (quinn-proto's own streamer) to DIR/server-ODCID.sqlog and
//! DIR/client-PID.sqlog.

use std::fs::File;
use std::io::{BufWriter, ErrorKind, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use quinn::{Endpoint, QlogConfig, TransportConfig, VarInt};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};

const ALPN: &[u8] = b"qprof-bulk";
const CHUNK: usize = 1 << 20;
const STREAM_WINDOW: u32 = 64 << 20;
const CONN_WINDOW: u32 = 128 << 20;

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// The transport settings; `qlog`: the one connection they serve writes its qlog there.
fn transport(qlog: Option<&QlogFile>) -> Arc<TransportConfig> {
    let mut t = TransportConfig::default();
    t.stream_receive_window(VarInt::from_u32(STREAM_WINDOW));
    t.receive_window(VarInt::from_u32(CONN_WINDOW));
    t.send_window(CONN_WINDOW as u64);
    t.max_idle_timeout(Some(VarInt::from_u32(30_000).into()));
    if let Some(q) = qlog {
        let mut c = QlogConfig::default();
        c.writer(Box::new(q.clone())).title(Some("quinn-bulk".into()));
        t.qlog_stream(c.into_stream());
    }
    Arc::new(t)
}

/// One connection's qlog file (QLOGDIR), shared between quinn, which writes it, and the connection's
/// task, which flushes it once the connection is over: the file is whole then, also when the process
/// is killed after (the server runs until killed). Buffered: quinn writes each event in many pieces.
#[derive(Clone)]
struct QlogFile(Arc<Mutex<BufWriter<File>>>);

impl QlogFile {
    /// DIR/ROLE-ID.sqlog when QLOGDIR=DIR is set; None (nothing opened, nothing logged) when not.
    fn create(role: &str, id: impl FnOnce() -> String) -> Option<QlogFile> {
        let dir = std::env::var_os("QLOGDIR")?;
        let path = Path::new(&dir).join(format!("{role}-{}.sqlog", id()));
        let file = std::fs::create_dir_all(&dir).and_then(|_| File::create(&path)).unwrap_or_else(|e| {
            eprintln!("quinn-bulk: qlog {}: {e}", path.display());
            std::process::exit(1)
        });
        Some(QlogFile(Arc::new(Mutex::new(BufWriter::with_capacity(1 << 20, file)))))
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

/// The server's own sending rate in bytes/s from QPROF_BULK_RATE_MBIT (None: as fast as it can).
fn app_rate() -> Option<f64> {
    let v = std::env::var("QPROF_BULK_RATE_MBIT").ok()?;
    match v.parse::<f64>() {
        Ok(r) if r > 0.0 => Some(r * 1e6 / 8.0),
        _ => {
            eprintln!("quinn-bulk: QPROF_BULK_RATE_MBIT must be a positive number of Mbit/s, not {v:?}");
            std::process::exit(1)
        }
    }
}

fn usage() -> ! {
    eprintln!("usage: quinn-bulk [--multi-thread] server ADDR CERT KEY | quinn-bulk [--multi-thread] client ADDR BYTES");
    std::process::exit(2)
}

fn main() {
    let mut args: Vec<String> = std::env::args().collect();
    // `--multi-thread` first: tokio's default runtime (what `#[tokio::main]` builds: a worker per
    // CPU plus the blocking pool); without it one current-thread runtime does all the work
    let multi = args.get(1).map(String::as_str) == Some("--multi-thread");
    if multi {
        args.remove(1);
    }
    let rt = if multi {
        tokio::runtime::Builder::new_multi_thread().enable_all().build()
    } else {
        tokio::runtime::Builder::new_current_thread().enable_all().build()
    }
    .expect("tokio runtime");
    let res = match args.get(1).map(String::as_str) {
        Some("server") if args.len() == 5 => rt.block_on(server(&args[2], &args[3], &args[4])),
        Some("client") if args.len() == 4 => rt.block_on(client(&args[2], &args[3])),
        _ => usage(),
    };
    if let Err(e) = res {
        eprintln!("quinn-bulk: {e}");
        std::process::exit(1);
    }
}

async fn server(addr: &str, cert: &str, key: &str) -> Res<()> {
    let addr: SocketAddr = addr.parse()?;
    let certs = CertificateDer::pem_file_iter(cert)?.collect::<Result<Vec<_>, _>>()?;
    let key = PrivateKeyDer::from_pem_file(key)?;
    let mut tls = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_no_client_auth()
        .with_single_cert(certs, key)?;
    tls.alpn_protocols = vec![ALPN.to_vec()];
    let mut cfg = quinn::ServerConfig::with_crypto(Arc::new(QuicServerConfig::try_from(tls)?));
    cfg.transport_config(transport(None));
    let endpoint = Endpoint::server(cfg.clone(), addr)?;
    while let Some(incoming) = endpoint.accept().await {
        let qlog = QlogFile::create("server", || incoming.orig_dst_cid().iter().map(|b| format!("{b:02x}")).collect());
        let connecting = match &qlog {
            Some(q) => {
                // the connection's own transport settings carry its qlog file
                let mut own = cfg.clone();
                own.transport_config(transport(Some(q)));
                incoming.accept_with(Arc::new(own))
            }
            None => incoming.accept(),
        };
        tokio::spawn(async move {
            if let Err(e) = serve(connecting).await {
                eprintln!("quinn-bulk server: connection: {e}");
            }
            if let Some(q) = qlog {
                q.flush_now();
            }
        });
    }
    Ok(())
}

async fn serve(connecting: Result<quinn::Connecting, quinn::ConnectionError>) -> Res<()> {
    let conn = connecting?.await?;
    let buf = vec![0x5au8; CHUNK];
    loop {
        let (mut send, mut recv) = match conn.accept_bi().await {
            Ok(s) => s,
            Err(quinn::ConnectionError::ApplicationClosed(_)) => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        let mut hdr = [0u8; 8];
        recv.read_exact(&mut hdr).await?;
        let mut left = u64::from_be_bytes(hdr);
        let rate = app_rate();
        let chunk = if rate.is_some() { 16 << 10 } else { CHUNK }; // paced: small writes, each when due
        let (start, mut sent) = (tokio::time::Instant::now(), 0u64);
        while left > 0 {
            let n = left.min(chunk as u64) as usize;
            if let Some(r) = rate {
                tokio::time::sleep_until(start + Duration::from_secs_f64(sent as f64 / r)).await;
            }
            send.write_all(&buf[..n]).await?;
            left -= n as u64;
            sent += n as u64;
        }
        send.finish()?;
        // keep the stream alive until the peer has everything (or closes)
        let _ = send.stopped().await;
    }
}

async fn client(addr: &str, bytes: &str) -> Res<()> {
    let addr: SocketAddr = addr.parse()?;
    let want: u64 = bytes.parse()?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut tls = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCert(provider)))
        .with_no_client_auth();
    tls.alpn_protocols = vec![ALPN.to_vec()];
    let mut cfg = quinn::ClientConfig::new(Arc::new(QuicClientConfig::try_from(tls)?));
    // the ODCID is chosen inside quinn, after the settings are made: the file is named by the process
    let qlog = QlogFile::create("client", || std::process::id().to_string());
    cfg.transport_config(transport(qlog.as_ref()));
    let bind: SocketAddr = if addr.is_ipv6() { "[::]:0" } else { "0.0.0.0:0" }.parse()?;
    let mut endpoint = Endpoint::client(bind)?;
    endpoint.set_default_client_config(cfg);

    let start = Instant::now();
    let conn = endpoint.connect(addr, "localhost")?.await?;
    let (mut send, mut recv) = conn.open_bi().await?;
    send.write_all(&want.to_be_bytes()).await?;
    send.finish()?;
    let mut got: u64 = 0;
    while let Some(chunk) = recv.read_chunk(usize::MAX, true).await? {
        got += chunk.bytes.len() as u64;
    }
    let secs = start.elapsed().as_secs_f64();
    conn.close(0u32.into(), b"done");
    endpoint.wait_idle().await;
    if let Some(q) = qlog {
        q.flush_now();
    }
    if got != want {
        return Err(format!("received {got} bytes, expected {want}").into());
    }
    println!("bytes={got} seconds={secs:.3}");
    Ok(())
}

/// Test-only verifier: accepts any server certificate, still checks handshake signatures.
#[derive(Debug)]
struct AnyCert(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for AnyCert {
    fn verify_server_cert(&self, _: &CertificateDer<'_>, _: &[CertificateDer<'_>], _: &ServerName<'_>,
                          _: &[u8], _: UnixTime) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(&self, msg: &[u8], cert: &CertificateDer<'_>, dss: &DigitallySignedStruct)
                              -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(msg, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(&self, msg: &[u8], cert: &CertificateDer<'_>, dss: &DigitallySignedStruct)
                              -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(msg, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
