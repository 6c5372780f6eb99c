// Bulk-transfer QUIC endpoint on quic-go, for qprof's tests.
//
//	quicgo server ADDR CERT KEY   serve until killed
//	quicgo client ADDR BYTES      download BYTES, print "bytes=N seconds=S", exit 0
//
// With QPROF_BULK_WORK=PASSES the client does work of its own on what it
// receives: it reads 256 KiB blocks and hashes each PASSES times
// (main.checksum), timing that with its thread's CPU clock, and adds
// "work_seconds=W cpu_seconds=T" (T: the whole process's CPU time) to its line.
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
	"runtime"
	"strconv"
	"syscall"
	"time"
	"unsafe"

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

// checksum is the client's own work on received data (QPROF_BULK_WORK).
//
//go:noinline
func checksum(b []byte, passes int) uint64 {
	h := uint64(14695981039346656037)
	for p := 0; p < passes; p++ {
		for i := 0; i+8 <= len(b); i += 8 {
			x := binary.LittleEndian.Uint64(b[i:]) ^ h
			x ^= x >> 29
			x *= 0xbf58476d1ce4e5b9
			h += x ^ (x >> 32)
		}
	}
	return h
}

// threadCPU is this OS thread's CPU time (the goroutine is locked to it).
func threadCPU() time.Duration {
	var ts syscall.Timespec
	syscall.Syscall(syscall.SYS_CLOCK_GETTIME, 3 /* CLOCK_THREAD_CPUTIME_ID */, uintptr(unsafe.Pointer(&ts)), 0)
	return time.Duration(ts.Nano())
}

func processCPU() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}

func client(addr string, want uint64) {
	passes, _ := strconv.Atoi(os.Getenv("QPROF_BULK_WORK"))
	if passes > 0 {
		runtime.LockOSThread() // the work's CPU time is read from this thread's clock
	}
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
	if passes > 0 {
		buf = buf[:256<<10] // whole blocks: two clock reads per 256 KiB of work
	}
	var got uint64
	var work time.Duration
	var sink uint64
	for {
		var n int
		var err error
		if passes > 0 {
			n, err = io.ReadFull(str, buf)
			if errors.Is(err, io.ErrUnexpectedEOF) {
				err = io.EOF
			}
			t0 := threadCPU()
			sink += checksum(buf[:n], passes)
			work += threadCPU() - t0
		} else {
			n, err = str.Read(buf)
		}
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
	if passes > 0 {
		fmt.Printf("bytes=%d seconds=%.3f work_seconds=%.6f cpu_seconds=%.6f checksum=%x\n", got, secs,
			work.Seconds(), processCPU(), sink)
		return
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
