//! s2n-quic-bulk: one-stream bulk transfer over s2n-quic (s2n-tls + aws-lc), for qprof's tests.
//!
//!   s2n-quic-bulk [--multi-thread] server ADDR CERT KEY   serve until killed
//!   s2n-quic-bulk [--multi-thread] client ADDR BYTES      download BYTES on one bidirectional stream
//!
//! The client sends an 8-byte big-endian count; the server answers with that
//! many bytes (slices of one reused buffer) and closes the stream, waiting for
//! the peer's acknowledgements (`close().await`: finishing alone would leave
//! the client waiting for an idle timeout). The client reads to the end,
//! checks the count and prints `bytes=N seconds=S`.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use s2n_quic::client::Connect;
use s2n_quic::provider::limits::Limits;
use s2n_quic::provider::tls::default as tls;
use s2n_quic::stream::BidirectionalStream;
use s2n_quic::{Client, Server};

const ALPN: &str = "qprof-bulk";
const CHUNK: usize = 1 << 20;
const STREAM_WINDOW: u64 = 64 << 20;
const CONN_WINDOW: u64 = 128 << 20;

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn limits() -> Res<Limits> {
    Ok(Limits::new()
        .with_data_window(CONN_WINDOW)?
        .with_bidirectional_local_data_window(STREAM_WINDOW)?
        .with_bidirectional_remote_data_window(STREAM_WINDOW)?
        .with_max_send_buffer_size(16 << 20)?
        .with_max_idle_timeout(Duration::from_secs(30))?)
}

fn usage() -> ! {
    eprintln!("usage: s2n-quic-bulk [--multi-thread] server ADDR CERT KEY | s2n-quic-bulk [--multi-thread] client ADDR BYTES");
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
        eprintln!("s2n-quic-bulk: {e}");
        std::process::exit(1);
    }
}

async fn server(addr: &str, cert: &str, key: &str) -> Res<()> {
    let addr: SocketAddr = addr.parse()?;
    let tls = tls::Server::builder()
        .with_certificate(Path::new(cert), Path::new(key))?
        .with_application_protocols([ALPN])?
        .build()?;
    let mut server = Server::builder().with_tls(tls)?.with_io(addr)?.with_limits(limits()?)?.start()?;
    while let Some(mut conn) = server.accept().await {
        tokio::spawn(async move {
            while let Ok(Some(stream)) = conn.accept_bidirectional_stream().await {
                tokio::spawn(async move {
                    if let Err(e) = serve(stream).await {
                        eprintln!("s2n-quic-bulk server: stream: {e}");
                    }
                });
            }
        });
    }
    Ok(())
}

async fn serve(mut stream: BidirectionalStream) -> Res<()> {
    let mut hdr = Vec::with_capacity(8);
    while hdr.len() < 8 {
        match stream.receive().await? {
            Some(b) => hdr.extend_from_slice(&b),
            None => return Err("stream ended before the 8-byte count".into()),
        }
    }
    let mut left = u64::from_be_bytes(hdr[..8].try_into()?);
    let buf = Bytes::from(vec![0x5au8; CHUNK]);
    while left > 0 {
        let n = left.min(CHUNK as u64) as usize;
        stream.send(buf.slice(..n)).await?;
        left -= n as u64;
    }
    // waits until the peer acknowledged everything; the peer may close the
    // connection as soon as it has read the last byte, which ends this early
    let _ = stream.close().await;
    Ok(())
}

async fn client(addr: &str, bytes: &str) -> Res<()> {
    let addr: SocketAddr = addr.parse()?;
    let want: u64 = bytes.parse()?;
    let mut tls = tls::Client::builder();
    // test-only: accept the server's self-signed certificate
    unsafe {
        tls.config_mut().disable_x509_verification()?;
    }
    let tls = tls.with_application_protocols([ALPN])?.build()?;
    let bind = if addr.is_ipv6() { "[::]:0" } else { "0.0.0.0:0" };
    let mut client = Client::builder().with_tls(tls)?.with_io(bind)?.with_limits(limits()?)?.start()?;

    let start = Instant::now();
    let mut conn = client.connect(Connect::new(addr).with_server_name("localhost")).await?;
    let mut stream = conn.open_bidirectional_stream().await?;
    stream.send(Bytes::copy_from_slice(&want.to_be_bytes())).await?;
    stream.finish()?;
    let mut got: u64 = 0;
    while let Some(chunk) = stream.receive().await? {
        got += chunk.len() as u64;
    }
    let secs = start.elapsed().as_secs_f64();
    conn.close(0u32.into());
    drop(stream);
    drop(conn);
    let _ = tokio::time::timeout(Duration::from_secs(2), client.wait_idle()).await;
    if got != want {
        return Err(format!("received {got} bytes, expected {want}").into());
    }
    println!("bytes={got} seconds={secs:.3}");
    Ok(())
}
