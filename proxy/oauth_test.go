package proxy

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/valyala/fasthttp"

	"github.com/mcpheal/mcpheal/proxy/internal/conf"
	"github.com/mcpheal/mcpheal/proxy/internal/exchange"
	"github.com/mcpheal/mcpheal/proxy/internal/link"
	"github.com/mcpheal/mcpheal/proxy/internal/peers"
	"github.com/mcpheal/mcpheal/upstream"
)

// TestOwnDiscovery: the upstream's challenge and protected resource
// metadata, as an agent gets them through mcpheal (oauth.go): what is on
// the upstream's origin moves to mcpheal's, where the agent reached it;
// anything else is left as the server wrote it.
func TestOwnDiscovery(t *testing.T) {
	t.Parallel()
	up, err := upstream.New(upstream.Config{URL: "https://mcp.example.com/mcp"})
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close()
	s := &Server{cfg: conf.Config{Path: "/wp/mcp"}, link: &link.Link{Up: up}}
	ch := &exchange.Challenges{Link: s.link, Path: s.cfg.Path}
	var h fasthttp.RequestHeader
	h.SetHost("127.0.0.1:8787")
	for _, c := range []struct{ name, in, want string }{
		{"default location", `Bearer error="invalid_token", resource_metadata="https://mcp.example.com/.well-known/oauth-protected-resource/mcp"`,
			`Bearer error="invalid_token", resource_metadata="http://127.0.0.1:8787/.well-known/oauth-protected-resource/wp/mcp"`},
		{"custom location", `Bearer resource_metadata="https://mcp.example.com/custom/prm.json", scope="read"`,
			`Bearer resource_metadata="http://127.0.0.1:8787/.well-known/oauth-protected-resource/wp/mcp", scope="read"`},
		{"another host", `Bearer resource_metadata="https://auth.example.com/prm"`, `Bearer resource_metadata="https://auth.example.com/prm"`},
		{"none", `Bearer realm="x"`, `Bearer realm="x"`},
	} {
		if got := string(ch.Own(&h, []byte(c.in))); got != c.want {
			t.Errorf("%s: ownChallenge(%s) = %s, want %s", c.name, c.in, got, c.want)
		}
	}
	if p := ch.Prm.Load(); p == nil || *p != "/custom/prm.json" {
		t.Errorf("the custom location is not remembered for Server.wellKnown: %v", p)
	}
	h.Set("X-Forwarded-Proto", "https")
	for _, c := range []struct{ name, in, want string }{
		{"the upstream's URL", `{"resource":"https://mcp.example.com/mcp","authorization_servers":["https://mcp.example.com"]}`,
			`{"resource":"https://127.0.0.1:8787/wp/mcp","authorization_servers":["https://mcp.example.com"]}`},
		{"the origin (root metadata)", `{"resource":"https://mcp.example.com"}`, `{"resource":"https://127.0.0.1:8787"}`},
		{"another resource", `{"resource":"https://other.example.com/mcp"}`, `{"resource":"https://other.example.com/mcp"}`},
		{"not metadata", `not json`, `not json`},
	} {
		if got := string(s.ownMetadata(&h, []byte(c.in))); got != c.want {
			t.Errorf("%s: ownMetadata(%s) = %s, want %s", c.name, c.in, got, c.want)
		}
	}
}

// TestOwnMetadataAtCustomLocation: a server whose challenge names its
// metadata at a location of its own (not RFC 9728's): the agent, sent to
// mcpheal's well-known URL, gets that document with mcpheal's URL as its
// resource (it got the server's, and the client then refused it and fell
// back to mcpheal's origin as the authorization server).
func TestOwnMetadataAtCustomLocation(t *testing.T) {
	t.Parallel()
	var base string
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/mcp":
			w.Header().Set("WWW-Authenticate", `Bearer resource_metadata="`+base+`/custom/metadata/location.json"`)
			w.WriteHeader(http.StatusUnauthorized)
		case "/custom/metadata/location.json":
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"resource":"%s/mcp","authorization_servers":["https://as.example/tenant1"]}`, base)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(hs.Close)
	base = hs.URL
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r, err := NewRouter(ln.Addr().String(), []conf.Config{{Upstream: base + "/mcp", Listen: ln.Addr().String(), AdminListen: "off"}}, nopLog())
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = r.Serve(ln) }()
	t.Cleanup(func() { _ = r.Shutdown(context.Background()) })
	own := "http://" + ln.Addr().String()
	resp, err := http.Post(own+"/mcp", "application/json", strings.NewReader(secInitBody))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	want := `Bearer resource_metadata="` + own + `/.well-known/oauth-protected-resource/mcp"`
	if got := resp.Header.Get("WWW-Authenticate"); resp.StatusCode != http.StatusUnauthorized || got != want {
		t.Fatalf("challenge: %d %q, want %q", resp.StatusCode, got, want)
	}
	resp, err = http.Get(own + "/.well-known/oauth-protected-resource/mcp")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if want := `{"resource":"` + own + `/mcp","authorization_servers":["https://as.example/tenant1"]}`; string(b) != want {
		t.Errorf("metadata: %d %s, want %s", resp.StatusCode, b, want)
	}
}

// TestWellKnownGuarded: OAuth discovery is a route like the MCP
// endpoint's. A foreign Host (DNS rebinding, which would get a document
// naming its own origin as the resource) gets 403; an upstream whose
// credential is mcpheal's (inbound auth tokens) has nothing to log in to
// and gets 404; a document larger than maxMetadata is refused, never held;
// while a document is read and until it is written it is counted in the
// memory budget, which comes back whole. Before, every well-known request
// passed before the guard, and a 30 MB document fetched by 40 slow readers
// held 1.4 GB outside memory_budget.
func TestWellKnownGuarded(t *testing.T) {
	t.Parallel()
	var base string
	var size atomic.Int64
	size.Store(100)
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/.well-known/oauth-protected-resource/mcp" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"resource":"%s/mcp","authorization_servers":["https://as.example"],"pad":"%s"}`, base,
			strings.Repeat("p", int(size.Load())))
	}))
	t.Cleanup(hs.Close)
	base = hs.URL
	serve := func(c conf.Config) (*Server, string) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		c.Upstream, c.Listen, c.AdminListen = base+"/mcp", ln.Addr().String(), "off"
		r, err := NewRouter(ln.Addr().String(), []conf.Config{c}, nopLog())
		if err != nil {
			t.Fatal(err)
		}
		go func() { _ = r.Serve(ln) }()
		t.Cleanup(func() { _ = r.Shutdown(context.Background()) })
		return r.routes.Load().byPath["/mcp"], "http://" + ln.Addr().String()
	}
	get := func(url, host string) (int, string) {
		req, _ := http.NewRequest(http.MethodGet, url+"/.well-known/oauth-protected-resource/mcp", nil)
		if host != "" {
			req.Host = host
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}

	s, own := serve(conf.Config{})
	base0 := s.mem.Used.Load()
	if st, b := get(own, ""); st != http.StatusOK || !strings.Contains(b, `"resource":"`+own+`/mcp"`) {
		t.Fatalf("metadata: %d %.200s; want mcpheal's URL as the resource", st, b)
	}
	if st, b := get(own, "evil.example"); st != http.StatusForbidden || strings.Contains(b, "evil.example") {
		t.Errorf("metadata for a foreign Host: %d %.200s; want 403", st, b)
	}
	size.Store(maxMetadata + 1)
	if st, b := get(own, ""); st != http.StatusBadGateway || !strings.Contains(b, strconv.Itoa(maxMetadata)) {
		t.Errorf("metadata past %d bytes: %d %.200s; want 502 naming the cap", maxMetadata, st, b)
	}
	peers.Wait(t, "the budget to come back", func() bool { return s.mem.Used.Load() == base0 })

	_, guarded := serve(conf.Config{AuthTokens: []string{"inbound-token-0000001"}})
	size.Store(100)
	if st, b := get(guarded, ""); st != http.StatusNotFound {
		t.Errorf("metadata of an upstream behind inbound auth: %d %.200s; want 404", st, b)
	}
}
