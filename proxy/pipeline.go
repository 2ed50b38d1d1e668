package proxy

import (
	"time"

	"github.com/valyala/fasthttp"

	"github.com/mcpheal/mcpheal/session"
)

// ServeMCP answers one agent request on this upstream's MCP endpoint, in
// the one pipeline every request takes: guard (guard.go) → route (below)
// → attempt (attempt.go) → answer (answer.go). A panic is answered 502
// and never spreads.
func (s *Server) ServeMCP(ctx *fasthttp.RequestCtx) {
	r := requestPool.Get().(*request)
	defer putRequest(r)
	defer s.recoverPanic(ctx, r)
	defer s.armWrite(ctx.Conn()) // the answer is written after the handler
	s.inflight.Add(1)
	defer s.inflight.Add(-1)
	if !s.guard.check(ctx, r) {
		return
	}
	defer s.guard.settle(r)
	if s.trace != nil {
		s.trace.start(r)
		defer r.endSpan()
	}
	s.route(ctx, r)
}

// route sends a guarded request the way its upstream's era asks (docs/eras.md
// "Across protocol eras"): a session-era agent of an upstream that speaks
// only 2026-07-28 goes through the bridge, a 2026-07-28 agent of an
// upstream of the session era only on the session mcpheal holds for it;
// an agent resuming an answer mcpheal keeps is served from its log; every
// other request passes through, its session id swapped for the upstream's.
func (s *Server) route(ctx *fasthttp.RequestCtx, r *request) {
	switch {
	case r.del:
		s.endSession(ctx, r)
	case !r.stateless && s.eras.bridged(r.auth):
		s.bridge.serve(ctx, r)
	case r.stateless && r.onHeldRoute:
		s.held.serve(ctx, r)
	case r.msg.method == "initialize" && r.sess == nil:
		s.initialize(ctx, r)
	case r.msg.get && r.sess != nil:
		if l, seq := s.answers.find(r.sess.ID, r.hdr.PeekBytes(hdrLastEventID)); l != nil {
			s.streams.serveLog(ctx, r, l, seq) // resuming an answer mcpheal keeps (answerlog.go)
			return
		}
		if s.streams.serve(ctx, r) {
			s.reroute(ctx, r)
		}
	default:
		if s.forward(ctx, r) {
			s.reroute(ctx, r)
		}
	}
}

// reroute is route again for a request whose upstream changed its era
// under it (the exchange's outcome, attempt.run): a session-era agent's
// request that a server now of 2026-07-28 only refused before running it
// goes through the bridge.
func (s *Server) reroute(ctx *fasthttp.RequestCtx, r *request) {
	ctx.Response.Reset()
	s.bridge.serve(ctx, r)
}

// forward sends the agent's request upstream (its session id swapped for
// the upstream's) and gives the agent one answer: the upstream's, after a
// heal and replay if the rules allow, or mcpheal's own error. It reports
// true, with nothing written, when the upstream's era changed under the
// request (attempt.run): the route stage sends it again.
func (s *Server) forward(ctx *fasthttp.RequestCtx, r *request) (reroute bool) {
	a := newAttempt(s.env, ctx, r)
	a.heals = r.sess != nil
	s.link.copyRequest(r.hdr, r.body, a.req)
	if a.heals && r.msg.method == "" && r.msg.id != "" && !r.msg.batch && !a.answerRoute() {
		// The agent's answer to a server→client request of an upstream
		// session that is gone: the new session never asked it.
		ctx.SetStatusCode(fasthttp.StatusAccepted)
		a.release()
		return false
	}
	owned, reroute := a.run()
	if !owned {
		a.release()
	}
	return reroute
}

// initialize forwards the agent's initialize and, when the upstream
// accepts it, creates the agent's session (sessions.newSession: the
// recipe, the sealed id), admitted under the store's caps and the memory
// budget, and answers with the session's id. Until the session exists the
// request is replay-safe, so a down upstream costs latency within the heal
// budget, not an error.
func (s *Server) initialize(ctx *fasthttp.RequestCtx, r *request) {
	a := newAttempt(s.env, ctx, r)
	a.gen = 1 // event ids are the proxy's from the first answer on (docs/streams.md "Streams")
	s.link.copyRequest(r.hdr, r.body, a.req)
	a.req.Header.DelBytes(hdrSessionID)
	s.count.upstreamInits.Add(1)
	a.watchAgent()
	out := a.loop()
	if out.kind == outUpstream {
		out = a.create()
	} else {
		// An answer mcpheal cannot carry (past max_answer or the memory
		// budget) or an agent gone: a session the upstream opened with it
		// is nobody's, and a server without idle expiry would keep it.
		s.link.dropMinted(a.resp)
	}
	if !a.answer(out) {
		a.unwatch()
		a.release()
	}
}

// endSession ends the agent's session (DELETE): the upstream session is
// DELETEd with whatever answer (200, 202, 204, 404, 405 are all fine) and
// the mapping is dropped. The agent gets 200: its session is over either
// way.
func (s *Server) endSession(ctx *fasthttp.RequestCtx, r *request) {
	if !s.sessions.end(r.sess, true) {
		sessionNotFound(ctx, "null") // ended meanwhile
		return
	}
	// The upstream session ends before the agent hears that its session
	// did: a request racing on another replica then meets a dead one.
	if up, _ := r.sess.Current(); up != "" {
		if err := s.link.deleteNow(up, r.auth, time.Now().Add(2*time.Second)); err != nil {
			s.log.Debug().Str(logUpstreamID, up.Short()).Err(err).Msg("upstream DELETE failed")
		}
	}
	ctx.SetStatusCode(fasthttp.StatusOK)
}

// fleetEvent applies one event of the fleet to the session it names, held
// by this process: an ended session is dropped here too (no upstream
// DELETE: the process that ended it sent one); a session healed elsewhere
// moves to the new upstream session, and its GET streams here reopen on
// it; a GET stream another process opened replaces this one's.
func (s *Server) fleetEvent(id session.ClientID, e session.Event) {
	switch {
	case e.Stream:
		if s.streams.set.evict(id, 0) {
			s.log.Debug().Str(logSession, id.Short()).Msg("GET stream handed to another process")
		}
	case e.Ended:
		s.sessions.endedElsewhere(id)
	default:
		sess, ok := s.sessions.store.Peek(id)
		if !ok {
			return
		}
		if _, gen := sess.Current(); gen < e.Gen {
			sess.Follow(e.Upstream, e.Gen)
			if _, now := sess.Current(); now == e.Gen {
				s.streams.set.healed(id, e.Gen)
			}
		}
	}
}

// released stops what a session held open once it left the store.
func (s *Server) released(sess *session.Session) {
	s.streams.set.stop(sess.ID)
	s.bridge.stopListen(sess.ID)
	s.held.released(sess)
}
