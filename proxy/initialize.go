package proxy

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
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
func (s *Server) initialize(ctx *fasthttp.RequestCtx, msg *message) {
	a := &attempt{s: s, ctx: ctx, msg: *msg}
	a.req = fasthttp.AcquireRequest()
	a.resp = upstream.AcquireResponse()
	defer fasthttp.ReleaseRequest(a.req)
	defer upstream.ReleaseResponse(a.resp)
	s.copyRequest(ctx, a.req)
	a.req.Header.DelBytes(hdrSessionID)
	var body []byte
	for {
		if !a.allowed() {
			return
		}
		s.count.upstreamInits.Add(1)
		err := s.do(a.req, a.resp, time.Now().Add(s.cfg.ResponseTimeout))
		if err == nil {
			body, err = readAnswer(a.resp)
		}
		if err != nil || a.resp.StatusCode() >= 500 {
			s.upFailure()
		} else {
			s.upSuccess()
		}
		if err == nil && a.resp.StatusCode() != fasthttp.StatusServiceUnavailable {
			break
		}
		if !a.backoff() {
			a.upstreamDown("upstream unreachable")
			return
		}
	}
	r := a.resp
	ctx.Response.Reset()
	r.Header.CopyTo(&ctx.Response.Header)
	ctx.Response.Header.ResetConnectionClose()
	for _, h := range respDropHeaders {
		ctx.Response.Header.Del(h)
	}
	ctx.Response.Header.DelBytes(hdrSessionID)
	if hasMediaType(r.Header.ContentType(), mimeEventStream) {
		// Event ids are the proxy's from the first answer on (DESIGN
		// "Streams"): the session starts in generation 1.
		er := eventRewriter{gen: 1}
		body = append(er.feed(nil, body), er.pending...)
	}
	ctx.Response.SetBody(body) // JSON, or the SSE answer up to the response event
	version := initializedVersion(r.StatusCode(), body)
	s.count.request(msg, classify.Classify(r.StatusCode(), r.Header.ContentType(), body))
	if version == "" {
		s.dropMintedSession(r) // a failed initialize: pass the answer through
		return
	}
	recipe := session.Recipe{
		InitBody:        append([]byte(nil), ctx.PostBody()...),
		ProtocolVersion: version,
		Credential:      s.fingerprint(ctx.Request.Header.PeekBytes(hdrAuthorization)).String(),
		Header:          recipeHeaders(&a.req.Header),
	}
	sess := session.New(session.NewClientID(), recipe,
		session.UpstreamID(r.Header.PeekBytes(hdrSessionID)))
	if !s.admit(recipe.Credential) {
		s.dropMintedSession(r)
		writeError(ctx, fasthttp.StatusTooManyRequests, codeTooMany, msg.idOrNull(),
			"Too many sessions for this credential")
		return
	}
	s.store.Add(sess)
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

// readAnswer returns the JSON-RPC answer of a response: its body, or for an
// SSE answer everything up to and including the event carrying the response
// (the stream is then closed). The data is valid until r is reset.
func readAnswer(r *upstream.Response) ([]byte, error) {
	if !r.IsStream() {
		return r.Body(), nil
	}
	var buf []byte
	for {
		if findResponse(buf) != nil {
			break
		}
		if len(buf) > peekLimit {
			return nil, errPeekTooLarge
		}
		n := len(buf)
		buf = append(buf, make([]byte, 4096)...)
		m, err := r.Read(buf[n:])
		buf = buf[:n+m]
		if err != nil {
			if findResponse(buf) != nil {
				break
			}
			return nil, fmt.Errorf("initialize stream ended without a response: %w", err)
		}
	}
	r.Close()
	r.SetBodyRaw(buf)
	return buf, nil
}

// initializedVersion returns result.protocolVersion of a successful
// initialize answer, or "".
func initializedVersion(status int, body []byte) string {
	if status/100 != 2 {
		return ""
	}
	d := body
	if len(d) > 0 && d[0] != '{' {
		d = findResponse(body)
	}
	v := gjson.GetBytes(d, "result.protocolVersion")
	if v.Type != gjson.String {
		return ""
	}
	return v.Str
}

var initSeq atomic.Uint64

// initUpstream creates a new upstream session from a recipe: initialize
// (with a proxy-namespaced id and no session header), then
// notifications/initialized. Failures that delivered nothing or that the
// server called transient are returned for retry; a refusal of the recipe is
// errRecipeRefused.
func (s *Server) initUpstream(ctx context.Context, agent *fasthttp.RequestHeader, initBody []byte, version string) (session.UpstreamID, error) {
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(s.cfg.HealTimeout)
	}
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	resp := upstream.AcquireResponse()
	defer upstream.ReleaseResponse(resp)
	agent.CopyTo(&req.Header)
	s.setOperatorHeaders(&req.Header)
	req.Header.ResetConnectionClose()
	for _, h := range reqDropHeaders {
		req.Header.Del(h)
	}
	req.Header.DelBytes(hdrSessionID)
	req.Header.DelBytes(hdrLastEventID)
	req.Header.DelBytes(hdrProtocolVersion)
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.SetContentTypeBytes(mimeJSON)
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.SetBody(withID(initBody, `"mcpheal-init-`+strconv.FormatUint(initSeq.Add(1), 10)+`"`))

	s.count.upstreamInits.Add(1)
	if err := s.do(req, resp, deadline); err != nil {
		return "", err
	}
	body, err := readAnswer(resp)
	if err != nil {
		return "", err
	}
	switch st := resp.StatusCode(); {
	case st == fasthttp.StatusTooManyRequests || st == fasthttp.StatusRequestTimeout || st >= 500:
		return "", fmt.Errorf("initialize answered %d", st)
	case st/100 != 2:
		return "", fmt.Errorf("%w: status %d", errRecipeRefused, st)
	}
	if got := initializedVersion(resp.StatusCode(), body); got != version {
		return "", fmt.Errorf("%w: protocol version %q, session has %q", errRecipeRefused, got, version)
	}
	up := session.UpstreamID(resp.Header.PeekBytes(hdrSessionID))

	// notifications/initialized (MCP lifecycle: the client MUST send it).
	resp.Close()
	resp.Response.Reset()
	req.Header.Del("Accept")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if up != "" {
		req.Header.SetBytesK(hdrSessionID, string(up))
	}
	req.Header.SetBytesK(hdrProtocolVersion, version)
	req.SetBodyString(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	if err := s.do(req, resp, deadline); err != nil {
		return "", fmt.Errorf("notifications/initialized: %w", err)
	}
	return up, nil
}

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
// tools/list answer passing through.
func learnTools(sess *session.Session, r *upstream.Response, peek []byte) {
	var d []byte
	if r.IsStream() {
		d = findResponse(peek) // never Body(): it would drain the stream
	} else {
		d = r.Body()
	}
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
