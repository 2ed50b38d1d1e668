package proxy

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"testing"

	"github.com/mcpheal/mcpheal/proxy/internal/peers"
	"github.com/tidwall/gjson"
)

// Pretty-printed messages: a server that writes its JSON indented sends
// each line as its own data line, which an SSE reader joins with LF
// (§9.2.6). A relay that writes the joined data after one "data: " puts
// the other lines outside any data field, and the agent reads "{".
const (
	prettyUpdated = `{
  "jsonrpc": "2.0",
  "method": "notifications/resources/updated",
  "params": {
    "uri": "test://r1"
  }
}`
	prettyToolsChanged = `{
  "jsonrpc": "2.0",
  "method": "notifications/tools/list_changed"
}`
	prettyAcknowledged = `{
  "jsonrpc": "2.0",
  "method": "notifications/subscriptions/acknowledged"
}`
	prettyLog = `{
  "jsonrpc": "2.0",
  "method": "notifications/message",
  "params": {
    "level": "info",
    "data": "step 1"
  }
}`
)

// sameJSON reports whether got is the JSON want, whitespace aside.
func sameJSON(t *testing.T, got []byte, want string) bool {
	t.Helper()
	var g, w bytes.Buffer
	if err := json.Compact(&g, got); err != nil {
		return false
	}
	if err := json.Compact(&w, []byte(want)); err != nil {
		t.Fatalf("bad test JSON %q: %v", want, err)
	}
	return bytes.Equal(g.Bytes(), w.Bytes())
}

// TestBridgeGetStreamKeepsMultiLineEvents: the bridged agent's GET stream
// is served from the upstream's subscriptions/listen. An upstream event
// whose JSON is split over several data lines reaches the agent as one
// event whose data is that JSON.
func TestBridgeGetStreamKeepsMultiLineEvents(t *testing.T) {
	t.Parallel()
	up := startScriptedModern(t, &scriptedModern{
		discover: modernDiscover(`{"tools":{"listChanged":true},"resources":{"subscribe":true}}`, ""),
		handle: func(w http.ResponseWriter, r *http.Request, c scriptedCall) {
			if c.method != "subscriptions/listen" {
				scriptedJSON(w, http.StatusOK, `{"jsonrpc":"2.0","id":`+c.msg.Get("id").Raw+`,"error":{"code":-32601,"message":"Method not found"}}`)
				return
			}
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(http.StatusOK)
			_, _ = io.WriteString(w, multiLineEvent(prettyAcknowledged)+multiLineEvent(prettyUpdated)+multiLineEvent(prettyToolsChanged))
			_ = http.NewResponseController(w).Flush()
			<-r.Context().Done()
		},
	})
	_, url := startProxy(t, up.url, nil)
	sid := peers.RawInitialize(t, url)
	if resp, body := peers.RawPost(t, url, sid, `{"jsonrpc":"2.0","id":2,"method":"resources/subscribe","params":{"uri":"test://r1"}}`); resp.StatusCode != http.StatusOK {
		t.Fatalf("resources/subscribe: %d %s; want 200", resp.StatusCode, body)
	}
	get, _ := http.NewRequest(http.MethodGet, url, nil)
	get.Header.Set("Accept", "text/event-stream")
	get.Header.Set("Mcp-Session-Id", sid)
	get.Header.Set("MCP-Protocol-Version", "2025-11-25")
	resp, events := agentOpen(t, get)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET stream: %d; want 200", resp.StatusCode)
	}
	for _, want := range []string{prettyUpdated, prettyToolsChanged} {
		data, err := events.next()
		if err != nil {
			t.Fatalf("GET stream ended before %s: %v", gjson.Get(want, "method").Str, err)
		}
		if !sameJSON(t, data, want) {
			t.Fatalf("GET stream event data %q; want the upstream's %s as one JSON message", data, gjson.Get(want, "method").Str)
		}
	}
	if n := len(up.received("subscriptions/listen", "")); n != 1 {
		t.Errorf("the upstream got %d subscriptions/listen, want 1", n)
	}
}

// TestBridgeCallStreamKeepsMultiLineEvents: a bridged call's SSE answer
// relays each upstream event, a notification and the answer split over
// several data lines included, as one event whose data is its JSON (the
// answer with the agent's id).
func TestBridgeCallStreamKeepsMultiLineEvents(t *testing.T) {
	t.Parallel()
	up := startScriptedModern(t, &scriptedModern{
		handle: func(w http.ResponseWriter, _ *http.Request, c scriptedCall) {
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(http.StatusOK)
			answer := "{\n  \"jsonrpc\": \"2.0\",\n  \"id\": " + c.msg.Get("id").Raw +
				",\n  \"result\": {\n    \"content\": [\n      {\"type\": \"text\", \"text\": \"done\"}\n    ]\n  }\n}"
			_, _ = io.WriteString(w, multiLineEvent(prettyLog)+multiLineEvent(answer))
		},
	})
	_, url := startProxy(t, up.url, nil)
	sid := peers.RawInitialize(t, url)
	resp, events := agentOpen(t, peers.PostRequest(t, url, sid, `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"steps"}}`))
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("steps: %d %s; want 200 and an event stream", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	data, err := events.next()
	if err != nil || !sameJSON(t, data, prettyLog) {
		t.Fatalf("steps: first event data %q (%v); want the upstream's log message as one JSON message", data, err)
	}
	data, err = events.next()
	if err != nil || !sameJSON(t, data, `{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"done"}]}}`) {
		t.Fatalf("steps: second event data %q (%v); want the upstream's answer with the agent's id as one JSON message", data, err)
	}
	if n := len(up.received("tools/call", "steps")); n != 1 {
		t.Errorf("steps ran %d times upstream, want 1", n)
	}
}
