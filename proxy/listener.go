package proxy

import (
	"errors"
	"net"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/mcpheal/mcpheal/upstream"
)

// patientListener keeps accepting through the errors an overloaded host
// gives (too many open files, a connection aborted before it was
// accepted): fasthttp's Serve returns on them, and the process would end
// (README "Under attack"). It waits as net/http's Server does, 5 ms doubling
// to 1 s (the one backoff, upstream.Backoff), counts each error and logs one
// line a second at most. A closed
// listener's error still ends Serve.
type patientListener struct {
	net.Listener
	log    *zerolog.Logger
	errs   *atomic.Uint64
	done   chan struct{}
	closed atomic.Bool
	logged atomic.Int64 // unix nanoseconds of the last log line
}

func newPatientListener(ln net.Listener, log *zerolog.Logger, errs *atomic.Uint64) *patientListener {
	return &patientListener{Listener: ln, log: log, errs: errs, done: make(chan struct{})}
}

// Accept returns the next connection, waiting out temporary errors.
func (l *patientListener) Accept() (net.Conn, error) {
	wait := upstream.Backoff{Min: 5 * time.Millisecond, Max: time.Second}
	for {
		c, err := l.Listener.Accept()
		if err == nil {
			return c, nil
		}
		var ne interface{ Temporary() bool }
		if l.closed.Load() || errors.Is(err, net.ErrClosed) || !errors.As(err, &ne) || !ne.Temporary() {
			return nil, err
		}
		l.errs.Add(1)
		delay := wait.Next()
		if now := time.Now().UnixNano(); now-l.logged.Load() >= int64(time.Second) {
			l.logged.Store(now)
			l.log.Error().Err(err).Dur("retry_in", delay).
				Msg("cannot accept connections (out of file descriptors?); going on")
		}
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-l.done:
			t.Stop()
			return nil, net.ErrClosed
		}
	}
}

// Close closes the listener and ends a wait in Accept.
func (l *patientListener) Close() error {
	if l.closed.CompareAndSwap(false, true) {
		close(l.done)
	}
	return l.Listener.Close()
}
