//go:build unix

package interop

import (
	"bytes"
	"io"
	"net"
	"net/url"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
)

// TestToolCallCutMidAnswer: the TypeScript SDK v1 server runs a tool that is
// not replay-safe, and mcpheal's connection to it is reset right after the
// call's first event (a load balancer's timeout, a network blip). With an
// event store the server can resume the answer stream: every client gets
// the result, and the tool ran once. Without one, nothing can fetch the
// rest: -32011, and the tool ran once.
func TestToolCallCutMidAnswer(t *testing.T) {
	t.Parallel()
	for _, store := range []bool{true, false} {
		for _, flavour := range flavours {
			name := flavour + map[bool]string{true: "/event-store", false: "/no-event-store"}[store]
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				countFile := filepath.Join(t.TempDir(), "work.count")
				srv := startV1Server(t, v1Opts{countFile: countFile, eventStore: store})
				cut := startCutRelay(t, srv.url())
				a := newAgent(t, flavour, startProxy(t, cut.url), "proxied-"+flavour)
				if r := a.connect(); !r.OK {
					t.Fatalf("through mcpheal: %v", r)
				}
				cut.after("work " + flavour + " started")
				r := a.call("work", map[string]any{"tag": flavour, "ms": 300, "notify": true})
				if n := cut.cuts.Load(); n != 1 {
					t.Fatalf("the relay cut %d connections, want 1 (call: %v)", n, r)
				}
				if n := countLines(countFile); n != 1 {
					t.Errorf("the work tool ran %d times, want exactly 1", n)
				}
				if !store {
					if !r.hasCode(codeMayHaveRun) {
						t.Errorf("cut without an event store: %v (text %q); want JSON-RPC error %d", r, r.TextHead, codeMayHaveRun)
					}
					return
				}
				if !r.OK || r.TextHead != "done "+flavour {
					t.Errorf("cut with an event store: %v, text %q; want the tool's result", r, r.TextHead)
				}
			})
		}
	}
}

// cutRelay is a TCP relay on 127.0.0.1 in front of an MCP server that
// resets, once, the connection on which the server sends bytes containing
// a pattern, right after forwarding them.
type cutRelay struct {
	url     string
	pattern atomic.Pointer[[]byte]
	cuts    atomic.Int32
	// seen, when set, makes the relay only signal the pattern: closed
	// (and cleared) when it passed, and nothing is cut.
	seen atomic.Pointer[chan struct{}]
}

// startCutRelay relays to the server at serverURL until the test ends.
func startCutRelay(t *testing.T, serverURL string) *cutRelay {
	t.Helper()
	u, err := url.Parse(serverURL)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &cutRelay{url: "http://" + ln.Addr().String() + u.Path}
	var wg sync.WaitGroup
	var mu sync.Mutex // protects open
	open := map[net.Conn]bool{}
	track := func(cs ...net.Conn) {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range cs {
			open[c] = true
		}
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", u.Host)
			if err != nil {
				_ = in.Close()
				continue
			}
			track(in, out)
			wg.Add(2)
			go func() { defer wg.Done(); r.pipe(out, in) }()
			go func() { defer wg.Done(); _, _ = io.Copy(out, in); _ = out.Close() }()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for c := range open {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return r
}

// after arms the relay: the next server bytes containing pattern are the
// last of their connection.
func (r *cutRelay) after(pattern string) {
	b := []byte(pattern)
	r.pattern.Store(&b)
}

// watch arms the relay to signal, and not cut, the next server bytes
// containing pattern: the channel is closed once they passed.
func (r *cutRelay) watch(pattern string) <-chan struct{} {
	ch := make(chan struct{})
	r.seen.Store(&ch)
	r.after(pattern)
	return ch
}

// pipe copies the server's bytes to mcpheal, and resets both connections
// after the bytes the relay is armed for.
func (r *cutRelay) pipe(from, to net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := from.Read(buf)
		if n > 0 {
			if _, werr := to.Write(buf[:n]); werr != nil {
				break
			}
			if p := r.pattern.Load(); p != nil && bytes.Contains(buf[:n], *p) && r.pattern.CompareAndSwap(p, nil) {
				if ch := r.seen.Swap(nil); ch != nil {
					close(*ch)
					continue
				}
				r.cuts.Add(1)
				for _, c := range []net.Conn{from, to} {
					if tc, ok := c.(*net.TCPConn); ok {
						_ = tc.SetLinger(0) // RST, not FIN
					}
					_ = c.Close()
				}
				return
			}
		}
		if err != nil { // the server ended it (or the test did): so does the relay
			break
		}
	}
	_ = to.Close()
	_ = from.Close()
}

// TestAgentCutMidAnswer: the client's own connection to mcpheal is reset
// right after the first event of a not-replay-safe call (an agent's Wi-Fi,
// a gateway between agent and mcpheal), in front of a TypeScript SDK v1
// server that keeps no events. Every client that resumes (the TypeScript
// SDK v1 and v2, and mcp-remote, which runs the v1 client) comes back with
// GET and the Last-Event-ID mcpheal gave it, and gets the result from
// mcpheal's log; the tool ran once.
func TestAgentCutMidAnswer(t *testing.T) {
	t.Parallel()
	for _, flavour := range flavours {
		t.Run(flavour, func(t *testing.T) {
			t.Parallel()
			countFile := filepath.Join(t.TempDir(), "work.count")
			srv := startV1Server(t, v1Opts{countFile: countFile})
			cut := startCutRelay(t, startProxy(t, srv.url()))
			a := newAgent(t, flavour, cut.url, "proxied-"+flavour)
			if r := a.connect(); !r.OK {
				t.Fatalf("through mcpheal: %v", r)
			}
			cut.after("work " + flavour + " started")
			r := a.call("work", map[string]any{"tag": flavour, "ms": 300, "notify": true})
			if n := cut.cuts.Load(); n != 1 {
				t.Fatalf("the relay cut %d connections, want 1 (call: %v)", n, r)
			}
			if !r.OK || r.TextHead != "done "+flavour {
				t.Errorf("call whose connection was cut: %v, text %q; want the tool's result", r, r.TextHead)
			}
			if n := countLines(countFile); n != 1 {
				t.Errorf("the work tool ran %d times, want exactly 1", n)
			}
		})
	}
}
