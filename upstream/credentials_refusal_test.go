package upstream

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"golang.org/x/oauth2"
)

// stoppedClock moves only when the test advances it, so that a hold-down
// cannot run out on its own while a slow (-race) test looks at it.
type stoppedClock struct {
	base time.Time
	off  atomic.Int64
}

func (c *stoppedClock) now() time.Time          { return c.base.Add(time.Duration(c.off.Load())) }
func (c *stoppedClock) advance(d time.Duration) { c.off.Add(int64(d)) }

// newStoppedCreds is newClientCreds on a stopped clock.
func newStoppedCreds(t *testing.T, ts *tokenServer) (*tokenCredentials, *stoppedClock) {
	t.Helper()
	c, _ := newClientCreds(t, ts)
	clk := &stoppedClock{base: time.Now()}
	c.now = clk.now
	return c, clk
}

// refuseClient answers like an endpoint that no longer knows the client
// (RFC 6749 §5.2: invalid_client may come with 401). The description echoes
// the secret, which must not reach an error.
func refuseClient(int32, *http.Request) (int, string) {
	return 401, `{"error":"invalid_client","error_description":"unknown client, secret ` + testClientSecret + `"}`
}

const refusedMsg = "token endpoint answered 401 invalid_client"

// wantRefused checks that err is the endpoint's 401 invalid_client refusal.
func wantRefused(t *testing.T, err error) {
	t.Helper()
	var te *TokenError
	if !errors.As(err, &te) || !te.Refused() || te.Error() != refusedMsg || err.Error() != "upstream token: "+refusedMsg {
		t.Fatalf("Apply = %v, want a refused TokenError %q", err, refusedMsg)
	}
}

// applyErr runs Apply once and returns its error; it must set no header.
func applyErr(t *testing.T, c Credentials) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var h fasthttp.RequestHeader
	err := c.Apply(ctx, &h)
	if len(h.Peek(authorizationHeader)) != 0 {
		t.Fatalf("Apply = %v, and set Authorization", err)
	}
	return err
}

// wantAllRefused checks every caller of applyAll got the refusal.
func wantAllRefused(t *testing.T, got []string, errs []error) {
	t.Helper()
	for i := range errs {
		if got[i] != "" {
			t.Fatalf("caller %d: Authorization %q set after a refusal", i, got[i])
		}
		wantRefused(t, errs[i])
	}
}

// holdDown returns the current hold-down's step and what is left of it.
func holdDown(c *tokenCredentials) (step, left time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.hold.Step(), c.heldUntil.Sub(c.now())
}

// spread returns the shortest and longest wait Backoff may draw for step.
func spread(step time.Duration) (lo, hi time.Duration) {
	return step * 8 / 10, step * 12 / 10
}

// TestTokenRefusalOneRequestForConcurrentApplies: 30 requests that need a
// token from an endpoint that refuses the client cost it one request, and
// so do their retries.
func TestTokenRefusalOneRequestForConcurrentApplies(t *testing.T) {
	t.Parallel()
	ts := newTokenServer(t, refuseClient)
	c, _ := newStoppedCreds(t, ts)
	got, errs := applyAll(c, 30)
	wantAllRefused(t, got, errs)
	wantHits(t, ts, 1)
	// Most of the 30 may have shared the fetch; these all come after it,
	// as a caller's retries would.
	got, errs = applyAll(c, 30)
	wantAllRefused(t, got, errs)
	wantHits(t, ts, 1)
}

// TestTokenRefusalHoldDown: no request during a hold-down, one after it,
// and each consecutive refusal doubles it from 1 s up to 60 s.
func TestTokenRefusalHoldDown(t *testing.T) {
	t.Parallel()
	ts := newTokenServer(t, refuseClient)
	c, clk := newStoppedCreds(t, ts)
	steps := []time.Duration{1, 2, 4, 8, 16, 32, 60, 60}
	for i, want := range steps {
		want *= time.Second
		// The hold-down before this one is over: concurrent callers share
		// the one request it allows.
		got, errs := applyAll(c, 10)
		wantAllRefused(t, got, errs)
		wantHits(t, ts, int32(i+1))

		step, left := holdDown(c)
		lo, hi := spread(want)
		if step != want || left < lo || left > hi {
			t.Fatalf("refusal %d: hold-down %v (step %v), want %v ±20 %%", i+1, left, step, want)
		}
		// Inside the shortest hold-down the spread allows: no request.
		clk.advance(lo - time.Millisecond)
		for range 5 {
			wantRefused(t, applyErr(t, c))
		}
		got, errs = applyAll(c, 10)
		wantAllRefused(t, got, errs)
		wantHits(t, ts, int32(i+1))
		// Past the longest: the next round asks again.
		clk.advance(hi - lo + time.Millisecond)
	}
}

// TestTokenRefusalResetBySuccess: a token ends the schedule of hold-downs,
// so a refusal after it is held down for the first step again.
func TestTokenRefusalResetBySuccess(t *testing.T) {
	t.Parallel()
	var refuse atomic.Bool
	refuse.Store(true)
	ts := newTokenServer(t, func(n int32, r *http.Request) (int, string) {
		if refuse.Load() {
			return refuseClient(n, r)
		}
		return issue(3600)(n, r)
	})
	c, clk := newStoppedCreds(t, ts)
	for i := range 3 {
		wantRefused(t, applyErr(t, c))
		wantHits(t, ts, int32(i+1))
		step, _ := holdDown(c)
		_, hi := spread(step)
		clk.advance(hi + time.Millisecond)
	}
	if step, _ := holdDown(c); step != 4*time.Second {
		t.Fatalf("after 3 refusals: step %v, want 4s", step)
	}

	// The operator fixed the client: the next fetch gets a token.
	refuse.Store(false)
	tok := apply(t, c)
	if tok != "Bearer tok-4" {
		t.Fatalf("Apply = %q, want %q", tok, "Bearer tok-4")
	}
	wantHits(t, ts, 4)

	// Refused again, after the upstream refused the token: held down for
	// about 1 s, not 8 s.
	refuse.Store(true)
	c.Invalidate(tok)
	wantRefused(t, applyErr(t, c))
	wantHits(t, ts, 5)
	step, left := holdDown(c)
	if lo, hi := spread(time.Second); step != time.Second || left < lo || left > hi {
		t.Fatalf("refusal after a token: hold-down %v (step %v), want 1s ±20 %%", left, step)
	}
	clk.advance(1200*time.Millisecond + time.Millisecond)
	wantRefused(t, applyErr(t, c))
	wantHits(t, ts, 6)
}

// TestTokenOutageNotHeldDown: a 503 says the endpoint is down, not that the
// credential is bad, so a stale token's next Apply asks again at once.
func TestTokenOutageNotHeldDown(t *testing.T) {
	t.Parallel()
	ts := newTokenServer(t, func(n int32, r *http.Request) (int, string) {
		if n > 1 {
			return 503, `{"error":"temporarily_unavailable"}`
		}
		return issue(3600)(n, r)
	})
	c, clk := newStoppedCreds(t, ts)
	apply(t, c)
	clk.advance(time.Hour) // stale
	for i := range 3 {
		err := applyErr(t, c)
		var te *TokenError
		if !errors.As(err, &te) || te.StatusCode != 503 || te.Refused() {
			t.Fatalf("Apply = %v, want a TokenError 503 that is not a refusal", err)
		}
		wantHits(t, ts, int32(i+2))
	}
	// Concurrent callers still share one fetch.
	release := ts.hold()
	go func() {
		time.Sleep(50 * time.Millisecond)
		release()
	}()
	_, errs := applyAll(c, 20)
	for i, err := range errs {
		if err == nil {
			t.Fatalf("caller %d: Apply = nil, want the outage", i)
		}
	}
	wantHits(t, ts, 5)
}

// TestTokenRefusalBackgroundRefresh: a refused background refresh leaves
// the token in hand in use, and waits out the hold-down; once the token is
// gone, Apply answers the refusal without asking again.
func TestTokenRefusalBackgroundRefresh(t *testing.T) {
	t.Parallel()
	ts := newTokenServer(t, func(n int32, r *http.Request) (int, string) {
		if n > 1 {
			return refuseClient(n, r)
		}
		return issue(3600)(n, r)
	})
	c, clk := newStoppedCreds(t, ts)
	tok := apply(t, c)
	clk.advance(time.Hour - 20*time.Second) // inside the early-refresh window
	if got := apply(t, c); got != tok {
		t.Fatalf("Apply = %q, want %q", got, tok)
	}
	waitFlight(c)
	wantHits(t, ts, 2)
	if got := apply(t, c); got != tok {
		t.Fatalf("Apply after a refused refresh = %q, want %q", got, tok)
	}
	wantHits(t, ts, 2)

	// The upstream refuses the token too: no request to the token
	// endpoint until the hold-down ends.
	c.Invalidate(tok)
	wantRefused(t, applyErr(t, c))
	wantHits(t, ts, 2)
	clk.advance(1200*time.Millisecond + time.Millisecond)
	wantRefused(t, applyErr(t, c))
	wantHits(t, ts, 3)
}

// TestRefreshTokenRevokedHeldDown: a revoked refresh token (RFC 6749 §5.2
// invalid_grant, 400) is held down like a refused client.
func TestRefreshTokenRevokedHeldDown(t *testing.T) {
	t.Parallel()
	ts := newTokenServer(t, func(int32, *http.Request) (int, string) {
		return 400, `{"error":"invalid_grant"}`
	})
	c := RefreshToken(&oauth2.Config{
		ClientID: testClientID, ClientSecret: testClientSecret,
		Endpoint: oauth2.Endpoint{TokenURL: ts.srv.URL + "/token", AuthStyle: oauth2.AuthStyleInHeader},
	}, "rt-0").(*tokenCredentials)
	t.Cleanup(c.Close)
	clk := &stoppedClock{base: time.Now()}
	c.now = clk.now
	for range 5 {
		err := applyErr(t, c)
		var te *TokenError
		if !errors.As(err, &te) || !te.Refused() || err.Error() != "upstream token: token endpoint answered 400 invalid_grant" {
			t.Fatalf("Apply = %v, want a refused TokenError 400 invalid_grant", err)
		}
	}
	wantHits(t, ts, 1)
}
