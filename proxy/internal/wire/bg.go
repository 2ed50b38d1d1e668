package wire

import (
	"net"
	"sync"
	"time"
)

// BgGroup tracks a Server's background goroutines. Unlike a bare
// sync.WaitGroup it refuses new work once Close waits: a heal's leader
// runs detached from any request and may start work (an outage watcher, a
// DELETE) while the server closes.
type BgGroup struct {
	mu     sync.Mutex // protects closed, and orders Add before Wait
	closed bool
	wg     sync.WaitGroup
}

// Add counts n more goroutines; false once the group is closed, and the
// caller must then not start them.
func (g *BgGroup) Add(n int) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return false
	}
	g.wg.Add(n)
	return true
}

// Done ends one goroutine.
func (g *BgGroup) Done() { g.wg.Done() }

// Wait closes the group and waits for the goroutines it counted.
func (g *BgGroup) Wait() {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
	g.wg.Wait()
}

// ArmWrite bounds the next writes to c by d.
func ArmWrite(c net.Conn, d time.Duration) {
	if c == nil {
		return
	}
	// A RequestCtx made by Init (tests, fasthttp.TimeoutHandler) has a
	// stand-in connection whose methods panic.
	defer func() { _ = recover() }()
	_ = c.SetWriteDeadline(time.Now().Add(d))
}

// SleepUnless waits d unless quit or done closes first.
func SleepUnless(d time.Duration, quit, done <-chan struct{}) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-quit:
		return false
	case <-done:
		return false
	}
}
