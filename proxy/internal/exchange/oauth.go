package exchange

import (
	"regexp"
	"strings"
	"sync/atomic"

	"github.com/valyala/fasthttp"

	"github.com/mcpheal/mcpheal/proxy/internal/link"
)

// An agent's own OAuth login through mcpheal (docs/oauth.md "OAuth"). An agent
// that meets a 401 follows the server's WWW-Authenticate to its protected
// resource metadata (RFC 9728) and checks that the metadata's resource is
// the URL it connected to (RFC 9728 §3.3, the MCP authorization spec):
// mcpheal's, not the server's. So mcpheal presents itself as the protected
// resource: the challenge's resource_metadata points at mcpheal's own
// well-known URL (which forwards to the server's, Router.wellKnown), and
// the metadata's resource names mcpheal's URL. The authorization server is
// the server's own, reached directly. The token the agent then gets names
// mcpheal's URL as its resource (RFC 8707): a server that checks its tokens'
// audience against its own URL refuses it, and such a server needs
// mcpheal's own credential (credentials) instead.

// PrmPath is where RFC 9728 §3.1 puts a resource's metadata: this segment,
// then the resource's path.
const PrmPath = "/.well-known/oauth-protected-resource"

// OwnOrigin is mcpheal's origin as the agent that sent h reached it:
// https when a TLS terminator in front says so (X-Forwarded-Proto), the
// agent's own Host.
func OwnOrigin(h *fasthttp.RequestHeader) string {
	scheme := "http://"
	if strings.EqualFold(string(h.Peek("X-Forwarded-Proto")), "https") {
		scheme = "https://"
	}
	return scheme + string(h.Host())
}

// resourceMetadata matches the resource_metadata parameter of a
// WWW-Authenticate challenge (RFC 9728 §5.1), its URL in group 1.
var resourceMetadata = regexp.MustCompile(`(?i)\bresource_metadata="([^"]*)"`)

// Challenges rewrites the upstream's WWW-Authenticate challenges for the
// agent (see above), and remembers where the upstream keeps its protected
// resource metadata, for the well-known route.
type Challenges struct {
	Link *link.Link
	Path string // Config.Path: mcpheal's MCP endpoint for this upstream
	// prm is the path of the upstream's protected resource metadata its
	// last challenge named; nil: the RFC 9728 default.
	Prm atomic.Pointer[string]
}

// Own rewrites the upstream's challenge for the agent: a
// resource_metadata on the upstream's origin becomes mcpheal's well-known
// URL for this upstream. Any other challenge is returned as it is.
func (s *Challenges) Own(h *fasthttp.RequestHeader, challenge []byte) []byte {
	m := resourceMetadata.FindSubmatchIndex(challenge)
	if m == nil {
		return challenge
	}
	u := string(challenge[m[2]:m[3]])
	path, ok := strings.CutPrefix(u, s.Link.Up.Origin())
	if !ok || !strings.HasPrefix(path, "/") {
		return challenge // another host's metadata: the agent reads it there
	}
	if cur := s.Prm.Load(); cur == nil || *cur != path {
		s.Prm.Store(&path) // where Server.wellKnown fetches it, wherever the server keeps it
	}
	origin := OwnOrigin(h)
	out := make([]byte, 0, len(challenge)+len(origin)+len(PrmPath)+len(s.Path))
	out = append(out, challenge[:m[2]]...)
	out = append(out, origin+PrmPath+s.Path...)
	return append(out, challenge[m[3]:]...)
}

// Pass gives the agent the upstream's challenge (in h), as mcpheal's
// (own), unless mcpheal owns the upstream's credential: the agent then has
// nothing to log in to.
func (s *Challenges) Pass(ctx *fasthttp.RequestCtx, h *fasthttp.ResponseHeader) {
	if c := h.Peek("WWW-Authenticate"); len(c) > 0 && !s.Link.OwnsAuthorization() {
		ctx.Response.Header.SetBytesV("WWW-Authenticate", s.Own(&ctx.Request.Header, c))
	}
}
