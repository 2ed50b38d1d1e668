package upstream

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// TestStaleEOFNotPooled: a Response reused after a stream read to its end
// does not pool the connection of a later stream left unread.
func TestStaleEOFNotPooled(t *testing.T) {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	n := 0
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n++
		switch n {
		case 1: // short SSE answer that ends
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, "data: {\"jsonrpc\":\"2.0\",\"id\":1,\"error\":{\"code\":-32001,\"message\":\"Session not found\"}}\n\n")
		case 2: // long SSE answer
			w.Header().Set("Content-Type", "text/event-stream")
			for i := 0; i < 50; i++ {
				io.WriteString(w, "data: "+strings.Repeat("x", 1000)+"\n\n")
			}
			w.(http.Flusher).Flush()
			time.Sleep(200 * time.Millisecond)
		default:
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"jsonrpc":"2.0","id":3,"result":{}}`)
		}
	})}
	go srv.Serve(ln)
	defer srv.Close()
	c, err := New(Config{URL: "http://" + ln.Addr().String() + "/mcp"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	req := fasthttp.AcquireRequest()
	req.Header.SetMethod("POST")
	req.SetBodyString(`{}`)
	resp := AcquireResponse()
	dl := time.Now().Add(5 * time.Second)
	if err := c.Do(req, resp, dl); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	for {
		if _, err := resp.Read(buf); err != nil {
			break
		}
	}
	// what attempt.next() does
	resp.Close()
	resp.Response.Reset()
	if err := c.Do(req, resp, dl); err != nil {
		t.Fatal(err)
	}
	resp.Read(buf) // read a little, then the agent goes away
	ReleaseResponse(resp)
	resp = AcquireResponse()
	err = c.Do(req, resp, dl)
	t.Logf("third exchange: err=%v status=%d body=%.80q", err, resp.StatusCode(), resp.Body())
	if err != nil || resp.StatusCode() != 200 {
		t.Fatalf("third exchange broken by a pooled connection holding the rest of an abandoned stream")
	}
}
