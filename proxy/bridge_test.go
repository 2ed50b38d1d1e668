package proxy

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpheal/mcpheal/proxy/internal/conf"
	"github.com/mcpheal/mcpheal/proxy/internal/peers"
	"github.com/mcpheal/mcpheal/proxy/internal/wire"
)

// modernServer is an official Go SDK (v1.8) server that speaks only MCP
// 2026-07-28 (stateless, SupportedProtocolVersions 2026-07-28), counting
// what it receives.
type modernServer struct {
	url     string
	srv     *mcp.Server
	rec     *recorder // what reached the server: a bridge never sends initialize
	echoes  atomic.Int64
	samples atomic.Int64 // sample calls that completed
	aborted atomic.Int64 // slow calls whose request context ended early
	close   func()
}

func startModern(t *testing.T) *modernServer {
	t.Helper()
	m := &modernServer{}
	m.srv = mcp.NewServer(&mcp.Implementation{Name: "modern-go", Version: "1.8"}, &mcp.ServerOptions{
		SupportedProtocolVersions: []string{wire.StatelessVersion},
		SubscribeHandler:          func(context.Context, *mcp.SubscribeRequest) error { return nil },
		UnsubscribeHandler:        func(context.Context, *mcp.UnsubscribeRequest) error { return nil },
		Instructions:              "modern instructions",
	})
	type textIn struct {
		Text string `json:"text"`
	}
	mcp.AddTool(m.srv, &mcp.Tool{Name: "echo", Description: "returns text"},
		func(_ context.Context, _ *mcp.CallToolRequest, in textIn) (*mcp.CallToolResult, any, error) {
			m.echoes.Add(1)
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: in.Text}}}, nil, nil
		})
	mcp.AddTool(m.srv, &mcp.Tool{Name: "steps", Description: "progress and log messages, then done"},
		func(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
			for i := 1; i <= 3; i++ {
				if tok := req.Params.GetProgressToken(); tok != nil {
					_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: tok, Progress: float64(i), Total: 3})
				}
				_ = req.Session.Log(ctx, &mcp.LoggingMessageParams{Level: "info", Data: "step " + strconv.Itoa(i)})
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "done"}}}, nil, nil
		})
	mcp.AddTool(m.srv, &mcp.Tool{Name: "sample", Description: "asks the client to sample"},
		func(_ context.Context, req *mcp.CallToolRequest, in textIn) (*mcp.CallToolResult, any, error) {
			// The Go SDK reads every sampling answer as the with-tools kind.
			if r, ok := req.Params.InputResponses["s"].(*mcp.CreateMessageWithToolsResult); ok {
				m.samples.Add(1)
				text := ""
				if len(r.Content) == 1 {
					if tc, ok := r.Content[0].(*mcp.TextContent); ok {
						text = tc.Text
					}
				}
				return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "sampled " + text + " state=" + req.Params.RequestState}}}, nil, nil
			}
			return &mcp.CallToolResult{
				InputRequests: mcp.InputRequestMap{"s": &mcp.CreateMessageParams{MaxTokens: 10,
					Messages: []*mcp.SamplingMessage{{Role: "user", Content: &mcp.TextContent{Text: in.Text}}}}},
				RequestState: "round-1",
			}, nil, nil
		})
	mcp.AddTool(m.srv, &mcp.Tool{Name: "slow", Description: "waits 10 s unless cancelled"},
		func(ctx context.Context, _ *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
			select {
			case <-ctx.Done():
				m.aborted.Add(1)
				return nil, nil, ctx.Err()
			case <-time.After(10 * time.Second):
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "slept"}}}, nil, nil
		})
	m.srv.AddResource(&mcp.Resource{URI: "test://r1", Name: "r1"}, func(context.Context, *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
		return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: "test://r1", Text: "one"}}}, nil
	})
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return m.srv },
		&mcp.StreamableHTTPOptions{Stateless: true, PropagateRequestCancellation: true})
	m.rec = startRecorder(t, h)
	m.url = m.rec.url
	hs := m.rec.srv
	m.close = func() { hs.CloseClientConnections(); hs.Close() }
	t.Cleanup(m.close)
	return m
}

// legacyClient connects an official Go SDK client pinned to the session
// era (2025-11-25), as an agent built before 2026-07-28 is.
func legacyClient(t *testing.T, url string, opts *mcp.ClientOptions) (*mcp.ClientSession, error) {
	t.Helper()
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	c := mcp.NewClient(&mcp.Implementation{Name: "legacy-agent", Version: "1"}, opts)
	ctx, cancel := context.WithTimeout(context.Background(), peers.Timeout)
	defer cancel()
	cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: &http.Client{Transport: tr}},
		&mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
	if err == nil {
		t.Cleanup(func() { _ = cs.Close() })
	}
	return cs, err
}

// TestBridgeGoSDK: a session-era Go SDK client cannot talk to a
// 2026-07-28-only Go SDK server directly; through mcpheal it connects,
// lists and calls tools, gets progress and log messages at the level it
// set, answers a sampling request the server made as an
// InputRequiredResult, and gets updates of a resource it subscribed to on
// its GET stream. The server never sees an initialize.
func TestBridgeGoSDK(t *testing.T) {
	t.Parallel()
	up := startModern(t)
	if cs, err := legacyClient(t, up.url, nil); err == nil {
		// The Go SDK server accepts the initialize and refuses what follows.
		_, err = cs.ListTools(context.Background(), nil)
		if err == nil {
			t.Fatal("a session-era client works directly against the 2026-07-28-only server: this test proves nothing")
		}
		t.Logf("directly: %v", err)
	}
	direct := up.rec.agentCalls("initialize")

	_, url := startProxy(t, up.url, nil)
	var progress, logs atomic.Int64
	var updated inbox
	cs, err := legacyClient(t, url, &mcp.ClientOptions{
		ProgressNotificationHandler: func(context.Context, *mcp.ProgressNotificationClientRequest) { progress.Add(1) },
		LoggingMessageHandler:       func(context.Context, *mcp.LoggingMessageRequest) { logs.Add(1) },
		ResourceUpdatedHandler: func(_ context.Context, req *mcp.ResourceUpdatedNotificationRequest) {
			updated.add(req.Params.URI)
		},
		CreateMessageHandler: func(_ context.Context, req *mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error) {
			text := ""
			if tc, ok := req.Params.Messages[0].Content.(*mcp.TextContent); ok {
				text = tc.Text
			}
			return &mcp.CreateMessageResult{Model: "m", Role: "assistant", Content: &mcp.TextContent{Text: "<" + text + ">"}}, nil
		},
	})
	if err != nil {
		t.Fatalf("connect through mcpheal: %v", err)
	}
	if got := cs.InitializeResult(); got.ServerInfo == nil || got.ServerInfo.Name != "modern-go" || got.Instructions != "modern instructions" {
		t.Fatalf("initialize through the bridge: %+v", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), peers.Timeout)
	defer cancel()
	tools, err := cs.ListTools(ctx, nil)
	if err != nil || len(tools.Tools) != 4 {
		t.Fatalf("tools/list: %v, %v", tools, err)
	}
	peers.CallEcho(t, cs, "bridged")
	if err := cs.SetLoggingLevel(ctx, &mcp.SetLoggingLevelParams{Level: "info"}); err != nil {
		t.Fatalf("logging/setLevel: %v", err)
	}
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "steps", Meta: mcp.Meta{"progressToken": "p1"}})
	if err != nil || peers.ResultText(res) != "done" {
		t.Fatalf("steps: %v, %v", peers.ResultText(res), err)
	}
	peers.Wait(t, "3 progress and 3 log messages", func() bool { return progress.Load() == 3 && logs.Load() == 3 })
	res, err = peers.GoSDKCall(t, cs, "sample", map[string]any{"text": "hi"})
	if err != nil || peers.ResultText(res) != "sampled <hi> state=round-1" {
		t.Fatalf("sample: %q, %v", peers.ResultText(res), err)
	}
	if err := cs.Subscribe(ctx, &mcp.SubscribeParams{URI: "test://r1"}); err != nil {
		t.Fatalf("resources/subscribe: %v", err)
	}
	nudge(t, "resources/updated through the bridge", func() {
		_ = up.srv.ResourceUpdated(context.Background(), &mcp.ResourceUpdatedNotificationParams{URI: "test://r1"})
	}, func() bool { return updated.count("test://r1") > 0 })
	if n := up.rec.agentCalls("initialize") - direct; n != 0 {
		t.Errorf("the server saw %d initialize through the bridge, want 0", n)
	}
	if n := up.echoes.Load(); n != 1 {
		t.Errorf("echo ran %d times, want 1", n)
	}
	if n := up.samples.Load(); n != 1 {
		t.Errorf("sample completed %d times, want 1", n)
	}
}

// TestBridgeCancel: the agent gives up on a bridged call (the Go SDK sends
// notifications/cancelled); mcpheal closes the upstream request, which is
// how 2026-07-28 cancels, and the server's handler sees it end.
func TestBridgeCancel(t *testing.T) {
	t.Parallel()
	up := startModern(t)
	_, url := startProxy(t, up.url, nil)
	cs, err := legacyClient(t, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if _, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "slow"}); err == nil {
		t.Fatal("slow returned before it was cancelled")
	}
	peers.Wait(t, "the server to see the call cancelled", func() bool { return up.aborted.Load() == 1 })
	peers.CallEcho(t, cs, "after a cancel") // the session goes on
}

// TestBridgeEraChange: the upstream is deployed again as a 2026-07-28-only
// server while an agent's session-era session is live. The agent's next
// call is refused by the new server as of the wrong era; mcpheal asks the
// era again and carries the session on through the bridge: the call
// succeeds, and runs once.
func TestBridgeEraChange(t *testing.T) {
	t.Parallel()
	modern := startModern(t)
	legacy := mcp.NewServer(&mcp.Implementation{Name: "legacy-go", Version: "1"}, nil)
	var legacyEchoes atomic.Int64
	mcp.AddTool(legacy, &mcp.Tool{Name: "echo"}, func(_ context.Context, _ *mcp.CallToolRequest, in struct {
		Text string `json:"text"`
	}) (*mcp.CallToolResult, any, error) {
		legacyEchoes.Add(1)
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: in.Text}}}, nil, nil
	})
	legacyH := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return legacy }, nil)
	modernH := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return modern.srv },
		&mcp.StreamableHTTPOptions{Stateless: true})
	var isModern atomic.Bool
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if isModern.Load() {
			modernH.ServeHTTP(w, r)
			return
		}
		legacyH.ServeHTTP(w, r)
	}))
	defer hs.Close()
	_, url := startProxy(t, hs.URL+"/mcp", nil)
	cs, err := legacyClient(t, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	peers.CallEcho(t, cs, "on the session-era server")
	isModern.Store(true)        // the redeploy
	hs.CloseClientConnections() // on loopback its FIN is here when this returns: the next write peeks it
	peers.CallEcho(t, cs, "on the 2026-07-28 server")
	peers.CallEcho(t, cs, "and again")
	if n, m := legacyEchoes.Load(), modern.echoes.Load(); n != 1 || m != 2 {
		t.Fatalf("echo ran %d times on the old server and %d on the new one, want 1 and 2", n, m)
	}
}

// TestBridgeOff: with era_bridge off the proxy passes a legacy agent's
// traffic through and never asks server/discover: the 2026-07-28-only
// server refuses the agent, as it would directly.
func TestBridgeOff(t *testing.T) {
	t.Parallel()
	up := startModern(t)
	_, url := startProxy(t, up.url, func(c *conf.Config) { c.EraBridge = "off" })
	cs, err := legacyClient(t, url, nil)
	if err == nil {
		_, err = cs.ListTools(context.Background(), nil)
	}
	if err == nil {
		t.Fatal("a legacy agent worked through mcpheal with era_bridge off")
	}
	if n := up.rec.calls("server/discover"); n != 0 {
		t.Fatalf("%d server/discover probes with era_bridge off, want 0", n)
	}
	if _, err := New(conf.Config{Upstream: up.url, EraBridge: "sometimes"}, nopLog()); err == nil {
		t.Fatal("era_bridge: sometimes accepted")
	}
}
