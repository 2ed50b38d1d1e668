package held

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"

	"github.com/mcpheal/mcpheal/classify"
	"github.com/mcpheal/mcpheal/proxy/internal/era"
	"github.com/mcpheal/mcpheal/proxy/internal/exchange"
	"github.com/mcpheal/mcpheal/proxy/internal/heal"
	"github.com/mcpheal/mcpheal/proxy/internal/link"
	"github.com/mcpheal/mcpheal/proxy/internal/obs"
	"github.com/mcpheal/mcpheal/proxy/internal/route/stream"
	"github.com/mcpheal/mcpheal/proxy/internal/wire"
	"github.com/mcpheal/mcpheal/session"
	"github.com/mcpheal/mcpheal/session/seal"
	"github.com/mcpheal/mcpheal/upstream"
)

// held is the route of an MCP 2026-07-28 agent in front of a session-era
// upstream (docs/eras.md "2026-07-28 agents, session-era servers"). The agent
// holds no session; mcpheal holds one upstream for it, and heals it like
// any other: its requests come through the guard (which finds the held
// session), go upstream through the attempt loop (the one replay rule, the
// one heal), and only their translation is this route's:
//
//   - server/discover is answered from the upstream's initialize;
//   - every other request goes on the held session of its credential and
//     client (the _meta's clientInfo and clientCapabilities), with an id of
//     mcpheal's (agents sharing a session may use the same ids) and without
//     the 2026-07-28 _meta members, which the session's initialize carries;
//     its answer comes back with the agent's id;
//   - a server→client request on the call's SSE answer (sampling,
//     elicitation, roots) ends the agent's answer as an InputRequiredResult;
//     the upstream's answer stays open until the agent retries with its
//     inputResponses and the requestState mcpheal gave it
//     (held_call.go); requests the server sends at once go to the agent
//     together;
//   - the log level the _meta asks for is set on the session first, and
//     kept in its journal, so a heal restores it;
//   - subscriptions/listen is the session's GET stream and
//     resources/subscribe (held_listen.go).
//
// A held session is a session like an agent's: in the store, under its
// caps and the memory budget, kept warm by keepalive, healed on death,
// ended and DELETEd upstream when idle for session_ttl. Its id, a digest
// of its key, never leaves mcpheal; with a fleet's store, a restarted
// process takes it over (adopt).
type Route struct {
	S  *exchange.Env // the exchange its requests' attempts go through
	Up Upstream      // all it sends upstream beside its requests' attempts
	// The stages it uses itself; it reaches no other.
	Sessions   *heal.Sessions
	Healer     *heal.Healer
	Eras       *era.State
	Challenges *exchange.Challenges
	Streams    *stream.Set // the held sessions' GET streams among the upstream's
	Scope      string      // heldScope
	mu         sync.Mutex
	ByKey      map[Key]*Entry
	parked     sync.Map // requestState → *heldCall waiting for the agent's input
	calls      sync.Map // callKey → heldCancel, for notifications/cancelled
	Infos      sync.Map // *session.Session → *discovery: its initialize's answer
	Hubs       map[*session.Session]*Hub
	// refusing counts the answers to upstream requests on GET streams in
	// flight (refuse, ask).
	refusing atomic.Int32
}

// Upstream is what the held route sends upstream itself, beside the
// attempts (exchange.NewAttempt) that carry its agents' requests: the
// held session's initialize, journal and tools/list, the answers to the
// upstream's requests, the DELETE of a session it lets go, and the held
// session's own GET stream (stream.Upstream). The front door gives it the
// link (link.Link); it reaches nothing else of it.
type Upstream interface {
	stream.Upstream
	UpcallID(kind string) string
	CopyRequest(hdr *fasthttp.RequestHeader, body []byte, req *fasthttp.Request)
	Call(c *link.Upcall) (link.Reply, error)
	DropMinted(r *upstream.Response)
	DeleteLater(up session.UpstreamID, auth []byte, dead bool)
}

// heldCancel is what an agent's notifications/cancelled can end: a call,
// or a listen.
type heldCancel interface{ cancelByAgent() }

// heldKey names the held session of a credential and a client: a hash of
// the agent's Authorization and the clientInfo and clientCapabilities its
// requests carry (what the upstream would have seen in an initialize).
type Key [sha256.Size]byte

// heldEntry is one held session, or its creation in progress (ready
// closes when it ended, sess nil if it failed).
type Entry struct {
	ready chan struct{}
	sess  *session.Session
	// info is what the upstream's initialize answered, for
	// server/discover; counted in the memory budget while held.
	info *era.Discovery
}

// The paths of the 2026-07-28 _meta members mcpheal reads.
const (
	metaClientInfo   = `params._meta.io\.modelcontextprotocol/clientInfo`
	metaCapabilities = `params._meta.io\.modelcontextprotocol/clientCapabilities`
	metaLogLevel     = `params._meta.io\.modelcontextprotocol/logLevel`
)

// heldKeyOf returns the held key of an agent request.
func KeyOf(auth, body []byte) Key {
	var info, caps string
	// One pass over _meta: a gjson path with an escaped dot allocates.
	gjson.Get(wire.B2s(body), "params._meta").ForEach(func(k, v gjson.Result) bool {
		switch k.Str {
		case "io.modelcontextprotocol/clientInfo":
			info = v.Raw
		case "io.modelcontextprotocol/clientCapabilities":
			caps = v.Raw
		}
		return true
	})
	var buf [512]byte
	b := append(buf[:0], auth...)
	b = append(b, 0)
	b = append(b, info...)
	b = append(b, 0)
	b = append(b, caps...)
	return sha256.Sum256(b)
}

// idOf returns the id of k's held session: a digest of k and of this
// process's place (its host name and listen address, heldScope), under
// which a fleet's store keeps its upstream session. A process restarted
// in place finds it there; another replica holds its own, since the
// upstream allows one GET stream per session and each replica's listens
// need theirs. It never leaves mcpheal, and no agent's Mcp-Session-Id
// opens it (sessions.lookup).
func (h *Route) idOf(k Key) session.ClientID {
	d := sha256.New()
	d.Write([]byte(h.Scope))
	d.Write(k[:])
	var sum [sha256.Size]byte
	var b [1 + 2*16]byte
	b[0] = heal.HeldPrefix
	hex.Encode(b[1:], d.Sum(sum[:0])[:16])
	return session.ClientID(b[:])
}

// heldScope names a process's place: what stays the same when it is
// restarted in place (a container restarted in its pod, a service
// restarted on its host) and differs between replicas.
func Scope(listen string) string {
	host, _ := os.Hostname()
	return host + "\x00" + listen
}

// Lookup returns the live held session of k, if any.
func (h *Route) Lookup(k Key) *session.Session {
	h.mu.Lock()
	e := h.ByKey[k]
	h.mu.Unlock()
	if e == nil {
		return nil
	}
	select {
	case <-e.ready:
		if e.sess != nil && !e.sess.Removed() {
			return e.sess
		}
	default:
	}
	return nil
}

// Released forgets a held session that left the store. Its key may
// already name the next one (a request came meanwhile): what it held is
// found by the session itself.
func (h *Route) Released(sess *session.Session) {
	if v, ok := h.Infos.LoadAndDelete(sess); ok {
		h.S.Mem.Give(v.(*era.Discovery).Size())
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for k, e := range h.ByKey {
		select {
		case <-e.ready:
			if e.sess == sess {
				delete(h.ByKey, k)
			}
		default:
		}
	}
	if hub := h.Hubs[sess]; hub != nil {
		delete(h.Hubs, sess)
		hub.g.Stop()
	}
}

// capabilities returns the upstream's capabilities of a held session, raw
// JSON.
func (h *Route) capabilities(sess *session.Session) []byte {
	if v, ok := h.Infos.Load(sess); ok {
		return v.(*era.Discovery).Capabilities
	}
	return []byte("{}")
}

// journalled records a change of a held session's state in its journal
// (within max_journal and the memory budget) and makes it upstream. The
// journal comes first: should the session be found gone, the heal that
// follows replays it.
func (h *Route) journalled(ctx context.Context, hdr *fasthttp.RequestHeader, sess *session.Session, c session.JournalChange, method, params string) error {
	s := h.S
	n, ok := sess.ReserveJournal(c, s.Cfg.MaxJournal)
	if !ok {
		return errJournalFull
	}
	if !s.Mem.Take(int64(n)) {
		sess.UnreserveJournal(n)
		return heal.ErrBudget
	}
	h.Sessions.Journal(sess, c, int64(n))
	if ctx == nil {
		ctx = context.Background()
	}
	up, gen := sess.Current()
	body := `{"jsonrpc":"2.0","id":` + h.Up.UpcallID("journal") + `,"method":"` + method + `","params":` + params + `}`
	cls, err := h.Healer.SessionCall(ctx, hdr, sess, up, body, nil)
	if cls == classify.SessionGone {
		hctx, cancel := context.WithTimeout(ctx, s.Cfg.HealTimeout)
		defer cancel()
		_, _, err = h.Healer.Heal(hctx, sess, gen, obs.ReasonSessionGone, hdr)
	}
	return err
}

// logAll sets the held session's log level to debug, once, before the
// first request that asks for log messages (its _meta's logLevel): every
// level then comes, and each request gets those of its own level
// (heldCall.notification), since agents sharing the session may each ask
// for another. Until one asks, the session spends no request on it: a
// server that allows a new session only a few requests gets the agent's
// first.
func (h *Route) logAll(c *heldCall, r *exchange.Request) {
	sess := r.Sess
	if c.level < 0 || sess.Journal().Level != "" || !gjson.GetBytes(h.capabilities(sess), "logging").Exists() {
		return
	}
	if err := h.journalled(r.Tctx, heal.RecipeHeader(sess), sess, session.JournalChange{Level: `{"level":"debug"}`},
		"logging/setLevel", `{"level":"debug"}`); err != nil {
		h.S.Log.Warn().Str(obs.LogSession, sess.ID.Short()).Err(err).Msg("held session: logging/setLevel failed")
	}
}

// errJournalFull: the change would pass max_journal.
var errJournalFull = errors.New("the session's state would pass max_journal")

// Serve handles one request of a 2026-07-28 agent of a session-era
// upstream.
func (h *Route) Serve(ctx *fasthttp.RequestCtx, r *exchange.Request) {
	m, w := &r.Msg, h.S.Writer()
	switch {
	case m.Batch:
		w.Refuse(ctx, m, fasthttp.StatusBadRequest, wire.CodeInvalidRequest, "Invalid Request: MCP 2026-07-28 has no JSON-RPC batches")
		return
	case m.Get || (m.Method == "" && m.ID != ""):
		// 2026-07-28 has no GET stream, and its agents answer the
		// server's requests in a retry's inputResponses.
		w.Refuse(ctx, m, fasthttp.StatusBadRequest, wire.CodeInvalidRequest, "Invalid Request: not a request of MCP 2026-07-28")
		return
	case sessionOnly(m.Method) || removed2026(m.Method):
		// The held session's own state is mcpheal's: an agent sharing
		// it may not change it for the others.
		if m.ID == "" {
			w.Status(ctx, m, fasthttp.StatusAccepted, classify.Unknown)
			return
		}
		w.Refuse(ctx, m, fasthttp.StatusNotFound, -32601, "Method not found: "+m.Method+
			" is not part of MCP 2026-07-28 (MCP-Protocol-Version says 2026-07-28)")
		return
	case refuse2026(ctx, r, w):
		return
	}
	if m.ID == "" && (r.Sess == nil || m.Method == "notifications/cancelled") {
		// A notification: it cancels a call or a listen, or has no
		// session to go to (it opens none).
		if m.Method == "notifications/cancelled" {
			h.cancel(r)
		}
		w.Status(ctx, m, fasthttp.StatusAccepted, classify.Unknown)
		return
	}
	var info *era.Discovery
	if r.Sess == nil || m.Method == "server/discover" {
		e, f := h.entry(r)
		if e == nil {
			w.Fail(ctx, m, classify.TransportDead, heldFailure(f))
			return
		}
		r.Sess, info = e.sess, e.info
	}
	// The key holds the credential: the session is the request's own.
	r.Standing, r.OwnCredential = heal.Bound, true
	switch {
	case m.Method == "server/discover":
		h.discover(ctx, r, info)
		h.Healer.ToolsDue(r.Sess) // no request of the agent's waits upstream
	case m.Method == "subscriptions/listen":
		h.listen(ctx, r)
	case strings.HasPrefix(gjson.GetBytes(r.Body, "params.requestState").Str, heldState):
		h.resume(ctx, r)
	default:
		h.call(ctx, r)
	}
}

// removed2026 reports the other methods MCP 2026-07-28 removed: ping, and
// tasks/list and tasks/result of the session era's tasks.
func removed2026(method string) bool {
	return method == "ping" || method == "tasks/list" || method == "tasks/result"
}

// metaVersion and metaCaps are the _meta members a 2026-07-28 request must
// carry (a request's own one pass over _meta: refuse2026).
const (
	MetaVersionKey = "io.modelcontextprotocol/protocolVersion"
	metaCapsKey    = "io.modelcontextprotocol/clientCapabilities"
)

// refuse2026 answers, as a server of MCP 2026-07-28 does, a request the
// held route must not take (mcpheal is that server for the agent): its
// Mcp-Method header missing or not its method, or its MCP-Protocol-Version
// header not its _meta's (400 -32020); _meta without a protocol version or
// client capabilities (400 -32602); a version other than 2026-07-28 (400
// -32022 naming the one supported). It reports whether it answered.
func refuse2026(ctx *fasthttp.RequestCtx, r *exchange.Request, w exchange.Writer) bool {
	m := &r.Msg
	if m.Method == "" {
		return false
	}
	var version gjson.Result
	caps := false
	gjson.Get(wire.B2s(r.Body), "params._meta").ForEach(func(k, v gjson.Result) bool {
		switch k.Str {
		case MetaVersionKey:
			version = v
		case metaCapsKey:
			caps = v.IsObject()
		}
		return true
	})
	hdrMethod := r.Hdr.Peek("Mcp-Method")
	header := r.Hdr.PeekBytes(wire.HdrProtocolVersion)
	var code int
	var msg string
	switch {
	case len(hdrMethod) == 0:
		code, msg = wire.CodeHeaderMismatch, "missing required Mcp-Method header"
	case wire.B2s(hdrMethod) != m.Method:
		code, msg = wire.CodeHeaderMismatch, "header mismatch: Mcp-Method header value "+strconv.Quote(string(hdrMethod))+
			" does not match body value "+strconv.Quote(m.Method)
	case version.Type != gjson.String || version.Str == "":
		code, msg = -32602, "missing or invalid _meta field \""+MetaVersionKey+"\""
	case wire.B2s(header) != version.Str:
		code, msg = wire.CodeHeaderMismatch, "MCP-Protocol-Version header "+strconv.Quote(string(header))+
			" does not match the request's "+MetaVersionKey+" "+strconv.Quote(version.Str)
	case version.Str != wire.StatelessVersion:
		if m.ID == "" {
			w.Status(ctx, m, fasthttp.StatusBadRequest, classify.Unknown)
			return true
		}
		b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": json.RawMessage(m.ID), "error": map[string]any{
			"code": -32022, "message": "Unsupported protocol version: " + version.Str,
			"data": map[string]any{"supported": []string{wire.StatelessVersion}, "requested": version.Str}}})
		w.RefuseBody(ctx, fasthttp.StatusBadRequest, b)
		return true
	case m.ID != "" && !caps:
		code, msg = -32602, "missing or invalid _meta field \""+metaCapsKey+"\""
	default:
		why, ok := nameMismatch(r)
		if !ok {
			why, ok = paramMismatch(r)
		}
		if !ok {
			return false
		}
		code, msg = wire.CodeHeaderMismatch, why
	}
	if m.ID == "" {
		w.Status(ctx, m, fasthttp.StatusBadRequest, classify.Unknown)
		return true
	}
	w.Refuse(ctx, m, fasthttp.StatusBadRequest, code, msg)
	return true
}

// nameMismatch checks the Mcp-Name header of a request that names its
// target (tools/call and prompts/get: params.name; resources/read:
// params.uri): it must be there and, leading and trailing white space
// aside (RFC 9110 §5.5), decoded from =?base64?…?= when so written, equal
// the body's. ok is true with the reason when it is not.
func nameMismatch(r *exchange.Request) (string, bool) {
	var want string
	switch r.Msg.Method {
	case "tools/call", "prompts/get":
		want = gjson.Get(wire.B2s(r.Body), "params.name").Str // views: nothing copied unless refused
	case "resources/read":
		want = gjson.Get(wire.B2s(r.Body), "params.uri").Str
	default:
		return "", false
	}
	v, ok := carriedValue(r.Hdr.Peek("Mcp-Name"))
	switch {
	case v == "" && ok:
		return "missing required Mcp-Name header for " + r.Msg.Method, true
	case !ok:
		return "Mcp-Name header is not valid base64", true
	}
	if v != want {
		return "header mismatch: Mcp-Name header value " + strconv.Quote(v) + " does not match body value " + strconv.Quote(want), true
	}
	return "", false
}

// paramMismatch checks the Mcp-Param-<name> headers of a tools/call whose
// tool declares x-mcp-header parameters (learnt from the held session's
// tools/list): each argument the body carries must come in its header,
// as it is or written =?base64?…?= (which must then be valid base64), and
// be equal to the body's. ok is true with the reason when one is not.
func paramMismatch(r *exchange.Request) (string, bool) {
	if r.Msg.Method != "tools/call" || r.Sess == nil {
		return "", false
	}
	hs := r.Sess.ParamHeaders(r.Msg.Tool)
	for param, name := range hs {
		arg := gjson.Get(wire.B2s(r.Body), "params.arguments."+gjson.Escape(param))
		if !arg.Exists() || arg.Type == gjson.Null {
			continue
		}
		want := arg.String()
		raw := r.Hdr.Peek("Mcp-Param-" + name)
		if raw == nil {
			return "missing required Mcp-Param-" + name + " header for argument " + strconv.Quote(param), true
		}
		v, ok := carriedValue(raw)
		if !ok {
			return "Mcp-Param-" + name + " header is not valid base64", true
		}
		if v != want {
			return "header mismatch: Mcp-Param-" + name + " header value does not match argument " + strconv.Quote(param), true
		}
	}
	return "", false
}

// carriedValue is the value of a 2026-07-28 header that carries a request's
// value (Mcp-Name, Mcp-Param-*): leading and trailing white space aside
// (RFC 9110 §5.5), decoded from =?base64?…?= when so written; ok is false
// when that base64 is not strictly valid.
func carriedValue(raw []byte) (v string, ok bool) {
	v = strings.Trim(wire.B2s(raw), " \t")
	enc, coded := strings.CutPrefix(v, "=?base64?")
	if !coded || !strings.HasSuffix(enc, "?=") {
		return v, true
	}
	b, err := base64.StdEncoding.Strict().DecodeString(strings.TrimSuffix(enc, "?="))
	return string(b), err == nil
}

// sessionOnly reports the methods of the session era that MCP 2026-07-28
// dropped: the log level and subscriptions go in _meta and
// subscriptions/listen instead.
func sessionOnly(method string) bool {
	switch method {
	case "initialize", "notifications/initialized", "logging/setLevel", "resources/subscribe", "resources/unsubscribe",
		"notifications/roots/list_changed":
		return true
	}
	return false
}

// entry returns the held session of r's key, creating it (an upstream
// initialize) when there is none. Concurrent first requests of a key wait
// for one creation. On failure it returns nil and the agent's answer.
func (h *Route) entry(r *exchange.Request) (*Entry, exchange.Failure) {
	k := KeyOf(r.Auth, r.Body)
	for {
		h.mu.Lock()
		e := h.ByKey[k]
		if e == nil {
			e = &Entry{ready: make(chan struct{})}
			h.ByKey[k] = e
			h.mu.Unlock()
			f := h.create(r, e, h.idOf(k))
			if e.sess == nil {
				h.mu.Lock()
				delete(h.ByKey, k)
				h.mu.Unlock()
			}
			close(e.ready)
			if e.sess == nil {
				return nil, f
			}
			return e, f
		}
		h.mu.Unlock()
		select {
		case <-e.ready:
		case <-h.S.Done:
			return nil, exchange.Failure{Status: fasthttp.StatusServiceUnavailable, Code: wire.CodeUpstreamDown, Msg: "mcpheal is shutting down", RetryAfter: 1}
		}
		if e.sess != nil && !e.sess.Removed() {
			return e, exchange.Failure{}
		}
		h.mu.Lock()
		if h.ByKey[k] == e {
			delete(h.ByKey, k) // ended, or failed for another request: try again
		}
		h.mu.Unlock()
		if e.sess == nil {
			// The creation this request waited for failed: it says why.
			return nil, exchange.Failure{Status: fasthttp.StatusServiceUnavailable, Code: wire.CodeUpstreamDown, RetryAfter: 1,
				Msg: "the upstream did not open a session for this agent; retry later"}
		}
	}
}

// create opens the held session of e, under id: the one a fleet's store
// keeps (made by this process's predecessor in its place) is taken over
// as it is; otherwise the initialize a session-era agent would have sent,
// built from the request's _meta, goes through the attempt loop as an
// agent's initialize does, then notifications/initialized. It returns
// the agent's answer on failure.
func (h *Route) create(r *exchange.Request, e *Entry, id session.ClientID) exchange.Failure {
	s := h.S
	if h.adopt(r, e, id) {
		return exchange.Failure{}
	}
	sess, info, f := h.open(r, id)
	if sess == nil {
		return f
	}
	up, _ := sess.Current()
	hdr := heal.RecipeHeader(sess)
	if err := h.Healer.Initialized(r.Tctx, hdr, up, sess.Recipe.ProtocolVersion, time.Now().Add(s.Cfg.HealTimeout)); err != nil {
		h.Sessions.End(sess, false)
		h.Up.DeleteLater(up, hdr.PeekBytes(wire.HdrAuthorization), true)
		return exchange.Failure{Status: fasthttp.StatusServiceUnavailable, Code: wire.CodeUpstreamDown, RetryAfter: 1,
			Msg: "the upstream did not take notifications/initialized: " + err.Error()}
	}
	h.hold(e, sess, info)
	s.Log.Debug().Str(obs.LogSession, sess.ID.Short()).Str("protocol", sess.Recipe.ProtocolVersion).
		Msg("session held for a 2026-07-28 agent")
	return exchange.Failure{}
}

// hold makes sess, whose upstream's initialize answered info, e's held
// session.
func (h *Route) hold(e *Entry, sess *session.Session, info *era.Discovery) {
	e.info = info
	h.S.Mem.Charge(info.Size())
	h.Infos.Store(sess, info)
	if sess.Removed() {
		h.Released(sess) // it left the store before it was held
	}
	e.sess = sess
	h.hub(sess)
	h.learnTools(sess)
}

// learnTools has mcpheal list the held session's tools itself
// (healer.refreshTools) once the agent's request that opened it has
// reached the upstream (attempt.sent), or at once when that request is
// answered here (server/discover): a 2026-07-28 agent may call a tool it
// never listed, and the replay rules read the tool's annotations.
func (h *Route) learnTools(sess *session.Session) {
	if info, ok := h.Infos.Load(sess); ok && gjson.GetBytes(info.(*era.Discovery).Capabilities, "tools").Exists() {
		sess.DueTools(false)
	}
}

// adopt takes over the held session id that the fleet's store keeps (this
// process's predecessor in its place made it): its
// upstream session and generation, its journal (log level,
// subscriptions) and the upstream's initialize answer, which
// server/discover gives. No upstream initialize: should the upstream
// session have died meanwhile, the first request heals it. It reports
// false when there is nothing to take over; r.heldGen is then the last
// generation the store knew, which the new upstream session follows.
func (h *Route) adopt(r *exchange.Request, e *Entry, id session.ClientID) bool {
	s := h.S
	st, ok := h.Sessions.Fleet.Load(context.Background(), id)
	if !ok || st.Ended {
		return false
	}
	r.HeldGen = st.Gen
	version := wire.InitializedVersion(fasthttp.StatusOK, st.Init)
	if st.Gen == 0 || st.Upstream == "" || version == "" {
		return false
	}
	info := heldDiscovery(st.Init)
	init := heldInitialize(r.Body, h.Up.UpcallID("init"))
	rec := seal.NewRecord(s.Cfg.Name, heal.BindingOf(r.Auth), version, init, time.Now(), s.Cfg.SessionMaxAge)
	recipe := heal.NewRecipe(r.Hdr, rec, init, version)
	recipe.InitSealed = true
	sess, ok := h.Sessions.AddRestored(session.Adopted(id, recipe, st.Upstream, st.Gen), st)
	if !ok {
		return false
	}
	h.hold(e, sess, info)
	s.Log.Info().Str(obs.LogSession, id.Short()).Msg("held session taken over from the session store")
	return true
}

// open sends the initialize of a held session through the attempt loop,
// as an agent's initialize goes, and admits the session it opens. It
// returns the session and what its initialize answered, or the agent's
// answer.
func (h *Route) open(r *exchange.Request, id session.ClientID) (*session.Session, *era.Discovery, exchange.Failure) {
	s := h.S
	body := heldInitialize(r.Body, h.Up.UpcallID("init"))
	if len(body) > s.Cfg.MaxInitBody {
		// The initialize a session-era agent would send is kept for the
		// session's life, as an agent's own is (guard.check).
		return nil, nil, exchange.Failure{Status: fasthttp.StatusRequestEntityTooLarge, Code: wire.CodeInvalidRequest,
			Msg: "_meta clientInfo and clientCapabilities larger than " + strconv.Itoa(s.Cfg.MaxInitBody) + " bytes (max_init_body)"}
	}
	ir := &exchange.Request{Msg: wire.Message{Method: "initialize", ID: gjson.GetBytes(body, "id").Raw}, Body: body, Hdr: r.Hdr,
		Auth: r.Auth, Tctx: r.Tctx, HeldID: id, HeldGen: r.HeldGen}
	a := exchange.NewAttempt(s, nil, ir)
	defer a.Release()
	a.Gen = 1
	h.Up.CopyRequest(r.Hdr, body, a.Req)
	stripStateless(&a.Req.Header)
	a.Req.Header.DelBytes(wire.HdrProtocolVersion)
	s.Count.UpstreamInits.Add(1)
	out := a.Loop()
	defer func() {
		if a.Sess == nil {
			// Not held: a session the upstream opened with its answer (one
			// mcpheal could not carry, a refusal, an error) is nobody's.
			h.Up.DropMinted(a.Resp)
		}
	}()
	var msg []byte
	if out.Kind == exchange.OutUpstream {
		var ok bool
		if msg, ok = a.InitializeAnswer(); !ok {
			h.Up.DropMinted(a.Resp)
			out = exchange.Outcome{Kind: exchange.OutTooLarge, Class: classify.Protocol, Err: wire.ErrAnswerTooLarge}
		} else {
			if wire.InitializedVersion(a.Resp.StatusCode(), msg) != "" {
				// Before the session is recorded: a process that finds
				// it in the store finds its answer too.
				h.Sessions.Fleet.Keep(id, msg)
			}
			out = a.CreateFrom(msg)
		}
	}
	switch st := a.Resp.StatusCode(); {
	case out.Kind != exchange.OutUpstream:
		return nil, nil, a.Fail(out)
	case a.Sess != nil:
		return a.Sess, heldDiscovery(msg), exchange.Failure{}
	case st == fasthttp.StatusUnauthorized || st == fasthttp.StatusForbidden:
		return nil, nil, exchange.Failure{Status: st, Code: wire.CodeUnauthorized, Challenge: string(h.Challenges.Own(r.Hdr, a.Resp.Header.Peek("WWW-Authenticate"))),
			Msg: "the upstream refused this request's credential (" + strconv.Itoa(st) + ")"}
	case era.LegacyRefused(st, msg):
		h.Eras.Forget() // redeployed 2026-07-28-only: the next request asks again
	}
	why := gjson.GetBytes(msg, "error.message").Str
	if why == "" {
		why = "HTTP " + strconv.Itoa(a.Resp.StatusCode())
	}
	return nil, nil, exchange.Failure{Status: fasthttp.StatusBadGateway, Code: wire.CodeUpstreamInvalid,
		Msg: "the upstream refused the session mcpheal opens for this agent: " + why}
}

// heldFailure is f as a 2026-07-28 agent can read it: it holds no
// session, so a 404 (the upstream refused to open one) is a refusal of the
// upstream's; and its SDK reads a JSON-RPC error only in an HTTP 200 or
// 400 answer, so mcpheal's errors go in a 200 (Retry-After kept), but for
// a 401 or 403, whose challenge the agent's auth acts on.
func heldFailure(f exchange.Failure) exchange.Failure {
	if f.Status == fasthttp.StatusNotFound {
		f.Code = wire.CodeUpstreamInvalid
		f.Msg = "the upstream refused the session mcpheal holds for this agent"
	}
	switch f.Status {
	case fasthttp.StatusUnauthorized, fasthttp.StatusForbidden, fasthttp.StatusRequestEntityTooLarge:
	default:
		f.Status = fasthttp.StatusOK
	}
	return f
}

// heldInitialize returns the initialize a session-era agent with the
// request's clientInfo and clientCapabilities would send.
func heldInitialize(body []byte, id string) []byte {
	out := append([]byte(`{"jsonrpc":"2.0","id":`), id...)
	out = append(out, `,"method":"initialize","params":{"protocolVersion":"`...)
	out = append(out, wire.LegacyVersions[0]...)
	out = append(out, `","capabilities":`...)
	if cc := gjson.GetBytes(body, metaCapabilities); cc.IsObject() {
		out = append(out, cc.Raw...)
	} else {
		out = append(out, "{}"...)
	}
	out = append(out, `,"clientInfo":`...)
	if ci := gjson.GetBytes(body, metaClientInfo); ci.IsObject() {
		out = append(out, ci.Raw...)
	} else {
		out = append(out, `{"name":"mcpheal","version":"1"}`...)
	}
	return append(out, "}}"...)
}

// heldDiscovery keeps what server/discover answers from an initialize
// answer.
func heldDiscovery(msg []byte) *era.Discovery {
	res := gjson.GetBytes(msg, "result")
	d := &era.Discovery{Capabilities: []byte(res.Get("capabilities").Raw), ServerInfo: []byte(res.Get("serverInfo").Raw)}
	if len(d.Capabilities) == 0 {
		d.Capabilities = []byte("{}")
	}
	if len(d.ServerInfo) == 0 {
		d.ServerInfo = []byte(`{"name":"mcpheal","version":"1"}`)
	}
	if ins := res.Get("instructions"); ins.Type == gjson.String {
		d.Instructions = []byte(ins.Raw)
	}
	return d
}

// discover answers server/discover from the held session's initialize.
func (h *Route) discover(ctx *fasthttp.RequestCtx, r *exchange.Request, d *era.Discovery) {
	m := &r.Msg
	out := append([]byte(`{"jsonrpc":"2.0","id":`), m.IdOrNull()...)
	// Private, as every answer on a held session is: it is the agent's
	// credential's (modernMessage).
	out = append(out, `,"result":{"resultType":"complete","ttlMs":0,"cacheScope":"private","supportedVersions":["`+wire.StatelessVersion+`"],"capabilities":`...)
	out = append(out, d.Capabilities...)
	if d.Instructions != nil {
		out = append(out, `,"instructions":`...)
		out = append(out, d.Instructions...)
	}
	out = append(out, `,"_meta":{"io.modelcontextprotocol/serverInfo":`...)
	out = append(out, d.ServerInfo...)
	out = append(out, "}}}"...)
	h.S.Writer().JSON(ctx, m, classify.OK, fasthttp.StatusOK, out, nil)
}

// stripStateless removes the headers of a 2026-07-28 request that a
// session-era server has no use for.
func stripStateless(h *fasthttp.RequestHeader) {
	h.Del("Mcp-Method")
	h.Del("Mcp-Name")
}

// Downgrade returns body as a session-era request of the held session:
// its id replaced by id, without the 2026-07-28 members of params._meta
// (the session's initialize carries them). Its inputResponses and
// requestState, when it has any, are the server's own (a result of its
// that asked for input, passed on as it was, held_call.go) and go with it.
func Downgrade(body []byte, id string) []byte {
	r := gjson.Parse(wire.B2s(body))
	out := make([]byte, 0, len(body)+len(id))
	out = append(out, `{"jsonrpc":"2.0"`...)
	r.ForEach(func(k, v gjson.Result) bool {
		switch k.Str {
		case "jsonrpc":
			return true
		case "id":
			out = append(out, `,"id":`...)
			out = append(out, id...)
			return true
		case "params":
			if v.IsObject() {
				out = append(out, `,"params":`...)
				out = appendParams(out, v)
				return true
			}
		}
		out = append(out, ',')
		out = append(out, k.Raw...)
		out = append(out, ':')
		out = append(out, v.Raw...)
		return true
	})
	return append(out, '}')
}

// appendParams appends params without the 2026-07-28 members of _meta (an
// empty _meta is left out).
func appendParams(out []byte, params gjson.Result) []byte {
	out = append(out, '{')
	out, n, meta := wire.CopyParams(out, params, true)
	if meta.Exists() && !meta.IsObject() {
		// Not 2026-07-28's: the upstream's to judge.
		if n > 0 {
			out = append(out, ',')
		}
		out = append(out, `"_meta":`...)
		out = append(out, meta.Raw...)
	} else if m := wire.AppendForeignMeta(nil, meta); len(m) > 0 {
		if n > 0 {
			out = append(out, ',')
		}
		out = append(out, `"_meta":{`...)
		out = append(out, m[1:]...) // without its first comma
		out = append(out, '}')
	}
	return append(out, '}')
}
