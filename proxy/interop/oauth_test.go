package interop

// OAuth through mcpheal (docs/oauth.md) against the TS SDK v1 example server
// and its demo authorization server (simpleStreamableHttp --oauth, and
// --oauth-strict, which issues tokens only for the server's own URL and
// accepts only such tokens): the agent logs in through mcpheal, or mcpheal
// logs in once for every agent; real clients (TS SDK v1, Go SDK) on the
// other side.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/modelcontextprotocol/go-sdk/oauthex"
	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"github.com/mcpheal/mcpheal/proxy"
	"github.com/mcpheal/mcpheal/proxy/doctor"
	"github.com/mcpheal/mcpheal/upstream"
	"github.com/mcpheal/mcpheal/upstream/login"
)

// oauthDemo is one simpleStreamableHttp --oauth process: the MCP server at
// url (on localhost, the name its metadata uses) and its authorization
// server.
type oauthDemo struct {
	proc *nodeProc
	url  string
}

func startOAuthDemo(t *testing.T, strict bool) *oauthDemo {
	t.Helper()
	mcpPort, asPort := freePort(t), freePort(t)
	args := []string{"--import", "./guard.mjs",
		"node_modules/@modelcontextprotocol/sdk/dist/esm/examples/server/simpleStreamableHttp.js", "--oauth"}
	if strict {
		args = append(args, "--oauth-strict")
	}
	p := startNode(t, "oauth-demo", []string{"MCP_PORT=" + strconv.Itoa(mcpPort), "MCP_AUTH_PORT=" + strconv.Itoa(asPort)}, args...)
	from := 0
	for range 2 {
		n, _, ok := p.out.waitFor(from, startTimeout, func(l string) bool { return strings.HasPrefix(l, "LISTENING ") })
		if !ok {
			t.Fatalf("the OAuth demo did not start; stderr:\n%s", p.stderr.String())
		}
		from = n + 1
	}
	return &oauthDemo{proc: p, url: fmt.Sprintf("http://localhost:%d/mcp", mcpPort)}
}

// sessionsMade counts the upstream sessions the demo opened.
func (d *oauthDemo) sessionsMade() int {
	return d.proc.out.count(func(l string) bool { return strings.HasPrefix(l, "Session initialized with ID: ") })
}

// lastSession is the id of the newest upstream session.
func (d *oauthDemo) lastSession(t *testing.T) string {
	t.Helper()
	var id string
	d.proc.out.count(func(l string) bool {
		if s, ok := strings.CutPrefix(l, "Session initialized with ID: "); ok {
			id = s
		}
		return false
	})
	if id == "" {
		t.Fatal("the demo opened no session")
	}
	return id
}

// endSession DELETEs an upstream session behind mcpheal's back, as an
// idle expiry or a restart would end it.
func (d *oauthDemo) endSession(t *testing.T, sid, token string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodDelete, d.url, nil)
	req.Header.Set("Mcp-Session-Id", sid)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("DELETE of upstream session: %d", resp.StatusCode)
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// tsOAuthResult is one oauthclient.mjs run.
type tsOAuthResult struct {
	OK       bool   `json:"ok"`
	Text     string `json:"text"`
	Resource string `json:"resource"`
	Stage    string `json:"stage"`
	Message  string `json:"message"`
}

// runTSOAuthClient runs testdata/oauthclient.mjs (TS SDK v1 with an
// OAuthClientProvider) against url.
func runTSOAuthClient(t *testing.T, url, name string) tsOAuthResult {
	t.Helper()
	p := startNode(t, "oauthclient", nil, "oauthclient.mjs", url, name)
	_, line, ok := p.out.waitFor(0, 30*time.Second, func(l string) bool { return strings.HasPrefix(l, "RESULT ") })
	if !ok {
		t.Fatalf("oauthclient.mjs gave no result; stderr:\n%s", p.stderr.String())
	}
	var r tsOAuthResult
	if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "RESULT ")), &r); err != nil {
		t.Fatal(err)
	}
	return r
}

// approve plays the user at the demo authorization server, which approves
// at once: it fetches authURL and returns the redirect's query.
func approve(ctx context.Context, authURL string) (url.Values, error) {
	c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, authURL, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	resp.Body.Close()
	loc, err := url.Parse(resp.Header.Get("Location"))
	if err != nil || loc.Query().Get("code") == "" {
		return nil, fmt.Errorf("authorization answered %d, Location %q", resp.StatusCode, resp.Header.Get("Location"))
	}
	return loc.Query(), nil
}

// goSDKOAuth is a Go SDK client that logs in with the SDK's authorization
// code handler (dynamic registration, PKCE), as the conformance
// everything-client does; token returns its current access token.
type goSDKOAuth struct {
	session *mcp.ClientSession
	handler *auth.AuthorizationCodeHandler
}

func connectGoSDKOAuth(t *testing.T, serverURL string) *goSDKOAuth {
	t.Helper()
	const redirect = "http://127.0.0.1:9/callback"
	h, err := auth.NewAuthorizationCodeHandler(&auth.AuthorizationCodeHandlerConfig{
		AuthorizationCodeFetcher: func(ctx context.Context, a *auth.AuthorizationArgs) (*auth.AuthorizationResult, error) {
			q, err := approve(ctx, a.URL)
			if err != nil {
				return nil, err
			}
			return &auth.AuthorizationResult{Code: q.Get("code"), State: q.Get("state"), Iss: q.Get("iss")}, nil
		},
		DynamicClientRegistrationConfig: &auth.DynamicClientRegistrationConfig{
			// client_secret_post: the TS SDK authorization server reads the client
			// id from the form only (the Go SDK would pick HTTP Basic).
			Metadata: &oauthex.ClientRegistrationMetadata{RedirectURIs: []string{redirect}, TokenEndpointAuthMethod: "client_secret_post"},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := mcp.NewClient(&mcp.Implementation{Name: "go-sdk-oauth", Version: "1"}, nil)
	s, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: serverURL, OAuthHandler: h}, nil)
	if err != nil {
		t.Fatalf("Go SDK client with OAuth: connect %s: %v", serverURL, err)
	}
	t.Cleanup(func() { s.Close() })
	return &goSDKOAuth{session: s, handler: h}
}

func (g *goSDKOAuth) token(t *testing.T) string {
	t.Helper()
	ts, err := g.handler.TokenSource(context.Background())
	if err != nil || ts == nil {
		t.Fatalf("no token source: %v", err)
	}
	tok, err := ts.Token()
	if err != nil {
		t.Fatal(err)
	}
	return tok.AccessToken
}

// greet calls the demo's greet tool and checks its answer.
func greet(t *testing.T, s *mcp.ClientSession, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	res, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "greet", Arguments: map[string]any{"name": name}})
	if err != nil {
		t.Fatalf("greet: %v", err)
	}
	if res.IsError || len(res.Content) == 0 || !strings.Contains(res.Content[0].(*mcp.TextContent).Text, name) {
		t.Fatalf("greet: %+v", res)
	}
}

// oauthProxy is mcpheal as the binary serves it (a Router: it also answers
// the agent's OAuth discovery), logging everything at debug level.
type oauthProxy struct {
	r    *proxy.Router
	url  string
	logs *syncBuf
}

func startOAuthProxy(t *testing.T, c proxy.Config) *oauthProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c.Listen, c.AdminListen, c.HealTimeout = ln.Addr().String(), "off", 5*time.Second
	p := &oauthProxy{url: "http://" + ln.Addr().String() + "/mcp", logs: &syncBuf{}}
	if p.r, err = proxy.NewRouter(c.Listen, []proxy.Config{c}, zerolog.New(p.logs).Level(zerolog.DebugLevel)); err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = p.r.Serve(ln)
	}()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		_ = p.r.Shutdown(ctx)
		<-served
		if t.Failed() {
			t.Logf("mcpheal log:\n%s", p.logs.String())
		}
	})
	return p
}

// metrics is the admin endpoint's /metrics.
func (p *oauthProxy) metrics() string {
	var ctx fasthttp.RequestCtx
	ctx.Request.SetRequestURI("http://127.0.0.1/metrics")
	ctx.Request.Header.SetHost("127.0.0.1")
	p.r.AdminHandler(&ctx)
	return string(ctx.Response.Body())
}

// heals is the count of heals that ended well, from /metrics.
func (p *oauthProxy) heals(t *testing.T) int {
	t.Helper()
	n := 0
	for _, l := range strings.Split(p.metrics(), "\n") {
		if strings.HasPrefix(l, "mcpheal_heals_total{") && strings.Contains(l, `outcome="ok"`) {
			f := strings.Fields(l)
			v, _ := strconv.ParseFloat(f[len(f)-1], 64)
			n += int(v)
		}
	}
	return n
}

// syncBuf is a goroutine-safe log sink that keeps everything.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestOAuthAgentLogsInThroughMcpheal: against a server that does not bind
// tokens to its URL, the TS SDK v1 and Go SDK clients log in through
// mcpheal as they do directly (the token names mcpheal's URL), call a tool,
// and a heal re-creates the upstream session under the agent's own token.
// Another agent holding the session id but not the token gets nothing.
func TestOAuthAgentLogsInThroughMcpheal(t *testing.T) {
	t.Parallel()
	demo := startOAuthDemo(t, false)
	direct := runTSOAuthClient(t, demo.url, "direct")
	if !direct.OK || direct.Resource != demo.url {
		t.Fatalf("TS client directly: %+v (want ok, resource %s)", direct, demo.url)
	}
	greet(t, connectGoSDKOAuth(t, demo.url).session, "direct")
	p := startOAuthProxy(t, proxy.Config{Upstream: demo.url})
	proxyURL := p.url
	ts := runTSOAuthClient(t, proxyURL, "ts-agent")
	if !ts.OK || !strings.Contains(ts.Text, "ts-agent") {
		t.Fatalf("TS client through mcpheal: %+v", ts)
	}
	if ts.Resource != proxyURL {
		t.Errorf("TS client asked a token for %q, want mcpheal's URL %s", ts.Resource, proxyURL)
	}

	g := connectGoSDKOAuth(t, proxyURL)
	greet(t, g.session, "go-agent")
	tok := g.token(t)

	// The upstream ends the session; the next call heals under the
	// agent's token (the demo refuses an initialize without one).
	before := demo.sessionsMade()
	demo.endSession(t, demo.lastSession(t), tok)
	greet(t, g.session, "after-heal")
	if got := demo.sessionsMade(); got != before+1 {
		t.Errorf("upstream sessions: %d after the heal, want %d", got, before+1)
	}
	if n := p.heals(t); n != 1 {
		t.Errorf("heals counted: %d, want 1", n)
	}

	// A session-era agent's session id, held by another agent without the
	// token (or with another): refused, never the first agent's result.
	sid := agentPost(t, proxyURL, "", "Bearer "+tok, `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{`+
		`"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`).Header.Get("Mcp-Session-Id")
	if sid == "" {
		t.Fatal("no session id from mcpheal")
	}
	agentPost(t, proxyURL, sid, "Bearer "+tok, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	call := `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"greet","arguments":{"name":"thief"}}}`
	for _, cred := range []string{"", "Bearer not-the-token"} {
		resp := agentPost(t, proxyURL, sid, cred, call)
		// mcpheal answers 404 without the credential the session is bound
		// to; with another, the upstream judges it (the demo: 500).
		if resp.StatusCode < 400 || strings.Contains(resp.body, "thief") {
			t.Errorf("a stolen session id with Authorization %q: %d %s, want a refusal and no result", cred, resp.StatusCode, resp.body)
		}
	}
	if resp := agentPost(t, proxyURL, sid, "Bearer "+tok, call); !strings.Contains(resp.body, "thief") {
		t.Errorf("the session's own agent: %d %s", resp.StatusCode, resp.body)
	}
	checkNoSecrets(t, p.logs.String()+p.metrics(), tok)
}

// TestOAuthStrictNeedsMcphealLogin: a server that binds tokens to its own
// URL (--oauth-strict) refuses a login through mcpheal, which asks for a
// token for mcpheal's URL; `mcpheal login` logs in once with the server's
// own URL as the resource, and agents with no OAuth at all (TS SDK v1, Go
// SDK) call tools through it, heals included. The token file is 0600 and
// no token reaches mcpheal's log, metrics or the doctor's report.
func TestOAuthStrictNeedsMcphealLogin(t *testing.T) {
	t.Parallel()
	demo := startOAuthDemo(t, true)
	if direct := runTSOAuthClient(t, demo.url, "direct"); !direct.OK {
		t.Fatalf("TS client directly: %+v", direct)
	}

	// The agent's own login through mcpheal: refused by the authorization
	// server when the agent exchanges its code (the resource is mcpheal's).
	plainURL := startOAuthProxy(t, proxy.Config{Upstream: demo.url}).url
	if r := runTSOAuthClient(t, plainURL, "agent"); r.OK || r.Stage != "token" || r.Resource != plainURL {
		t.Fatalf("TS client logging in through mcpheal to a strict server: %+v, want a refusal at the token stage", r)
	}

	// mcpheal's own login, as `mcpheal login` runs it: the loopback
	// listener gets the redirect back from a "browser".
	file := filepath.Join(t.TempDir(), "login.json")
	var out syncBuf
	lb, err := login.NewLoopback("127.0.0.1:0", &out)
	if err != nil {
		t.Fatal(err)
	}
	defer lb.Close()
	var code string
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := login.Login(ctx, login.Config{Server: demo.url, RedirectURL: lb.RedirectURL,
		Authorize: func(ctx context.Context, authURL string) (url.Values, error) {
			go func() {
				// The user's browser: the authorization server redirects to
				// the loopback listener, which the browser follows.
				if resp, err := http.Get(authURL); err == nil {
					resp.Body.Close()
				}
			}()
			q, err := lb.Authorize(ctx, authURL)
			code = q.Get("code")
			return q, err
		}})
	if err != nil {
		t.Fatalf("mcpheal login: %v\n%s", err, out.String())
	}
	if l.Resource != demo.url || l.AccessToken == "" || l.ClientID == "" {
		t.Fatalf("login: resource %q, token set %v, client %q", l.Resource, l.AccessToken != "", l.ClientID)
	}
	if !strings.Contains(out.String(), "Open this URL") {
		t.Errorf("the login printed no URL to open: %q", out.String())
	}
	if err := login.Write(file, l); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(file); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("token file: %v, mode %v, want 0600", err, st.Mode().Perm())
	}

	creds := upstream.LoginCredentials(file)
	t.Cleanup(creds.Close)
	p := startOAuthProxy(t, proxy.Config{Upstream: demo.url, Credentials: creds})
	proxyURL := p.url
	ts := runTSOAuthClient(t, proxyURL, "ts-plain")
	if !ts.OK || ts.Resource != "" {
		t.Fatalf("TS client through mcpheal's login: %+v (want ok, and no login of its own)", ts)
	}
	c := mcp.NewClient(&mcp.Implementation{Name: "go-sdk-plain", Version: "1"}, nil)
	g, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: proxyURL}, nil)
	if err != nil {
		t.Fatalf("Go SDK client without OAuth through mcpheal's login: %v", err)
	}
	defer g.Close()
	greet(t, g, "go-plain")

	before := demo.sessionsMade()
	demo.endSession(t, demo.lastSession(t), l.AccessToken)
	greet(t, g, "after-heal")
	if got := demo.sessionsMade(); got != before+1 {
		t.Errorf("upstream sessions: %d after the heal, want %d", got, before+1)
	}
	if n := p.heals(t); n != 1 {
		t.Errorf("heals counted: %d, want 1", n)
	}

	// The doctor says how the server authenticates and what works.
	rep, err := doctor.Run(ctx, demo.url, nil)
	if err != nil {
		t.Fatal(err)
	}
	var report bytes.Buffer
	_, _ = rep.WriteTo(&report)
	for _, want := range []string{"OAuth: resource " + demo.url, "dynamic client registration", "mcpheal login -token-file FILE " + demo.url} {
		if !strings.Contains(report.String(), want) {
			t.Errorf("doctor report lacks %q:\n%s", want, report.String())
		}
	}
	metrics := p.metrics()
	if !strings.Contains(metrics, "mcpheal_heals_total") {
		t.Fatalf("no metrics gathered:\n%s", metrics)
	}
	checkNoSecrets(t, p.logs.String()+metrics+report.String()+out.String(), l.AccessToken, code)
}

// rawAnswer is one answer to rawPost, its body read whole.
type rawAnswer struct {
	*http.Response
	body string
}

// agentPost sends one JSON-RPC message as a session-era agent would.
func agentPost(t *testing.T, url, sid, authz, body string) rawAnswer {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("MCP-Protocol-Version", "2025-11-25")
	if sid != "" {
		req.Header.Set("Mcp-Session-Id", sid)
	}
	if authz != "" {
		req.Header.Set("Authorization", authz)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	_, _ = b.ReadFrom(resp.Body)
	resp.Body.Close()
	return rawAnswer{resp, b.String()}
}

// checkNoSecrets fails t if any secret appears in text.
func checkNoSecrets(t *testing.T, text string, secrets ...string) {
	t.Helper()
	if len(text) == 0 {
		t.Fatal("nothing to search: no log was kept")
	}
	for _, s := range secrets {
		if s != "" && strings.Contains(text, s) {
			t.Errorf("a secret (%d bytes, %.4s…) appears in mcpheal's output", len(s), s)
		}
	}
}
