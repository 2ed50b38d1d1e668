package proxy

// ledger is a session-era MCP server on net/http that accepts every request
// on a live session (resources/subscribe, logging/setLevel, ping, ...) with
// an empty result and writes each one down, so that tests count what really
// reached the upstream, server-side: initializes, every request with its
// session and params, and the DELETEs that ended its sessions.

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcpheal/mcpheal/proxy/internal/peers"
	"github.com/tidwall/gjson"
)

type ledger struct {
	url string
	// stateless: initialize names no session (no Mcp-Session-Id), and
	// every request is served without one, as a stateless server does.
	stateless bool
	inits     atomic.Int64
	streams   atomic.Int64 // GET streams open

	mu       sync.Mutex // protects sessions, got, deletes, hold
	sessions map[string]bool
	// hold, when not nil, keeps every resources/subscribe waiting for its
	// answer until it is closed, once written down.
	hold    chan struct{}
	got     []ledgerEntry
	deletes []string // upstream session ids DELETEd
}

// ledgerEntry is one JSON-RPC message the server accepted: an initialize
// (Session is the one it created), or a message on a live session.
type ledgerEntry struct {
	Session string
	Method  string
	ID      string // raw JSON; mcpheal's own requests have "mcpheal-…" ids
	URI     string // params.uri
	Params  string // params, raw JSON
}

func startLedger(t testing.TB, stateless bool) *ledger {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := &ledger{url: "http://" + ln.Addr().String() + "/mcp", stateless: stateless, sessions: map[string]bool{}}
	srv := &http.Server{Handler: l, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return l
}

// Expire forgets every session: the next request on one gets 404, as from
// a server that restarted.
func (l *ledger) Expire() {
	l.mu.Lock()
	defer l.mu.Unlock()
	clear(l.sessions)
}

// Hold makes resources/subscribe answers wait until the returned channel
// is closed.
func (l *ledger) Hold() chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.hold = make(chan struct{})
	return l.hold
}

// Got returns the accepted messages of method, in order.
func (l *ledger) Got(method string) []ledgerEntry {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []ledgerEntry
	for _, e := range l.got {
		if e.Method == method {
			out = append(out, e)
		}
	}
	return out
}

// URIs returns the params.uri of the accepted messages of method on the
// upstream session sid ("" for any), in order.
func (l *ledger) URIs(method, sid string) []string {
	var out []string
	for _, e := range l.Got(method) {
		if sid == "" || e.Session == sid {
			out = append(out, e.URI)
		}
	}
	return out
}

// Deletes returns the upstream session ids DELETEd so far.
func (l *ledger) Deletes() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.deletes)
}

// Sessions returns the upstream session ids created so far, in order.
func (l *ledger) Sessions() []string {
	var out []string
	for i := range l.inits.Load() {
		out = append(out, fmt.Sprintf("s-%d", i+1))
	}
	return out
}

func (l *ledger) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	sid := r.Header.Get("Mcp-Session-Id")
	switch r.Method {
	case http.MethodDelete:
		l.mu.Lock()
		l.deletes = append(l.deletes, sid)
		delete(l.sessions, sid)
		l.mu.Unlock()
		w.WriteHeader(http.StatusOK)
		return
	case http.MethodGet:
		l.stream(w, r, sid)
		return
	case http.MethodPost:
	default:
		w.WriteHeader(http.StatusMethodNotAllowed)
		return
	}
	var msg struct {
		ID     json.RawMessage `json:"id"`
		Method string          `json:"method"`
		Params json.RawMessage `json:"params"`
	}
	if err := json.NewDecoder(r.Body).Decode(&msg); err != nil {
		http.Error(w, "bad json", http.StatusBadRequest)
		return
	}
	if msg.Method == "initialize" {
		n := l.inits.Add(1)
		sid = ""
		if !l.stateless {
			sid = fmt.Sprintf("s-%d", n)
			w.Header().Set("Mcp-Session-Id", sid)
		}
		l.mu.Lock()
		if sid != "" {
			l.sessions[sid] = true
		}
		l.got = append(l.got, ledgerEntry{Session: sid, Method: msg.Method, ID: string(msg.ID), Params: string(msg.Params)})
		l.mu.Unlock()
		writeJSON(w, msg.ID, `{"protocolVersion":"2025-11-25","capabilities":{"logging":{},"resources":{"subscribe":true}},`+
			`"serverInfo":{"name":"ledger","version":"1"}}`)
		return
	}
	if !l.stateless {
		l.mu.Lock()
		live := l.sessions[sid]
		l.mu.Unlock()
		switch {
		case sid == "":
			http.Error(w, "Bad Request: Mcp-Session-Id header is required", http.StatusBadRequest)
			return
		case !live:
			http.Error(w, "session not found", http.StatusNotFound)
			return
		}
	}
	var p struct {
		URI string `json:"uri"`
	}
	_ = json.Unmarshal(msg.Params, &p)
	l.mu.Lock()
	l.got = append(l.got, ledgerEntry{Session: sid, Method: msg.Method, ID: string(msg.ID), URI: p.URI, Params: string(msg.Params)})
	hold := l.hold
	l.mu.Unlock()
	if hold != nil && msg.Method == "resources/subscribe" {
		select {
		case <-hold:
		case <-r.Context().Done():
			return
		}
	}
	if len(msg.ID) == 0 || strings.HasPrefix(msg.Method, "notifications/") {
		w.WriteHeader(http.StatusAccepted)
		return
	}
	writeJSON(w, msg.ID, `{}`)
}

// agentRPC POSTs one JSON-RPC message as an agent and returns the HTTP
// status and the JSON-RPC answer.
func agentRPC(t testing.TB, url, sid, body string) (int, gjson.Result) {
	t.Helper()
	resp, raw := peers.RawPost(t, url, sid, body)
	return resp.StatusCode, rpcAnswer(raw)
}

// agentDelete ends the agent's session and returns the HTTP status.
func agentDelete(t testing.TB, url, sid string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodDelete, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Mcp-Session-Id", sid)
	resp, _ := peers.RawDo(t, req)
	return resp.StatusCode
}

// memSettled returns the bytes s's memory budget counts once nothing is in
// flight: an answer is counted until the agent's connection took it, which
// may be a moment after the agent read it, so it waits for three equal
// readings in a row.
func memSettled(t testing.TB, s *Server) int64 {
	t.Helper()
	deadline := time.Now().Add(peers.Timeout)
	last, same := s.mem.Used.Load(), 0
	for same < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("the memory budget's count never settled (last %d)", last)
		}
		time.Sleep(15 * time.Millisecond)
		if u := s.mem.Used.Load(); u == last {
			same++
		} else {
			last, same = u, 0
		}
	}
	return last
}

// stream serves a GET stream on a live session: an SSE answer that sends
// nothing and stays open until the client goes.
func (l *ledger) stream(w http.ResponseWriter, r *http.Request, sid string) {
	l.mu.Lock()
	live := l.sessions[sid]
	l.mu.Unlock()
	if !live {
		http.Error(w, "session not found", http.StatusNotFound)
		return
	}
	l.streams.Add(1)
	defer l.streams.Add(-1)
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	_ = http.NewResponseController(w).Flush()
	<-r.Context().Done()
}
