package proxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"

	"github.com/mcpheal/mcpheal/proxy/internal/exchange"
	"github.com/mcpheal/mcpheal/proxy/internal/wire"
	"github.com/mcpheal/mcpheal/upstream"
)

// ownMetadata rewrites the upstream's protected resource metadata for the
// agent: a resource on the upstream's origin moves to mcpheal's, the
// upstream's URL becoming mcpheal's URL of this upstream and any other path
// kept (the metadata at the origin's root names the origin). A body that
// is not such a JSON object is returned as it is.
func (s *Server) ownMetadata(h *fasthttp.RequestHeader, body []byte) []byte {
	r := gjson.GetBytes(body, "resource")
	if r.Type != gjson.String || r.Index <= 0 {
		return body
	}
	rest, ok := strings.CutPrefix(r.Str, s.link.Up.Origin())
	if !ok || rest != "" && rest[0] != '/' {
		return body // another resource: nothing of mcpheal's
	}
	own := exchange.OwnOrigin(h) + rest
	if rest == s.link.Up.Path() {
		own = exchange.OwnOrigin(h) + s.cfg.Path // the upstream's URL: mcpheal's of it
	}
	v, _ := json.Marshal(own)
	var b bytes.Buffer
	b.Grow(len(body) + len(v))
	b.Write(body[:r.Index])
	b.Write(v)
	b.Write(body[r.Index+len(r.Raw):])
	return b.Bytes()
}

// maxMetadata caps an OAuth metadata document mcpheal forwards: they are a
// few KiB, and a larger one is held, with its rewritten copy, until the
// agent has read it.
const maxMetadata = 64 << 10

// wellKnown forwards OAuth discovery (RFC 9728 protected resource metadata,
// RFC 8414 authorization server metadata) to the upstream's origin, so that
// an agent whose credential passes through can find where to get one. It
// is a route like the MCP endpoint's: the guard's Host and Origin check
// first (its document names mcpheal's URL as the agent reached it), and
// the document, at most maxMetadata, is counted in the memory budget
// while it is read and until the agent has it. An upstream whose
// credential is mcpheal's (its own, or inbound auth's) has nothing for an
// agent to log in to: 404.
func (s *Server) wellKnown(ctx *fasthttp.RequestCtx, path string) {
	defer s.recoverPanic(ctx, nil)
	switch {
	case !s.guard.hosts.allow(ctx):
		wire.WriteError(ctx, fasthttp.StatusForbidden, wire.CodeForbidden, "null", "Forbidden: Host or Origin not allowed")
		return
	case s.link.OwnsAuthorization():
		ctx.Error("not found: mcpheal holds this upstream's credential; there is nothing to log in to\n", fasthttp.StatusNotFound)
		return
	}
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	resp := upstream.AcquireResponse()
	defer upstream.ReleaseResponse(resp)
	resp.SetBudget(&s.mem)
	resp.SetMaxBody(maxMetadata)
	req.Header.SetMethod(fasthttp.MethodGet)
	req.Header.Set("Accept", "application/json")
	isPRM := strings.HasPrefix(path, exchange.PrmPath)
	if p := s.challenges.Prm.Load(); p != nil && path == exchange.PrmPath+s.link.Up.Path() {
		path = *p // the server named another location in its challenge
	}
	var tl *upstream.TooLargeError
	switch err := s.link.Up.DoPath(req, resp, path, time.Now().Add(10*time.Second)); {
	case errors.As(err, &tl):
		wire.WriteError(ctx, fasthttp.StatusBadGateway, wire.CodeTooLarge, "null", "the upstream's OAuth metadata is larger than "+
			strconv.Itoa(maxMetadata)+" bytes")
		return
	case errors.Is(err, upstream.ErrOverBudget):
		wire.WriteError(ctx, fasthttp.StatusServiceUnavailable, wire.CodeBudget, "null", "mcpheal's memory_budget is reached; retry later")
		ctx.Response.Header.Set("Retry-After", "1")
		return
	case err != nil:
		wire.WriteError(ctx, fasthttp.StatusBadGateway, wire.CodeUpstreamDown, "null", "upstream unreachable: "+s.link.Up.Origin())
		return
	}
	if resp.IsStream() {
		ctx.SetStatusCode(fasthttp.StatusBadGateway)
		return
	}
	body := resp.Body()
	if isPRM && resp.StatusCode() == fasthttp.StatusOK {
		body = s.ownMetadata(&ctx.Request.Header, body) // mcpheal is the resource the agent reached (oauth.go)
	}
	if !s.mem.Take(int64(len(body))) {
		wire.WriteError(ctx, fasthttp.StatusServiceUnavailable, wire.CodeBudget, "null", "mcpheal's memory_budget is reached; retry later")
		ctx.Response.Header.Set("Retry-After", "1")
		return
	}
	ctx.SetStatusCode(resp.StatusCode())
	ctx.Response.Header.SetContentTypeBytes(resp.Header.ContentType())
	// A copy, counted until the agent has read it: resp goes back now.
	b := append([]byte(nil), body...)
	ctx.Response.SetBodyStream(&exchange.BudgetBody{B: b, Mem: &s.mem, N: int64(len(b))}, len(b))
}
