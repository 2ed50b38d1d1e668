package proxy

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/mcpheal/mcpheal/classify"
	"github.com/mcpheal/mcpheal/session"
	"github.com/mcpheal/mcpheal/upstream"
)

// errRecipeRefused: the upstream no longer accepts the session's initialize
// (another protocol version, a credential it rejects). The agent must start
// over, so it is told its session is gone.
var errRecipeRefused = errors.New("upstream refused the recorded initialize")

// mayHeal reports whether this request may re-create the session: only under
// the credential that created it (DESIGN §Security).
func (a *attempt) mayHeal() bool {
	return a.s.fingerprint(a.ctx.Request.Header.PeekBytes(hdrAuthorization)) == a.sess.Recipe.Credential
}

// heal re-initializes the upstream session (single-flight per session) and
// points the request at the new one. It answers the agent itself and returns
// false when healing failed.
func (a *attempt) heal(reason classify.Class) bool {
	a.next()
	if a.budget.IsZero() {
		a.budget = time.Now().Add(a.s.cfg.HealTimeout)
	}
	ctx, cancel := context.WithDeadline(context.Background(), a.budget)
	defer cancel()
	start := time.Now()
	seen := a.gen
	age := a.sess.UpstreamAge()
	up, gen, err := a.sess.Heal(ctx, seen, time.Until(a.budget), a.s.reinit(a.sess, &a.ctx.Request.Header, a.up))
	log := a.s.log
	if err != nil {
		a.s.count.healFailures.Add(1)
		log.Error().Str(logSession, a.sess.ID.Short()).Stringer(logReason, reason).Uint64(logGen, seen).
			Dur(logDuration, time.Since(start)).Err(err).Msg("heal failed")
		if errors.Is(err, errRecipeRefused) || errors.Is(err, session.ErrClosed) {
			a.s.store.Remove(a.sess.ID)
			a.s.sessionNotFound(a.ctx, a.msg.idOrNull())
			return false
		}
		a.upstreamDown("upstream unreachable while re-initializing the session")
		return false
	}
	log.Warn().Str(logSession, a.sess.ID.Short()).Stringer(logReason, reason).Uint64(logGen, gen).
		Dur(logDuration, time.Since(start)).Dur("upstream_age", age).Msg("session healed")
	a.up, a.gen, a.healed = up, gen, true
	return true
}

// reinit returns the re-init that Session.Heal runs once per generation:
// POST the recorded initialize under the failing request's headers, then
// notifications/initialized, retrying failures that delivered nothing with
// backoff until ctx ends. The dead upstream session is DELETEd best-effort.
func (s *Server) reinit(sess *session.Session, agent *fasthttp.RequestHeader, dead session.UpstreamID) session.InitFunc {
	// The leader may outlive the request that started it: copy its headers.
	hdr := new(fasthttp.RequestHeader)
	agent.CopyTo(hdr)
	return func(ctx context.Context) (session.UpstreamID, error) {
		delay := 25 * time.Millisecond
		for try := 1; ; try++ {
			up, err := s.initUpstream(ctx, hdr, sess.Recipe.InitBody, sess.Recipe.ProtocolVersion)
			if err == nil {
				s.count.heals.Add(1)
				s.deleteUpstream(dead, hdr.PeekBytes(hdrAuthorization), true)
				return up, nil
			}
			if errors.Is(err, errRecipeRefused) {
				return "", err
			}
			dl, _ := ctx.Deadline()
			if time.Now().Add(delay).After(dl) || !s.sleep(delay) {
				return "", fmt.Errorf("reinit after %d tries: %w", try, err)
			}
			delay = min(2*delay, time.Second)
		}
	}
}

// replayable reports whether the request may be sent again although the
// upstream may have received it (DESIGN §Replay safety).
func (a *attempt) replayable() bool {
	m := a.msg
	if m.get || !m.isRequest() {
		return true // a GET stream, a notification, an answer: nothing runs twice
	}
	switch m.method {
	case "ping", "initialize", "tools/list", "resources/list", "resources/templates/list",
		"resources/read", "prompts/list", "prompts/get", "completion/complete",
		"logging/setLevel", "resources/subscribe", "resources/unsubscribe", "server/discover":
		return true
	case "tools/call":
		return a.s.replayTools[m.tool] || (a.sess != nil && a.sess.Replayable(m.tool))
	}
	return false
}

// refuse answers an ambiguous failure of a request that is unsafe to run
// twice. HTTP 200 keeps the agent's transport alive (the Python SDK tears
// its transport down on other 4xx/5xx); the JSON-RPC error fails the call.
func (a *attempt) refuse(cls classify.Class, err error) {
	a.s.count.replaysRefused.Add(1)
	cause := "upstream connection lost"
	if cls == classify.Timeout {
		cause = "upstream did not answer in time"
	}
	a.s.log.Warn().Str(logMethod, a.msg.method).Str("tool", a.msg.tool).Stringer(logClass, cls).
		Err(err).Msg("not replayed: the request may have run")
	writeError(a.ctx, fasthttp.StatusOK, codeMaybeExecuted, a.msg.idOrNull(),
		cause+" after the request was sent; "+a.msg.method+" may or may not have run and was not retried")
}

// upstreamDown answers 503 with Retry-After; the client session stays valid
// and the agent's next request heals.
func (a *attempt) upstreamDown(why string) {
	a.s.count.upstreamDown.Add(1)
	writeError(a.ctx, fasthttp.StatusServiceUnavailable, codeUpstreamDown, a.msg.idOrNull(),
		why+": "+a.s.up.Origin())
	a.ctx.Response.Header.Set("Retry-After", "1")
}

// deleteUpstream ends an upstream session best-effort in the background,
// bounded by a few seconds.
func (s *Server) deleteUpstream(up session.UpstreamID, auth []byte, dead bool) {
	if up == "" {
		return
	}
	var authCopy []byte
	if len(auth) > 0 {
		authCopy = append([]byte(nil), auth...)
	}
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		defer func() { _ = recover() }()
		req := fasthttp.AcquireRequest()
		defer fasthttp.ReleaseRequest(req)
		resp := upstream.AcquireResponse()
		defer upstream.ReleaseResponse(resp)
		req.Header.SetMethod(fasthttp.MethodDelete)
		req.Header.SetBytesK(hdrSessionID, string(up))
		if authCopy != nil {
			req.Header.SetBytesKV(hdrAuthorization, authCopy)
		}
		if err := s.up.Do(req, resp, time.Now().Add(2*time.Second)); err != nil && !dead {
			s.log.Debug().Str(logUpstreamID, up.Short()).Err(err).Msg("upstream DELETE failed")
		}
	}()
}

// sessionDropped runs when the store expires or evicts a session.
func (s *Server) sessionDropped(sess *session.Session) {
	s.streams.interrupt(sess.ID)
	up, _ := sess.Current()
	s.log.Info().Str(logSession, sess.ID.Short()).Msg("session expired")
	s.deleteUpstream(up, nil, false)
}

// dropMintedSession: a pre-2026 server answering a session-less request
// (e.g. a server/discover probe) may open a session for it. The agent never
// sees that id, so the proxy ends it.
func (s *Server) dropMintedSession(r *upstream.Response) {
	if id := r.Header.PeekBytes(hdrSessionID); len(id) > 0 {
		s.deleteUpstream(session.UpstreamID(id), nil, true)
	}
}
