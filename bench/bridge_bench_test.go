package bench

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/valyala/fasthttp"
)

// modernUpstream is an official Go SDK (v1.8) server that speaks only MCP
// 2026-07-28, with an echo tool.
func modernUpstream(tb testing.TB) string {
	tb.Helper()
	srv := mcp.NewServer(&mcp.Implementation{Name: "modern", Version: "1"},
		&mcp.ServerOptions{SupportedProtocolVersions: []string{"2026-07-28"}})
	type in struct {
		Text string `json:"text"`
	}
	mcp.AddTool(srv, &mcp.Tool{Name: "echo"}, func(_ context.Context, _ *mcp.CallToolRequest, a in) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: a.Text}}}, nil, nil
	})
	hs := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv },
		&mcp.StreamableHTTPOptions{Stateless: true}))
	tb.Cleanup(hs.Close)
	return hs.URL + "/mcp"
}

// BenchmarkBridge measures one echo call through mcpheal to a
// 2026-07-28-only server: "native" is a 2026-07-28 request (passed
// through), "bridged" the same call from a session-era agent (mcpheal adds
// the envelope and headers, and maps the answer back). The difference is
// the bridge's added latency.
func BenchmarkBridge(b *testing.B) {
	up := modernUpstream(b)
	url := startProxy(b, up)
	addr := url[len("http://") : len(url)-len("/mcp")]
	hc := &fasthttp.HostClient{Addr: addr}

	// A session-era agent's session, through the bridge.
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	post := func(body string, hdr ...string) []byte {
		req.Reset()
		req.SetRequestURI(url)
		req.Header.SetMethod(fasthttp.MethodPost)
		req.Header.SetContentType("application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		req.SetBodyString(body)
		if err := hc.Do(req, resp); err != nil || resp.StatusCode() != fasthttp.StatusOK && resp.StatusCode() != fasthttp.StatusAccepted {
			b.Fatalf("%s: %v %d %s", body, err, resp.StatusCode(), resp.Body())
		}
		return resp.Body()
	}
	post(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"bench","version":"1"}}}`)
	sid := string(resp.Header.Peek("Mcp-Session-Id"))
	post(`{"jsonrpc":"2.0","method":"notifications/initialized"}`, "Mcp-Session-Id", sid, "MCP-Protocol-Version", "2025-11-25")

	cases := []struct {
		name string
		body string
		hdr  []string
	}{
		{"native", `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"echo","arguments":{"text":"x"},"_meta":{` +
			`"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientInfo":{"name":"bench","version":"1"},` +
			`"io.modelcontextprotocol/clientCapabilities":{}}}}`,
			[]string{"MCP-Protocol-Version", "2026-07-28", "Mcp-Method", "tools/call", "Mcp-Name", "echo"}},
		{"bridged", `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"echo","arguments":{"text":"x"}}}`,
			[]string{"Mcp-Session-Id", sid, "MCP-Protocol-Version", "2025-11-25"}},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			if out := post(c.body, c.hdr...); !bytes.Contains(out, []byte(`"text":"x"`)) {
				b.Fatalf("%s: %s", c.name, out)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				post(c.body, c.hdr...)
			}
		})
	}
}
