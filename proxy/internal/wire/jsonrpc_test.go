package wire

import (
	"testing"

	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"
)

func TestParseMessage(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in      string
		want    Message
		request bool
	}{
		{`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo"}}`, Message{Method: "tools/call", ID: "1", Tool: "echo"}, true},
		{`{"jsonrpc":"2.0","id":"a-1","method":"ping"}`, Message{Method: "ping", ID: `"a-1"`}, true},
		{`{"jsonrpc":"2.0","method":"notifications/initialized"}`, Message{Method: "notifications/initialized"}, false},
		{`{"jsonrpc":"2.0","id":null,"method":"x"}`, Message{Method: "x"}, false},
		{`{"jsonrpc":"2.0","id":7,"result":{}}`, Message{ID: "7"}, false},
		{`[{"jsonrpc":"2.0","id":1,"method":"ping"}]`, Message{Batch: true}, false},
		// Routed members are read as Go servers read them: escapes decoded,
		// case folded, the last one kept, and a second one flagged.
		{`{"jsonrpc":"2.0","id":1,"m\u0065thod":"ping"}`, Message{Method: "ping", ID: "1"}, true},
		{`{"jsonrpc":"2.0","ID":1,"Method":"tools/call","Params":{"Name":"echo"}}`, Message{Method: "tools/call", ID: "1", Tool: "echo"}, true},
		{`{"jsonrpc":"2.0","id":1,"method":"ping","Method":"tools/call","params":{"name":"x"}}`, Message{Method: "tools/call", ID: "1", Tool: "x", Dup: true}, true},
		{`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","NAME":"b"}}`, Message{Method: "tools/call", ID: "1", Tool: "b", Dup: true}, true},
	}
	for _, tt := range tests {
		got := ParseMessage([]byte(tt.in))
		if got != tt.want || got.IsRequest() != tt.request {
			t.Errorf("parseMessage(%s) = %+v (request %v), want %+v (request %v)", tt.in, got, got.IsRequest(), tt.want, tt.request)
		}
	}
}

func TestWriteError(t *testing.T) {
	t.Parallel()
	var ctx fasthttp.RequestCtx
	WriteError(&ctx, 404, CodeSessionNotFound, `"r-1"`, `Session "x" not found`)
	body := ctx.Response.Body()
	if !gjson.ValidBytes(body) {
		t.Fatalf("writeError body is not JSON: %s", body)
	}
	if ctx.Response.StatusCode() != 404 || gjson.GetBytes(body, "id").Str != "r-1" ||
		gjson.GetBytes(body, "error.code").Int() != CodeSessionNotFound ||
		gjson.GetBytes(body, "error.message").Str != `Session "x" not found` {
		t.Fatalf("writeError = %d %s", ctx.Response.StatusCode(), body)
	}
}

func TestWithID(t *testing.T) {
	t.Parallel()
	in := []byte(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"id":3}}`)
	got := WithID(in, `"mcpheal-init-9"`)
	if want := `{"jsonrpc":"2.0","id":"mcpheal-init-9","method":"initialize","params":{"id":3}}`; string(got) != want {
		t.Fatalf("withID = %s, want %s", got, want)
	}
	if string(in) != `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"id":3}}` {
		t.Fatal("withID changed its input")
	}
}
