package proxy

import (
	"bytes"
	"strconv"
	"strings"
	"time"

	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"

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

// ServeMCP answers one agent request on this upstream's MCP endpoint: guard,
// then route by HTTP method. A panic is answered 502 and never spreads.
func (s *Server) ServeMCP(ctx *fasthttp.RequestCtx) {
	defer s.recoverPanic(ctx)
	defer s.armWrite(ctx.Conn()) // the answer is written after the handler
	s.inflight.Add(1)
	defer s.inflight.Add(-1)
	if len(ctx.PostBody()) > s.cfg.MaxBody {
		tooLarge(ctx, s.cfg.MaxBody)
		return
	}
	if !s.guard.check(ctx) {
		writeError(ctx, fasthttp.StatusForbidden, codeForbidden, requestID(ctx.PostBody(), s.cfg.MaxJSONDepth),
			"Forbidden: Host or Origin not allowed")
		return
	}
	if !s.inboundAllowed(ctx) {
		return
	}
	if len(ctx.Request.Header.PeekAll(string(hdrSessionID))) > 1 {
		// Which one would the upstream read? Neither is forwarded.
		writeError(ctx, fasthttp.StatusBadRequest, codeInvalidRequest, requestID(ctx.PostBody(), s.cfg.MaxJSONDepth),
			"Bad Request: more than one Mcp-Session-Id header")
		return
	}
	switch {
	case ctx.IsPost():
		s.servePost(ctx)
	case ctx.IsGet():
		s.serveGet(ctx)
	case ctx.IsDelete():
		s.serveDelete(ctx)
	default:
		ctx.Response.Header.Set("Allow", "GET, POST, DELETE")
		writeError(ctx, fasthttp.StatusMethodNotAllowed, codeInvalidRequest, "null", "Method Not Allowed")
	}
}

func (s *Server) servePost(ctx *fasthttp.RequestCtx) {
	body := ctx.PostBody()
	if !hasMediaType(ctx.Request.Header.ContentType(), mimeJSON) {
		writeError(ctx, fasthttp.StatusUnsupportedMediaType, codeInvalidRequest, requestID(body, s.cfg.MaxJSONDepth),
			"Unsupported Media Type: Content-Type must be application/json")
		return
	}
	if !jsonDepthOK(body, s.cfg.MaxJSONDepth) {
		// Checked first: gjson's validator recurses once per level.
		writeError(ctx, fasthttp.StatusBadRequest, codeInvalidRequest, "null",
			"Invalid Request: JSON nested deeper than "+strconv.Itoa(s.cfg.MaxJSONDepth)+" levels (max_json_depth)")
		return
	}
	if !gjson.ValidBytes(body) {
		writeError(ctx, fasthttp.StatusBadRequest, codeParseError, "null", "Parse error: body is not valid JSON")
		return
	}
	msg := parseMessage(body)
	if msg.dup {
		writeError(ctx, fasthttp.StatusBadRequest, codeInvalidRequest, "null",
			"Invalid Request: a member (method, id, params or params.name) appears twice")
		return
	}
	sid := ctx.Request.Header.PeekBytes(hdrSessionID)
	if len(sid) == 0 {
		switch {
		case msg.method == "initialize" && len(body) > s.cfg.MaxInitBody:
			// A recipe is kept for the session's life: agents' are < 2 KiB.
			writeError(ctx, fasthttp.StatusRequestEntityTooLarge, codeInvalidRequest, msg.idOrNull(),
				"initialize body larger than "+strconv.Itoa(s.cfg.MaxInitBody)+" bytes (max_init_body)")
		case msg.method == "initialize" && !isStatelessEra(ctx, &msg) && s.bridged():
			s.bridgeInitialize(ctx, &msg)
		case msg.method == "initialize":
			s.initialize(ctx, &msg)
		case isStatelessEra(ctx, &msg):
			s.forward(ctx, nil, msg)
		default:
			writeError(ctx, fasthttp.StatusBadRequest, codeInvalidRequest, msg.idOrNull(),
				"Bad Request: Mcp-Session-Id header is required")
		}
		return
	}
	sess, ok := s.lookup(ctx, sid)
	if !ok {
		s.sessionNotFound(ctx, msg.idOrNull())
		return
	}
	if !isStatelessEra(ctx, &msg) && s.bridged() {
		s.bridgePost(ctx, sess, msg)
		return
	}
	if msg.method == "" && msg.id != "" && !msg.batch {
		// The agent's answer to a server→client request: it goes to the
		// upstream session that asked, or nowhere if that one is gone.
		_, gen := sess.Current()
		if answerGen(msg.id) > gen {
			// Asked by a generation another process healed into.
			gen = s.follow(sess)
		}
		restored, live := answerRoute(body, msg.id, gen)
		if !live {
			ctx.SetStatusCode(fasthttp.StatusAccepted)
			return
		}
		if restored != nil {
			msg.id = strings.Clone(msg.id) // a view into the body being replaced
			ctx.Request.SetBody(restored)
		}
	}
	s.forward(ctx, sess, msg)
}

func (s *Server) serveGet(ctx *fasthttp.RequestCtx) {
	if !bytes.Contains(ctx.Request.Header.PeekBytes(hdrAccept), mimeEventStream) {
		writeError(ctx, fasthttp.StatusNotAcceptable, codeInvalidRequest, "null",
			"Not Acceptable: GET requires Accept: text/event-stream")
		return
	}
	sid := ctx.Request.Header.PeekBytes(hdrSessionID)
	if len(sid) == 0 {
		if isStatelessEra(ctx, &message{}) {
			s.forward(ctx, nil, message{get: true})
			return
		}
		writeError(ctx, fasthttp.StatusBadRequest, codeInvalidRequest, "null",
			"Bad Request: Mcp-Session-Id header is required")
		return
	}
	sess, ok := s.lookup(ctx, sid)
	if !ok || !s.sameBinding(ctx, sess) {
		s.sessionNotFound(ctx, "null")
		return
	}
	if !isStatelessEra(ctx, &message{}) && s.bridged() {
		s.bridgeListen(ctx, sess)
		return
	}
	s.serveStream(ctx, sess)
}

// serveDelete ends the agent's session: the upstream session is DELETEd with
// whatever answer (200, 202, 204, 404, 405 are all fine) and the mapping is
// dropped. The agent always gets 200: its session is over either way.
func (s *Server) serveDelete(ctx *fasthttp.RequestCtx) {
	sid := ctx.Request.Header.PeekBytes(hdrSessionID)
	if len(sid) == 0 {
		writeError(ctx, fasthttp.StatusBadRequest, codeInvalidRequest, "null",
			"Bad Request: Mcp-Session-Id header is required")
		return
	}
	sess, ok := s.lookup(ctx, sid)
	if !ok || !s.sameBinding(ctx, sess) {
		s.sessionNotFound(ctx, "null")
		return
	}
	// Buried first: a request restoring the id meanwhile finds it ended.
	s.graves.bury(string(sess.ID), s.cfg.SessionMaxAge)
	if _, ok = s.store.Remove(sess.ID); !ok {
		s.sessionNotFound(ctx, "null") // ended meanwhile
		return
	}
	s.release(sess)
	s.streams.stop(sess.ID)
	s.ended(sess.ID) // in every other process of the fleet
	// The upstream session ends before the agent hears that its session
	// did: a request racing on another replica then meets a dead one.
	if up, _ := sess.Current(); up != "" {
		if err := s.deleteNow(up, ctx.Request.Header.PeekBytes(hdrAuthorization), time.Now().Add(2*time.Second)); err != nil {
			s.log.Debug().Str(logUpstreamID, up.Short()).Err(err).Msg("upstream DELETE failed")
		}
	}
	ctx.SetStatusCode(fasthttp.StatusOK)
}

// sameBinding reports whether the request carries the credential the
// session is bound to. A GET or a DELETE under another credential (or
// none) is answered as for an unknown session: it must neither end the
// session nor take its stream, and learns nothing of it (README
// "Security").
func (s *Server) sameBinding(ctx *fasthttp.RequestCtx, sess *session.Session) bool {
	return sameCredential(sess, s.fingerprint(ctx.Request.Header.PeekBytes(hdrAuthorization)))
}

// lookup finds the client session named by the agent's header.
func (s *Server) lookup(ctx *fasthttp.RequestCtx, sid []byte) (*session.Session, bool) {
	// The key is only read during Get, so a zero-copy view is safe.
	if sess, ok := s.store.Get(session.ClientID(b2s(sid))); ok {
		return sess, true
	}
	return s.restore(ctx, sid)
}

// sessionNotFound is MCP's answer to an unknown session id (2025-03-26+
// §Session Management: 404; the agent then starts over with initialize).
func (s *Server) sessionNotFound(ctx *fasthttp.RequestCtx, id string) {
	writeError(ctx, fasthttp.StatusNotFound, codeSessionNotFound, id, "Session not found")
}

// isStatelessEra reports traffic of MCP 2026-07-28 or later, which has no
// sessions: a server/discover probe or an explicit new protocol version.
func isStatelessEra(ctx *fasthttp.RequestCtx, m *message) bool {
	if m.method == "server/discover" {
		return true
	}
	v := ctx.Request.Header.PeekBytes(hdrProtocolVersion)
	return len(v) == len(statelessVersion) && b2s(v) >= statelessVersion
}

// hasMediaType reports whether a Content-Type value names mt (parameters
// such as charset allowed).
func hasMediaType(ct, mt []byte) bool {
	if len(ct) < len(mt) || !bytes.EqualFold(ct[:len(mt)], mt) {
		return false
	}
	return len(ct) == len(mt) || ct[len(mt)] == ';' || ct[len(mt)] == ' '
}
