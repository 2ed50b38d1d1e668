package proxy

import (
	"strings"

	"github.com/valyala/fasthttp"

	"github.com/mcpheal/mcpheal/session"
)

func setSessionHeader(req *fasthttp.Request, up session.UpstreamID) {
	if up == "" {
		req.Header.DelBytes(hdrSessionID)
		return
	}
	req.Header.SetBytesK(hdrSessionID, string(up))
}

// Hop-by-hop headers (RFC 9110 §7.6.1) and headers the proxy owns.
var (
	reqDropHeaders = []string{
		"Connection", "Keep-Alive", "Proxy-Connection", "Proxy-Authorization", "TE", "Trailer",
		"Transfer-Encoding", "Upgrade",
		// fasthttp has answered the agent's Expect: 100-continue itself.
		"Expect",
		// Bodies must come back uncompressed so they can be classified.
		"Accept-Encoding",
		// The proxy has checked Origin against its own names; the upstream
		// would compare it with a Host it no longer sees.
		"Origin",
	}
	respDropHeaders = []string{
		"Connection", "Keep-Alive", "Proxy-Connection", "Proxy-Authenticate", "TE", "Trailer",
		"Transfer-Encoding", "Upgrade",
	}
)

// copyRequest builds the upstream request from the agent's. The body is
// shared with ctx, which outlives every upstream exchange of this request.
func (s *Server) copyRequest(ctx *fasthttp.RequestCtx, req *fasthttp.Request) {
	ctx.Request.Header.CopyTo(&req.Header)
	req.Header.ResetConnectionClose()
	for _, h := range reqDropHeaders {
		req.Header.Del(h)
	}
	if s.ownsAuthorization() {
		req.Header.DelBytes(hdrAuthorization)
	}
	s.setOperatorHeaders(&req.Header)
	req.SetBodyRaw(ctx.PostBody())
}

// setOperatorHeaders sets Config.Headers, replacing the agent's.
func (s *Server) setOperatorHeaders(h *fasthttp.RequestHeader) {
	for k, v := range s.cfg.Headers {
		h.Set(k, v)
	}
}

// headerValue returns the value of the named header in hdr, or "".
func headerValue(hdr [][2]string, name string) string {
	for _, kv := range hdr {
		if strings.EqualFold(kv[0], name) {
			return kv[1]
		}
	}
	return ""
}
