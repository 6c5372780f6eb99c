// Bulk-transfer QUIC endpoint on quic-go, for qprof's tests.
//
//	quicgo server ADDR CERT KEY   serve until killed
//	quicgo client ADDR BYTES      download BYTES, print "bytes=N seconds=S", exit 0
//
// Protocol: the client opens one bidirectional stream and writes the byte
// count (8 bytes, big-endian), then closes its send side; the server writes
// that many bytes from a reused random buffer and closes the stream; the
// client reads until EOF and checks the count.
//
// Environment: QPROF_BULK_RATE_MBIT=R makes the server pace its own writes to
// R Mbit/s (an application-limited sender); QLOGDIR=DIR makes both ends
// write a qlog per connection into DIR (quic-go's own tracer).
package main

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/qlog"
)

const alpn = "qprof-bulk"

func config() *quic.Config {
	return &quic.Config{
		InitialStreamReceiveWindow:     16 << 20,
		MaxStreamReceiveWindow:         64 << 20,
		InitialConnectionReceiveWindow: 32 << 20,
		MaxConnectionReceiveWindow:     128 << 20,
		MaxIdleTimeout:                 30 * time.Second,
		Tracer:                         qlog.DefaultConnectionTracer, // nil trace unless QLOGDIR is set
	}
}

// appRate is the server's own sending rate in bytes/s from QPROF_BULK_RATE_MBIT (0: as fast as it can).
func appRate() float64 {
	v := os.Getenv("QPROF_BULK_RATE_MBIT")
	if v == "" {
		return 0
	}
	r, err := strconv.ParseFloat(v, 64)
	if err != nil || r <= 0 {
		fail("QPROF_BULK_RATE_MBIT must be a positive number of Mbit/s, not %q", v)
	}
	return r * 1e6 / 8
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "quicgo: "+format+"\n", args...)
	os.Exit(1)
}

func server(addr, certFile, keyFile string) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		fail("loading certificate: %v", err)
	}
	tlsConf := &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{alpn}}
	ln, err := quic.ListenAddr(addr, tlsConf, config())
	if err != nil {
		fail("listen %s: %v", addr, err)
	}
	buf := make([]byte, 1<<20)
	if _, err := rand.Read(buf); err != nil {
		fail("random buffer: %v", err)
	}
	for {
		conn, err := ln.Accept(context.Background())
		if err != nil {
			fail("accept: %v", err)
		}
		go serve(conn, buf)
	}
}

func serve(conn *quic.Conn, buf []byte) {
	str, err := conn.AcceptStream(context.Background())
	if err != nil {
		return
	}
	var hdr [8]byte
	if _, err := io.ReadFull(str, hdr[:]); err != nil {
		conn.CloseWithError(1, "short request")
		return
	}
	left := binary.BigEndian.Uint64(hdr[:])
	rate, chunk := appRate(), uint64(len(buf))
	if rate > 0 {
		chunk = 16 << 10 // paced: small writes, each when the rate allows it
	}
	start, sent := time.Now(), 0.0
	for left > 0 {
		n := chunk
		if left < n {
			n = left
		}
		if rate > 0 {
			time.Sleep(time.Until(start.Add(time.Duration(sent / rate * float64(time.Second)))))
		}
		if _, err := str.Write(buf[:n]); err != nil {
			return
		}
		left -= n
		sent += float64(n)
	}
	str.Close()
	// the client closes the connection once it has read everything
	<-conn.Context().Done()
}

func client(addr string, want uint64) {
	tlsConf := &tls.Config{InsecureSkipVerify: true, NextProtos: []string{alpn}}
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	conn, err := quic.DialAddr(ctx, addr, tlsConf, config())
	cancel()
	if err != nil {
		fail("dial %s: %v", addr, err)
	}
	str, err := conn.OpenStreamSync(context.Background())
	if err != nil {
		fail("open stream: %v", err)
	}
	var hdr [8]byte
	binary.BigEndian.PutUint64(hdr[:], want)
	if _, err := str.Write(hdr[:]); err != nil {
		fail("request: %v", err)
	}
	str.Close()
	buf := make([]byte, 1<<20)
	var got uint64
	for {
		n, err := str.Read(buf)
		got += uint64(n)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			fail("read after %d bytes: %v", got, err)
		}
	}
	secs := time.Since(start).Seconds()
	conn.CloseWithError(0, "done")
	if got != want {
		fail("received %d bytes, expected %d", got, want)
	}
	fmt.Printf("bytes=%d seconds=%.3f\n", got, secs)
}

func main() {
	if len(os.Args) == 5 && os.Args[1] == "server" {
		server(os.Args[2], os.Args[3], os.Args[4])
		return
	}
	if len(os.Args) == 4 && os.Args[1] == "client" {
		n, err := strconv.ParseUint(os.Args[3], 10, 64)
		if err != nil || n == 0 {
			fail("BYTES must be a positive integer, not %q", os.Args[3])
		}
		client(os.Args[2], n)
		return
	}
	fmt.Fprintln(os.Stderr, "usage: quicgo server ADDR CERT KEY | quicgo client ADDR BYTES")
	os.Exit(2)
}
