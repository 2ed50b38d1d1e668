package proxy

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

// TestInitializeNotKeptIsDeleted: an initialize whose answer mcpheal cannot
// keep (over max_answer, or over the memory budget) leaves no session open
// upstream: every session the server opened for it is DELETEd, once.
func TestInitializeNotKeptIsDeleted(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		mod  func(*Config)
	}{
		{"max_answer", func(c *Config) { c.MaxAnswer = 1 << 10 }},
		{"memory_budget", func(c *Config) { c.MemoryBudget = 4 << 10 }},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			var mu sync.Mutex // protects created, deleted
			created, deleted := map[string]int{}, map[string]int{}
			big := strings.Repeat("x", 8<<10)
			up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				defer mu.Unlock()
				if r.Method == http.MethodDelete {
					deleted[r.Header.Get("Mcp-Session-Id")]++
					return
				}
				id := fmt.Sprintf("UP-%d", len(created)+1)
				created[id]++
				w.Header().Set("Mcp-Session-Id", id)
				w.Header().Set("Content-Type", "application/json")
				fmt.Fprintf(w, `{"jsonrpc":"2.0","id":1,"result":{"protocolVersion":"2025-11-25","capabilities":{},"serverInfo":{"name":"big","version":"1"},"instructions":"%s"}}`, big)
			}))
			t.Cleanup(up.Close)
			_, url := startProxy(t, up.URL+"/mcp", func(cfg *Config) { c.mod(cfg); cfg.Keepalive = -1; cfg.EraBridge = "off" })
			for range 4 {
				resp, body := peerRawPost(t, url, "",
					`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"a","version":"1"}}}`)
				if resp.StatusCode == http.StatusOK {
					t.Fatalf("initialize answered 200 %.80s; want mcpheal's refusal", body)
				}
			}
			// The DELETEs go in the background, each at once.
			peerWait(t, "a DELETE of every upstream session", func() bool {
				mu.Lock()
				defer mu.Unlock()
				return len(deleted) >= len(created)
			})
			mu.Lock()
			defer mu.Unlock()
			for id := range created {
				if deleted[id] != 1 {
					t.Errorf("upstream session %s: %d DELETEs, want 1 (created %d, deleted %v)", id, deleted[id], len(created), deleted)
				}
			}
		})
	}
}
