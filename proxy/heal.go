package proxy

import (
	"context"
	"errors"
	"fmt"
	"strconv"
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
	return sameCredential(a.sess, a.s.fingerprint(a.ctx.Request.Header.PeekBytes(hdrAuthorization)))
}

// heal re-initializes the upstream session (single-flight per session) and
// points the request at the new one. It answers the agent itself and returns
// false when healing failed.
func (a *attempt) heal(reason int) bool {
	a.next()
	if a.budget.IsZero() {
		a.budget = time.Now().Add(a.s.cfg.HealTimeout)
	}
	ctx, cancel := context.WithDeadline(context.Background(), a.budget)
	defer cancel()
	init := a.s.reinit(a.sess, &a.ctx.Request.Header, a.up)
	up, gen, err := a.s.healSession(ctx, a.sess, a.gen, reason, init)
	if err != nil {
		var bo *breakerOpenError
		switch {
		case errors.As(err, &bo):
			a.breakerOpen(bo.wait)
		case errors.Is(err, errRecipeRefused) || errors.Is(err, session.ErrClosed):
			if _, ok := a.s.store.Remove(a.sess.ID); ok {
				a.s.forget(a.sess)
			}
			a.s.count.request(&a.msg, classify.SessionGone)
			a.s.sessionNotFound(a.ctx, a.msg.idOrNull())
		default:
			a.upstreamDown("upstream unreachable while re-initializing the session")
		}
		return false
	}
	a.up, a.gen, a.healed = up, gen, true
	return true
}

// healSession runs (or joins) the session's re-init, and counts and logs
// the outcome once per generation: only the caller that saw the generation
// change reports it.
func (s *Server) healSession(ctx context.Context, sess *session.Session, seen uint64, reason int, init session.InitFunc) (session.UpstreamID, uint64, error) {
	start := time.Now()
	age := sess.UpstreamAge()
	budget := time.Until(deadlineOf(ctx, start.Add(s.cfg.HealTimeout)))
	up, gen, err := sess.Heal(ctx, seen, budget, init)
	log := s.log
	switch {
	case err == nil && gen == seen+1 && s.leadReported(sess, gen):
		s.count.heals[reason][outcomeOK].Add(1)
		s.count.healDuration.Observe(time.Since(start).Seconds())
		s.count.sessionAge.Observe(age.Seconds())
		log.Warn().Str(logSession, sess.ID.Short()).Str(logReason, reasonNames[reason]).Uint64(logGen, gen).
			Dur(logDuration, time.Since(start)).Dur("upstream_age", age).Msg("session healed")
		s.streams.healed(sess.ID, gen)
		if sess.ToolsSeen() {
			s.bg.Add(1)
			go s.checkTools(sess, recipeHeader(sess))
		}
	case errors.Is(err, session.ErrClosed):
		log.Debug().Str(logSession, sess.ID.Short()).Msg("heal abandoned: the session ended")
	case err != nil:
		outcome := outcomeFailed
		if errors.Is(err, errRecipeRefused) {
			outcome = outcomeRefused
		}
		s.count.heals[reason][outcome].Add(1)
		log.Error().Str(logSession, sess.ID.Short()).Str(logReason, reasonNames[reason]).Uint64(logGen, seen).
			Dur(logDuration, time.Since(start)).Err(err).Msg("heal failed")
	}
	return up, gen, err
}

// leadReported reports true exactly once per (session, generation): the
// first of the waiters of one heal to get here counts and logs it.
func (s *Server) leadReported(sess *session.Session, gen uint64) bool {
	return sess.MarkReported(gen)
}

func deadlineOf(ctx context.Context, def time.Time) time.Time {
	if dl, ok := ctx.Deadline(); ok {
		return dl
	}
	return def
}

// breakerOpenError: the circuit breaker refused the work.
type breakerOpenError struct{ wait time.Duration }

func (e *breakerOpenError) Error() string {
	return fmt.Sprintf("circuit breaker open for %v", e.wait.Round(time.Millisecond))
}

// breakerOpen answers 503 at once while the upstream's breaker is open.
func (a *attempt) breakerOpen(wait time.Duration) {
	a.s.count.upstreamDown.Add(1)
	a.s.count.request(&a.msg, classify.TransportDead)
	writeError(a.ctx, fasthttp.StatusServiceUnavailable, codeUpstreamDown, a.msg.idOrNull(),
		"upstream "+a.s.cfg.Name+" unavailable (circuit breaker open): "+a.s.up.Origin())
	a.ctx.Response.Header.Set("Retry-After", strconv.Itoa(int((wait+time.Second-1)/time.Second)))
}

// reinit returns the re-init that Session.Heal runs once per generation:
// POST the recorded initialize under the failing request's headers, then
// notifications/initialized, retrying failures that delivered nothing with
// backoff until ctx ends. The dead upstream session is DELETEd best-effort.
func (s *Server) reinit(sess *session.Session, agent *fasthttp.RequestHeader, dead session.UpstreamID) session.InitFunc {
	// The leader may outlive the request that started it: copy its headers.
	hdr := new(fasthttp.RequestHeader)
	agent.CopyTo(hdr)
	if s.ownsAuthorization() {
		hdr.DelBytes(hdrAuthorization) // the agent's is the proxy's own, not the upstream's
	}
	return func(ctx context.Context) (session.UpstreamID, error) {
		delay := 25 * time.Millisecond
		for try := 1; ; try++ {
			if ok, wait := s.breaker.Allow(); !ok {
				return "", &breakerOpenError{wait: wait}
			}
			up, err := s.initUpstream(ctx, hdr, sess.Recipe.InitBody, sess.Recipe.ProtocolVersion)
			if err == nil {
				s.upSuccess()
				s.replayJournal(ctx, hdr, sess, up)
				s.deleteUpstream(dead, hdr.PeekBytes(hdrAuthorization), true)
				return up, nil
			}
			if errors.Is(err, errRecipeRefused) {
				return "", err
			}
			s.upFailure()
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
	a.s.count.request(&a.msg, cls)
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
	a.s.count.request(&a.msg, classify.TransportDead)
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
		err := s.deleteNow(up, authCopy, time.Now().Add(2*time.Second))
		if err != nil && !dead {
			s.log.Debug().Str(logUpstreamID, up.Short()).Err(err).Msg("upstream DELETE failed")
		}
	}()
}

// deleteNow sends DELETE for an upstream session (MCP 2025-03-26+ §Session
// Management: the client SHOULD end sessions it no longer needs).
func (s *Server) deleteNow(up session.UpstreamID, auth []byte, deadline time.Time) (err error) {
	defer func() {
		if p := recover(); p != nil {
			s.count.panics.Add(1)
			err = fmt.Errorf("delete panicked: %v", p)
		}
	}()
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	resp := upstream.AcquireResponse()
	defer upstream.ReleaseResponse(resp)
	req.Header.SetMethod(fasthttp.MethodDelete)
	req.Header.SetBytesK(hdrSessionID, string(up))
	if len(auth) > 0 && !s.ownsAuthorization() {
		req.Header.SetBytesKV(hdrAuthorization, auth)
	}
	s.setOperatorHeaders(&req.Header)
	return s.do(req, resp, deadline)
}

// sessionDropped runs when the store expires or evicts a session.
func (s *Server) sessionDropped(sess *session.Session) {
	s.forget(sess)
	s.streams.stop(sess.ID)
	up, _ := sess.Current()
	s.log.Info().Str(logSession, sess.ID.Short()).Msg("session expired")
	s.deleteUpstream(up, recipeHeader(sess).PeekBytes(hdrAuthorization), false)
}

// dropMintedSession: a pre-2026 server answering a session-less request
// (e.g. a server/discover probe) may open a session for it. The agent never
// sees that id, so the proxy ends it.
func (s *Server) dropMintedSession(r *upstream.Response) {
	if id := r.Header.PeekBytes(hdrSessionID); len(id) > 0 {
		s.deleteUpstream(session.UpstreamID(id), nil, true)
	}
}
