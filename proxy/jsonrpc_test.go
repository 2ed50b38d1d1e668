package proxy

import (
	"testing"

	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"

	"github.com/mcpheal/mcpheal/proxy/internal/wire"
)

func TestParseMessage(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in      string
		want    wire.Message
		request bool
	}{
		{`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo"}}`, wire.Message{Method: "tools/call", ID: "1", Tool: "echo"}, true},
		{`{"jsonrpc":"2.0","id":"a-1","method":"ping"}`, wire.Message{Method: "ping", ID: `"a-1"`}, true},
		{`{"jsonrpc":"2.0","method":"notifications/initialized"}`, wire.Message{Method: "notifications/initialized"}, false},
		{`{"jsonrpc":"2.0","id":null,"method":"x"}`, wire.Message{Method: "x"}, false},
		{`{"jsonrpc":"2.0","id":7,"result":{}}`, wire.Message{ID: "7"}, false},
		{`[{"jsonrpc":"2.0","id":1,"method":"ping"}]`, wire.Message{Batch: true}, false},
		// Routed members are read as Go servers read them: escapes decoded,
		// case folded, the last one kept, and a second one flagged.
		{`{"jsonrpc":"2.0","id":1,"m\u0065thod":"ping"}`, wire.Message{Method: "ping", ID: "1"}, true},
		{`{"jsonrpc":"2.0","ID":1,"Method":"tools/call","Params":{"Name":"echo"}}`, wire.Message{Method: "tools/call", ID: "1", Tool: "echo"}, true},
		{`{"jsonrpc":"2.0","id":1,"method":"ping","Method":"tools/call","params":{"name":"x"}}`, wire.Message{Method: "tools/call", ID: "1", Tool: "x", Dup: true}, true},
		{`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","NAME":"b"}}`, wire.Message{Method: "tools/call", ID: "1", Tool: "b", Dup: true}, true},
	}
	for _, tt := range tests {
		got := wire.ParseMessage([]byte(tt.in))
		if got != tt.want || got.IsRequest() != tt.request {
			t.Errorf("parseMessage(%s) = %+v (request %v), want %+v (request %v)", tt.in, got, got.IsRequest(), tt.want, tt.request)
		}
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

func TestWriteError(t *testing.T) {
	t.Parallel()
	var ctx fasthttp.RequestCtx
	wire.WriteError(&ctx, 404, wire.CodeSessionNotFound, `"r-1"`, `Session "x" not found`)
	body := ctx.Response.Body()
	if !gjson.ValidBytes(body) {
		t.Fatalf("writeError body is not JSON: %s", body)
	}
	if ctx.Response.StatusCode() != 404 || gjson.GetBytes(body, "id").Str != "r-1" ||
		gjson.GetBytes(body, "error.code").Int() != wire.CodeSessionNotFound ||
		gjson.GetBytes(body, "error.message").Str != `Session "x" not found` {
		t.Fatalf("writeError = %d %s", ctx.Response.StatusCode(), body)
	}
}

func TestWithID(t *testing.T) {
	t.Parallel()
	in := []byte(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"id":3}}`)
	got := wire.WithID(in, `"mcpheal-init-9"`)
	if want := `{"jsonrpc":"2.0","id":"mcpheal-init-9","method":"initialize","params":{"id":3}}`; string(got) != want {
		t.Fatalf("withID = %s, want %s", got, want)
	}
	if string(in) != `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"id":3}}` {
		t.Fatal("withID changed its input")
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
