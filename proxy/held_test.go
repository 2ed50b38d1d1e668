package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/tidwall/gjson"

	"github.com/mcpheal/mcpheal/proxy/internal/conf"
	"github.com/mcpheal/mcpheal/proxy/internal/era"
	"github.com/mcpheal/mcpheal/proxy/internal/peers"
	"github.com/mcpheal/mcpheal/proxy/internal/route/held"
	"github.com/mcpheal/mcpheal/proxy/internal/wire"
	"github.com/mcpheal/mcpheal/session"
)

// The held route: an official Go SDK client speaking MCP 2026-07-28 (no
// initialize, no session) in front of an official Go SDK server of the
// session era only, through mcpheal, which holds the upstream session for
// it.

// heldClientOpts are the handlers of a 2026-07-28 client that answers the
// server's sampling requests and counts what it receives.
type heldCounts struct {
	progress, logs, updates atomic.Int64
}

func heldClientOpts(n *heldCounts) *mcp.ClientOptions {
	return &mcp.ClientOptions{
		ProgressNotificationHandler: func(context.Context, *mcp.ProgressNotificationClientRequest) { n.progress.Add(1) },
		LoggingMessageHandler:       func(context.Context, *mcp.LoggingMessageRequest) { n.logs.Add(1) },
		ResourceUpdatedHandler: func(context.Context, *mcp.ResourceUpdatedNotificationRequest) {
			n.updates.Add(1)
		},
		CreateMessageHandler: func(_ context.Context, req *mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error) {
			text := ""
			if tc, ok := req.Params.Messages[0].Content.(*mcp.TextContent); ok {
				text = tc.Text
			}
			return &mcp.CreateMessageResult{Model: "m", Role: "assistant", Content: &mcp.TextContent{Text: "<" + text + ">"}}, nil
		},
	}
}

// TestHeldDirectFails: a Go SDK client pinned to 2026-07-28 cannot use a
// server of the session era directly; it falls back to a session, which
// is what the held route spares it.
func TestHeldDirectFails(t *testing.T) {
	t.Parallel()
	up := peers.StartGoSDK(t, peers.GoSDKOpts{})
	cs := peers.GoSDK2026Client(t, up.URL(), nil)
	if v := cs.InitializeResult().ProtocolVersion; v == wire.StatelessVersion {
		t.Fatalf("directly, the session-era server spoke %s: this test proves nothing", v)
	}
	if up.Inits() != 1 {
		t.Fatalf("directly, %d initialize; want the client's fallback to the session era", up.Inits())
	}
}

// TestHeldGoSDK: through mcpheal the client speaks 2026-07-28: it lists and
// calls tools, gets progress and the log messages of the level its request
// asks for, answers a sampling request the server makes on the call's
// stream (as an InputRequiredResult and its retry), gets a resource update
// through subscriptions/listen, and cancels a call, whose handler upstream
// then ends. It goes on across an expiry of the upstream session and a
// restart of the server, which mcpheal heals; it never initializes.
func TestHeldGoSDK(t *testing.T) {
	t.Parallel()
	up := peers.StartGoSDK(t, peers.GoSDKOpts{State: true})
	s, url := startProxy(t, up.URL(), nil)
	var n heldCounts
	cs := peers.GoSDK2026Client(t, url, heldClientOpts(&n))
	if v := cs.InitializeResult().ProtocolVersion; v != wire.StatelessVersion {
		t.Fatalf("through mcpheal the client speaks %q; want %s", v, wire.StatelessVersion)
	}
	if si := cs.InitializeResult().ServerInfo; si == nil || si.Name != "peer-go-sdk" {
		t.Fatalf("server/discover's serverInfo %+v; want the upstream's", si)
	}
	ctx, cancel := context.WithTimeout(context.Background(), peers.Timeout)
	defer cancel()
	tools, err := cs.ListTools(ctx, nil)
	if err != nil || len(tools.Tools) != 8 {
		t.Fatalf("tools/list: %v, %v", tools, err)
	}
	peers.CallEcho(t, cs, "held")

	// Progress, on the call's own stream.
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "slow", Arguments: map[string]any{"steps": 3, "delayMs": 0},
		Meta: mcp.Meta{"progressToken": "p1"}})
	if err != nil || peers.ResultText(res) != "done" {
		t.Fatalf("slow: %v, %v", peers.ResultText(res), err)
	}
	peers.Wait(t, "3 progress notifications", func() bool { return n.progress.Load() == 3 })

	// Log messages at the level the request asks for, none without one.
	for _, tc := range []struct {
		meta mcp.Meta
		want int64
	}{{nil, 0}, {mcp.Meta{"io.modelcontextprotocol/logLevel": "warning"}, 0},
		{mcp.Meta{"io.modelcontextprotocol/logLevel": "info"}, 1}} {
		before := n.logs.Load()
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "log", Arguments: map[string]any{"level": "info", "text": "x"}, Meta: tc.meta})
		if err != nil || peers.ResultText(res) != "logged" {
			t.Fatalf("log: %v, %v", peers.ResultText(res), err)
		}
		time.Sleep(50 * time.Millisecond)
		if got := n.logs.Load() - before; got != tc.want {
			t.Errorf("log at info with _meta %v: %d messages; want %d", tc.meta, got, tc.want)
		}
	}

	// Sampling: the server asks on the call's stream, the agent answers
	// through an InputRequiredResult.
	res, err = peers.GoSDKCall(t, cs, "sample", map[string]any{"prompt": "hi"})
	if err != nil || peers.ResultText(res) != "<hi>" {
		t.Fatalf("sample: %q, %v", peers.ResultText(res), err)
	}
	if up.ToolCalls("sample") != 1 {
		t.Errorf("the sample tool ran %d times; want 1 (the retry resumes it)", up.ToolCalls("sample"))
	}

	// A resource update through subscriptions/listen.
	if err := cs.Subscribe(ctx, &mcp.SubscribeParams{URI: peers.ResourceURI}); err != nil {
		t.Fatalf("subscribe: %v", err)
	}
	nudge(t, "resources/updated through subscriptions/listen", func() { up.UpdateResource(peers.ResourceURI) },
		func() bool { return n.updates.Load() > 0 })

	// The upstream session expires, then the server restarts: the client
	// notices nothing.
	up.ExpireSessions()
	peers.CallEcho(t, cs, "after expiry")
	up.Restart()
	peers.CallEcho(t, cs, "after restart")
	res, err = peers.GoSDKCall(t, cs, "sample", map[string]any{"prompt": "again"})
	if err != nil || peers.ResultText(res) != "<again>" {
		t.Fatalf("sample after the restart: %q, %v", peers.ResultText(res), err)
	}
	before := n.updates.Load()
	nudge(t, "resources/updated after the restart", func() { up.UpdateResource(peers.ResourceURI) },
		func() bool { return n.updates.Load() > before })

	// Cancelling a call: the agent's connection closes; mcpheal tells the
	// upstream, whose handler ends.
	cctx, ccancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := cs.CallTool(cctx, &mcp.CallToolParams{Name: "slow", Arguments: map[string]any{"steps": 1, "delayMs": 20000}})
		done <- err
	}()
	peers.Wait(t, "the slow call to reach the server", func() bool { return up.ToolCalls("slow") == 2 })
	ccancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled call: %v; want context.Canceled", err)
	}
	peers.Wait(t, "notifications/cancelled upstream", func() bool { return up.Calls("notifications/cancelled") >= 1 })

	if up.Calls("initialize") < 2 || s.Stats().Sessions != 1 {
		t.Errorf("%d upstream initializes, %d sessions held; want ≥ 2 (one per heal) and 1", up.Calls("initialize"), s.Stats().Sessions)
	}
	for _, r := range up.Requests() {
		if r.RPCMethod == "server/discover" {
			continue // mcpheal's probe of the upstream's era
		}
		if r.HTTPMethod == http.MethodPost && r.RPCMethod != "initialize" && r.SessionID == "" {
			t.Errorf("upstream %s without a session id", r.RPCMethod)
		}
		if strings.Contains(string(r.Body), "io.modelcontextprotocol/") {
			t.Errorf("upstream %s carried the 2026-07-28 _meta: %s", r.RPCMethod, r.Body)
			break
		}
	}
}

// TestHeldNeverRunsTwice: the held route replays by the one rule. A tool
// that is not replay-safe, whose server dies after running it, is not run
// again (-32011 in an HTTP 200: a 2026-07-28 agent reads no other status's
// body); a read-only one is, and the agent gets its answer.
func TestHeldNeverRunsTwice(t *testing.T) {
	t.Parallel()
	up := peers.StartGoSDK(t, peers.GoSDKOpts{})
	_, url := startProxy(t, up.URL(), nil)
	cs := peers.GoSDK2026Client(t, url, nil)
	ctx, cancel := context.WithTimeout(context.Background(), peers.Timeout)
	defer cancel()
	if _, err := cs.ListTools(ctx, nil); err != nil { // the annotations, learned
		t.Fatal(err)
	}
	up.KillOnCounter.Store(true)
	_, err := peers.GoSDKCall(t, cs, "counter", nil)
	if err == nil || !strings.Contains(err.Error(), "may or may not have run") {
		t.Fatalf("counter across a crash: %v; want -32011", err)
	}
	if got := up.Counter(); got != 1 {
		t.Fatalf("INVARIANT: the counter tool ran %d times; want 1", got)
	}
	peers.CallEcho(t, cs, "heals the session the crash took")
	up.KillOnCounter.Store(true)
	res, err := peers.GoSDKCall(t, cs, "ro_counter", nil)
	if err != nil || peers.ResultText(res) != "3" {
		t.Fatalf("ro_counter across a crash: %q, %v; want the replay's 3", peers.ResultText(res), err)
	}
}

// TestHeldSessionsPerClient: agents of one credential and client share a
// held session; another client (its clientInfo) or another credential gets
// its own.
func TestHeldSessionsPerClient(t *testing.T) {
	t.Parallel()
	up := peers.StartGoSDK(t, peers.GoSDKOpts{})
	s, url := startProxy(t, up.URL(), nil)
	a := peers.GoSDK2026Client(t, url, nil)
	b := peers.GoSDK2026Client(t, url, nil)
	peers.CallEcho(t, a, "a")
	peers.CallEcho(t, b, "b")
	if n := s.Stats().Sessions; n != 1 {
		t.Errorf("two agents of one client: %d held sessions; want 1", n)
	}
	other := mcp.NewClient(&mcp.Implementation{Name: "another-agent", Version: "2"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), peers.Timeout)
	defer cancel()
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	cs, err := other.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: &http.Client{Transport: tr}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	peers.CallEcho(t, cs, "c")
	if n := s.Stats().Sessions; n != 2 {
		t.Errorf("another client: %d held sessions; want 2", n)
	}
}

// heldPost sends one raw 2026-07-28 request under auth and returns the
// status and the JSON-RPC message that answers it (the last event of an
// event stream).
func heldPost(t *testing.T, url, auth, method, params string, id int) (int, gjson.Result) {
	t.Helper()
	return heldPostCaps(t, url, auth, `{"sampling":{}}`, method, params, id)
}

// heldPostCaps is heldPost from an agent of the client capabilities caps.
func heldPostCaps(t *testing.T, url, auth, caps, method, params string, id int) (int, gjson.Result) {
	t.Helper()
	body := `{"jsonrpc":"2.0","id":` + strconv.Itoa(id) + `,"method":"` + method + `","params":{` + params +
		`"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientInfo":{"name":"raw","version":"1"},` +
		`"io.modelcontextprotocol/clientCapabilities":` + caps + `}}}`
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("MCP-Protocol-Version", "2026-07-28")
	req.Header.Set("Mcp-Method", method)
	if name := gjson.Get(body, "params.name"); name.Exists() {
		req.Header.Set("Mcp-Name", name.Str) // as 2026-07-28 clients send it (SEP-2243)
	}
	req.Header.Set("Authorization", "Bearer "+auth)
	resp, err := peers.RawClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	msg := b
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		msg = nil
		for _, line := range strings.Split(string(b), "\n") {
			if d, ok := strings.CutPrefix(line, "data: "); ok {
				msg = []byte(d)
			}
		}
	}
	return resp.StatusCode, gjson.ParseBytes(msg)
}

// FuzzHeldTranslate: whatever a 2026-07-28 agent sends and whatever a
// session-era upstream answers, the held route's translations of a JSON
// object are JSON objects again, and they keep what they must: the
// request's method and the upstream's id, the agent's id and a resultType
// on a result.
func FuzzHeldTranslate(f *testing.F) {
	f.Add([]byte(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","_meta":{"io.modelcontextprotocol/clientInfo":{},"progressToken":1},"inputResponses":{},"requestState":"s"}}`))
	f.Add([]byte(`{"jsonrpc":"2.0","id":"a","result":{}}`))
	f.Add([]byte(`{"result":{"content":[]},"jsonrpc":"2.0","id":7}`))
	f.Add([]byte(`{"jsonrpc":"2.0","method":"notifications/resources/updated","params":{"uri":"u"}}`))
	f.Add([]byte(`{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		if !gjson.ValidBytes(b) || !gjson.ParseBytes(b).IsObject() || !jsonDepthOK(b, 64) {
			return
		}
		in := gjson.ParseBytes(b)
		down := held.Downgrade(b, `"mcpheal-call-1"`)
		if !gjson.ValidBytes(down) {
			t.Fatalf("downgrade(%s) = %s: not JSON", b, down)
		}
		if d := gjson.ParseBytes(down); d.Get("method").Raw != in.Get("method").Raw && in.Get("method").Exists() {
			t.Fatalf("downgrade(%s) changed the method: %s", b, down)
		}
		up := held.ModernMessage(b, "42", true)
		if !gjson.ValidBytes(up) {
			t.Fatalf("modernMessage(%s) = %s: not JSON", b, up)
		}
		if m := gjson.ParseBytes(up); in.Get("id").Exists() && in.Get("id").Index > 0 && m.Get("id").Raw != "42" {
			t.Fatalf("modernMessage(%s) = %s: not the agent's id", b, up)
		}
		if in.Get("method").Exists() {
			if w := held.WithSubscription(b, `"listen:0"`); !gjson.ValidBytes(w) {
				t.Fatalf("withSubscription(%s) = %s: not JSON", b, w)
			}
		}
	})
}

// TestHeldSessionReleasedWhileInUse: a held session leaves the store (the
// idle sweep removes it; its release runs a moment later) and a request
// of its key comes in between, creating the next one. The release still
// gives back what the old one held: its initialize answer's share of the
// memory budget, and its place in held.infos.
func TestHeldSessionReleasedWhileInUse(t *testing.T) {
	up := peers.StartGoSDK(t, peers.GoSDKOpts{})
	s, url := startProxy(t, up.URL(), nil)
	base := s.mem.Used.Load()
	if st, _ := heldPost(t, url, "alice", "tools/list", "", 1); st != http.StatusOK {
		t.Fatalf("first request: %d", st)
	}
	old := s.sessions.Store.Sessions()[0]
	s.sessions.Store.Remove(old.ID) // as the sweep does: removed; its release comes after
	if st, _ := heldPost(t, url, "alice", "tools/list", "", 2); st != http.StatusOK {
		t.Fatalf("request after the removal: %d", st)
	}
	if n := up.Inits(); n != 2 {
		t.Fatalf("%d upstream initializes, want 2: the next request held a new session", n)
	}
	s.sessions.Dropped(old) // the release
	if _, ok := s.held.Infos.Load(old); ok {
		t.Errorf("held.infos still holds the released session")
	}
	next := s.sessions.Store.Sessions()[0]
	if _, ok := s.held.Infos.Load(next); !ok {
		t.Errorf("held.infos lost the live session")
	}
	s.sessions.End(next, false)
	if got := s.mem.Used.Load(); got != base {
		t.Errorf("memory budget used %d after both sessions left, want %d", got, base)
	}
}

// TestHeldLearnsTools: a 2026-07-28 client (Go SDK) through the held route
// calls tools it never listed. mcpheal lists the held session's tools
// itself, so a read-only tool whose exchange breaks after it was sent
// (a relay resets the connection as the request goes upstream) is sent
// again and runs once, while a tool without annotations gets -32011 and
// never runs twice. A restart with the same tools brings the client no
// tools/list_changed; one with another tool brings it exactly one.
func TestHeldLearnsTools(t *testing.T) {
	t.Parallel()
	up := peers.StartGoSDK(t, peers.GoSDKOpts{})
	relay := peers.NewTCPRelay(t, up.Addr())
	s, url, logs := startProxyLog(t, relay.URL(), nil)
	var changed atomic.Int64
	cs := peers.GoSDK2026Client(t, url, &mcp.ClientOptions{
		ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) { changed.Add(1) },
	})
	var held []*session.Session
	peers.Wait(t, "mcpheal to learn the held session's tools", func() bool {
		held = s.sessions.Store.Sessions()
		return len(held) == 1 && held[0].Replayable("ro_counter")
	})
	if held[0].Replayable("counter") {
		t.Fatal("a tool without annotations was learnt replay-safe")
	}

	relay.CutRequest(`"name":"ro_counter"`)
	res, err := peers.GoSDKCall(t, cs, "ro_counter", map[string]any{})
	if err != nil || peers.ResultText(res) != "1" || relay.Cuts() != 1 {
		t.Fatalf("ro_counter cut on its way upstream: %v, %s, %d cuts; want it sent again and run once", err, peers.ResultText(res), relay.Cuts())
	}
	relay.CutRequest(`"name":"counter"`)
	res, err = peers.GoSDKCall(t, cs, "counter", map[string]any{})
	if err == nil && !res.IsError || relay.Cuts() != 2 {
		t.Fatalf("counter cut on its way upstream: %v, %s, %d cuts; want -32011", err, peers.ResultText(res), relay.Cuts())
	}
	if n := up.Counter(); n != 1 {
		t.Errorf("the server's counter is %d; want 1 (ro_counter once, counter never)", n)
	}

	// The agent lists tools now: the list mcpheal records from the answer
	// it translated is the one it compares after a heal.
	ctx, cancel := context.WithTimeout(context.Background(), peers.Timeout)
	defer cancel()
	if _, err := cs.ListTools(ctx, nil); err != nil {
		t.Fatal(err)
	}
	// Each of mcpheal's own tools/list ends with one log line: whether it
	// told the agent the list changed, or not.
	count := func(what string) int { return strings.Count(logs.String(), what) }
	const notified, learnt = `"message":"tool list changed across the heal; agent notified"`, `"message":"tool list learnt"`
	for i, extra := range [][]string{nil, {"extra"}} {
		up.SetNextTools(extra, nil)
		up.Restart()
		// A read-only call heals the session (a call that is not could
		// meet the dead connection and get -32011).
		if res, err := peers.GoSDKCall(t, cs, "ro_counter", map[string]any{}); err != nil || peers.ResultText(res) != strconv.Itoa(2+i) {
			t.Fatalf("ro_counter after restart %d: %v, %s", i+1, err, peers.ResultText(res))
		}
		// One tools/list when the session was held, one after each heal
		// (and one more for any list_changed the server sends itself).
		peers.Wait(t, "mcpheal's tools/list after the heal", func() bool { return count(notified)+count(learnt) >= 2+i })
		if n := count(notified); n > i {
			t.Fatalf("after restart %d (the list changed: %v) mcpheal told the agent %d times; want at most %d", i+1, extra != nil, n, i)
		}
	}
	peers.Wait(t, "the client to be told the list changed", func() bool { return changed.Load() >= 1 })
	if n := changed.Load(); n != 1 {
		t.Errorf("the client was told %d times that the list changed; want once", n)
	}
	noPanics(t, s)
}

// stepUpServer is the conformance suite's auth/scope-step-up server as
// mcpheal meets it: stateless (no Mcp-Session-Id), POST only (a GET gets
// Express's 404), initialize and notifications open to all, every other
// request needing a bearer token: none gets 401 asking for mcp:basic, the
// token "basic" gets 403 insufficient_scope asking for mcp:write, the token
// "full" an answer (an empty tool list; server/discover: method not found,
// as a session-era server says).
type stepUpServer struct {
	url          string
	inits, gets  atomic.Int64
	getSeen      chan struct{} // one value per GET
	challengeFor string        // the resource_metadata it names
}

func startStepUpServer(t *testing.T) *stepUpServer {
	t.Helper()
	s := &stepUpServer{getSeen: make(chan struct{}, 64)}
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			s.gets.Add(1)
			s.getSeen <- struct{}{}
			http.Error(w, "Cannot GET /mcp", http.StatusNotFound)
			return
		}
		body, _ := io.ReadAll(r.Body)
		m := gjson.ParseBytes(body)
		switch method := m.Get("method").Str; {
		case method == "initialize":
			s.inits.Add(1)
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"jsonrpc":"2.0","id":`+m.Get("id").Raw+`,"result":{"protocolVersion":"2025-11-25",`+
				`"capabilities":{"tools":{}},"serverInfo":{"name":"step-up","version":"1"}}}`)
		case strings.HasPrefix(method, "notifications/"):
			w.WriteHeader(http.StatusAccepted)
		case r.Header.Get("Authorization") == "Bearer full":
			w.Header().Set("Content-Type", "application/json")
			if method == "server/discover" {
				_, _ = io.WriteString(w, `{"jsonrpc":"2.0","id":`+m.Get("id").Raw+`,"error":{"code":-32601,"message":"Method not found"}}`)
				return
			}
			_, _ = io.WriteString(w, `{"jsonrpc":"2.0","id":`+m.Get("id").Raw+`,"result":{"tools":[]}}`)
		case r.Header.Get("Authorization") == "":
			w.Header().Set("WWW-Authenticate", `Bearer scope="mcp:basic", resource_metadata="`+s.challengeFor+`"`)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = io.WriteString(w, `{"error":"invalid_token","error_description":"Missing Authorization header"}`)
		default:
			w.Header().Set("WWW-Authenticate", `Bearer scope="mcp:write", resource_metadata="`+s.challengeFor+`", error="insufficient_scope"`)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusForbidden)
			_, _ = io.WriteString(w, `{"error":"insufficient_scope","error_description":"Token has insufficient scope"}`)
		}
	}))
	t.Cleanup(hs.Close)
	s.url = hs.URL + "/mcp"
	s.challengeFor = hs.URL + "/.well-known/oauth-protected-resource/mcp"
	return s
}

// TestHeldPassesChallenges: a 2026-07-28 agent on the held route meets
// the server's 401 and then its 403 insufficient_scope: each comes with
// the server's challenge (scope included, resource_metadata pointing at
// mcpheal), so the agent can log in and step up its scope; they came
// without one, and the client logged in for the wrong scope and never
// stepped up (conformance auth/scope-step-up). And a stateless server's
// 404 to the held session's GET stream is not a dead session: it was
// healed, and the GET sent again, without end.
func TestHeldPassesChallenges(t *testing.T) {
	t.Parallel()
	up := startStepUpServer(t)
	_, url := startProxy(t, up.url, nil)
	own := strings.TrimSuffix(url, "/mcp") + "/.well-known/oauth-protected-resource/mcp"
	for _, c := range []struct {
		auth   string
		status int
		want   string
	}{
		{"full", http.StatusOK, ""},
		{"", http.StatusUnauthorized, `Bearer scope="mcp:basic", resource_metadata="` + own + `"`},
		{"basic", http.StatusForbidden, `Bearer scope="mcp:write", resource_metadata="` + own + `", error="insufficient_scope"`},
	} {
		body := `{"jsonrpc":"2.0","id":3,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28",` +
			`"io.modelcontextprotocol/clientInfo":{"name":"raw","version":"1"},"io.modelcontextprotocol/clientCapabilities":{}}}}`
		req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("MCP-Protocol-Version", "2026-07-28")
		req.Header.Set("Mcp-Method", "tools/list")
		if c.auth != "" {
			req.Header.Set("Authorization", "Bearer "+c.auth)
		}
		resp, b := peers.RawDo(t, req)
		if resp.StatusCode != c.status || resp.Header.Get("WWW-Authenticate") != c.want {
			t.Errorf("token %q: %d %q %s; want %d %q", c.auth, resp.StatusCode, resp.Header.Get("WWW-Authenticate"), b, c.status, c.want)
		}
	}
	// Each held session (one per credential) opens its GET once; a heal
	// would initialize again and open another at once.
	for range 3 {
		select {
		case <-up.getSeen:
		case <-time.After(peers.Timeout):
			t.Fatal("the held sessions opened no GET stream")
		}
	}
	select {
	case <-up.getSeen:
		t.Errorf("a GET stream was opened again after the server's 404 (%d GETs, %d initializes): a stateless server was healed",
			up.gets.Load(), up.inits.Load())
	case <-time.After(time.Second):
	}
	if n := up.inits.Load(); n != 3 {
		t.Errorf("%d initializes for three held sessions, want 3", n)
	}
}

// TestHeldMaxInitBody: a 2026-07-28 agent whose _meta would make the held
// session's initialize larger than max_init_body gets 413 and the
// upstream no initialize; the held route made a 3.84 MB initialize of a
// 3.84 MB clientCapabilities, kept for the session's life.
func TestHeldMaxInitBody(t *testing.T) {
	t.Parallel()
	up := peers.StartGoSDK(t, peers.GoSDKOpts{})
	_, url := startProxy(t, up.URL(), func(c *conf.Config) { c.MaxInitBody = 4096; c.MaxBody = 1 << 20 })
	big := `"x":"` + strings.Repeat("a", 8192) + `"`
	body := `{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28",` +
		`"io.modelcontextprotocol/clientInfo":{"name":"raw","version":"1"},"io.modelcontextprotocol/clientCapabilities":{` + big + `}}}}`
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("MCP-Protocol-Version", "2026-07-28")
	req.Header.Set("Mcp-Method", "tools/list")
	resp, b := peers.RawDo(t, req)
	if resp.StatusCode != http.StatusRequestEntityTooLarge || !strings.Contains(string(b), "max_init_body") {
		t.Fatalf("%d %s; want 413 naming max_init_body", resp.StatusCode, b)
	}
	if n := up.Inits(); n != 0 {
		t.Errorf("the upstream got %d initialize", n)
	}
	// A small one is held as before.
	if st, res := heldPost(t, url, "", "tools/list", "", 2); st != http.StatusOK || !res.Get("result.tools").IsArray() {
		t.Fatalf("a small _meta: %d %s", st, res.Raw)
	}
}

// TestHeldAnswersAs2026 (docs/eras.md "Across protocol eras"): on the held route
// mcpheal is the agent's MCP 2026-07-28 server, and refuses what such a
// server refuses, as the Go SDK's server of both eras does: headers that
// disagree with the body (400 -32020), _meta without its protocol version
// or client capabilities (400 -32602), another version (400 -32022 naming
// 2026-07-28), methods 2026-07-28 removed (404 -32601). None reaches the
// upstream. They were forwarded, or answered 200.
func TestHeldAnswersAs2026(t *testing.T) {
	t.Parallel()
	up := peers.StartGoSDK(t, peers.GoSDKOpts{})
	_, url := startProxy(t, up.URL(), nil)
	meta := func(v string, caps bool) string {
		m := `"_meta":{"io.modelcontextprotocol/protocolVersion":"` + v + `","io.modelcontextprotocol/clientInfo":{"name":"raw","version":"1"}`
		if caps {
			m += `,"io.modelcontextprotocol/clientCapabilities":{}`
		}
		return m + "}"
	}
	for _, c := range []struct {
		name, version, method, name2, body string
		status                             int
		code                               int64
	}{
		{"no Mcp-Method", "2026-07-28", "", "", `{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{` + meta("2026-07-28", true) + `}}`, 400, -32020},
		{"Mcp-Method differs", "2026-07-28", "prompts/list", "", `{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{` + meta("2026-07-28", true) + `}}`, 400, -32020},
		{"header version differs", "2025-11-25", "tools/list", "", `{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{` + meta("2026-07-28", true) + `}}`, 400, -32020},
		{"Mcp-Name differs", "2026-07-28", "tools/call", "other", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo","arguments":{"text":"x"},` + meta("2026-07-28", true) + `}}`, 400, -32020},
		{"no _meta", "2026-07-28", "tools/list", "", `{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}`, 400, -32602},
		{"no capabilities", "2026-07-28", "tools/list", "", `{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{` + meta("2026-07-28", false) + `}}`, 400, -32602},
		{"another version", "1999-01-01", "tools/list", "", `{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{` + meta("1999-01-01", true) + `}}`, 400, -32022},
		{"ping", "2026-07-28", "ping", "", `{"jsonrpc":"2.0","id":1,"method":"ping","params":{` + meta("2026-07-28", true) + `}}`, 404, -32601},
		{"tasks/list", "2026-07-28", "tasks/list", "", `{"jsonrpc":"2.0","id":1,"method":"tasks/list","params":{` + meta("2026-07-28", true) + `}}`, 404, -32601},
		{"initialize", "2026-07-28", "initialize", "", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{` + meta("2026-07-28", true) + `}}`, 404, -32601},
	} {
		req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(c.body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("MCP-Protocol-Version", c.version)
		if c.method != "" {
			req.Header.Set("Mcp-Method", c.method)
		}
		if c.name2 != "" {
			req.Header.Set("Mcp-Name", c.name2)
		}
		resp, b := peers.RawDo(t, req)
		if resp.StatusCode != c.status || gjson.GetBytes(b, "error.code").Int() != c.code {
			t.Errorf("%s: %d %s; want %d and %d", c.name, resp.StatusCode, b, c.status, c.code)
		}
		if c.code == -32022 && gjson.GetBytes(b, "error.data.supported.0").Str != "2026-07-28" {
			t.Errorf("%s: %s; want data.supported naming 2026-07-28", c.name, b)
		}
	}
	if n := up.Inits(); n != 0 {
		t.Errorf("the upstream got %d initialize: a refused request opened a held session", n)
	}
	if n := up.ToolCalls("echo"); n != 0 {
		t.Errorf("echo ran %d times", n)
	}
}

// TestHeldSessionBelongsToCredential (docs/eras.md): a held session is
// the credential's and the client's. Without inbound auth two agents that
// name the same client share one, and what a session-era server keeps per
// session is visible across them (measured: the second reads the first's
// stored value). Each agent with its own inbound token (--auth-token-env)
// gets its own held session, and reads nothing of the other's.
func TestHeldSessionBelongsToCredential(t *testing.T) {
	t.Parallel()
	srv := mcp.NewServer(&mcp.Implementation{Name: "per-session", Version: "1"}, nil)
	var mu sync.Mutex
	stored := map[string]string{}
	type putIn struct {
		V string `json:"v"`
	}
	mcp.AddTool(srv, &mcp.Tool{Name: "put"}, func(_ context.Context, req *mcp.CallToolRequest, in putIn) (*mcp.CallToolResult, any, error) {
		mu.Lock()
		stored[req.Session.ID()] = in.V
		mu.Unlock()
		return peers.Text("ok"), nil, nil
	})
	mcp.AddTool(srv, &mcp.Tool{Name: "get"}, func(_ context.Context, req *mcp.CallToolRequest, _ peers.NoIn) (*mcp.CallToolResult, any, error) {
		mu.Lock()
		defer mu.Unlock()
		return peers.Text("[" + stored[req.Session.ID()] + "]"), nil, nil
	})
	hs := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil))
	t.Cleanup(hs.Close)
	for _, c := range []struct {
		name       string
		tokens     []string
		alice, bob string
		want       string
	}{
		{"no inbound auth: one held session", nil, "", "", "[alice-value]"},
		{"a token each: a held session each", []string{"alice-token-0123456789", "bob-token-0123456789"},
			"alice-token-0123456789", "bob-token-0123456789", "[]"},
	} {
		_, url := startProxy(t, hs.URL+"/mcp", func(cfg *conf.Config) { cfg.AuthTokens = c.tokens })
		if st, res := heldPost(t, url, c.alice, "tools/call", `"name":"put","arguments":{"v":"alice-value"},`, 1); st != http.StatusOK {
			t.Fatalf("%s: put: %d %s", c.name, st, res.Raw)
		}
		st, res := heldPost(t, url, c.bob, "tools/call", `"name":"get","arguments":{},`, 2)
		if got := res.Get("result.content.0.text").Str; st != http.StatusOK || got != c.want {
			t.Errorf("%s: the other agent reads %q (%d %s), want %q", c.name, got, st, res.Raw, c.want)
		}
	}
}

// TestHeldOnRealRefusal: a Go SDK server limited to the session era
// (ServerOptions.SupportedProtocolVersions) refuses a 2026-07-28 request
// with 400 -32022 naming the versions it supports. That is its era: a
// 2026-07-28 agent gets the held route and speaks 2026-07-28 through
// mcpheal, where directly it falls back to a session. Before, mcpheal took
// -32022 for no answer, left the era unknown and passed the agent through.
func TestHeldOnRealRefusal(t *testing.T) {
	t.Parallel()
	up := peers.StartGoSDK(t, peers.GoSDKOpts{Versions: []string{"2025-11-25", "2025-06-18", "2025-03-26"}})
	direct := peers.GoSDK2026Client(t, up.URL(), nil)
	if v := direct.InitializeResult().ProtocolVersion; v == wire.StatelessVersion {
		t.Fatalf("directly the session-era server spoke %s: this test proves nothing", v)
	}
	s, url := startProxy(t, up.URL(), nil)
	cs := peers.GoSDK2026Client(t, url, nil)
	if v := cs.InitializeResult().ProtocolVersion; v != wire.StatelessVersion {
		t.Fatalf("through mcpheal the client speaks %q; want %s (the held route)", v, wire.StatelessVersion)
	}
	if v := s.eras.V.Load(); v != era.EraLegacy {
		t.Errorf("era %s, want %s", era.EraNames[v], era.EraNames[era.EraLegacy])
	}
	peers.CallEcho(t, cs, "held on a real refusal")
	if n := up.ToolCalls("echo"); n != 1 {
		t.Errorf("echo ran %d times, want 1", n)
	}
}

// TestHeldResumesPolledStream: a session-era server with an event store
// closes a call's answer stream on purpose (SSE polling, MCP 2025-11-25:
// a progress event with an id, retry:, the connection closed) and answers
// on the GET with Last-Event-ID that resumes it. Through the held route a
// 2026-07-28 agent gets the answer, as the session-era route's agent does,
// and the tool runs once; the polls cost the upstream one GET each and no
// server/discover. Before, the held route read the events itself without
// resuming, and the agent got -32011 for a call that had run.
func TestHeldResumesPolledStream(t *testing.T) {
	t.Parallel()
	up := peers.StartGoSDK(t, peers.GoSDKOpts{EventStore: true, Polls: true})
	_, url := startProxy(t, up.URL(), nil)
	cs := peers.GoSDK2026Client(t, url, nil)
	if v := cs.InitializeResult().ProtocolVersion; v != wire.StatelessVersion {
		t.Fatalf("through mcpheal the client speaks %q; want %s (the held route)", v, wire.StatelessVersion)
	}
	discovers := up.Calls("server/discover")
	gets := func() int {
		n := 0
		for _, r := range up.Requests() {
			if r.HTTPMethod == http.MethodGet && r.Header.Get("Last-Event-ID") != "" {
				n++
			}
		}
		return n
	}
	before := gets()
	const polls = 3
	res, err := peers.GoSDKCall(t, cs, "poll", map[string]any{"times": polls, "retryMs": 20, "delayMs": 100})
	if err != nil || peers.ResultText(res) != "polled" {
		t.Fatalf("poll through the held route: %q, %v; want its answer", peers.ResultText(res), err)
	}
	if n := up.ToolCalls("poll"); n != 1 {
		t.Errorf("poll ran %d times, want 1", n)
	}
	if n := up.Calls("server/discover") - discovers; n != 0 {
		t.Errorf("%d server/discover during the polls, want 0 (a stream closed on purpose is no outage)", n)
	}
	if n := gets() - before; n < 1 || n > polls {
		t.Errorf("%d upstream GETs with Last-Event-ID to resume %d polls, want 1 to %d", n, polls, polls)
	}
}

// forgetAfter serves upstream through a server that forgets each session
// after n requests on it: the request after the n-th gets the Go SDK's 404
// "session not found", as a server short of memory, or with a per-session
// request quota, might.
func forgetAfter(t *testing.T, upstream string, n int) string {
	t.Helper()
	target, err := url.Parse(upstream)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(target)
	var mu sync.Mutex
	seen := map[string]int{}
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if sid := r.Header.Get("Mcp-Session-Id"); sid != "" && r.Method == http.MethodPost {
			mu.Lock()
			seen[sid]++
			over := seen[sid] > n
			mu.Unlock()
			if over {
				http.Error(w, "session not found", http.StatusNotFound)
				return
			}
		}
		r.Host = target.Host
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(hs.Close)
	return hs.URL + target.Path
}

// TestHeldReplayFirst: a session-era server that lets each session serve
// three requests. A held session's heal spends two of them (initialize,
// notifications/initialized); the agent's call goes next, then what can
// wait (the tools/list by which mcpheal learns the annotations). Every call
// of a 2026-07-28 agent then gets its answer, and each runs once. Before,
// the tools/list went first, and the replay met a session already gone.
func TestHeldReplayFirst(t *testing.T) {
	t.Parallel()
	up := peers.StartGoSDK(t, peers.GoSDKOpts{})
	_, proxyURL := startProxy(t, forgetAfter(t, up.URL(), 3), func(c *conf.Config) { c.Keepalive = -1 })
	cs := peers.GoSDK2026Client(t, proxyURL, nil)
	if v := cs.InitializeResult().ProtocolVersion; v != wire.StatelessVersion {
		t.Fatalf("through mcpheal the client speaks %q; want %s (the held route)", v, wire.StatelessVersion)
	}
	const calls = 7
	for i := range calls {
		peers.CallEcho(t, cs, fmt.Sprint("quota-", i))
	}
	if n := up.ToolCalls("echo"); n != calls {
		t.Errorf("echo ran %d times for %d calls, want once each", n, calls)
	}
}
