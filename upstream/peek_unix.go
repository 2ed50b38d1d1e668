//go:build linux || darwin || freebsd || netbsd || openbsd

package upstream

import (
	"crypto/tls"
	"errors"
	"net"
	"os"
	"syscall"
	"time"
	"unsafe"
)

// peerGone reports whether a pooled connection's peer has closed it (its
// FIN or RST is already here) or sent something unasked, without waiting
// and without consuming anything: one recv(MSG_PEEK|MSG_DONTWAIT). A server
// that was killed or restarted while the connection idled leaves exactly
// that, and a request written after it would meet EOF with no way to tell
// whether it ran.
func peerGone(nc net.Conn) bool {
	if tc, ok := nc.(*tls.Conn); ok {
		nc = tc.NetConn()
	}
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return false
	}
	// The last exchange's read deadline has usually passed: with it the
	// poller would refuse to look at all. The next exchange sets its own.
	_ = nc.SetReadDeadline(time.Time{})
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	gone := false
	err = rc.Read(func(fd uintptr) bool {
		var b byte
		n, _, errno := syscall.Syscall6(syscall.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&b)), 1,
			syscall.MSG_PEEK|syscall.MSG_DONTWAIT, 0, 0)
		// n == 0: EOF. n > 0: bytes nobody asked for. An error other than
		// "nothing yet": a reset, or worse.
		gone = errno == 0 || (errno != syscall.EAGAIN && errno != syscall.EWOULDBLOCK && errno != syscall.EINTR)
		_ = n
		return true // never wait for readiness
	})
	return gone || (err != nil && !errors.Is(err, os.ErrDeadlineExceeded))
}
