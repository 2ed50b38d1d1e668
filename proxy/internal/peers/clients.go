package peers

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	mcpgoclient "github.com/mark3labs/mcp-go/client"
	mcpgotransport "github.com/mark3labs/mcp-go/client/transport"
	mcpgo "github.com/mark3labs/mcp-go/mcp"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// ---------------------------------------------------------------------------
// clients

// GoSDKClient connects a go-sdk v1.8.0 client (StreamableClientTransport,
// default options, its own connection pool) to url and closes it in
// cleanup. It speaks the session era (initialize 2025-11-25): the tests of
// session-era agents use it; GoSDK2026Client is the same client speaking
// MCP 2026-07-28.
func GoSDKClient(t testing.TB, url string) *mcp.ClientSession {
	t.Helper()
	return GoSDKClientWith(t, url, nil)
}

// GoSDKClientWith is GoSDKClient with client options (handlers such as
// ProgressNotificationHandler).
func GoSDKClientWith(t testing.TB, url string, opts *mcp.ClientOptions) *mcp.ClientSession {
	t.Helper()
	cs, err := goSDKConnect(t, url, opts)
	if err != nil {
		t.Fatalf("go-sdk client connect %s: %v", url, err)
	}
	return cs
}

// goSDKConnect is GoSDKClientWith returning the connect error instead of
// failing the test.
func goSDKConnect(t testing.TB, url string, opts *mcp.ClientOptions) (*mcp.ClientSession, error) {
	t.Helper()
	return goSDKConnectVia(t, url, opts, nil)
}

// GoSDKClientVia is GoSDKClientWith whose HTTP requests go through
// wrap(transport), e.g. to record the wire traffic between client and proxy.
func GoSDKClientVia(t testing.TB, url string, opts *mcp.ClientOptions, wrap func(http.RoundTripper) http.RoundTripper) *mcp.ClientSession {
	t.Helper()
	cs, err := goSDKConnectVia(t, url, opts, wrap)
	if err != nil {
		t.Fatalf("go-sdk client connect %s: %v", url, err)
	}
	return cs
}

func goSDKConnectVia(t testing.TB, url string, opts *mcp.ClientOptions, wrap func(http.RoundTripper) http.RoundTripper) (*mcp.ClientSession, error) {
	t.Helper()
	tr := &http.Transport{}
	var rt http.RoundTripper = tr
	if wrap != nil {
		rt = wrap(tr)
	}
	c := mcp.NewClient(&mcp.Implementation{Name: "peer-test-go-sdk", Version: "1.0.0"}, opts)
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{
		Endpoint:   url,
		HTTPClient: &http.Client{Transport: rt},
	}, goSDKEra)
	if err != nil {
		tr.CloseIdleConnections()
		return nil, err
	}
	t.Cleanup(func() {
		_ = cs.Close()
		tr.CloseIdleConnections()
	})
	return cs, nil
}

// goSDKEra pins goSDKConnectVia's clients to the session era. Left to
// itself a go-sdk 1.8 client first POSTs server/discover
// (MCP-Protocol-Version 2026-07-28) and speaks 2026-07-28 when the answer
// offers it, as mcpheal's does for a session-era upstream (held.go).
var goSDKEra = &mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"}

// GoSDK2026Client connects a go-sdk v1.8.0 client as it comes (it asks
// server/discover first), which through mcpheal speaks MCP 2026-07-28.
func GoSDK2026Client(t testing.TB, url string, opts *mcp.ClientOptions) *mcp.ClientSession {
	t.Helper()
	tr := &http.Transport{}
	c := mcp.NewClient(&mcp.Implementation{Name: "peer-test-go-sdk-2026", Version: "1.0.0"}, opts)
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: &http.Client{Transport: tr}}, nil)
	if err != nil {
		tr.CloseIdleConnections()
		t.Fatalf("go-sdk client connect %s: %v", url, err)
	}
	t.Cleanup(func() {
		_ = cs.Close()
		tr.CloseIdleConnections()
	})
	return cs
}

// GoSDKCall calls a tool with a Timeout deadline and returns the SDK's
// answer unchanged.
func GoSDKCall(t testing.TB, cs *mcp.ClientSession, name string, args any) (*mcp.CallToolResult, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	return cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
}

// ResultText returns the text of a single-text-content result, or a
// description of what it was instead.
func ResultText(res *mcp.CallToolResult) string {
	if res == nil {
		return "<nil result>"
	}
	if res.IsError {
		return fmt.Sprintf("<tool error %v>", res.Content)
	}
	if len(res.Content) != 1 {
		return fmt.Sprintf("<%d contents>", len(res.Content))
	}
	tc, ok := res.Content[0].(*mcp.TextContent)
	if !ok {
		return fmt.Sprintf("<%T>", res.Content[0])
	}
	return tc.Text
}

// CallEcho calls echo {text} and fails the test unless text comes back.
func CallEcho(t testing.TB, cs *mcp.ClientSession, text string) {
	t.Helper()
	res, err := GoSDKCall(t, cs, "echo", map[string]any{"text": text})
	if err != nil {
		t.Fatalf("echo(%q): %v", text, err)
	}
	if got := ResultText(res); got != text {
		t.Fatalf("echo(%q) = %q, want %q", text, got, text)
	}
}

// McpGoClient starts and initializes a mark3labs/mcp-go v1.2.1 streamable
// HTTP client (default options: it probes server/discover first) and closes
// it in cleanup.
func McpGoClient(t testing.TB, url string) *mcpgoclient.Client {
	t.Helper()
	tr := &http.Transport{}
	c, err := mcpgoclient.NewStreamableHttpClient(url,
		mcpgotransport.WithHTTPBasicClient(&http.Client{Transport: tr}),
		mcpgotransport.WithHTTPLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatalf("mcp-go client %s: %v", url, err)
	}
	t.Cleanup(func() {
		_ = c.Close()
		tr.CloseIdleConnections()
	})
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	if err := c.Start(ctx); err != nil {
		t.Fatalf("mcp-go client start: %v", err)
	}
	var req mcpgo.InitializeRequest
	req.Params.ClientInfo = mcpgo.Implementation{Name: "peer-test-mcp-go", Version: "1.0.0"}
	if _, err := c.Initialize(ctx, req); err != nil {
		t.Fatalf("mcp-go client initialize %s: %v", url, err)
	}
	return c
}

// mcpGoCall calls a tool through an mcp-go client with a Timeout deadline.
func mcpGoCall(t testing.TB, c *mcpgoclient.Client, name string, args map[string]any) (*mcpgo.CallToolResult, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	var req mcpgo.CallToolRequest
	req.Params.Name = name
	req.Params.Arguments = args
	return c.CallTool(ctx, req)
}

// McpGoCallEcho calls echo {text} through an mcp-go client and fails the
// test unless text comes back.
func McpGoCallEcho(t testing.TB, c *mcpgoclient.Client, text string) {
	t.Helper()
	res, err := mcpGoCall(t, c, "echo", map[string]any{"text": text})
	if err != nil {
		t.Fatalf("mcp-go echo(%q): %v", text, err)
	}
	if res.IsError || len(res.Content) != 1 {
		t.Fatalf("mcp-go echo(%q) = %+v, want one text", text, res)
	}
	tc, ok := res.Content[0].(mcpgo.TextContent)
	if !ok || tc.Text != text {
		t.Fatalf("mcp-go echo(%q) = %#v, want %q", text, res.Content[0], text)
	}
}

// RawClient sends raw requests without keep-alive, so no idle socket
// outlives a test or points at a killed peer.
var RawClient = &http.Client{
	Transport: &http.Transport{DisableKeepAlives: true},
	Timeout:   Timeout,
}

// RawPost POSTs one JSON-RPC message as a session-era MCP client would
// (Content-Type application/json, Accept application/json and
// text/event-stream, MCP-Protocol-Version 2025-11-25, Mcp-Session-Id if
// sessionID != "") and returns the answer with its whole body.
func RawPost(t testing.TB, url, sessionID, body string) (*http.Response, []byte) {
	t.Helper()
	return RawDo(t, PostRequest(t, url, sessionID, body))
}

// PostRequest builds the POST that RawPost sends.
func PostRequest(t testing.TB, url, sessionID, body string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("MCP-Protocol-Version", "2025-11-25")
	if sessionID != "" {
		req.Header.Set("Mcp-Session-Id", sessionID)
	}
	return req
}

// RawDo sends req with RawClient and reads the whole answer.
func RawDo(t testing.TB, req *http.Request) (*http.Response, []byte) {
	t.Helper()
	resp, err := RawClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read body: %v", req.Method, req.URL, err)
	}
	return resp, b
}

// RawInitialize runs the 2025-11-25 handshake (initialize, then
// notifications/initialized) with raw requests and returns the session id.
func RawInitialize(t testing.TB, url string) string {
	t.Helper()
	resp, body := RawPost(t, url, "",
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"peer-raw","version":"1.0.0"}}}`)
	sid := resp.Header.Get("Mcp-Session-Id")
	if resp.StatusCode != http.StatusOK || sid == "" {
		t.Fatalf("raw initialize: %d, session %q, body %q", resp.StatusCode, sid, body)
	}
	resp, body = RawPost(t, url, sid, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("raw notifications/initialized: %d %q", resp.StatusCode, body)
	}
	return sid
}

// Wait polls cond every 2 ms until it holds or Timeout passes.
func Wait(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(Timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", Timeout, what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}
