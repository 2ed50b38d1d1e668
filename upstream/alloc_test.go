//go:build !race

package upstream

import (
	"bufio"
	"bytes"
	"io"
	"net"
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
