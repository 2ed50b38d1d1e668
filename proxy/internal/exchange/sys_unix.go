//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package exchange

import "syscall"

// canWatch: peerClosed can tell a closed connection here.
const canWatch = true

// peerClosed waits until c is readable, or its read deadline passes, and
// reports whether its peer closed it. It reads nothing: recv with MSG_PEEK
// (on a socket Go made non-blocking) sees the end of the stream (0 bytes)
// or an error such as a reset, while bytes that wait (a pipelined request)
// stay for the server to read.
func peerClosed(c syscall.Conn) bool {
	rc, err := c.SyscallConn()
	if err != nil {
		return false
	}
	var closed bool
	var b [1]byte
	err = rc.Read(func(fd uintptr) bool {
		for {
			n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK)
			switch err {
			case syscall.EINTR:
				continue
			case syscall.EAGAIN:
				return false // nothing yet: wait until the poller says readable
			}
			closed = err != nil || n == 0
			return true
		}
	})
	return err == nil && closed
}
