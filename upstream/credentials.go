package upstream

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
	"golang.org/x/oauth2"
	"golang.org/x/oauth2/clientcredentials"
)

// Credentials supplies the credential the proxy itself owns for an upstream
// (docs/security.md "Security": proxy-owned credentials). When the proxy owns it, the agent's own Authorization is
// not forwarded; that stripping is the caller's job.
type Credentials interface {
	// Apply sets the credential header(s) on h (e.g. Authorization: Bearer …),
	// fetching or refreshing a token first if needed; ctx bounds only the
	// wait, never the fetch, whose result is cached for the next caller.
	Apply(ctx context.Context, h *fasthttp.RequestHeader) error
	// Invalidate drops a cached token after the upstream answered 401 with
	// it, so the next Apply fetches a new one. rejected is the header value
	// that was refused; if the cache already holds another, it is a late
	// 401 and is ignored. Safe to call concurrently: concurrent 401s with
	// the same value cause one refresh.
	Invalidate(rejected string)
	// Close releases background resources (if any). Idempotent.
	Close()
}

// Token fetch timing. A token is refreshed in the background from
// earlyRefresh before its expiry, and no longer sent from expirySkew before
// it (the request needs time to reach the upstream, whose clock may run
// ahead). Both are capped at a fraction of the token's lifetime, so that a
// token issued for 20 s is not taken as expired on arrival.
const (
	earlyRefresh = 30 * time.Second
	expirySkew   = 5 * time.Second
	// refreshRetry spaces background refresh attempts after a failure while
	// the current token is still good; once it is stale, every Apply that
	// finds no fetch running starts one.
	refreshRetry = 5 * time.Second
	// tokenTimeout bounds one exchange with the token endpoint.
	tokenTimeout = 10 * time.Second
	// holdMin and holdMax bound the hold-down after a refusal: the first
	// lasts about holdMin and each consecutive refusal doubles it up to
	// holdMax. A refused credential stays refused until an operator fixes
	// it, so asking more often than this only loads the endpoint (and may
	// get the client locked out); asking at all lets a fix take effect
	// without a restart.
	holdMin = time.Second
	holdMax = 60 * time.Second
)

const authorizationHeader = "Authorization"

// StaticHeader returns Credentials that set header name to value on every
// request (e.g. "Authorization", "Bearer "+os.Getenv(…)). It never fetches,
// and Invalidate does nothing: a static credential that the upstream refuses
// stays refused.
func StaticHeader(name, value string) Credentials {
	return staticHeader{name: name, value: value}
}

type staticHeader struct{ name, value string }

func (s staticHeader) Apply(_ context.Context, h *fasthttp.RequestHeader) error {
	h.Set(s.name, s.value)
	return nil
}

func (staticHeader) Invalidate(string) {}
func (staticHeader) Close()            {}

// ClientCredentials returns Credentials that obtain a bearer token with the
// OAuth 2.0 client credentials grant (RFC 6749 §4.4). cfg is retained and
// must not be changed afterwards. Call Close when done.
//
// The client authenticates with HTTP Basic unless cfg says otherwise: every
// token endpoint must support it for a client issued a password (RFC 6749
// §2.3.1), and oauth2's auto-detection would send the secret a second time,
// in the body, after every refusal.
func ClientCredentials(cfg *clientcredentials.Config) Credentials {
	if cfg.AuthStyle == oauth2.AuthStyleAutoDetect {
		c := *cfg
		c.AuthStyle = oauth2.AuthStyleInHeader
		cfg = &c
	}
	return newTokenCredentials(cfg.Token)
}

// RefreshToken returns Credentials that obtain a bearer token with the OAuth
// 2.0 refresh token grant (RFC 6749 §6). A refresh token rotated by the
// endpoint replaces refreshToken for the next refresh; it lives only in
// memory. cfg is retained and must not be changed afterwards. Call Close
// when done.
func RefreshToken(cfg *oauth2.Config, refreshToken string) Credentials {
	if cfg.Endpoint.AuthStyle == oauth2.AuthStyleAutoDetect {
		c := *cfg
		c.Endpoint.AuthStyle = oauth2.AuthStyleInHeader
		cfg = &c
	}
	g := &refreshGrant{cfg: cfg, refresh: refreshToken}
	return newTokenCredentials(g.token)
}

// refreshGrant runs the refresh token grant and keeps the newest refresh
// token.
type refreshGrant struct {
	cfg *oauth2.Config
	// refresh is read and written only by the fetch goroutine; fetches never
	// overlap and are ordered by tokenCredentials.mu.
	refresh string
}

func (g *refreshGrant) token(ctx context.Context) (*oauth2.Token, error) {
	// A token with no access token is invalid, so the source refreshes at
	// once; a fresh source per fetch keeps oauth2 from caching anything.
	t, err := g.cfg.TokenSource(ctx, &oauth2.Token{RefreshToken: g.refresh}).Token()
	if err != nil {
		return nil, err
	}
	if t.RefreshToken != "" {
		g.refresh = t.RefreshToken
	}
	return t, nil
}

// tokenCredentials caches one OAuth access token and fetches a new one on a
// single goroutine at a time (single flight): callers that find no usable
// token wait for that fetch, each on its own context.
//
// A fetch the endpoint refuses (an error response of RFC 6749 §5.2 with a
// 4xx status; TokenError.Refused) starts a hold-down: until it ends no
// fetch starts, and a caller with no usable token gets the refusal at once.
// Without it every Apply that found no token would ask again, and a proxy
// retrying one agent request would ask once per retry. Transient failures
// (network, timeouts, 5xx) are not held down: the next Apply that needs a
// token asks again, as the endpoint may be back.
type tokenCredentials struct {
	fetch  func(context.Context) (*oauth2.Token, error) // called by the fetch goroutine only
	base   context.Context                              // long-lived: oauth2 keeps it; cancelled by Close
	cancel context.CancelFunc
	tr     *http.Transport // the token client's own, so Close can drop its connections
	now    func() time.Time
	wg     sync.WaitGroup // fetch goroutines

	mu        sync.Mutex // protects value, refreshAt, staleAt, retryAt, refusal, heldUntil, hold, flight, closed
	value     string     // header value in use; "" when none
	refreshAt time.Time  // start a background refresh from here; zero: never
	staleAt   time.Time  // stop sending value from here; zero: never
	retryAt   time.Time  // no background refresh before this
	refusal   error      // the last fetch's error if it was a refusal (Refused), else nil
	heldUntil time.Time  // no fetch before this, while refusal is set
	hold      Backoff    // hold-downs of consecutive refusals; a token resets it
	flight    *tokenFlight
	closed    bool
}

// tokenFlight is one token fetch. value and err are written once, before
// done is closed, and read after.
type tokenFlight struct {
	done  chan struct{}
	value string
	err   error
}

func newTokenCredentials(fetch func(context.Context) (*oauth2.Token, error)) *tokenCredentials {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	hc := &http.Client{Transport: tr, Timeout: tokenTimeout}
	// oauth2 retains the context it is given for every later refresh, so it
	// gets a long-lived one rather than a request's, which ends with it.
	base, cancel := context.WithCancel(context.WithValue(context.Background(), oauth2.HTTPClient, hc))
	return &tokenCredentials{
		fetch: fetch, base: base, cancel: cancel, tr: tr, now: time.Now,
		hold: Backoff{Min: holdMin, Max: holdMax},
	}
}

// Apply sets Authorization to the cached token, or waits for a fetch. During
// a hold-down it returns the refusal that started it without asking again.
func (c *tokenCredentials) Apply(ctx context.Context, h *fasthttp.RequestHeader) error {
	value, f, err := c.current()
	if err != nil {
		return err
	}
	if f != nil {
		select {
		case <-f.done:
			if f.err != nil {
				return fmt.Errorf("upstream token: %w", f.err)
			}
			value = f.value
		case <-ctx.Done():
			return fmt.Errorf("upstream token: %w", ctx.Err())
		}
	}
	h.Set(authorizationHeader, value)
	return nil
}

// current returns the header value to send, or else the fetch to wait for,
// or else the refusal that holds fetches down.
func (c *tokenCredentials) current() (string, *tokenFlight, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return "", nil, fmt.Errorf("upstream token: %w", ErrClosed)
	}
	now := c.now()
	held := c.refusal != nil && now.Before(c.heldUntil)
	if c.value != "" && (c.staleAt.IsZero() || now.Before(c.staleAt)) {
		// A refused background refresh does not cost the token still in
		// hand: it is sent until stale, and the refresh waits out the
		// hold-down like any other fetch.
		if c.flight == nil && !held && !c.refreshAt.IsZero() && !now.Before(c.refreshAt) && !now.Before(c.retryAt) {
			c.startLocked()
		}
		return c.value, nil, nil
	}
	if c.flight == nil {
		if held {
			return "", nil, fmt.Errorf("upstream token: %w", c.refusal)
		}
		c.startLocked()
	}
	return "", c.flight, nil
}

// startLocked starts the one fetch; c is not closed.
func (c *tokenCredentials) startLocked() {
	f := &tokenFlight{done: make(chan struct{})}
	c.flight = f
	c.wg.Add(1)
	go c.run(f)
}

// run performs fetch f and publishes its result.
func (c *tokenCredentials) run(f *tokenFlight) {
	defer c.wg.Done()
	defer close(f.done)
	t, err := c.safeFetch()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.flight = nil
	if err != nil {
		f.err = tokenErr(err)
		now := c.now()
		c.retryAt = now.Add(refreshRetry)
		if Refused(f.err) {
			c.refusal = f.err
			c.heldUntil = now.Add(c.hold.Next())
		} else {
			// An outage says nothing about the credential: the hold-down
			// schedule is kept, and only a token starts it over.
			c.refusal = nil
		}
		return
	}
	c.refusal = nil
	c.hold.Reset()
	f.value = t.Type() + " " + t.AccessToken
	c.value = f.value
	c.refreshAt, c.staleAt = time.Time{}, time.Time{}
	if !t.Expiry.IsZero() {
		// oauth2 set Expiry from expires_in on the real clock; re-base it on
		// c.now so that the two can be compared.
		ttl := time.Until(t.Expiry)
		now := c.now()
		c.refreshAt = now.Add(ttl - min(earlyRefresh, ttl/2))
		c.staleAt = now.Add(ttl - min(expirySkew, ttl/4))
	}
}

// safeFetch runs c.fetch, turning a panic into an error so that waiters are
// released and the proxy keeps serving: no input may crash it.
func (c *tokenCredentials) safeFetch() (t *oauth2.Token, err error) {
	defer func() {
		if r := recover(); r != nil {
			t, err = nil, errors.New("token fetch panicked")
		}
	}()
	return c.fetch(c.base)
}

// Invalidate drops the cached token if it is still the one refused.
func (c *tokenCredentials) Invalidate(rejected string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if rejected != "" && rejected == c.value {
		c.value = ""
		c.refreshAt, c.staleAt, c.retryAt = time.Time{}, time.Time{}, time.Time{}
	}
}

// Close cancels a fetch in flight, waits for it, and closes the token
// client's idle connections. Apply then fails with ErrClosed.
func (c *tokenCredentials) Close() {
	c.mu.Lock()
	c.closed = true
	c.value = ""
	c.mu.Unlock()
	c.cancel()
	c.wg.Wait()
	c.tr.CloseIdleConnections()
}

// TokenError is a token endpoint's refusal (RFC 6749 §5.2). Its message
// holds the status and the error code only: the response body, and with it
// any description the endpoint chose to echo, is dropped so that no secret
// can reach a log.
type TokenError struct {
	// StatusCode is the HTTP status of the token response.
	StatusCode int
	// Code is RFC 6749's error code (e.g. "invalid_client") if it is one of
	// the registered codes, "" otherwise.
	Code string
}

// Refused reports whether the endpoint turned the request down (a 4xx
// status: RFC 6749 §5.2 answers 400, or 401 for invalid_client) rather
// than failed to answer it (a 5xx, or a 200 that holds no token). Asking
// again with the same client credentials or refresh token will get the
// same answer until an operator changes them, so a refusal is not worth
// retrying within a request; an outage may be. Callers tell the two apart
// with errors.As(err, &te) && te.Refused().
func (e *TokenError) Refused() bool { return e.StatusCode >= 400 && e.StatusCode < 500 }

func (e *TokenError) Error() string {
	if e.Code == "" {
		return fmt.Sprintf("token endpoint answered %d", e.StatusCode)
	}
	return fmt.Sprintf("token endpoint answered %d %s", e.StatusCode, e.Code)
}

// oauthErrorCodes are the error codes of RFC 6749 §5.2 plus the two of
// §4.1.2.1 that token endpoints also use. Only these are repeated, so a
// server-chosen string cannot smuggle a value into our messages.
var oauthErrorCodes = map[string]bool{
	"invalid_request":         true,
	"invalid_client":          true,
	"invalid_grant":           true,
	"unauthorized_client":     true,
	"unsupported_grant_type":  true,
	"invalid_scope":           true,
	"server_error":            true,
	"temporarily_unavailable": true,
}

// tokenErr replaces oauth2's RetrieveError, whose message includes the
// response body, with a TokenError. Other errors (transport, timeouts,
// malformed answers) carry no body and are kept, so IsTimeout still works.
func tokenErr(err error) error {
	var re *oauth2.RetrieveError
	if !errors.As(err, &re) {
		return err
	}
	te := &TokenError{}
	if re.Response != nil {
		te.StatusCode = re.Response.StatusCode
	}
	if oauthErrorCodes[re.ErrorCode] {
		te.Code = re.ErrorCode
	}
	return te
}
