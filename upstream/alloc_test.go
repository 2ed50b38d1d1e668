//go:build !race

package upstream

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// TestExchangeAllocs: a JSON exchange on a pooled connection allocates
// nothing, through Do and DoOnce alike (so DoOnce reuses a connection that
// is not in doubt: a dial allocates). Not under -race, and not in parallel
// with other tests: AllocsPerRun counts allocations process-wide, so the fake
// upstream here reads and answers into fixed buffers.
func TestExchangeAllocs(t *testing.T) {
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	req.Header.SetMethod("POST")
	req.Header.SetContentType("application/json")
	req.SetBodyString(`{"jsonrpc":"2.0","id":1,"method":"tools/call"}`)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	url := "http://" + ln.Addr().String() + "/mcp"
	c := newClient(t, url)

	// The request's exact wire size, so that the server reads it whole.
	req.SetRequestURIBytes(c.path)
	req.Header.SetHost(c.host)
	var w bytes.Buffer
	bw := bufio.NewWriter(&w)
	if err := req.Write(bw); err != nil || bw.Flush() != nil {
		t.Fatal(err)
	}
	size := w.Len()
	answer := []byte("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer nc.Close()
				in := make([]byte, size)
				for {
					if _, err := io.ReadFull(nc, in); err != nil {
						return
					}
					if _, err := nc.Write(answer); err != nil {
						return
					}
				}
			}()
		}
	}()

	resp := AcquireResponse()
	defer ReleaseResponse(resp)
	for name, do := range map[string]func(*fasthttp.Request, *Response, time.Time) error{
		"Do": c.Do, "DoOnce": c.DoOnce,
	} {
		n := testing.AllocsPerRun(200, func() {
			resp.Response.Reset()
			if err := do(req, resp, time.Now().Add(time.Second)); err != nil || resp.StatusCode() != 200 {
				t.Fatalf("%s = %d, %v; want 200", name, resp.StatusCode(), err)
			}
		})
		if n != 0 {
			t.Errorf("%s: %v allocs per exchange, want 0", name, n)
		}
	}
}

// TestWaitAllocs: waiting for a stream's next bytes (Response.Arrived)
// allocates nothing, whether they are there or the wait runs out.
func TestWaitAllocs(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	peer, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	w := newWaiter(nc)
	if w == nil {
		if runtime.GOOS == "linux" {
			t.Fatal("no waiter for a TCP connection")
		}
		return // Arrived reports only what is buffered here
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
