package proxy

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"

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
	s := &Server{cfg: Config{Path: "/wp/mcp"}, link: &link{up: up}}
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
		if got := string(s.ownChallenge(&h, []byte(c.in))); got != c.want {
			t.Errorf("%s: ownChallenge(%s) = %s, want %s", c.name, c.in, got, c.want)
		}
	}
	if p := s.prm.Load(); p == nil || *p != "/custom/prm.json" {
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
	r, err := NewRouter(ln.Addr().String(), []Config{{Upstream: base + "/mcp", Listen: ln.Addr().String(), AdminListen: "off"}}, nopLog())
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
