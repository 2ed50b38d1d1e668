package upstream

import (
	"net"
	"testing"
	"time"
)

// TestPoolReapsIdle: an idle connection past MaxIdleConn is closed by the
// reaper even when no request comes.
func TestPoolReapsIdle(t *testing.T) {
	t.Parallel()
	closed := make(chan struct{})
	url := rawServer(t, func(c net.Conn) {
		buf := make([]byte, 4096)
		for {
			if _, err := c.Read(buf); err != nil {
				close(closed) // the proxy side closed it
				return
			}
			c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"))
		}
	})
	c, err := New(Config{URL: url, MaxIdleConn: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	resp, err := post(c, `{}`, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	ReleaseResponse(resp)
	select {
	case <-closed:
	case <-time.After(2 * time.Second):
		t.Fatal("idle connection never reaped")
	}
}

// tcpPair returns a connected client conn (with its waiter, where there is
// one) and the server's end, both closed when t ends.
func tcpPair(t *testing.T) (*conn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	peer, err := ln.Accept()
	if err != nil {
		nc.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close(); peer.Close() })
	return &conn{nc: nc, slot: -1, wait: newWaiter(nc)}, peer
}
