package proxy

import (
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
