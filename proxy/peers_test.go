package proxy

// Real MCP upstreams and real SDK clients for end-to-end proxy tests.
//
// Three kinds of upstream ("peer") run on 127.0.0.1 and stop by themselves in
// t.Cleanup:
//
//   - startGoSDK: the official Go SDK server (go-sdk v1.8.0);
//   - startMCPGo: mark3labs/mcp-go v1.2.1;
//   - startDialect: a scripted fake for session-loss dialects no SDK produces
//     (TS example 400, WordPress HTTP 200, SSE-framed HTTP 200), see
//     the class table of docs/healing.md.
//
// Every peer records each HTTP request it receives (peerRequest), counts
// JSON-RPC methods, and can be restarted on the same port (all sessions lost),
// stopped, started again and told to forget its sessions. The clients are
// the SDKs' own: goSDKClient (go-sdk) and mcpGoClient (mcp-go).

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	mcpgoclient "github.com/mark3labs/mcp-go/client"
	mcpgotransport "github.com/mark3labs/mcp-go/client/transport"
	mcpgo "github.com/mark3labs/mcp-go/mcp"
	mcpgoserver "github.com/mark3labs/mcp-go/server"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// peerTimeout bounds every single exchange the helpers make (connect, call,
// raw POST) and every wait for a peer to come up or drain.
const PeerTimeout = 5 * time.Second

// goSDKOpts configures startGoSDK; the zero value is a stateful server
// answering with text/event-stream and never expiring idle sessions.
type goSDKOpts struct {
	// Stateless maps to StreamableHTTPOptions.Stateless: no Mcp-Session-Id at
	// all, GET/DELETE answer 405.
	Stateless bool
	// JSONResponse maps to StreamableHTTPOptions.JSONResponse: answers are
	// application/json (progress notifications of a call are then not
	// delivered on the call's answer).
	JSONResponse bool
	// SessionTimeout maps to StreamableHTTPOptions.SessionTimeout; zero means
	// never. An expired session answers 404 text/plain "session not found\n".
	SessionTimeout time.Duration
	// EventStore gives each generation an mcp.MemoryEventStore: SSE events
	// then carry ids ("<stream>_<index>") and a GET with Last-Event-ID
	// resumes a stream (an unknown stream or session: 400 "failed to replay
	// events"). Without it a GET with Last-Event-ID answers 400 "stream
	// replay unsupported".
	EventStore bool
	// State adds the session-state features (docs/streams.md "Streams and session
	// state across a heal"): subscribable
	// resources (peerResourceURI and any other URI; see UpdateResource) and
	// the log, sample, ask and ask_aside tools. The server's tool list then
	// has 8 tools.
	State bool
	// Versions maps to ServerOptions.SupportedProtocolVersions: a server of
	// the session era only answers a 2026-07-28 request 400 -32022 naming
	// them. Nil: the SDK's own.
	Versions []string
	// Polls adds the poll tool, which closes its call's answer stream on
	// purpose (SSE polling, MCP 2025-11-25) times times, each after a
	// progress notification, with retry: retryMs and a pause of delayMs
	// (a long call's work), then answers "polled".
	// It needs EventStore for the client to resume.
	Polls bool
}

type peerPollIn struct {
	Times   int `json:"times"`
	RetryMs int `json:"retryMs"`
	DelayMs int `json:"delayMs"`
}

// dialect selects how a startDialect peer answers a request that carries an
// unknown or forgotten Mcp-Session-Id.
type dialect int

const (
	// dialectTS400: 400 application/json, -32000 "Bad Request: No valid
	// session ID provided", no "id" member (TS server-everything, §7).
	dialectTS400 dialect = iota + 1
	// dialectWP200: HTTP 200 application/json, -32602 "Invalid params:
	// Invalid or expired session" with the request's id (WordPress
	// mcp-adapter, §2).
	dialectWP200
	// dialectSSE200: the dialectWP200 error framed as one SSE event in an
	// HTTP 200 text/event-stream answer. This dialect answers every request
	// with SSE.
	dialectSSE200
)

func (d dialect) String() string {
	switch d {
	case dialectTS400:
		return "TS400"
	case dialectWP200:
		return "WP200"
	case dialectSSE200:
		return "SSE200"
	}
	return "dialect(" + strconv.Itoa(int(d)) + ")"
}

// dialectExpired returns the exact answer a dialect peer gives to a POST
// carrying a forgotten or unknown session id. id is the request's raw
// JSON-RPC id (nil for a notification, which is rendered as null).
func dialectExpired(d dialect, id json.RawMessage) (status int, contentType string, body []byte) {
	if len(id) == 0 {
		id = json.RawMessage("null")
	}
	wp := `{"jsonrpc":"2.0","error":{"code":-32602,"message":"Invalid params: Invalid or expired session"},"id":` + string(id) + `}`
	switch d {
	case dialectTS400:
		return http.StatusBadRequest, "application/json",
			[]byte(`{"jsonrpc":"2.0","error":{"code":-32000,"message":"Bad Request: No valid session ID provided"}}`)
	case dialectWP200:
		return http.StatusOK, "application/json", []byte(wp)
	case dialectSSE200:
		return http.StatusOK, "text/event-stream", []byte("event: message\ndata: " + wp + "\n\n")
	}
	panic("unknown dialect " + d.String())
}

// dialectMissing returns the answer to a non-initialize POST without an
// Mcp-Session-Id (the go-sdk client's server/discover probe is one): TS
// server-everything "Server not initialized", WordPress "Missing
// Mcp-Session-Id header". Both are 400 with a JSON-RPC error body, which makes
// the go-sdk client fall back to initialize.
func dialectMissing(d dialect, id json.RawMessage) (status int, contentType string, body []byte) {
	if len(id) == 0 {
		id = json.RawMessage("null")
	}
	if d == dialectTS400 {
		return http.StatusBadRequest, "application/json",
			[]byte(`{"jsonrpc":"2.0","error":{"code":-32000,"message":"Bad Request: Server not initialized"},"id":null}`)
	}
	return http.StatusBadRequest, "application/json",
		[]byte(`{"jsonrpc":"2.0","error":{"code":-32600,"message":"Invalid Request: Missing Mcp-Session-Id header"},"id":` + string(id) + `}`)
}

// peerRequest is one HTTP request as a peer received it.
type peerRequest struct {
	HTTPMethod string
	SessionID  string // Mcp-Session-Id header, "" if absent
	RPCMethod  string // JSON-RPC method of a POST body ("" for responses, GET, DELETE, junk); first element of a batch
	RPCID      json.RawMessage
	Header     http.Header
	Body       []byte // raw POST body
}

// peerGen is one incarnation of a peer's server. Restart and the counter kill
// replace it, so every session of the old one is gone.
type peerGen struct {
	handler http.Handler
	// expire forgets every session; the server stays up.
	expire func()
	// close releases the generation. It may wait for tool handlers still
	// running, which stop early once the generation context is cancelled.
	close  func()
	cancel context.CancelFunc
	// sdk is the generation's server (go-sdk peers only), for notifications
	// sent unprompted: UpdateResource, AddResource, LogAll.
	sdk *mcp.Server
}

// peer is a running MCP upstream on 127.0.0.1. All methods are safe for
// concurrent use.
type peer struct {
	tb     testing.TB
	name   string
	newGen func(p *peer, ctx context.Context) *peerGen

	// counter is shared by the counter and ro_counter tools (toolCalls tells
	// them apart).
	counter atomic.Int64
	// killOnCounter, when set, makes the next counter or ro_counter call crash
	// the server right after incrementing: listener and every connection are
	// closed with RST before the answer is written, then a fresh server (no
	// sessions) starts on the same port. It is one-shot: the crashing call
	// clears it, so a replay by the proxy runs normally.
	killOnCounter atomic.Bool
	inits         atomic.Int64
	initDelay     atomic.Int64 // nanoseconds each initialize waits before it is served
	inflight      atomic.Int64 // HTTP handlers running
	crashes       atomic.Int64

	mu        sync.Mutex // protects addr, srv, serveDone, gen, closed
	addr      string     // "127.0.0.1:port", fixed by the first listen
	srv       *http.Server
	serveDone chan struct{}
	gen       *peerGen
	closed    bool

	connMu sync.Mutex // protects conns
	conns  map[net.Conn]struct{}

	recMu     sync.Mutex // protects reqs, methods, toolCalls
	reqs      []peerRequest
	methods   map[string]int64
	toolCalls map[string]int64

	bg sync.WaitGroup // generation closers started by a crash

	toolMu    sync.Mutex // protects addTools, dropTools
	addTools  []string   // see SetNextTools
	dropTools []string
}

func newPeer(tb testing.TB, name string, newGen func(p *peer, ctx context.Context) *peerGen) *peer {
	tb.Helper()
	p := &peer{
		tb:        tb,
		name:      name,
		newGen:    newGen,
		addr:      "127.0.0.1:0",
		conns:     make(map[net.Conn]struct{}),
		methods:   make(map[string]int64),
		toolCalls: make(map[string]int64),
	}
	p.mu.Lock()
	err := p.startLocked()
	p.mu.Unlock()
	if err != nil {
		tb.Fatalf("start %s peer: %v", name, err)
	}
	tb.Cleanup(p.shutdown)
	return p
}

// URL returns the MCP endpoint, http://127.0.0.1:port/mcp. It stays the same
// across Restart and Stop/Start.
func (p *peer) URL() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return "http://" + p.addr + "/mcp"
}

// Addr returns "127.0.0.1:port".
func (p *peer) Addr() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.addr
}

// Inits counts initialize requests received, whatever their outcome.
func (p *peer) Inits() int64 { return p.inits.Load() }

// Counter returns the shared counter of the counter and ro_counter tools.
func (p *peer) Counter() int64 { return p.counter.Load() }

// Crashes counts kills made by killOnCounter.
func (p *peer) Crashes() int64 { return p.crashes.Load() }

// Calls counts POSTed JSON-RPC messages by method ("initialize",
// "tools/call", "notifications/initialized", …; batches count each element).
func (p *peer) Calls(method string) int64 {
	p.recMu.Lock()
	defer p.recMu.Unlock()
	return p.methods[method]
}

// ToolCalls counts executions of the named tool (go-sdk and mcp-go peers:
// handler runs; dialect peers: tools/call requests on a live session).
func (p *peer) ToolCalls(name string) int64 {
	p.recMu.Lock()
	defer p.recMu.Unlock()
	return p.toolCalls[name]
}

// Requests returns a copy of every request received so far, in arrival order.
func (p *peer) Requests() []peerRequest {
	p.recMu.Lock()
	defer p.recMu.Unlock()
	out := make([]peerRequest, len(p.reqs))
	copy(out, p.reqs)
	return out
}

// ExpireSessions forgets every session while the server stays up: go-sdk
// closes each ServerSession (404 "session not found" afterwards; this waits
// for tool calls still running on them), mcp-go stateful forgets its ids
// (404 "Invalid session ID"; a no-op for the format-only default manager),
// dialect peers forget their ids (dialectExpired afterwards).
func (p *peer) ExpireSessions() {
	p.mu.Lock()
	g := p.gen
	p.mu.Unlock()
	if g != nil {
		g.expire()
	}
}

// Restart kills the server abruptly (listener and every connection closed
// with RST, every session dropped, running tools cancelled) and starts a
// fresh one on the same port. It works repeatedly.
func (p *peer) Restart() {
	p.tb.Helper()
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	old := p.stopLocked()
	err := p.startLocked()
	p.mu.Unlock()
	if old != nil {
		old.close()
	}
	if err != nil {
		p.tb.Fatalf("restart %s peer: %v", p.name, err)
	}
}

// Stop kills the server like Restart does and leaves it down (connections are
// refused) until Start.
func (p *peer) Stop() {
	p.mu.Lock()
	old := p.stopLocked()
	p.mu.Unlock()
	if old != nil {
		old.close()
	}
}

// Start brings a stopped peer back on the same port with no sessions. It is a
// no-op on a running peer.
func (p *peer) Start() {
	p.tb.Helper()
	p.mu.Lock()
	var err error
	if !p.closed && p.srv == nil {
		err = p.startLocked()
	}
	p.mu.Unlock()
	if err != nil {
		p.tb.Fatalf("start %s peer: %v", p.name, err)
	}
}

// crash is the killOnCounter path. It runs inside a tool handler of the
// generation it kills, so that generation is closed in the background: a
// go-sdk ServerSession.Close waits for the very handler calling crash.
func (p *peer) crash() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.srv == nil {
		return
	}
	p.crashes.Add(1)
	if old := p.stopLocked(); old != nil {
		p.bg.Add(1)
		go func() {
			defer p.bg.Done()
			old.close()
		}()
	}
	if err := p.startLocked(); err != nil {
		// Not Fatalf: this runs on an SDK goroutine.
		p.tb.Errorf("restart %s peer after crash: %v", p.name, err)
	}
}

// startLocked listens on p.addr (retrying while the port is still busy) and
// serves a new generation.
func (p *peer) startLocked() error {
	ln, err := peerListen(p.addr)
	if err != nil {
		return err
	}
	p.addr = ln.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	g := p.newGen(p, ctx)
	g.cancel = cancel
	srv := &http.Server{
		Handler:           p.record(g.handler),
		ConnState:         p.trackConn,
		ErrorLog:          log.New(io.Discard, "", 0),
		ReadHeaderTimeout: PeerTimeout,
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	p.srv, p.serveDone, p.gen = srv, done, g
	return nil
}

// stopLocked closes the listener and resets every connection, then returns
// the dead generation for the caller to close outside p.mu.
func (p *peer) stopLocked() *peerGen {
	if p.srv == nil {
		return nil
	}
	p.connMu.Lock()
	for c := range p.conns {
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0) // close sends RST: the reader sees a reset, not a clean FIN
		}
	}
	p.connMu.Unlock()
	_ = p.srv.Close()
	<-p.serveDone
	g := p.gen
	g.cancel()
	p.srv, p.serveDone, p.gen = nil, nil, nil
	return g
}

func (p *peer) shutdown() {
	p.mu.Lock()
	p.closed = true
	old := p.stopLocked()
	p.mu.Unlock()
	if old != nil {
		old.close()
	}
	p.bg.Wait()
	deadline := time.Now().Add(PeerTimeout)
	for p.inflight.Load() > 0 {
		if time.Now().After(deadline) {
			p.tb.Errorf("%s peer: %d HTTP handlers still running %v after stop", p.name, p.inflight.Load(), PeerTimeout)
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func (p *peer) trackConn(c net.Conn, st http.ConnState) {
	p.connMu.Lock()
	defer p.connMu.Unlock()
	switch st {
	case http.StateNew:
		p.conns[c] = struct{}{}
	case http.StateClosed, http.StateHijacked:
		delete(p.conns, c)
	}
}

// record wraps a generation's handler: it logs the request, counts
// initialize and JSON-RPC methods, and restores the body it peeked.
func (p *peer) record(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.inflight.Add(1)
		defer p.inflight.Add(-1)
		rec := peerRequest{
			HTTPMethod: r.Method,
			SessionID:  r.Header.Get("Mcp-Session-Id"),
			Header:     r.Header.Clone(),
		}
		var methods []string
		if r.Method == http.MethodPost && r.Body != nil {
			body, err := io.ReadAll(r.Body)
			_ = r.Body.Close()
			if err != nil {
				return // connection died mid-body
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
			rec.Body = body
			methods, rec.RPCID = peerPeekRPC(body)
			if len(methods) > 0 {
				rec.RPCMethod = methods[0]
			}
		}
		p.recMu.Lock()
		p.reqs = append(p.reqs, rec)
		for _, m := range methods {
			p.methods[m]++
			if m == "initialize" {
				p.inits.Add(1)
			}
		}
		p.recMu.Unlock()
		if d := p.initDelay.Load(); d > 0 && slices.Contains(methods, "initialize") {
			time.Sleep(time.Duration(d)) // a slow initialize: heals overlap
		}
		h.ServeHTTP(w, r)
	})
}

func (p *peer) countTool(name string) {
	p.recMu.Lock()
	p.toolCalls[name]++
	p.recMu.Unlock()
}

// bumpCounter runs the counter and ro_counter tools.
func (p *peer) bumpCounter(tool string) int64 {
	p.countTool(tool)
	n := p.counter.Add(1)
	if p.killOnCounter.CompareAndSwap(true, false) {
		p.crash()
	}
	return n
}

// peerPeekRPC returns the methods ("" skipped) and the first id of a JSON-RPC
// message or batch.
func peerPeekRPC(body []byte) (methods []string, id json.RawMessage) {
	type msg struct {
		Method string          `json:"method"`
		ID     json.RawMessage `json:"id"`
	}
	var msgs []msg
	b := bytes.TrimSpace(body)
	if len(b) > 0 && b[0] == '[' {
		if json.Unmarshal(b, &msgs) != nil {
			return nil, nil
		}
	} else {
		var m msg
		if json.Unmarshal(b, &m) != nil {
			return nil, nil
		}
		msgs = []msg{m}
	}
	for i, m := range msgs {
		if i == 0 {
			id = m.ID
		}
		if m.Method != "" {
			methods = append(methods, m.Method)
		}
	}
	return methods, id
}

// peerListen listens on addr, retrying for a while if the port is still in
// use (a previous incarnation's sockets; Go sets SO_REUSEADDR on Linux, so
// TIME_WAIT alone does not block it).
func peerListen(addr string) (net.Listener, error) {
	deadline := time.Now().Add(PeerTimeout)
	for {
		ln, err := net.Listen("tcp", addr)
		if err == nil {
			return ln, nil
		}
		if !errors.Is(err, syscall.EADDRINUSE) || time.Now().After(deadline) {
			return nil, err
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// ---------------------------------------------------------------------------
// go-sdk peer

type peerEchoIn struct {
	Text string `json:"text"`
}

type peerSlowIn struct {
	Steps   int `json:"steps"`
	DelayMs int `json:"delayMs"`
}

type peerNoIn struct{}

// startGoSDK starts a go-sdk v1.8.0 server (mcp.NewServer behind
// mcp.NewStreamableHTTPHandler) with these tools:
//
//   - echo {text}: returns text;
//   - slow {steps, delayMs}: sends steps progress notifications (progress
//     1..steps, total steps) delayMs apart on the request's progress token,
//     then returns "done";
//   - counter {} (no annotations, so not idempotent): increments the shared
//     counter and returns its new value as text, see peer.killOnCounter;
//   - ro_counter {} (ReadOnlyHint): same, same counter.
//
// With o.State it also has the session-state features:
//
//   - resources: peerResourceURI is listed and readable, and a
//     resources/subscribe to any URI is accepted (SubscribeHandler), so
//     UpdateResource reaches the sessions subscribed to it;
//   - log {level, text}: logs text at level through the calling session,
//     on the call's own stream (sent only at or above the session's
//     logging/setLevel, none before one), then returns "logged";
//   - sample {prompt}: asks the client for sampling/createMessage with
//     prompt as the user message, on the call's stream, and returns the text
//     the client sampled; it gives up after peerTimeout or when the
//     generation stops (ExpireSessions waits for it like for any handler).
//
// SetNextTools changes the tool list of later generations.
func startGoSDK(t testing.TB, o goSDKOpts) *peer {
	t.Helper()
	return newPeer(t, "go-sdk", func(p *peer, genCtx context.Context) *peerGen {
		sopts := &mcp.ServerOptions{SupportedProtocolVersions: o.Versions}
		if o.State {
			sopts.SubscribeHandler = func(context.Context, *mcp.SubscribeRequest) error { return nil }
			sopts.UnsubscribeHandler = func(context.Context, *mcp.UnsubscribeRequest) error { return nil }
		}
		srv := mcp.NewServer(&mcp.Implementation{Name: "peer-go-sdk", Version: "1.0.0"}, sopts)
		p.addGoSDKTools(srv, genCtx)
		if o.State {
			p.addGoSDKState(srv, genCtx)
		}
		if o.Polls {
			p.addGoSDKPoll(srv)
		}
		p.applyNextTools(srv)
		hopts := &mcp.StreamableHTTPOptions{
			Stateless:      o.Stateless,
			JSONResponse:   o.JSONResponse,
			SessionTimeout: o.SessionTimeout,
		}
		if o.EventStore {
			hopts.EventStore = mcp.NewMemoryEventStore(nil)
		}
		h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, hopts)
		closeAll := func() {
			for ss := range srv.Sessions() {
				_ = ss.Close()
			}
		}
		return &peerGen{handler: h, expire: closeAll, close: closeAll, sdk: srv}
	})
}

func peerText(s string) *mcp.CallToolResult {
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: s}}}
}

func (p *peer) addGoSDKTools(srv *mcp.Server, genCtx context.Context) {
	mcp.AddTool(srv, &mcp.Tool{Name: "echo", Description: "returns text"},
		func(_ context.Context, _ *mcp.CallToolRequest, in peerEchoIn) (*mcp.CallToolResult, any, error) {
			p.countTool("echo")
			return peerText(in.Text), nil, nil
		})
	mcp.AddTool(srv, &mcp.Tool{Name: "slow", Description: "progress steps, then done"},
		func(ctx context.Context, req *mcp.CallToolRequest, in peerSlowIn) (*mcp.CallToolResult, any, error) {
			p.countTool("slow")
			tok := req.Params.GetProgressToken()
			for i := 1; i <= in.Steps; i++ {
				if in.DelayMs > 0 {
					tm := time.NewTimer(time.Duration(in.DelayMs) * time.Millisecond)
					select {
					case <-tm.C:
					case <-ctx.Done():
						tm.Stop()
						return nil, nil, ctx.Err()
					case <-genCtx.Done():
						tm.Stop()
						return nil, nil, errors.New("server stopped")
					}
				}
				if tok == nil {
					continue
				}
				err := req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{
					ProgressToken: tok,
					Progress:      float64(i),
					Total:         float64(in.Steps),
					Message:       fmt.Sprintf("step %d/%d", i, in.Steps),
				})
				if err != nil {
					return nil, nil, err
				}
			}
			return peerText("done"), nil, nil
		})
	mcp.AddTool(srv, &mcp.Tool{Name: "counter", Description: "increments a counter (not idempotent)"},
		func(context.Context, *mcp.CallToolRequest, peerNoIn) (*mcp.CallToolResult, any, error) {
			return peerText(strconv.FormatInt(p.bumpCounter("counter"), 10)), nil, nil
		})
	mcp.AddTool(srv, &mcp.Tool{
		Name:        "ro_counter",
		Description: "increments a counter, but claims to be read-only",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true},
	}, func(context.Context, *mcp.CallToolRequest, peerNoIn) (*mcp.CallToolResult, any, error) {
		return peerText(strconv.FormatInt(p.bumpCounter("ro_counter"), 10)), nil, nil
	})
}

// peerSchema is an elicitation's schema: one string property.
func peerSchema(prop string) map[string]any {
	return map[string]any{"type": "object", "properties": map[string]any{prop: map[string]any{"type": "string"}}}
}

// peerAsk is the ask tool of a State go-sdk peer: it asks for input the
// way the Go SDK's multi-round input requests do (the SDK serves them to a
// session-era client as concurrent server requests, and hands the
// handler's second round back in its result): round 1 asks for a name
// (elicitation), a greeting (sampling) and the roots at once; round 2,
// given all three, asks for a colour with requestState "round2:<name>";
// given the colour and that state, it completes (counted as "ask").
func (p *peer) peerAsk(_ context.Context, req *mcp.CallToolRequest, _ peerNoIn) (*mcp.CallToolResult, any, error) {
	in := req.Params.InputResponses
	if st, ok := strings.CutPrefix(req.Params.RequestState, "round2:"); ok {
		colour := ""
		if e, ok := in["colour"].(*mcp.ElicitResult); ok && e.Action == "accept" {
			colour, _ = e.Content["colour"].(string)
		}
		if colour == "" {
			return nil, nil, errors.New("round 2 without a colour")
		}
		p.countTool("ask")
		return peerText(st + " likes " + colour), nil, nil
	}
	name, _ := in["name"].(*mcp.ElicitResult)
	_, greeted := in["greeting"].(*mcp.CreateMessageWithToolsResult)
	_, rooted := in["roots"].(*mcp.ListRootsResult)
	if name == nil || name.Action != "accept" || !greeted || !rooted {
		return &mcp.CallToolResult{InputRequests: mcp.InputRequestMap{
			"name": &mcp.ElicitParams{Message: "name?", RequestedSchema: peerSchema("name")},
			"greeting": &mcp.CreateMessageParams{MaxTokens: 8,
				Messages: []*mcp.SamplingMessage{{Role: "user", Content: &mcp.TextContent{Text: "greet"}}}},
			"roots": &mcp.ListRootsParams{},
		}}, nil, nil
	}
	who, _ := name.Content["name"].(string)
	return &mcp.CallToolResult{InputRequests: mcp.InputRequestMap{
		"colour": &mcp.ElicitParams{Message: "colour?", RequestedSchema: peerSchema("colour")},
	}, RequestState: "round2:" + who}, nil, nil
}

// peerResourceURI is the resource a State go-sdk peer lists.
const peerResourceURI = "test://peer/resource"

type peerLogIn struct {
	Level string `json:"level"`
	Text  string `json:"text"`
}

type peerSampleIn struct {
	Prompt string `json:"prompt"`
}

// addGoSDKPoll adds the o.Polls tool.
func (p *peer) addGoSDKPoll(srv *mcp.Server) {
	mcp.AddTool(srv, &mcp.Tool{Name: "poll", Description: "closes its answer stream on purpose, then answers"},
		func(ctx context.Context, req *mcp.CallToolRequest, in peerPollIn) (*mcp.CallToolResult, any, error) {
			p.countTool("poll")
			for i := 1; i <= in.Times; i++ {
				_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: "poll",
					Progress: float64(i), Message: fmt.Sprintf("poll %d", i)})
				if req.Extra != nil && req.Extra.CloseSSEStream != nil {
					req.Extra.CloseSSEStream(mcp.CloseSSEStreamArgs{RetryAfter: time.Duration(in.RetryMs) * time.Millisecond})
				}
				select {
				case <-time.After(time.Duration(in.DelayMs) * time.Millisecond):
				case <-ctx.Done():
					return nil, nil, ctx.Err()
				}
			}
			return peerText("polled"), nil, nil
		})
}

// addGoSDKState adds the o.State features to a generation's server.
func (p *peer) addGoSDKState(srv *mcp.Server, genCtx context.Context) {
	srv.AddResource(&mcp.Resource{URI: peerResourceURI, Name: "resource", MIMEType: "text/plain"},
		func(_ context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
			return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{
				{URI: req.Params.URI, MIMEType: "text/plain", Text: "resource"},
			}}, nil
		})
	mcp.AddTool(srv, &mcp.Tool{Name: "log", Description: "logs text at level through the session"},
		func(ctx context.Context, req *mcp.CallToolRequest, in peerLogIn) (*mcp.CallToolResult, any, error) {
			p.countTool("log")
			err := req.Session.Log(ctx, &mcp.LoggingMessageParams{
				Level: mcp.LoggingLevel(in.Level), Logger: "peer", Data: in.Text,
			})
			if err != nil {
				return nil, nil, err
			}
			return peerText("logged"), nil, nil
		})
	mcp.AddTool(srv, &mcp.Tool{Name: "sample", Description: "returns what the client samples for prompt"},
		func(ctx context.Context, req *mcp.CallToolRequest, in peerSampleIn) (*mcp.CallToolResult, any, error) {
			p.countTool("sample")
			// An answer that never comes must not outlive the generation:
			// closing a go-sdk session waits for its running handlers.
			ctx, cancel := context.WithTimeout(ctx, PeerTimeout)
			defer cancel()
			stop := context.AfterFunc(genCtx, cancel)
			defer stop()
			res, err := req.Session.CreateMessage(ctx, &mcp.CreateMessageParams{
				MaxTokens: 16,
				Messages:  []*mcp.SamplingMessage{{Role: "user", Content: &mcp.TextContent{Text: in.Prompt}}},
			})
			if err != nil {
				return nil, nil, err
			}
			tc, ok := res.Content.(*mcp.TextContent)
			if !ok {
				return nil, nil, fmt.Errorf("sampled %T, want text", res.Content)
			}
			return peerText(tc.Text), nil, nil
		})
	mcp.AddTool(srv, &mcp.Tool{Name: "ask", Description: "asks for a name, a greeting and the roots, then a colour"}, p.peerAsk)
	mcp.AddTool(srv, &mcp.Tool{Name: "ask_aside", Description: "asks for a name on the session's GET stream"},
		func(ctx context.Context, req *mcp.CallToolRequest, _ peerNoIn) (*mcp.CallToolResult, any, error) {
			// The call's answer stream begins (the Go SDK sends its head
			// with the first event; the TypeScript SDK's at once)...
			if err := req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: "aside", Progress: 1}); err != nil {
				return nil, nil, err
			}
			// ...then a context not of the call's request: the SDK sends the
			// elicitation on the standalone (GET) stream, as the TypeScript
			// SDK's elicitInput does.
			aside, cancel := context.WithTimeout(context.Background(), PeerTimeout)
			defer cancel()
			defer context.AfterFunc(genCtx, cancel)()
			res, err := req.Session.Elicit(aside, &mcp.ElicitParams{Message: "name?", RequestedSchema: peerSchema("name")})
			if err != nil {
				return nil, nil, err
			}
			p.countTool("ask_aside")
			name, _ := res.Content["name"].(string)
			return peerText("hello " + name), nil, nil
		})
	// What the SDK asks a client on a handler's behalf (ask's input
	// requests) must not outlive the generation either.
	srv.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			ctx, cancel := context.WithTimeout(ctx, PeerTimeout)
			defer cancel()
			defer context.AfterFunc(genCtx, cancel)()
			return next(ctx, method, req)
		}
	})
}

// SetNextTools changes the tool list of every go-sdk generation started
// from now on (Restart, Stop/Start, a crash): each name in add becomes one
// more tool that answers like echo, each name in drop is removed. The
// running generation keeps its tools.
func (p *peer) SetNextTools(add, drop []string) {
	p.toolMu.Lock()
	p.addTools, p.dropTools = slices.Clone(add), slices.Clone(drop)
	p.toolMu.Unlock()
}

// applyNextTools applies SetNextTools to a new generation's server, before
// it has sessions (so no list_changed is sent).
func (p *peer) applyNextTools(srv *mcp.Server) {
	p.toolMu.Lock()
	add, drop := p.addTools, p.dropTools
	p.toolMu.Unlock()
	for _, name := range add {
		mcp.AddTool(srv, &mcp.Tool{Name: name, Description: "returns text"},
			func(_ context.Context, _ *mcp.CallToolRequest, in peerEchoIn) (*mcp.CallToolResult, any, error) {
				p.countTool(name)
				return peerText(in.Text), nil, nil
			})
	}
	if len(drop) > 0 {
		srv.RemoveTools(drop...)
	}
}

// sdkServer returns the running generation's go-sdk server, or nil (peer
// stopped, or not a go-sdk peer).
func (p *peer) sdkServer() *mcp.Server {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.gen == nil {
		return nil
	}
	return p.gen.sdk
}

// UpdateResource has the running go-sdk generation send
// notifications/resources/updated for uri to every session subscribed to
// it. The notification goes on each session's standalone GET stream and is
// lost for a session that has none open at this moment.
func (p *peer) UpdateResource(uri string) {
	if srv := p.sdkServer(); srv != nil {
		_ = srv.ResourceUpdated(context.Background(), &mcp.ResourceUpdatedNotificationParams{URI: uri})
	}
}

// AddResource adds a resource to the running go-sdk generation, which then
// sends notifications/resources/list_changed (10 ms later) to all its
// sessions on their standalone GET streams: a notification no client
// request prompts and no session state gates.
func (p *peer) AddResource(uri string) {
	if srv := p.sdkServer(); srv != nil {
		srv.AddResource(&mcp.Resource{URI: uri, Name: uri}, func(context.Context, *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
			return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: uri, Text: uri}}}, nil
		})
	}
}

// LogAll has every session of the running go-sdk generation log text at
// level, unprompted (on its standalone GET stream); a session sends it only
// at or above its logging/setLevel.
func (p *peer) LogAll(level, text string) {
	srv := p.sdkServer()
	if srv == nil {
		return
	}
	for ss := range srv.Sessions() {
		_ = ss.Log(context.Background(), &mcp.LoggingMessageParams{
			Level: mcp.LoggingLevel(level), Logger: "peer", Data: text,
		})
	}
}

// SessionIDs returns the ids of the running go-sdk generation's sessions.
func (p *peer) SessionIDs() []string {
	srv := p.sdkServer()
	if srv == nil {
		return nil
	}
	var ids []string
	for ss := range srv.Sessions() {
		ids = append(ids, ss.ID())
	}
	return ids
}

// ---------------------------------------------------------------------------
// mcp-go peer

// startMCPGo starts a mark3labs/mcp-go v1.2.1 server with an echo {text}
// tool. stateful installs a session manager equivalent to
// server.WithStateful(true) (unknown ids: 404 text/plain "Invalid session
// ID") that ExpireSessions can reset, and advertises only the session-era
// protocol versions, so that a client's server/discover probe falls back to
// initialize and real sessions exist. !stateful is the mcp-go default: any
// well-formed id is accepted (expiry is invisible) and 2026-07-28 clients go
// sessionless.
func startMCPGo(t testing.TB, stateful bool) *peer {
	t.Helper()
	return newPeer(t, "mcp-go", func(p *peer, _ context.Context) *peerGen {
		s := mcpgoserver.NewMCPServer("peer-mcp-go", "1.0.0", mcpgoserver.WithToolCapabilities(false))
		s.AddTool(mcpgo.NewTool("echo", mcpgo.WithDescription("returns text"), mcpgo.WithString("text", mcpgo.Required())),
			func(_ context.Context, req mcpgo.CallToolRequest) (*mcpgo.CallToolResult, error) {
				p.countTool("echo")
				return mcpgo.NewToolResultText(req.GetString("text", "")), nil
			})
		opts := []mcpgoserver.StreamableHTTPOption{
			mcpgoserver.WithStreamableHTTPLogger(slog.New(slog.DiscardHandler)),
		}
		mgr := &peerMCPGoSessions{}
		mgr.reset()
		if stateful {
			opts = append(opts,
				mcpgoserver.WithSessionIdManager(mgr),
				mcpgoserver.WithStreamableHTTPProtocolVersions(
					mcpgo.ProtocolVersion20251125, mcpgo.ProtocolVersion20250618, mcpgo.ProtocolVersion20250326))
		}
		h := mcpgoserver.NewStreamableHTTPServer(s, opts...)
		expire := func() {
			if stateful {
				mgr.reset()
			}
		}
		closeGen := func() {
			ctx, cancel := context.WithTimeout(context.Background(), PeerTimeout)
			defer cancel()
			_ = h.Shutdown(ctx)
		}
		return &peerGen{handler: h, expire: expire, close: closeGen}
	})
}

// peerMCPGoSessions is mcp-go's InsecureStatefulSessionIdManager (what
// WithStateful(true) installs) behind a resettable pointer.
type peerMCPGoSessions struct {
	mu    sync.Mutex // protects inner
	inner *mcpgoserver.InsecureStatefulSessionIdManager
}

func (m *peerMCPGoSessions) reset() {
	m.mu.Lock()
	m.inner = &mcpgoserver.InsecureStatefulSessionIdManager{}
	m.mu.Unlock()
}

func (m *peerMCPGoSessions) get() *mcpgoserver.InsecureStatefulSessionIdManager {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.inner
}

func (m *peerMCPGoSessions) Generate() string { return m.get().Generate() }

func (m *peerMCPGoSessions) Validate(id string) (bool, error) { return m.get().Validate(id) }

func (m *peerMCPGoSessions) Terminate(id string) (bool, error) { return m.get().Terminate(id) }

// ---------------------------------------------------------------------------
// dialect peer

// startDialect starts a scripted MCP server (Streamable HTTP, session era)
// that answers:
//
//   - initialize: the requested protocolVersion, a fresh random
//     Mcp-Session-Id, tools capability;
//   - any other POST without an id: dialectMissing; with an unknown or
//     forgotten id: dialectExpired;
//   - on a live session: notifications and responses → 202; ping → {};
//     tools/list → the echo tool; tools/call echo {text} → text (counted in
//     ToolCalls("echo")); other tools → -32602; other methods → -32601;
//   - GET → 405; DELETE → 200 and the id is forgotten (unknown id:
//     dialectExpired).
//
// Success answers are application/json, except dialectSSE200 which frames
// every answer as one SSE event. Use Requests to see what it received.
func startDialect(t testing.TB, d dialect) *peer {
	t.Helper()
	return newPeer(t, "dialect-"+d.String(), func(p *peer, _ context.Context) *peerGen {
		g := &peerDialect{d: d, p: p, sessions: make(map[string]bool)}
		return &peerGen{handler: g, expire: g.forgetAll, close: g.forgetAll}
	})
}

type peerDialect struct {
	d dialect
	p *peer

	mu       sync.Mutex // protects sessions
	sessions map[string]bool
}

func (g *peerDialect) forgetAll() {
	g.mu.Lock()
	clear(g.sessions)
	g.mu.Unlock()
}

func (g *peerDialect) known(id string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.sessions[id]
}

func (g *peerDialect) write(w http.ResponseWriter, status int, contentType string, body []byte) {
	w.Header().Set("Content-Type", contentType)
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// reply writes a JSON-RPC message in the dialect's framing.
func (g *peerDialect) reply(w http.ResponseWriter, msg []byte) {
	if g.d == dialectSSE200 {
		g.write(w, http.StatusOK, "text/event-stream", []byte("event: message\ndata: "+string(msg)+"\n\n"))
		return
	}
	g.write(w, http.StatusOK, "application/json", msg)
}

func (g *peerDialect) result(w http.ResponseWriter, id json.RawMessage, result string) {
	g.reply(w, []byte(`{"jsonrpc":"2.0","id":`+string(id)+`,"result":`+result+`}`))
}

func (g *peerDialect) rpcError(w http.ResponseWriter, id json.RawMessage, code int, msg string) {
	m, _ := json.Marshal(msg)
	g.reply(w, []byte(`{"jsonrpc":"2.0","id":`+string(id)+`,"error":{"code":`+strconv.Itoa(code)+`,"message":`+string(m)+`}}`))
}

func (g *peerDialect) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	sid := r.Header.Get("Mcp-Session-Id")
	switch r.Method {
	case http.MethodPost:
	case http.MethodDelete:
		g.mu.Lock()
		ok := g.sessions[sid]
		delete(g.sessions, sid)
		g.mu.Unlock()
		if !ok {
			st, ct, b := dialectExpired(g.d, nil)
			g.write(w, st, ct, b)
			return
		}
		w.WriteHeader(http.StatusOK)
		return
	default:
		w.Header().Set("Allow", "POST, DELETE")
		http.Error(w, "Method Not Allowed", http.StatusMethodNotAllowed)
		return
	}
	body, _ := io.ReadAll(r.Body)
	var msg struct {
		ID     json.RawMessage `json:"id"`
		Method string          `json:"method"`
		Params json.RawMessage `json:"params"`
	}
	if err := json.Unmarshal(body, &msg); err != nil {
		g.write(w, http.StatusBadRequest, "application/json",
			[]byte(`{"jsonrpc":"2.0","error":{"code":-32700,"message":"Parse error"},"id":null}`))
		return
	}
	if msg.Method == "initialize" {
		var params struct {
			ProtocolVersion string `json:"protocolVersion"`
		}
		_ = json.Unmarshal(msg.Params, &params)
		if params.ProtocolVersion == "" {
			params.ProtocolVersion = "2025-03-26"
		}
		id := rand.Text()
		g.mu.Lock()
		g.sessions[id] = true
		g.mu.Unlock()
		v, _ := json.Marshal(params.ProtocolVersion)
		w.Header().Set("Mcp-Session-Id", id)
		g.result(w, msg.ID, `{"protocolVersion":`+string(v)+`,"capabilities":{"tools":{}},"serverInfo":{"name":"peer-dialect-`+g.d.String()+`","version":"1.0.0"}}`)
		return
	}
	if sid == "" {
		st, ct, b := dialectMissing(g.d, msg.ID)
		g.write(w, st, ct, b)
		return
	}
	if !g.known(sid) {
		st, ct, b := dialectExpired(g.d, msg.ID)
		g.write(w, st, ct, b)
		return
	}
	if len(msg.ID) == 0 || msg.Method == "" { // notification or response
		w.WriteHeader(http.StatusAccepted)
		return
	}
	switch msg.Method {
	case "ping":
		g.result(w, msg.ID, `{}`)
	case "tools/list":
		g.result(w, msg.ID, `{"tools":[{"name":"echo","description":"returns text","inputSchema":{"type":"object","properties":{"text":{"type":"string"}},"required":["text"]}}]}`)
	case "tools/call":
		var call struct {
			Name      string `json:"name"`
			Arguments struct {
				Text string `json:"text"`
			} `json:"arguments"`
		}
		_ = json.Unmarshal(msg.Params, &call)
		if call.Name != "echo" {
			g.rpcError(w, msg.ID, -32602, "Unknown tool: "+call.Name)
			return
		}
		g.p.countTool("echo")
		text, _ := json.Marshal(call.Arguments.Text)
		g.result(w, msg.ID, `{"content":[{"type":"text","text":`+string(text)+`}]}`)
	default:
		g.rpcError(w, msg.ID, -32601, "Method not found")
	}
}

// ---------------------------------------------------------------------------
// clients

// goSDKClient connects a go-sdk v1.8.0 client (StreamableClientTransport,
// default options, its own connection pool) to url and closes it in
// cleanup. It speaks the session era (initialize 2025-11-25): the tests of
// session-era agents use it; goSDK2026Client is the same client speaking
// MCP 2026-07-28.
func goSDKClient(t testing.TB, url string) *mcp.ClientSession {
	t.Helper()
	return goSDKClientWith(t, url, nil)
}

// goSDKClientWith is goSDKClient with client options (handlers such as
// ProgressNotificationHandler).
func goSDKClientWith(t testing.TB, url string, opts *mcp.ClientOptions) *mcp.ClientSession {
	t.Helper()
	cs, err := goSDKConnect(t, url, opts)
	if err != nil {
		t.Fatalf("go-sdk client connect %s: %v", url, err)
	}
	return cs
}

// goSDKConnect is goSDKClientWith returning the connect error instead of
// failing the test.
func goSDKConnect(t testing.TB, url string, opts *mcp.ClientOptions) (*mcp.ClientSession, error) {
	t.Helper()
	return goSDKConnectVia(t, url, opts, nil)
}

// goSDKClientVia is goSDKClientWith whose HTTP requests go through
// wrap(transport), e.g. to record the wire traffic between client and proxy.
func goSDKClientVia(t testing.TB, url string, opts *mcp.ClientOptions, wrap func(http.RoundTripper) http.RoundTripper) *mcp.ClientSession {
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
	ctx, cancel := context.WithTimeout(context.Background(), PeerTimeout)
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

// goSDK2026Client connects a go-sdk v1.8.0 client as it comes (it asks
// server/discover first), which through mcpheal speaks MCP 2026-07-28.
func goSDK2026Client(t testing.TB, url string, opts *mcp.ClientOptions) *mcp.ClientSession {
	t.Helper()
	tr := &http.Transport{}
	c := mcp.NewClient(&mcp.Implementation{Name: "peer-test-go-sdk-2026", Version: "1.0.0"}, opts)
	ctx, cancel := context.WithTimeout(context.Background(), PeerTimeout)
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

// goSDKCall calls a tool with a peerTimeout deadline and returns the SDK's
// answer unchanged.
func goSDKCall(t testing.TB, cs *mcp.ClientSession, name string, args any) (*mcp.CallToolResult, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), PeerTimeout)
	defer cancel()
	return cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
}

// peerResultText returns the text of a single-text-content result, or a
// description of what it was instead.
func peerResultText(res *mcp.CallToolResult) string {
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

// callEcho calls echo {text} and fails the test unless text comes back.
func callEcho(t testing.TB, cs *mcp.ClientSession, text string) {
	t.Helper()
	res, err := goSDKCall(t, cs, "echo", map[string]any{"text": text})
	if err != nil {
		t.Fatalf("echo(%q): %v", text, err)
	}
	if got := peerResultText(res); got != text {
		t.Fatalf("echo(%q) = %q, want %q", text, got, text)
	}
}

// mcpGoClient starts and initializes a mark3labs/mcp-go v1.2.1 streamable
// HTTP client (default options: it probes server/discover first) and closes
// it in cleanup.
func mcpGoClient(t testing.TB, url string) *mcpgoclient.Client {
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
	ctx, cancel := context.WithTimeout(context.Background(), PeerTimeout)
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

// mcpGoCall calls a tool through an mcp-go client with a peerTimeout deadline.
func mcpGoCall(t testing.TB, c *mcpgoclient.Client, name string, args map[string]any) (*mcpgo.CallToolResult, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), PeerTimeout)
	defer cancel()
	var req mcpgo.CallToolRequest
	req.Params.Name = name
	req.Params.Arguments = args
	return c.CallTool(ctx, req)
}

// mcpGoCallEcho calls echo {text} through an mcp-go client and fails the
// test unless text comes back.
func mcpGoCallEcho(t testing.TB, c *mcpgoclient.Client, text string) {
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

// peerRawClient sends raw requests without keep-alive, so no idle socket
// outlives a test or points at a killed peer.
var peerRawClient = &http.Client{
	Transport: &http.Transport{DisableKeepAlives: true},
	Timeout:   PeerTimeout,
}

// peerRawPost POSTs one JSON-RPC message as a session-era MCP client would
// (Content-Type application/json, Accept application/json and
// text/event-stream, MCP-Protocol-Version 2025-11-25, Mcp-Session-Id if
// sessionID != "") and returns the answer with its whole body.
func peerRawPost(t testing.TB, url, sessionID, body string) (*http.Response, []byte) {
	t.Helper()
	return peerRawDo(t, peerPostRequest(t, url, sessionID, body))
}

// peerPostRequest builds the POST that peerRawPost sends.
func peerPostRequest(t testing.TB, url, sessionID, body string) *http.Request {
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

// peerRawDo sends req with peerRawClient and reads the whole answer.
func peerRawDo(t testing.TB, req *http.Request) (*http.Response, []byte) {
	t.Helper()
	resp, err := peerRawClient.Do(req)
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

// peerRawInitialize runs the 2025-11-25 handshake (initialize, then
// notifications/initialized) with raw requests and returns the session id.
func peerRawInitialize(t testing.TB, url string) string {
	t.Helper()
	resp, body := peerRawPost(t, url, "",
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"peer-raw","version":"1.0.0"}}}`)
	sid := resp.Header.Get("Mcp-Session-Id")
	if resp.StatusCode != http.StatusOK || sid == "" {
		t.Fatalf("raw initialize: %d, session %q, body %q", resp.StatusCode, sid, body)
	}
	resp, body = peerRawPost(t, url, sid, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("raw notifications/initialized: %d %q", resp.StatusCode, body)
	}
	return sid
}

// peerWait polls cond every 2 ms until it holds or peerTimeout passes.
func PeerWait(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(PeerTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", PeerTimeout, what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// Self-tests of the peers and clients in peers_test.go, without the proxy:
// each proves that a peer really behaves the way the heal tests rely on.

func TestPeersGoSDKEcho(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		opts goSDKOpts
		sse  bool // tools/call answered with text/event-stream
	}{
		{"sse", goSDKOpts{}, true},
		{"json", goSDKOpts{JSONResponse: true}, false},
		{"stateless", goSDKOpts{Stateless: true}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := startGoSDK(t, tc.opts)
			cs := goSDK2026Client(t, p.URL(), nil) // as it comes: it probes server/discover
			callEcho(t, cs, "hello")
			callEcho(t, cs, "again")
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
				sid = peerRawInitialize(t, p.URL())
			}
			resp, body := peerRawPost(t, p.URL(), sid, `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"echo","arguments":{"text":"raw"}}}`)
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
	p := startGoSDK(t, goSDKOpts{})
	cs := goSDKClient(t, p.URL())
	callEcho(t, cs, "before")
	sid := peerRawInitialize(t, p.URL())

	p.ExpireSessions()

	if _, err := goSDKCall(t, cs, "echo", map[string]any{"text": "after"}); err == nil {
		t.Fatal("echo after ExpireSessions succeeded, want an error")
	} else {
		t.Logf("go-sdk client after expiry: %v (ErrSessionMissing=%v)", err, errors.Is(err, mcp.ErrSessionMissing))
	}
	resp, body := peerRawPost(t, p.URL(), sid, `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo","arguments":{"text":"x"}}}`)
	if resp.StatusCode != http.StatusNotFound || string(body) != "session not found\n" ||
		!strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain") {
		t.Errorf("expired id: %d %q %q, want 404 text/plain %q", resp.StatusCode, resp.Header.Get("Content-Type"), body, "session not found\n")
	}
	// The server itself is fine: a new client works.
	callEcho(t, goSDKClient(t, p.URL()), "new")
	if got := p.Inits(); got != 3 {
		t.Errorf("Inits() = %d, want 3", got)
	}
}

func TestPeersGoSDKSessionTimeout(t *testing.T) {
	t.Parallel()
	const idle = 50 * time.Millisecond
	p := startGoSDK(t, goSDKOpts{SessionTimeout: idle})
	sid := peerRawInitialize(t, p.URL())
	// Every request restarts the idle timer, so poll slower than it.
	deadline := time.Now().Add(PeerTimeout)
	for {
		time.Sleep(2 * idle)
		resp, body := peerRawPost(t, p.URL(), sid, `{"jsonrpc":"2.0","id":3,"method":"ping"}`)
		if resp.StatusCode == http.StatusNotFound {
			if string(body) != "session not found\n" {
				t.Errorf("idle-expired id: 404 %q, want %q", body, "session not found\n")
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("session still alive after %v idle: %d %q", PeerTimeout, resp.StatusCode, body)
		}
	}
}

// TestPeersGoSDKForeignHost: a loopback go-sdk server refuses a non-loopback
// Host (DNS-rebinding protection), so the proxy must send the upstream's host.
func TestPeersGoSDKForeignHost(t *testing.T) {
	t.Parallel()
	p := startGoSDK(t, goSDKOpts{})
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
		resp, body := peerRawDo(t, req)
		if resp.StatusCode != tc.want {
			t.Errorf("Host %q: %d %q, want %d", tc.host, resp.StatusCode, body, tc.want)
		}
	}
}

func TestPeersGoSDKRestart(t *testing.T) {
	t.Parallel()
	p := startGoSDK(t, goSDKOpts{})
	url := p.URL()
	old := goSDKClient(t, url)
	callEcho(t, old, "before")

	for i := range 3 {
		p.Restart()
		if p.URL() != url {
			t.Fatalf("restart %d moved the peer: %s, want %s", i, p.URL(), url)
		}
		callEcho(t, goSDKClient(t, url), "fresh")
	}
	if _, err := goSDKCall(t, old, "echo", map[string]any{"text": "stale"}); err == nil {
		t.Error("old client call after Restart succeeded, want an error")
	}
	if got := p.Inits(); got != 4 {
		t.Errorf("Inits() = %d, want 4", got)
	}
}

func TestPeersGoSDKStopStart(t *testing.T) {
	t.Parallel()
	p := startGoSDK(t, goSDKOpts{})
	cs := goSDKClient(t, p.URL())
	p.Stop()
	if _, err := goSDKCall(t, cs, "echo", map[string]any{"text": "down"}); err == nil {
		t.Error("call to a stopped peer succeeded")
	}
	if _, err := peerRawClient.Get(p.URL()); err == nil || !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("GET on a stopped peer: %v, want connection refused", err)
	}
	p.Start()
	callEcho(t, goSDKClient(t, p.URL()), "up")
}

// TestPeersGoSDKSlowProgress: slow delivers every progress notification on
// the call's stream before the result.
func TestPeersGoSDKSlowProgress(t *testing.T) {
	t.Parallel()
	p := startGoSDK(t, goSDKOpts{})
	var (
		mu   sync.Mutex
		seen []float64
	)
	cs := goSDKClientWith(t, p.URL(), &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
			mu.Lock()
			seen = append(seen, req.Params.Progress)
			mu.Unlock()
		},
	})
	const steps = 4
	params := &mcp.CallToolParams{Name: "slow", Arguments: map[string]any{"steps": steps, "delayMs": 10}}
	params.SetProgressToken("tok-1")
	ctx, cancel := context.WithTimeout(context.Background(), PeerTimeout)
	defer cancel()
	start := time.Now()
	res, err := cs.CallTool(ctx, params)
	if err != nil {
		t.Fatalf("slow: %v", err)
	}
	if got := peerResultText(res); got != "done" {
		t.Fatalf("slow = %q, want done", got)
	}
	if d := time.Since(start); d < steps*10*time.Millisecond {
		t.Errorf("slow returned after %v, want at least %v", d, steps*10*time.Millisecond)
	}
	// The client hands notifications to the handler asynchronously, so
	// the last ones may land just after CallTool returns.
	PeerWait(t, "all progress notifications", func() bool {
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
	sid := peerRawInitialize(t, p.URL())
	resp, body := peerRawPost(t, p.URL(), sid,
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
	p := startGoSDK(t, goSDKOpts{})
	cs := goSDKClient(t, p.URL())
	errc := make(chan error, 1)
	go func() {
		_, err := goSDKCall(t, cs, "slow", map[string]any{"steps": 1, "delayMs": 60_000})
		errc <- err
	}()
	PeerWait(t, "slow to start", func() bool { return p.ToolCalls("slow") == 1 })
	start := time.Now()
	p.Restart()
	if err := <-errc; err == nil {
		t.Error("slow call across a Restart succeeded")
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("Restart with a running slow tool took %v", d)
	}
}

// TestPeersGoSDKCounterKill: with killOnCounter the tool runs, the connection
// dies before the answer, the client sees an error, and the server comes back
// on the same port without the old sessions.
func TestPeersGoSDKCounterKill(t *testing.T) {
	t.Parallel()
	for _, tool := range []string{"counter", "ro_counter"} {
		t.Run(tool, func(t *testing.T) {
			t.Parallel()
			p := startGoSDK(t, goSDKOpts{})
			cs := goSDKClient(t, p.URL())
			p.killOnCounter.Store(true)
			res, err := goSDKCall(t, cs, tool, map[string]any{})
			if err == nil {
				t.Fatalf("%s with kill = %q, want an error", tool, peerResultText(res))
			}
			t.Logf("go-sdk client on a killed connection: %v", err)
			if got := p.Counter(); got != 1 {
				t.Errorf("Counter() = %d, want 1", got)
			}
			if got := p.Crashes(); got != 1 {
				t.Errorf("Crashes() = %d, want 1", got)
			}
			if p.killOnCounter.Load() {
				t.Error("killOnCounter still set after the crash")
			}
			if _, err := goSDKCall(t, cs, "echo", map[string]any{"text": "stale"}); err == nil {
				t.Error("old session survived the crash")
			}
			cs2 := goSDKClient(t, p.URL())
			res, err = goSDKCall(t, cs2, tool, map[string]any{})
			if err != nil || peerResultText(res) != "2" {
				t.Errorf("%s after crash = %q, %v; want \"2\"", tool, peerResultText(res), err)
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
	p := startGoSDK(t, goSDKOpts{})
	cs := goSDKClient(t, p.URL())
	ctx, cancel := context.WithTimeout(context.Background(), PeerTimeout)
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
		p := startMCPGo(t, true)
		c := mcpGoClient(t, p.URL())
		mcpGoCallEcho(t, c, "hello")
		if c.GetSessionId() == "" || !strings.HasPrefix(c.GetSessionId(), "mcp-session-") {
			t.Errorf("session id = %q, want mcp-session-<uuid>", c.GetSessionId())
		}
		if p.Inits() != 1 || p.Calls("server/discover") != 1 {
			t.Errorf("Inits() = %d, server/discover = %d; want 1 and 1", p.Inits(), p.Calls("server/discover"))
		}
		sid := peerRawInitialize(t, p.URL())

		p.ExpireSessions()

		if _, err := mcpGoCall(t, c, "echo", map[string]any{"text": "after"}); err == nil {
			t.Error("mcp-go echo after ExpireSessions succeeded")
		} else {
			t.Logf("mcp-go client after expiry: %v", err)
		}
		resp, body := peerRawPost(t, p.URL(), sid, `{"jsonrpc":"2.0","id":2,"method":"ping"}`)
		if resp.StatusCode != http.StatusNotFound || string(body) != "Invalid session ID\n" {
			t.Errorf("expired id: %d %q, want 404 %q", resp.StatusCode, body, "Invalid session ID\n")
		}
		mcpGoCallEcho(t, mcpGoClient(t, p.URL()), "new")

		p.Restart()
		mcpGoCallEcho(t, mcpGoClient(t, p.URL()), "restarted")
	})
	t.Run("default", func(t *testing.T) {
		t.Parallel()
		p := startMCPGo(t, false)
		c := mcpGoClient(t, p.URL())
		mcpGoCallEcho(t, c, "hello")
		// The default server advertises 2026-07-28: the client goes
		// sessionless and never sends initialize.
		if p.Inits() != 0 || c.GetSessionId() != "" {
			t.Errorf("Inits() = %d, session %q; want 0 and none", p.Inits(), c.GetSessionId())
		}
		// Format-only ids: an id it never issued is accepted.
		resp, body := peerRawPost(t, p.URL(), "mcp-session-6f1c3d1e-8f55-4a7c-9d0e-0123456789ab", `{"jsonrpc":"2.0","id":2,"method":"ping"}`)
		if resp.StatusCode != http.StatusOK {
			t.Errorf("unknown well-formed id: %d %q, want 200", resp.StatusCode, body)
		}
	})
	t.Run("go-sdk client", func(t *testing.T) {
		t.Parallel()
		p := startMCPGo(t, true)
		cs := goSDKClient(t, p.URL())
		callEcho(t, cs, "cross")
		if p.Inits() != 1 {
			t.Errorf("Inits() = %d, want 1 (legacy handshake)", p.Inits())
		}
		p.ExpireSessions()
		if _, err := goSDKCall(t, cs, "echo", map[string]any{"text": "after"}); err == nil {
			t.Error("go-sdk echo on mcp-go after ExpireSessions succeeded")
		}
	})
}

func TestPeersDialect(t *testing.T) {
	t.Parallel()
	for _, d := range []dialect{dialectTS400, dialectWP200, dialectSSE200} {
		t.Run(d.String(), func(t *testing.T) {
			t.Parallel()
			p := startDialect(t, d)
			cs := goSDKClient(t, p.URL())
			callEcho(t, cs, "hello")
			if p.Inits() != 1 || p.ToolCalls("echo") != 1 {
				t.Errorf("Inits() = %d, ToolCalls(echo) = %d; want 1 and 1", p.Inits(), p.ToolCalls("echo"))
			}
			sid := peerRawInitialize(t, p.URL())
			resp, body := peerRawPost(t, p.URL(), sid, `{"jsonrpc":"2.0","id":5,"method":"ping"}`)
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
				resp, body := peerRawPost(t, p.URL(), sid, tc.body)
				st, ct, want := dialectExpired(d, []byte(tc.id))
				if resp.StatusCode != st || resp.Header.Get("Content-Type") != ct || !bytes.Equal(body, want) {
					t.Errorf("%s expired:\n got %d %q %q\nwant %d %q %q", tc.body, resp.StatusCode, resp.Header.Get("Content-Type"), body, st, ct, want)
				}
			}
			if _, err := goSDKCall(t, cs, "echo", map[string]any{"text": "after"}); err == nil {
				t.Error("go-sdk echo after ExpireSessions succeeded")
			} else {
				t.Logf("go-sdk client on expired %s: %v", d, err)
			}
			// Every request carries the id it was sent with.
			var last peerRequest
			for _, r := range p.Requests() {
				if r.RPCMethod == "tools/call" {
					last = r
				}
			}
			if last.SessionID == "" || last.HTTPMethod != http.MethodPost || len(last.Body) == 0 {
				t.Errorf("last recorded tools/call = %+v", last)
			}
			callEcho(t, goSDKClient(t, p.URL()), "new")
		})
	}
}

// TestPeersDialectMissingID: a non-initialize POST without a session id gets a
// 400 JSON-RPC error (what makes the go-sdk discover probe fall back).
func TestPeersDialectMissingID(t *testing.T) {
	t.Parallel()
	for _, d := range []dialect{dialectTS400, dialectWP200, dialectSSE200} {
		p := startDialect(t, d)
		resp, body := peerRawPost(t, p.URL(), "", `{"jsonrpc":"2.0","id":9,"method":"tools/list"}`)
		st, ct, want := dialectMissing(d, []byte(`9`))
		if resp.StatusCode != st || resp.Header.Get("Content-Type") != ct || !bytes.Equal(body, want) {
			t.Errorf("%s: got %d %q %q, want %d %q %q", d, resp.StatusCode, resp.Header.Get("Content-Type"), body, st, ct, want)
		}
	}
}
