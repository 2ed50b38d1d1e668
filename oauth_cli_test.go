package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mcpheal/mcpheal/upstream/login"
	"github.com/mcpheal/mcpheal/upstream/login/logintest"
)

// terminal is the stdout of `mcpheal login`: it keeps what was printed and
// hands the authorization URL to the test, which plays the user.
type terminal struct {
	mu   sync.Mutex
	b    bytes.Buffer
	once sync.Once
	url  chan string
}

func newTerminal() *terminal { return &terminal{url: make(chan string, 1)} }

func (t *terminal) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b.Write(p)
	for _, l := range strings.Split(t.b.String(), "\n") {
		if l = strings.TrimSpace(l); strings.HasPrefix(l, "http") {
			t.once.Do(func() { t.url <- l })
		}
	}
	return len(p), nil
}

func (t *terminal) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.b.String()
}

// stray is a request to the loopback listener that is not the login's
// redirect back, and the status it must get.
type stray struct {
	path   string
	status int
}

// loginCLI runs `mcpheal login -token-file file server`; before it plays
// the user's browser at the printed URL, the stray requests are sent, in
// order.
func loginCLI(t *testing.T, file, server string, strays ...stray) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	term := newTerminal()
	var errb bytes.Buffer
	exit := make(chan int, 1)
	go func() { exit <- cli(ctx, []string{"login", "-token-file", file, server}, term, &errb) }()
	var authURL string
	select {
	case authURL = <-term.url:
	case code := <-exit:
		t.Fatalf("login ended (exit %d) before printing a URL: %s", code, errb.String())
	}
	au, err := url.Parse(authURL)
	if err != nil {
		t.Fatal(err)
	}
	redirect, err := url.Parse(au.Query().Get("redirect_uri"))
	if err != nil || redirect.Host == "" {
		t.Fatalf("authorization URL without a redirect URI: %s", authURL)
	}
	for _, s := range strays {
		resp, err := http.Get("http://" + redirect.Host + s.path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != s.status {
			t.Errorf("GET %s on the loopback listener: %d %q, want %d", s.path, resp.StatusCode, body, s.status)
		}
	}
	if code, err := logintest.Browse(ctx, authURL); err != nil || code != http.StatusOK {
		t.Errorf("the browser's redirect back: %d, %v", code, err)
	}
	if code := <-exit; code != 0 {
		t.Fatalf("login: exit %d, %s\n%s", code, errb.String(), term.String())
	}
	return term.String()
}

// TestLoginCLIIgnoresStrayRedirects: `mcpheal login` against an
// OAuth-protected server: a redirect back with another login's state, one
// with a forged error, and a favicon request reach the loopback listener
// first and are refused without ending the login; the browser's real
// redirect back then completes it and the token file is written (0600).
func TestLoginCLIIgnoresStrayRedirects(t *testing.T) {
	t.Parallel()
	s := logintest.Start(t)
	file := filepath.Join(t.TempDir(), "login.json")
	out := loginCLI(t, file, s.URL,
		stray{"/callback?code=stolen&state=another-login", http.StatusBadRequest},
		stray{"/callback?error=access_denied&state=another-login", http.StatusBadRequest},
		stray{"/favicon.ico", http.StatusNotFound})
	if !strings.Contains(out, "Logged in to "+s.URL) {
		t.Errorf("login output:\n%s", out)
	}
	f, err := login.Read(file)
	if err != nil || f.AccessToken == "" || f.RefreshToken == "" || f.Resource != s.URL {
		t.Fatalf("token file: %+v, %v", f, err)
	}
	if st, err := os.Stat(file); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("token file mode: %v, %v", st.Mode(), err)
	}
}

// TestDoctorUsesLogin: `mcpheal doctor` against an OAuth-protected server.
// Without a credential it says the server wants an OAuth login and names
// the mcpheal login to run (not "not healable"); with a token file that
// does not exist yet, the same, naming that file. With the token file
// `mcpheal login` wrote (--upstream-login, or credentials: {oauth:
// {token_file: …}} in a config file) it probes as mcpheal would and finds
// the server healable; after the server revoked the access token it
// refreshes the login, as mcpheal does, and writes it back. No token
// appears in a report.
func TestDoctorUsesLogin(t *testing.T) {
	t.Parallel()
	s := logintest.Start(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "login.json")
	var all strings.Builder // every report, searched for tokens at the end
	doctor := func(args ...string) (int, string) {
		t.Helper()
		var out, errb bytes.Buffer
		code := cli(context.Background(), append([]string{"doctor"}, args...), &out, &errb)
		all.WriteString(out.String() + errb.String())
		t.Logf("mcpheal doctor %s: exit %d\n%s%s", strings.Join(args, " "), code, out.String(), errb.String())
		return code, out.String() + errb.String()
	}

	code, out := doctor(s.URL)
	for _, want := range []string{"verdict: needs a login", "wants an OAuth login",
		"mcpheal login -token-file FILE " + s.URL, "mcpheal doctor --upstream-login FILE " + s.URL} {
		if !strings.Contains(out, want) {
			t.Errorf("doctor without a credential lacks %q:\n%s", want, out)
		}
	}
	if code != 1 || strings.Contains(out, "not healable") || strings.Contains(out, "cannot heal") {
		t.Errorf("doctor without a credential: exit %d, want 1 and no \"not healable\":\n%s", code, out)
	}

	code, out = doctor("--upstream-login", file, s.URL)
	for _, want := range []string{"verdict: needs a login", "no usable login in " + file,
		"mcpheal login -token-file " + file + " " + s.URL} {
		if !strings.Contains(out, want) {
			t.Errorf("doctor with a token file not written yet lacks %q:\n%s", want, out)
		}
	}
	if code != 1 {
		t.Errorf("doctor with a token file not written yet: exit %d, want 1", code)
	}

	loginCLI(t, file, s.URL)
	first, err := login.Read(file)
	if err != nil {
		t.Fatal(err)
	}
	code, out = doctor(s.URL, "--upstream-login", file)
	if code != 0 || !strings.Contains(out, "verdict: healable") || !strings.Contains(out, "→ SessionGone") ||
		!strings.Contains(out, "credential     mcpheal's own, --upstream-login "+file) {
		t.Errorf("doctor with the login: exit %d\n%s", code, out)
	}
	secrets := []string{first.AccessToken, first.RefreshToken}

	s.Revoke()
	refused := s.Refused()
	code, out = doctor("--upstream-login", file, s.URL)
	if code != 0 || !strings.Contains(out, "verdict: healable") {
		t.Errorf("doctor after the server revoked the token: exit %d\n%s", code, out)
	}
	now, err := login.Read(file)
	if err != nil || now.AccessToken == first.AccessToken || s.Issued() != 2 {
		t.Errorf("after the doctor met a revoked token: file %v, %d tokens issued; want the refreshed token written back, 2 issued", err, s.Issued())
	}
	if n := s.Refused() - refused; n < 1 {
		t.Errorf("the server refused %d requests with the revoked token, want at least 1", n)
	}
	secrets = append(secrets, now.AccessToken, now.RefreshToken)

	cfg := filepath.Join(dir, "mcpheal.yaml")
	yaml := fmt.Sprintf("upstreams:\n  peer:\n    url: %s\n    credentials:\n      oauth:\n        token_file: %s\n"+
		"  other:\n    url: http://127.0.0.1:1/mcp\n", s.URL, file)
	if err := os.WriteFile(cfg, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out = doctor("--config", cfg, "peer")
	if code != 0 || !strings.Contains(out, "verdict: healable") ||
		!strings.Contains(out, "the credentials of upstream peer in "+cfg+" (token file "+file+")") {
		t.Errorf("doctor --config: exit %d\n%s", code, out)
	}
	if code, out := doctor("--config", cfg); code != 2 || !strings.Contains(out, "name the one to probe") {
		t.Errorf("doctor --config with two upstreams and no name: exit %d\n%s", code, out)
	}
	for _, sec := range secrets {
		if strings.Contains(all.String(), sec) {
			t.Errorf("a token (%.8s…) appears in the doctor's output", sec)
		}
	}
}
