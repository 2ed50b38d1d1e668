//go:build unix

package interop

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpheal/mcpheal/proxy"
	"github.com/mcpheal/mcpheal/upstream"
)

// ownCase is one answer mcpheal writes itself (docs/observability.md
// "Errors mcpheal writes itself"), provoked with small settings.
type ownCase struct {
	name   string
	code   int    // its JSON-RPC code (-32015 or -32017 both for the budget at a session's start)
	codes  []int  // other codes that say the same, if any
	phrase string // in its message
	config func(*proxy.Config)
	// down: the upstream is reachable while the agents connect and list,
	// then refuses connections before their calls.
	down bool
	// atConnect: the answer is to the agent's first request (its session
	// is refused); otherwise to its call.
	atConnect bool
	// occupy: a session opened (and used) through mcpheal before the agents
	// connect, taking the one place the caps leave.
	occupy bool
	// call is the tool the agent calls, with its arguments.
	tool string
	args map[string]any
	// first: the call that must come first, answered within first (the
	// outage that opens the breaker); then the call of the case.
	first time.Duration
	// within bounds how long the answer may take to reach the model.
	within time.Duration
}

// ownClients are the clients of TestOwnAnswersReachEveryClient: every real
// one, the official Go SDK client in process, and raw HTTP (which checks
// the status: 200 for a request, 202 for a notification).
var ownClients = []string{"hermes", "py-sdk", "py-client-legacy", "py-client-auto", "fastmcp-py", "ts-sdk-v1", "ts-sdk-v2", "mcp-remote", "go-sdk", "raw-http"}

// TestOwnAnswersReachEveryClient (docs/observability.md "Errors mcpheal
// writes itself"): every answer mcpheal writes itself reaches every real
// client as an error at once, well under the client's own timeout: the
// upstream unreachable past heal_timeout (-32010), the circuit breaker open
// (-32010), max_sessions, max_sessions_per_credential and memory_budget
// reached by a new session (-32015; -32017 where an answer meets the
// budget first), memory_budget reached by an answer (-32017). The upstream
// is the official Go SDK server (the session era, JSON answers), so that
// the 2026-07-28 clients (the Python SDK in auto mode, FastMCP's client)
// take the held route. mcpheal sends each as HTTP 200 with the JSON-RPC
// error (202 to a notification): the raw client fails the test on any
// other status, and Hermes (the MCP Python SDK 1.x under it) would wait
// for its timeout on a 503.
func TestOwnAnswersReachEveryClient(t *testing.T) {
	cases := []ownCase{
		{name: "upstream unreachable past heal_timeout", code: -32010, phrase: "upstream unreachable", down: true,
			config: func(c *proxy.Config) {
				c.HealTimeout = 2 * time.Second
				c.Breaker = upstream.BreakerConfig{Threshold: 1 << 20} // never opens
			},
			tool: "echo", args: map[string]any{"text": "hello"}, within: 2*time.Second + atOnce},
		{name: "circuit breaker open", code: -32010, phrase: "circuit breaker open", down: true,
			config: func(c *proxy.Config) {
				c.HealTimeout = time.Second
				c.Breaker = upstream.BreakerConfig{Threshold: 1, MinStreak: time.Nanosecond, Cooldown: 10 * time.Minute, MaxCooldown: 10 * time.Minute}
			},
			tool: "echo", args: map[string]any{"text": "hello"}, first: time.Second + atOnce, within: atOnce},
		{name: "max_sessions reached", code: -32015, phrase: "max_sessions", atConnect: true, occupy: true,
			config: func(c *proxy.Config) { c.MaxSessions = 1 }, within: atOnce},
		{name: "max_sessions_per_credential reached", code: -32015, phrase: "max_sessions_per_credential", atConnect: true, occupy: true,
			config: func(c *proxy.Config) { c.MaxSessionsPerCredential = 1 }, within: atOnce},
		{name: "memory_budget reached by a new session", code: -32015, codes: []int{-32017}, phrase: "memory_budget", atConnect: true,
			config: func(c *proxy.Config) { c.MemoryBudget = 1 << 10 }, within: atOnce},
		{name: "memory_budget reached by an answer", code: -32017, phrase: "memory_budget",
			config: func(c *proxy.Config) { c.MemoryBudget = 256 << 10 },
			tool:   "big", args: map[string]any{"bytes": 200_000}, within: atOnce},
	}
	up := startOwnUpstream(t)
	var wg sync.WaitGroup
	for _, oc := range cases {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t.Run(oc.name, func(t *testing.T) { runOwnCase(t, oc, up) })
		}()
	}
	wg.Wait()
}

// runOwnCase provokes oc in front of up for every client at once.
func runOwnCase(t *testing.T, oc ownCase, up string) {
	target := up
	var relay *faultRelay
	if oc.down {
		relay = startFaultRelay(t, up, nil)
		target = relay.url()
	}
	c := proxy.Config{Upstream: target, HealTimeout: matrixHealTimeout}
	oc.config(&c)
	_, url := startProxyConfig(t, c, &tail{max: 64 << 10})
	if oc.occupy {
		r := newRawAgent(t, url)
		if got := r.connect(); !got.OK {
			t.Fatalf("the session that takes the one place: %v", got)
		}
		if got := r.list(); !got.OK {
			t.Fatalf("the session that takes the one place: tools/list %v", got)
		}
	}
	agents := make([]agent, len(ownClients))
	connected := make([]result, len(ownClients))
	connTook := make([]time.Duration, len(ownClients))
	eachClient(func(i int, client string) {
		gated(func() {
			agents[i] = newOwnAgent(t, client, url)
			start := time.Now()
			connected[i] = agents[i].connect()
			connTook[i] = time.Since(start)
			if rm, ok := agents[i].(*remote); ok && connected[i].Kind == "timeout" && remoteExited(rm) {
				// mcp-remote ends when its initialize fails: the host sees
				// the server end at once, with the error on its stderr.
				connected[i].Kind = "mcp-remote exited"
			}
			if connected[i].OK {
				if l := agents[i].list(); !l.OK && !oc.atConnect {
					t.Errorf("%s: tools/list before the fault: %v", client, l)
				}
			}
		})
	})
	if oc.atConnect {
		eachClient(func(i int, client string) {
			t.Run(client, func(t *testing.T) { oc.judge(t, client, connected[i], connTook[i]) })
		})
		return
	}
	for i, client := range ownClients {
		if !connected[i].OK {
			t.Fatalf("%s could not connect before the fault: %v", client, connected[i])
		}
	}
	if relay != nil {
		relay.down()
	}
	call := func(a agent) (result, time.Duration) {
		start := time.Now()
		r := a.call(oc.tool, oc.args)
		return r, time.Since(start)
	}
	eachClient(func(i int, client string) {
		t.Run(client, func(t *testing.T) {
			if oc.first > 0 {
				r, took := call(agents[i])
				t.Logf("the call that meets the outage first: %v after %v", r, took.Round(time.Millisecond))
				if r.OK || took >= oc.first {
					t.Errorf("the first call in the outage: %v after %v; want an error within %v", r, took.Round(time.Millisecond), oc.first)
				}
			}
			r, took := call(agents[i])
			oc.judge(t, client, r, took)
		})
	})
}

// judge checks one client's answer: an error, at once, that carries
// mcpheal's code where the client shows codes and its words where it shows
// text.
func (oc ownCase) judge(t *testing.T, client string, r result, took time.Duration) {
	t.Helper()
	t.Logf("%s: %v after %v", client, r, took.Round(time.Millisecond))
	if r.OK {
		t.Fatalf("%s got no error: %v", client, r)
	}
	within := oc.within
	if client == "hermes" && oc.atConnect {
		// Hermes tries a first connection 4 times, 1, 2 and 4 s apart,
		// whatever the error (tools/mcp_tool.py
		// _MAX_INITIAL_CONNECT_RETRIES): its own 7 s, and three more
		// connects of its own to answer.
		within += 7*time.Second + atOnce
	}
	if lim := min(within, clientTimeout(client)-5*time.Second); took >= lim || r.Kind == "timeout" {
		t.Errorf("%s waited %v for mcpheal's answer (%s); want it under %v (its own timeout %v)", client, took.Round(time.Millisecond), r.Kind, lim, clientTimeout(client))
	}
	codeOK := r.Code != nil && (*r.Code == oc.code || containsInt(oc.codes, *r.Code))
	words := strings.Contains(strings.ToLower(r.Message), strings.ToLower(oc.phrase))
	if !codeOK && !words {
		t.Errorf("%s: the error reaches the model without mcpheal's code %d or its words %q: %v", client, oc.code, oc.phrase, r)
	}
}

// remoteExited says whether mcp-remote's process has ended (its stdout
// did, when it gave no answer: the process follows within moments).
func remoteExited(r *remote) bool {
	select {
	case <-r.p.exited:
		return true
	case <-time.After(5 * time.Second):
		return false
	}
}

func containsInt(s []int, v int) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// eachClient runs f for every client of ownClients at once.
func eachClient(f func(i int, client string)) {
	var wg sync.WaitGroup
	for i, c := range ownClients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f(i, c)
		}()
	}
	wg.Wait()
}

// newOwnAgent is newAgent, plus the Go SDK client in process and raw HTTP.
func newOwnAgent(t *testing.T, client, url string) agent {
	switch client {
	case "go-sdk":
		return &goAgent{t: t, url: url}
	case "raw-http":
		return newRawAgent(t, url)
	}
	return newAgent(t, client, url, "own-"+client)
}

// startOwnUpstream serves the official Go SDK server (stateful: the
// session era; JSON answers, which mcpheal reads whole) on 127.0.0.1 with
// echo and big (readOnlyHint: a text of bytes bytes).
func startOwnUpstream(t *testing.T) string {
	t.Helper()
	srv := mcp.NewServer(&mcp.Implementation{Name: "mcpheal-interop-go-json", Version: "1.0.0"}, nil)
	type echoIn struct {
		Text string `json:"text"`
	}
	type bigIn struct {
		Bytes int `json:"bytes"`
	}
	ro := &mcp.ToolAnnotations{ReadOnlyHint: true}
	mcp.AddTool(srv, &mcp.Tool{Name: "echo", Description: "Echoes text.", Annotations: ro},
		func(_ context.Context, _ *mcp.CallToolRequest, in echoIn) (*mcp.CallToolResult, any, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: in.Text}}}, nil, nil
		})
	mcp.AddTool(srv, &mcp.Tool{Name: "big", Description: "A text of bytes bytes.", Annotations: ro},
		func(_ context.Context, _ *mcp.CallToolRequest, in bigIn) (*mcp.CallToolResult, any, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: strings.Repeat("x", in.Bytes)}}}, nil, nil
		})
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, &mcp.StreamableHTTPOptions{JSONResponse: true})
	mux := http.NewServeMux()
	mux.Handle("/mcp", h)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: mux}
	go func() { _ = hs.Serve(ln) }()
	t.Cleanup(func() {
		_ = hs.Close()
		for ss := range srv.Sessions() {
			_ = ss.Close()
		}
	})
	return "http://" + ln.Addr().String() + "/mcp"
}

// goAgent is the official Go SDK client (StreamableClientTransport) as an
// agent.
type goAgent struct {
	t   *testing.T
	url string
	cs  *mcp.ClientSession
}

// goResult reduces a Go SDK error to a result: a JSON-RPC error keeps its
// code.
func goResult(op string, err error) result {
	var we *jsonrpc.Error
	if errors.As(err, &we) {
		code := int(we.Code)
		return result{Op: op, Code: &code, Kind: "JSON-RPC error", Message: we.Message}
	}
	kind := "error"
	if errors.Is(err, context.DeadlineExceeded) {
		kind = "timeout"
	}
	return result{Op: op, Kind: kind, Message: err.Error()}
}

func (g *goAgent) connect() result {
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	c := mcp.NewClient(&mcp.Implementation{Name: "own-go-sdk", Version: "1.0.0"}, nil)
	cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: g.url, MaxRetries: -1}, nil)
	if err != nil {
		return goResult("connect", err)
	}
	g.cs = cs
	g.t.Cleanup(func() { _ = cs.Close() })
	name := ""
	if ir := cs.InitializeResult(); ir != nil && ir.ServerInfo != nil {
		name = ir.ServerInfo.Name
	}
	return result{Op: "connect", OK: true, ServerName: name}
}

func (g *goAgent) list() result {
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	lr, err := g.cs.ListTools(ctx, nil)
	if err != nil {
		return goResult("list", err)
	}
	r := result{Op: "list", OK: true, Count: len(lr.Tools)}
	for _, tool := range lr.Tools {
		r.Names = append(r.Names, tool.Name)
	}
	return r
}

func (g *goAgent) call(name string, args map[string]any) result { return g.callAsync(name, args)() }

func (g *goAgent) callAsync(name string, args map[string]any) func() result {
	done := make(chan result, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		defer cancel()
		cr, err := g.cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
		if err != nil {
			done <- goResult("call", err)
			return
		}
		text := ""
		for _, c := range cr.Content {
			if tc, ok := c.(*mcp.TextContent); ok {
				text += tc.Text
			}
		}
		r := result{Op: "call", OK: true, IsError: cr.IsError, TextHead: text[:min(200, len(text))]}
		r.TextLen, r.TextSha256 = digest(text)
		done <- r
	}()
	return func() result { return <-done }
}

// rawAgent speaks MCP over plain HTTP as the spec writes it, and fails an
// answer of mcpheal's whose status is not 200 (202 for the notification it
// sends after every failed call).
type rawAgent struct {
	t   *testing.T
	url string
	sid string
	id  int
	wg  sync.WaitGroup // the notifications sent, checked in cleanup
}

func newRawAgent(t *testing.T, url string) *rawAgent {
	r := &rawAgent{t: t, url: url}
	t.Cleanup(r.wg.Wait)
	return r
}

// post sends body and returns the status, the session id and the body.
func (r *rawAgent) post(body string) (int, string, []byte, error) {
	req, err := http.NewRequest(http.MethodPost, r.url, strings.NewReader(body))
	if err != nil {
		return 0, "", nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if r.sid != "" {
		req.Header.Set("Mcp-Session-Id", r.sid)
		req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	}
	resp, err := (&http.Client{Timeout: opTimeout}).Do(req)
	if err != nil {
		return 0, "", nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("Mcp-Session-Id"), b, err
}

// request sends one JSON-RPC request and reads its answer (JSON, or the
// last data line of an event stream).
func (r *rawAgent) request(op, method string, params any) (result, json.RawMessage) {
	r.id++
	b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": r.id, "method": method, "params": params})
	status, sid, body, err := r.post(string(b))
	if err != nil {
		return result{Op: op, Kind: "transport", Message: err.Error()}, nil
	}
	if sid != "" {
		r.sid = sid
	}
	payload := body
	if i := strings.LastIndex(string(body), "data: "); i >= 0 {
		payload = []byte(strings.SplitN(string(body[i+len("data: "):]), "\n", 2)[0])
	}
	var m struct {
		ID     json.RawMessage `json:"id"`
		Result json.RawMessage `json:"result"`
		Error  *struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(payload, &m); err != nil {
		return result{Op: op, Kind: fmt.Sprintf("HTTP %d", status), Message: fmt.Sprintf("%.300s", body)}, nil
	}
	if m.Error != nil {
		code := m.Error.Code
		res := result{Op: op, Code: &code, Kind: "JSON-RPC error", Message: m.Error.Message}
		if status != http.StatusOK {
			res.Kind = fmt.Sprintf("HTTP %d (want 200)", status)
			res.Code = nil // not an answer every client reads as this error
			r.t.Errorf("mcpheal answered %s with HTTP %d, want 200 with the JSON-RPC error: %s", method, status, payload)
		}
		if string(m.ID) != fmt.Sprint(r.id) {
			r.t.Errorf("mcpheal's error to %s carries id %s, want %d", method, m.ID, r.id)
		}
		if r.sid != "" {
			r.wg.Add(1)
			go func() { defer r.wg.Done(); r.notify() }()
		}
		return res, nil
	}
	if status != http.StatusOK {
		return result{Op: op, Kind: fmt.Sprintf("HTTP %d", status), Message: fmt.Sprintf("%.300s", body)}, nil
	}
	return result{Op: op, OK: true}, m.Result
}

// notify sends a notification, which must be answered 202 whatever
// mcpheal's trouble (it may wait for the upstream as a request does, so it
// is sent beside the calls, not timed with them).
func (r *rawAgent) notify() {
	status, _, body, err := r.post(`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":999999}}`)
	if err == nil && status != http.StatusAccepted {
		r.t.Errorf("mcpheal answered a notification with HTTP %d (%.200s), want 202", status, body)
	}
}

func (r *rawAgent) connect() result {
	res, _ := r.request("connect", "initialize", map[string]any{
		"protocolVersion": "2025-11-25", "capabilities": map[string]any{},
		"clientInfo": map[string]any{"name": "own-raw", "version": "1"},
	})
	if res.OK {
		if status, _, body, err := r.post(`{"jsonrpc":"2.0","method":"notifications/initialized"}`); err != nil || status != http.StatusAccepted {
			return result{Op: "connect", Kind: "initialized", Message: fmt.Sprintf("HTTP %d %v %.200s", status, err, body)}
		}
	}
	return res
}

func (r *rawAgent) list() result {
	res, raw := r.request("list", "tools/list", map[string]any{})
	if res.OK {
		var v struct{ Tools []struct{ Name string } }
		_ = json.Unmarshal(raw, &v)
		for _, tool := range v.Tools {
			res.Names = append(res.Names, tool.Name)
		}
		res.Count = len(res.Names)
	}
	return res
}

func (r *rawAgent) call(name string, args map[string]any) result {
	res, _ := r.request("call", "tools/call", map[string]any{"name": name, "arguments": args})
	return res
}

func (r *rawAgent) callAsync(name string, args map[string]any) func() result {
	res := r.call(name, args)
	return func() result { return res }
}
