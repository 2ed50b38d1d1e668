package proxy

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/rs/zerolog"
	"github.com/tidwall/gjson"

	"github.com/mcpheal/mcpheal/proxy/internal/conf"
	"github.com/mcpheal/mcpheal/proxy/internal/peers"
)

// testLog sends the proxy's log to t.Log, so a failing test shows what the
// proxy did.
type testLog struct {
	mu sync.Mutex
	t  testing.TB
	b  strings.Builder
}

func (l *testLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.b.Write(p)
	return len(p), nil
}

func (l *testLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startProxy serves a proxy for upstream on a 127.0.0.1 port and returns it
// with the URL agents use. It shuts down in cleanup.
func startProxy(t testing.TB, upstream string, mod func(*conf.Config)) (*Server, string) {
	t.Helper()
	s, url, _ := startProxyLog(t, upstream, mod)
	return s, url
}

// startProxyLog is startProxy that also returns the proxy's log.
func startProxyLog(t testing.TB, upstream string, mod func(*conf.Config)) (*Server, string, *testLog) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg := conf.Config{Upstream: upstream, Listen: ln.Addr().String(), HealTimeout: 5 * time.Second}
	if mod != nil {
		mod(&cfg)
	}
	logs := &testLog{t: t}
	s, err := New(cfg, zerolog.New(logs).Level(zerolog.DebugLevel))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = s.Serve(ln)
	}()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		_ = s.Shutdown(ctx)
		<-done
		if n := s.Stats().UnsafeResends; n != 0 {
			t.Errorf("INVARIANT: %d requests that are not replay-safe were sent again after they may have run", n)
		}
		if t.Failed() {
			t.Logf("proxy log:\n%s", logs.String())
		}
	})
	return s, "http://" + ln.Addr().String() + "/mcp", logs
}

// TestGoSDKThroughProxy: the official Go SDK client works through the proxy
// as it does directly, and never sees an upstream session id.
func TestGoSDKThroughProxy(t *testing.T) {
	t.Parallel()
	for _, o := range []peers.GoSDKOpts{{}, {JSONResponse: true}} {
		up := peers.StartGoSDK(t, o)
		_, url := startProxy(t, up.URL(), nil)
		cs := peers.GoSDKClient(t, url)
		peers.CallEcho(t, cs, "hello")
		tools, err := cs.ListTools(context.Background(), nil)
		if err != nil || len(tools.Tools) != 4 {
			t.Fatalf("ListTools = %v, %v; want 4 tools", tools, err)
		}
		for _, r := range up.Requests() {
			if r.SessionID != "" && r.SessionID == cs.ID() {
				t.Fatalf("upstream saw the client id %q", cs.ID())
			}
		}
		if id := cs.ID(); !strings.HasPrefix(id, "m") || len(id) > 2048 || strings.ContainsFunc(id, func(r rune) bool { return r < 0x21 || r > 0x7e }) {
			t.Fatalf("client session id %q, want the proxy's sealed id (visible ASCII, under 2 KB)", id)
		}
	}
}

// TestSSEProgressStreams: a slow tool's progress notifications reach the
// agent as they happen, before the final result.
func TestSSEProgressStreams(t *testing.T) {
	t.Parallel()
	up := peers.StartGoSDK(t, peers.GoSDKOpts{})
	_, url := startProxy(t, up.URL(), nil)
	var mu sync.Mutex
	var progress []time.Time
	cs := peers.GoSDKClientWith(t, url, &mcp.ClientOptions{
		ProgressNotificationHandler: func(context.Context, *mcp.ProgressNotificationClientRequest) {
			mu.Lock()
			progress = append(progress, time.Now())
			mu.Unlock()
		},
	})
	params := &mcp.CallToolParams{Name: "slow", Arguments: map[string]any{"steps": 3, "delayMs": 150}}
	params.SetProgressToken("p-1")
	start := time.Now()
	res, err := cs.CallTool(context.Background(), params)
	end := time.Now()
	if err != nil || peers.ResultText(res) != "done" {
		t.Fatalf("slow = %v, %v", peers.ResultText(res), err)
	}
	// The go-sdk client runs progress handlers asynchronously: the last one
	// may land just after CallTool returned.
	peers.Wait(t, "3 progress notifications", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(progress) == 3
	})
	mu.Lock()
	defer mu.Unlock()
	// The first notification is sent ~150 ms in, the result ~450 ms in: it
	// must arrive long before the end, not bundled with it.
	if first := progress[0].Sub(start); first > end.Sub(start)-200*time.Millisecond {
		t.Fatalf("first progress after %v, result after %v: progress was not streamed", first, end.Sub(start))
	}
}

// TestAbandonedStreamClosesUpstream: an agent that leaves in the middle of
// a streamed answer (a long tool sending progress) and does not come back
// makes the proxy close that upstream stream at the end of resume_window
// (200 ms here), not when the tool ends; the session keeps working.
func TestAbandonedStreamClosesUpstream(t *testing.T) {
	t.Parallel()
	up := peers.StartGoSDK(t, peers.GoSDKOpts{})
	rl := peers.NewTCPRelay(t, up.Addr())
	s, url := startProxy(t, rl.URL(), func(c *conf.Config) { c.ResumeWindow = 200 * time.Millisecond })
	sid := peers.RawInitialize(t, url)
	rawEcho(t, url, sid, "warm")
	open := rl.Open()
	for round := range 3 {
		body := `{"jsonrpc":"2.0","id":"slow-` + string(rune('a'+round)) + `","method":"tools/call","params":{"name":"slow",` +
			`"arguments":{"steps":40,"delayMs":100},"_meta":{"progressToken":"p"}}}`
		resp, err := peers.RawClient.Do(peers.PostRequest(t, url, sid, body))
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 4096)
		n, err := resp.Body.Read(buf)
		if err != nil || !strings.Contains(string(buf[:n]), "notifications/progress") {
			t.Fatalf("round %d: first read %q, %v; want a progress event", round, buf[:n], err)
		}
		left := time.Now()
		_ = resp.Body.Close() // the agent goes away; the tool would run 4 s more
		peers.Wait(t, "the proxy to close the abandoned upstream stream", func() bool { return rl.Open() <= open })
		if el := time.Since(left); el > time.Second {
			t.Errorf("round %d: upstream stream closed %v after the agent left, want well under the tool's 4 s", round, el)
		}
	}
	rawEcho(t, url, sid, "after")
	noPanics(t, s)
}

// TestMCPGoThroughProxy: the mark3labs/mcp-go client works through the proxy.
func TestMCPGoThroughProxy(t *testing.T) {
	t.Parallel()
	up := peers.StartMCPGo(t, true)
	_, url := startProxy(t, up.URL(), nil)
	c := peers.McpGoClient(t, url)
	peers.McpGoCallEcho(t, c, "hi")
}

// rpcError decodes a JSON-RPC error answer.
func rpcError(t testing.TB, body []byte) (code int64, msg string, id string) {
	t.Helper()
	if !gjson.ValidBytes(body) {
		t.Fatalf("answer is not JSON: %q", body)
	}
	r := gjson.ParseBytes(body)
	return r.Get("error.code").Int(), r.Get("error.message").Str, r.Get("id").Raw
}

var _ = json.Marshal
var _ = io.EOF

func nopLog() zerolog.Logger { return zerolog.New(io.Discard) }

func zeroLog(w io.Writer) zerolog.Logger { return zerolog.New(w).Level(zerolog.DebugLevel) }
