package peers

import (
	"errors"
	"io"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestRelayModes: the relay does what the fault tests rely on, on a plain TCP
// echo server: pass-through, reset after idle, blackhole, down (counted), and
// it leaves no goroutine behind.
func TestRelayModes(t *testing.T) {
	CheckGoroutines(t)
	echo := startTCPEcho(t)
	r := NewTCPRelay(t, echo)
	roundTrip := func(c net.Conn, msg string) error {
		_ = c.SetDeadline(time.Now().Add(300 * time.Millisecond))
		if _, err := c.Write([]byte(msg)); err != nil {
			return err
		}
		got := make([]byte, len(msg))
		if _, err := io.ReadFull(c, got); err != nil {
			return err
		}
		if string(got) != msg {
			return errors.New("echo " + string(got) + ", want " + msg)
		}
		return nil
	}
	dial := func() net.Conn {
		c, err := net.Dial("tcp", r.Addr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c
	}

	c := dial()
	if err := roundTrip(c, "pass"); err != nil {
		t.Fatalf("pass: %v", err)
	}

	r.ResetIdle(50 * time.Millisecond)
	if err := roundTrip(c, "busy"); err != nil {
		t.Fatalf("reset-idle, connection not idle: %v", err)
	}
	time.Sleep(100 * time.Millisecond)
	err := roundTrip(c, "late")
	if !errors.Is(err, syscall.ECONNRESET) || r.Resets() != 1 {
		t.Fatalf("reset-idle after 100ms idle: err %v (want ECONNRESET), %d resets", err, r.Resets())
	}

	r.Blackhole(50 * time.Millisecond)
	c = dial()
	if err := roundTrip(c, "fresh"); err != nil {
		t.Fatalf("blackhole, fresh connection: %v", err)
	}
	time.Sleep(100 * time.Millisecond)
	err = roundTrip(c, "lost")
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() || r.Holes() != 1 {
		t.Fatalf("blackhole after 100ms idle: err %v (want a timeout), %d holes", err, r.Holes())
	}

	r.Down()
	before := r.Accepted()
	// The kernel completes the handshake before the relay accepts, so the
	// reset shows on the round trip, or on the dial if it came first.
	if c, err := net.Dial("tcp", r.Addr()); err == nil {
		err = roundTrip(c, "down")
		_ = c.Close()
		if err == nil {
			t.Fatal("down: round trip succeeded")
		}
	} else if !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("down: dial: %v, want success or ECONNRESET", err)
	}
	Wait(t, "the refused connection to be counted", func() bool { return r.Accepted() == before+1 })
	if r.Accepted() != before+1 || r.Refused() != 1 {
		t.Fatalf("down: %d accepted (want %d), %d refused (want 1)", r.Accepted(), before+1, r.Refused())
	}

	r.Pass()
	if err := roundTrip(dial(), "back"); err != nil {
		t.Fatalf("pass again: %v", err)
	}
}

// startTCPEcho serves a TCP echo on 127.0.0.1 until cleanup.
func startTCPEcho(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex // protects conns
	conns := map[net.Conn]bool{}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns[c] = true
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, _ = io.Copy(c, c)
				_ = c.Close()
			}()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}
