package bench

import (
	"io"
	"net/http"
	"strconv"
	"sync/atomic"

	"github.com/tidwall/gjson"
)

// Stub is a minimal stateful MCP upstream for the memory run, where the Go
// SDK server would itself hold 100 000 sessions: it answers initialize with
// a fresh Mcp-Session-Id and every other POST with 202, and keeps no state.
type Stub struct {
	n atomic.Uint64 // session ids handed out
}

// ServeHTTP implements http.Handler.
func (s *Stub) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodDelete {
		w.WriteHeader(http.StatusOK)
		return
	}
	if r.Method != http.MethodPost {
		w.WriteHeader(http.StatusMethodNotAllowed)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	if gjson.GetBytes(body, "method").Str != "initialize" {
		w.WriteHeader(http.StatusAccepted)
		return
	}
	id := gjson.GetBytes(body, "id").Raw
	w.Header().Set("Mcp-Session-Id", "stub-"+strconv.FormatUint(s.n.Add(1), 10))
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, `{"jsonrpc":"2.0","id":`+id+`,"result":{"protocolVersion":"`+ProtocolVersion+
		`","capabilities":{"tools":{}},"serverInfo":{"name":"bench-stub","version":"1"}}}`)
}

// Sessions returns how many sessions the stub has opened.
func (s *Stub) Sessions() uint64 { return s.n.Load() }
