package proxy

import (
	"bytes"
	"context"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/mcpheal/mcpheal/classify"
)

// runDoctor runs Doctor against url with a bounded context and logs the
// printed report, so a failing test shows what the server said.
func runDoctor(t *testing.T, url string) *Report {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	r, err := Doctor(ctx, url, nil)
	if err != nil {
		t.Fatalf("Doctor(%s): %v", url, err)
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

// TestDoctorServers: the report for each server of issue 5 §6, checked
// against what MCP-BEHAVIOUR.md §7 observed of it.
func TestDoctorServers(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		start func(t *testing.T) *peer
		want  doctorWant
	}{
		{"go-sdk", func(t *testing.T) *peer { return startGoSDK(t, goSDKOpts{}) }, doctorWant{
			verdict: VerdictHealable, healable: true, stateful: true, versions: sessionEra,
			idShape:     IDShape{Length: 26, Charset: "base32"},
			unknownCode: 404, unknownCT: "text/plain", unknownBody: "session not found", class: classify.SessionGone,
			getStatus: 200, pong: true, tools: 4, readOnly: 1,
		}},
		{"go-sdk stateless", func(t *testing.T) *peer { return startGoSDK(t, goSDKOpts{Stateless: true, JSONResponse: true}) }, doctorWant{
			verdict: VerdictStateless, healable: true, versions: sessionEra, discover: true,
			unknownCode: 200, unknownCT: "application/json", unknownBody: `"result":{}`, class: classify.OK,
			getStatus: 405, pong: true, tools: 4, readOnly: 1,
		}},
		{"mcp-go stateful", func(t *testing.T) *peer { return startMCPGo(t, true) }, doctorWant{
			verdict: VerdictHealable, healable: true, stateful: true, versions: sessionEra,
			idShape:     IDShape{Length: 48, Prefix: "mcp-session-", Charset: "uuid"},
			unknownCode: 404, unknownCT: "text/plain", unknownBody: "Invalid session ID", class: classify.SessionGone,
			getStatus: 200, pong: true, tools: 1,
		}},
		{"mcp-go default", func(t *testing.T) *peer { return startMCPGo(t, false) }, doctorWant{
			verdict: VerdictExpiryInvisible, healable: true, stateful: true, versions: sessionEra, discover: true,
			idShape:     IDShape{Length: 48, Prefix: "mcp-session-", Charset: "uuid"},
			unknownCode: 200, unknownCT: "application/json", unknownBody: `"result":{}`, class: classify.OK,
			getStatus: 200, pong: true, tools: 1,
		}},
		{"WordPress-like 200 -32602", func(t *testing.T) *peer { return startDialect(t, dialectWP200) }, doctorWant{
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
			r := runDoctor(t, p.URL())
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

// TestDoctorNotHealable: a server that answers an unknown session id with a
// JSON-RPC error naming no session (a Python server after a redeploy:
// -32602 "Invalid request parameters", hermes PR #66841) is reported not
// healable, with its answer shown.
func TestDoctorNotHealable(t *testing.T) {
	t.Parallel()
	p := startGoSDK(t, goSDKOpts{JSONResponse: true})
	url := serveRewritten(t, p.URL(), func(status int, body []byte) (int, []byte, bool) {
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

// serveRewritten serves a reverse proxy to upstream on 127.0.0.1 that passes
// everything through except POST answers to requests with a session id,
// which rewrite may replace. It stops in cleanup.
func serveRewritten(t *testing.T, upstream string, rewrite func(status int, body []byte) (int, []byte, bool)) string {
	t.Helper()
	c := &http.Client{Transport: &http.Transport{}, Timeout: peerTimeout}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
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
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
		_, _ = io.Copy(w, resp.Body)
	})
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.Start()
	t.Cleanup(func() {
		srv.CloseClientConnections()
		srv.Close()
		c.CloseIdleConnections()
	})
	return srv.URL + "/mcp"
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
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if r, err := Doctor(ctx, "http://"+addr+"/mcp", nil); err == nil {
		t.Fatalf("Doctor on a closed port = %+v, want an error", r)
	}
}

// TestDoctorIDShape: shapes of the session ids seen in the wild
// (MCP-BEHAVIOUR.md §5.7), and lookalike ids keep the shape but differ.
func TestDoctorIDShape(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, id string
		want     IDShape
	}{
		{"go-sdk rand.Text", "Q2WBHRFSN4GHJ3LK7XKFW4UDNA", IDShape{26, "", "base32"}},
		{"python uuid hex", "5f0c8e3b2a1d4c6e9b7a8f0e1d2c3b4a", IDShape{32, "", "hex"}},
		{"uuid", "5f0c8e3b-2a1d-4c6e-9b7a-8f0e1d2c3b4a", IDShape{36, "", "uuid"}},
		{"mcp-go", "mcp-session-5f0c8e3b-2a1d-4c6e-9b7a-8f0e1d2c3b4a", IDShape{48, "mcp-session-", "uuid"}},
		{"prefixed alnum", "sess_Ab3dEf9hIjK1mNoPqR7t", IDShape{25, "sess_", "alphanumeric"}},
		{"jwt-like", "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.abc-_def", IDShape{45, "", "visible ASCII"}},
		{"base64url", "Ab-_cdEFgh12ijKLmn34", IDShape{20, "", "base64url"}},
		{"base64url, lower start", "ab-_cdEFgh12ijKLmn34", IDShape{20, "", "base64url"}},
		{"two-letter word", "ab-cdEFgh12ijKLmn34xyz", IDShape{22, "", "base64url"}},
		{"upper hex", "5F0C8E3B2A1D4C6E9B7A8F0E1D2C3B4A", IDShape{32, "", "hex"}},
		{"control byte", "abc\x01def", IDShape{7, "", "invalid"}},
	}
	for _, tc := range cases {
		if got := shapeOf(tc.id); got != tc.want {
			t.Errorf("shapeOf(%s) = %+v, want %+v", tc.name, got, tc.want)
		}
		if tc.want.Charset == "invalid" || tc.want.Charset == "visible ASCII" {
			continue
		}
		for range 200 { // random: try many
			fake := lookalike(tc.id)
			if fake == tc.id || shapeOf(fake) != tc.want {
				t.Fatalf("lookalike(%s) = %q (shape %+v), want another id of shape %+v", tc.name, fake, shapeOf(fake), tc.want)
			}
		}
	}
}
