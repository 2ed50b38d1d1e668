package upstream

import (
	"errors"
	"fmt"
	"time"
)

// ErrClosed is returned by Do after Close.
var ErrClosed = errors.New("upstream client closed")

// Error is a failed exchange with the upstream. It carries what replay safety
// needs: whether the request may have reached the server.
type Error struct {
	// Op is the step that failed: "dial", "write" or "read".
	Op string
	// Written reports whether any byte of the request reached the socket. A
	// request with Written false was provably never delivered.
	Written bool
	// Reused reports whether the connection had served an earlier request.
	Reused bool
	// Idle is how long a reused connection had waited in the pool.
	Idle time.Duration
	// Answered reports whether any response byte arrived.
	Answered bool
	// Err is the underlying network error.
	Err error
}

func (e *Error) Error() string {
	return fmt.Sprintf("upstream %s: %v", e.Op, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

// Timeout reports whether the exchange ran out of time.
func (e *Error) Timeout() bool {
	var t interface{ Timeout() bool }
	return errors.As(e.Err, &t) && t.Timeout()
}

// Delivered reports whether err leaves open that the upstream received and
// acted on the request. Only an exchange that failed before writing a byte is
// known not to have been delivered.
func Delivered(err error) bool {
	var ue *Error
	if errors.As(err, &ue) {
		return ue.Written
	}
	return err != nil
}

// IsTimeout reports whether err is a deadline expiry.
func IsTimeout(err error) bool {
	var t interface{ Timeout() bool }
	return errors.As(err, &t) && t.Timeout()
}

// staleIdle is how long a pooled connection must have idled before a failure
// on it, with no response byte, is taken for a dropped flow (a NAT or load
// balancer forgot it, and answers the next bytes with a reset) rather than a
// server that read the request and died. A connection reused at once, as in
// a busy session, never qualifies: its failure stays ambiguous.
const staleIdle = time.Second

// stale reports whether err is a failure on a connection that had idled in
// the pool and broke before answering: the request never reached a live
// server process, so it may be sent again on a fresh connection.
func stale(err error) bool {
	if err == nil {
		return false // the common case, without errors.As's allocation
	}
	var ue *Error
	if !errors.As(err, &ue) || !ue.Reused || ue.Answered || ue.Op == "dial" || ue.Idle < staleIdle {
		return false
	}
	return !ue.Timeout()
}
