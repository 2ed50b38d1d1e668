package proxy

import (
	"bytes"
	"crypto/subtle"
	"net"
	"net/url"
	"strconv"
	"strings"

	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"

	"github.com/mcpheal/mcpheal/session"
)

// guard is the first stage of every agent request, whatever its route
// (docs/security.md "Security"): nothing reaches a route before it ran, and each of
// its checks lives here and nowhere else. In order: body size, Host and
// Origin (DNS rebinding), inbound auth, the HTTP method and media types,
// JSON depth and validity, ambiguous members, the session (known, not past
// its maximum age, not ended) and the credential it is bound to, and the
// memory a request would add to its session's journal. Admission of new
// sessions under the store's caps and the memory budget is sessions.admit,
// which every route that creates a session calls.
type guard struct {
	cfg      *Config
	hosts    hostGuard
	mem      *budget
	link     *link
	sessions *sessions
	eras     *eraState
	held     *held
}

// check runs every check on one agent request and fills r, or answers the
// refusal itself and reports false.
func (g *guard) check(ctx *fasthttp.RequestCtx, r *request) bool {
	body := ctx.PostBody()
	h := &ctx.Request.Header
	switch {
	case len(body) > g.cfg.MaxBody:
		tooLarge(ctx, g.cfg.MaxBody)
		return false
	case !g.hosts.allow(ctx):
		writeError(ctx, fasthttp.StatusForbidden, codeForbidden, requestID(body, g.cfg.MaxJSONDepth),
			"Forbidden: Host or Origin not allowed")
		return false
	case !g.inbound(ctx):
		return false
	case len(h.PeekAll(string(hdrSessionID))) > 1:
		// Which one would the upstream read? Neither is forwarded.
		writeError(ctx, fasthttp.StatusBadRequest, codeInvalidRequest, requestID(body, g.cfg.MaxJSONDepth),
			"Bad Request: more than one Mcp-Session-Id header")
		return false
	}
	r.hdr, r.body, r.auth = h, body, h.PeekBytes(hdrAuthorization)
	switch {
	case ctx.IsPost():
		if !g.message(ctx, r) {
			return false
		}
	case ctx.IsGet():
		if !bytes.Contains(h.PeekBytes(hdrAccept), mimeEventStream) {
			writeError(ctx, fasthttp.StatusNotAcceptable, codeInvalidRequest, "null",
				"Not Acceptable: GET requires Accept: text/event-stream")
			return false
		}
		r.msg.get = true
	case ctx.IsDelete():
		r.del = true
	default:
		ctx.Response.Header.Set("Allow", "GET, POST, DELETE")
		writeError(ctx, fasthttp.StatusMethodNotAllowed, codeInvalidRequest, "null", "Method Not Allowed")
		return false
	}
	r.stateless = isStatelessEra(h, &r.msg)
	if sid := h.PeekBytes(hdrSessionID); len(sid) > 0 {
		return g.session(ctx, r, sid)
	}
	if !r.stateless && r.msg.method != "initialize" && bytes.Contains(body, metaVersionName) {
		// No session, and the body says 2026-07-28's way what version it
		// speaks, whatever its header says: the 2026-07-28 server judges
		// it (the held route: refuse2026; else the upstream).
		r.stateless = true
	}
	switch {
	case r.msg.method == "initialize" && len(body) > g.cfg.MaxInitBody:
		// A recipe is kept for the session's life: agents' are < 2 KiB.
		writeError(ctx, fasthttp.StatusRequestEntityTooLarge, codeInvalidRequest, r.msg.idOrNull(),
			"initialize body larger than "+strconv.Itoa(g.cfg.MaxInitBody)+" bytes (max_init_body)")
		return false
	case r.stateless && !r.del && g.eras.heldRoute(r.auth):
		// No session id: the session mcpheal holds for the agent's
		// credential and client, if there is one yet (held.go).
		r.onHeldRoute = true
		r.sess = g.held.lookup(heldKeyOf(r.auth, body))
		return true
	case r.msg.method == "initialize" || (r.stateless && !r.del):
		return true
	}
	writeError(ctx, fasthttp.StatusBadRequest, codeInvalidRequest, r.msg.idOrNull(),
		"Bad Request: Mcp-Session-Id header is required")
	return false
}

// message checks a POST's body and reads the JSON-RPC members mcpheal
// routes on.
func (g *guard) message(ctx *fasthttp.RequestCtx, r *request) bool {
	body := r.body
	switch {
	case !hasMediaType(r.hdr.ContentType(), mimeJSON):
		writeError(ctx, fasthttp.StatusUnsupportedMediaType, codeInvalidRequest, requestID(body, g.cfg.MaxJSONDepth),
			"Unsupported Media Type: Content-Type must be application/json")
		return false
	case !jsonDepthOK(body, g.cfg.MaxJSONDepth):
		// Checked first: gjson's validator recurses once per level.
		writeError(ctx, fasthttp.StatusBadRequest, codeInvalidRequest, "null",
			"Invalid Request: JSON nested deeper than "+strconv.Itoa(g.cfg.MaxJSONDepth)+" levels (max_json_depth)")
		return false
	case !gjson.ValidBytes(body):
		writeError(ctx, fasthttp.StatusBadRequest, codeParseError, "null", "Parse error: body is not valid JSON")
		return false
	}
	r.msg = parseMessage(body)
	if r.msg.dup {
		writeError(ctx, fasthttp.StatusBadRequest, codeInvalidRequest, "null",
			"Invalid Request: a member (method, id, params or params.name) appears twice")
		return false
	}
	return true
}

// session finds the session the agent names and checks the credential it
// is bound to (binding.go). An unknown, ended or expired session, and one
// under a credential that may not use it, are answered alike: 404, as MCP
// answers an unknown session (2025-03-26+ §Session Management), so that a
// stranger learns nothing of it.
func (g *guard) session(ctx *fasthttp.RequestCtx, r *request, sid []byte) bool {
	sess, ok := g.sessions.lookup(sid, r.auth)
	if ok {
		r.standing, r.ownCredential = standingOf(sess, r.auth, g.link.judgesCredentials.Load())
		// Only the upstream may accept a credential the session is not
		// bound to: a GET or a DELETE under it would take the session's
		// stream or end it without asking the upstream.
		ok = r.standing == bound || (r.standing == rotating && !r.msg.get && !r.del)
	}
	if !ok {
		sessionNotFound(ctx, r.msg.idOrNull())
		return false
	}
	r.sess = sess
	return g.reserveJournal(ctx, r)
}

// reserveJournal takes the memory a request would add to its session's
// journal (a subscription's URI, a log level's params) before it goes
// anywhere, within the session's cap (Config.MaxJournal) and the memory
// budget, or refuses the request: a journal is replayed on every heal, so
// it must stay small, and it is held for the session's life.
func (g *guard) reserveJournal(ctx *fasthttp.RequestCtx, r *request) bool {
	if !r.msg.isRequest() {
		return true
	}
	switch r.msg.method {
	case "resources/subscribe", "resources/unsubscribe":
		uri := gjson.GetBytes(r.body, "params.uri").Str
		if uri == "" {
			return true // the upstream's own error
		}
		r.journal = session.JournalChange{URI: uri, Subscribed: r.msg.method == "resources/subscribe"}
	case "logging/setLevel":
		p := gjson.GetBytes(r.body, "params")
		if !p.IsObject() {
			return true
		}
		r.journal = session.JournalChange{Level: p.Raw}
	default:
		return true
	}
	n, ok := r.sess.ReserveJournal(r.journal, g.cfg.MaxJournal)
	if !ok {
		r.journal = session.JournalChange{}
		writeError(ctx, fasthttp.StatusOK, codeJournalFull, r.msg.idOrNull(), "the session's state (log level and "+
			"subscriptions) would pass mcpheal's max_journal of "+strconv.Itoa(g.cfg.MaxJournal)+
			" bytes, which mcpheal restores after every heal; "+r.msg.method+" was not sent")
		return false
	}
	if !g.mem.take(int64(n)) {
		r.sess.UnreserveJournal(n)
		r.journal = session.JournalChange{}
		writeFailure(ctx, &r.msg, failure{status: fasthttp.StatusServiceUnavailable, code: codeBudget, retryAfter: 1,
			msg: r.msg.method + " not sent: mcpheal's memory_budget is reached; retry later"})
		return false
	}
	r.reserved = int64(n)
	return true
}

// settle gives back a journal reservation the request did not use.
func (g *guard) settle(r *request) {
	if r.journal != (session.JournalChange{}) {
		r.sess.UnreserveJournal(int(r.reserved))
		g.mem.give(r.reserved)
		r.journal, r.reserved = session.JournalChange{}, 0
	}
}

// inbound checks the agent's bearer token when the upstream requires
// inbound auth, answering 401 itself when it is missing or wrong.
func (g *guard) inbound(ctx *fasthttp.RequestCtx) bool {
	if len(g.cfg.AuthTokens) == 0 {
		return true
	}
	got := ctx.Request.Header.PeekBytes(hdrAuthorization)
	const scheme = "Bearer "
	if len(got) > len(scheme) && strings.EqualFold(b2s(got[:len(scheme)]), scheme) {
		tok := got[len(scheme):]
		ok := 0
		for _, want := range g.cfg.AuthTokens { // no early exit: constant time over the set
			ok |= subtle.ConstantTimeCompare(tok, []byte(want))
		}
		if ok == 1 {
			return true
		}
	}
	writeError(ctx, fasthttp.StatusUnauthorized, codeUnauthorized, requestID(ctx.PostBody(), g.cfg.MaxJSONDepth),
		"Unauthorized: a valid bearer token is required")
	ctx.Response.Header.Set("WWW-Authenticate", `Bearer realm="mcpheal"`)
	return false
}

// isStatelessEra reports traffic of MCP 2026-07-28 or later, which has no
// sessions: a server/discover probe or an explicit new protocol version.
func isStatelessEra(h *fasthttp.RequestHeader, m *message) bool {
	if m.method == "server/discover" {
		return true
	}
	v := h.PeekBytes(hdrProtocolVersion)
	return len(v) == len(statelessVersion) && b2s(v) >= statelessVersion
}

// metaVersionName is the _meta member by which a 2026-07-28 request names
// its protocol version.
var metaVersionName = []byte(`"` + metaVersionKey + `"`)

// sessionNotFound is MCP's answer to an unknown session id (2025-03-26+
// §Session Management: 404; the agent then starts over with initialize).
func sessionNotFound(ctx *fasthttp.RequestCtx, id string) {
	writeError(ctx, fasthttp.StatusNotFound, codeSessionNotFound, id, "Session not found")
}

func tooLarge(ctx *fasthttp.RequestCtx, limit int) {
	writeError(ctx, fasthttp.StatusRequestEntityTooLarge, codeInvalidRequest, "null",
		"Request body too large (limit "+strconv.Itoa(limit)+" bytes)")
}

// jsonDepthOK reports whether no array or object in b nests deeper than
// max. It scans once, without recursion, skipping strings; it does not
// validate (gjson.ValidBytes does that after it, with its recursion bounded
// by max).
func jsonDepthOK(b []byte, max int) bool {
	depth := 0
	for i := 0; i < len(b); i++ {
		switch b[i] {
		case '"':
			for i++; i < len(b) && b[i] != '"'; i++ {
				if b[i] == '\\' {
					i++
				}
			}
		case '[', '{':
			if depth++; depth > max {
				return false
			}
		case ']', '}':
			depth--
		}
	}
	return true
}

// requestID returns the raw JSON id of body for error answers, or "null".
// maxDepth is Config.MaxJSONDepth: gjson's validator recurses per level.
func requestID(body []byte, maxDepth int) string {
	if len(body) == 0 || !jsonDepthOK(body, maxDepth) || !gjson.ValidBytes(body) { // an id from broken JSON is no id
		return "null"
	}
	id := gjson.Get(b2s(body), "id")
	if !id.Exists() || id.Raw == "" {
		return "null"
	}
	if id.Type != gjson.String && id.Type != gjson.Number {
		return "null"
	}
	return id.Raw
}

// hostGuard implements the DNS-rebinding check that MCP 2025-06-18+
// §Security Warning asks of Streamable HTTP servers. Because mcpheal rewrites
// Host for the upstream, the upstream's own check no longer protects it, so
// the proxy takes it over: Host must name the proxy itself, and a browser's
// Origin must be one of those names too.
type hostGuard struct {
	hosts map[string]bool // lower-case host names, without port
}

func newHostGuard(listen string, extra []string) hostGuard {
	g := hostGuard{hosts: make(map[string]bool)}
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		host = listen
	}
	names := []string{"localhost", "127.0.0.1", "::1"}
	if host != "" && host != "0.0.0.0" && host != "::" {
		names = append(names, host)
	}
	names = append(names, extra...)
	for _, n := range names {
		g.hosts[strings.ToLower(hostname(n))] = true
	}
	return g
}

// hostname strips an optional port and IPv6 brackets from a Host value.
// The port is not checked: a container or port forward may publish the
// proxy under another port, and DNS rebinding is about names.
func hostname(h string) string {
	if host, _, err := net.SplitHostPort(h); err == nil {
		return host
	}
	return strings.Trim(h, "[]")
}

// allowHost reports whether a Host header names this proxy.
func (g hostGuard) allowHost(h []byte) bool {
	if len(h) == 0 {
		return false
	}
	name := hostname(b2s(h))
	return g.hosts[name] || g.hosts[strings.ToLower(name)]
}

// allowOrigin reports whether an Origin header is absent (a non-browser
// client), or a page served from one of the proxy's own names.
func (g hostGuard) allowOrigin(o []byte) bool {
	if len(o) == 0 {
		return true
	}
	u, err := url.Parse(string(o))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") {
		return false
	}
	return g.hosts[strings.ToLower(u.Hostname())]
}

func (g hostGuard) allow(ctx *fasthttp.RequestCtx) bool {
	return g.allowHost(ctx.Request.Header.Host()) && g.allowOrigin(ctx.Request.Header.PeekBytes(hdrOrigin))
}
