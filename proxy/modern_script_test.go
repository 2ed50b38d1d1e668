package proxy

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/mcpheal/mcpheal/classify/sse"
	"github.com/mcpheal/mcpheal/proxy/internal/peers"
)

// scriptedModern is a scripted upstream that speaks only MCP 2026-07-28:
// it answers server/discover with discover, tools/list with tools, 405 to
// a GET, and hands every other POST to handle. It records every POST it
// read, so that a test can count what the server ran.
type scriptedModern struct {
	url      string
	discover string // the result of server/discover, raw JSON
	tools    string // the result of tools/list, raw JSON
	handle   func(w http.ResponseWriter, r *http.Request, c scriptedCall)
	// needsAuth, if set, is the only Authorization it accepts: any other
	// POST, server/discover included, gets 401 with a challenge.
	needsAuth string

	mu    sync.Mutex // protects calls
	calls []scriptedCall
}

// scriptedCall is one POST the scripted upstream read.
type scriptedCall struct {
	method string
	name   string // params.name of a tools/call
	auth   string // its Authorization
	body   []byte
	msg    gjson.Result
}

// modernDiscover is a server/discover result of a 2026-07-28-only server
// with the given capabilities and instructions (raw JSON; "" for none).
func modernDiscover(capabilities, instructions string) string {
	d := `{"supportedVersions":["2026-07-28"],"capabilities":` + capabilities
	if instructions != "" {
		d += `,"instructions":` + instructions
	}
	return d + `,"_meta":{"io.modelcontextprotocol/serverInfo":{"name":"scripted-modern","version":"1"}}}`
}

// startScriptedModern serves s on a 127.0.0.1 port until the test ends.
func startScriptedModern(t testing.TB, s *scriptedModern) *scriptedModern {
	t.Helper()
	if s.discover == "" {
		s.discover = modernDiscover(`{"tools":{}}`, "")
	}
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", "POST")
			w.WriteHeader(http.StatusMethodNotAllowed)
			return
		}
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return
		}
		msg := gjson.ParseBytes(body)
		c := scriptedCall{method: msg.Get("method").Str, name: msg.Get("params.name").Str,
			auth: r.Header.Get("Authorization"), body: body, msg: msg}
		s.mu.Lock()
		s.calls = append(s.calls, c)
		s.mu.Unlock()
		switch {
		case s.needsAuth != "" && c.auth != s.needsAuth:
			w.Header().Set("WWW-Authenticate", `Bearer resource_metadata="`+s.url[:len(s.url)-len("/mcp")]+
				`/.well-known/oauth-protected-resource/mcp"`)
			scriptedJSON(w, http.StatusUnauthorized, `{"error":"invalid_token"}`)
		case c.method == "server/discover":
			scriptedResult(w, msg.Get("id").Raw, s.discover)
		case c.method == "tools/list" && s.tools != "":
			scriptedResult(w, msg.Get("id").Raw, s.tools)
		case s.handle != nil:
			s.handle(w, r, c)
		default:
			scriptedJSON(w, http.StatusOK, `{"jsonrpc":"2.0","id":`+msg.Get("id").Raw+
				`,"error":{"code":-32601,"message":"Method not found"}}`)
		}
	}))
	t.Cleanup(func() { hs.CloseClientConnections(); hs.Close() })
	s.url = hs.URL + "/mcp"
	return s
}

// received returns the POSTs of method (and tool name, for tools/call;
// "" for any) the upstream read.
func (s *scriptedModern) received(method, name string) []scriptedCall {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []scriptedCall
	for _, c := range s.calls {
		if c.method == method && (name == "" || c.name == name) {
			out = append(out, c)
		}
	}
	return out
}

// agentInits counts the initializes the upstream read but mcpheal's own
// questions of its era (isEraProbe).
func agentInits(s *scriptedModern) int {
	n := 0
	for _, c := range s.received("initialize", "") {
		if !isEraProbe(c.msg.Get("id").Raw) {
			n++
		}
	}
	return n
}

// all returns every POST the upstream read.
func (s *scriptedModern) all() []scriptedCall {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]scriptedCall(nil), s.calls...)
}

// scriptedJSON writes one JSON answer.
func scriptedJSON(w http.ResponseWriter, status int, body string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = io.WriteString(w, body)
}

// scriptedResult answers the request id (raw JSON) with result.
func scriptedResult(w http.ResponseWriter, id, result string) {
	scriptedJSON(w, http.StatusOK, `{"jsonrpc":"2.0","id":`+id+`,"result":`+result+`}`)
}

// scriptedCut drops the connection of a request the server has read,
// without a byte of answer: the request may have run.
func scriptedCut(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err == nil {
		_ = conn.Close()
	}
}

// multiLineEvent is msg (JSON) as an SSE event whose data is split over
// one data line per line of msg, as a server that pretty-prints does.
func multiLineEvent(msg string) string {
	var b strings.Builder
	b.WriteString("event: message\n")
	for _, line := range strings.Split(msg, "\n") {
		b.WriteString("data: " + line + "\n")
	}
	b.WriteString("\n")
	return b.String()
}

// agentPost is a session-era agent's POST on session sid under the
// Authorization auth ("" for none).
func agentPost(t testing.TB, url, sid, auth, body string) (*http.Response, []byte) {
	t.Helper()
	req := peers.PostRequest(t, url, sid, body)
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	return peers.RawDo(t, req)
}

// agentInitialize runs a session-era agent's handshake under auth and
// returns its session id.
func agentInitialize(t testing.TB, url, auth string) string {
	t.Helper()
	resp, body := agentPost(t, url, "", auth, `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25",`+
		`"capabilities":{"elicitation":{"form":{}}},"clientInfo":{"name":"raw-legacy-agent","version":"1"}}}`)
	sid := resp.Header.Get("Mcp-Session-Id")
	if resp.StatusCode != http.StatusOK || sid == "" {
		t.Fatalf("initialize: %d %s; want 200 and a session id", resp.StatusCode, body)
	}
	if resp, body = agentPost(t, url, sid, auth, `{"jsonrpc":"2.0","method":"notifications/initialized"}`); resp.StatusCode != http.StatusAccepted {
		t.Fatalf("notifications/initialized: %d %s; want 202", resp.StatusCode, body)
	}
	return sid
}

// agentOpen opens an agent request whose answer is read as it comes
// (an SSE answer, a GET stream), closed when the test ends.
func agentOpen(t testing.TB, req *http.Request) (*http.Response, *eventReader) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*peers.Timeout)
	t.Cleanup(cancel)
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	resp, err := (&http.Client{Transport: tr}).Do(req.WithContext(ctx))
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	t.Cleanup(func() { _ = resp.Body.Close() })
	return resp, &eventReader{r: resp.Body, buf: make([]byte, 32<<10)}
}

// eventReader reads an agent's SSE answer with the repository's framer,
// as a client's SSE parser does (§9.2.6: data lines joined by LF).
type eventReader struct {
	r   io.Reader
	fr  sse.Framer
	buf []byte
}

// next returns the data of the next event that has any (comments and
// keepalives skipped).
func (e *eventReader) next() ([]byte, error) {
	for {
		ev, ok, err := e.fr.Next()
		if err != nil {
			return nil, err
		}
		if ok {
			if d := sse.Data(nil, ev); len(d) > 0 {
				return bytes.Clone(d), nil
			}
			continue
		}
		n, err := e.r.Read(e.buf)
		e.fr.Feed(e.buf[:n])
		if err != nil && n == 0 {
			return nil, err
		}
	}
}

// waitFor polls cond every 2 ms for up to d, and reports whether it held.
func waitFor(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(2 * time.Millisecond)
	}
	return true
}
