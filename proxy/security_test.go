package proxy

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	neturl "net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"golang.org/x/oauth2/clientcredentials"

	"github.com/mcpheal/mcpheal/proxy/internal/conf"
	"github.com/mcpheal/mcpheal/proxy/internal/peers"
	"github.com/mcpheal/mcpheal/proxy/internal/wire"
	"github.com/mcpheal/mcpheal/upstream"
	"github.com/mcpheal/mcpheal/upstream/login"
)

// authServer is a Go SDK server behind the SDK's bearer-token middleware,
// which binds each session to the token's user (go-sdk answers 403 "session
// user mismatch" to another user). tokens maps a token to its user; a token
// not in it gets 401.
type authServer struct {
	url    string
	srv    *mcp.Server
	mu     sync.Mutex
	tokens map[string]string
	echoes atomic.Int64 // executions of echo
	rec    *recorder    // what reached the server
}

func startAuthServer(t *testing.T, tokens map[string]string) *authServer {
	t.Helper()
	a := &authServer{tokens: tokens}
	a.srv = mcp.NewServer(&mcp.Implementation{Name: "auth-peer", Version: "1"}, nil)
	mcp.AddTool(a.srv, &mcp.Tool{Name: "echo"}, func(_ context.Context, _ *mcp.CallToolRequest, in peers.EchoIn) (*mcp.CallToolResult, any, error) {
		a.echoes.Add(1)
		return peers.Text(in.Text), nil, nil
	})
	verify := func(_ context.Context, tok string, _ *http.Request) (*auth.TokenInfo, error) {
		a.mu.Lock()
		defer a.mu.Unlock()
		user, ok := a.tokens[tok]
		if !ok {
			return nil, auth.ErrInvalidToken
		}
		return &auth.TokenInfo{UserID: user, Expiration: time.Now().Add(time.Hour)}, nil
	}
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return a.srv }, nil)
	protected := auth.RequireBearerToken(verify, nil)(h)
	a.rec = startRecorder(t, protected)
	a.url = a.rec.url
	return a
}

func (a *authServer) setToken(tok, user string) {
	a.mu.Lock()
	a.tokens[tok] = user
	a.mu.Unlock()
}

func (a *authServer) expireAll() {
	for ss := range a.srv.Sessions() {
		_ = ss.Close()
	}
}

func (a *authServer) sawAuthorization(v string) bool { return a.rec.saw(v) }

// authPost POSTs a JSON-RPC message with a bearer token.
func authPost(t *testing.T, url, sid, token, body string) (*http.Response, []byte) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("MCP-Protocol-Version", "2025-11-25")
	if sid != "" {
		req.Header.Set("Mcp-Session-Id", sid)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	return peers.RawDo(t, req)
}

const secInitBody = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"sec","version":"1"}}}`

func authInit(t *testing.T, url, token string) string {
	t.Helper()
	resp, body := authPost(t, url, "", token, secInitBody)
	sid := resp.Header.Get("Mcp-Session-Id")
	if resp.StatusCode != 200 || sid == "" {
		t.Fatalf("initialize: %d %q", resp.StatusCode, body)
	}
	authPost(t, url, sid, token, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	return sid
}

const echoCall = `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo","arguments":{"text":"secret-answer"}}}`

// TestStolenSessionID: an attacker who learned a client id but holds another
// credential cannot read through the owner's session, and cannot make the
// proxy re-create it.
func TestStolenSessionID(t *testing.T) {
	t.Parallel()
	up := startAuthServer(t, map[string]string{"victim-token-0001": "alice", "attacker-token-01": "mallory"})
	_, url := startProxy(t, up.url, nil)
	sid := authInit(t, url, "victim-token-0001")

	resp, body := authPost(t, url, sid, "attacker-token-01", echoCall)
	if resp.StatusCode != http.StatusForbidden || strings.Contains(string(body), "secret-answer") {
		t.Fatalf("attacker on the owner's session: %d %q; want the upstream's 403", resp.StatusCode, body)
	}
	up.expireAll()
	inits := up.rec.calls("initialize")
	resp, body = authPost(t, url, sid, "attacker-token-01", echoCall)
	if resp.StatusCode != http.StatusNotFound || up.rec.calls("initialize") != inits {
		t.Fatalf("attacker on the dead session: %d %q, %d initializes; want the upstream's 404 and no heal",
			resp.StatusCode, body, up.rec.calls("initialize")-inits)
	}
	resp, body = authPost(t, url, sid, "victim-token-0001", echoCall)
	if resp.StatusCode != 200 || !strings.Contains(string(body), "secret-answer") || up.rec.calls("initialize") != inits+1 {
		t.Fatalf("owner after expiry: %d %q; want healed", resp.StatusCode, body)
	}
}

// TestTokenRotation: once the upstream accepts the owner's new token on the
// session, the session is bound to it as well: the new token heals, and
// the re-init uses it. The old token stays the creator's (a stranger who
// got a token accepted could otherwise lock the creator out): what it may
// do, the upstream judges.
func TestTokenRotation(t *testing.T) {
	t.Parallel()
	up := startAuthServer(t, map[string]string{"alice-token-old1": "alice"})
	_, url := startProxy(t, up.url, nil)
	sid := authInit(t, url, "alice-token-old1")
	up.setToken("alice-token-new1", "alice")
	if resp, body := authPost(t, url, sid, "alice-token-new1", echoCall); resp.StatusCode != 200 {
		t.Fatalf("new token: %d %q", resp.StatusCode, body)
	}
	up.expireAll()
	inits := up.rec.calls("initialize")
	resp, body := authPost(t, url, sid, "alice-token-new1", echoCall)
	if resp.StatusCode != 200 || !strings.Contains(string(body), "secret-answer") || up.rec.calls("initialize") != inits+1 {
		t.Fatalf("rotated token after expiry: %d %q", resp.StatusCode, body)
	}
	if !up.sawAuthorization("Bearer alice-token-new1") {
		t.Fatal("the re-init did not use the rotated token")
	}
}

// tokenEndpoint is an OAuth 2.0 token endpoint issuing tok-1, tok-2, …
type tokenEndpoint struct {
	url   string
	calls atomic.Int64
}

func startTokenEndpoint(t *testing.T) *tokenEndpoint {
	te := &tokenEndpoint{}
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := te.calls.Add(1)
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{"access_token": fmt.Sprintf("owned-token-%04d", n), "token_type": "Bearer", "expires_in": 3600})
	}))
	t.Cleanup(hs.Close)
	te.url = hs.URL + "/token"
	return te
}

// TestOwnedOAuthCredential: the proxy owns the upstream credential (client
// credentials): the token is fetched once and reused, the agent's own
// Authorization never reaches the upstream, and a 401 makes the proxy fetch a
// new token and retry exactly once.
func TestOwnedOAuthCredential(t *testing.T) {
	t.Parallel()
	te := startTokenEndpoint(t)
	up := startAuthServer(t, map[string]string{"owned-token-0001": "svc"})
	creds := upstream.ClientCredentials(&clientcredentials.Config{ClientID: "mcpheal", ClientSecret: "client-secret-xyz", TokenURL: te.url})
	t.Cleanup(creds.Close)
	_, url := startProxy(t, up.url, func(c *conf.Config) { c.Credentials = creds })
	sid := authInit(t, url, "agent-own-token-1")
	for range 3 {
		if resp, body := authPost(t, url, sid, "agent-own-token-1", echoCall); resp.StatusCode != 200 {
			t.Fatalf("call: %d %q", resp.StatusCode, body)
		}
	}
	if te.calls.Load() != 1 {
		t.Fatalf("token fetched %d times, want 1", te.calls.Load())
	}
	if up.sawAuthorization("Bearer agent-own-token-1") {
		t.Fatal("the agent's Authorization reached the upstream")
	}
	// Revoke the token and re-issue: the next call gets 401, the proxy
	// fetches owned-token-0002 and retries once.
	up.mu.Lock()
	delete(up.tokens, "owned-token-0001")
	up.tokens["owned-token-0002"] = "svc"
	up.mu.Unlock()
	resp, body := authPost(t, url, sid, "agent-own-token-1", echoCall)
	if resp.StatusCode != 200 || !strings.Contains(string(body), "secret-answer") || te.calls.Load() != 2 {
		t.Fatalf("after revocation: %d %q, %d token fetches; want success after one refresh", resp.StatusCode, body, te.calls.Load())
	}
}

// TestLoginRefreshedMidHeal: mcpheal's own login (a token file of `mcpheal
// login`). The upstream revokes the access token and ends the session at
// once; the next call meets the 401 first, mcpheal refreshes the login
// (refresh token grant with the RFC 8707 resource) and writes it back to
// the file, then meets the dead session and heals: the re-initialize and
// the replay carry the new token, and the call runs once.
func TestLoginRefreshedMidHeal(t *testing.T) {
	t.Parallel()
	up := startAuthServer(t, map[string]string{"login-token-A": "svc"})
	var refreshes atomic.Int32
	var mu sync.Mutex
	var forms []string
	te := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = r.ParseForm()
		mu.Lock()
		forms = append(forms, r.PostForm.Encode())
		mu.Unlock()
		n := refreshes.Add(1)
		if r.PostForm.Get("grant_type") != "refresh_token" || r.PostForm.Get("refresh_token") != fmt.Sprintf("refresh-%d", n-1) {
			w.WriteHeader(http.StatusBadRequest)
			fmt.Fprint(w, `{"error":"invalid_grant"}`)
			return
		}
		tok := fmt.Sprintf("login-token-%d", n)
		up.setToken(tok, "svc")
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"access_token":%q,"token_type":"bearer","expires_in":3600,"refresh_token":"refresh-%d"}`, tok, n)
	}))
	t.Cleanup(te.Close)
	file := filepath.Join(t.TempDir(), "login.json")
	if err := login.Write(file, &login.File{Server: up.url, Resource: up.url, TokenURL: te.URL, ClientID: "mcpheal",
		TokenAuth: "none", AccessToken: "login-token-A", TokenType: "Bearer", Expiry: time.Now().Add(time.Hour),
		RefreshToken: "refresh-0"}); err != nil {
		t.Fatal(err)
	}
	creds := upstream.LoginCredentials(file)
	t.Cleanup(creds.Close)
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	_, url, logs := startProxyLog(t, up.url, func(c *conf.Config) { c.Credentials = creds; c.Tracer = tp })
	sid := authInit(t, url, "")
	if resp, body := authPost(t, url, sid, "", echoCall); resp.StatusCode != 200 || refreshes.Load() != 0 {
		t.Fatalf("call with the file's token: %d %q, %d refreshes", resp.StatusCode, body, refreshes.Load())
	}

	up.mu.Lock()
	delete(up.tokens, "login-token-A")
	up.mu.Unlock()
	up.expireAll()
	before := up.echoes.Load()
	resp, body := authPost(t, url, sid, "", echoCall)
	if resp.StatusCode != 200 || !strings.Contains(string(body), "secret-answer") {
		t.Fatalf("call after revocation and expiry: %d %q", resp.StatusCode, body)
	}
	if n := up.echoes.Load() - before; n != 1 {
		t.Errorf("echo ran %d times for one call, want 1", n)
	}
	if n := refreshes.Load(); n != 1 {
		t.Errorf("%d refreshes, want 1", n)
	}
	mu.Lock()
	if len(forms) == 0 || !strings.Contains(forms[0], "resource="+neturl.QueryEscape(up.url)) {
		t.Errorf("refresh request %q lacks the resource %s", forms, up.url)
	}
	mu.Unlock()
	auths := authSeenSince(up, 0)
	last := auths[len(auths)-1]
	if last != "Bearer login-token-1" || up.rec.calls("initialize") != 2 {
		t.Errorf("after the heal: last Authorization %q, %d initializes; want the refreshed token and 2", last, up.rec.calls("initialize"))
	}
	f, err := login.Read(file)
	if err != nil || f.AccessToken != "login-token-1" || f.RefreshToken != "refresh-1" {
		t.Fatalf("token file after the refresh: %+v, %v", f, err)
	}
	if st, err := os.Stat(file); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("token file mode: %v %v", st.Mode(), err)
	}
	// No token in the log or any span (name, attribute or event).
	var seen strings.Builder
	seen.WriteString(logs.String())
	for _, sp := range spans.Ended() {
		fmt.Fprintln(&seen, sp.Name(), sp.Attributes(), sp.Events(), sp.Status())
	}
	if len(spans.Ended()) == 0 {
		t.Fatal("no span recorded")
	}
	for _, secret := range []string{"login-token-", "refresh-0", "refresh-1"} {
		if strings.Contains(seen.String(), secret) {
			t.Errorf("%q appears in mcpheal's log or spans", secret)
		}
	}
}

// TestLoginMissingNamesTheWayOut: an upstream whose token file does not
// exist yet: the agent gets -32018 naming the command that logs in, and
// once the operator has run it, the next request succeeds without a restart.
func TestLoginMissingNamesTheWayOut(t *testing.T) {
	t.Parallel()
	up := startAuthServer(t, map[string]string{"login-token-A": "svc"})
	file := filepath.Join(t.TempDir(), "login.json")
	creds := upstream.LoginCredentials(file)
	t.Cleanup(creds.Close)
	_, url := startProxy(t, up.url, func(c *conf.Config) { c.Credentials = creds })
	resp, body := authPost(t, url, "", "", secInitBody)
	if code, msg, _ := rpcError(t, body); resp.StatusCode != http.StatusOK || code != wire.CodeCredential ||
		!strings.Contains(msg, "mcpheal login -token-file "+file) {
		t.Fatalf("without a login: %d %s", resp.StatusCode, body)
	}
	if err := login.Write(file, &login.File{Server: up.url, Resource: up.url, TokenURL: "http://127.0.0.1:1/token",
		ClientID: "mcpheal", AccessToken: "login-token-A", Expiry: time.Now().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	// The file is looked at once a second at most; the hold-down after the
	// refusal does not outlast a new login.
	if !waitFor(5*time.Second, func() bool {
		resp, body = authPost(t, url, "", "", secInitBody)
		return resp.StatusCode == 200
	}) {
		t.Fatalf("after the login: %d %s", resp.StatusCode, body)
	}
}

// TestInboundAuth: with inbound tokens configured, a missing or wrong token
// gets 401 with WWW-Authenticate; the right one works and is not forwarded.
func TestInboundAuth(t *testing.T) {
	t.Parallel()
	up := peers.StartDialect(t, peers.DialectWP200)
	_, url := startProxy(t, up.URL(), func(c *conf.Config) { c.AuthTokens = []string{"inbound-token-0123456789"} })
	for _, tok := range []string{"", "wrong-token-000000000000"} {
		resp, body := authPost(t, url, "", tok, secInitBody)
		if code, _, id := rpcError(t, body); resp.StatusCode != 401 || code != wire.CodeUnauthorized || id != "1" ||
			!strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Bearer") {
			t.Fatalf("token %q: %d %v %s", tok, resp.StatusCode, resp.Header, body)
		}
	}
	sid := authInit(t, url, "inbound-token-0123456789")
	if resp, body := authPost(t, url, sid, "inbound-token-0123456789", echoCall); resp.StatusCode != 200 {
		t.Fatalf("with the token: %d %q", resp.StatusCode, body)
	}
	for _, r := range up.Requests() {
		if strings.Contains(r.Header.Get("Authorization"), "inbound-token") {
			t.Fatal("the inbound token was forwarded upstream")
		}
	}
}

// TestListenRequiresAuth: a non-loopback listener needs inbound auth or an
// explicit opt-in.
func TestListenRequiresAuth(t *testing.T) {
	t.Parallel()
	if _, err := New(conf.Config{Upstream: "http://127.0.0.1:1/mcp", Listen: "0.0.0.0:8787"}, nopLog()); err == nil {
		t.Fatal("non-loopback listen without auth accepted")
	}
	for _, c := range []conf.Config{
		{Upstream: "http://127.0.0.1:1/mcp", Listen: "0.0.0.0:8787", InsecureListen: true},
		{Upstream: "http://127.0.0.1:1/mcp", Listen: "0.0.0.0:8787", AuthTokens: []string{"inbound-token-0123456789"}},
		{Upstream: "http://127.0.0.1:1/mcp", Listen: "localhost:8787"},
	} {
		s, err := New(c, nopLog())
		if err != nil {
			t.Fatalf("%+v: %v", c, err)
		}
		s.Close()
	}
}

// TestSlowloris: a client that sends its request one byte at a time is cut
// off at the read timeout.
func TestSlowloris(t *testing.T) {
	t.Parallel()
	up := peers.StartDialect(t, peers.DialectWP200)
	_, url := startProxy(t, up.URL(), func(c *conf.Config) { c.ReadTimeout = 300 * time.Millisecond })
	c, err := net.Dial("tcp", strings.TrimSuffix(strings.TrimPrefix(url, "http://"), "/mcp"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	closed := make(chan time.Duration, 1)
	go func() {
		buf := make([]byte, 512)
		for {
			if _, err := c.Read(buf); err != nil {
				closed <- time.Since(start)
				return
			}
		}
	}()
	head := "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
	for i := 0; i < len(head); i++ {
		if _, err := c.Write([]byte{head[i]}); err != nil {
			break
		}
		select {
		case el := <-closed:
			if el > 2*time.Second {
				t.Fatalf("cut off after %v, want about 300ms", el)
			}
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
	t.Fatal("a one-byte-at-a-time client was never cut off")
}

// TestIdleNewConnectionTimesOut408: a connection on which the client sends
// nothing (one it dialed ahead and has not used) is closed at the read
// timeout with 408, which Go's net/http client takes as the server closing
// an unused connection; it was answered "400 malformed HTTP request", which
// Go clients logged as an unsolicited response. A request cut off half-way
// gets the same 408; a malformed one still gets 400.
func TestIdleNewConnectionTimesOut408(t *testing.T) {
	t.Parallel()
	up := peers.StartDialect(t, peers.DialectWP200)
	_, url := startProxy(t, up.URL(), func(c *conf.Config) { c.ReadTimeout = 300 * time.Millisecond })
	addr := strings.TrimSuffix(strings.TrimPrefix(url, "http://"), "/mcp")
	cases := []struct {
		name, send string
		status     int
	}{
		{"nothing sent", "", http.StatusRequestTimeout},
		{"half a request head", "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n", http.StatusRequestTimeout},
		{"malformed request line", "BOGUS\r\n\r\n", http.StatusBadRequest},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			conn, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
			if _, err := io.WriteString(conn, c.send); err != nil {
				t.Fatal(err)
			}
			br := bufio.NewReader(conn)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("no answer: %v", err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != c.status || !resp.Close {
				t.Fatalf("answered %d (close %v) %s, want %d and the connection closed", resp.StatusCode, resp.Close, body, c.status)
			}
			if _, err := br.ReadByte(); err != io.EOF {
				t.Errorf("connection still open after the %d (read: %v)", c.status, err)
			}
		})
	}
}

// TestHeaderTooLarge: an oversized request head gets 431.
func TestHeaderTooLarge(t *testing.T) {
	t.Parallel()
	up := peers.StartDialect(t, peers.DialectWP200)
	_, url := startProxy(t, up.URL(), func(c *conf.Config) { c.MaxHeaderBytes = 4096 })
	// A raw connection: the proxy answers as soon as the head overflows, and
	// a client still writing would race that answer.
	c, err := net.Dial("tcp", strings.TrimSuffix(strings.TrimPrefix(url, "http://"), "/mcp"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "POST /mcp HTTP/1.1\r\nHost: %s\r\nX-Pad: %s\r\n", c.RemoteAddr(), strings.Repeat("a", 8000))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Fatalf("oversized head: %d, want 431", resp.StatusCode)
	}
}

// TestSessionAndStreamCaps: sessions per credential are bounded (429), and
// streams per session too (the newest replaces the oldest).
func TestSessionAndStreamCaps(t *testing.T) {
	t.Parallel()
	up := peers.StartGoSDK(t, peers.GoSDKOpts{})
	_, url := startProxy(t, up.URL(), func(c *conf.Config) { c.MaxSessionsPerCredential = 2; c.MaxStreams = 1 })
	sid := authInit(t, url, "cap-token-00000001")
	authInit(t, url, "cap-token-00000001")
	resp, body := authPost(t, url, "", "cap-token-00000001", secInitBody)
	if code, _, _ := rpcError(t, body); resp.StatusCode != http.StatusOK || code != wire.CodeTooMany || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("third session: %d %q, want 200 -32015 with Retry-After", resp.StatusCode, body)
	}
	if resp, _ := authPost(t, url, "", "cap-token-00000002", secInitBody); resp.StatusCode != 200 {
		t.Fatalf("another credential: %d", resp.StatusCode)
	}
	open := func() (*http.Response, error) {
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		req.Header.Set("Accept", "text/event-stream")
		req.Header.Set("Mcp-Session-Id", sid)
		req.Header.Set("Authorization", "Bearer cap-token-00000001")
		return http.DefaultClient.Do(req)
	}
	// One stream per session: a second GET replaces the first (the agent has
	// abandoned it), which ends.
	first, err := open()
	if err != nil || first.StatusCode != 200 {
		t.Fatalf("first stream: %v %v", first, err)
	}
	defer first.Body.Close()
	second, err := open()
	if err != nil || second.StatusCode != 200 {
		t.Fatalf("second stream: %v %v", second, err)
	}
	defer second.Body.Close()
	ended := make(chan error, 1)
	go func() { _, err := io.Copy(io.Discard, first.Body); ended <- err }()
	select {
	case <-ended:
	case <-time.After(3 * time.Second):
		t.Fatal("the replaced stream stayed open")
	}
}

// TestWellKnownForwarded: OAuth discovery reaches the upstream's origin when
// the agent's credential passes through.
func TestWellKnownForwarded(t *testing.T) {
	t.Parallel()
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/.well-known/oauth-protected-resource/mcp" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"resource":"upstream","authorization_servers":["https://as.example"]}`)
	}))
	t.Cleanup(hs.Close)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r, err := NewRouter(ln.Addr().String(), []conf.Config{{Name: "a", Upstream: hs.URL + "/mcp", Path: "/mcp"}}, nopLog())
	if err != nil {
		t.Fatal(err)
	}
	go r.Serve(ln)
	t.Cleanup(func() { r.Shutdown(context.Background()) })
	resp, err := http.Get("http://" + ln.Addr().String() + "/.well-known/oauth-protected-resource/mcp")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), "authorization_servers") {
		t.Fatalf("well-known: %d %q", resp.StatusCode, body)
	}
}

// TestSecretsNeverLogged runs the scenarios above at debug level and checks
// that no credential and no full session id appears in the proxy's log.
func TestSecretsNeverLogged(t *testing.T) {
	t.Parallel()
	te := startTokenEndpoint(t)
	up := startAuthServer(t, map[string]string{"log-victim-token-1": "alice", "owned-token-0001": "svc"})
	logs := &testLog{t: t}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	creds := upstream.ClientCredentials(&clientcredentials.Config{ClientID: "mcpheal", ClientSecret: "client-secret-xyz", TokenURL: te.url})
	t.Cleanup(creds.Close)
	r, err := NewRouter(ln.Addr().String(), []conf.Config{
		{Name: "pass", Upstream: up.url, Path: "/mcp"},
		{Name: "owned", Upstream: up.url, Path: "/owned/mcp", Credentials: creds},
		{Name: "inbound", Upstream: up.url, Path: "/in/mcp", AuthTokens: []string{"inbound-secret-0123456789"}},
		{Name: "broken", Upstream: startBrokenUpstream(t), Path: "/broken/mcp", HealTimeout: time.Second},
	}, zeroLog(logs))
	if err != nil {
		t.Fatal(err)
	}
	go r.Serve(ln)
	t.Cleanup(func() { r.Shutdown(context.Background()) })
	base := "http://" + ln.Addr().String()
	var sids []string
	sid := authInit(t, base+"/mcp", "log-victim-token-1")
	sids = append(sids, sid)
	authPost(t, base+"/mcp", sid, "log-victim-token-1", echoCall)
	up.expireAll()
	authPost(t, base+"/mcp", sid, "log-victim-token-1", echoCall) // heal
	authPost(t, base+"/mcp", sid, "stolen-attempt-token", echoCall)
	osid := authInit(t, base+"/owned/mcp", "agent-secret-abc123")
	sids = append(sids, osid)
	authPost(t, base+"/in/mcp", "", "wrong-inbound-secret-00", secInitBody)
	authPost(t, base+"/mcp", sid, "log-victim-token-1", `{"jsonrpc":"2.0","id":9,`) // malformed
	// Malformed requests fasthttp rejects before the handler: its error
	// message would quote the request head.
	for _, head := range []string{
		"POST /mcp HTTP/1.1\r\n" + rawSecretHeaders,                                                      // no Host
		"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n" + rawSecretHeaders + "Cookie RAW-SECRET-TOKEN-x\r\n", // header line without a colon
		"GARBAGE\x01 /mcp?x HTTP/9\r\nHost: 127.0.0.1\r\n" + rawSecretHeaders,                            // garbage request line
	} {
		rawExchange(t, ln.Addr().String(), head+"Content-Length: 2\r\n\r\n{}")
	}
	// An upstream answer whose head does not parse and quotes the upstream
	// session id: logged (the call was refused), but without header values.
	bsid := peers.RawInitialize(t, base+"/broken/mcp")
	sids = append(sids, bsid)
	peers.RawPost(t, base+"/broken/mcp", bsid, echoCall)
	peers.RawPost(t, base+"/broken/mcp", bsid, `{"jsonrpc":"2.0","id":3,"method":"ping"}`)
	out := logs.String()
	if !strings.Contains(out, "error when serving connection") || !strings.Contains(out, "not replayed") {
		t.Fatalf("the malformed requests or the broken upstream answer were not logged; log:\n%s", out)
	}
	if !strings.Contains(out, "session healed") {
		t.Fatalf("the scenarios did not heal; log:\n%s", out)
	}
	secrets := []string{"log-victim-token-1", "stolen-attempt-token", "agent-secret-abc123", "owned-token-0001",
		"client-secret-xyz", "inbound-secret-0123456789", "wrong-inbound-secret", "secret-answer",
		"RAW-SECRET-TOKEN", "RAW-SECRET-SID", "UPSTREAM-SECRET"}
	secrets = append(secrets, sids...)
	for _, s := range secrets {
		if strings.Contains(out, s) {
			t.Errorf("log contains %q:\n%s", s, out)
		}
	}
	var n int
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line is not JSON: %q", line)
		}
		n++
	}
	if n == 0 {
		t.Fatal("no log lines")
	}
	_ = errors.New
}

// rawSecretHeaders are the credential and session id a malformed raw
// request carries.
const rawSecretHeaders = "Authorization: Bearer RAW-SECRET-TOKEN-0123456789\r\n" +
	"Mcp-Session-Id: RAW-SECRET-SID-0123456789\r\nContent-Type: application/json\r\n"

// rawExchange writes req on a new connection and reads until the proxy
// closes it or a second passes.
func rawExchange(t *testing.T, addr, req string) string {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(c)
	return string(b)
}

// startBrokenUpstream is a raw TCP MCP server: initialize gets a good answer
// with session id UPSTREAM-SECRET-SID-…, notifications 202, and every other
// request an answer whose head is broken (a line without a colon) and
// quotes the session id again.
func startBrokenUpstream(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	const sid = "UPSTREAM-SECRET-SID-0123456789"
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					body, _ := io.ReadAll(req.Body)
					switch {
					case strings.Contains(string(body), `"initialize"`):
						ans := `{"jsonrpc":"2.0","id":1,"result":{"protocolVersion":"2025-11-25","capabilities":{"tools":{}},"serverInfo":{"name":"broken","version":"1"}}}`
						fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nMcp-Session-Id: %s\r\nContent-Length: %d\r\n\r\n%s", sid, len(ans), ans)
					case strings.Contains(string(body), `"notifications/`):
						io.WriteString(c, "HTTP/1.1 202 Accepted\r\nContent-Length: 0\r\n\r\n")
					default:
						fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nMcp-Session-Id: %s\r\nX-Secret UPSTREAM-SECRET-HEADER\r\nContent-Type: application/json\r\n\r\n", sid)
						return
					}
				}
			}()
		}
	}()
	return "http://" + ln.Addr().String() + "/mcp"
}
