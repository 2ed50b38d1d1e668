package upstream

import (
	"errors"
	"fmt"
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
