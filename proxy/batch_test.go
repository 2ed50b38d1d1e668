package proxy

import (
	"encoding/json"
	"io"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcpheal/mcpheal/proxy/internal/conf"
	"github.com/mcpheal/mcpheal/proxy/internal/peers"
)

// startBatchUpstream: a 2025-03-26 style server that accepts JSON-RPC
// batches; a batch runs its tools/call and then the server crashes (cuts
// the connection). It returns the URL and the count of tools/call run.
func startBatchUpstream(t *testing.T) (string, *atomic.Int64) {
	var runs atomic.Int64
	replies := peers.Session("UP-1", "{}")
	replies[peers.Key{HTTP: http.MethodPost, Session: "UP-1", RPC: peers.Batch}] = &peers.Reply{
		Serve: func(w http.ResponseWriter, r *http.Request, _ string) {
			var msgs []map[string]any
			body, _ := io.ReadAll(r.Body)
			_ = json.Unmarshal(body, &msgs)
			for _, m := range msgs {
				if m["method"] == "tools/call" {
					runs.Add(1)
				}
			}
			c, _, _ := http.NewResponseController(w).Hijack()
			c.Close()
		}}
	replies[peers.Key{HTTP: http.MethodDelete, Session: peers.Any}] = &peers.Reply{Optional: true}
	return peers.StartScript(t, replies).URL(), &runs
}

// TestBatchNotReplayed: a JSON-RPC batch is judged as a whole and is not
// replay-safe (one element may be a tools/call): a server that runs it and
// dies gets it once, not once per backoff step (it ran 8 times).
func TestBatchNotReplayed(t *testing.T) {
	up, runs := startBatchUpstream(t)
	_, url := startProxy(t, up, func(c *conf.Config) { c.HealTimeout = 300 * time.Millisecond })
	sid := peers.RawInitialize(t, url)
	resp, raw := peers.RawPost(t, url, sid, `[{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"send_email","arguments":{}}}]`)
	t.Logf("agent got %d %s", resp.StatusCode, raw)
	if n := runs.Load(); n > 1 {
		t.Fatalf("non-replay-safe tools/call (in a batch) ran %d times", n)
	}
}
