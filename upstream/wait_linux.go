package upstream

import (
	"crypto/tls"
	"net"
	"syscall"
	"time"
	"unsafe"
)

// pollFd is struct pollfd.
type pollFd struct {
	fd      int32
	events  int16
	revents int16
}

const pollIn = 0x1

// readable waits up to wait for nc to have something to read (bytes, its
// peer's close, or an error), without consuming anything, and reports
// whether it has. It blocks its thread in one ppoll(2) instead of parking
// on the runtime's poller: a read deadline that short would be the
// earliest timer, and setting it wakes a second thread to watch it (a
// futex wake and a context switch per call, measured). The runtime keeps
// the goroutine's P while it blocks, unless other goroutines wait for it.
// TLS is not looked at: a readable socket may hold part of a record, whose
// read would wait without a deadline.
func readable(nc net.Conn, wait time.Duration) bool {
	if _, ok := nc.(*tls.Conn); ok {
		return false
	}
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	ready := false
	err = rc.Control(func(fd uintptr) {
		// The file stays open until Control returns, even if Interrupt
		// closes the connection meanwhile (then the wait runs out).
		pfd := pollFd{fd: int32(fd), events: pollIn}
		ts := syscall.NsecToTimespec(int64(wait))
		for {
			n, _, errno := syscall.Syscall6(syscall.SYS_PPOLL, uintptr(unsafe.Pointer(&pfd)), 1,
				uintptr(unsafe.Pointer(&ts)), 0, 0, 0)
			if errno == syscall.EINTR {
				continue // ppoll left the rest of the wait in ts
			}
			ready = errno == 0 && n > 0
			return
		}
	})
	return err == nil && ready
}
