package upstream

import (
	"errors"
	"fmt"
	"syscall"
	"testing"
	"time"
)

// TestEvidence: what a failure proves about delivery, row by row.
func TestEvidence(t *testing.T) {
	t.Parallel()
	refused := &Error{Op: "dial", Err: syscall.ECONNREFUSED}
	written := &Error{Op: "read", Written: true, Reused: true, Idle: 2 * time.Second, Err: errors.New("EOF")}
	for _, tc := range []struct {
		name      string
		err       error
		delivered bool
		notSent   bool
	}{
		{"success", nil, false, false},
		{"dial refused", refused, false, true},
		{"wrapped dial refused", fmt.Errorf("forward: %w", refused), false, true},
		{"write failed before a byte", &Error{Op: "write", Err: syscall.EPIPE}, false, true},
		{"read failed after the write", written, true, false},
		{"resend refused after a written first try", resent(&Error{Op: "dial", Err: syscall.ECONNREFUSED}, written), true, false},
		{"client closed before the resend", resent(ErrClosed, written), true, false},
		{"resend refused after an unwritten first try", resent(&Error{Op: "dial", Err: syscall.ECONNREFUSED}, &Error{Op: "write", Reused: true}), false, true},
		{"not an *Error proves nothing", ErrClosed, true, false},
	} {
		if got := Delivered(tc.err); got != tc.delivered {
			t.Errorf("Delivered(%s) = %v, want %v", tc.name, got, tc.delivered)
		}
		if got := NotSent(tc.err); got != tc.notSent {
			t.Errorf("NotSent(%s) = %v, want %v", tc.name, got, tc.notSent)
		}
	}
	if err := resent(ErrClosed, written); !errors.Is(err, ErrClosed) {
		t.Errorf("resent(ErrClosed) = %v, want it to match ErrClosed", err)
	}
}

type timeoutErr struct{}

func (timeoutErr) Error() string { return "i/o timeout" }
func (timeoutErr) Timeout() bool { return true }

// TestStale: which failures let Do send a replay-safe request again.
func TestStale(t *testing.T) {
	t.Parallel()
	eof := errors.New("EOF")
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"success", nil, false},
		{"idle connection reset before answering", &Error{Op: "read", Written: true, Reused: true, Idle: staleIdle, Err: eof}, true},
		{"reset before the write", &Error{Op: "write", Reused: true, Idle: 2 * staleIdle, Err: eof}, true},
		{"connection reused at once", &Error{Op: "read", Written: true, Reused: true, Idle: staleIdle - 1, Err: eof}, false},
		{"new connection", &Error{Op: "read", Written: true, Err: eof}, false},
		{"answer begun", &Error{Op: "read", Written: true, Reused: true, Idle: staleIdle, Answered: true, Err: eof}, false},
		{"dial", &Error{Op: "dial", Reused: true, Idle: staleIdle, Err: eof}, false},
		{"timeout", &Error{Op: "read", Written: true, Reused: true, Idle: staleIdle, Err: timeoutErr{}}, false},
		{"not an *Error", eof, false},
	} {
		if got := stale(tc.err, staleIdle); got != tc.want {
			t.Errorf("stale(%s) = %v, want %v", tc.name, got, tc.want)
		}
	}
}
