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
