package proxy

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/tidwall/gjson"

	"github.com/mcpheal/mcpheal/proxy/internal/conf"
	"github.com/mcpheal/mcpheal/proxy/internal/peers"
)

// TestInitializeNotKeptIsDeleted: an initialize whose answer mcpheal cannot
// keep (over max_answer, or over the memory budget) leaves no session open
// upstream: every session the server opened for it is DELETEd, once, the
// agent's own initialize and the one the held route sends for a
// 2026-07-28 agent alike (before, the held route DELETEd none of them).
func TestInitializeNotKeptIsDeleted(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		mod  func(*conf.Config)
		held bool
	}{
		{"max_answer", func(c *conf.Config) { c.MaxAnswer = 1 << 10 }, false},
		{"memory_budget", func(c *conf.Config) { c.MemoryBudget = 4 << 10 }, false},
		{"held max_answer", func(c *conf.Config) { c.MaxAnswer = 1 << 10; c.EraBridge = "auto" }, true},
		{"held memory_budget", func(c *conf.Config) { c.MemoryBudget = 4 << 10; c.EraBridge = "auto" }, true},
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
				if r.Header.Get("Mcp-Method") == "server/discover" {
					// A server of the session era: the held route's.
					http.Error(w, `{"jsonrpc":"2.0","error":{"code":-32000,"message":"Bad Request: Server not initialized"},"id":null}`, http.StatusBadRequest)
					return
				}
				id := fmt.Sprintf("UP-%d", len(created)+1)
				created[id]++
				w.Header().Set("Mcp-Session-Id", id)
				w.Header().Set("Content-Type", "application/json")
				fmt.Fprintf(w, `{"jsonrpc":"2.0","id":1,"result":{"protocolVersion":"2025-11-25","capabilities":{},"serverInfo":{"name":"big","version":"1"},"instructions":"%s"}}`, big)
			}))
			t.Cleanup(up.Close)
			_, url := startProxy(t, up.URL+"/mcp", func(cfg *conf.Config) { cfg.EraBridge = "off"; c.mod(cfg); cfg.Keepalive = -1 })
			for i := range 4 {
				if c.held {
					if st, msg := heldPost(t, url, "", "tools/list", "", i+1); st != http.StatusOK || msg.Get("error.code").Int() == 0 {
						t.Fatalf("a held route's tools/list answered %d %.80s; want mcpheal's refusal", st, msg.Raw)
					}
					continue
				}
				resp, body := peers.RawPost(t, url, "",
					`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"a","version":"1"}}}`)
				if resp.StatusCode != http.StatusOK || gjson.GetBytes(body, "error.code").Int() == 0 {
					t.Fatalf("initialize answered %d %.80s; want mcpheal's refusal", resp.StatusCode, body)
				}
			}
			// The DELETEs go in the background, each at once.
			peers.Wait(t, "a DELETE of every upstream session", func() bool {
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

// TestChurnDeletesEverySession: agents come and go every way they do
// (DELETE, idle expiry, a session the server itself expired and mcpheal
// healed), against the Go SDK server, and every upstream session mcpheal
// opened is DELETEd exactly once: created = DELETEd, so a server without
// idle expiry of its own never fills up with sessions nobody uses.
func TestChurnDeletesEverySession(t *testing.T) {
	t.Parallel()
	srv := mcp.NewServer(&mcp.Implementation{Name: "churn", Version: "1"}, nil)
	mcp.AddTool(srv, &mcp.Tool{Name: "echo"}, func(_ context.Context, _ *mcp.CallToolRequest, in peers.EchoIn) (*mcp.CallToolResult, any, error) {
		return peers.Text(in.Text), nil, nil
	})
	up := startRecorder(t, mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, &mcp.StreamableHTTPOptions{JSONResponse: true}))
	// sessions: the upstream sessions the answers named, and the DELETEs
	// of each.
	sessions := func() (created map[string]bool, deleted map[string]int) {
		created, deleted = map[string]bool{}, map[string]int{}
		up.mu.Lock()
		defer up.mu.Unlock()
		for _, q := range up.got {
			if q.minted != "" {
				created[q.minted] = true
			}
			if q.httpMethod == http.MethodDelete {
				deleted[q.session]++
			}
		}
		return created, deleted
	}
	_, url := startProxy(t, up.url, func(c *conf.Config) {
		c.SessionTTL, c.Keepalive, c.EraBridge = 300*time.Millisecond, -1, "off"
	})
	call := `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo","arguments":{"text":"churn"}}}`
	for i := range 30 {
		sid := peers.RawInitialize(t, url)
		if resp, body := peers.RawPost(t, url, sid, call); resp.StatusCode != http.StatusOK {
			t.Fatalf("agent %d: %d %s", i, resp.StatusCode, body)
		}
		switch i % 3 {
		case 0: // the agent ends it
			req, _ := http.NewRequest(http.MethodDelete, url, nil)
			req.Header.Set("Mcp-Session-Id", sid)
			peers.RawDo(t, req)
		case 1: // the server expires it; the next call heals
			for ss := range srv.Sessions() {
				_ = ss.Close()
			}
			if resp, body := peers.RawPost(t, url, sid, call); resp.StatusCode != http.StatusOK {
				t.Fatalf("agent %d after the server's expiry: %d %s", i, resp.StatusCode, body)
			}
		case 2: // left to idle out (session_ttl)
		}
	}
	peers.Wait(t, "a DELETE of every upstream session", func() bool {
		created, deleted := sessions()
		return len(deleted) >= len(created)
	})
	created, deleted := sessions()
	if len(created) < 30 {
		t.Fatalf("%d upstream sessions created, want at least 30", len(created))
	}
	for id := range created {
		if deleted[id] != 1 {
			t.Errorf("upstream session %.8s: %d DELETEs, want 1", id, deleted[id])
		}
	}
	for id := range deleted {
		if !created[id] {
			t.Errorf("a DELETE of %.8s, which was never created", id)
		}
	}
}
