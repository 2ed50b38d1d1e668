package proxy

// What mcpheal says when something goes wrong, in the words an operator
// acts on: an answer cut mid-stream is not "answered 200", and a heal
// abandoned because mcpheal is shutting down is not a failed heal.

import (
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/mcpheal/mcpheal/proxy/internal/peers"
	"github.com/mcpheal/mcpheal/proxy/internal/wire"
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
	sid := peers.RawInitialize(t, url)
	resp, raw := peers.RawPost(t, url, sid, `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"charge","arguments":{}}}`)
	code, msg, _ := rpcError(t, raw)
	if resp.StatusCode != http.StatusOK || code != wire.CodeMaybeExecuted {
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
