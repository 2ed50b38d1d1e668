package bench

import "testing"

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
}
