package upstream

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"
)

// waitPair is tcpPair for a test of the waiter: a TCP connection has one
// on Linux.
func waitPair(t *testing.T) (*conn, net.Conn) {
	t.Helper()
	c, peer := tcpPair(t)
	if c.wait == nil {
		t.Fatal("no waiter for a TCP connection")
	}
	return c, peer
}

// TestWriteAwait: a request written with answerNext set returns only once
// its answer is there to read (or the read deadline passed, or the
// connection closed), and never misses an answer that arrives at once.
func TestWriteAwait(t *testing.T) {
	t.Parallel()
	req := []byte("ping")

	t.Run("answer later", func(t *testing.T) {
		t.Parallel()
		c, peer := waitPair(t)
		go func() {
			buf := make([]byte, len(req))
			if _, err := io.ReadFull(peer, buf); err == nil {
				time.Sleep(100 * time.Millisecond)
				peer.Write([]byte("pong"))
			}
		}()
		c.answerNext = true
		start := time.Now()
		n, err := c.Write(req)
		took := time.Since(start)
		if n != len(req) || err != nil || c.written != int64(len(req)) {
			t.Fatalf("Write = %d, %v (written %d); want %d, nil", n, err, c.written, len(req))
		}
		if took < 80*time.Millisecond || !c.wait.readable(0) {
			t.Fatalf("Write returned after %v, answer readable %v; want after the answer", took, c.wait.readable(0))
		}
		buf := make([]byte, 4)
		if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "pong" {
			t.Fatalf("answer %q, %v", buf, err)
		}
	})

	t.Run("answer at once", func(t *testing.T) {
		// The write follows the poller's readiness reset: an answer sent
		// the moment the request lands is seen, never waited past.
		t.Parallel()
		c, peer := waitPair(t)
		go func() {
			buf := make([]byte, len(req))
			for {
				if _, err := io.ReadFull(peer, buf); err != nil {
					return
				}
				peer.Write([]byte("pong"))
			}
		}()
		if err := c.nc.SetReadDeadline(time.Now().Add(time.Minute)); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 4)
		for i := range 500 {
			c.answerNext = true
			start := time.Now()
			if n, err := c.Write(req); n != len(req) || err != nil {
				t.Fatalf("exchange %d: Write = %d, %v", i, n, err)
			}
			if took := time.Since(start); took > 5*time.Second {
				t.Fatalf("exchange %d: Write waited %v for an answer sent at once", i, took)
			}
			if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "pong" {
				t.Fatalf("exchange %d: answer %q, %v", i, buf, err)
			}
		}
	})

	t.Run("no answer", func(t *testing.T) {
		t.Parallel()
		c, _ := waitPair(t)
		if err := c.nc.SetReadDeadline(time.Now().Add(50 * time.Millisecond)); err != nil {
			t.Fatal(err)
		}
		c.answerNext = true
		start := time.Now()
		if n, err := c.Write(req); n != len(req) || err != nil {
			t.Fatalf("Write = %d, %v; want the write to succeed", n, err)
		}
		if took := time.Since(start); took < 40*time.Millisecond {
			t.Fatalf("Write returned after %v, before the read deadline", took)
		}
		// The wait's end is the read's to report.
		if _, err := c.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("read after the deadline: %v", err)
		}
	})

	t.Run("closed while waiting", func(t *testing.T) {
		t.Parallel()
		c, _ := waitPair(t)
		time.AfterFunc(50*time.Millisecond, func() { c.nc.Close() })
		c.answerNext = true
		start := time.Now()
		if n, err := c.Write(req); n != len(req) || err != nil {
			t.Fatalf("Write = %d, %v", n, err)
		}
		if took := time.Since(start); took > 5*time.Second {
			t.Fatalf("Write waited %v on a closed connection", took)
		}
		if _, err := c.Read(make([]byte, 1)); !errors.Is(err, net.ErrClosed) {
			t.Fatalf("read after close: %v", err)
		}
	})

	t.Run("peer reset", func(t *testing.T) {
		// A failed write is reported as the net package reports one.
		t.Parallel()
		c, peer := waitPair(t)
		if err := peer.(*net.TCPConn).SetLinger(0); err != nil {
			t.Fatal(err)
		}
		peer.Close() // an RST
		time.Sleep(50 * time.Millisecond)
		c.answerNext = true
		_, err := c.Write(req)
		var oe *net.OpError
		if !errors.As(err, &oe) || oe.Op != "write" ||
			!errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) {
			t.Fatalf("Write after the peer's reset: %#v", err)
		}
	})

	t.Run("send buffer full", func(t *testing.T) {
		// More than the socket takes at once: the rest goes as usual, and
		// every byte arrives in order.
		t.Parallel()
		c, peer := waitPair(t)
		big := bytes.Repeat([]byte("0123456789abcdef"), 1<<19) // 8 MiB
		got := make(chan []byte, 1)
		go func() {
			time.Sleep(50 * time.Millisecond) // let the send buffer fill
			b := make([]byte, len(big))
			if _, err := io.ReadFull(peer, b); err != nil {
				got <- nil
				return
			}
			got <- b
			peer.Write([]byte("pong"))
		}()
		if err := c.nc.SetDeadline(time.Now().Add(time.Minute)); err != nil {
			t.Fatal(err)
		}
		c.answerNext = true
		if n, err := c.Write(big); n != len(big) || err != nil || c.written != int64(len(big)) {
			t.Fatalf("Write = %d, %v (written %d); want %d, nil", n, err, c.written, len(big))
		}
		if b := <-got; !bytes.Equal(b, big) {
			t.Fatalf("the peer read %d bytes, not the %d written", len(b), len(big))
		}
		buf := make([]byte, 4)
		if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "pong" {
			t.Fatalf("answer %q, %v", buf, err)
		}
	})
}
