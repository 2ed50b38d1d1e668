package doctor

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	mcpgo "github.com/mark3labs/mcp-go/mcp"
	mcpgoserver "github.com/mark3labs/mcp-go/server"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpheal/mcpheal/classify"
)

// runDoctor runs Run against url with a bounded context and logs the
// printed report, so a failing test shows what the server said.
func runDoctor(t *testing.T, url string) *Report {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	r, err := Run(ctx, url, nil)
	if err != nil {
		t.Fatalf("Run(%s): %v", url, err)
	}
	var b strings.Builder
	if _, err := r.WriteTo(&b); err != nil {
		t.Fatal(err)
	}
	t.Logf("report:\n%s", b.String())
	return r
}

// doctorWant is what one server's report must say.
type doctorWant struct {
	verdict     Verdict
	healable    bool
	stateful    bool
	versions    []string // accepted initialize versions
	discover    bool     // 2026-07-28 accepted by server/discover
	idShape     IDShape
	unknownCode int
	unknownCT   string
	unknownBody string // substring
	class       classify.Class
	getStatus   int
	pong        bool
	tools       int
	readOnly    int
}

func checkReport(t *testing.T, r *Report, w doctorWant) {
	t.Helper()
	if r.Verdict != w.verdict || r.Healable() != w.healable {
		t.Errorf("verdict %v, healable %v; want %v, %v (notes %q)", r.Verdict, r.Healable(), w.verdict, w.healable, r.Notes)
	}
	if r.Stateful != w.stateful {
		t.Errorf("Stateful = %v, want %v", r.Stateful, w.stateful)
	}
	var got []string
	for _, v := range r.Versions {
		if v.Accepted {
			got = append(got, v.Version)
		}
	}
	if strings.Join(got, ",") != strings.Join(w.versions, ",") {
		t.Errorf("accepted versions %q, want %q", got, w.versions)
	}
	if r.Discover.Accepted != w.discover {
		t.Errorf("discover accepted = %v, want %v (%+v)", r.Discover.Accepted, w.discover, r.Discover)
	}
	if w.stateful && r.SessionID != w.idShape {
		t.Errorf("session id shape %+v, want %+v", r.SessionID, w.idShape)
	}
	u := r.Unknown
	if u.Status != w.unknownCode || !strings.HasPrefix(u.ContentType, w.unknownCT) ||
		!strings.Contains(u.Body, w.unknownBody) || u.Class != w.class {
		t.Errorf("unknown id answer %d %q %q → %v, want %d %q ~%q → %v",
			u.Status, u.ContentType, u.Body, u.Class, w.unknownCode, w.unknownCT, w.unknownBody, w.class)
	}
	if r.GetStream.Status != w.getStatus {
		t.Errorf("GET stream status %d (%s), want %d", r.GetStream.Status, r.GetStream.Err, w.getStatus)
	}
	if r.Pong != w.pong {
		t.Errorf("ping supported = %v, want %v (%+v)", r.Pong, w.pong, r.Ping)
	}
	if !r.Tools.Listed || r.Tools.Count != w.tools || r.Tools.ReadOnly != w.readOnly || r.Tools.Idempotent != 0 {
		t.Errorf("tools %+v, want %d listed, %d readOnly, 0 idempotent", r.Tools, w.tools, w.readOnly)
	}
}

var sessionEra = []string{"2025-11-25", "2025-06-18", "2025-03-26"}

// TestDoctorServers: the report for the Go SDK server (stateful and
// stateless), mcp-go (stateful and default) and a server that answers like
// WordPress mcp-adapter, the servers docs/observability.md's doctor section names.
func TestDoctorServers(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		start func(t *testing.T) *server
		want  doctorWant
	}{
		{"go-sdk", func(t *testing.T) *server { return startGoSDK(t, goSDKOpts{}) }, doctorWant{
			verdict: VerdictHealable, healable: true, stateful: true, versions: sessionEra,
			idShape:     IDShape{Length: 26, Charset: "base32"},
			unknownCode: 404, unknownCT: "text/plain", unknownBody: "session not found", class: classify.SessionGone,
			getStatus: 200, pong: true, tools: 4, readOnly: 1,
		}},
		{"go-sdk stateless", func(t *testing.T) *server { return startGoSDK(t, goSDKOpts{Stateless: true, JSONResponse: true}) }, doctorWant{
			verdict: VerdictStateless, healable: true, versions: sessionEra, discover: true,
			unknownCode: 200, unknownCT: "application/json", unknownBody: `"result":{}`, class: classify.OK,
			getStatus: 405, pong: true, tools: 4, readOnly: 1,
		}},
		{"mcp-go stateful", func(t *testing.T) *server { return startMCPGo(t, true) }, doctorWant{
			verdict: VerdictHealable, healable: true, stateful: true, versions: sessionEra,
			idShape:     IDShape{Length: 48, Prefix: "mcp-session-", Charset: "uuid"},
			unknownCode: 404, unknownCT: "text/plain", unknownBody: "Invalid session ID", class: classify.SessionGone,
			getStatus: 200, pong: true, tools: 1,
		}},
		{"mcp-go default", func(t *testing.T) *server { return startMCPGo(t, false) }, doctorWant{
			verdict: VerdictExpiryInvisible, healable: true, stateful: true, versions: sessionEra, discover: true,
			idShape:     IDShape{Length: 48, Prefix: "mcp-session-", Charset: "uuid"},
			unknownCode: 200, unknownCT: "application/json", unknownBody: `"result":{}`, class: classify.OK,
			getStatus: 200, pong: true, tools: 1,
		}},
		{"WordPress-like 200 -32602", func(t *testing.T) *server { return startWordPress(t) }, doctorWant{
			verdict: VerdictHealable, healable: true, stateful: true, versions: sessionEra,
			idShape:     IDShape{Length: 26, Charset: "base32"},
			unknownCode: 200, unknownCT: "application/json", unknownBody: "Invalid or expired session", class: classify.SessionGone,
			getStatus: 405, pong: true, tools: 1,
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := tc.start(t)
			r := runDoctor(t, p.URL)
			checkReport(t, r, tc.want)
			if tc.want.stateful && r.Delete.Status/100 != 2 {
				t.Errorf("DELETE of the doctor's session: %+v, want 2xx", r.Delete)
			}
			if p.Inits() < int64(len(sessionEra)) {
				t.Errorf("server saw %d initialize, want at least %d", p.Inits(), len(sessionEra))
			}
		})
	}
}

// TestDoctorCountsEveryTool: a tools/list answered as SSE and larger than
// 4 KiB is counted whole, as the Go SDK sends it and in flushed writes
// smaller than 4 KiB. The doctor once framed SSE on its own and took an
// event that had not ended yet for the answer: against server-everything
// (13 tools, 7.8 KB) it reported 8 tools, and against this server (40
// tools, about 24 KB) 7.
func TestDoctorCountsEveryTool(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		pieces int
	}{{"go-sdk", 0}, {"1000-byte writes", 1000}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := startGoSDK(t, goSDKOpts{Tools: 40, Pieces: tc.pieces})
			r := runDoctor(t, p.URL)
			if n := p.Written("tools/list"); n <= 16<<10 {
				t.Fatalf("the tools/list answer has %d bytes, want more than 16 KiB for this test", n)
			}
			if !isEventStream(r.Tools.ContentType) {
				t.Fatalf("tools/list answered as %q, want text/event-stream for this test", r.Tools.ContentType)
			}
			if !r.Tools.Listed || r.Tools.Count != 40 || r.Tools.ReadOnly != 10 {
				t.Errorf("tools %+v, want 40 listed, 10 readOnly", r.Tools)
			}
		})
	}
}

// TestDoctorCutToolList: a tools/list whose SSE answer ends inside its
// event is reported as cut, with no count.
func TestDoctorCutToolList(t *testing.T) {
	t.Parallel()
	p := startGoSDK(t, goSDKOpts{Tools: 40, Pieces: 1000, Cut: true})
	r := runDoctor(t, p.URL)
	if r.Tools.Listed || !strings.Contains(r.Tools.Err, errCut.Error()) {
		t.Errorf("tools %+v, want not listed, error %q", r.Tools, errCut)
	}
	var b strings.Builder
	_, _ = r.WriteTo(&b)
	if want := "tools/list failed: 200 text/event-stream"; !strings.Contains(b.String(), want) {
		t.Errorf("printed report lacks %q", want)
	}
}

// TestDoctorNotHealable: a server that answers an unknown session id with a
// JSON-RPC error naming no session (a Python server after a redeploy:
// -32602 "Invalid request parameters", hermes PR #66841) is reported not
// healable, with its answer shown.
func TestDoctorNotHealable(t *testing.T) {
	t.Parallel()
	p := startGoSDK(t, goSDKOpts{JSONResponse: true})
	url := serveRewritten(t, p.URL, func(status int, body []byte) (int, []byte, bool) {
		if status != http.StatusNotFound {
			return 0, nil, false
		}
		return http.StatusOK, []byte(`{"jsonrpc":"2.0","id":"doctor-unknown","error":{"code":-32602,"message":"Invalid request parameters"}}`), true
	})
	r := runDoctor(t, url)
	if r.Verdict != VerdictNotHealable || r.Healable() {
		t.Errorf("verdict %v, healable %v; want not healable", r.Verdict, r.Healable())
	}
	if r.Unknown.Class != classify.ToolError || !strings.Contains(r.Unknown.Body, "Invalid request parameters") {
		t.Errorf("unknown id answer %+v, want ToolError showing the body", r.Unknown)
	}
	var b bytes.Buffer
	_, _ = r.WriteTo(&b)
	for _, want := range []string{"verdict: not healable", "unknown id", "-32602", "→ ToolError"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("printed report lacks %q", want)
		}
	}
}

// TestDoctorUnreachable: a refused connection is an error, not a report.
func TestDoctorUnreachable(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	if r, err := Run(ctx, "http://"+addr+"/mcp", nil); err == nil {
		t.Fatalf("Run on a closed port = %+v, want an error", r)
	}
}

// MCP servers for the doctor's tests, on 127.0.0.1, stopped in t.Cleanup:
// the official Go SDK (go-sdk v1.8.0) and mark3labs/mcp-go v1.2.1 in
// process, and a scripted server for a dialect no SDK produces (WordPress
// mcp-adapter's HTTP 200 -32602). Each one counts the initialize requests
// it receives and the size of its largest answer to each JSON-RPC method.

// testTimeout bounds every wait in these tests.
const testTimeout = 20 * time.Second

// server is a running MCP server.
type server struct {
	URL   string // the MCP endpoint, http://127.0.0.1:port/mcp
	inits atomic.Int64

	mu      sync.Mutex     // protects written
	written map[string]int // largest answer body per JSON-RPC method, in bytes
}

// Inits counts initialize requests received.
func (s *server) Inits() int64 { return s.inits.Load() }

// Written returns the size of the largest answer body to method.
func (s *server) Written(method string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.written[method]
}

// serve runs h on 127.0.0.1 behind a recorder of initialize requests and
// answer sizes.
func serve(t testing.TB, h http.Handler) *server {
	t.Helper()
	s := &server{written: make(map[string]int)}
	rec := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var method string
		if r.Method == http.MethodPost {
			body, err := io.ReadAll(r.Body)
			if err != nil {
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
			var m struct {
				Method string `json:"method"`
			}
			_ = json.Unmarshal(body, &m)
			if method = m.Method; method == "initialize" {
				s.inits.Add(1)
			}
		}
		h.ServeHTTP(&countingWriter{ResponseWriter: w, s: s, method: method}, r)
	})
	hs := httptest.NewUnstartedServer(rec)
	hs.Config.ErrorLog = log.New(io.Discard, "", 0)
	hs.Start()
	t.Cleanup(func() {
		hs.CloseClientConnections()
		hs.Close()
	})
	s.URL = hs.URL + "/mcp"
	return s
}

// countingWriter counts the body bytes of an answer into s.written as they
// are written, before they can reach the client: a count taken when the
// handler returns raced with a test that reads it as soon as it has its
// answer (the Go SDK ends the stream after the response event). It keeps
// Flush, which the SDKs need to stream SSE.
type countingWriter struct {
	http.ResponseWriter
	s      *server
	method string
	n      int
}

func (w *countingWriter) Write(p []byte) (int, error) {
	n, err := w.ResponseWriter.Write(p)
	w.n += n
	w.s.mu.Lock()
	w.s.written[w.method] = max(w.s.written[w.method], w.n)
	w.s.mu.Unlock()
	return n, err
}

func (w *countingWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *countingWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// goSDKOpts configures startGoSDK; the zero value is a stateful server
// answering with text/event-stream and four tools.
type goSDKOpts struct {
	Stateless    bool // StreamableHTTPOptions.Stateless: no Mcp-Session-Id, GET/DELETE 405
	JSONResponse bool // StreamableHTTPOptions.JSONResponse: application/json answers
	// Tools is the number of tools (zero: 4). Every fourth one, from the
	// fourth, has readOnlyHint; each has a description of descLen bytes.
	Tools int
	// Pieces > 0 sends the answer to tools/list in writes of that many
	// bytes, each flushed; Cut drops its last byte, so that the answer ends
	// inside its event.
	Pieces int
	Cut    bool
}

// descLen is the length of each go-sdk tool's description: 40 tools make
// a tools/list answer of about 24 KB.
const descLen = 480

type noInput struct{}

// startGoSDK starts a go-sdk server (mcp.NewServer behind
// mcp.NewStreamableHTTPHandler).
func startGoSDK(t testing.TB, o goSDKOpts) *server {
	t.Helper()
	if o.Tools == 0 {
		o.Tools = 4
	}
	srv := mcp.NewServer(&mcp.Implementation{Name: "test-go-sdk", Version: "1.0.0"}, nil)
	desc := strings.Repeat("a tool the doctor counts; ", descLen/26+1)[:descLen]
	for i := range o.Tools {
		tool := &mcp.Tool{Name: fmt.Sprintf("tool_%02d", i), Description: desc}
		if i%4 == 3 {
			tool.Annotations = &mcp.ToolAnnotations{ReadOnlyHint: true}
		}
		mcp.AddTool(srv, tool, func(context.Context, *mcp.CallToolRequest, noInput) (*mcp.CallToolResult, any, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "ok"}}}, nil, nil
		})
	}
	var h http.Handler = mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv },
		&mcp.StreamableHTTPOptions{Stateless: o.Stateless, JSONResponse: o.JSONResponse})
	if o.Pieces > 0 {
		h = piecewise(h, "tools/list", o.Pieces, o.Cut)
	}
	s := serve(t, h)
	t.Cleanup(func() {
		for ss := range srv.Sessions() {
			_ = ss.Close()
		}
	})
	return s
}

// piecewise has h answer POSTs of the JSON-RPC method in writes of size
// bytes, each flushed, as a server streaming a large answer does; with cut
// the last byte is never sent.
func piecewise(h http.Handler, method string, size int, cut bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		if !bytes.Contains(body, []byte(`"method":"`+method+`"`)) {
			h.ServeHTTP(w, r)
			return
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.Code)
		b := rec.Body.Bytes()
		if cut {
			b = b[:len(b)-1]
		}
		rc := http.NewResponseController(w)
		for len(b) > 0 {
			n := min(size, len(b))
			_, _ = w.Write(b[:n])
			_ = rc.Flush()
			b = b[n:]
		}
	})
}

// startMCPGo starts an mcp-go server with one echo tool. stateful is
// server.WithStateful(true) (an unknown id: 404 text/plain "Invalid session
// ID") with only the session-era protocol versions, so that
// server/discover is not accepted; !stateful is mcp-go's default, which
// accepts any well-formed session id (expiry is invisible).
func startMCPGo(t testing.TB, stateful bool) *server {
	t.Helper()
	s := mcpgoserver.NewMCPServer("test-mcp-go", "1.0.0", mcpgoserver.WithToolCapabilities(false))
	s.AddTool(mcpgo.NewTool("echo", mcpgo.WithDescription("returns text"), mcpgo.WithString("text", mcpgo.Required())),
		func(_ context.Context, req mcpgo.CallToolRequest) (*mcpgo.CallToolResult, error) {
			return mcpgo.NewToolResultText(req.GetString("text", "")), nil
		})
	opts := []mcpgoserver.StreamableHTTPOption{mcpgoserver.WithStreamableHTTPLogger(slog.New(slog.DiscardHandler))}
	if stateful {
		opts = append(opts, mcpgoserver.WithStateful(true), mcpgoserver.WithStreamableHTTPProtocolVersions(
			mcpgo.ProtocolVersion20251125, mcpgo.ProtocolVersion20250618, mcpgo.ProtocolVersion20250326))
	}
	h := mcpgoserver.NewStreamableHTTPServer(s, opts...)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
		defer cancel()
		_ = h.Shutdown(ctx)
	})
	return serve(t, h)
}

// startWordPress starts a scripted session-era server that answers a
// request with an unknown session id like WordPress mcp-adapter: HTTP 200
// application/json, -32602 "Invalid params: Invalid or expired session"
// with the request's id. It knows initialize (a fresh rand.Text session
// id), ping, tools/list (one tool) and DELETE; GET is 405.
func startWordPress(t testing.TB) *server {
	t.Helper()
	return serve(t, &wordPress{sessions: make(map[string]bool)})
}

// wordPress is startWordPress's handler.
type wordPress struct {
	mu       sync.Mutex // protects sessions
	sessions map[string]bool
}

func (s *wordPress) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	sid := r.Header.Get("Mcp-Session-Id")
	switch r.Method {
	case http.MethodPost:
		s.post(w, r, sid)
	case http.MethodDelete:
		s.mu.Lock()
		delete(s.sessions, sid)
		s.mu.Unlock()
		w.WriteHeader(http.StatusOK)
	default:
		w.Header().Set("Allow", "POST, DELETE")
		http.Error(w, "Method Not Allowed", http.StatusMethodNotAllowed)
	}
}

func (s *wordPress) post(w http.ResponseWriter, r *http.Request, sid string) {
	var msg struct {
		ID     json.RawMessage `json:"id"`
		Method string          `json:"method"`
		Params struct {
			ProtocolVersion string `json:"protocolVersion"`
		} `json:"params"`
	}
	if err := json.NewDecoder(r.Body).Decode(&msg); err != nil {
		reply(w, http.StatusBadRequest, `{"jsonrpc":"2.0","error":{"code":-32700,"message":"Parse error"},"id":null}`)
		return
	}
	id := string(msg.ID)
	if id == "" {
		id = "null"
	}
	s.mu.Lock()
	known := s.sessions[sid]
	s.mu.Unlock()
	switch {
	case msg.Method == "initialize":
		sid := rand.Text()
		s.mu.Lock()
		s.sessions[sid] = true
		s.mu.Unlock()
		v, _ := json.Marshal(msg.Params.ProtocolVersion)
		w.Header().Set("Mcp-Session-Id", sid)
		reply(w, http.StatusOK, `{"jsonrpc":"2.0","id":`+id+`,"result":{"protocolVersion":`+string(v)+
			`,"capabilities":{"tools":{}},"serverInfo":{"name":"test-wordpress","version":"1.0.0"}}}`)
	case sid == "":
		reply(w, http.StatusBadRequest, `{"jsonrpc":"2.0","error":{"code":-32600,"message":"Invalid Request: Missing Mcp-Session-Id header"},"id":`+id+`}`)
	case !known:
		reply(w, http.StatusOK, `{"jsonrpc":"2.0","error":{"code":-32602,"message":"Invalid params: Invalid or expired session"},"id":`+id+`}`)
	case msg.ID == nil:
		w.WriteHeader(http.StatusAccepted)
	case msg.Method == "ping":
		reply(w, http.StatusOK, `{"jsonrpc":"2.0","id":`+id+`,"result":{}}`)
	case msg.Method == "tools/list":
		reply(w, http.StatusOK, `{"jsonrpc":"2.0","id":`+id+`,"result":{"tools":[{"name":"echo","inputSchema":{"type":"object"}}]}}`)
	default:
		reply(w, http.StatusOK, `{"jsonrpc":"2.0","id":`+id+`,"error":{"code":-32601,"message":"Method not found"}}`)
	}
}

// reply writes a JSON answer.
func reply(w http.ResponseWriter, status int, body string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = io.WriteString(w, body)
}

// serveRewritten serves a reverse proxy to upstream on 127.0.0.1 that passes
// everything through except POST answers to requests with a session id,
// which rewrite may replace.
func serveRewritten(t testing.TB, upstream string, rewrite func(status int, body []byte) (int, []byte, bool)) string {
	t.Helper()
	c := &http.Client{Transport: &http.Transport{}, Timeout: testTimeout}
	t.Cleanup(c.CloseIdleConnections)
	s := serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		req, _ := http.NewRequestWithContext(r.Context(), r.Method, upstream, bytes.NewReader(body))
		req.Header = r.Header.Clone()
		resp, err := c.Do(req)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		for k, v := range resp.Header {
			w.Header()[k] = v
		}
		if r.Method == http.MethodPost && r.Header.Get("Mcp-Session-Id") != "" {
			rb, _ := io.ReadAll(resp.Body)
			if st, nb, ok := rewrite(resp.StatusCode, rb); ok {
				w.Header().Set("Content-Type", "application/json")
				w.Header().Del("Content-Length")
				w.WriteHeader(st)
				_, _ = w.Write(nb)
				return
			}
			w.WriteHeader(resp.StatusCode)
			_, _ = w.Write(rb)
			return
		}
		w.WriteHeader(resp.StatusCode)
		http.NewResponseController(w).Flush()
		_, _ = io.Copy(w, resp.Body)
	}))
	return s.URL
}
