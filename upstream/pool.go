package upstream

import (
	"bufio"
	"crypto/tls"
	"io"
	"net"
	"sync"
	"time"
)

// conn is one upstream TCP connection with its buffers and the byte counters
// that tell replay safety what happened on the wire.
type conn struct {
	nc        net.Conn
	br        *bufio.Reader
	bw        *bufio.Writer
	written   int64 // bytes written during the current exchange
	read      int64 // bytes read during the current exchange
	uses      int   // exchanges started on this connection
	sawEOF    bool  // the peer closed its side
	idleSince time.Time
	// meter, while a body of unknown length is read, is charged for every
	// byte that arrives; overBudget: its budget refused a charge, and every
	// read fails until the next exchange (none: the connection is
	// discarded).
	meter      *Response
	overBudget bool
	// slot is c's index in its pool's active list while it is in an
	// exchange, -1 otherwise.
	slot int
	wait *waiter // nil where Response.Arrived cannot wait
	peek *peeker // nil where a close cannot be seen before a read
}

func (c *conn) Read(p []byte) (int, error) {
	if c.overBudget {
		return 0, ErrOverBudget // sticky: fasthttp reads on past an error that came with bytes
	}
	n, err := c.nc.Read(p)
	c.read += int64(n)
	if err == io.EOF {
		c.sawEOF = true
	}
	if c.meter != nil && n > 0 && !c.meter.charge(n) {
		c.overBudget = true
		return 0, ErrOverBudget // the connection is discarded: its bytes go nowhere
	}
	return n, err
}

func (c *conn) Write(p []byte) (int, error) {
	n, err := c.nc.Write(p)
	c.written += int64(n)
	return n, err
}

// pool keeps idle keep-alive connections, newest last, so the stalest is
// always at the front and the freshest is reused first.
type pool struct {
	dialer   net.Dialer
	addr     string
	maxIdle  time.Duration
	maxConns int
	// staleAfter is the idle time after which a pooled connection's peer is
	// in doubt (Config.StaleAfter).
	staleAfter time.Duration
	tls        *tls.Config // nil for plain http

	mu     sync.Mutex // protects idle, active, closed
	idle   []*conn
	active []*conn // connections in an exchange (conn.slot)
	closed bool
}

const bufSize = 16 << 10

// get returns the freshest pooled connection idle for less than maxIdle, or
// dials one. With fresh set it also refuses a connection idle for staleAfter
// or longer, for a request that must not meet a dropped flow.
func (p *pool) get(deadline time.Time, fresh bool) (*conn, error) {
	now := time.Now()
	var stale []*conn
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, ErrClosed
	}
	// Everything idle too long is stale; the slice is ordered by idleSince.
	n := 0
	for n < len(p.idle) && now.Sub(p.idle[n].idleSince) >= p.maxIdle {
		n++
	}
	if n > 0 {
		stale = append(stale, p.idle[:n]...)
		p.idle = append(p.idle[:0], p.idle[n:]...)
	}
	var c *conn
	if k := len(p.idle); k > 0 {
		c = p.idle[k-1]
		p.idle[k-1] = nil
		p.idle = p.idle[:k-1]
		p.add(c) // under the same lock; untracked below if it is not used
	}
	p.mu.Unlock()
	for _, s := range stale {
		_ = s.nc.Close()
	}
	if c != nil && fresh && now.Sub(c.idleSince) >= p.staleAfter {
		// Every other idle connection is older still. Close only this one,
		// the one the request would have used: the fresh connection takes
		// its place, so the pool does not grow, and the others stay for
		// replay-safe requests, which may resend, until they are reaped.
		p.discard(c)
		c = nil
	}
	if c != nil && fresh && (c.br.Buffered() > 0 || c.peek.peerGone()) {
		// The server closed it while it idled (a restart), however short
		// the idle: a request written now would be lost with no way to
		// tell whether it ran. One non-blocking recv tells, for every
		// request that must not run twice: under a burst of writes the
		// connections are reused within microseconds, and a server killed
		// then left -32011 for writes it never read.
		p.discard(c)
		c = nil
	}
	if c != nil {
		return c, nil
	}
	c, err := p.dial(deadline)
	if err != nil {
		return nil, err
	}
	if !p.track(c) {
		_ = c.nc.Close()
		return nil, ErrClosed
	}
	return c, nil
}

// dial opens a new connection (TLS when configured) by deadline.
func (p *pool) dial(deadline time.Time) (*conn, error) {
	d := p.dialer
	d.Deadline = deadline
	nc, err := d.Dial("tcp", p.addr)
	if err != nil {
		return nil, &Error{Op: "dial", Err: err}
	}
	if p.tls != nil {
		tc := tls.Client(nc, p.tls)
		_ = tc.SetDeadline(deadline)
		if err := tc.Handshake(); err != nil {
			_ = nc.Close()
			return nil, &Error{Op: "dial", Err: err}
		}
		nc = tc
	}
	c := &conn{nc: nc, slot: -1, wait: newWaiter(nc), peek: newPeeker(nc)}
	c.br = bufio.NewReaderSize(c, bufSize)
	c.bw = bufio.NewWriterSize(c, bufSize)
	return c, nil
}

// track marks c as in an exchange, so that a final close can cut it.
func (p *pool) track(c *conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.add(c)
	return true
}

// add puts c on the active list; p.mu is held.
func (p *pool) add(c *conn) {
	c.slot = len(p.active)
	p.active = append(p.active, c)
}

// remove takes c off the active list, if it is on it; p.mu is held.
func (p *pool) remove(c *conn) {
	i := c.slot
	if i < 0 || i >= len(p.active) || p.active[i] != c {
		return
	}
	last := len(p.active) - 1
	p.active[i] = p.active[last]
	p.active[i].slot = i
	p.active[last] = nil
	p.active = p.active[:last]
	c.slot = -1
}

// discard closes a connection whose exchange failed or cannot be reused.
func (p *pool) discard(c *conn) {
	p.mu.Lock()
	p.remove(c)
	p.mu.Unlock()
	_ = c.nc.Close()
}

// reap closes idle connections older than maxIdle, so that none lingers
// open toward the upstream while the proxy is quiet.
func (p *pool) reap(now time.Time) {
	p.mu.Lock()
	n := 0
	for n < len(p.idle) && now.Sub(p.idle[n].idleSince) >= p.maxIdle {
		n++
	}
	stale := append([]*conn(nil), p.idle[:n]...)
	p.idle = append(p.idle[:0], p.idle[n:]...)
	p.mu.Unlock()
	for _, c := range stale {
		_ = c.nc.Close()
	}
}

// put returns a healthy connection whose exchange ended cleanly.
func (p *pool) put(c *conn) {
	c.idleSince = time.Now()
	p.mu.Lock()
	p.remove(c)
	if p.closed || len(p.idle) >= p.maxConns {
		p.mu.Unlock()
		_ = c.nc.Close()
		return
	}
	p.idle = append(p.idle, c)
	p.mu.Unlock()
}

// closeIdle closes every idle connection. With final set, it also cuts the
// exchanges in flight (their reads fail at once) and refuses new work.
func (p *pool) closeIdle(final bool) {
	p.mu.Lock()
	idle := p.idle
	p.idle = nil
	var active []*conn
	if final {
		p.closed = true
		active = append(active, p.active...)
	}
	p.mu.Unlock()
	for _, c := range idle {
		_ = c.nc.Close()
	}
	for _, c := range active {
		_ = c.nc.Close()
	}
}
