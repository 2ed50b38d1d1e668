package proxy

import (
	"time"

	"github.com/valyala/fasthttp"

	"github.com/mcpheal/mcpheal/proxy/internal/exchange"
	"github.com/mcpheal/mcpheal/proxy/internal/obs"
	"github.com/mcpheal/mcpheal/proxy/internal/route/held"
	"github.com/mcpheal/mcpheal/proxy/internal/wire"
	"github.com/mcpheal/mcpheal/session"
)

// ServeMCP answers one agent request on this upstream's MCP endpoint, in
// the one pipeline every request takes: guard (guard.go) → route (below)
// → attempt (attempt.go) → answer (answer.go). A panic is answered 502
// and never spreads.
func (s *Server) ServeMCP(ctx *fasthttp.RequestCtx) {
	r := exchange.RequestPool.Get().(*exchange.Request)
	defer exchange.PutRequest(r)
	defer s.recoverPanic(ctx, r)
	defer s.armWrite(ctx.Conn()) // the answer is written after the handler
	s.inflight.Add(1)
	defer s.inflight.Add(-1)
	if !s.guard.check(ctx, r) {
		return
	}
	defer s.guard.settle(r)
	if s.trace != nil {
		exchange.StartSpan(s.trace, r)
		defer r.EndSpan()
	}
	s.route(ctx, r)
}

// route sends a guarded request the way its upstream's era asks (docs/eras.md
// "Across protocol eras"): a session-era agent of an upstream that speaks
// only 2026-07-28 goes through the bridge, a 2026-07-28 agent of an
// upstream of the session era only on the session mcpheal holds for it;
// an agent resuming an answer mcpheal keeps is served from its log (or the
// fleet's, docs/streams.md "Across replicas"); every
// other request passes through, its session id swapped for the upstream's.
// The choice is made here and nowhere else: the guard checks, the routes
// translate, and an era change the exchange finds comes back here
// (reroute).
func (s *Server) route(ctx *fasthttp.RequestCtx, r *exchange.Request) {
	switch {
	case r.Del:
		s.endSession(ctx, r)
	case !r.Stateless && s.eras.Bridged(r.Auth):
		s.bridge.Serve(ctx, r)
	case r.Stateless && s.eras.HeldRoute(r.Auth):
		// No session id: the session mcpheal holds for the agent's
		// credential and client, if there is one yet (route/held).
		r.Sess = s.held.Lookup(held.KeyOf(r.Auth, r.Body))
		s.held.Serve(ctx, r)
	case r.Msg.Method == "initialize" && r.Sess == nil:
		s.initialize(ctx, r)
	case r.Msg.Get && r.Sess != nil:
		if l, seq := s.answers.Find(r.Sess.ID, r.Hdr.PeekBytes(wire.HdrLastEventID)); l != nil {
			s.streams.ServeLog(ctx, r, l, seq) // resuming an answer mcpheal keeps (answerlog.go)
			return
		}
		if key, seq, ok := s.answers.SharedKey(r.Hdr.PeekBytes(wire.HdrLastEventID)); ok {
			s.streams.ServeShared(ctx, r, key, seq) // one the fleet keeps (route/stream/shared.go)
			return
		}
		if s.streams.Serve(ctx, r) {
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
func (s *Server) reroute(ctx *fasthttp.RequestCtx, r *exchange.Request) {
	ctx.Response.Reset()
	s.bridge.Serve(ctx, r)
}

// forward sends the agent's request upstream (its session id swapped for
// the upstream's) and gives the agent one answer: the upstream's, after a
// heal and replay if the rules allow, or mcpheal's own error. It reports
// true, with nothing written, when the upstream's era changed under the
// request (attempt.run): the route stage sends it again.
func (s *Server) forward(ctx *fasthttp.RequestCtx, r *exchange.Request) (reroute bool) {
	a := exchange.NewAttempt(s.env, ctx, r)
	a.Heals = r.Sess != nil
	s.link.CopyRequest(r.Hdr, r.Body, a.Req)
	if a.Heals && r.Msg.Method == "" && r.Msg.ID != "" && !r.Msg.Batch && !a.AnswerRoute() {
		// The agent's answer to a server→client request of an upstream
		// session that is gone: the new session never asked it.
		ctx.SetStatusCode(fasthttp.StatusAccepted)
		a.Release()
		return false
	}
	owned, reroute := a.Run()
	if !owned {
		a.Release()
	}
	return reroute
}

// initialize forwards the agent's initialize and, when the upstream
// accepts it, creates the agent's session (sessions.newSession: the
// recipe, the sealed id), admitted under the store's caps and the memory
// budget, and answers with the session's id. Until the session exists the
// request is replay-safe, so a down upstream costs latency within the heal
// budget, not an error.
func (s *Server) initialize(ctx *fasthttp.RequestCtx, r *exchange.Request) {
	a := exchange.NewAttempt(s.env, ctx, r)
	a.Gen = 1 // event ids are the proxy's from the first answer on (docs/streams.md "Streams")
	s.link.CopyRequest(r.Hdr, r.Body, a.Req)
	a.Req.Header.DelBytes(wire.HdrSessionID)
	s.count.UpstreamInits.Add(1)
	a.WatchAgent()
	out := a.Loop()
	if out.Kind == exchange.OutUpstream {
		out = a.Create()
	} else {
		// An answer mcpheal cannot carry (past max_answer or the memory
		// budget) or an agent gone: a session the upstream opened with it
		// is nobody's, and a server without idle expiry would keep it.
		s.link.DropMinted(a.Resp)
	}
	if !a.Answer(out) {
		a.Unwatch()
		a.Release()
	}
}

// endSession ends the agent's session (DELETE): the upstream session is
// DELETEd with whatever answer (200, 202, 204, 404, 405 are all fine) and
// the mapping is dropped. The agent gets 200: its session is over either
// way.
func (s *Server) endSession(ctx *fasthttp.RequestCtx, r *exchange.Request) {
	if !s.sessions.End(r.Sess, true) {
		sessionNotFound(ctx, "null") // ended meanwhile
		return
	}
	// The upstream session ends before the agent hears that its session
	// did: a request racing on another replica then meets a dead one.
	if up, _ := r.Sess.Current(); up != "" {
		if err := s.link.DeleteNow(up, r.Auth, time.Now().Add(2*time.Second)); err != nil {
			s.log.Debug().Str(obs.LogUpstreamID, up.Short()).Err(err).Msg("upstream DELETE failed")
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
		if s.streams.Set.Evict(id, 0) {
			s.log.Debug().Str(obs.LogSession, id.Short()).Msg("GET stream handed to another process")
		}
	case e.Ended:
		s.sessions.EndedElsewhere(id)
	default:
		sess, ok := s.sessions.Store.Peek(id)
		if !ok {
			return
		}
		if _, gen := sess.Current(); gen < e.Gen {
			sess.Follow(e.Upstream, e.Gen)
			if _, now := sess.Current(); now == e.Gen {
				s.streams.Set.Healed(id, e.Gen)
			}
		}
	}
}

// released stops what a session held open once it left the store.
func (s *Server) released(sess *session.Session) {
	s.streams.Set.Stop(sess.ID)
	s.bridge.StopListen(sess.ID)
	s.held.Released(sess)
}
