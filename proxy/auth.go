package proxy

import (
	"context"
	"crypto/subtle"
	"strings"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/mcpheal/mcpheal/upstream"
)

// do sends one exchange upstream. When the proxy owns the upstream
// credential it sets it first, and a 401 makes it drop the token, fetch a
// new one and send once more (the upstream refused before dispatch, so this
// is safe for any request).
func (s *Server) do(req *fasthttp.Request, resp *upstream.Response, deadline time.Time) error {
	return s.exchange(req, resp, deadline, s.up.Do)
}

// doOnce is do for a request that is not safe to send twice: the upstream
// client never resends it (upstream.Client.DoOnce).
func (s *Server) doOnce(req *fasthttp.Request, resp *upstream.Response, deadline time.Time) error {
	return s.exchange(req, resp, deadline, s.up.DoOnce)
}

func (s *Server) exchange(req *fasthttp.Request, resp *upstream.Response, deadline time.Time,
	send func(*fasthttp.Request, *upstream.Response, time.Time) error) error {
	creds := s.cfg.Credentials
	if creds == nil {
		return send(req, resp, deadline)
	}
	for try := 0; ; try++ {
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		err := creds.Apply(ctx, &req.Header)
		cancel()
		if err != nil {
			return err
		}
		// A 401 is a refusal before dispatch: sending again under a new
		// token runs nothing twice.
		err = send(req, resp, deadline)
		if err != nil || resp.StatusCode() != fasthttp.StatusUnauthorized || try > 0 {
			return err
		}
		creds.Invalidate(string(req.Header.PeekBytes(hdrAuthorization)))
		s.log.Info().Msg("upstream refused the proxy's credential; fetching a new one")
		resp.Close()
		resp.Response.Reset()
	}
}

// inboundAllowed checks the agent's bearer token when the upstream requires
// inbound auth, answering 401 itself when it is missing or wrong.
func (s *Server) inboundAllowed(ctx *fasthttp.RequestCtx) bool {
	if len(s.cfg.AuthTokens) == 0 {
		return true
	}
	got := ctx.Request.Header.PeekBytes(hdrAuthorization)
	const scheme = "Bearer "
	if len(got) > len(scheme) && strings.EqualFold(b2s(got[:len(scheme)]), scheme) {
		tok := got[len(scheme):]
		ok := 0
		for _, want := range s.cfg.AuthTokens { // no early exit: constant time over the set
			ok |= subtle.ConstantTimeCompare(tok, []byte(want))
		}
		if ok == 1 {
			return true
		}
	}
	writeError(ctx, fasthttp.StatusUnauthorized, codeUnauthorized, requestID(ctx.PostBody(), s.cfg.MaxJSONDepth),
		"Unauthorized: a valid bearer token is required")
	ctx.Response.Header.Set("WWW-Authenticate", `Bearer realm="mcpheal"`)
	return false
}

// ownsAuthorization reports whether the agent's Authorization is the
// proxy's business (inbound auth, or a proxy-owned upstream credential) and
// must not be forwarded.
func (s *Server) ownsAuthorization() bool {
	return s.cfg.Credentials != nil || len(s.cfg.AuthTokens) > 0
}

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
	if err := s.up.DoPath(req, resp, path, time.Now().Add(10*time.Second)); err != nil {
		writeError(ctx, fasthttp.StatusBadGateway, codeUpstreamDown, "null", "upstream unreachable: "+s.up.Origin())
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
