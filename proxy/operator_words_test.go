package proxy

// What mcpheal says when something goes wrong, in the words an operator
// acts on: an answer cut mid-stream is not "answered 200", and a heal
// abandoned because mcpheal is shutting down is not a failed heal.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestCutStreamSaysSo: the upstream sends the head of an SSE answer to a
// tools/call and dies before its first event. The call may have run: the
// agent gets -32011, and its message and the log line say the stream ended
// before the answer (not that the upstream "answered 200", which reads like
// success), and the log line has a cause.
func TestCutStreamSaysSo(t *testing.T) {
	t.Parallel()
	var runs atomic.Int64
	up := startStub(t, nil, func(w http.ResponseWriter, r *http.Request, method string) {
		if method != "tools/call" {
			w.WriteHeader(http.StatusBadRequest) // a session-era server's answer to server/discover
			return
		}
		runs.Add(1)
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		_ = http.NewResponseController(w).Flush()
		panic(http.ErrAbortHandler) // the server dies mid-answer
	})
	_, url, logs := startProxyLog(t, up, nil)
	sid := peerRawInitialize(t, url)
	resp, raw := peerRawPost(t, url, sid, `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"charge","arguments":{}}}`)
	code, msg, _ := rpcError(t, raw)
	if resp.StatusCode != http.StatusOK || code != codeMaybeExecuted {
		t.Fatalf("cut answer: %d %s; want 200 with -32011", resp.StatusCode, raw)
	}
	if strings.Contains(msg, "answered 200") || !strings.Contains(msg, "stream ended before its answer") {
		t.Fatalf("cut answer says %q; want that the stream ended before the answer", msg)
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("the tool ran %d times; want 1 (not replayed)", n)
	}
	line := logLine(t, logs, "not replayed")
	if !strings.Contains(line, `"cause":"the upstream's event stream ended before its answer (no event id to resume it from)"`) {
		t.Fatalf("log line %s; want its cause", line)
	}
}

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
	sid := peerRawInitialize(t, url)
	resp := agentGet(t, url, sid)
	go func() { _, _ = io.Copy(io.Discard, resp.Body) }()
	peerWait(t, "the GET stream's heal to reach the upstream", func() bool { return inits.Load() == 2 })
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	_ = s.Shutdown(ctx)
	peerWait(t, "the heal to be given up", func() bool { return strings.Contains(logs.String(), "heal abandoned") })
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, `"level":"error"`) {
			t.Fatalf("an error-level line for a heal abandoned at shutdown: %s", line)
		}
	}
}

// logLine returns the first line of the proxy's log holding want, failing
// the test when there is none.
func logLine(t *testing.T, logs *testLog, want string) string {
	t.Helper()
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, want) {
			return line
		}
	}
	t.Fatalf("no log line with %q", want)
	return ""
}
