//go:build !race

package upstream

import (
	"testing"
	"time"
)

// TestWaitAllocs: waiting for a stream's next bytes (Response.Arrived)
// allocates nothing, whether they are there or the wait runs out.
func TestWaitAllocs(t *testing.T) {
	c, peer := tcpPair(t)
	w := c.wait
	if w == nil {
		t.Fatal("no waiter for a TCP connection")
	}
	if n := testing.AllocsPerRun(50, func() { w.readable(20 * time.Microsecond) }); n != 0 || w.ready {
		t.Fatalf("an empty socket: %v allocs per wait, ready %v; want 0, false", n, w.ready)
	}
	if _, err := peer.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(50, func() { w.readable(time.Second) }); n != 0 || !w.ready {
		t.Fatalf("a byte waiting: %v allocs per wait, ready %v; want 0, true", n, w.ready)
	}
}
