package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/mcpheal/mcpheal/proxy/internal/conf"
	"github.com/mcpheal/mcpheal/proxy/internal/peers"
	"github.com/mcpheal/mcpheal/proxy/internal/wire"
)

// TestBadInput: each malformed request gets the proxy's own clear 4xx with a
// JSON-RPC error (carrying the request id where there is one), and the
// agent's live session keeps working afterwards.
func TestBadInput(t *testing.T) {
	t.Parallel()
	up := peers.StartGoSDK(t, peers.GoSDKOpts{})
	_, url := startProxy(t, up.URL(), func(c *conf.Config) { c.MaxBody = 64 << 10 })
	sid := peers.RawInitialize(t, url)
	before := up.Inits()

	post := func(ct, sid, body string, hdr map[string]string) *http.Request {
		req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
		if ct != "" {
			req.Header.Set("Content-Type", ct)
		}
		req.Header.Set("Accept", "application/json, text/event-stream")
		if sid != "" {
			req.Header.Set("Mcp-Session-Id", sid)
		}
		for k, v := range hdr {
			if k == "Host" {
				req.Host = v
				continue
			}
			req.Header.Set(k, v)
		}
		return req
	}
	get := func(accept string) *http.Request {
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		req.Header.Set("Mcp-Session-Id", sid)
		if accept != "" {
			req.Header.Set("Accept", accept)
		}
		return req
	}
	ping := `{"jsonrpc":"2.0","id":41,"method":"ping"}`
	tests := []struct {
		name   string
		req    *http.Request
		status int
		code   int64
		id     string
	}{
		{"malformed JSON", post("application/json", sid, `{"jsonrpc":"2.0","id":1,`, nil), 400, wire.CodeParseError, "null"},
		{"no session id", post("application/json", "", `{"jsonrpc":"2.0","id":"n-1","method":"tools/list"}`, nil), 400, wire.CodeInvalidRequest, `"n-1"`},
		{"unknown session id", post("application/json", "0123456789abcdef0123456789abcdef", ping, nil), 404, wire.CodeSessionNotFound, "41"},
		{"wrong content type", post("text/plain", sid, ping, nil), 415, wire.CodeInvalidRequest, "41"},
		{"no content type", post("", sid, ping, nil), 415, wire.CodeInvalidRequest, "41"},
		{"GET without Accept", get(""), 406, wire.CodeInvalidRequest, "null"},
		{"GET wanting JSON", get("application/json"), 406, wire.CodeInvalidRequest, "null"},
		{"foreign Host", post("application/json", sid, ping, map[string]string{"Host": "evil.example:8787"}), 403, wire.CodeForbidden, "41"},
		{"foreign Origin", post("application/json", sid, ping, map[string]string{"Origin": "https://evil.example"}), 403, wire.CodeForbidden, "41"},
		{"PUT", func() *http.Request { r, _ := http.NewRequest(http.MethodPut, url, nil); return r }(), 405, wire.CodeInvalidRequest, "null"},
	}
	for _, tt := range tests {
		resp, body := peers.RawDo(t, tt.req)
		code, msg, id := rpcError(t, body)
		if resp.StatusCode != tt.status || code != tt.code || id != tt.id || msg == "" {
			t.Errorf("%s: %d %s; want %d, code %d, id %s", tt.name, resp.StatusCode, body, tt.status, tt.code, tt.id)
		}
		if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
			t.Errorf("%s: Content-Type %q, want application/json", tt.name, ct)
		}
	}
	// Over the body limit: the proxy answers from the declared length,
	// before reading the body (a raw connection, so that the client's write
	// of the unread body cannot race the answer).
	c, err := net.Dial("tcp", strings.TrimSuffix(strings.TrimPrefix(url, "http://"), "/mcp"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "POST /mcp HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nMcp-Session-Id: %s\r\nContent-Length: %d\r\n\r\n{",
		c.RemoteAddr(), sid, 70<<10)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	if code, _, _ := rpcError(t, body); resp.StatusCode != http.StatusRequestEntityTooLarge || code != wire.CodeInvalidRequest {
		t.Errorf("body over limit: %d %s; want 413 with a JSON-RPC error", resp.StatusCode, body)
	}

	// Nothing above disturbed the session.
	resp, body = peers.RawPost(t, url, sid, ping)
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"result"`) {
		t.Fatalf("ping after bad input: %d %q", resp.StatusCode, body)
	}
	if up.Inits() != before {
		t.Fatalf("bad input caused %d upstream initializes", up.Inits()-before)
	}
}

func TestRequestID(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		`{"id":5}`: "5", `{"id":"x"}`: `"x"`, `{"id":null}`: "null", `{}`: "null", ``: "null",
		`{"id":{"a":1}}`: "null", `not json`: "null",
	} {
		if got := RequestID([]byte(in), 64); got != want {
			t.Errorf("requestID(%q) = %s, want %s", in, got, want)
		}
	}
}

func TestHostGuard(t *testing.T) {
	t.Parallel()
	g := NewHostGuard("127.0.0.1:8787", []string{"mcp.internal"})
	for host, want := range map[string]bool{
		"127.0.0.1:8787": true, "localhost:8787": true, "LOCALHOST:8787": true, "[::1]:8787": true,
		"mcp.internal": true, "mcp.internal:8787": true,
		"evil.example:8787": false, "127.0.0.1:9999": true, "": false, "attacker.com": false,
	} {
		// A bare 127.0.0.1 of another port is still this machine's loopback:
		// only names matter for DNS rebinding.
		if got := g.AllowHost([]byte(host)); got != want {
			t.Errorf("allowHost(%q) = %v, want %v", host, got, want)
		}
	}
	for origin, want := range map[string]bool{
		"": true, "http://localhost:8787": true, "http://127.0.0.1:8787": true,
		"https://evil.example": false, "null": false, "http://localhost.evil.example": false,
	} {
		if got := g.AllowOrigin([]byte(origin)); got != want {
			t.Errorf("allowOrigin(%q) = %v, want %v", origin, got, want)
		}
	}
}
