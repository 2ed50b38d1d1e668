package proxy

import (
	"bytes"
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
		// The upstream's session id never reaches the agent (idBit).
		"Mcp-Session-Id",
	}
	// reqDropWithAuth is reqDropHeaders when mcpheal supplies the
	// upstream credential itself: the agent's Authorization stays behind.
	reqDropWithAuth = append(append([]string(nil), reqDropHeaders...), "Authorization")
)

// requestDrops returns the names of the agent's fields that never go
// upstream.
func (s *Server) requestDrops() []string {
	if s.ownsAuthorization() {
		return reqDropWithAuth
	}
	return reqDropHeaders
}

// copyRequest builds the upstream request from the agent's. The body is
// shared with ctx, which outlives every upstream exchange of this request.
func (s *Server) copyRequest(ctx *fasthttp.RequestCtx, req *fasthttp.Request) {
	ctx.Request.Header.CopyTo(&req.Header)
	stripRequestHeader(&req.Header, s.requestDrops())
	s.setOperatorHeaders(&req.Header)
	req.SetBodyRaw(ctx.PostBody())
}

// stripRequestHeader deletes the fields named in names from h, a copy of
// an agent's request header as parsed, and keeps the order of those that
// stay (the order of the fields of one name is part of their meaning).
//
// fasthttp's Del moves the last field into the gap it leaves, and copies
// and normalizes its name and scans every field first. So h's raw block
// (the fields as received) is scanned once, and Del runs only for the
// names present (agents send Accept-Encoding, now and then a Keep-Alive);
// if some field name that stays appears more than once, the fields are
// written again in the order received instead. A header that was not
// parsed from the wire (RequestCtx.Init) has no raw block: each name is
// deleted.
func stripRequestHeader(h *fasthttp.RequestHeader, names []string) {
	h.ResetConnectionClose()
	raw := h.RawHeaders()
	if len(raw) == 0 {
		for _, n := range names {
			h.Del(n)
		}
		return
	}
	found, repeated := rawHeaderNames(raw, names)
	switch {
	case found == 0:
	case !repeated:
		for i, n := range names {
			if found&(1<<i) != 0 {
				h.Del(n)
			}
		}
	default:
		// Every field fasthttp keeps in its list goes, then those that
		// stay come back in the order received. Cookie stays in place
		// (adding it would parse it), and the fields fasthttp keeps
		// apart (Host, Content-Type, ...) are not in the list.
		for k := range h.AllInOrder() {
			if !requestFieldApart(k) {
				h.DelBytes(k)
			}
		}
		for k, v := range h.AllInOrder() {
			if !requestFieldApart(k) && found&nameBits(k, names) == 0 {
				h.AddBytesKV(k, v)
			}
		}
	}
}

// requestFieldApart reports whether fasthttp keeps a request field with
// this name out of its list of fields (or, for Cookie, should be left
// where it is).
func requestFieldApart(k []byte) bool {
	return nameBits(k, requestApart) != 0
}

var requestApart = []string{"Host", "Content-Type", "Content-Length", "User-Agent", "Cookie"}

// maxNames is how many distinct field names rawHeaderNames and
// stripResponseHeader tell apart when they look for repeats; past it they
// assume one.
const maxNames = 32

// rawHeaderNames returns a bit (1<<i) for each names[i] that names a field
// line of raw, a header block as received (case-insensitive, as HTTP field
// names are; len(names) is at most 32), and whether a field name not in
// names appears more than once.
func rawHeaderNames(raw []byte, names []string) (found uint32, repeated bool) {
	var seen [maxNames][]byte
	n := 0
	for len(raw) > 0 {
		line := raw
		if i := bytes.IndexByte(raw, '\n'); i >= 0 {
			line, raw = raw[:i], raw[i+1:]
		} else {
			raw = nil
		}
		colon := bytes.IndexByte(line, ':')
		if colon <= 0 || line[0] == ' ' || line[0] == '\t' {
			continue // no field line (or an obsolete folded continuation)
		}
		name := line[:colon]
		if bit := nameBits(name, names); bit != 0 {
			found |= bit
			continue
		}
		repeated = repeated || seenName(seen[:n], name) || n == maxNames
		if n < maxNames {
			seen[n], n = name, n+1
		}
	}
	return found, repeated
}

// seenName reports whether name is among seen (case-insensitive).
func seenName(seen [][]byte, name []byte) bool {
	for _, s := range seen {
		if len(s) == len(name) && bytes.EqualFold(s, name) {
			return true
		}
	}
	return false
}

// nameBits returns 1<<i if name is names[i] (case-insensitive), else 0.
func nameBits(name []byte, names []string) uint32 {
	for i, n := range names {
		if len(name) == len(n) && strings.EqualFold(b2s(name), n) {
			return 1 << i
		}
	}
	return 0
}

// stripResponseHeader deletes the hop-by-hop fields and the upstream's
// session ids from h, a copy of src (an upstream answer's head), keeping
// the order of the fields that stay; with keepOneID, a sole Mcp-Session-Id
// stays for its caller to overwrite in place. It reports how many
// Mcp-Session-Id fields src has. As in stripRequestHeader, one pass finds
// the names, Del runs only for those present (Node's server sends
// Keep-Alive), and if a field name that stays appears more than once the
// fields are written again in src's order.
func stripResponseHeader(src, h *fasthttp.ResponseHeader, keepOneID bool) (sessionIDs int) {
	h.ResetConnectionClose()
	var found uint32
	var seen [maxNames][]byte
	n, repeated := 0, false
	for k := range src.All() {
		if bit := nameBits(k, respDropHeaders); bit != 0 {
			found |= bit
			if bit == idBit {
				sessionIDs++
			}
			continue
		}
		if len(k) == len(strSetCookie) && bytes.EqualFold(k, strSetCookie) {
			continue // fasthttp keeps these apart, in order
		}
		repeated = repeated || seenName(seen[:n], k) || n == maxNames
		if n < maxNames {
			seen[n], n = k, n+1
		}
	}
	if keepOneID && sessionIDs == 1 {
		found &^= idBit
	}
	switch {
	case found == 0:
	case !repeated:
		for i, name := range respDropHeaders {
			if found&(1<<i) != 0 {
				h.Del(name)
			}
		}
	default:
		for k := range src.All() {
			if nameBits(k, responseApart) == 0 {
				h.DelBytes(k)
			}
		}
		for k, v := range src.All() {
			if nameBits(k, responseApart) == 0 && found&nameBits(k, respDropHeaders) == 0 {
				h.AddBytesKV(k, v)
			}
		}
	}
	return sessionIDs
}

// responseApart names the response fields fasthttp keeps out of its list
// of fields, or manages itself.
var responseApart = []string{"Content-Type", "Content-Length", "Content-Encoding", "Server", "Set-Cookie", "Date"}

var strSetCookie = []byte("Set-Cookie")

// idBit is Mcp-Session-Id's bit among respDropHeaders.
var idBit = nameBits(hdrSessionID, respDropHeaders)

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
