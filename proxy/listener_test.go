package proxy

import (
	"context"
	"errors"
	"net"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/mcpheal/mcpheal/proxy/internal/conf"
	"github.com/mcpheal/mcpheal/proxy/internal/peers"
	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"
)

// flakyListener fails its first Accepts with err, then accepts from a real
// listener.
type flakyListener struct {
	net.Listener
	fails atomic.Int32
	err   error
}

func (l *flakyListener) Accept() (net.Conn, error) {
	if l.fails.Add(-1) >= 0 {
		return nil, l.err
	}
	return l.Listener.Accept()
}

// TestPatientListener: accept errors a host under a connection flood gives
// (EMFILE) are waited out and counted, so that Serve never returns on them;
// a closed listener still ends Accept, also in the middle of a wait.
func TestPatientListener(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fl := &flakyListener{Listener: ln, err: &net.OpError{Op: "accept", Net: "tcp", Err: syscall.EMFILE}}
	fl.fails.Store(4)
	var errs atomic.Uint64
	log := zerolog.Nop()
	var shed atomic.Uint64
	pl := newPatientListener(fl, &log, &errs, &shed)
	go func() {
		if c, err := net.Dial("tcp", ln.Addr().String()); err == nil {
			defer c.Close()
			buf := make([]byte, 1)
			_, _ = c.Read(buf)
		}
	}()
	c, err := pl.Accept()
	if err != nil {
		t.Fatalf("Accept after 4 EMFILE: %v", err)
	}
	_ = c.Close()
	if n := errs.Load(); n != 4 {
		t.Errorf("counted %d accept errors, want 4", n)
	}

	fl.fails.Store(1 << 20) // out of descriptors for good: Close must end the wait
	done := make(chan error, 1)
	go func() {
		_, err := pl.Accept()
		done <- err
	}()
	for errs.Load() < 6 { // it is waiting
		runtime.Gosched()
	}
	_ = pl.Close()
	if err := <-done; !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept after Close: %v, want net.ErrClosed", err)
	}
}

// TestConnectionCap: at the cap a new agent connection takes the place of
// the one idle longest (connected and silent, or between requests); a
// connection in the middle of a request is never shed, and with none idle
// the new one is refused. Each is counted.
func TestConnectionCap(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var errs, shed atomic.Uint64
	log := zerolog.Nop()
	pl := newPatientListener(ln, &log, &errs, &shed)
	pl.max, pl.checked = 3, time.Now().Add(time.Hour) // never read again from the limit
	var gate atomic.Pointer[chan struct{}]
	release := make(chan struct{})
	gate.Store(&release)
	srv := newFastHTTPServer(func(ctx *fasthttp.RequestCtx) {
		if string(ctx.Path()) == "/slow" {
			<-*gate.Load()
		}
		ctx.SetBodyString("ok")
	}, log, listenerLimits{maxBody: 1 << 10, maxHeader: 4 << 10, readTimeout: time.Minute})
	go func() { _ = srv.Serve(pl) }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	addr := ln.Addr().String()
	dial := func() net.Conn {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	get := func(c net.Conn, path string) string {
		if _, err := c.Write([]byte("GET " + path + " HTTP/1.1\r\nHost: x\r\n\r\n")); err != nil {
			return err.Error()
		}
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		b := make([]byte, 512)
		n, err := c.Read(b)
		if err != nil {
			return err.Error()
		}
		return string(b[:n])
	}
	closedByPeer := func(c net.Conn) bool {
		_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
		_, err := c.Read(make([]byte, 1))
		var ne net.Error
		return err != nil && !(errors.As(err, &ne) && ne.Timeout())
	}
	waitOpen := func(n int) {
		for {
			pl.mu.Lock()
			open := pl.open
			pl.mu.Unlock()
			if open == n {
				return
			}
			runtime.Gosched()
		}
	}
	// waitIdle waits for the listener to count n connections idle: fasthttp
	// reports a connection idle after its answer has gone, so an agent can
	// read the answer before the connection counts as idle.
	waitIdle := func(n int) {
		for {
			pl.mu.Lock()
			idle := len(pl.idle)
			pl.mu.Unlock()
			if idle == n {
				return
			}
			runtime.Gosched()
		}
	}

	// Three connections: the first silent, the second answered once (idle
	// between requests), the third in the middle of a slow request.
	silent := dial()
	waitOpen(1)
	between := dial()
	if got := get(between, "/"); !strings.Contains(got, "ok") {
		t.Fatalf("first request: %q", got)
	}
	busy := dial()
	slow := make(chan string, 1)
	go func() { slow <- get(busy, "/slow") }()
	waitOpen(3)
	for srv.GetOpenConnectionsCount() < 3 {
		runtime.Gosched()
	}

	// A fourth sheds the silent one, a fifth the one between requests.
	fourth := dial()
	if !closedByPeer(silent) {
		t.Fatal("the silent connection was not shed for a new one")
	}
	if got := get(fourth, "/"); !strings.Contains(got, "ok") {
		t.Fatalf("the new connection: %q", got)
	}
	fifth := dial()
	if !closedByPeer(between) {
		t.Fatal("the connection between requests was not shed")
	}
	if got := get(fifth, "/"); !strings.Contains(got, "ok") {
		t.Fatalf("the fifth connection: %q", got)
	}
	// fourth and fifth are idle again, busy is not: a sixth sheds fourth
	// (idle longest), never busy, whose request completes.
	waitIdle(2)
	sixth := dial()
	if !closedByPeer(fourth) {
		t.Fatal("the connection idle longest was not shed")
	}
	close(release)
	if got := <-slow; !strings.Contains(got, "ok") {
		t.Fatalf("the connection in the middle of a request: %q; it must never be shed", got)
	}
	if got := get(sixth, "/"); !strings.Contains(got, "ok") {
		t.Fatalf("the sixth connection: %q", got)
	}
	if n := shed.Load(); n != 3 {
		t.Errorf("%d connections shed, want 3", n)
	}

	// Every connection in the middle of a request (each new one shed an
	// idle one): a new one is refused.
	hold := make(chan struct{})
	gate.Store(&hold)
	var wait []chan string
	waitIdle(3) // busy, fifth and sixth
	for i := range 3 {
		c := dial()
		ch := make(chan string, 1)
		go func() { ch <- get(c, "/slow") }()
		wait = append(wait, ch)
		// It shed one idle connection and is busy itself before the next
		// comes: a new one still waiting for its first byte is idle too.
		waitIdle(2 - i)
	}
	before := shed.Load()
	if refused := dial(); !closedByPeer(refused) {
		t.Fatal("a new connection with every other one busy was not refused")
	}
	if n := shed.Load() - before; n != 1 {
		t.Errorf("%d shed for the refusal, want 1", n)
	}
	close(hold)
	for _, ch := range wait {
		if got := <-ch; !strings.Contains(got, "ok") {
			t.Fatalf("a busy connection: %q", got)
		}
	}
}

// TestShutdownEndsServe: a Serve that begins as Shutdown runs, or after
// it, returns: fasthttp's Shutdown closes only the listeners its Serve
// already holds, and a Serve a moment later served on for ever (the
// conformance suite's client wrapper hung on it when its client exited at
// once). For the Router and the Server alike, 200 times each with Serve
// and Shutdown racing, every Serve returns.
func TestShutdownEndsServe(t *testing.T) {
	t.Parallel()
	up := peers.StartGoSDK(t, peers.GoSDKOpts{})
	type served interface {
		Serve(net.Listener) error
		Shutdown(context.Context) error
	}
	for _, tc := range []struct {
		name string
		make func(addr string) served
	}{
		{"router", func(addr string) served {
			r, err := NewRouter(addr, []conf.Config{{Upstream: up.URL(), Listen: addr, AdminListen: conf.AdminOff}}, nopLog())
			if err != nil {
				t.Fatal(err)
			}
			return r
		}},
		{"server", func(addr string) served {
			s, err := New(conf.Config{Upstream: up.URL(), Listen: addr, AdminListen: conf.AdminOff}, nopLog())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(s.Close)
			return s
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for i := range 200 {
				ln, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					t.Fatal(err)
				}
				srv := tc.make(ln.Addr().String())
				done := make(chan error, 1)
				if i%2 == 0 {
					go func() { done <- srv.Serve(ln) }()
					_ = srv.Shutdown(context.Background())
				} else {
					_ = srv.Shutdown(context.Background())
					go func() { done <- srv.Serve(ln) }()
				}
				select {
				case <-done:
				case <-time.After(peers.Timeout):
					t.Fatalf("run %d: Serve still serving %v after Shutdown", i, peers.Timeout)
				}
			}
		})
	}
}
