package proxy

import (
	"context"
	"encoding/json"
	"fmt"
	"github.com/mcpheal/mcpheal/proxy/internal/peers"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// Tests of shutdown (lifecycle.go).

// TestHealAbandonedAtShutdownIsNoError: a GET stream's heal is under way
// (the upstream takes its time to initialize) when mcpheal shuts down. The
// heal is abandoned: logged at info as such, never as "heal failed" at
// error level, which docs/observability.md lists as worth an alert.
func TestHealAbandonedAtShutdownIsNoError(t *testing.T) {
	t.Parallel()
	var inits, gets atomic.Int64
	hold := make(chan struct{})
	defer close(hold)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			if gets.Add(1) == 1 {
				// The first stream carries one event and ends; the session
				// is gone for the reopen.
				w.Header().Set("Content-Type", "text/event-stream")
				_, _ = io.WriteString(w, "event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{\"level\":\"info\",\"data\":\"x\"}}\n\n")
				return
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			_, _ = io.WriteString(w, `{"jsonrpc":"2.0","error":{"code":-32001,"message":"Session not found"},"id":null}`)
			return
		}
		var m struct {
			Method string          `json:"method"`
			ID     json.RawMessage `json:"id"`
		}
		_ = json.NewDecoder(r.Body).Decode(&m)
		switch m.Method {
		case "initialize":
			if inits.Add(1) > 1 {
				select { // the heal's initialize: slow
				case <-hold:
				case <-r.Context().Done():
				}
				return
			}
			w.Header().Set("Mcp-Session-Id", "UP-1")
			w.Header().Set("Content-Type", "application/json")
			_, _ = fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":{"protocolVersion":"2025-11-25","capabilities":{},"serverInfo":{"name":"slow-heal","version":"1"}}}`, m.ID)
		default:
			w.WriteHeader(http.StatusAccepted)
		}
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	s, url, logs := startProxyLog(t, "http://"+ln.Addr().String()+"/mcp", nil)
	sid := peers.RawInitialize(t, url)
	resp := agentGet(t, url, sid)
	go func() { _, _ = io.Copy(io.Discard, resp.Body) }()
	peers.Wait(t, "the GET stream's heal to reach the upstream", func() bool { return inits.Load() == 2 })
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	_ = s.Shutdown(ctx)
	peers.Wait(t, "the heal to be given up", func() bool { return strings.Contains(logs.String(), "heal abandoned") })
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, `"level":"error"`) {
			t.Fatalf("an error-level line for a heal abandoned at shutdown: %s", line)
		}
	}
}
