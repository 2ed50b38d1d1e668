package proxy

import (
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/mcpheal/mcpheal/classify"
	"github.com/mcpheal/mcpheal/session"
)

var (
	hdrSessionID       = []byte("Mcp-Session-Id")
	hdrProtocolVersion = []byte("MCP-Protocol-Version")
	hdrLastEventID     = []byte("Last-Event-ID")
	hdrAuthorization   = []byte("Authorization")
	hdrOrigin          = []byte("Origin")
	hdrAccept          = []byte("Accept")
	mimeJSON           = []byte("application/json")
	mimeEventStream    = []byte("text/event-stream")
)

// statelessVersion is the first MCP version without sessions (2026-07-28
// changelog): its traffic passes through without session mapping.
const statelessVersion = "2026-07-28"

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

// requestPool holds the guard's requests: one per agent request, which the
// attempt points to, so that none is allocated on the hot path. Nothing
// may hold a request once its handler has returned (an answer body that
// outlives it lets go of it: attempt.run).
var requestPool = sync.Pool{New: func() any { return new(request) }}

func putRequest(r *request) {
	*r = request{}
	requestPool.Put(r)
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
			s.serveLog(ctx, r, l, seq) // resuming an answer mcpheal keeps (answerlog.go)
			return
		}
		s.serveStream(ctx, r)
	default:
		s.forward(ctx, r)
	}
}

// reroute is route again for a request whose upstream changed its era
// under it (attempt.run): a session-era agent's request that a server now
// of 2026-07-28 only refused before running it goes through the bridge.
func (s *Server) reroute(ctx *fasthttp.RequestCtx, r *request) {
	ctx.Response.Reset()
	s.bridge.serve(ctx, r)
}

// forward sends the agent's request upstream (its session id swapped for
// the upstream's) and gives the agent one answer: the upstream's, after a
// heal and replay if the rules allow, or mcpheal's own error.
func (s *Server) forward(ctx *fasthttp.RequestCtx, r *request) {
	a := newAttempt(s, ctx, r)
	a.heals = r.sess != nil
	s.link.copyRequest(r.hdr, r.body, a.req)
	if a.heals && r.msg.method == "" && r.msg.id != "" && !r.msg.batch && !a.answerRoute() {
		// The agent's answer to a server→client request of an upstream
		// session that is gone: the new session never asked it.
		ctx.SetStatusCode(fasthttp.StatusAccepted)
		a.release()
		return
	}
	if !a.run() {
		a.release()
	}
}

// answerRoute points the agent's answer to a server→client request at the
// upstream session that asked (docs/streams.md "Streams and session state across a
// heal": ids of later generations were renumbered). It reports false when
// that session is gone.
func (a *attempt) answerRoute() bool {
	if answerGen(a.msg.id) > a.gen {
		// Asked by a generation another process healed into.
		a.gen = a.s.sessions.fleet.follow(a.sess)
		a.up, a.gen = a.sess.Current()
	}
	restored, live := answerRoute(a.r.body, a.msg.id, a.gen)
	if restored != nil {
		a.req.SetBodyRaw(restored)
	}
	return live
}

// initialize forwards the agent's initialize and, when the upstream
// accepts it, creates the agent's session (sessions.newSession: the
// recipe, the sealed id), admitted under the store's caps and the memory
// budget, and answers with the session's id. Until the session exists the
// request is replay-safe, so a down upstream costs latency within the heal
// budget, not an error.
func (s *Server) initialize(ctx *fasthttp.RequestCtx, r *request) {
	a := newAttempt(s, ctx, r)
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

// create makes the agent's session from the upstream's accepted
// initialize. An answer that is not a successful initialize passes through
// without one; a session the caps or the budget leave no room for, or an
// upstream session id past maxUpstreamID, is DELETEd upstream and the
// agent gets mcpheal's error.
func (a *attempt) create() outcome {
	msg, ok := a.initializeAnswer()
	if !ok {
		a.s.link.dropMinted(a.resp)
		return outcome{kind: outTooLarge, class: classify.Protocol, err: errAnswerTooLarge}
	}
	return a.createFrom(msg)
}

// createFrom is create, given the initialize's answer (its JSON-RPC
// message).
func (a *attempt) createFrom(msg []byte) outcome {
	version := initializedVersion(a.resp.StatusCode(), msg)
	if version == "" {
		return outcome{kind: outUpstream, class: classify.Classify(a.resp.StatusCode(), mimeJSON, msg)}
	}
	s := a.s
	up, err := s.link.sessionOf(&a.resp.Header, a.req.Header.PeekBytes(hdrAuthorization))
	if err != nil {
		return outcome{kind: outInvalid, err: err}
	}
	sess := s.sessions.newSession(a.r, &a.req.Header, version, up)
	if err := s.sessions.admit(sess); err != nil {
		s.link.dropMinted(a.resp)
		s.log.Warn().Err(err).Int("sessions", s.sessions.store.Len()).Int64("budget", s.mem.limit).Msg("initialize refused")
		return outcome{kind: outFull, err: err}
	}
	a.sess, a.r.sess, a.heals = sess, sess, true
	a.r.standing, a.r.ownCredential = bound, true
	s.log.Debug().Str(logSession, sess.ID.Short()).Str("protocol", version).Bool("stateful", up != "").Msg("session created")
	return outcome{kind: outUpstream, class: classify.OK}
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
		if s.streams.evict(id, 0) {
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
				s.streams.healed(id, e.Gen)
			}
		}
	}
}

// released stops what a session held open once it left the store.
func (s *Server) released(sess *session.Session) {
	s.streams.stop(sess.ID)
	s.bridge.stopListen(sess.ID)
	s.held.released(sess)
}
