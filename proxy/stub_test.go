package proxy

// Tests that need one odd upstream answer, each against a stub: an MCP
// server of one session that answers initialize and notifications itself
// and hands the agent's GET and every other POST to the test.

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/mcpheal/mcpheal/proxy/internal/conf"
	"github.com/mcpheal/mcpheal/proxy/internal/peers"
)

// startStub serves a stub upstream until the test ends and returns its MCP
// URL: a peers.Script of one session, UP-1. get answers GETs; post answers
// POSTs other than initialize and notifications, given their JSON-RPC
// method.
func startStub(t testing.TB, get http.HandlerFunc, post func(w http.ResponseWriter, r *http.Request, method string)) string {
	t.Helper()
	return startStubWith(t, "{}", get, post)
}

// startStubWith is startStub whose initialize answer offers capabilities
// (raw JSON).
func startStubWith(t testing.TB, capabilities string, get http.HandlerFunc, post func(w http.ResponseWriter, r *http.Request, method string)) string {
	t.Helper()
	replies := peers.Session("UP-1", capabilities)
	replies[peers.Key{HTTP: http.MethodGet, Session: peers.Any, RPC: peers.Any}] = &peers.Reply{Optional: true, Status: http.StatusMethodNotAllowed}
	if get != nil {
		replies[peers.Key{HTTP: http.MethodGet, Session: peers.Any, RPC: peers.Any}] = &peers.Reply{Optional: true,
			Serve: func(w http.ResponseWriter, r *http.Request, _ string) { get(w, r) }}
	}
	rest := &peers.Reply{Optional: true, Serve: func(w http.ResponseWriter, r *http.Request, rpc string) {
		if strings.HasPrefix(rpc, "notifications/") || post == nil {
			w.WriteHeader(http.StatusAccepted)
			return
		}
		post(w, r, rpc)
	}}
	replies[peers.Key{HTTP: http.MethodPost, Session: peers.Any, RPC: peers.Any}] = rest
	replies[peers.Key{HTTP: http.MethodDelete, Session: peers.Any, RPC: peers.Any}] = rest
	return peers.StartScript(t, replies).URL()
}

// agentGet opens the agent's GET stream on session sid.
func agentGet(t testing.TB, url, sid string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Mcp-Session-Id", sid)
	req.Header.Set("MCP-Protocol-Version", "2025-11-25")
	resp, err := peers.RawClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = resp.Body.Close() })
	return resp
}

// TestFinishReadsOnlyWhatArrived: an answer whose stream stays open after
// its response is not cut into by a read deadline (a line split across that
// wait once escaped its rewriting, and the agent saw the upstream's own
// event id).
func TestFinishReadsOnlyWhatArrived(t *testing.T) {
	t.Parallel()
	up := startStub(t, nil, func(w http.ResponseWriter, r *http.Request, _ string) {
		w.Header().Set("Content-Type", "text/event-stream")
		rc := http.NewResponseController(w)
		_, _ = io.WriteString(w, "id: 41\ndata: {\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{}}\n\n")
		_ = rc.Flush()
		time.Sleep(5 * time.Millisecond)
		_, _ = io.WriteString(w, "id: 4") // a line split across the old 20 ms finish window
		_ = rc.Flush()
		time.Sleep(60 * time.Millisecond)
		_, _ = io.WriteString(w, "2\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{}}\n\n")
	})
	_, url := startProxy(t, up, nil)
	sid := peers.RawInitialize(t, url)
	_, raw := peers.RawPost(t, url, sid, `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"x","arguments":{}}}`)
	if strings.Contains(string(raw), "id: 4") || strings.Count(string(raw), "id: m") != 2 {
		t.Fatalf("agent got %q; want every event id mcpheal's own (m<answer>-<n>)", raw)
	}
}

// TestGetStreamKeepaliveBetweenEvents: the GET stream's keepalive comments
// go between events, never inside one (an event split across reads got a
// keepalive in its data line, and the Go SDK client ends its session on an
// undecodable event).
func TestGetStreamKeepaliveBetweenEvents(t *testing.T) {
	t.Parallel()
	up := startStub(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		rc := http.NewResponseController(w)
		w.WriteHeader(http.StatusOK)
		_ = rc.Flush()
		_, _ = io.WriteString(w, "event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",")
		_ = rc.Flush()
		time.Sleep(120 * time.Millisecond) // more than two keepalive ticks
		_, _ = io.WriteString(w, "\"params\":{\"level\":\"info\",\"data\":\"x\"}}\n\n")
		_ = rc.Flush()
		<-r.Context().Done()
	}, nil)
	_, url := startProxy(t, up, func(c *conf.Config) { c.StreamKeepalive = 50 * time.Millisecond })
	resp := agentGet(t, url, peers.RawInitialize(t, url))
	br := bufio.NewReader(resp.Body)
	var got strings.Builder
	for !strings.Contains(got.String(), "}}\n\n") {
		line, err := br.ReadString('\n')
		got.WriteString(line)
		if err != nil {
			t.Fatalf("stream ended: %v after %q", err, got.String())
		}
	}
	if !strings.Contains(got.String(), "\"notifications/message\",\"params\"") {
		t.Fatalf("agent stream %q: the event was split by a keepalive", got.String())
	}
}

// TestGetStreamEventTooLarge: a GET stream event past max_sse_line ends the
// agent's stream once; mcpheal does not reopen the upstream stream (a
// resumable server would send the same event again, in a loop).
func TestGetStreamEventTooLarge(t *testing.T) {
	t.Parallel()
	var gets atomic.Int64
	up := startStub(t, func(w http.ResponseWriter, r *http.Request) {
		gets.Add(1)
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "id: 1\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{\"data\":\""+
			strings.Repeat("x", 256<<10)+"\"}}\n\n")
		<-r.Context().Done()
	}, nil)
	_, url := startProxy(t, up, func(c *conf.Config) { c.MaxSSELine = 64 << 10 })
	resp := agentGet(t, url, peers.RawInitialize(t, url))
	n, _ := io.Copy(io.Discard, resp.Body) // ends when mcpheal ends the stream
	if n >= 256<<10 {
		t.Fatalf("the agent got %d bytes: the event past max_sse_line was relayed", n)
	}
	if n := gets.Load(); n != 1 {
		t.Fatalf("the upstream saw %d GETs, want 1 (no reopen loop)", n)
	}
}

// TestGetRefusalGivesBudgetBack: a GET the upstream refuses (405, a TS SDK
// server without GET support) gives back the memory budget its buffered
// answer took; it once leaked on every such GET.
func TestGetRefusalGivesBudgetBack(t *testing.T) {
	t.Parallel()
	up := startStub(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusMethodNotAllowed)
		_, _ = io.WriteString(w, `{"jsonrpc":"2.0","error":{"code":-32000,"message":"Method not allowed."},"id":null}`)
	}, nil)
	s, url := startProxy(t, up, nil)
	sid := peers.RawInitialize(t, url)
	before := s.mem.Used.Load()
	for range 20 {
		resp := agentGet(t, url, sid)
		_, _ = io.Copy(io.Discard, resp.Body)
		if resp.StatusCode != http.StatusMethodNotAllowed {
			t.Fatalf("GET answered %d, want the upstream's 405", resp.StatusCode)
		}
	}
	if after := s.mem.Used.Load(); after != before {
		t.Fatalf("budget used %d before 20 refused GETs, %d after", before, after)
	}
}

// TestStreamed503Judged: a 503 whose body is an event stream that stays
// open is judged on its first event; reading its body whole (as a JSON
// answer's) once hung the request until the upstream gave up. Its first
// event is the server's own JSON-RPC error (classify.Busy), which may have
// run the call: the agent gets it at once, as a JSON answer with
// Retry-After, and the call is not sent again.
func TestStreamed503Judged(t *testing.T) {
	t.Parallel()
	up := startStub(t, nil, func(w http.ResponseWriter, r *http.Request, _ string) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = io.WriteString(w, "data: {\"jsonrpc\":\"2.0\",\"id\":7,\"error\":{\"code\":-32000,\"message\":\"busy\"}}\n\n")
		_ = http.NewResponseController(w).Flush()
		<-r.Context().Done()
	})
	_, url := startProxy(t, up, func(c *conf.Config) { c.HealTimeout = time.Second })
	sid := peers.RawInitialize(t, url)
	start := time.Now()
	resp, raw := peers.RawPost(t, url, sid, `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"x","arguments":{}}}`)
	if code, msg, _ := rpcError(t, raw); resp.StatusCode != http.StatusServiceUnavailable || code != -32000 || msg != "busy" ||
		resp.Header.Get("Retry-After") == "" || time.Since(start) > 3*time.Second {
		t.Fatalf("after %v: %d %s; want the server's 503 and words at once", time.Since(start), resp.StatusCode, raw)
	}
}

// recorder serves a real server's handler (a Go SDK handler behind its
// own authentication, say) and records what reached it: the one wrapper
// for the tests that count an upstream's requests, in place of a fake.
type recorder struct {
	url string // the MCP endpoint
	srv *httptest.Server
	mu  sync.Mutex
	got []recorded
}

// recorded is one request the recorder served.
type recorded struct {
	httpMethod string // POST, GET, DELETE
	method     string // the JSON-RPC method of a POST
	id         string // its raw JSON-RPC id
	auth       string // Authorization
	session    string // the Mcp-Session-Id it named
	minted     string // the Mcp-Session-Id its answer set
	status     int    // the status it was answered
}

// startRecorder serves h on a 127.0.0.1 port until the test ends.
func startRecorder(t testing.TB, h http.Handler) *recorder {
	t.Helper()
	rec := &recorder{}
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := recorded{httpMethod: r.Method, auth: r.Header.Get("Authorization"), session: r.Header.Get("Mcp-Session-Id")}
		if r.Method == http.MethodPost {
			body, _ := io.ReadAll(r.Body)
			r.Body = io.NopCloser(bytes.NewReader(body))
			q.method, q.id = gjson.GetBytes(body, "method").Str, gjson.GetBytes(body, "id").Raw
		}
		// Recorded as it arrives (an agent may count before the handler
		// returns); its answer's status and session id once answered.
		rec.mu.Lock()
		i := len(rec.got)
		rec.got = append(rec.got, q)
		rec.mu.Unlock()
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		h.ServeHTTP(sw, r)
		rec.mu.Lock()
		rec.got[i].status, rec.got[i].minted = sw.status, w.Header().Get("Mcp-Session-Id")
		rec.mu.Unlock()
	}))
	t.Cleanup(hs.Close)
	rec.url, rec.srv = hs.URL+"/mcp", hs
	return rec
}

// count counts the recorded requests for which match is true.
func (rec *recorder) count(match func(recorded) bool) int64 {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	var n int64
	for _, q := range rec.got {
		if match(q) {
			n++
		}
	}
	return n
}

// calls counts the POSTs of a JSON-RPC method.
func (rec *recorder) calls(method string) int64 {
	return rec.count(func(q recorded) bool { return q.method == method })
}

// agentCalls counts the POSTs of a JSON-RPC method but mcpheal's own
// questions of the upstream's era (eraState.servesSessions).
func (rec *recorder) agentCalls(method string) int64 {
	return rec.count(func(q recorded) bool { return q.method == method && !isEraProbe(q.id) })
}

// isEraProbe reports the raw JSON-RPC id of a request by which mcpheal
// asks whether a 2026-07-28 upstream serves sessions too.
func isEraProbe(id string) bool { return strings.HasPrefix(id, `"mcpheal-era-`) }

// saw reports whether a request came with Authorization auth.
func (rec *recorder) saw(auth string) bool {
	return rec.count(func(q recorded) bool { return q.auth == auth }) > 0
}

// answered counts the requests answered status.
func (rec *recorder) answered(status int) int64 {
	return rec.count(func(q recorded) bool { return q.status == status })
}
