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

	"github.com/mcpheal/mcpheal/proxy/internal/conf"
	"github.com/mcpheal/mcpheal/proxy/internal/exchange"
	"github.com/mcpheal/mcpheal/proxy/internal/heal"
	"github.com/mcpheal/mcpheal/proxy/internal/link"
	"github.com/mcpheal/mcpheal/proxy/internal/route/held"
	"github.com/mcpheal/mcpheal/proxy/internal/wire"
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
	cfg      *conf.Config
	hosts    hostGuard
	mem      *wire.Budget
	link     *link.Link
	sessions *heal.Sessions
}

// check runs every check on one agent request and fills r, or answers the
// refusal itself and reports false.
func (g *guard) check(ctx *fasthttp.RequestCtx, r *exchange.Request) bool {
	body := ctx.PostBody()
	h := &ctx.Request.Header
	switch {
	case len(body) > g.cfg.MaxBody:
		tooLarge(ctx, g.cfg.MaxBody)
		return false
	case !g.hosts.allow(ctx):
		wire.WriteError(ctx, fasthttp.StatusForbidden, wire.CodeForbidden, RequestID(body, g.cfg.MaxJSONDepth),
			"Forbidden: Host or Origin not allowed")
		return false
	case !g.inbound(ctx):
		return false
	case len(h.PeekAll(string(wire.HdrSessionID))) > 1:
		// Which one would the upstream read? Neither is forwarded.
		wire.WriteError(ctx, fasthttp.StatusBadRequest, wire.CodeInvalidRequest, RequestID(body, g.cfg.MaxJSONDepth),
			"Bad Request: more than one Mcp-Session-Id header")
		return false
	}
	r.Hdr, r.Body, r.Auth = h, body, h.PeekBytes(wire.HdrAuthorization)
	switch {
	case ctx.IsPost():
		if !g.message(ctx, r) {
			return false
		}
	case ctx.IsGet():
		if !bytes.Contains(h.PeekBytes(wire.HdrAccept), wire.MimeEventStream) {
			wire.WriteError(ctx, fasthttp.StatusNotAcceptable, wire.CodeInvalidRequest, "null",
				"Not Acceptable: GET requires Accept: text/event-stream")
			return false
		}
		r.Msg.Get = true
	case ctx.IsDelete():
		r.Del = true
	default:
		ctx.Response.Header.Set("Allow", "GET, POST, DELETE")
		wire.WriteError(ctx, fasthttp.StatusMethodNotAllowed, wire.CodeInvalidRequest, "null", "Method Not Allowed")
		return false
	}
	r.Stateless = isStatelessEra(h, &r.Msg)
	if sid := h.PeekBytes(wire.HdrSessionID); len(sid) > 0 {
		return g.session(ctx, r, sid)
	}
	if !r.Stateless && r.Msg.Method != "initialize" && bytes.Contains(body, metaVersionName) {
		// No session, and the body says 2026-07-28's way what version it
		// speaks, whatever its header says: the 2026-07-28 server judges
		// it (the held route: refuse2026; else the upstream).
		r.Stateless = true
	}
	switch {
	case r.Msg.Method == "initialize" && len(body) > g.cfg.MaxInitBody:
		// A recipe is kept for the session's life: agents' are < 2 KiB.
		wire.WriteError(ctx, fasthttp.StatusRequestEntityTooLarge, wire.CodeInvalidRequest, r.Msg.IdOrNull(),
			"initialize body larger than "+strconv.Itoa(g.cfg.MaxInitBody)+" bytes (max_init_body)")
		return false
	case r.Msg.Method == "initialize" || (r.Stateless && !r.Del):
		return true
	}
	wire.WriteError(ctx, fasthttp.StatusBadRequest, wire.CodeInvalidRequest, r.Msg.IdOrNull(),
		"Bad Request: Mcp-Session-Id header is required")
	return false
}

// message checks a POST's body and reads the JSON-RPC members mcpheal
// routes on.
func (g *guard) message(ctx *fasthttp.RequestCtx, r *exchange.Request) bool {
	body := r.Body
	switch {
	case !wire.HasMediaType(r.Hdr.ContentType(), wire.MimeJSON):
		wire.WriteError(ctx, fasthttp.StatusUnsupportedMediaType, wire.CodeInvalidRequest, RequestID(body, g.cfg.MaxJSONDepth),
			"Unsupported Media Type: Content-Type must be application/json")
		return false
	case !jsonDepthOK(body, g.cfg.MaxJSONDepth):
		// Checked first: gjson's validator recurses once per level.
		wire.WriteError(ctx, fasthttp.StatusBadRequest, wire.CodeInvalidRequest, "null",
			"Invalid Request: JSON nested deeper than "+strconv.Itoa(g.cfg.MaxJSONDepth)+" levels (max_json_depth)")
		return false
	case !gjson.ValidBytes(body):
		wire.WriteError(ctx, fasthttp.StatusBadRequest, wire.CodeParseError, "null", "Parse error: body is not valid JSON")
		return false
	}
	r.Msg = wire.ParseMessage(body)
	if r.Msg.Dup {
		wire.WriteError(ctx, fasthttp.StatusBadRequest, wire.CodeInvalidRequest, "null",
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
func (g *guard) session(ctx *fasthttp.RequestCtx, r *exchange.Request, sid []byte) bool {
	sess, ok := g.sessions.Lookup(sid, r.Auth)
	if ok {
		r.Standing, r.OwnCredential = heal.StandingOf(sess, r.Auth, g.link.JudgesCredentials.Load())
		// Only the upstream may accept a credential the session is not
		// bound to: a GET or a DELETE under it would take the session's
		// stream or end it without asking the upstream.
		ok = r.Standing == heal.Bound || (r.Standing == heal.Rotating && !r.Msg.Get && !r.Del)
	}
	if !ok {
		sessionNotFound(ctx, r.Msg.IdOrNull())
		return false
	}
	r.Sess = sess
	return g.reserveJournal(ctx, r)
}

// reserveJournal takes the memory a request would add to its session's
// journal (a subscription's URI, a log level's params) before it goes
// anywhere, within the session's cap (Config.MaxJournal) and the memory
// budget, or refuses the request: a journal is replayed on every heal, so
// it must stay small, and it is held for the session's life.
func (g *guard) reserveJournal(ctx *fasthttp.RequestCtx, r *exchange.Request) bool {
	if !r.Msg.IsRequest() {
		return true
	}
	switch r.Msg.Method {
	case "resources/subscribe", "resources/unsubscribe":
		uri := gjson.GetBytes(r.Body, "params.uri").Str
		if uri == "" {
			return true // the upstream's own error
		}
		r.Journal = session.JournalChange{URI: uri, Subscribed: r.Msg.Method == "resources/subscribe"}
	case "logging/setLevel":
		p := gjson.GetBytes(r.Body, "params")
		if !p.IsObject() {
			return true
		}
		r.Journal = session.JournalChange{Level: p.Raw}
	default:
		return true
	}
	n, ok := r.Sess.ReserveJournal(r.Journal, g.cfg.MaxJournal)
	if !ok {
		r.Journal = session.JournalChange{}
		wire.WriteError(ctx, fasthttp.StatusOK, wire.CodeJournalFull, r.Msg.IdOrNull(), "the session's state (log level and "+
			"subscriptions) would pass mcpheal's max_journal of "+strconv.Itoa(g.cfg.MaxJournal)+
			" bytes, which mcpheal restores after every heal; "+r.Msg.Method+" was not sent")
		return false
	}
	if !g.mem.Take(int64(n)) {
		r.Sess.UnreserveJournal(n)
		r.Journal = session.JournalChange{}
		exchange.WriteFailure(ctx, &r.Msg, exchange.Failure{Status: fasthttp.StatusServiceUnavailable, Code: wire.CodeBudget, RetryAfter: 1,
			Msg: r.Msg.Method + " not sent: mcpheal's memory_budget is reached; retry later"})
		return false
	}
	r.Reserved = int64(n)
	return true
}

// settle gives back a journal reservation the request did not use.
func (g *guard) settle(r *exchange.Request) {
	if r.Journal != (session.JournalChange{}) {
		r.Sess.UnreserveJournal(int(r.Reserved))
		g.mem.Give(r.Reserved)
		r.Journal, r.Reserved = session.JournalChange{}, 0
	}
}

// inbound checks the agent's bearer token when the upstream requires
// inbound auth, answering 401 itself when it is missing or wrong.
func (g *guard) inbound(ctx *fasthttp.RequestCtx) bool {
	if len(g.cfg.AuthTokens) == 0 {
		return true
	}
	got := ctx.Request.Header.PeekBytes(wire.HdrAuthorization)
	const scheme = "Bearer "
	if len(got) > len(scheme) && strings.EqualFold(wire.B2s(got[:len(scheme)]), scheme) {
		tok := got[len(scheme):]
		ok := 0
		for _, want := range g.cfg.AuthTokens { // no early exit: constant time over the set
			ok |= subtle.ConstantTimeCompare(tok, []byte(want))
		}
		if ok == 1 {
			return true
		}
	}
	wire.WriteError(ctx, fasthttp.StatusUnauthorized, wire.CodeUnauthorized, RequestID(ctx.PostBody(), g.cfg.MaxJSONDepth),
		"Unauthorized: a valid bearer token is required")
	ctx.Response.Header.Set("WWW-Authenticate", `Bearer realm="mcpheal"`)
	return false
}

// isStatelessEra reports traffic of MCP 2026-07-28 or later, which has no
// sessions: a server/discover probe or an explicit new protocol version.
func isStatelessEra(h *fasthttp.RequestHeader, m *wire.Message) bool {
	if m.Method == "server/discover" {
		return true
	}
	v := h.PeekBytes(wire.HdrProtocolVersion)
	return len(v) == len(wire.StatelessVersion) && wire.B2s(v) >= wire.StatelessVersion
}

// metaVersionName is the _meta member by which a 2026-07-28 request names
// its protocol version.
var metaVersionName = []byte(`"` + held.MetaVersionKey + `"`)

// sessionNotFound is MCP's answer to an unknown session id (2025-03-26+
// §Session Management: 404; the agent then starts over with initialize).
func sessionNotFound(ctx *fasthttp.RequestCtx, id string) {
	wire.WriteError(ctx, fasthttp.StatusNotFound, wire.CodeSessionNotFound, id, "Session not found")
}

func tooLarge(ctx *fasthttp.RequestCtx, limit int) {
	wire.WriteError(ctx, fasthttp.StatusRequestEntityTooLarge, wire.CodeInvalidRequest, "null",
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

// RequestID returns the raw JSON id of body for error answers, or "null".
// maxDepth is Config.MaxJSONDepth: gjson's validator recurses per level.
func RequestID(body []byte, maxDepth int) string {
	if len(body) == 0 || !jsonDepthOK(body, maxDepth) || !gjson.ValidBytes(body) { // an id from broken JSON is no id
		return "null"
	}
	id := gjson.Get(wire.B2s(body), "id")
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

func NewHostGuard(listen string, extra []string) hostGuard {
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

// AllowHost reports whether a Host header names this proxy.
func (g hostGuard) AllowHost(h []byte) bool {
	if len(h) == 0 {
		return false
	}
	name := hostname(wire.B2s(h))
	return g.hosts[name] || g.hosts[strings.ToLower(name)]
}

// AllowOrigin reports whether an Origin header is absent (a non-browser
// client), or a page served from one of the proxy's own names.
func (g hostGuard) AllowOrigin(o []byte) bool {
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
	return g.AllowHost(ctx.Request.Header.Host()) && g.AllowOrigin(ctx.Request.Header.PeekBytes(wire.HdrOrigin))
}
