package upstream

import (
	"crypto/tls"
	"net"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

// waiter waits for one connection's socket to become readable (conn.wait).
// It is made once per connection, so that a wait allocates nothing: the
// raw connection and the bound callback are kept.
type waiter struct {
	rc    syscall.RawConn
	poll  func(fd uintptr) // w.ppoll, bound once
	pfd   pollFd
	ts    syscall.Timespec
	ready bool
}

// maxWaiting bounds the waits blocked in ppoll at once, process-wide: each
// holds a thread, and the runtime keeps the threads it starts meanwhile.
const maxWaiting = 8

var waiting atomic.Int32

// pollFd is struct pollfd.
type pollFd struct {
	fd      int32
	events  int16
	revents int16
}

const pollIn = 0x1

// newWaiter returns nc's waiter, or nil where none can wait: TLS (a
// readable socket may hold part of a record, whose read would wait without
// a deadline) and connections that are not sockets.
func newWaiter(nc net.Conn) *waiter {
	if _, ok := nc.(*tls.Conn); ok {
		return nil
	}
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	w := &waiter{rc: rc}
	w.poll = w.ppoll
	return w
}

// readable waits up to wait for the socket to have something to read
// (bytes, its peer's close, or an error), without consuming anything, and
// reports whether it has. It blocks its thread in one ppoll(2) instead of
// parking on the runtime's poller: a read deadline that short is the
// earliest timer, and setting it wakes a second thread to watch it (a futex
// wake and a context switch per call, measured). The runtime keeps the
// goroutine's P while it blocks, unless other goroutines wait for it. A nil
// waiter reports false at once.
func (w *waiter) readable(wait time.Duration) bool {
	if w == nil {
		return false
	}
	if waiting.Add(1) > maxWaiting {
		waiting.Add(-1)
		return false // enough threads blocked already: the caller goes on without
	}
	defer waiting.Add(-1)
	w.ts, w.ready = syscall.NsecToTimespec(int64(wait)), false
	// The file stays open until Control returns, even if Interrupt closes
	// the connection meanwhile (then the wait runs out).
	return w.rc.Control(w.poll) == nil && w.ready
}

func (w *waiter) ppoll(fd uintptr) {
	w.pfd = pollFd{fd: int32(fd), events: pollIn}
	for {
		n, _, errno := syscall.Syscall6(syscall.SYS_PPOLL, uintptr(unsafe.Pointer(&w.pfd)), 1,
			uintptr(unsafe.Pointer(&w.ts)), 0, 0, 0)
		if errno == syscall.EINTR {
			continue // ppoll left the rest of the wait in ts
		}
		w.ready = errno == 0 && n > 0
		return
	}
}
