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

	// writeAwait's state: send is w.writeThenWait, bound once; p is what
	// is left to write, n what has been written, err the write's error.
	send  func(fd uintptr) bool
	p     []byte
	n     int
	err   error
	wrote bool
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
	w.poll, w.send = w.ppoll, w.writeThenWait
	return w
}

// writeAwait writes p, a request whose answer is read next, and waits on
// the runtime's poller until the socket is readable, without the read that
// would find nothing there first: an answer cannot arrive before its
// request has gone, so that read only costs a system call (EAGAIN) before
// the goroutine parks. The write is made inside the raw read, after the
// poller's readiness was reset, so an answer that arrives at once is not
// missed. The wait ends at the connection's read deadline, or when it is
// closed; the next read reports either. writeAwait returns how much of p
// it wrote: the caller writes the rest as usual (a full send buffer, or a
// connection whose read deadline had passed before anything was written).
func (w *waiter) writeAwait(p []byte) (int, error) {
	if w == nil {
		return 0, nil
	}
	w.p, w.n, w.err, w.wrote = p, 0, nil, false
	_ = w.rc.Read(w.send) // a failed wait is the next read's to report
	n, err := w.n, w.err
	w.p, w.err = nil, nil
	return n, err
}

// writeThenWait is writeAwait's raw read callback: the first call writes
// and asks the poller to wait for readability unless the write stopped
// short; the next call (readable) ends the wait.
func (w *waiter) writeThenWait(fd uintptr) bool {
	if w.wrote {
		return true
	}
	w.wrote = true
	for len(w.p) > 0 {
		n, err := syscall.Write(int(fd), w.p)
		switch {
		case err == syscall.EINTR:
			continue
		case err == syscall.EAGAIN:
			return true // the send buffer is full: the caller writes the rest
		case err != nil:
			w.err = err
			return true
		}
		w.n += n
		w.p = w.p[n:]
	}
	return false
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
