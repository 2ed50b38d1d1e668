package proxy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcpheal/mcpheal/proxy/internal/conf"
)

// batchUpstream: 2025-03-26 style server that accepts JSON-RPC batches; a
// batch runs its tools/call and then the server crashes (cuts the connection).
func startBatchUpstream(t *testing.T) (string, *atomic.Int64) {
	var runs atomic.Int64
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if bytes.HasPrefix(bytes.TrimSpace(body), []byte("[")) {
			var msgs []map[string]any
			_ = json.Unmarshal(body, &msgs)
			for _, m := range msgs {
				if m["method"] == "tools/call" {
					runs.Add(1)
				}
			}
			c, _, _ := http.NewResponseController(w).Hijack()
			c.Close()
			return
		}
		var m map[string]any
		_ = json.Unmarshal(body, &m)
		switch m["method"] {
		case "initialize":
			w.Header().Set("Mcp-Session-Id", "UP-1")
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"jsonrpc":"2.0","id":1,"result":{"protocolVersion":"2025-03-26","capabilities":{},"serverInfo":{"name":"b","version":"1"}}}`)
		default:
			w.WriteHeader(202)
		}
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return "http://" + ln.Addr().String() + "/mcp", &runs
}

// TestBatchNotReplayed: a JSON-RPC batch is judged as a whole and is not
// replay-safe (one element may be a tools/call): a server that runs it and
// dies gets it once, not once per backoff step (it ran 8 times).
func TestBatchNotReplayed(t *testing.T) {
	up, runs := startBatchUpstream(t)
	_, url := startProxy(t, up, func(c *conf.Config) { c.HealTimeout = 300 * time.Millisecond })
	sid := peerRawInitialize(t, url)
	resp, raw := peerRawPost(t, url, sid, `[{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"send_email","arguments":{}}}]`)
	t.Logf("agent got %d %s", resp.StatusCode, raw)
	if n := runs.Load(); n > 1 {
		t.Fatalf("non-replay-safe tools/call (in a batch) ran %d times", n)
	}
}
