package link

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"github.com/mcpheal/mcpheal/classify"
	"github.com/mcpheal/mcpheal/proxy/internal/conf"
	"github.com/mcpheal/mcpheal/proxy/internal/obs"
	"github.com/mcpheal/mcpheal/proxy/internal/wire"
	"github.com/mcpheal/mcpheal/session"
	"github.com/mcpheal/mcpheal/upstream"
)

// Link is mcpheal's side of one upstream: the HTTP client, the credential
// mcpheal owns for it, the circuit breaker and the outage watch. Every
// request sent upstream, the agent's and mcpheal's own, leaves through
// [link.do] or [link.doOnce]; every request mcpheal makes on an agent's
// behalf is built by [link.build] (call.go).
type Link struct {
	Cfg     *conf.Config
	log     *zerolog.Logger
	count   *obs.Counters
	Up      *upstream.Client
	Breaker *upstream.Breaker
	bg      *wire.BgGroup
	done    <-chan struct{} // closed when the server closes

	Trace *obs.Tracing // nil: tracing off

	seq atomic.Uint64 // numbers the JSON-RPC ids of mcpheal's own requests
	// judgesCredentials: the upstream answered 401 to a request whose
	// credential was missing or refused, so it checks credentials itself
	// and may judge a token rotation (docs/security.md "Security").
	JudgesCredentials atomic.Bool
	// credLogged: unix nanoseconds of the last log line about a refused
	// upstream credential (one per second at most).
	credLogged atomic.Int64
	// busyLogged: unix nanoseconds of the last log line about a busy
	// upstream (noteBusy).
	busyLogged atomic.Int64
	// onRecover runs when the upstream answers again after failures (the
	// era is asked again: a restart may have changed it).
	OnRecover func()

	failing atomic.Bool // an exchange failed and none has succeeded since
	// failingSince is the unix nanoseconds of the failure that began the
	// outage in progress (outageEnd).
	failingSince atomic.Int64
	wakeMu       sync.Mutex    // protects wake
	wake         chan struct{} // closed (and replaced) when the upstream answers again
	// watching: an outage watcher runs (watchOutage); lastFailure is the
	// unix nanoseconds of the last failed exchange.
	watching    atomic.Bool
	lastFailure atomic.Int64
}

func NewLink(cfg *conf.Config, log *zerolog.Logger, count *obs.Counters, bg *wire.BgGroup, done <-chan struct{}) (*Link, error) {
	up, err := upstream.New(upstream.Config{URL: cfg.Upstream, MaxIdleConn: cfg.MaxIdleConn, MaxResponseBody: cfg.MaxAnswer})
	if err != nil {
		return nil, err
	}
	l := &Link{Cfg: cfg, log: log, count: count, Up: up, bg: bg, done: done, wake: make(chan struct{})}
	bc := cfg.Breaker
	bc.OnChange = func(from, to upstream.BreakerState, cooldown time.Duration) {
		log.Warn().Str("from", from.String()).Str("to", to.String()).Dur("cooldown", cooldown).
			Msg("circuit breaker " + to.String())
	}
	l.Breaker = upstream.NewBreaker(bc)
	return l, nil
}

// Do sends one exchange upstream. When mcpheal owns the upstream
// credential it sets it first, and a 401 makes it drop the token, fetch a
// new one and send once more (the upstream refused before dispatch, so
// this is safe for any request).
func (l *Link) Do(req *fasthttp.Request, resp *upstream.Response, deadline time.Time) error {
	return l.exchange(req, resp, deadline, l.Up.Do)
}

// DoOnce is do for a request that is not safe to send twice: the upstream
// client never resends it (upstream.Client.DoOnce).
func (l *Link) DoOnce(req *fasthttp.Request, resp *upstream.Response, deadline time.Time) error {
	return l.exchange(req, resp, deadline, l.Up.DoOnce)
}

func (l *Link) exchange(req *fasthttp.Request, resp *upstream.Response, deadline time.Time,
	send func(*fasthttp.Request, *upstream.Response, time.Time) error) error {
	creds := l.Cfg.Credentials
	if creds == nil {
		err := send(req, resp, deadline)
		if err == nil && resp.StatusCode() == fasthttp.StatusUnauthorized {
			l.JudgesCredentials.Store(true)
		}
		return err
	}
	for try := 0; ; try++ {
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		err := creds.Apply(ctx, &req.Header)
		cancel()
		if err != nil {
			return l.credentialFailed(err)
		}
		// A 401 is a refusal before dispatch: sending again under a new
		// token runs nothing twice.
		err = send(req, resp, deadline)
		if err != nil || resp.StatusCode() != fasthttp.StatusUnauthorized || try > 0 {
			return err
		}
		creds.Invalidate(string(req.Header.PeekBytes(wire.HdrAuthorization)))
		l.log.Info().Msg("upstream refused the proxy's credential; fetching a new one")
		resp.Close()
		resp.Response.Reset()
	}
}

// CredentialError is the failure of an exchange that never started:
// mcpheal could not get the upstream credential it owns. Nothing was sent,
// and the upstream is not at fault: it feeds neither the breaker nor a
// retry (decide: actCredential).
type CredentialError struct{ Err error }

func (e *CredentialError) Error() string { return "upstream credential: " + e.Err.Error() }
func (e *CredentialError) Unwrap() error { return e.Err }

// Refused reports a token endpoint's refusal (a 4xx: invalid_client, …)
// or a missing login, which only the operator can mend, as opposed to an
// outage.
func (e *CredentialError) Refused() bool { return upstream.Refused(e.Err) }

// credentialFailed logs a failed credential fetch, at most once a second
// (the token endpoint's status and error code, never a secret), and
// returns it as a credentialError.
func (l *Link) credentialFailed(err error) error {
	ce := &CredentialError{Err: err}
	now := time.Now().UnixNano()
	if last := l.credLogged.Load(); now-last > int64(time.Second) && l.credLogged.CompareAndSwap(last, now) {
		l.log.Error().Err(err).Bool("refused", ce.Refused()).
			Msg("no upstream credential: the token request failed; requests get -32018 until it succeeds")
	}
	return ce
}

// OwnsAuthorization reports whether the agent's Authorization is the
// proxy's business (inbound auth, or a proxy-owned upstream credential) and
// must not be forwarded.
func (l *Link) OwnsAuthorization() bool {
	return l.Cfg.Credentials != nil || len(l.Cfg.AuthTokens) > 0
}

// RequestDrops returns the names of the agent's fields that never go
// upstream.
func (l *Link) RequestDrops() *wire.NameSet {
	if l.OwnsAuthorization() {
		return wire.ReqDropWithAuth
	}
	return wire.ReqDropHeaders
}

// CopyRequest builds the upstream request from the agent's headers and
// body. The body is shared, not copied: the agent's request outlives
// every upstream exchange made for it.
func (l *Link) CopyRequest(hdr *fasthttp.RequestHeader, body []byte, req *fasthttp.Request) {
	hdr.CopyTo(&req.Header)
	wire.StripRequestHeader(&req.Header, l.RequestDrops())
	l.SetOperatorHeaders(&req.Header)
	req.SetBodyRaw(body)
}

// SetOperatorHeaders sets Config.Headers, which replace an agent's header
// of the same name.
func (l *Link) SetOperatorHeaders(h *fasthttp.RequestHeader) {
	for k, v := range l.Cfg.Headers {
		h.Set(k, v)
	}
}

// Origin names the upstream in what mcpheal tells an agent.
func (l *Link) Origin() string { return l.Up.Origin() }

// Allow asks the circuit breaker for a try (upstream.Breaker.Allow).
func (l *Link) Allow() (bool, time.Duration) { return l.Breaker.Allow() }

// UpcallID returns a JSON-RPC id (raw JSON) in mcpheal's own namespace for
// a request of the given kind, unique in the process.
func (l *Link) UpcallID(kind string) string {
	return `"mcpheal-` + kind + `-` + strconv.FormatUint(l.seq.Add(1), 10) + `"`
}

// MaxUpstreamID caps an upstream Mcp-Session-Id. MCP sets no maximum, but
// every id mcpheal holds is sent on every request of its session, and
// servers' ids are 32 to 48 characters (JWTs a few hundred): a longer one
// is refused once, clearly, rather than carried until some hop between
// here and the upstream cuts it.
const MaxUpstreamID = 4 << 10

// errUpstreamIDTooLong: the upstream named its session with an id longer
// than maxUpstreamID. The session is DELETEd and not used.
var errUpstreamIDTooLong = errors.New("upstream Mcp-Session-Id longer than " + strconv.Itoa(MaxUpstreamID) + " bytes")

// SessionOf returns the upstream session id an answer names, or
// errUpstreamIDTooLong (the session it names is then DELETEd).
func (l *Link) SessionOf(h *fasthttp.ResponseHeader, auth []byte) (session.UpstreamID, error) {
	id := h.PeekBytes(wire.HdrSessionID)
	if len(id) <= MaxUpstreamID {
		return session.UpstreamID(id), nil
	}
	l.log.Error().Int("bytes", len(id)).Int("limit", MaxUpstreamID).
		Msg("upstream session id refused: longer than mcpheal's cap; the upstream session is DELETEd")
	l.DeleteLater(session.UpstreamID(id), auth, true)
	return "", errUpstreamIDTooLong
}

// DeleteLater ends an upstream session best-effort in the background,
// bounded by a few seconds.
func (l *Link) DeleteLater(up session.UpstreamID, auth []byte, dead bool) {
	if up == "" {
		return
	}
	var authCopy []byte
	if len(auth) > 0 {
		authCopy = append([]byte(nil), auth...)
	}
	if !l.bg.Add(1) {
		return // closing: a killed process says no goodbye either
	}
	go func() {
		defer l.bg.Done()
		err := l.DeleteNow(up, authCopy, time.Now().Add(2*time.Second))
		if err != nil && !dead {
			l.log.Debug().Str(obs.LogUpstreamID, up.Short()).Err(err).Msg("upstream DELETE failed")
		}
	}()
}

// DeleteNow sends DELETE for an upstream session (MCP 2025-03-26+ §Session
// Management: the client SHOULD end sessions it no longer needs).
func (l *Link) DeleteNow(up session.UpstreamID, auth []byte, deadline time.Time) (err error) {
	defer func() {
		if p := recover(); p != nil {
			l.count.Panics.Add(1)
			err = fmt.Errorf("delete panicked: %v", p)
		}
	}()
	var hdr *fasthttp.RequestHeader
	if len(auth) > 0 {
		hdr = new(fasthttp.RequestHeader)
		hdr.SetBytesKV(wire.HdrAuthorization, auth)
	}
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	resp := upstream.AcquireResponse()
	defer upstream.ReleaseResponse(resp)
	l.Build(req, &Upcall{Hdr: hdr, Method: fasthttp.MethodDelete, Session: up})
	return l.Do(req, resp, deadline)
}

// DropMinted ends a session a server opened for a request that needs
// none (a server/discover probe, a failed initialize, a 2026-07-28
// request to a session-era server): nobody will use its id. The id is
// taken off r, so that it is dropped once.
func (l *Link) DropMinted(r *upstream.Response) {
	if id := r.Header.PeekBytes(wire.HdrSessionID); len(id) > 0 {
		l.DeleteLater(session.UpstreamID(id), nil, true)
		r.Header.DelBytes(wire.HdrSessionID)
	}
}

// recordHealth feeds the breaker: a transport failure is an infrastructure
// failure; any HTTP answer shows the upstream is up.
// noteBusy logs a busy upstream's answer (classify.Busy), at most once a
// second: at capacity or rate-limited, which the operator should know
// of, and which is not an outage (the breaker does not count it).
func (l *Link) NoteBusy(status int, waiting bool) {
	now := time.Now().UnixNano()
	if last := l.busyLogged.Load(); now-last <= int64(time.Second) || !l.busyLogged.CompareAndSwap(last, now) {
		return
	}
	msg := "upstream busy (at capacity or rate-limited): its answer goes to the agent, with Retry-After"
	if waiting {
		msg = "upstream busy (at capacity or rate-limited): waiting its Retry-After, then sending once more"
	}
	l.log.Warn().Int("status", status).Msg(msg)
}

// RetryAfter is how long a busy upstream asked to be left alone
// (Retry-After: seconds or an HTTP date), at most a minute; 1 s when it
// did not say.
func RetryAfter(h *fasthttp.ResponseHeader, now time.Time) time.Duration {
	v := strings.TrimSpace(string(h.Peek("Retry-After")))
	if n, err := strconv.ParseUint(v, 10, 64); err == nil || errors.Is(err, strconv.ErrRange) {
		// Capped before it is multiplied: 2^63-1 seconds is a minute, not
		// a negative wait (ParseUint gives the largest uint64 past it).
		return time.Duration(min(n, 60)) * time.Second
	}
	if t, err := fasthttp.ParseHTTPDate([]byte(v)); err == nil {
		return min(max(t.Sub(now), 0), time.Minute)
	}
	return time.Second
}

func (l *Link) RecordHealth(cls classify.Class) {
	if cls == classify.TransportDead || cls == classify.Timeout {
		l.Failure()
	} else {
		l.Success()
	}
}
