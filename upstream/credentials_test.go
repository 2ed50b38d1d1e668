package upstream

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"golang.org/x/oauth2"
	"golang.org/x/oauth2/clientcredentials"
)

const (
	testClientID     = "mcpheal-test"
	testClientSecret = "s3cret-client-value"
)

// tokenServer is an OAuth token endpoint on 127.0.0.1 that counts requests.
// answer decides each response from the request's number (1-based) and form.
type tokenServer struct {
	srv    *httptest.Server
	hits   atomic.Int32
	answer func(n int32, r *http.Request) (status int, body string)
	gate   atomic.Pointer[chan struct{}] // if set, each request waits for it (or for the client to leave)
}

// hold makes later requests wait until the returned func is called.
func (ts *tokenServer) hold() (release func()) {
	g := make(chan struct{})
	ts.gate.Store(&g)
	var once sync.Once
	return func() { once.Do(func() { close(g) }) }
}

func newTokenServer(t *testing.T, answer func(n int32, r *http.Request) (int, string)) *tokenServer {
	t.Helper()
	ts := &tokenServer{answer: answer}
	ts.srv = httptest.NewServer(http.HandlerFunc(ts.serve))
	t.Cleanup(ts.srv.Close)
	return ts
}

func (ts *tokenServer) serve(w http.ResponseWriter, r *http.Request) {
	n := ts.hits.Add(1)
	// The body is read first: only then does the server watch for the
	// client hanging up, and cancel r.Context.
	if err := r.ParseForm(); err != nil {
		http.Error(w, "bad form", http.StatusBadRequest)
		return
	}
	if g := ts.gate.Load(); g != nil {
		select {
		case <-*g:
		case <-r.Context().Done():
			return
		}
	}
	status, body := ts.answer(n, r)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	fmt.Fprint(w, body)
}

// issue answers every request with a fresh access token "tok-<n>".
func issue(expiresIn int) func(int32, *http.Request) (int, string) {
	return func(n int32, r *http.Request) (int, string) {
		if id, secret, _ := r.BasicAuth(); id != testClientID || secret != testClientSecret {
			return 401, `{"error":"invalid_client"}`
		}
		if r.PostForm.Get("grant_type") != "client_credentials" {
			return 400, `{"error":"unsupported_grant_type"}`
		}
		return 200, fmt.Sprintf(`{"access_token":"tok-%d","token_type":"bearer","expires_in":%d}`, n, expiresIn)
	}
}

// testClock is real time plus an offset that a test moves forward.
type testClock struct{ off atomic.Int64 }

func (c *testClock) now() time.Time          { return time.Now().Add(time.Duration(c.off.Load())) }
func (c *testClock) advance(d time.Duration) { c.off.Add(int64(d)) }

func newClientCreds(t *testing.T, ts *tokenServer) (*tokenCredentials, *testClock) {
	t.Helper()
	cfg := &clientcredentials.Config{
		ClientID:     testClientID,
		ClientSecret: testClientSecret,
		TokenURL:     ts.srv.URL + "/token",
		AuthStyle:    oauth2.AuthStyleInHeader,
	}
	c := ClientCredentials(cfg).(*tokenCredentials)
	clk := new(testClock)
	c.now = clk.now
	t.Cleanup(c.Close)
	return c, clk
}

// apply runs Apply with a 5 s bound and returns the Authorization it set.
func apply(t *testing.T, c Credentials) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var h fasthttp.RequestHeader
	if err := c.Apply(ctx, &h); err != nil {
		t.Fatalf("Apply: %v", err)
	}
	return string(h.Peek(authorizationHeader))
}

// applyAll runs Apply on n goroutines at once and returns what each set.
func applyAll(c Credentials, n int) ([]string, []error) {
	got, errs := make([]string, n), make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			<-start
			var h fasthttp.RequestHeader
			errs[i] = c.Apply(context.Background(), &h)
			got[i] = string(h.Peek(authorizationHeader))
		})
	}
	close(start)
	wg.Wait()
	return got, errs
}

func wantAll(t *testing.T, got []string, errs []error, want string) {
	t.Helper()
	for i := range got {
		if errs[i] != nil || got[i] != want {
			t.Fatalf("caller %d: Apply = %q, %v, want %q", i, got[i], errs[i], want)
		}
	}
}

func wantHits(t *testing.T, ts *tokenServer, want int32) {
	t.Helper()
	if got := ts.hits.Load(); got != want {
		t.Fatalf("token requests = %d, want %d", got, want)
	}
}

// waitFlight waits for the fetch in progress, if any, to publish.
func waitFlight(c *tokenCredentials) {
	c.mu.Lock()
	f := c.flight
	c.mu.Unlock()
	if f != nil {
		<-f.done
	}
}

func TestClientCredentialsReused(t *testing.T) {
	t.Parallel()
	ts := newTokenServer(t, issue(3600))
	c, _ := newClientCreds(t, ts)
	for range 50 {
		if got := apply(t, c); got != "Bearer tok-1" {
			t.Fatalf("Apply = %q, want %q", got, "Bearer tok-1")
		}
	}
	got, errs := applyAll(c, 20)
	wantAll(t, got, errs, "Bearer tok-1")
	wantHits(t, ts, 1)
}

func TestClientCredentialsFirstFetchSingleFlight(t *testing.T) {
	t.Parallel()
	ts := newTokenServer(t, issue(3600))
	c, _ := newClientCreds(t, ts)
	got, errs := applyAll(c, 20)
	wantAll(t, got, errs, "Bearer tok-1")
	wantHits(t, ts, 1)
}

func TestClientCredentialsExpiredRefetchedOnce(t *testing.T) {
	t.Parallel()
	ts := newTokenServer(t, issue(3600))
	c, clk := newClientCreds(t, ts)
	apply(t, c)
	clk.advance(time.Hour)
	release := ts.hold()
	go func() {
		// Let the callers pile up on the one fetch before it answers.
		time.Sleep(50 * time.Millisecond)
		release()
	}()
	got, errs := applyAll(c, 20)
	wantAll(t, got, errs, "Bearer tok-2")
	wantHits(t, ts, 2)
}

func TestClientCredentialsRefreshedBeforeExpiry(t *testing.T) {
	t.Parallel()
	ts := newTokenServer(t, issue(3600))
	c, clk := newClientCreds(t, ts)
	apply(t, c)
	// Inside the early-refresh window: the old token is still sent, without
	// waiting, while one background fetch replaces it. The fetch is held
	// until all callers are back, or a fast one could beat a slow caller.
	clk.advance(time.Hour - 20*time.Second)
	release := ts.hold()
	got, errs := applyAll(c, 10)
	wantAll(t, got, errs, "Bearer tok-1")
	release()
	waitFlight(c)
	if got := apply(t, c); got != "Bearer tok-2" {
		t.Fatalf("Apply after refresh = %q, want %q", got, "Bearer tok-2")
	}
	wantHits(t, ts, 2)
}

func TestClientCredentialsBackgroundRefreshFailureKeepsToken(t *testing.T) {
	t.Parallel()
	ts := newTokenServer(t, func(n int32, r *http.Request) (int, string) {
		if n > 1 {
			return 503, `{"error":"temporarily_unavailable"}`
		}
		return issue(3600)(n, r)
	})
	c, clk := newClientCreds(t, ts)
	apply(t, c)
	clk.advance(time.Hour - 20*time.Second)
	if got := apply(t, c); got != "Bearer tok-1" {
		t.Fatalf("Apply = %q, want %q", got, "Bearer tok-1")
	}
	waitFlight(c)
	// The failed refresh is not retried on every request.
	if got := apply(t, c); got != "Bearer tok-1" {
		t.Fatalf("Apply = %q, want %q", got, "Bearer tok-1")
	}
	wantHits(t, ts, 2)
	// Once stale, Apply reports the endpoint's refusal.
	clk.advance(time.Minute)
	var h fasthttp.RequestHeader
	err := c.Apply(context.Background(), &h)
	var te *TokenError
	if !errors.As(err, &te) || te.StatusCode != 503 || te.Code != "temporarily_unavailable" {
		t.Fatalf("Apply = %v, want TokenError 503 temporarily_unavailable", err)
	}
}

func TestClientCredentialsShortLifetime(t *testing.T) {
	t.Parallel()
	// A token issued for 2 s is not taken for expired on arrival, although
	// it is shorter than the refresh margin.
	ts := newTokenServer(t, issue(2))
	c, clk := newClientCreds(t, ts)
	apply(t, c)
	apply(t, c)
	wantHits(t, ts, 1)
	clk.advance(2 * time.Second)
	if got := apply(t, c); got != "Bearer tok-2" {
		t.Fatalf("Apply after expiry = %q, want %q", got, "Bearer tok-2")
	}
	wantHits(t, ts, 2)
}

func TestInvalidateCausesOneFetch(t *testing.T) {
	t.Parallel()
	ts := newTokenServer(t, issue(3600))
	c, _ := newClientCreds(t, ts)
	old := apply(t, c)
	// 20 requests were refused with the same token: each invalidates it,
	// then applies again.
	var wg sync.WaitGroup
	got, errs := make([]string, 20), make([]error, 20)
	for i := range 20 {
		wg.Go(func() {
			c.Invalidate(old)
			var h fasthttp.RequestHeader
			errs[i] = c.Apply(context.Background(), &h)
			got[i] = string(h.Peek(authorizationHeader))
		})
	}
	wg.Wait()
	wantAll(t, got, errs, "Bearer tok-2")
	wantHits(t, ts, 2)
}

func TestInvalidateThenConcurrentApply(t *testing.T) {
	t.Parallel()
	ts := newTokenServer(t, issue(3600))
	c, _ := newClientCreds(t, ts)
	c.Invalidate(apply(t, c))
	got, errs := applyAll(c, 20)
	wantAll(t, got, errs, "Bearer tok-2")
	wantHits(t, ts, 2)
}

func TestInvalidateStaleIgnored(t *testing.T) {
	t.Parallel()
	ts := newTokenServer(t, issue(3600))
	c, _ := newClientCreds(t, ts)
	first := apply(t, c)
	c.Invalidate(first)
	if got := apply(t, c); got != "Bearer tok-2" {
		t.Fatalf("Apply = %q, want %q", got, "Bearer tok-2")
	}
	// A late 401 for the replaced token, and values never issued.
	for _, v := range []string{first, "", "Bearer nope", "tok-2"} {
		c.Invalidate(v)
		if got := apply(t, c); got != "Bearer tok-2" {
			t.Fatalf("Invalidate(%q); Apply = %q, want %q", v, got, "Bearer tok-2")
		}
	}
	wantHits(t, ts, 2)
}

func TestApplyContextBoundsWaitNotFetch(t *testing.T) {
	t.Parallel()
	ts := newTokenServer(t, issue(3600))
	release := ts.hold()
	c, _ := newClientCreds(t, ts)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	var h fasthttp.RequestHeader
	err := c.Apply(ctx, &h)
	if !IsTimeout(err) || !strings.HasPrefix(err.Error(), "upstream token: ") {
		t.Fatalf("Apply = %v, want a wrapped timeout", err)
	}
	// The fetch went on without the caller, and its token is used next.
	release()
	if got := apply(t, c); got != "Bearer tok-1" {
		t.Fatalf("Apply = %q, want %q", got, "Bearer tok-1")
	}
	wantHits(t, ts, 1)
}

func TestRefreshTokenGrant(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var sent []string // refresh tokens received, in order
	ts := newTokenServer(t, func(n int32, r *http.Request) (int, string) {
		if id, secret, _ := r.BasicAuth(); id != testClientID || secret != testClientSecret {
			return 401, `{"error":"invalid_client"}`
		}
		if r.PostForm.Get("grant_type") != "refresh_token" {
			return 400, `{"error":"unsupported_grant_type"}`
		}
		mu.Lock()
		sent = append(sent, r.PostForm.Get("refresh_token"))
		mu.Unlock()
		if n == 1 {
			// Rotation (RFC 9700 §4.14.2): the old refresh token is spent.
			return 200, `{"access_token":"at-1","token_type":"Bearer","expires_in":3600,"refresh_token":"rt-1"}`
		}
		return 200, fmt.Sprintf(`{"access_token":"at-%d","token_type":"Bearer","expires_in":3600}`, n)
	})
	cfg := &oauth2.Config{
		ClientID:     testClientID,
		ClientSecret: testClientSecret,
		Endpoint:     oauth2.Endpoint{TokenURL: ts.srv.URL + "/token", AuthStyle: oauth2.AuthStyleInHeader},
	}
	c := RefreshToken(cfg, "rt-0")
	t.Cleanup(c.Close)
	for i, want := range []string{"Bearer at-1", "Bearer at-2", "Bearer at-3"} {
		got := apply(t, c)
		if got != want {
			t.Fatalf("Apply #%d = %q, want %q", i+1, got, want)
		}
		if apply(t, c) != want {
			t.Fatalf("Apply #%d not reused", i+1)
		}
		c.Invalidate(got)
	}
	mu.Lock()
	defer mu.Unlock()
	// rt-1 replaced rt-0; an answer without refresh_token keeps rt-1.
	if want := []string{"rt-0", "rt-1", "rt-1"}; fmt.Sprint(sent) != fmt.Sprint(want) {
		t.Fatalf("refresh tokens sent = %v, want %v", sent, want)
	}
}

func TestTokenEndpointFailures(t *testing.T) {
	t.Parallel()
	// Secrets the endpoint echoes back must not reach the error.
	leak := fmt.Sprintf(`{"error":"invalid_client","error_description":"bad secret %s","access_token":"leaked-token"}`, testClientSecret)
	tests := []struct {
		name     string
		status   int
		body     string
		wantCode string // TokenError.Code, or "" for another error
	}{
		{"400 invalid_client", 400, leak, "invalid_client"},
		{"401 invalid_client", 401, leak, "invalid_client"},
		{"500 text body", 500, "boom leaked-token " + testClientSecret, ""},
		{"400 unregistered code", 400, `{"error":"leaked-token"}`, ""},
		{"200 error field", 200, `{"error":"invalid_grant","access_token":"leaked-token"}`, "invalid_grant"},
		{"200 no access token", 200, `{"token_type":"bearer"}`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ts := newTokenServer(t, func(int32, *http.Request) (int, string) { return tt.status, tt.body })
			c, _ := newClientCreds(t, ts)
			var h fasthttp.RequestHeader
			err := c.Apply(context.Background(), &h)
			if err == nil {
				t.Fatal("Apply = nil, want an error")
			}
			wantSafeErr(t, err, "leaked-token", "rt-secret")
			if len(h.Peek(authorizationHeader)) != 0 {
				t.Errorf("Authorization set after a failure")
			}
			var te *TokenError
			if tt.wantCode != "" && (!errors.As(err, &te) || te.Code != tt.wantCode || te.StatusCode != tt.status) {
				t.Errorf("Apply = %v, want TokenError %d %s", err, tt.status, tt.wantCode)
			}
		})
	}
	t.Run("refresh invalid_grant", func(t *testing.T) {
		t.Parallel()
		ts := newTokenServer(t, func(_ int32, r *http.Request) (int, string) {
			return 400, `{"error":"invalid_grant","error_description":"` + r.PostForm.Get("refresh_token") + ` revoked"}`
		})
		c := RefreshToken(&oauth2.Config{
			ClientID: testClientID, ClientSecret: testClientSecret,
			Endpoint: oauth2.Endpoint{TokenURL: ts.srv.URL + "/token"}, // auth style auto-detected
		}, "rt-secret")
		t.Cleanup(c.Close)
		var h fasthttp.RequestHeader
		err := c.Apply(context.Background(), &h)
		var te *TokenError
		if !errors.As(err, &te) || te.Code != "invalid_grant" {
			t.Fatalf("Apply = %v, want TokenError invalid_grant", err)
		}
		wantSafeErr(t, err, "rt-secret")
	})
	t.Run("endpoint down", func(t *testing.T) {
		t.Parallel()
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		c := ClientCredentials(&clientcredentials.Config{
			ClientID: testClientID, ClientSecret: testClientSecret, TokenURL: "http://" + addr + "/token",
		})
		t.Cleanup(c.Close)
		var h fasthttp.RequestHeader
		err = c.Apply(context.Background(), &h)
		if err == nil {
			t.Fatal("Apply = nil, want an error")
		}
		wantSafeErr(t, err)
	})
}

// wantSafeErr checks err is wrapped once and holds no secret.
func wantSafeErr(t *testing.T, err error, secrets ...string) {
	t.Helper()
	msg := err.Error()
	if !strings.HasPrefix(msg, "upstream token: ") || strings.Count(msg, "upstream token") != 1 {
		t.Errorf("error %q: want one %q prefix", msg, "upstream token: ")
	}
	for _, s := range append(secrets, testClientSecret) {
		if strings.Contains(msg, s) {
			t.Errorf("error %q contains secret %q", msg, s)
		}
	}
}

func TestStaticHeader(t *testing.T) {
	t.Parallel()
	tests := []struct{ name, value string }{
		{"Authorization", "Bearer static-1"},
		{"X-Api-Key", "key-1"},
	}
	for _, tt := range tests {
		c := StaticHeader(tt.name, tt.value)
		var h fasthttp.RequestHeader
		h.Set(tt.name, "agent-value")
		for range 3 {
			if err := c.Apply(context.Background(), &h); err != nil {
				t.Fatalf("Apply: %v", err)
			}
			c.Invalidate(tt.value) // nothing to refresh
		}
		if got := string(h.Peek(tt.name)); got != tt.value {
			t.Errorf("StaticHeader(%s).Apply: %s = %q, want %q", tt.name, tt.name, got, tt.value)
		}
		if n := strings.Count(h.String(), tt.value); n != 1 {
			t.Errorf("StaticHeader(%s).Apply: value appears %d times, want 1", tt.name, n)
		}
		c.Close()
		c.Close()
	}
}

// Not parallel: it counts the process's goroutines.
func TestCredentialsCloseStopsGoroutines(t *testing.T) {
	ts := newTokenServer(t, issue(3600))
	base := runtime.NumGoroutine()

	idle, _ := newClientCreds(t, ts)
	apply(t, idle) // leaves a keep-alive connection in its token client
	busy, _ := newClientCreds(t, ts)
	release := ts.hold()
	defer release()
	res := make(chan error, 1)
	go func() {
		var h fasthttp.RequestHeader
		res <- busy.Apply(context.Background(), &h) // hangs until Close
	}()
	for ts.hits.Load() < 2 {
		time.Sleep(time.Millisecond)
	}
	for _, c := range []*tokenCredentials{idle, busy} {
		start := time.Now()
		c.Close()
		c.Close()
		if d := time.Since(start); d > time.Second {
			t.Fatalf("Close took %v: the fetch in flight was not cancelled", d)
		}
		var h fasthttp.RequestHeader
		if err := c.Apply(context.Background(), &h); !errors.Is(err, ErrClosed) {
			t.Fatalf("Apply after Close = %v, want ErrClosed", err)
		}
	}
	if err := <-res; err == nil {
		t.Fatal("Apply cut by Close = nil, want an error")
	}
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > base {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<16)
			t.Fatalf("goroutines = %d, want ≤ %d\n%s", runtime.NumGoroutine(), base, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestTokenErrorRefused(t *testing.T) {
	t.Parallel()
	tests := []struct {
		status int
		want   bool
	}{
		{0, false}, // no response at all
		{200, false},
		{399, false},
		{400, true},
		{401, true},
		{403, true},
		{499, true},
		{500, false},
		{503, false},
	}
	for _, tt := range tests {
		if got := (&TokenError{StatusCode: tt.status}).Refused(); got != tt.want {
			t.Errorf("TokenError{StatusCode: %d}.Refused() = %v, want %v", tt.status, got, tt.want)
		}
	}
}
