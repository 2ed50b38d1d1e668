package login

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestChallengeParams(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		in   string
		want map[string]string
	}{
		{`Bearer resource_metadata="https://a.example/.well-known/oauth-protected-resource/mcp", scope="files:read files:write"`,
			map[string]string{"resource_metadata": "https://a.example/.well-known/oauth-protected-resource/mcp", "scope": "files:read files:write"}},
		{`bearer error=invalid_token,Scope=a`, map[string]string{"error": "invalid_token", "scope": "a"}},
		{`Bearer error_description="say \"no\", twice"`, map[string]string{"error_description": `say "no", twice`}},
		{`Basic realm="x"`, map[string]string{}},
		{`Bearer realm="unterminated`, map[string]string{"realm": "unterminated"}},
		{``, map[string]string{}},
	} {
		got := challengeParams(c.in)
		if fmt.Sprint(got) != fmt.Sprint(c.want) {
			t.Errorf("challengeParams(%q) = %v, want %v", c.in, got, c.want)
		}
	}
}

// FuzzChallengeParams: a server's WWW-Authenticate never panics the parser,
// which always ends.
func FuzzChallengeParams(f *testing.F) {
	f.Add(`Bearer resource_metadata="https://x/.well-known/oauth-protected-resource", scope="a b"`)
	f.Add(`Bearer a="\`)
	f.Add(`Bearer =,=,"`)
	f.Fuzz(func(t *testing.T, s string) {
		for k := range challengeParams(s) {
			if k == "" {
				t.Fatalf("empty parameter name from %q", s)
			}
		}
	})
}

func TestCovers(t *testing.T) {
	t.Parallel()
	server, _ := url.Parse("https://mcp.example.com/tenant/mcp")
	for res, want := range map[string]bool{
		"https://mcp.example.com/tenant/mcp":  true,
		"https://mcp.example.com/tenant/mcp/": true,
		"https://mcp.example.com/tenant":      true,
		"https://MCP.example.com/":            true,
		"https://mcp.example.com/ten":         false, // not at a segment
		"http://mcp.example.com/tenant/mcp":   false,
		"https://evil.example.com/tenant/mcp": false,
		"https://mcp.example.com/other":       false,
		"::":                                  false,
	} {
		if got := covers(res, server); got != want {
			t.Errorf("covers(%q) = %v, want %v", res, got, want)
		}
	}
}

func TestMetadataURLs(t *testing.T) {
	t.Parallel()
	s, _ := url.Parse("https://mcp.example.com/tenant/mcp")
	got := strings.Join(prmURLs(s, "https://mcp.example.com/custom"), " ")
	want := "https://mcp.example.com/custom https://mcp.example.com/.well-known/oauth-protected-resource/tenant/mcp " +
		"https://mcp.example.com/.well-known/oauth-protected-resource"
	if got != want {
		t.Errorf("prmURLs: %s\nwant %s", got, want)
	}
	i, _ := url.Parse("https://auth.example.com/tenant1")
	got = strings.Join(asURLs(i), " ")
	want = "https://auth.example.com/.well-known/oauth-authorization-server/tenant1 " +
		"https://auth.example.com/.well-known/openid-configuration/tenant1 https://auth.example.com/tenant1/.well-known/openid-configuration"
	if got != want {
		t.Errorf("asURLs: %s\nwant %s", got, want)
	}
}

// hostileAS is an MCP server and authorization server in one, each
// answer shaped by the test, for the refusals no real server gives.
func hostileAS(t *testing.T, prm, as func(base string) any) string {
	t.Helper()
	var base string
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var v any
		switch {
		case r.URL.Path == "/mcp":
			w.Header().Set("WWW-Authenticate", `Bearer resource_metadata="`+base+`/.well-known/oauth-protected-resource/mcp"`)
			w.WriteHeader(http.StatusUnauthorized)
			return
		case strings.HasPrefix(r.URL.Path, "/.well-known/oauth-protected-resource"):
			v = prm(base)
		case r.URL.Path == "/.well-known/oauth-authorization-server":
			v = as(base)
		}
		if v == nil {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(v)
	}))
	t.Cleanup(hs.Close)
	base = hs.URL
	return base + "/mcp"
}

// TestLoginRefusals: each way a server's metadata is unfit stops the
// login with a message that says what is wrong and what to do.
func TestLoginRefusals(t *testing.T) {
	t.Parallel()
	goodPRM := func(base string) any {
		return map[string]any{"resource": base + "/mcp", "authorization_servers": []string{base}}
	}
	goodAS := func(base string) map[string]any {
		return map[string]any{"issuer": base, "authorization_endpoint": base + "/authorize", "token_endpoint": base + "/token",
			"code_challenge_methods_supported": []string{"S256"}}
	}
	for _, c := range []struct {
		name    string
		prm, as func(string) any
		want    string
	}{
		{"no metadata", func(string) any { return nil }, func(string) any { return nil }, "publishes no protected resource metadata"},
		{"another resource", func(string) any {
			return map[string]any{"resource": "https://elsewhere.example/mcp", "authorization_servers": []string{"https://as.example"}}
		}, func(string) any { return nil }, "RFC 9728 §3.3"},
		{"no PKCE", goodPRM, func(b string) any { m := goodAS(b); delete(m, "code_challenge_methods_supported"); return m }, "PKCE (S256)"},
		{"issuer mismatch", goodPRM, func(b string) any { m := goodAS(b); m["issuer"] = "https://evil.example"; return m }, "RFC 8414 §3.3"},
		{"no registration", goodPRM, func(b string) any { return goodAS(b) }, "pass -client-id"},
	} {
		server := hostileAS(t, c.prm, c.as)
		_, err := Login(context.Background(), Config{Server: server, RedirectURL: "http://127.0.0.1:1/callback",
			Authorize: func(context.Context, string) (url.Values, error) {
				t.Fatal("no authorization expected")
				return nil, nil
			}})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error with %q", c.name, err, c.want)
		}
	}
}

// TestLoginChecksTheRedirect: a redirect back with another state, or an
// error, ends the login before any token request.
func TestLoginChecksTheRedirect(t *testing.T) {
	t.Parallel()
	server := hostileAS(t, func(b string) any {
		return map[string]any{"resource": b + "/mcp", "authorization_servers": []string{b}}
	}, func(b string) any {
		return map[string]any{"issuer": b, "authorization_endpoint": b + "/authorize", "token_endpoint": b + "/token",
			"code_challenge_methods_supported": []string{"S256"}}
	})
	for q, want := range map[*url.Values]string{
		{"code": {"c"}, "state": {"forged"}}: "another login's state",
		{"error": {"access_denied"}}:         "refused the login: access_denied",
	} {
		_, err := Login(context.Background(), Config{Server: server, ClientID: "pre", RedirectURL: "http://127.0.0.1:1/callback",
			Authorize: func(_ context.Context, authURL string) (url.Values, error) {
				u, _ := url.Parse(authURL)
				for _, p := range []string{"code_challenge", "state", "resource"} {
					if u.Query().Get(p) == "" {
						t.Errorf("authorization URL lacks %s: %s", p, authURL)
					}
				}
				if u.Query().Get("code_challenge_method") != "S256" || u.Query().Get("resource") != server {
					t.Errorf("authorization URL: %s", authURL)
				}
				return *q, nil
			}})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("redirect %v: %v, want %q", *q, err, want)
		}
	}
}

// TestFileIsPrivate: the token file is written 0600 whatever the umask
// allows, replaced whole, and a damaged one is refused without quoting it.
func TestFileIsPrivate(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "login.json")
	f := &File{Server: "https://x/mcp", TokenURL: "https://x/token", ClientID: "c", AccessToken: "tok-secret",
		Expiry: time.Now().Add(time.Hour).Round(time.Second)}
	for range 2 {
		if err := Write(path, f); err != nil {
			t.Fatal(err)
		}
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v, %v", st.Mode(), err)
	}
	got, err := Read(path)
	if err != nil || got.AccessToken != "tok-secret" || !got.Expiry.Equal(f.Expiry) {
		t.Fatalf("read back %+v, %v", got, err)
	}
	entries, _ := os.ReadDir(filepath.Dir(path))
	if len(entries) != 1 {
		t.Errorf("%d files beside the token file, want none", len(entries)-1)
	}
	if err := os.WriteFile(path, []byte(`{"access_token":"tok-secret",`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(path); err == nil || strings.Contains(err.Error(), "tok-secret") {
		t.Errorf("damaged file: %v", err)
	}
}
