package login

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mcpheal/mcpheal/upstream/login/logintest"
)

// printedURL is the terminal of a login: it hands the authorization URL
// Loopback.Authorize prints to the test, which plays the user.
type printedURL struct {
	mu   sync.Mutex
	text strings.Builder
	once sync.Once
	url  chan string
}

func newPrintedURL() *printedURL { return &printedURL{url: make(chan string, 1)} }

func (p *printedURL) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.text.Write(b)
	for _, l := range strings.Split(p.text.String(), "\n") {
		if l = strings.TrimSpace(l); strings.HasPrefix(l, "http") {
			p.once.Do(func() { p.url <- l })
		}
	}
	return len(b), nil
}

// get sends one GET and returns the status and body.
func get(t *testing.T, u string) (int, string) {
	t.Helper()
	resp, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestLoopbackIgnoresStrayRequests: requests to the loopback listener that
// are not the login's redirect back (a favicon, another login's state, a
// forged error, the right state without a code) are answered 404 or 400
// and ignored; the browser's real redirect that follows completes the
// login, and a second one gets 409.
func TestLoopbackIgnoresStrayRequests(t *testing.T) {
	t.Parallel()
	s := logintest.Start(t)
	term := newPrintedURL()
	lb, err := NewLoopback("127.0.0.1:0", term)
	if err != nil {
		t.Fatal(err)
	}
	defer lb.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	type result struct {
		f   *File
		err error
	}
	done := make(chan result, 1)
	go func() {
		f, err := Login(ctx, Config{Server: s.URL, RedirectURL: lb.RedirectURL, Authorize: lb.Authorize})
		done <- result{f, err}
	}()
	var authURL string
	select {
	case authURL = <-term.url:
	case r := <-done:
		t.Fatalf("the login ended before printing a URL: %v", r.err)
	}
	au, _ := url.Parse(authURL)
	state := au.Query().Get("state")
	base := strings.TrimSuffix(lb.RedirectURL, "/callback")
	for _, c := range []struct {
		path string
		code int
		want string
	}{
		{"/favicon.ico", http.StatusNotFound, ""},
		{"/callback?code=stolen&state=forged", http.StatusBadRequest, "not the redirect back of the login"},
		{"/callback?code=stolen", http.StatusBadRequest, "not the redirect back of the login"},
		{"/callback?error=access_denied&state=forged", http.StatusBadRequest, "not the redirect back of the login"},
		{"/callback", http.StatusBadRequest, "not the redirect back of the login"},
		{"/callback?state=" + url.QueryEscape(state), http.StatusBadRequest, "neither an authorization code nor an error"},
	} {
		if code, body := get(t, base+c.path); code != c.code || !strings.Contains(body, c.want) {
			t.Errorf("GET %s: %d %q, want %d and %q", c.path, code, body, c.code, c.want)
		}
	}
	select {
	case r := <-done:
		t.Fatalf("a stray request ended the login: %v", r.err)
	default:
	}
	if code, err := logintest.Browse(ctx, authURL); err != nil || code != http.StatusOK {
		t.Fatalf("the browser's redirect back: %d, %v", code, err)
	}
	r := <-done
	if r.err != nil || r.f.AccessToken == "" || r.f.Resource != s.URL || s.Issued() != 1 {
		t.Fatalf("login: %+v, %v; %d tokens issued", r.f, r.err, s.Issued())
	}
	if code, body := get(t, base+"/callback?code=again&state="+url.QueryEscape(state)); code != http.StatusConflict {
		t.Errorf("a second redirect back: %d %q, want 409", code, body)
	}
}

// TestLoopbackRefusalEndsLogin: the redirect back of the login itself
// with an OAuth error (the user or the authorization server said no) ends
// the login with that error.
func TestLoopbackRefusalEndsLogin(t *testing.T) {
	t.Parallel()
	s := logintest.Start(t)
	term := newPrintedURL()
	lb, err := NewLoopback("127.0.0.1:0", term)
	if err != nil {
		t.Fatal(err)
	}
	defer lb.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := Login(ctx, Config{Server: s.URL, RedirectURL: lb.RedirectURL, Authorize: lb.Authorize})
		done <- err
	}()
	au, _ := url.Parse(<-term.url)
	back := lb.RedirectURL + "?error=access_denied&state=" + url.QueryEscape(au.Query().Get("state"))
	if code, body := get(t, back); code != http.StatusOK || !strings.Contains(body, "refused") {
		t.Errorf("the refusal: %d %q", code, body)
	}
	if err := <-done; err == nil || !strings.Contains(err.Error(), "refused the login: access_denied") {
		t.Fatalf("login after a refusal: %v", err)
	}
}

// TestLoopbackEarlyBrowser: a browser quicker than the terminal, whose
// redirect back reaches the listener before Authorize has printed the URL,
// completes the login too.
func TestLoopbackEarlyBrowser(t *testing.T) {
	t.Parallel()
	s := logintest.Start(t)
	lb, err := NewLoopback("127.0.0.1:0", io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	defer lb.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	browsed := make(chan error, 1)
	f, err := Login(ctx, Config{Server: s.URL, RedirectURL: lb.RedirectURL,
		Authorize: func(ctx context.Context, authURL string) (url.Values, error) {
			go func() {
				code, err := logintest.Browse(ctx, authURL)
				if err == nil && code != http.StatusOK {
					err = &Error{Msg: http.StatusText(code)}
				}
				browsed <- err
			}()
			return lb.Authorize(ctx, authURL)
		}})
	if err != nil || f.AccessToken == "" {
		t.Fatalf("login: %+v, %v", f, err)
	}
	if err := <-browsed; err != nil {
		t.Errorf("the browser: %v", err)
	}
}
