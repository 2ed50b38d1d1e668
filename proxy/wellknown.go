package proxy

import (
	"time"

	"github.com/valyala/fasthttp"

	"github.com/mcpheal/mcpheal/upstream"
)

// wellKnown forwards OAuth discovery (RFC 9728 protected resource metadata,
// RFC 8414 authorization server metadata) to the upstream's origin, so that
// an agent whose credential passes through can find where to get one.
func (s *Server) wellKnown(ctx *fasthttp.RequestCtx, path string) {
	defer s.recoverPanic(ctx)
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	resp := upstream.AcquireResponse()
	defer upstream.ReleaseResponse(resp)
	req.Header.SetMethod(fasthttp.MethodGet)
	req.Header.Set("Accept", "application/json")
	if err := s.link.up.DoPath(req, resp, path, time.Now().Add(10*time.Second)); err != nil {
		writeError(ctx, fasthttp.StatusBadGateway, codeUpstreamDown, "null", "upstream unreachable: "+s.link.up.Origin())
		return
	}
	ctx.SetStatusCode(resp.StatusCode())
	ctx.Response.Header.SetContentTypeBytes(resp.Header.ContentType())
	if resp.IsStream() {
		ctx.SetStatusCode(fasthttp.StatusBadGateway)
		return
	}
	ctx.Response.SetBody(resp.Body())
}
