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

// peeker looks at one pooled connection for a close from its peer. It is
// made once per connection (the raw connection and the bound callback are
// kept), so that a look allocates nothing: every request that must not
// run twice is preceded by one.
type peeker struct {
	nc   net.Conn // the TCP connection under TLS, if any
	rc   syscall.RawConn
	look func(fd uintptr) bool // p.recv, bound once
	gone bool
}

// newPeeker returns nc's peeker, or nil where it cannot look.
func newPeeker(nc net.Conn) *peeker {
	if tc, ok := nc.(*tls.Conn); ok {
		nc = tc.NetConn()
	}
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	p := &peeker{nc: nc, rc: rc}
	p.look = p.recv
	return p
}

// peerGone reports whether the connection's peer has closed it (its FIN or
// RST is already here) or sent something unasked, without waiting and
// without consuming anything: one recv(MSG_PEEK|MSG_DONTWAIT). A server
// that was killed or restarted while the connection idled leaves exactly
// that, and a request written after it would meet EOF with no way to tell
// whether it ran. A nil peeker never knows.
func (p *peeker) peerGone() bool {
	if p == nil {
		return false
	}
	// The last exchange's read deadline has usually passed: with it the
	// poller would refuse to look at all. The next exchange sets its own.
	_ = p.nc.SetReadDeadline(time.Time{})
	p.gone = false
	err := p.rc.Read(p.look)
	return p.gone || (err != nil && !errors.Is(err, os.ErrDeadlineExceeded))
}

// recv is the one look, as rc.Read's callback: it never waits for
// readiness.
func (p *peeker) recv(fd uintptr) bool {
	var b byte
	_, _, errno := syscall.Syscall6(syscall.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&b)), 1,
		syscall.MSG_PEEK|syscall.MSG_DONTWAIT, 0, 0)
	// errno 0: EOF (n == 0) or bytes nobody asked for (n > 0). An error
	// other than "nothing yet": a reset, or worse.
	p.gone = errno == 0 || (errno != syscall.EAGAIN && errno != syscall.EWOULDBLOCK && errno != syscall.EINTR)
	return true
}
