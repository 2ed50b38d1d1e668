package peers

// TCPRelay: a TCP relay on 127.0.0.1 between the proxy and a real upstream,
// for fault injection. It plays the network middlebox that the
// field reports blame: a NAT or load balancer that forgets an idle flow and
// answers its next packet with a reset, one that forgets it silently, and an
// upstream host that is down.

import (
	"bytes"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// relayMode is what a TCPRelay does to the traffic it carries.
type relayMode int

const (
	// relayPass forwards everything both ways.
	relayPass relayMode = iota
	// relayResetIdle resets (RST: SO_LINGER 0, then close) a connection
	// idle longer than the limit when bytes next come from the proxy side,
	// and drops those bytes.
	relayResetIdle
	// relayBlackhole stops forwarding, silently and for good, on a
	// connection idle longer than the limit when bytes next come from
	// either side: they and everything after are read and dropped, nothing
	// is closed towards the proxy.
	relayBlackhole
	// relayDown accepts each new connection and resets it at once.
	relayDown
)

func (m relayMode) String() string {
	switch m {
	case relayPass:
		return "pass"
	case relayResetIdle:
		return "reset-idle"
	case relayBlackhole:
		return "blackhole"
	case relayDown:
		return "down"
	}
	return "unknown"
}

// RelayAttempt is one connection the relay accepted.
type RelayAttempt struct {
	At      time.Time
	Refused bool // reset at once because the relay was down
}

// TCPRelay forwards 127.0.0.1:port to a target address. Modes switch at
// runtime and apply to connections already open. It stops in t.Cleanup and
// leaves no goroutine behind. All methods are safe for concurrent use.
type TCPRelay struct {
	ln     net.Listener
	target string

	resets atomic.Int64 // connections reset for idling
	holes  atomic.Int64 // connections blackholed
	cuts   atomic.Int64 // connections reset by CutAfter
	// idleClosed counts connections closed by CloseIdle.
	idleClosed atomic.Int64

	// cutAfter, set by CutAfter: the next bytes from the upstream that
	// contain it are forwarded, then their connection is reset (once);
	// cutBefore, set by CutRequest: the next bytes from the proxy that
	// contain it are dropped and their connection reset (once).
	cutAfter  atomic.Pointer[[]byte]
	cutBefore atomic.Pointer[[]byte]

	mu       sync.Mutex // protects mode, limit, conns, attempts, closed
	mode     relayMode
	limit    time.Duration
	conns    map[*relayConn]struct{}
	attempts []RelayAttempt
	closed   bool

	wg   sync.WaitGroup // the accept loop and every connection's goroutines
	once sync.Once
}

// NewTCPRelay starts a pass-through relay to target ("host:port").
func NewTCPRelay(tb testing.TB, target string) *TCPRelay {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("relay listen: %v", err)
	}
	r := &TCPRelay{ln: ln, target: target, conns: make(map[*relayConn]struct{})}
	r.wg.Add(1)
	go r.serve()
	tb.Cleanup(r.Close)
	return r
}

// Addr returns the relay's "127.0.0.1:port".
func (r *TCPRelay) Addr() string { return r.ln.Addr().String() }

// URL returns the MCP endpoint through the relay, http://127.0.0.1:port/mcp
// (the path every peer serves).
func (r *TCPRelay) URL() string { return "http://" + r.Addr() + "/mcp" }

// Pass forwards everything again. Flows already blackholed stay dead, as
// they would behind a NAT that forgot them.
func (r *TCPRelay) Pass() { r.set(relayPass, 0) }

// ResetIdle resets every connection idle longer than limit when the proxy
// next sends on it (a load balancer or NAT that dropped the flow).
func (r *TCPRelay) ResetIdle(limit time.Duration) { r.set(relayResetIdle, limit) }

// Blackhole silently stops forwarding on every connection idle longer than
// limit when bytes next arrive on it. Blackhole(0) swallows every flow,
// new ones included, from its first byte: a hung upstream.
func (r *TCPRelay) Blackhole(limit time.Duration) { r.set(relayBlackhole, limit) }

// CutAfter resets, once, the connection on which the upstream next sends
// bytes that contain pattern, right after forwarding them: an answer cut
// mid-stream (a load balancer's timeout, a reset) after its first event.
func (r *TCPRelay) CutAfter(pattern string) {
	b := []byte(pattern)
	r.cutAfter.Store(&b)
}

// CutRequest resets, once, the connection on which the proxy next sends
// bytes that contain pattern, without forwarding them: a request written
// and lost on its way (the server never sees it, the proxy cannot know).
func (r *TCPRelay) CutRequest(pattern string) {
	b := []byte(pattern)
	r.cutBefore.Store(&b)
}

// Cuts counts connections reset by CutAfter and CutRequest.
func (r *TCPRelay) Cuts() int64 { return r.cuts.Load() }

// cut reports whether bytes b are the ones a CutAfter or CutRequest
// (which) waits for; the first such bytes disarm it.
func (r *TCPRelay) cut(which *atomic.Pointer[[]byte], b []byte) bool {
	p := which.Load()
	return p != nil && bytes.Contains(b, *p) && which.CompareAndSwap(p, nil)
}

// CloseIdle closes, from now until the relay closes, every connection
// that carried nothing either way for limit: a load balancer's idle
// timeout. It checks every limit/8.
func (r *TCPRelay) CloseIdle(limit time.Duration) {
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		t := time.NewTicker(limit / 8)
		defer t.Stop()
		for range t.C {
			r.mu.Lock()
			if r.closed {
				r.mu.Unlock()
				return
			}
			var idle []*relayConn
			for c := range r.conns {
				c.mu.Lock()
				if time.Since(c.last) > limit && !c.dead {
					idle = append(idle, c)
				}
				c.mu.Unlock()
			}
			r.mu.Unlock()
			for _, c := range idle {
				r.idleClosed.Add(1)
				c.close(false)
			}
		}
	}()
}

// IdleClosed counts connections closed by CloseIdle.
func (r *TCPRelay) IdleClosed() int64 { return r.idleClosed.Load() }

// Down resets every open connection, as a host that died would, and then
// accepts and resets each new one (counted by Attempts). Accept-and-RST
// rather than a closed listener, so that every connection attempt of the
// proxy is seen and counted.
func (r *TCPRelay) Down() {
	r.mu.Lock()
	r.mode = relayDown
	open := make([]*relayConn, 0, len(r.conns))
	for c := range r.conns {
		open = append(open, c)
	}
	r.mu.Unlock()
	for _, c := range open {
		c.close(true)
	}
}

func (r *TCPRelay) set(m relayMode, limit time.Duration) {
	r.mu.Lock()
	r.mode, r.limit = m, limit
	r.mu.Unlock()
}

func (r *TCPRelay) settings() (relayMode, time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.mode, r.limit
}

// Accepted counts every connection accepted, whatever the mode.
func (r *TCPRelay) Accepted() int { return len(r.Attempts()) }

// Refused counts connections reset at once because the relay was down.
func (r *TCPRelay) Refused() int {
	n := 0
	for _, a := range r.Attempts() {
		if a.Refused {
			n++
		}
	}
	return n
}

// Attempts returns every accepted connection in order.
func (r *TCPRelay) Attempts() []RelayAttempt {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]RelayAttempt(nil), r.attempts...)
}

// Resets counts connections reset by ResetIdle.
func (r *TCPRelay) Resets() int64 { return r.resets.Load() }

// Holes counts connections blackholed by Blackhole.
func (r *TCPRelay) Holes() int64 { return r.holes.Load() }

// Close stops the relay: the listener and every connection are closed and
// every goroutine has returned when it does. It is idempotent.
func (r *TCPRelay) Close() {
	r.once.Do(func() {
		r.mu.Lock()
		r.closed = true
		open := make([]*relayConn, 0, len(r.conns))
		for c := range r.conns {
			open = append(open, c)
		}
		r.mu.Unlock()
		_ = r.ln.Close()
		for _, c := range open {
			c.close(false)
		}
		r.wg.Wait()
	})
}

func (r *TCPRelay) serve() {
	defer r.wg.Done()
	for {
		nc, err := r.ln.Accept()
		if err != nil {
			return // Close
		}
		now := time.Now()
		r.mu.Lock()
		if r.closed {
			r.mu.Unlock()
			_ = nc.Close()
			return
		}
		down := r.mode == relayDown
		r.attempts = append(r.attempts, RelayAttempt{At: now, Refused: down})
		if down {
			r.mu.Unlock()
			resetConn(nc)
			continue
		}
		c := &relayConn{r: r, proxy: nc, last: now}
		r.conns[c] = struct{}{}
		r.wg.Add(1) // serve holds a count, so this never races with Wait at zero
		r.mu.Unlock()
		go c.run()
	}
}

// Open returns how many relayed connections are open.
func (r *TCPRelay) Open() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.conns)
}

func (r *TCPRelay) forget(c *relayConn) {
	r.mu.Lock()
	delete(r.conns, c)
	r.mu.Unlock()
}

// resetConn closes nc with an RST instead of a FIN.
func resetConn(nc net.Conn) {
	if tc, ok := nc.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = nc.Close()
}

// relayConn is one relayed connection: proxy side and upstream side.
type relayConn struct {
	r     *TCPRelay
	proxy net.Conn // accepted from the proxy; written once

	mu       sync.Mutex // protects upstream, last, holed, dead
	upstream net.Conn
	last     time.Time // when the last byte was relayed, either way
	holed    bool      // blackholed: drop everything from now on
	dead     bool      // closed; a late upstream dial is dropped
}

// relayVerdict is what a relayConn does with bytes it just read.
type relayVerdict int

const (
	relayForward relayVerdict = iota
	relayDrop
	relayReset
)

func (c *relayConn) run() {
	defer c.r.wg.Done()
	defer c.r.forget(c)
	up, err := net.DialTimeout("tcp", c.r.target, Timeout)
	if err != nil {
		c.close(true) // the upstream refuses: so does the relay
		return
	}
	if !c.setUpstream(up) {
		_ = up.Close()
		return
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.pump(up, c.proxy, false)
	}()
	c.pump(c.proxy, up, true)
	<-done
}

func (c *relayConn) setUpstream(up net.Conn) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dead {
		return false
	}
	c.upstream = up
	return true
}

// pump copies from → to until either side ends, applying the relay's mode to
// every read.
func (c *relayConn) pump(from, to net.Conn, fromProxy bool) {
	buf := make([]byte, 32<<10)
	for {
		n, err := from.Read(buf)
		if n > 0 && fromProxy && c.r.cut(&c.r.cutBefore, buf[:n]) {
			c.r.cuts.Add(1)
			c.close(true)
			return
		}
		if n > 0 {
			switch c.admit(fromProxy) {
			case relayReset:
				c.r.resets.Add(1)
				c.close(true)
				return
			case relayForward:
				if _, werr := to.Write(buf[:n]); werr != nil {
					c.close(false)
					return
				}
				if !fromProxy && c.r.cut(&c.r.cutAfter, buf[:n]) {
					c.r.cuts.Add(1)
					c.close(true)
					return
				}
			case relayDrop:
			}
		}
		if err != nil {
			if !fromProxy && c.isHoled() {
				// The upstream ended a flow the middlebox already forgot: the
				// proxy hears nothing of it.
				_ = from.Close()
				return
			}
			if errors.Is(err, io.EOF) {
				c.close(false)
			} else {
				c.close(true) // pass a reset on as a reset
			}
			return
		}
	}
}

// admit decides what happens to bytes just read from one side.
func (c *relayConn) admit(fromProxy bool) relayVerdict {
	mode, limit := c.r.settings()
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.holed {
		return relayDrop
	}
	idle := now.Sub(c.last)
	switch {
	case mode == relayResetIdle && fromProxy && idle > limit:
		return relayReset
	case mode == relayBlackhole && idle > limit:
		c.holed = true
		c.r.holes.Add(1)
		return relayDrop
	}
	c.last = now
	return relayForward
}

func (c *relayConn) isHoled() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.holed
}

// close closes both sides, with RST if rst is set. It is idempotent.
func (c *relayConn) close(rst bool) {
	c.mu.Lock()
	c.dead = true
	up := c.upstream
	c.mu.Unlock()
	for _, nc := range []net.Conn{c.proxy, up} {
		if nc == nil {
			continue
		}
		if rst {
			resetConn(nc)
		} else {
			_ = nc.Close()
		}
	}
}
