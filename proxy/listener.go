package proxy

import (
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"github.com/mcpheal/mcpheal/upstream"
)

// patientListener keeps accepting through the errors an overloaded host
// gives (too many open files, a connection aborted before it was
// accepted): fasthttp's Serve returns on them, and the process would end
// (docs/security.md "Under attack"). It waits as net/http's Server does, 5 ms doubling
// to 1 s (the one backoff, upstream.Backoff), counts each error and logs one
// line a second at most. A closed
// listener's error still ends Serve.
//
// It also holds the agents' connections below the process's file
// descriptor limit, keeping a quarter of it for upstream connections,
// files and the store (maxConns): at the cap a new connection takes the
// place of the one idle longest (one that sent no request yet, or waits
// between requests), and is refused only when none is idle. Both are
// counted (shed).
type patientListener struct {
	net.Listener
	log    *zerolog.Logger
	errs   *atomic.Uint64
	shed   *atomic.Uint64
	done   chan struct{}
	closed atomic.Bool
	logged atomic.Int64 // unix nanoseconds of the last log line
	max    int          // the cap (maxConns), read again once a second

	mu      sync.Mutex // protects open, idle, max, checked
	open    int
	idle    map[*trackedConn]time.Time // since when each idle connection waits
	checked time.Time                  // when max was read from the limit
}

func newPatientListener(ln net.Listener, log *zerolog.Logger, errs, shed *atomic.Uint64) *patientListener {
	return &patientListener{Listener: ln, log: log, errs: errs, shed: shed, done: make(chan struct{}),
		max: maxConns(), checked: time.Now(), idle: map[*trackedConn]time.Time{}}
}

// trackedConn is an agent's connection the listener counts.
type trackedConn struct {
	net.Conn
	l     *patientListener
	once  sync.Once
	fresh atomic.Bool // nothing read from it yet: idle, whatever fasthttp says
}

// Read marks the connection used at its first byte.
func (c *trackedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 && c.fresh.Load() && c.fresh.CompareAndSwap(true, false) {
		c.l.mu.Lock()
		delete(c.l.idle, c)
		c.l.mu.Unlock()
	}
	return n, err
}

// SyscallConn lets the proxy watch the connection for its agent's
// departure (agentwatch.go).
func (c *trackedConn) SyscallConn() (syscall.RawConn, error) {
	sc, ok := c.Conn.(syscall.Conn)
	if !ok {
		return nil, errors.ErrUnsupported
	}
	return sc.SyscallConn()
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.l.mu.Lock()
		c.l.open--
		delete(c.l.idle, c)
		c.l.mu.Unlock()
	})
	return c.Conn.Close()
}

// trackConnState is fasthttp's ConnState: it keeps the listener's idle
// set.
func trackConnState(nc net.Conn, st fasthttp.ConnState) {
	c, ok := nc.(*trackedConn)
	if !ok {
		return
	}
	c.l.mu.Lock()
	defer c.l.mu.Unlock()
	switch {
	case st == fasthttp.StateIdle:
		c.l.idle[c] = time.Now() // answered; waiting for its next request
	case c.fresh.Load() && st != fasthttp.StateClosed && st != fasthttp.StateHijacked:
		// fasthttp calls a connection active before its first byte; it
		// stays idle (admit) until one comes.
	default:
		delete(c.l.idle, c)
	}
}

// admit counts c in, shedding the connection idle longest when at the
// cap; false when there is none to shed and c must be refused.
func (l *patientListener) admit(c *trackedConn) bool {
	l.mu.Lock()
	var victim *trackedConn
	if now := time.Now(); now.Sub(l.checked) >= time.Second {
		// The limit may change under a running process (prlimit).
		l.max, l.checked = maxConns(), now
	}
	if l.open >= l.max {
		var since time.Time
		for v, t := range l.idle {
			if victim == nil || t.Before(since) {
				victim, since = v, t
			}
		}
		if victim == nil {
			l.mu.Unlock()
			return false
		}
		delete(l.idle, victim)
	}
	l.open++
	c.fresh.Store(true)
	l.idle[c] = time.Now()
	l.mu.Unlock()
	if victim != nil {
		l.shed.Add(1)
		_ = victim.Close()
	}
	return true
}

// Accept returns the next connection, waiting out temporary errors.
func (l *patientListener) Accept() (net.Conn, error) {
	wait := upstream.Backoff{Min: 5 * time.Millisecond, Max: time.Second}
	for {
		c, err := l.Listener.Accept()
		if err == nil {
			tc := &trackedConn{Conn: c, l: l}
			if !l.admit(tc) {
				l.shed.Add(1)
				_ = c.Close()
				l.note("at the connection cap with no idle connection to close: a new one refused", nil, 0)
				continue
			}
			return tc, nil
		}
		var ne interface{ Temporary() bool }
		if l.closed.Load() || errors.Is(err, net.ErrClosed) || !errors.As(err, &ne) || !ne.Temporary() {
			return nil, err
		}
		l.errs.Add(1)
		delay := wait.Next()
		l.note("cannot accept connections (out of file descriptors?); going on", err, delay)
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-l.done:
			t.Stop()
			return nil, net.ErrClosed
		}
	}
}

// note logs one line a second at most.
func (l *patientListener) note(msg string, err error, delay time.Duration) {
	if now := time.Now().UnixNano(); now-l.logged.Load() >= int64(time.Second) {
		l.logged.Store(now)
		l.mu.Lock()
		limit := l.max
		l.mu.Unlock()
		ev := l.log.Error().Err(err).Int("max_connections", limit)
		if delay > 0 {
			ev = ev.Dur("retry_in", delay)
		}
		ev.Msg(msg)
	}
}

// Close closes the listener and ends a wait in Accept.
func (l *patientListener) Close() error {
	if l.closed.CompareAndSwap(false, true) {
		close(l.done)
	}
	return l.Listener.Close()
}

// listeners are the listeners a server was given to serve on. fasthttp's
// Shutdown closes only those its Serve already holds: a Serve that began
// as Shutdown ran would find none closed and serve on. Shutdown closes
// these too, and a Serve after it is refused.
type listeners struct {
	mu     sync.Mutex
	closed bool
	lns    []net.Listener
}

// add records ln, unless the listeners are closed: then it closes ln and
// reports false.
func (l *listeners) add(ln net.Listener) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		_ = ln.Close()
		return false
	}
	l.lns = append(l.lns, ln)
	return true
}

// close closes every listener given (those fasthttp held are closed
// already) and refuses later ones.
func (l *listeners) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	for _, ln := range l.lns {
		_ = ln.Close()
	}
}
