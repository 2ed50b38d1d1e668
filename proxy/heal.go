package proxy

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/mcpheal/mcpheal/session"
	"github.com/mcpheal/mcpheal/upstream"
)

// errRecipeRefused: the upstream no longer accepts the session's initialize
// (another protocol version, a credential it rejects). The agent must start
// over, so it is told its session is gone.
var errRecipeRefused = errors.New("upstream refused the recorded initialize")

// mayHeal reports whether this request may re-create the session: only under
// the credential that created it (README "Security").
func (a *attempt) mayHeal() bool {
	return sameCredential(a.sess, a.s.fingerprint(a.ctx.Request.Header.PeekBytes(hdrAuthorization)))
}

// heal re-initializes the upstream session (single-flight per session) and
// points the request at the new one. When healing fails, ok is false and
// out is what the agent gets.
func (a *attempt) heal(reason int) (out outcome, ok bool) {
	a.next()
	if a.budget.IsZero() {
		a.budget = time.Now().Add(a.s.cfg.HealTimeout)
	}
	ctx, cancel := context.WithDeadline(context.Background(), a.budget)
	defer cancel()
	init := a.s.reinit(a.sess, &a.ctx.Request.Header, a.up, a.gen)
	up, gen, err := a.s.healSession(ctx, a.sess, a.gen, reason, init)
	if err != nil {
		var bo *breakerOpenError
		switch {
		case errors.As(err, &bo):
			return outcome{kind: outBreakerOpen, wait: bo.wait}, false
		case errors.Is(err, errRecipeRefused) || errors.Is(err, session.ErrClosed):
			// Its id would open again and heal into the same refusal.
			a.s.graves.bury(string(a.sess.ID), a.s.cfg.SessionMaxAge)
			if errors.Is(err, errRecipeRefused) {
				a.s.ended(a.sess.ID)
			}
			if _, ok := a.s.store.Remove(a.sess.ID); ok {
				a.s.release(a.sess)
			}
			return outcome{kind: outGone}, false
		}
		return outcome{kind: outDown, why: "upstream unreachable while re-initializing the session"}, false
	}
	// A session adopted from another process may have died with this
	// one (an upstream restart): the request may then heal once more.
	a.up, a.gen = up, gen
	if !a.sess.WasAdopted(gen) || a.adopted {
		a.healed = true
	}
	a.adopted = true
	return outcome{}, true
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
	case err == nil && gen > seen && !sess.WasAdopted(gen) && s.leadReported(sess, gen):
		s.count.heals[reason][outcomeOK].Add(1)
		s.count.healDuration.Observe(time.Since(start).Seconds())
		s.count.sessionAge.Observe(age.Seconds())
		log.Warn().Str(logSession, sess.ID.Short()).Str(logReason, reasonNames[reason]).Uint64(logGen, gen).
			Dur(logDuration, time.Since(start)).Dur("upstream_age", age).Msg("session healed")
		s.streams.healed(sess.ID, gen)
		if sess.ToolsSeen() && s.bg.Add(1) {
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

// reinit returns the re-init that Session.Heal runs once per generation:
// POST the recorded initialize under the failing request's headers, then
// notifications/initialized, retrying failures that delivered nothing with
// backoff until ctx ends. The dead upstream session is DELETEd best-effort.
// With a shared store, the upstream session another process made for the
// generation after seen is adopted instead (shared.go).
func (s *Server) reinit(sess *session.Session, agent *fasthttp.RequestHeader, dead session.UpstreamID, seen uint64) session.InitFunc {
	// The leader may outlive the request that started it: copy its headers.
	hdr := new(fasthttp.RequestHeader)
	agent.CopyTo(hdr)
	if s.ownsAuthorization() {
		hdr.DelBytes(hdrAuthorization) // the agent's is the proxy's own, not the upstream's
	}
	return func(ctx context.Context) (session.UpstreamID, uint64, error) {
		switch up, gen, err := s.adopt(ctx, sess, seen); {
		case err == nil:
			sess.NoteAdopted(gen)
			s.log.Info().Str(logSession, sess.ID.Short()).Uint64(logGen, gen).Msg("heal adopted from another process")
			return up, gen, nil
		case !errors.Is(err, errAdopt):
			return "", 0, err
		}
		delay := 25 * time.Millisecond
		for try := 1; ; try++ {
			if ok, wait := s.breaker.Allow(); !ok {
				return "", 0, &breakerOpenError{wait: wait}
			}
			up, err := s.initUpstream(ctx, hdr, sess.Recipe.InitBody, sess.Recipe.ProtocolVersion)
			if err == nil {
				s.upSuccess()
				s.replayJournal(ctx, hdr, sess, up)
				mine := up
				up, gen, err := s.publish(ctx, sess, seen, up, hdr.PeekBytes(hdrAuthorization))
				if err != nil {
					return "", 0, err
				}
				if up != mine {
					sess.NoteAdopted(gen) // another process won the race: its session, not ours
					return up, gen, nil
				}
				s.deleteUpstream(dead, hdr.PeekBytes(hdrAuthorization), true)
				return up, gen, nil
			}
			if errors.Is(err, errRecipeRefused) {
				return "", 0, err
			}
			s.upFailure()
			s.log.Debug().Str(logSession, sess.ID.Short()).Int("try", try).Err(err).Msg("upstream initialize failed; retrying")
			dl, _ := ctx.Deadline()
			if time.Now().Add(delay).After(dl) || !s.sleep(delay) {
				return "", 0, fmt.Errorf("reinit after %d tries: %w", try, err)
			}
			delay = min(2*delay, time.Second)
		}
	}
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
	if !s.bg.Add(1) {
		return // closing: a killed process says no goodbye either
	}
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
	var hdr *fasthttp.RequestHeader
	if len(auth) > 0 {
		hdr = new(fasthttp.RequestHeader)
		hdr.SetBytesKV(hdrAuthorization, auth)
	}
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	resp := upstream.AcquireResponse()
	defer upstream.ReleaseResponse(resp)
	s.build(req, &upcall{hdr: hdr, method: fasthttp.MethodDelete, session: up})
	return s.do(req, resp, deadline)
}

// sessionDropped runs when the store expires or evicts a session.
func (s *Server) sessionDropped(sess *session.Session) {
	s.release(sess)
	s.streams.stop(sess.ID)
	up, _ := sess.Current()
	s.log.Info().Str(logSession, sess.ID.Short()).Msg("session expired")
	if s.cfg.Shared != nil {
		return // another process of the fleet may be using its upstream session
	}
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
