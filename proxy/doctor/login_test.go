package doctor

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/mcpheal/mcpheal/upstream/login"
	"github.com/mcpheal/mcpheal/upstream/login/logintest"
)

// fileCredential is mcpheal's login as a test holds it: the access token
// of a token file `mcpheal login` wrote, read at each request.
type fileCredential struct {
	path    string
	refused atomic.Int32
}

func (c *fileCredential) Header(context.Context) (http.Header, error) {
	f, err := login.Read(c.path)
	if err != nil {
		return nil, err
	}
	return http.Header{"Authorization": {"Bearer " + f.AccessToken}}, nil
}

func (c *fileCredential) Refused(http.Header) { c.refused.Add(1) }
func (c *fileCredential) String() string      { return "token file " + c.path }

// brokenCredential cannot be had, as a login not made yet.
type brokenCredential struct{}

func (brokenCredential) Header(context.Context) (http.Header, error) {
	return nil, errors.New("no usable login in /nowhere/login.json (no such file: mcpheal has not logged in)")
}
func (brokenCredential) Refused(http.Header) {}
func (brokenCredential) String() string      { return "token file /nowhere/login.json" }

// logIn runs mcpheal's login against s, the test playing the browser, and
// writes the token file.
func logIn(t *testing.T, s *logintest.Server) string {
	t.Helper()
	lb, err := login.NewLoopback("127.0.0.1:0", &strings.Builder{})
	if err != nil {
		t.Fatal(err)
	}
	defer lb.Close()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	f, err := login.Login(ctx, login.Config{Server: s.URL, RedirectURL: lb.RedirectURL,
		Authorize: func(ctx context.Context, authURL string) (url.Values, error) {
			go func() { _, _ = logintest.Browse(ctx, authURL) }()
			return lb.Authorize(ctx, authURL)
		}})
	if err != nil {
		t.Fatalf("login: %v", err)
	}
	path := filepath.Join(t.TempDir(), "login.json")
	if err := login.Write(path, f); err != nil {
		t.Fatal(err)
	}
	return path
}

func runWith(t *testing.T, url string, o Options) (*Report, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	r, err := RunWith(ctx, url, o)
	if err != nil {
		t.Fatalf("RunWith(%s): %v", url, err)
	}
	var b strings.Builder
	_, _ = r.WriteTo(&b)
	t.Logf("report:\n%s", b.String())
	return r, b.String()
}

// TestDoctorOAuthServer: an OAuth-protected Go SDK server. Without a
// credential the verdict is that it needs a login, and the notes name the
// mcpheal login to run, not that it cannot be healed. With the token file
// mcpheal's login wrote, every probe carries its token as mcpheal's
// requests would, and the server is healable. A credential that cannot be
// had, or one the server refuses, is a login still needed, said so.
func TestDoctorOAuthServer(t *testing.T) {
	t.Parallel()
	s := logintest.Start(t)

	r, text := runWith(t, s.URL, Options{})
	if r.Verdict != VerdictNeedsLogin || r.Healable() || r.Auth == nil || !r.Auth.OAuth {
		t.Errorf("without a credential: verdict %v, auth %+v; want needs a login, OAuth", r.Verdict, r.Auth)
	}
	for _, want := range []string{"verdict: needs a login", "wants an OAuth login",
		"mcpheal login -token-file FILE " + s.URL, "mcpheal doctor --upstream-login FILE " + s.URL} {
		if !strings.Contains(text, want) {
			t.Errorf("report without a credential lacks %q", want)
		}
	}

	cred := &fileCredential{path: logIn(t, s)}
	r, text = runWith(t, s.URL, Options{Credential: cred, LoginFile: cred.path})
	if r.Verdict != VerdictHealable || !r.Healable() || r.Credential == nil || r.Credential.Err != "" || r.Credential.Refused {
		t.Errorf("with the login: verdict %v, credential %+v; want healable", r.Verdict, r.Credential)
	}
	if cred.refused.Load() != 0 || !strings.Contains(text, "credential     mcpheal's own, token file "+cred.path) {
		t.Errorf("with the login: %d refusals; report:\n%s", cred.refused.Load(), text)
	}
	if f, _ := login.Read(cred.path); strings.Contains(text, f.AccessToken) {
		t.Error("the access token appears in the report")
	}

	r, text = runWith(t, s.URL, Options{Credential: brokenCredential{}, LoginFile: "/nowhere/login.json"})
	if r.Verdict != VerdictNeedsLogin || r.Credential.Err == "" ||
		!strings.Contains(text, "mcpheal login -token-file /nowhere/login.json "+s.URL) {
		t.Errorf("with a login not made yet: verdict %v, credential %+v", r.Verdict, r.Credential)
	}

	// The server ends the token; the file's stays what it was, so the
	// retry after the 401 sends it again and is refused too.
	s.Revoke()
	r, text = runWith(t, s.URL, Options{Credential: cred, LoginFile: cred.path})
	if r.Verdict != VerdictNeedsLogin || !r.Credential.Refused || cred.refused.Load() == 0 ||
		!strings.Contains(text, "refuses mcpheal's credential") {
		t.Errorf("with a revoked token: verdict %v, credential %+v, %d refusals", r.Verdict, r.Credential, cred.refused.Load())
	}
}
