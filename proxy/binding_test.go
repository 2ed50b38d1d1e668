package proxy

// Credential rotation (docs/security.md "Security"): a session is bound to the
// principal that created it, so that the same user's next token keeps it,
// on every replica and after a restart, while another principal never
// reaches it, and never takes it from its creator.

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpheal/mcpheal/proxy/internal/conf"
	"github.com/mcpheal/mcpheal/proxy/internal/peers"
	"github.com/mcpheal/mcpheal/proxy/internal/wire"
	"github.com/mcpheal/mcpheal/session/redisstore/redistest"
)

// authSeenSince returns the Authorization headers up received from the
// n-th request on.
func authSeenSince(up *authServer, n int) []string {
	up.rec.mu.Lock()
	defer up.rec.mu.Unlock()
	var seen []string
	for _, q := range up.rec.got[n:] {
		seen = append(seen, q.auth)
	}
	return seen
}

func authSeenCount(up *authServer) int {
	up.rec.mu.Lock()
	defer up.rec.mu.Unlock()
	return len(up.rec.got)
}

// TestRotatedTokenFollowsSessionAcrossReplicas: the upstream accepts the
// owner's second token on the session through replica A. The session is
// the same wherever the agent's next request lands: on replica B, which
// only knows the rotation from the shared store, the new token is the
// session's, the upstream session is used, and after the upstream forgot
// it the heal re-creates it under the new token; a restarted A takes the
// new token as well. Before, the sealed id carried the first credential
// only, so anywhere but on A the new token got 404 and only the old one
// worked.
func TestRotatedTokenFollowsSessionAcrossReplicas(t *testing.T) {
	t.Parallel()
	sharedKinds(t, func(t *testing.T, sh *countingShared, _ *redistest.Server) {
		const tok1, tok2 = "alice-rotating-token-1", "alice-rotating-token-2"
		up := startAuthServer(t, map[string]string{tok1: "alice", tok2: "alice"})
		f := startFleet(t, 2, up.url, sh)
		a, b := f.replica(0), f.replica(1)
		sid := authInit(t, a, tok1)

		resp, body := authPost(t, a, sid, tok2, echoCall)
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "secret-answer") {
			t.Fatalf("second token on replica A: %d %s; want the upstream's answer", resp.StatusCode, body)
		}
		inits := up.rec.calls("initialize")
		resp, body = authPost(t, b, sid, tok2, echoCall)
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "secret-answer") {
			t.Fatalf("second token on replica B: %d %s; want the session", resp.StatusCode, body)
		}
		if n := up.rec.calls("initialize") - inits; n != 0 {
			t.Fatalf("replica B made %d upstream initializes; want 0 (it adopts the live upstream session)", n)
		}

		// The upstream forgets its session: B heals it, under the token the
		// request came with, which the session is bound to now.
		up.expireAll()
		seen := authSeenCount(up)
		resp, body = authPost(t, b, sid, tok2, echoCall)
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "secret-answer") {
			t.Fatalf("second token on replica B after the upstream session expired: %d %s; want healed", resp.StatusCode, body)
		}
		if n := up.rec.calls("initialize") - inits; n != 1 {
			t.Fatalf("%d upstream initializes for the heal, want 1", n)
		}
		for _, h := range authSeenSince(up, seen) {
			if h != "Bearer "+tok2 {
				t.Fatalf("the heal on replica B sent Authorization %q upstream; want only the second token", h)
			}
		}

		// The creator's token stays bound as well.
		if resp, body := authPost(t, b, sid, tok1, echoCall); resp.StatusCode != http.StatusOK {
			t.Fatalf("first token on replica B: %d %s", resp.StatusCode, body)
		}

		f.restart(0)
		resp, body = authPost(t, a, sid, tok2, echoCall)
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "secret-answer") {
			t.Fatalf("second token on replica A after its restart: %d %s; want the session", resp.StatusCode, body)
		}
		f.check()
	})
}

// wantSessionNotFound fails the test unless the answer is MCP's answer to
// an unknown session: 404 with JSON-RPC error -32001.
func wantSessionNotFound(t *testing.T, what string, resp *http.Response, body []byte) {
	t.Helper()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("%s: %d %q; want 404 -32001", what, resp.StatusCode, body)
	}
	if code, _, _ := rpcError(t, body); code != wire.CodeSessionNotFound {
		t.Fatalf("%s: 404 %s; want JSON-RPC error -32001", what, body)
	}
}

// testJWT returns an unsigned JWT (alg none) with the given claims. mcpheal
// reads a bearer JWT's issuer and subject without verifying it; the
// upstream is the one that verifies.
func testJWT(claims map[string]any) string {
	enc := base64.RawURLEncoding
	head := enc.EncodeToString([]byte(`{"alg":"none","typ":"JWT"}`))
	body, _ := json.Marshal(claims)
	return head + "." + enc.EncodeToString(body) + "."
}

// jwtClaims decodes the claims of testJWT's tokens (nil when tok is not
// one).
func jwtClaims(tok string) map[string]any {
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		return nil
	}
	b, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return nil
	}
	var m map[string]any
	if json.Unmarshal(b, &m) != nil {
		return nil
	}
	return m
}

// jwtServer is a Go SDK server behind the SDK's bearer-token middleware
// whose verifier accepts any JWT of issuer jwtIssuer with a subject, as
// that subject's user (the SDK binds each session to it: another user
// gets 403). It records every Authorization it received and counts its
// 401s.
type jwtServer struct {
	url string
	srv *mcp.Server
	rec *recorder // what reached the server
}

const jwtIssuer = "https://issuer.mcpheal.test"

func startJWTServer(t *testing.T) *jwtServer {
	t.Helper()
	j := &jwtServer{}
	j.srv = mcp.NewServer(&mcp.Implementation{Name: "jwt-peer", Version: "1"}, nil)
	mcp.AddTool(j.srv, &mcp.Tool{Name: "echo"}, func(_ context.Context, _ *mcp.CallToolRequest, in peers.EchoIn) (*mcp.CallToolResult, any, error) {
		return peers.Text(in.Text), nil, nil
	})
	verify := func(_ context.Context, tok string, _ *http.Request) (*auth.TokenInfo, error) {
		c := jwtClaims(tok)
		sub, _ := c["sub"].(string)
		if c == nil || c["iss"] != jwtIssuer || sub == "" {
			return nil, auth.ErrInvalidToken
		}
		return &auth.TokenInfo{UserID: sub, Expiration: time.Now().Add(time.Hour)}, nil
	}
	h := auth.RequireBearerToken(verify, nil)(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return j.srv }, nil))
	j.rec = startRecorder(t, h)
	j.url = j.rec.url
	return j
}

func (j *jwtServer) saw(auth string) bool { return j.rec.saw(auth) }

func (j *jwtServer) answered(status int) int { return int(j.rec.answered(status)) }

// statusWriter records the status an http.Handler answered.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	w.status = code
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// TestJWTRotationKeepsSession: a session created under a JWT is bound to
// its issuer and subject. The user's next JWT (same issuer and subject, a
// new token) works on the session at once, on the process that created it
// and on another with the same key ring and no shared store (the sealed
// id alone says whose it is), although the upstream never answered 401
// (so mcpheal does not take it for a judge of rotations). A JWT of another
// subject is answered as an unknown session everywhere, and the upstream
// never sees it.
func TestJWTRotationKeepsSession(t *testing.T) {
	t.Parallel()
	up := startJWTServer(t)
	keys := testKeys(1)
	// No era probe: it goes without a credential and would get the
	// upstream's 401.
	mod := func(c *conf.Config) { c.SessionKeys = keys; c.EraBridge = "off" }
	pa := startProxyAt(t, "127.0.0.1:0", up.url, mod)
	pb := startProxyAt(t, "127.0.0.1:0", up.url, mod)
	a, b := "http://"+pa.ln.Addr().String()+"/mcp", "http://"+pb.ln.Addr().String()+"/mcp"

	now := time.Now().Unix()
	first := testJWT(map[string]any{"iss": jwtIssuer, "sub": "alice", "iat": now, "exp": now + 300, "jti": "first"})
	second := testJWT(map[string]any{"iss": jwtIssuer, "sub": "alice", "iat": now + 1, "exp": now + 600, "jti": "second"})
	mallory := testJWT(map[string]any{"iss": jwtIssuer, "sub": "mallory", "iat": now, "exp": now + 300, "jti": "third"})

	sid := authInit(t, a, first)
	for _, c := range []struct{ where, url string }{{"the creating process", a}, {"another process", b}} {
		resp, body := authPost(t, c.url, sid, second, echoCall)
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "secret-answer") {
			t.Fatalf("the user's next JWT on %s: %d %s; want the session", c.where, resp.StatusCode, body)
		}
	}
	for _, c := range []struct{ where, url string }{{"the creating process", a}, {"another process", b}} {
		resp, body := authPost(t, c.url, sid, mallory, echoCall)
		wantSessionNotFound(t, "another subject's JWT on "+c.where, resp, body)
	}
	if up.saw("Bearer " + mallory) {
		t.Fatal("another subject's JWT reached the upstream")
	}
	if n := up.answered(http.StatusUnauthorized); n != 0 {
		t.Fatalf("the upstream answered 401 %d times; the test needs one that never did", n)
	}
	for _, c := range []struct{ where, url string }{{"the creating process", a}, {"another process", b}} {
		if resp, body := authPost(t, c.url, sid, first, echoCall); resp.StatusCode != http.StatusOK {
			t.Fatalf("the first JWT on %s after the second: %d %s", c.where, resp.StatusCode, body)
		}
	}
}

// TestStrangerCannotMoveBinding: an upstream that ignores credentials
// accepts whatever comes, so it cannot tell a rotation from a stranger. A
// request on the session under another credential is answered as for an
// unknown session and never reaches the upstream, and the creator keeps
// all of its session: its GET stream, the heal after the upstream forgot
// the session, and its DELETE. Before, the upstream's 200 to the
// stranger's POST moved the session to the stranger's credential: the
// creator's GET got 404 and its session could no longer heal.
func TestStrangerCannotMoveBinding(t *testing.T) {
	t.Parallel()
	up := peers.StartGoSDK(t, peers.GoSDKOpts{})
	_, url := startProxy(t, up.URL(), nil)
	const owner, stranger = "owner-token-0000001", "stranger-token-00001"
	sid := authInit(t, url, owner)
	get := func(tok string) int {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		req.Header.Set("Accept", "text/event-stream")
		req.Header.Set("MCP-Protocol-Version", "2025-11-25")
		req.Header.Set("Mcp-Session-Id", sid)
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := http.DefaultTransport.RoundTrip(req)
		if err != nil {
			t.Fatalf("GET: %v", err)
		}
		resp.Body.Close() // a stream stays open: only its status matters
		return resp.StatusCode
	}
	del := func(tok string) (*http.Response, []byte) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodDelete, url, nil)
		req.Header.Set("Mcp-Session-Id", sid)
		req.Header.Set("Authorization", "Bearer "+tok)
		return peers.RawDo(t, req)
	}

	resp, body := authPost(t, url, sid, stranger, echoCall)
	wantSessionNotFound(t, "the stranger's POST", resp, body)
	if st := get(owner); st != http.StatusOK {
		t.Fatalf("owner's GET after the stranger's POST: %d; want its stream", st)
	}
	up.ExpireSessions()
	inits := up.Inits()
	resp, body = authPost(t, url, sid, owner, echoCall)
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "secret-answer") || up.Inits() != inits+1 {
		t.Fatalf("owner's POST after the upstream forgot the session: %d %s, %d initializes; want healed",
			resp.StatusCode, body, up.Inits()-inits)
	}
	if st := get(stranger); st != http.StatusNotFound {
		t.Fatalf("stranger's GET: %d; want 404", st)
	}
	resp, body = del(stranger)
	wantSessionNotFound(t, "the stranger's DELETE", resp, body)
	for _, r := range up.Requests() {
		if strings.Contains(r.Header.Get("Authorization"), stranger) {
			t.Fatalf("the stranger's %s %s reached the upstream", r.HTTPMethod, r.RPCMethod)
		}
	}
	if resp, body := del(owner); resp.StatusCode != http.StatusOK {
		t.Fatalf("owner's DELETE: %d %s", resp.StatusCode, body)
	}
	resp, body = authPost(t, url, sid, owner, echoCall)
	wantSessionNotFound(t, "owner's POST after its DELETE", resp, body)
}
