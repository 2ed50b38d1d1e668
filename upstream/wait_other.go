//go:build !linux

package upstream

import (
	"net"
	"time"
)

// waiter cannot wait without reading here.
type waiter struct{}

func newWaiter(net.Conn) *waiter { return nil }

// readable reports nothing arrived, and the caller goes on as it would have
// without it.
func (*waiter) readable(time.Duration) bool { return false }
