package proxy

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"

	"github.com/mcpheal/mcpheal/classify"
	"github.com/mcpheal/mcpheal/session"
	"github.com/mcpheal/mcpheal/upstream"
)

// initialize handles the agent's initialize: forward it, and on success
// record the recipe, mint the client id and answer with it. Until the session
// exists the request is replay-safe, so a down upstream costs latency within
// the heal budget, not an error.
func (s *Server) initialize(ctx *fasthttp.RequestCtx, m *message) {
	a := &attempt{s: s, ctx: ctx, msg: *m}
	a.req = fasthttp.AcquireRequest()
	a.resp = upstream.AcquireResponse()
	defer fasthttp.ReleaseRequest(a.req)
	defer upstream.ReleaseResponse(a.resp)
	s.copyRequest(ctx, a.req)
	a.req.Header.DelBytes(hdrSessionID)
	var raw, msg []byte
	er := eventRewriter{gen: 1} // event ids are the proxy's from the first answer on (README "Streams")
	for {
		if ok, wait := s.breaker.Allow(); !ok {
			a.answer(outcome{kind: outBreakerOpen, wait: wait})
			return
		}
		s.count.upstreamInits.Add(1)
		err := s.do(a.req, a.resp, time.Now().Add(s.cfg.ResponseTimeout))
		if err == nil {
			raw, msg, err = readAnswer(a.resp, &er, s.cfg.MaxAnswer)
		}
		var tl *upstream.TooLargeError
		if errors.As(err, &tl) || errors.Is(err, errAnswerTooLarge) {
			// The upstream answered, too large: the same again on a retry.
			s.dropMintedSession(a.resp)
			a.answer(outcome{kind: outTooLarge, class: classify.Protocol, err: err})
			return
		}
		if err != nil || a.resp.StatusCode() >= 500 {
			s.upFailure()
		} else {
			s.upSuccess()
		}
		if err == nil && a.resp.StatusCode() != fasthttp.StatusServiceUnavailable {
			break
		}
		s.dropMintedSession(a.resp) // a session the failed answer may have opened
		if !a.backoff() {
			a.endProbe()
			a.answer(outcome{kind: outDown, why: "upstream unreachable"})
			return
		}
		er = eventRewriter{gen: 1}
	}
	r := a.resp
	ctx.Response.Reset()
	r.Header.CopyTo(&ctx.Response.Header)
	stripResponseHeader(&r.Header, &ctx.Response.Header, false)
	ctx.Response.SetBody(raw) // JSON, or the SSE answer up to the response event
	version := initializedVersion(r.StatusCode(), msg)
	s.count.request(m, classify.Classify(r.StatusCode(), mimeJSON, msg))
	if version == "" {
		s.dropMintedSession(r) // a failed initialize: pass the answer through
		return
	}
	init := session.Intern(ctx.PostBody())
	recipe := session.Recipe{
		InitBody:        init.Value(),
		Interned:        init,
		ProtocolVersion: version,
		Credential:      s.fingerprint(ctx.Request.Header.PeekBytes(hdrAuthorization)).String(),
		Header:          recipeHeaders(&a.req.Header),
	}
	sess := session.New(s.sealID(ctx.Request.Header.PeekBytes(hdrAuthorization), version, ctx.PostBody()), recipe,
		session.UpstreamID(r.Header.PeekBytes(hdrSessionID)))
	if !s.mem.take(sessionCost(sess)) {
		s.dropMintedSession(r)
		s.log.Warn().Int64("budget", s.mem.limit).Int("sessions", s.store.Len()).Msg("initialize refused: memory budget")
		writeError(ctx, fasthttp.StatusServiceUnavailable, codeTooMany, m.idOrNull(),
			"Too many sessions: mcpheal's memory_budget for this upstream is reached; retry later")
		ctx.Response.Header.Set("Retry-After", "10")
		return
	}
	if err := s.store.Add(sess); err != nil {
		s.mem.give(sessionCost(sess))
		// Admission never evicts a session at work (session.Store.Add).
		s.dropMintedSession(r)
		s.log.Warn().Err(err).Int("sessions", s.store.Len()).Msg("initialize refused: session cap reached")
		if errors.Is(err, session.ErrCredentialFull) {
			writeError(ctx, fasthttp.StatusTooManyRequests, codeTooMany, m.idOrNull(),
				"Too many sessions for this credential (max_sessions_per_credential); retry later")
		} else {
			writeError(ctx, fasthttp.StatusServiceUnavailable, codeTooMany, m.idOrNull(),
				"Too many sessions: mcpheal's session cap (max_sessions) is reached; retry later")
		}
		ctx.Response.Header.Set("Retry-After", "10")
		return
	}
	s.index(sess)
	s.created(sess)
	ctx.Response.Header.SetBytesK(hdrSessionID, string(sess.ID))
	s.log.Debug().Str(logSession, sess.ID.Short()).Str("protocol", version).
		Bool("stateful", len(r.Header.PeekBytes(hdrSessionID)) > 0).Msg("session created")
}

// recipeHeaders copies the headers of the upstream initialize request that
// identify the agent (credentials, custom headers), leaving out what each
// request sets itself.
func recipeHeaders(h *fasthttp.RequestHeader) [][2]string {
	var out [][2]string
	for k, v := range h.All() {
		switch string(k) {
		case "Host", "Content-Length", "Content-Type", "Accept", "Mcp-Session-Id", "Mcp-Protocol-Version",
			"Last-Event-Id", "User-Agent":
			continue
		}
		out = append(out, [2]string{string(k), string(v)})
	}
	return out
}

// initializedVersion returns result.protocolVersion of a successful
// initialize answer (its JSON-RPC message), or "".
func initializedVersion(status int, msg []byte) string {
	if status/100 != 2 {
		return ""
	}
	v := gjson.GetBytes(msg, "result.protocolVersion")
	if v.Type != gjson.String {
		return ""
	}
	return v.Str
}

// initUpstream creates a new upstream session from a recipe: initialize
// (with a proxy-namespaced id and no session header), then
// notifications/initialized. Failures that delivered nothing or that the
// server called transient are returned for retry; a refusal of the recipe is
// errRecipeRefused.
func (s *Server) initUpstream(ctx context.Context, agent *fasthttp.RequestHeader, initBody string, version string) (session.UpstreamID, error) {
	deadline := deadlineOf(ctx, time.Now().Add(s.cfg.HealTimeout))
	s.count.upstreamInits.Add(1)
	rep, err := s.call(&upcall{hdr: agent, body: withID([]byte(initBody), s.upcallID("init")), deadline: deadline})
	if err != nil {
		return "", err
	}
	switch st := rep.status; {
	case st == fasthttp.StatusTooManyRequests || st == fasthttp.StatusRequestTimeout || st >= 500:
		return "", fmt.Errorf("initialize answered %d", st)
	case st/100 != 2:
		return "", fmt.Errorf("%w: status %d", errRecipeRefused, st)
	}
	if got := initializedVersion(rep.status, rep.msg); got != version {
		return "", fmt.Errorf("%w: protocol version %q, session has %q", errRecipeRefused, got, version)
	}
	// notifications/initialized (MCP lifecycle: the client MUST send it).
	// A notification does no harm twice, so a transport failure (a pooled
	// connection the upstream closed as it restarted) sends it again on a
	// checked connection: giving up would throw away the session the
	// initialize just made, and make another.
	note := upcall{hdr: agent, session: rep.session, version: version, body: initializedNote, deadline: deadline}
	for try := 1; ; try++ {
		if _, err = s.call(&note); err == nil {
			return rep.session, nil
		}
		if try == 3 || time.Now().After(deadline) {
			s.deleteUpstream(rep.session, agent.PeekBytes(hdrAuthorization), true)
			return "", fmt.Errorf("notifications/initialized: %w", err)
		}
		note.checked = true
	}
}

var initializedNote = []byte(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)

// withID returns a copy of the JSON object body with its top-level "id"
// replaced by id (raw JSON).
func withID(body []byte, id string) []byte {
	r := gjson.GetBytes(body, "id")
	if !r.Exists() || r.Index <= 0 {
		return append([]byte(nil), body...)
	}
	out := make([]byte, 0, len(body)+len(id))
	out = append(out, body[:r.Index]...)
	out = append(out, id...)
	return append(out, body[r.Index+len(r.Raw):]...)
}

// learnTools records which tools the upstream declares safe to run twice
// (readOnlyHint or idempotentHint, MCP 2025-03-26+ tool annotations) from a
// tools/list answer passing through: msg is its JSON-RPC message.
func learnTools(sess *session.Session, msg []byte) {
	d := msg
	if res := gjson.GetBytes(d, "result"); res.IsObject() && !gjson.Get(res.Raw, "nextCursor").Exists() {
		sess.SeeTools([]byte(res.Raw)) // the first page of a paged list is not the list
	}
	gjson.GetBytes(d, "result.tools").ForEach(func(_, t gjson.Result) bool {
		name := t.Get("name").String()
		if name != "" {
			ann := t.Get("annotations")
			sess.SetReplayable(name, ann.Get("readOnlyHint").Bool() || ann.Get("idempotentHint").Bool())
		}
		return true
	})
}
