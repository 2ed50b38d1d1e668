package proxy

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestGetStreamKeepaliveBetweenEvents: the GET stream's keepalive comments
// go between events, never inside one (an event split across reads got a
// keepalive in its data line, and the Go SDK client ends its session on an
// undecodable event).
func TestGetStreamKeepaliveBetweenEvents(t *testing.T) {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			w.Header().Set("Content-Type", "text/event-stream")
			f := w.(http.Flusher)
			w.WriteHeader(200)
			f.Flush()
			io.WriteString(w, "event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",")
			f.Flush()
			time.Sleep(120 * time.Millisecond)
			io.WriteString(w, "\"params\":{\"level\":\"info\",\"data\":\"x\"}}\n\n")
			f.Flush()
			<-r.Context().Done()
			return
		}
		var m map[string]any
		_ = json.NewDecoder(r.Body).Decode(&m)
		if m["method"] == "initialize" {
			w.Header().Set("Mcp-Session-Id", "UP-1")
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"jsonrpc":"2.0","id":1,"result":{"protocolVersion":"2025-11-25","capabilities":{},"serverInfo":{"name":"b","version":"1"}}}`)
			return
		}
		w.WriteHeader(202)
	})}
	go srv.Serve(ln)
	defer srv.Close()
	_, url := startProxy(t, "http://"+ln.Addr().String()+"/mcp", func(c *Config) { c.StreamKeepalive = 50 * time.Millisecond })
	sid := peerRawInitialize(t, url)
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Mcp-Session-Id", sid)
	req.Header.Set("MCP-Protocol-Version", "2025-11-25")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	var got strings.Builder
	deadline := time.Now().Add(400 * time.Millisecond)
	for time.Now().Before(deadline) {
		line, err := br.ReadString('\n')
		got.WriteString(line)
		if err != nil || strings.Contains(got.String(), "}}\n\n") {
			break
		}
	}
	t.Logf("agent stream: %q", got.String())
	if strings.Contains(got.String(), `,: keepalive`) {
		t.Fatal("keepalive comment written in the middle of a data line: the event is corrupted")
	}
}

// TestGetStreamEventTooLarge: a GET stream event past max_sse_line ends the
// agent's stream once; mcpheal does not reopen the upstream stream (a
// resumable server would send the same event again, in a loop).
func TestGetStreamEventTooLarge(t *testing.T) {
	t.Parallel()
	var gets atomic.Int64
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			gets.Add(1)
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, "id: 1\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{\"data\":\""+
				strings.Repeat("x", 256<<10)+"\"}}\n\n")
			<-r.Context().Done()
			return
		}
		var m map[string]any
		_ = json.NewDecoder(r.Body).Decode(&m)
		if m["method"] == "initialize" {
			w.Header().Set("Mcp-Session-Id", "UP-1")
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"jsonrpc":"2.0","id":1,"result":{"protocolVersion":"2025-11-25","capabilities":{},"serverInfo":{"name":"b","version":"1"}}}`)
			return
		}
		w.WriteHeader(202)
	})}
	go srv.Serve(ln)
	defer srv.Close()
	_, url := startProxy(t, "http://"+ln.Addr().String()+"/mcp", func(c *Config) { c.MaxSSELine = 64 << 10 })
	sid := peerRawInitialize(t, url)
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Mcp-Session-Id", sid)
	req.Header.Set("MCP-Protocol-Version", "2025-11-25")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	done := make(chan int64, 1)
	go func() { n, _ := io.Copy(io.Discard, resp.Body); done <- n }()
	select {
	case n := <-done:
		if n >= 256<<10 {
			t.Fatalf("the agent got %d bytes: the event past max_sse_line was relayed", n)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("the agent's stream did not end")
	}
	time.Sleep(200 * time.Millisecond)
	if n := gets.Load(); n != 1 {
		t.Fatalf("the upstream saw %d GETs, want 1 (no reopen loop)", n)
	}
}
