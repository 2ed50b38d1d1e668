package proxy

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"testing"
)

// TestGetRefusalGivesBudgetBack: a GET answered with a refusal (405) gives
// back the memory budget its buffered answer took.
func TestGetRefusalGivesBudgetBack(t *testing.T) {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(405)
			io.WriteString(w, `{"jsonrpc":"2.0","error":{"code":-32000,"message":"Method not allowed."},"id":null}`)
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
	s, url := startProxy(t, "http://"+ln.Addr().String()+"/mcp", nil)
	sid := peerRawInitialize(t, url)
	before := s.mem.used.Load()
	for i := 0; i < 100; i++ {
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		req.Header.Set("Accept", "text/event-stream")
		req.Header.Set("Mcp-Session-Id", sid)
		req.Header.Set("MCP-Protocol-Version", "2025-11-25")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if i == 0 {
			t.Logf("GET answered %d", resp.StatusCode)
		}
	}
	after := s.mem.used.Load()
	t.Logf("memory budget used: before %d, after 100 GETs answered 405: %d", before, after)
	if after != before {
		t.Fatalf("budget leaked %d bytes", after-before)
	}
}
