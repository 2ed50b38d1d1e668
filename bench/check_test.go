package bench

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

func TestCheckEcho(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		body   string
		wantID uint64
		ok     bool
	}{
		{"json", `{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"bench-7"}]}}`, 7, true},
		{"sse", "event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":8,\"result\":{\"content\":[{\"type\":\"text\",\"text\":\"bench-8\"}]}}\n\n", 8, true},
		{"sse-crlf-priming", "id: 1\r\ndata:\r\n\r\nevent: message\r\ndata: {\"jsonrpc\":\"2.0\",\"id\":9,\"result\":{\"content\":[{\"type\":\"text\",\"text\":\"bench-9\"}]}}\r\n\r\n", 9, true},
		{"sse-lone-cr", "data: {\"jsonrpc\":\"2.0\",\"id\":3,\"result\":{\"content\":[{\"type\":\"text\",\"text\":\"bench-3\"}]}}\r\r", 3, true},
		{"sse-notification-first", "data: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{\"result\":1,\"id\":4}}\n\ndata: {\"jsonrpc\":\"2.0\",\"id\":5,\"result\":{\"content\":[{\"type\":\"text\",\"text\":\"bench-5\"}]}}\n\n", 5, true},
		{"sse-two-data-lines", "data: {\"jsonrpc\":\"2.0\",\"id\":6,\ndata: \"result\":{\"content\":[{\"type\":\"text\",\"text\":\"bench-6\"}]}}\n\n", 6, true},
		// An answer that ends inside its event was cut on the way: it fails
		// even though its data is whole JSON.
		{"sse-unfinished", "event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":8,\"result\":{\"content\":[{\"type\":\"text\",\"text\":\"bench-8\"}]}}\n", 0, false},
		{"other-text", `{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"bench-8"}]}}`, 0, false},
		{"string-id", `{"jsonrpc":"2.0","id":"7","result":{"content":[{"type":"text","text":"bench-7"}]}}`, 0, false},
		{"error", `{"jsonrpc":"2.0","id":7,"error":{"code":-32011,"message":"bench-7"}}`, 0, false},
		{"empty", ``, 0, false},
		{"html", `<html>502</html>`, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			id, err := CheckEcho([]byte(tc.body))
			if (err == nil) != tc.ok || (tc.ok && id != tc.wantID) {
				t.Errorf("CheckEcho(%s) = %d, %v; want %d, ok %v", tc.name, id, err, tc.wantID, tc.ok)
			}
		})
	}
}

func TestCallBodyIsEchoed(t *testing.T) {
	t.Parallel()
	body := CallBody(42)
	want := `{"jsonrpc":"2.0","id":42,"method":"tools/call","params":{"name":"echo","arguments":{"text":"bench-42"}}}`
	if string(body) != want {
		t.Errorf("CallBody(42) = %s, want %s", body, want)
	}
	body = AppendToolCallBody(nil, 42, "bench-echo")
	want = `{"jsonrpc":"2.0","id":42,"method":"tools/call","params":{"name":"bench-echo","arguments":{"text":"bench-42"}}}`
	if string(body) != want {
		t.Errorf("AppendToolCallBody(42, bench-echo) = %s, want %s", body, want)
	}
	h := Session{Auth: "Bearer x"}.Header()
	if got := h.Get("Authorization"); got != "Bearer x" {
		t.Errorf("Session.Header Authorization = %q, want the session's Auth", got)
	}
}

// TestCallSplitAnswer: Session.Call checks an SSE answer that arrives in
// several reads, one CRLF split across two of them, and fails one that
// ends inside its event.
func TestCallSplitAnswer(t *testing.T) {
	t.Parallel()
	const data = `{"jsonrpc":"2.0","id":5,"result":{"content":[{"type":"text","text":"bench-5"}]}}`
	for _, tc := range []struct {
		name   string
		pieces []string
		ok     bool
	}{
		{"whole", []string{"event: message\r\n", "data: " + data[:30], data[30:] + "\r", "\n\r", "\n"}, true},
		{"cut", []string{"event: message\r\n", "data: " + data[:30], data[30:] + "\r\n"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				w.Header().Set("Content-Type", "text/event-stream")
				rc := http.NewResponseController(w)
				for _, p := range tc.pieces {
					_, _ = w.Write([]byte(p))
					_ = rc.Flush()
					time.Sleep(time.Millisecond) // one read each, most of the time
				}
			}))
			t.Cleanup(up.Close)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			s := Session{URL: up.URL, ID: "s", Protocol: ProtocolVersion}
			if err := s.Call(ctx, up.Client(), 5); (err == nil) != tc.ok {
				t.Errorf("Call over %q = %v; want ok %v", tc.pieces, err, tc.ok)
			}
		})
	}
}
