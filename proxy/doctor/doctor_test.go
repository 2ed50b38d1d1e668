package doctor

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"strings"
	"testing"

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
// WordPress mcp-adapter, the servers the README's doctor section names.
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
