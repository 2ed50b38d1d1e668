package peers

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Self-tests of the peers and clients, without mcpheal:
// each proves that a peer really behaves the way the heal tests rely on.

func TestPeersGoSDKEcho(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		opts GoSDKOpts
		sse  bool // tools/call answered with text/event-stream
	}{
		{"sse", GoSDKOpts{}, true},
		{"json", GoSDKOpts{JSONResponse: true}, false},
		{"stateless", GoSDKOpts{Stateless: true}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := StartGoSDK(t, tc.opts)
			cs := GoSDK2026Client(t, p.URL(), nil) // as it comes: it probes server/discover
			CallEcho(t, cs, "hello")
			CallEcho(t, cs, "again")
			// A stateless server answers the client's server/discover
			// probe, so the client speaks 2026-07-28 and never initializes.
			wantInits, wantVersion := int64(1), "2025-11-25"
			if tc.opts.Stateless {
				wantInits, wantVersion = 0, "2026-07-28"
			}
			if got := p.Inits(); got != wantInits {
				t.Errorf("Inits() = %d, want %d", got, wantInits)
			}
			if got := p.ToolCalls("echo"); got != 2 {
				t.Errorf("ToolCalls(echo) = %d, want 2", got)
			}

			// What the go-sdk 1.8 client sends: a server/discover probe
			// (2026-07-28) first, then, unless the probe succeeded, the
			// 2025-11-25 handshake.
			reqs := p.Requests()
			if len(reqs) < 3 {
				t.Fatalf("got %d requests, want at least 3", len(reqs))
			}
			first := reqs[0]
			if first.RPCMethod != "server/discover" || first.Header.Get("MCP-Protocol-Version") != "2026-07-28" || first.SessionID != "" {
				t.Errorf("first request = %s %q (MCP-Protocol-Version %q, session %q), want POST server/discover 2026-07-28 without session",
					first.HTTPMethod, first.RPCMethod, first.Header.Get("MCP-Protocol-Version"), first.SessionID)
			}
			if !tc.opts.Stateless && (reqs[1].RPCMethod != "initialize" || !bytes.Contains(reqs[1].Body, []byte(`"protocolVersion":"2025-11-25"`))) {
				t.Errorf("second request = %q %s, want initialize 2025-11-25", reqs[1].RPCMethod, reqs[1].Body)
			}
			var sid string
			for _, r := range reqs {
				if r.RPCMethod == "tools/call" {
					sid = r.SessionID
					if v := r.Header.Get("MCP-Protocol-Version"); v != wantVersion {
						t.Errorf("tools/call MCP-Protocol-Version = %q, want %s", v, wantVersion)
					}
				}
			}
			if tc.opts.Stateless != (sid == "") {
				t.Errorf("tools/call session id = %q with Stateless=%v", sid, tc.opts.Stateless)
			}

			// Raw: content type of a tools/call answer.
			if !tc.opts.Stateless {
				sid = RawInitialize(t, p.URL())
			}
			resp, body := RawPost(t, p.URL(), sid, `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"echo","arguments":{"text":"raw"}}}`)
			ct := resp.Header.Get("Content-Type")
			if resp.StatusCode != http.StatusOK || strings.HasPrefix(ct, "text/event-stream") != tc.sse || !bytes.Contains(body, []byte(`"text":"raw"`)) {
				t.Errorf("raw tools/call = %d %q %q, want 200 (sse=%v) with the echo", resp.StatusCode, ct, body, tc.sse)
			}
		})
	}
}

// TestPeersGoSDKExpire: ExpireSessions closes every go-sdk ServerSession; the
// server then answers 404 text/plain "session not found" and the go-sdk
// client's next call fails.
func TestPeersGoSDKExpire(t *testing.T) {
	t.Parallel()
	p := StartGoSDK(t, GoSDKOpts{})
	cs := GoSDKClient(t, p.URL())
	CallEcho(t, cs, "before")
	sid := RawInitialize(t, p.URL())

	p.ExpireSessions()

	if _, err := GoSDKCall(t, cs, "echo", map[string]any{"text": "after"}); err == nil {
		t.Fatal("echo after ExpireSessions succeeded, want an error")
	} else {
		t.Logf("go-sdk client after expiry: %v (ErrSessionMissing=%v)", err, errors.Is(err, mcp.ErrSessionMissing))
	}
	resp, body := RawPost(t, p.URL(), sid, `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo","arguments":{"text":"x"}}}`)
	if resp.StatusCode != http.StatusNotFound || string(body) != "session not found\n" ||
		!strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain") {
		t.Errorf("expired id: %d %q %q, want 404 text/plain %q", resp.StatusCode, resp.Header.Get("Content-Type"), body, "session not found\n")
	}
	// The server itself is fine: a new client works.
	CallEcho(t, GoSDKClient(t, p.URL()), "new")
	if got := p.Inits(); got != 3 {
		t.Errorf("Inits() = %d, want 3", got)
	}
}

func TestPeersGoSDKSessionTimeout(t *testing.T) {
	t.Parallel()
	const idle = 50 * time.Millisecond
	p := StartGoSDK(t, GoSDKOpts{SessionTimeout: idle})
	sid := RawInitialize(t, p.URL())
	// Every request restarts the idle timer, so poll slower than it.
	deadline := time.Now().Add(Timeout)
	for {
		time.Sleep(2 * idle)
		resp, body := RawPost(t, p.URL(), sid, `{"jsonrpc":"2.0","id":3,"method":"ping"}`)
		if resp.StatusCode == http.StatusNotFound {
			if string(body) != "session not found\n" {
				t.Errorf("idle-expired id: 404 %q, want %q", body, "session not found\n")
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("session still alive after %v idle: %d %q", Timeout, resp.StatusCode, body)
		}
	}
}

// TestPeersGoSDKForeignHost: a loopback go-sdk server refuses a non-loopback
// Host (DNS-rebinding protection), so the proxy must send the upstream's host.
func TestPeersGoSDKForeignHost(t *testing.T) {
	t.Parallel()
	p := StartGoSDK(t, GoSDKOpts{})
	for _, tc := range []struct {
		host string
		want int
	}{
		{"example.com", http.StatusForbidden},
		{"proxy.internal:8080", http.StatusForbidden},
		{"localhost:1", http.StatusOK},
		{p.Addr(), http.StatusOK},
	} {
		req, _ := http.NewRequest(http.MethodPost, p.URL(), strings.NewReader(
			`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"h","version":"1"}}}`))
		req.Host = tc.host
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		resp, body := RawDo(t, req)
		if resp.StatusCode != tc.want {
			t.Errorf("Host %q: %d %q, want %d", tc.host, resp.StatusCode, body, tc.want)
		}
	}
}

func TestPeersGoSDKRestart(t *testing.T) {
	t.Parallel()
	p := StartGoSDK(t, GoSDKOpts{})
	url := p.URL()
	old := GoSDKClient(t, url)
	CallEcho(t, old, "before")

	for i := range 3 {
		p.Restart()
		if p.URL() != url {
			t.Fatalf("restart %d moved the peer: %s, want %s", i, p.URL(), url)
		}
		CallEcho(t, GoSDKClient(t, url), "fresh")
	}
	if _, err := GoSDKCall(t, old, "echo", map[string]any{"text": "stale"}); err == nil {
		t.Error("old client call after Restart succeeded, want an error")
	}
	if got := p.Inits(); got != 4 {
		t.Errorf("Inits() = %d, want 4", got)
	}
}

func TestPeersGoSDKStopStart(t *testing.T) {
	t.Parallel()
	p := StartGoSDK(t, GoSDKOpts{})
	cs := GoSDKClient(t, p.URL())
	p.Stop()
	if _, err := GoSDKCall(t, cs, "echo", map[string]any{"text": "down"}); err == nil {
		t.Error("call to a stopped peer succeeded")
	}
	if _, err := RawClient.Get(p.URL()); err == nil || !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("GET on a stopped peer: %v, want connection refused", err)
	}
	p.Start()
	CallEcho(t, GoSDKClient(t, p.URL()), "up")
}

// TestPeersGoSDKSlowProgress: slow delivers every progress notification on
// the call's stream before the result.
func TestPeersGoSDKSlowProgress(t *testing.T) {
	t.Parallel()
	p := StartGoSDK(t, GoSDKOpts{})
	var (
		mu   sync.Mutex
		seen []float64
	)
	cs := GoSDKClientWith(t, p.URL(), &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
			mu.Lock()
			seen = append(seen, req.Params.Progress)
			mu.Unlock()
		},
	})
	const steps = 4
	params := &mcp.CallToolParams{Name: "slow", Arguments: map[string]any{"steps": steps, "delayMs": 10}}
	params.SetProgressToken("tok-1")
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	start := time.Now()
	res, err := cs.CallTool(ctx, params)
	if err != nil {
		t.Fatalf("slow: %v", err)
	}
	if got := ResultText(res); got != "done" {
		t.Fatalf("slow = %q, want done", got)
	}
	if d := time.Since(start); d < steps*10*time.Millisecond {
		t.Errorf("slow returned after %v, want at least %v", d, steps*10*time.Millisecond)
	}
	// The client hands notifications to the handler asynchronously, so
	// the last ones may land just after CallTool returns.
	Wait(t, "all progress notifications", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(seen) >= steps
	})
	mu.Lock()
	if len(seen) != steps {
		t.Errorf("progress = %v, want %d notifications", seen, steps)
	}
	for i, v := range seen {
		if v != float64(i+1) {
			t.Errorf("progress[%d] = %v, want %d", i, v, i+1)
		}
	}
	mu.Unlock()

	// On the wire the notifications precede the result in the call's
	// SSE answer.
	sid := RawInitialize(t, p.URL())
	resp, body := RawPost(t, p.URL(), sid,
		`{"jsonrpc":"2.0","id":11,"method":"tools/call","params":{"_meta":{"progressToken":"raw"},"name":"slow","arguments":{"steps":3,"delayMs":1}}}`)
	var kinds []string
	for _, ev := range strings.Split(string(body), "\n\n") {
		for _, line := range strings.Split(ev, "\n") {
			data, ok := strings.CutPrefix(line, "data: ")
			switch {
			case !ok:
			case strings.Contains(data, `"method":"notifications/progress"`):
				kinds = append(kinds, "progress")
			case strings.Contains(data, `"id":11`):
				kinds = append(kinds, "result")
			default:
				kinds = append(kinds, data)
			}
		}
	}
	if resp.Header.Get("Content-Type") != "text/event-stream" || strings.Join(kinds, ",") != "progress,progress,progress,result" {
		t.Errorf("raw slow answer (%s) = %v, want 3 progress events then the result:\n%s", resp.Header.Get("Content-Type"), kinds, body)
	}
}

// TestPeersGoSDKSlowStops: Restart cancels a running slow tool, so neither the
// restart nor cleanup waits for it.
func TestPeersGoSDKSlowStops(t *testing.T) {
	t.Parallel()
	p := StartGoSDK(t, GoSDKOpts{})
	cs := GoSDKClient(t, p.URL())
	errc := make(chan error, 1)
	go func() {
		_, err := GoSDKCall(t, cs, "slow", map[string]any{"steps": 1, "delayMs": 60_000})
		errc <- err
	}()
	Wait(t, "slow to start", func() bool { return p.ToolCalls("slow") == 1 })
	start := time.Now()
	p.Restart()
	if err := <-errc; err == nil {
		t.Error("slow call across a Restart succeeded")
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("Restart with a running slow tool took %v", d)
	}
}

// TestPeersGoSDKCounterKill: with KillOnCounter the tool runs, the connection
// dies before the answer, the client sees an error, and the server comes back
// on the same port without the old sessions.
func TestPeersGoSDKCounterKill(t *testing.T) {
	t.Parallel()
	for _, tool := range []string{"counter", "ro_counter"} {
		t.Run(tool, func(t *testing.T) {
			t.Parallel()
			p := StartGoSDK(t, GoSDKOpts{})
			cs := GoSDKClient(t, p.URL())
			p.KillOnCounter.Store(true)
			res, err := GoSDKCall(t, cs, tool, map[string]any{})
			if err == nil {
				t.Fatalf("%s with kill = %q, want an error", tool, ResultText(res))
			}
			t.Logf("go-sdk client on a killed connection: %v", err)
			if got := p.Counter(); got != 1 {
				t.Errorf("Counter() = %d, want 1", got)
			}
			if got := p.Crashes(); got != 1 {
				t.Errorf("Crashes() = %d, want 1", got)
			}
			if p.KillOnCounter.Load() {
				t.Error("KillOnCounter still set after the crash")
			}
			if _, err := GoSDKCall(t, cs, "echo", map[string]any{"text": "stale"}); err == nil {
				t.Error("old session survived the crash")
			}
			cs2 := GoSDKClient(t, p.URL())
			res, err = GoSDKCall(t, cs2, tool, map[string]any{})
			if err != nil || ResultText(res) != "2" {
				t.Errorf("%s after crash = %q, %v; want \"2\"", tool, ResultText(res), err)
			}
			if got := p.ToolCalls(tool); got != 2 {
				t.Errorf("ToolCalls(%s) = %d, want 2", tool, got)
			}
		})
	}
}

// TestPeersGoSDKToolAnnotations: counter has no annotations, ro_counter is
// read-only, as the proxy's replay rule sees them in tools/list.
func TestPeersGoSDKToolAnnotations(t *testing.T) {
	t.Parallel()
	p := StartGoSDK(t, GoSDKOpts{})
	cs := GoSDKClient(t, p.URL())
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	defer cancel()
	res, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]*mcp.ToolAnnotations{}
	for _, tl := range res.Tools {
		got[tl.Name] = tl.Annotations
	}
	for _, name := range []string{"echo", "slow", "counter", "ro_counter"} {
		if _, ok := got[name]; !ok {
			t.Errorf("tools/list lacks %s", name)
		}
	}
	if got["counter"] != nil {
		t.Errorf("counter annotations = %+v, want none", got["counter"])
	}
	if a := got["ro_counter"]; a == nil || !a.ReadOnlyHint {
		t.Errorf("ro_counter annotations = %+v, want readOnlyHint", a)
	}
}

func TestPeersMCPGo(t *testing.T) {
	t.Parallel()
	t.Run("stateful", func(t *testing.T) {
		t.Parallel()
		p := StartMCPGo(t, true)
		c := McpGoClient(t, p.URL())
		McpGoCallEcho(t, c, "hello")
		if c.GetSessionId() == "" || !strings.HasPrefix(c.GetSessionId(), "mcp-session-") {
			t.Errorf("session id = %q, want mcp-session-<uuid>", c.GetSessionId())
		}
		if p.Inits() != 1 || p.Calls("server/discover") != 1 {
			t.Errorf("Inits() = %d, server/discover = %d; want 1 and 1", p.Inits(), p.Calls("server/discover"))
		}
		sid := RawInitialize(t, p.URL())

		p.ExpireSessions()

		if _, err := mcpGoCall(t, c, "echo", map[string]any{"text": "after"}); err == nil {
			t.Error("mcp-go echo after ExpireSessions succeeded")
		} else {
			t.Logf("mcp-go client after expiry: %v", err)
		}
		resp, body := RawPost(t, p.URL(), sid, `{"jsonrpc":"2.0","id":2,"method":"ping"}`)
		if resp.StatusCode != http.StatusNotFound || string(body) != "Invalid session ID\n" {
			t.Errorf("expired id: %d %q, want 404 %q", resp.StatusCode, body, "Invalid session ID\n")
		}
		McpGoCallEcho(t, McpGoClient(t, p.URL()), "new")

		p.Restart()
		McpGoCallEcho(t, McpGoClient(t, p.URL()), "restarted")
	})
	t.Run("default", func(t *testing.T) {
		t.Parallel()
		p := StartMCPGo(t, false)
		c := McpGoClient(t, p.URL())
		McpGoCallEcho(t, c, "hello")
		// The default server advertises 2026-07-28: the client goes
		// sessionless and never sends initialize.
		if p.Inits() != 0 || c.GetSessionId() != "" {
			t.Errorf("Inits() = %d, session %q; want 0 and none", p.Inits(), c.GetSessionId())
		}
		// Format-only ids: an id it never issued is accepted.
		resp, body := RawPost(t, p.URL(), "mcp-session-6f1c3d1e-8f55-4a7c-9d0e-0123456789ab", `{"jsonrpc":"2.0","id":2,"method":"ping"}`)
		if resp.StatusCode != http.StatusOK {
			t.Errorf("unknown well-formed id: %d %q, want 200", resp.StatusCode, body)
		}
	})
	t.Run("go-sdk client", func(t *testing.T) {
		t.Parallel()
		p := StartMCPGo(t, true)
		cs := GoSDKClient(t, p.URL())
		CallEcho(t, cs, "cross")
		if p.Inits() != 1 {
			t.Errorf("Inits() = %d, want 1 (legacy handshake)", p.Inits())
		}
		p.ExpireSessions()
		if _, err := GoSDKCall(t, cs, "echo", map[string]any{"text": "after"}); err == nil {
			t.Error("go-sdk echo on mcp-go after ExpireSessions succeeded")
		}
	})
}

func TestPeersDialect(t *testing.T) {
	t.Parallel()
	for _, d := range []Dialect{DialectTS400, DialectWP200, DialectSSE200} {
		t.Run(d.String(), func(t *testing.T) {
			t.Parallel()
			p := StartDialect(t, d)
			cs := GoSDKClient(t, p.URL())
			CallEcho(t, cs, "hello")
			if p.Inits() != 1 || p.ToolCalls("echo") != 1 {
				t.Errorf("Inits() = %d, ToolCalls(echo) = %d; want 1 and 1", p.Inits(), p.ToolCalls("echo"))
			}
			sid := RawInitialize(t, p.URL())
			resp, body := RawPost(t, p.URL(), sid, `{"jsonrpc":"2.0","id":5,"method":"ping"}`)
			if resp.StatusCode != http.StatusOK || !bytes.Contains(body, []byte(`"id":5,"result":{}`)) {
				t.Errorf("ping: %d %q", resp.StatusCode, body)
			}

			p.ExpireSessions()

			for _, tc := range []struct {
				body string
				id   string
			}{
				{`{"jsonrpc":"2.0","id":42,"method":"tools/call","params":{"name":"echo","arguments":{"text":"x"}}}`, `42`},
				{`{"jsonrpc":"2.0","id":"req-7","method":"tools/list"}`, `"req-7"`},
				{`{"jsonrpc":"2.0","method":"notifications/initialized"}`, ``},
			} {
				resp, body := RawPost(t, p.URL(), sid, tc.body)
				st, ct, want := dialectExpired(d, []byte(tc.id))
				if resp.StatusCode != st || resp.Header.Get("Content-Type") != ct || !bytes.Equal(body, want) {
					t.Errorf("%s expired:\n got %d %q %q\nwant %d %q %q", tc.body, resp.StatusCode, resp.Header.Get("Content-Type"), body, st, ct, want)
				}
			}
			if _, err := GoSDKCall(t, cs, "echo", map[string]any{"text": "after"}); err == nil {
				t.Error("go-sdk echo after ExpireSessions succeeded")
			} else {
				t.Logf("go-sdk client on expired %s: %v", d, err)
			}
			// Every request carries the id it was sent with.
			var last Request
			for _, r := range p.Requests() {
				if r.RPCMethod == "tools/call" {
					last = r
				}
			}
			if last.SessionID == "" || last.HTTPMethod != http.MethodPost || len(last.Body) == 0 {
				t.Errorf("last recorded tools/call = %+v", last)
			}
			CallEcho(t, GoSDKClient(t, p.URL()), "new")
		})
	}
}

// TestPeersDialectMissingID: a non-initialize POST without a session id gets a
// 400 JSON-RPC error (what makes the go-sdk discover probe fall back).
func TestPeersDialectMissingID(t *testing.T) {
	t.Parallel()
	for _, d := range []Dialect{DialectTS400, DialectWP200, DialectSSE200} {
		p := StartDialect(t, d)
		resp, body := RawPost(t, p.URL(), "", `{"jsonrpc":"2.0","id":9,"method":"tools/list"}`)
		st, ct, want := dialectMissing(d, []byte(`9`))
		if resp.StatusCode != st || resp.Header.Get("Content-Type") != ct || !bytes.Equal(body, want) {
			t.Errorf("%s: got %d %q %q, want %d %q %q", d, resp.StatusCode, resp.Header.Get("Content-Type"), body, st, ct, want)
		}
	}
}
