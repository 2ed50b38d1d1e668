package proxy

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestFinishReadsOnlyWhatArrived: an answer whose stream stays open after
// its response is not cut into by a read deadline (a line split across that
// wait once escaped its rewriting).
func TestFinishReadsOnlyWhatArrived(t *testing.T) {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var m map[string]any
		_ = json.NewDecoder(r.Body).Decode(&m)
		if m["method"] == "initialize" {
			w.Header().Set("Mcp-Session-Id", "UP-1")
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"jsonrpc":"2.0","id":1,"result":{"protocolVersion":"2025-11-25","capabilities":{},"serverInfo":{"name":"b","version":"1"}}}`)
			return
		}
		if m["method"] != "tools/call" {
			w.WriteHeader(202)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		f := w.(http.Flusher)
		io.WriteString(w, "id: 41\ndata: {\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{}}\n\n")
		f.Flush()
		time.Sleep(5 * time.Millisecond)
		io.WriteString(w, "id: 4") // a line split across the 20 ms finish window
		f.Flush()
		time.Sleep(60 * time.Millisecond)
		io.WriteString(w, "2\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{}}\n\n")
	})}
	go srv.Serve(ln)
	defer srv.Close()
	_, url := startProxy(t, "http://"+ln.Addr().String()+"/mcp", nil)
	sid := peerRawInitialize(t, url)
	_, raw := peerRawPost(t, url, sid, `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"x","arguments":{}}}`)
	t.Logf("agent got %q", raw)
	if strings.Contains(string(raw), "id: 42\n") {
		t.Fatalf("event id passed through unrewritten (upstream id leaked to the agent, Last-Event-ID scheme broken)")
	}
}
