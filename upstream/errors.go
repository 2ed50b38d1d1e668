package upstream

import (
	"errors"
	"fmt"
	"time"
)

// ErrClosed is returned by Do after Close.
var ErrClosed = errors.New("upstream client closed")

// ErrInterrupted is the failure of an exchange that Response.Interrupt
// ended: its caller gave up waiting. The flags of its *Error still say what
// reached the upstream.
var ErrInterrupted = errors.New("exchange interrupted")

// ErrOverBudget is the failure of a JSON answer whose body would pass its
// Response's Budget: the upstream answered, and the answer was not read
// whole. Like TooLargeError, it is no transport death.
var ErrOverBudget = errors.New("answer not read: memory budget reached")

// Error is a failed exchange with the upstream. It carries what replay safety
// needs: whether the request may have reached the server.
type Error struct {
	// Op is the step that failed: "dial", "write" or "read".
	Op string
	// Written reports whether any byte of the request reached the socket, on
	// any try: when Do's resend fails, even at its dial, the first try's
	// bytes still count. A request with Written false was provably never
	// delivered.
	Written bool
	// Reused reports whether the connection had served an earlier request.
	Reused bool
	// Idle is how long a reused connection had waited in the pool.
	Idle time.Duration
	// Answered reports whether any response byte arrived.
	Answered bool
	// Resent reports that this is the failure of Do's second try, made on a
	// fresh connection after the first broke on a stale one. Op, Reused,
	// Idle, Answered and Err describe the second try; Written covers both.
	Resent bool
	// Err is the underlying network error.
	Err error
}

func (e *Error) Error() string {
	if e.Resent {
		return fmt.Sprintf("upstream %s on resend: %v", e.Op, e.Err)
	}
	return fmt.Sprintf("upstream %s: %v", e.Op, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

// Timeout reports whether the exchange ran out of time.
func (e *Error) Timeout() bool {
	var t interface{ Timeout() bool }
	return errors.As(e.Err, &t) && t.Timeout()
}

// The evidence a failure carries about delivery is decided here and nowhere
// else: Delivered and NotSent are complements for any non-nil error. An error
// that is not an *Error (the client closed before the exchange, a caller's
// own failure) proves nothing, so it counts as delivered: "not dispatched" is
// proven, never assumed.

// Delivered reports whether err leaves open that the upstream received and
// acted on the request: some request byte was written, on any try. A request
// that may have been delivered is sent again only if its method is replay
// safe (docs/healing.md "Replay"). Delivered(nil) is false.
func Delivered(err error) bool {
	var ue *Error
	if errors.As(err, &ue) {
		return ue.Written
	}
	return err != nil
}

// NotSent reports whether err proves that no byte of the request left: the
// dial failed, or the write failed before its first byte. Such a request may
// be sent again whatever its method. NotSent(nil) is false.
func NotSent(err error) bool {
	return err != nil && !Delivered(err)
}

// IsTimeout reports whether err is a deadline expiry.
func IsTimeout(err error) bool {
	var t interface{ Timeout() bool }
	return errors.As(err, &t) && t.Timeout()
}

// staleIdle is the default of Config.StaleAfter: how long a pooled
// connection may idle before its peer is in doubt. A failure on such a
// connection, with no response byte, is most likely a dropped flow (a NAT or
// load balancer forgot it and answers the next bytes with a reset), but it
// may also be a server that read the request and died. A connection reused
// at once, as in a busy session, is never in doubt: its failure stays
// ambiguous.
const staleIdle = time.Second

// stale reports whether err is a failure on a connection that had idled at
// least after in the pool and broke before answering, so that Do may send a
// replay-safe request again on a fresh connection. It proves nothing about
// delivery: the first try's bytes may have reached a server that died.
func stale(err error, after time.Duration) bool {
	if err == nil {
		return false // the common case, without errors.As's allocation
	}
	var ue *Error
	if !errors.As(err, &ue) || !ue.Reused || ue.Answered || ue.Op == "dial" || ue.Idle < after {
		return false
	}
	return !ue.Timeout()
}

// resent returns err, the failure of Do's second try, with the first try's
// evidence kept: bytes the first try wrote may have reached the server, so
// Written stays true whatever the second try did, a refused dial included.
func resent(err, first error) error {
	var ue *Error
	if !errors.As(err, &ue) {
		ue = &Error{Op: "dial", Err: err} // the client closed before the second try
	}
	ue.Written = ue.Written || Delivered(first)
	ue.Resent = true
	return ue
}
