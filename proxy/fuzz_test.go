package proxy

import (
	"bytes"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"

	"github.com/mcpheal/mcpheal/proxy/internal/conf"
	"github.com/mcpheal/mcpheal/proxy/internal/peers"
)

// handle runs one request through the full handler in-process and returns
// the answer. A streamed body is read for at most 200 ms, then closed.
func handle(s *Server, method, host, ct, accept, origin, sid string, body []byte) (int, []byte, string) {
	var req fasthttp.Request
	req.Header.SetMethod(method)
	req.SetRequestURI("/mcp")
	req.Header.SetHost(host)
	if ct != "" {
		req.Header.SetContentType(ct)
	}
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	if origin != "" {
		req.Header.Set("Origin", origin)
	}
	if sid != "" {
		req.Header.Set("Mcp-Session-Id", sid)
	}
	req.SetBody(body)
	var ctx fasthttp.RequestCtx
	ctx.Init(&req, &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 40000}, nil)
	s.Handler(&ctx)
	var out []byte
	if !ctx.Response.IsBodyStream() { // Body() would drain a stream
		out = append(out, ctx.Response.Body()...)
	} else {
		r := ctx.Response.BodyStream()
		done := make(chan []byte, 1)
		go func() {
			b, _ := io.ReadAll(io.LimitReader(r, 1<<20))
			done <- b
		}()
		select {
		case out = <-done:
		case <-time.After(200 * time.Millisecond):
		}
		_ = ctx.Response.CloseBodyStream()
	}
	return ctx.Response.StatusCode(), out, string(ctx.Response.Header.ContentType())
}

// FuzzProxy sends fuzzed method, headers, session id and body through the
// full handler against a live upstream. Invariants: no panic (recovered or
// not), always a well-formed HTTP answer (a JSON body when it says JSON), no
// other session's ids in the answer, and that session still works.
func FuzzProxy(f *testing.F) {
	up := peers.StartGoSDK(f, peers.GoSDKOpts{JSONResponse: true}) // a real server, so every upstream answer is well-formed
	s, err := New(conf.Config{Upstream: up.URL(), Listen: "127.0.0.1:8787", HealTimeout: 300 * time.Millisecond,
		ResponseTimeout: 2 * time.Second, Keepalive: -1, StreamKeepalive: 20 * time.Millisecond,
		MaxSessions: 2000, MaxSessionsPerCredential: 1 << 30}, nopLog())
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(s.Close)
	const host, jsonCT, both = "127.0.0.1:8787", "application/json", "application/json, text/event-stream"
	status, body, _ := handle(s, "POST", host, jsonCT, both, "", "",
		[]byte(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"victim","version":"1"}}}`))
	victim := ""
	for _, sess := range s.sessions.Store.Sessions() {
		victim = string(sess.ID)
	}
	if status != 200 || victim == "" {
		f.Fatalf("victim initialize: %d %q", status, body)
	}
	victimUp, _ := s.sessions.Store.Sessions()[0].Current()

	seeds := []struct {
		method, host, ct, accept, origin string
		sid                              uint8
		body                             string
	}{
		{"POST", host, jsonCT, both, "", 0, `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25"}}`},
		{"POST", host, jsonCT, both, "", 1, `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo","arguments":{"text":"x"}}}`},
		{"POST", host, jsonCT, both, "", 2, `{"jsonrpc":"2.0","id":"mcpheal-g2-n5","result":{}}`},
		{"POST", host, jsonCT, both, "", 2, `[{"jsonrpc":"2.0","id":1,"method":"ping"}]`},
		{"POST", host, jsonCT, both, "", 0, `{"jsonrpc":"2.0","method":"server/discover"}`},
		{"GET", host, "", "text/event-stream", "", 2, ""},
		{"DELETE", host, "", "", "", 1, ""},
		{"POST", "evil.example", jsonCT, both, "http://evil.example", 2, `{"id":1}`},
		{"POST", host, "text/plain; charset=utf-8", both, "", 2, "\xef\xbb\xbf{\"id\":\x00}"},
		{"PATCH", host, jsonCT, "*/*", "null", 3, `{"jsonrpc":"2.0","id":{"a":[1,2]},"method":"logging/setLevel","params":{"level":"debug"}}`},
		// Hostile agents (docs/security.md "Under attack").
		{"POST", host, jsonCT, both, "", 2, strings.Repeat("[", 100<<10)},
		{"POST", host, jsonCT, both, "", 2, strings.Repeat(`{"a":`, 70) + "1" + strings.Repeat("}", 70)},
		{"POST", host, jsonCT, both, "", 2, `{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"echo","name":"counter"}}`},
		{"POST", host, jsonCT, both, "", 2, `{"jsonrpc":"2.0","id":9,"method":"tools/list","method":"tools/call","params":{"name":"counter"}}`},
		{"POST", host, jsonCT, both, "", 0, `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"clientInfo":{"name":"` + strings.Repeat("x", 70<<10) + `"}}}`},
		{"POST", host, jsonCT, both, "", 2, `{"jsonrpc":"2.0","id":"\"]]]]","method":"ping","params":{"s":"[[[[\\"}}`},
	}
	for _, sd := range seeds {
		f.Add(sd.method, sd.host, sd.ct, sd.accept, sd.origin, sd.sid, []byte(sd.body))
	}
	ping := []byte(`{"jsonrpc":"2.0","id":"v","method":"ping"}`)
	f.Fuzz(func(t *testing.T, method, hostHdr, ct, accept, origin string, sidMode uint8, body []byte) {
		panics := s.count.Panics.Load()
		var sid string
		switch sidMode % 4 {
		case 1:
			sid = "0123456789abcdef0123456789abcdef" // well-formed, unknown
		case 2:
			sid = string(s.freshSession(t))
		case 3:
			sid = string(body[:min(len(body), 40)])
		}
		status, out, ctype := handle(s, method, hostHdr, ct, accept, origin, sid, body)
		if s.count.Panics.Load() != panics {
			t.Fatalf("the handler panicked on %q %q %q", method, sid, body)
		}
		if status < 100 || status > 599 {
			t.Fatalf("status %d", status)
		}
		if strings.HasPrefix(ctype, "application/json") && len(out) > 0 && !gjson.ValidBytes(out) {
			t.Fatalf("JSON answer is not JSON: %q", out)
		}
		if !bytes.Contains(body, []byte(victim)) && (bytes.Contains(out, []byte(victim)) ||
			victimUp != "" && bytes.Contains(out, []byte(victimUp))) {
			t.Fatalf("answer carries another session's id: %q", out)
		}
		if st, vb, _ := handle(s, "POST", host, jsonCT, both, "", victim, ping); st != 200 || !bytes.Contains(vb, []byte(`"result"`)) {
			t.Fatalf("the victim's session broke after %q %q: %d %q", method, body, st, vb)
		}
	})
}

// freshSession creates a session of the fuzz input's own.
func (s *Server) freshSession(t *testing.T) string {
	t.Helper()
	// Admission never evicts a session at its cap, so the harness ends old
	// ones itself (an agent would DELETE them), keeping the victim.
	if s.sessions.Store.Len() > 1000 {
		for _, sess := range s.sessions.Store.Sessions()[:500] {
			if sess.Recipe.InitBody != "" && !strings.Contains(sess.Recipe.InitBody, `"victim"`) {
				s.sessions.End(sess, false)
			}
		}
	}
	status, body, _ := handle(s, "POST", "127.0.0.1:8787", "application/json", "application/json, text/event-stream", "", "",
		[]byte(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"f","version":"1"}}}`))
	if status != 200 {
		t.Fatalf("initialize: %d %q", status, body)
	}
	var newest string
	for _, sess := range s.sessions.Store.Sessions() { // most recently used last
		newest = string(sess.ID)
	}
	return newest
}
