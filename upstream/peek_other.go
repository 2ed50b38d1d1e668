//go:build !(linux || darwin || freebsd || netbsd || openbsd)

package upstream

import (
	"net"
	"time"
)

// peerGone cannot look without a read here: a dead peer shows at the first
// read, as before.
func peerGone(net.Conn) bool { return false }

// readable cannot wait without reading here: it reports nothing arrived, and
// the caller reads as it would have without it.
func readable(net.Conn, time.Time) bool { return false }
