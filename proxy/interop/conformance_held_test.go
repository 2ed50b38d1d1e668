package interop

// The shim of the conformance table's row "Go SDK 1.8.0 behind a shim,
// session era only" (conformance_table_test.go): the Go SDK's
// everything-server (with sessions) behind a shim that makes it a server of
// the session era only, as the table's first judge of the held route was;
// the real servers of the session era are in conformance_servers_test.go.
// And what the held route in front of any session-era server cannot carry.

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"
)

// onlyLegacy fronts the everything-server at upstream as a server of the
// session era only: a POST without Mcp-Session-Id that is not an
// initialize, or one that claims 2026-07-28, gets 400 "Bad Request:
// Server not initialized" (the TypeScript SDK's answer, id null). All else
// passes through, SSE streamed as it comes.
func onlyLegacy(t *testing.T, upstream string) http.Handler {
	t.Helper()
	u, err := url.Parse(upstream)
	if err != nil {
		t.Fatal(err)
	}
	pass := httputil.NewSingleHostReverseProxy(u)
	pass.FlushInterval = -1
	pass.ErrorLog = nil
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			body, err := io.ReadAll(r.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
			var msg struct {
				Method string `json:"method"`
			}
			_ = json.Unmarshal(body, &msg)
			modern := strings.HasPrefix(r.Header.Get("Mcp-Protocol-Version"), "2026") || bytes.Contains(body, []byte(`"io.modelcontextprotocol/protocolVersion"`))
			if (r.Header.Get("Mcp-Session-Id") == "" && msg.Method != "initialize") || (modern && msg.Method != "initialize") {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusBadRequest)
				_, _ = io.WriteString(w, `{"jsonrpc":"2.0","error":{"code":-32000,"message":"Bad Request: Server not initialized"},"id":null}`)
				return
			}
		}
		pass.ServeHTTP(w, r)
	})
}

// heldKnown are the checks that pass on a server of both eras but not
// through the held route in front of the same server restricted to the
// session era, each with why (docs/eras.md "What the session era cannot
// carry"):
//
//   - input-required-result-basic-elicitation: the suite wants the input
//     request under the tool's own key (user_name); a session-era server
//     sends an elicitation/create request, which names no key, and mcpheal
//     gives it one of its own (mcpheal-1); the second check follows from
//     the first (it is not run when the key is missing).
var heldKnown = []string{
	"input-required-result-basic-elicitation/sep-2322-elicitation-incomplete",
	"input-required-result-basic-elicitation/sep-2322-elicitation-complete",
}
