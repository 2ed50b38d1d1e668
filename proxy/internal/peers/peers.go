// Package peers holds the real MCP upstreams and real SDK clients that
// mcpheal's tests drive, shared by the tests of proxy/ and its internal
// packages (it is imported by tests only; the mcpheal binary links none of
// it).
//
// Three kinds of upstream ("peer", a *Server) run on 127.0.0.1 and stop by
// themselves in t.Cleanup:
//
//   - StartGoSDK: the official Go SDK server (go-sdk v1.8.0);
//   - StartMCPGo: mark3labs/mcp-go v1.2.1;
//   - StartDialect: a scripted fake for session-loss dialects no SDK produces
//     (TS example 400, WordPress HTTP 200, SSE-framed HTTP 200), see
//     the class table of docs/healing.md.
//
// Every peer records each HTTP request it receives (Request), counts
// JSON-RPC methods, and can be restarted on the same port (all sessions lost),
// stopped, started again and told to forget its sessions. The clients are
// the SDKs' own: GoSDKClient (go-sdk) and McpGoClient (mcp-go). Script is
// the one keyed scripted fake, for the faults no real peer makes. TCPRelay
// stands between mcpheal and any upstream, in-process or a child process
// (proxy/interop): it counts the connections mcpheal opens and plays the
// network's faults (an idle flow reset or blackholed, a host down, a
// request or an answer cut). CheckGoroutines fails a test that leaves
// goroutines behind.
package peers

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Timeout bounds every single exchange the helpers make (connect, call,
// raw POST) and every wait for a peer to come up or drain.
const Timeout = 5 * time.Second

// GoSDKOpts configures StartGoSDK; the zero value is a stateful server
// answering with text/event-stream and never expiring idle sessions.
type GoSDKOpts struct {
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
	// resources (ResourceURI and any other URI; see UpdateResource) and
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

// Request is one HTTP request as a peer received it.
type Request struct {
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
type Server struct {
	tb     testing.TB
	name   string
	newGen func(p *Server, ctx context.Context) *peerGen

	// counter is shared by the counter and ro_counter tools (toolCalls tells
	// them apart).
	counter atomic.Int64
	// KillOnCounter, when set, makes the next counter or ro_counter call crash
	// the server right after incrementing: listener and every connection are
	// closed with RST before the answer is written, then a fresh server (no
	// sessions) starts on the same port. It is one-shot: the crashing call
	// clears it, so a replay by the proxy runs normally.
	KillOnCounter atomic.Bool
	inits         atomic.Int64
	InitDelay     atomic.Int64 // nanoseconds each initialize waits before it is served
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
	reqs      []Request
	methods   map[string]int64
	toolCalls map[string]int64

	bg sync.WaitGroup // generation closers started by a crash

	toolMu    sync.Mutex // protects addTools, dropTools
	addTools  []string   // see SetNextTools
	dropTools []string
}

func newPeer(tb testing.TB, name string, newGen func(p *Server, ctx context.Context) *peerGen) *Server {
	tb.Helper()
	p := &Server{
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
func (p *Server) URL() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return "http://" + p.addr + "/mcp"
}

// Addr returns "127.0.0.1:port".
func (p *Server) Addr() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.addr
}

// Inits counts initialize requests received, whatever their outcome.
func (p *Server) Inits() int64 { return p.inits.Load() }

// Counter returns the shared counter of the counter and ro_counter tools.
func (p *Server) Counter() int64 { return p.counter.Load() }

// Crashes counts kills made by KillOnCounter.
func (p *Server) Crashes() int64 { return p.crashes.Load() }

// Calls counts POSTed JSON-RPC messages by method ("initialize",
// "tools/call", "notifications/initialized", …; batches count each element).
func (p *Server) Calls(method string) int64 {
	p.recMu.Lock()
	defer p.recMu.Unlock()
	return p.methods[method]
}

// ToolCalls counts executions of the named tool (go-sdk and mcp-go peers:
// handler runs; dialect peers: tools/call requests on a live session).
func (p *Server) ToolCalls(name string) int64 {
	p.recMu.Lock()
	defer p.recMu.Unlock()
	return p.toolCalls[name]
}

// Requests returns a copy of every request received so far, in arrival order.
func (p *Server) Requests() []Request {
	p.recMu.Lock()
	defer p.recMu.Unlock()
	out := make([]Request, len(p.reqs))
	copy(out, p.reqs)
	return out
}

// ExpireSessions forgets every session while the server stays up: go-sdk
// closes each ServerSession (404 "session not found" afterwards; this waits
// for tool calls still running on them), mcp-go stateful forgets its ids
// (404 "Invalid session ID"; a no-op for the format-only default manager),
// dialect peers forget their ids (dialectExpired afterwards).
func (p *Server) ExpireSessions() {
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
func (p *Server) Restart() {
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
func (p *Server) Stop() {
	p.mu.Lock()
	old := p.stopLocked()
	p.mu.Unlock()
	if old != nil {
		old.close()
	}
}

// Start brings a stopped peer back on the same port with no sessions. It is a
// no-op on a running peer.
func (p *Server) Start() {
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

// crash is the KillOnCounter path. It runs inside a tool handler of the
// generation it kills, so that generation is closed in the background: a
// go-sdk ServerSession.Close waits for the very handler calling crash.
func (p *Server) crash() {
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
func (p *Server) startLocked() error {
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
		ReadHeaderTimeout: Timeout,
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
func (p *Server) stopLocked() *peerGen {
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

func (p *Server) shutdown() {
	p.mu.Lock()
	p.closed = true
	old := p.stopLocked()
	p.mu.Unlock()
	if old != nil {
		old.close()
	}
	p.bg.Wait()
	deadline := time.Now().Add(Timeout)
	for p.inflight.Load() > 0 {
		if time.Now().After(deadline) {
			p.tb.Errorf("%s peer: %d HTTP handlers still running %v after stop", p.name, p.inflight.Load(), Timeout)
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func (p *Server) trackConn(c net.Conn, st http.ConnState) {
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
func (p *Server) record(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.inflight.Add(1)
		defer p.inflight.Add(-1)
		rec := Request{
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
		if d := p.InitDelay.Load(); d > 0 && slices.Contains(methods, "initialize") {
			time.Sleep(time.Duration(d)) // a slow initialize: heals overlap
		}
		h.ServeHTTP(w, r)
	})
}

func (p *Server) countTool(name string) {
	p.recMu.Lock()
	p.toolCalls[name]++
	p.recMu.Unlock()
}

// bumpCounter runs the counter and ro_counter tools.
func (p *Server) bumpCounter(tool string) int64 {
	p.countTool(tool)
	n := p.counter.Add(1)
	if p.KillOnCounter.CompareAndSwap(true, false) {
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
	deadline := time.Now().Add(Timeout)
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
