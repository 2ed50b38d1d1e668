package bridge

import (
	"bufio"
	"crypto/rand"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/attribute"

	"github.com/mcpheal/mcpheal/classify"
	"github.com/mcpheal/mcpheal/proxy/internal/era"
	"github.com/mcpheal/mcpheal/proxy/internal/exchange"
	"github.com/mcpheal/mcpheal/proxy/internal/heal"
	"github.com/mcpheal/mcpheal/proxy/internal/link"
	"github.com/mcpheal/mcpheal/proxy/internal/obs"
	"github.com/mcpheal/mcpheal/proxy/internal/wire"
	"github.com/mcpheal/mcpheal/session"
	"github.com/mcpheal/mcpheal/upstream"
)

// bridge is the route of a session-era agent in front of an upstream that
// speaks only MCP 2026-07-28 (docs/eras.md "Across protocol eras").
// mcpheal owns the agent's session; upstream every request is
// self-contained. Its requests come through the guard like every other
// (the session's credential, the journal's cap and the memory budget), and
// its upstream requests go through the attempt loop like every other (the
// one replay rule, the one backoff); what it adds is translation:
//
//   - initialize is answered from server/discover; notifications/initialized
//     and ping locally;
//   - logging/setLevel and resources/subscribe|unsubscribe are recorded in
//     the session's journal and answered locally: the level goes into every
//     request's _meta, the subscriptions into the GET stream's
//     subscriptions/listen (bridge_listen.go);
//   - every other request gets the 2026-07-28 envelope (_meta with the
//     agent's protocol version, clientInfo and capabilities from its
//     initialize) and headers (MCP-Protocol-Version, Mcp-Method, Mcp-Name);
//   - an InputRequiredResult becomes the session-era server→client
//     requests on the call's SSE answer (sampling, elicitation, roots); the
//     agent's answers go into the retry's inputResponses;
//   - notifications/cancelled ends the upstream request;
//   - what cannot be translated gets a JSON-RPC error that names it.
type Route struct {
	S  *exchange.Env // the exchange its calls' attempts go through
	Up Upstream      // all it sends upstream beside its calls' attempts
	// The stages it uses itself; it reaches no other.
	Sessions *heal.Sessions
	Eras     *era.State
	Trace    *obs.Tracing
	inputs   sync.Map // raw JSON id of a request sent to an agent → *pendingInput
	calls    sync.Map // callKey → *bridgeCall, for notifications/cancelled
	listens  sync.Map // session.ClientID → *listenState (bridge_listen.go)
}

// Upstream is what the bridge sends upstream itself, beside the attempts
// (exchange.NewAttempt) that carry its agents' calls: each round of a
// call, built in the 2026-07-28 envelope, and the listen that feeds a
// bridged GET stream, at its own pace. The front door gives it the link
// (link.Link); it reaches nothing else of it.
type Upstream interface {
	Origin() string
	UpcallID(kind string) string
	Build(req *fasthttp.Request, c *link.Upcall)
	Do(req *fasthttp.Request, resp *upstream.Response, deadline time.Time) error
	Retry(p link.Pace, budget time.Duration) link.Retry
}

// maxInputRounds bounds the InputRequiredResult rounds of one call (the
// TypeScript and Go SDK clients stop at 10 too).
const maxInputRounds = 10

// pendingInput is a server→client request the bridge sent an agent,
// waiting for its answer.
type pendingInput struct {
	sess   *session.Session
	answer chan []byte // the agent's response message, once
}

func callKey(id session.ClientID, rawID string) string { return string(id) + "\x00" + rawID }

// Serve handles one request of a legacy agent of a 2026-07-28 upstream.
// A request under a credential the session is not bound to (a possible
// rotation) may only go upstream, which judges it: nothing local happens
// for it (binding.go).
func (b *Route) Serve(ctx *fasthttp.RequestCtx, r *exchange.Request) {
	m := &r.Msg
	switch {
	case r.Sess == nil:
		b.initialize(ctx, r)
	case m.Get && r.Standing == heal.Bound:
		b.listen(ctx, r)
	case m.IsRequest() && !m.Batch && !answeredHere(m.Method):
		b.call(ctx, r)
	default:
		status, body, cls := b.local(r)
		b.S.Writer().JSON(ctx, m, cls, status, body, r.Sess)
	}
}

// answeredHere reports the requests the bridge answers itself: 2026-07-28
// has no session to initialize or ping, and carries the journal (log
// level, subscriptions) on every request and on the listen instead.
func answeredHere(method string) bool {
	switch method {
	case "ping", "initialize", "logging/setLevel", "resources/subscribe", "resources/unsubscribe":
		return true
	}
	return false
}

// local answers what the bridge handles itself: the status, the JSON
// body (nil for none), and the class it is counted as (Unknown: not
// counted).
func (b *Route) local(r *exchange.Request) (int, []byte, classify.Class) {
	m := &r.Msg
	switch {
	case r.Standing != heal.Bound:
		return fasthttp.StatusNotFound, wire.AppendError(nil, wire.CodeSessionNotFound, m.IdOrNull(), "Session not found"), classify.SessionGone
	case m.Batch:
		return fasthttp.StatusBadRequest, wire.AppendError(nil, wire.CodeInvalidRequest, "null",
			"JSON-RPC batches are not supported: the upstream speaks MCP 2026-07-28, which has none"), classify.Unknown
	case m.Method == "" && m.ID != "":
		b.input(r)
		return fasthttp.StatusAccepted, nil, classify.Unknown
	case m.ID == "": // a notification
		if m.Method == "notifications/cancelled" {
			b.cancel(r.Sess, gjson.GetBytes(r.Body, "params.requestId").Raw)
		}
		// notifications/initialized, roots/list_changed…: 2026-07-28 has
		// no place for them.
		return fasthttp.StatusAccepted, nil, classify.Unknown
	case m.Method == "initialize":
		return fasthttp.StatusBadRequest, wire.AppendError(nil, wire.CodeInvalidRequest, m.ID, "Invalid Request: the session is already initialized"), classify.Unknown
	case m.Method != "ping":
		if body, ok := b.journal(r); !ok {
			return fasthttp.StatusOK, body, classify.Unknown
		}
	}
	out := append([]byte(`{"jsonrpc":"2.0","id":`), m.ID...)
	return fasthttp.StatusOK, append(out, `,"result":{}}`...), classify.OK
}

// initialize answers a legacy agent's initialize for a 2026-07-28 upstream
// from what server/discover said, and creates its session. The answer
// carries the server's instructions, which may be large: it is counted in
// the memory budget until written.
func (b *Route) initialize(ctx *fasthttp.RequestCtx, r *exchange.Request) {
	s, m := b.S, &r.Msg
	d := b.Eras.Info.Load()
	if d == nil {
		s.Writer().Fail(ctx, m, classify.Unknown, exchange.Failure{Status: fasthttp.StatusServiceUnavailable, Code: wire.CodeUpstreamDown, RetryAfter: 1,
			Msg: "upstream unreachable: " + b.Up.Origin()})
		return
	}
	version := gjson.GetBytes(r.Body, "params.protocolVersion").Str
	if !wire.Contains(wire.LegacyVersions, version) {
		version = wire.LegacyVersions[0]
	}
	size := 128 + len(m.ID) + len(d.Capabilities) + len(d.ServerInfo) + len(d.Instructions)
	if !s.Mem.Take(int64(size)) {
		s.Writer().Fail(ctx, m, classify.Unknown, exchange.Failure{Status: fasthttp.StatusServiceUnavailable, Code: wire.CodeBudget, RetryAfter: 1,
			Msg: "initialize not answered: mcpheal's memory_budget is reached; retry later"})
		return
	}
	body := &exchange.BudgetBody{Mem: s.Mem, N: int64(size), B: make([]byte, 0, size)}
	sess := b.Sessions.NewSession(heal.Origin{Auth: r.Auth, Init: r.Body}, r.Hdr, version, "")
	if err := b.Sessions.Admit(sess); err != nil {
		body.Close()
		s.Writer().Fail(ctx, m, classify.OK, exchange.AdmissionFailure(err))
		return
	}
	out := append(body.B, `{"jsonrpc":"2.0","id":`...)
	out = append(out, m.ID...)
	out = append(out, `,"result":{"protocolVersion":`...)
	out = strconv.AppendQuote(out, version)
	out = append(out, `,"capabilities":`...)
	out = append(out, d.Capabilities...)
	out = append(out, `,"serverInfo":`...)
	out = append(out, d.ServerInfo...)
	if d.Instructions != nil {
		out = append(out, `,"instructions":`...)
		out = append(out, d.Instructions...)
	}
	body.B = append(out, "}}"...)
	s.Writer().Held(ctx, m, classify.OK, body, sess)
	s.Log.Debug().Str(obs.LogSession, sess.ID.Short()).Str("protocol", version).Msg("session created (bridged to 2026-07-28)")
}

// journal records a logging/setLevel or resources/(un)subscribe, whose
// memory the guard reserved: 2026-07-28 carries them on every request and
// on the listen instead. It returns the error answer of one that lacks its
// params (ok false).
func (b *Route) journal(r *exchange.Request) (errBody []byte, ok bool) {
	switch {
	case r.Journal == (session.JournalChange{}) && r.Msg.Method == "logging/setLevel",
		r.Journal.Level != "" && !gjson.Get(r.Journal.Level, "level").Exists():
		return wire.AppendError(nil, -32602, r.Msg.ID, "Invalid params: level is required"), false
	case r.Journal == (session.JournalChange{}):
		return wire.AppendError(nil, -32602, r.Msg.ID, "Invalid params: uri is required"), false
	}
	b.Sessions.Journal(r.Sess, r.Journal, r.Reserved)
	r.Journal, r.Reserved = session.JournalChange{}, 0
	if r.Msg.Method != "logging/setLevel" {
		b.listenChanged(r.Sess.ID)
	}
	return nil, true
}

// input takes an agent's answer to a request the bridge sent it, for the
// session that was asked only.
func (b *Route) input(r *exchange.Request) {
	if v, ok := b.inputs.Load(r.Msg.ID); ok {
		if p := v.(*pendingInput); p.sess == r.Sess {
			select {
			case p.answer <- append([]byte(nil), r.Body...):
			default: // answered already
			}
		}
	}
}

// inputID returns the JSON-RPC id of a request the bridge sends an agent:
// random, so that no other session's agent can guess one.
func inputID() string { return `"mcpheal-input-` + rand.Text() + `"` }

// cancel ends the upstream request of the agent's call rawID.
func (b *Route) cancel(sess *session.Session, rawID string) {
	if v, ok := b.calls.Load(callKey(sess.ID, rawID)); ok {
		v.(*bridgeCall).cancel()
	}
}

// bridgeCall is one bridged call: its rounds upstream, each an exchange of
// the attempt loop, and its answer.
type bridgeCall struct {
	b    *Route
	a    *exchange.Attempt
	key  string
	hdr  *fasthttp.RequestHeader // the agent's, for the rounds after the handler returned
	body []byte                  // the agent's request, for the same
	st   exchange.AgentStream

	mu        sync.Mutex // protects cancelled, finished
	cancelled bool
	finished  bool // a went back to the pool
}

// call sends a legacy agent's request upstream as a 2026-07-28 one and
// answers the agent, InputRequiredResult rounds included. The answer is an
// event stream (progress, log messages and requests to the agent go on it
// as they come), or JSON when the upstream answered JSON at once.
func (b *Route) call(ctx *fasthttp.RequestCtx, r *exchange.Request) {
	s := b.S
	a := exchange.NewAttempt(s, ctx, r)
	c := &bridgeCall{b: b, a: a, key: callKey(r.Sess.ID, r.Msg.ID), hdr: new(fasthttp.RequestHeader),
		body: append([]byte(nil), r.Body...)}
	r.Hdr.CopyTo(c.hdr)
	a.Msg.ID, a.Msg.Method, a.Msg.Tool = strings.Clone(a.Msg.ID), strings.Clone(a.Msg.Method), strings.Clone(a.Msg.Tool)
	b.calls.Store(c.key, c)
	c.prepare(a.Msg.ID, nil, "")
	a.WatchAgent()
	out := c.round(1)
	if out.Kind != exchange.OutUpstream || (!a.Resp.IsStream() && !isInputRequired(a.Resp.Body())) {
		c.answerJSON(out)
		c.finish()
		return
	}
	// An event stream from here on; the writer owns the call.
	c.st = exchange.AgentStream{S: s, Conn: ctx.Conn()}
	a.Ctx, a.R = nil, &exchange.Request{Msg: a.Msg, Sess: r.Sess, Standing: r.Standing, OwnCredential: r.OwnCredential,
		Auth: append([]byte(nil), r.Auth...), Hdr: c.hdr, Tctx: r.Tctx}
	s.Writer().Stream(ctx, &a.Msg, r.Sess, classify.Unknown, c.stream) // counted at its answer (Final)
}

// prepare builds the upstream request of a round: the agent's request in
// the 2026-07-28 envelope, with the round's JSON-RPC id.
func (c *bridgeCall) prepare(id string, inputs []byte, state string) {
	a := c.a
	a.Req.Reset()
	c.b.Up.Build(a.Req, &link.Upcall{Hdr: c.hdr, Body: wire.Envelope(c.body, id, a.Sess, inputs, state), Version: wire.StatelessVersion,
		McpMethod: a.Msg.Method, McpName: wire.McpNameOf(a.Msg.Method, c.body)})
}

// cancel interrupts the call: its exchange in flight ends as if its agent
// had gone (nothing is sent again), and no round follows.
func (c *bridgeCall) cancel() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cancelled = true
	if !c.finished {
		c.a.Abandon()
	}
}

// finish ends the call: a cancel from now on finds nothing to interrupt
// (its attempt goes back to the pool, to serve other requests).
func (c *bridgeCall) finish() {
	c.b.calls.Delete(c.key)
	c.mu.Lock()
	c.finished = true
	c.mu.Unlock()
	c.a.Unwatch()
	c.a.Release()
}

// answerJSON answers the agent with the first round's outcome: the
// upstream's JSON answer mapped to the session era, or mcpheal's error.
func (c *bridgeCall) answerJSON(out exchange.Outcome) {
	a := c.a
	switch {
	case out.Kind == exchange.OutAgentGone && c.isCancelled():
		a.S.Writer().Status(a.Ctx, &a.Msg, fasthttp.StatusAccepted, classify.Unknown) // the agent gave up on it
	case out.Kind != exchange.OutUpstream:
		a.Answer(out)
	default:
		msg, status := c.legacyAnswer(a.Resp.StatusCode(), a.Resp.Body())
		if cls := exchange.ClassOf(status, msg); a.S.Writer().JSON(a.Ctx, &a.Msg, cls, status, msg, a.Sess) {
			c.a.Answered(cls, msg)
		}
	}
}

func (c *bridgeCall) isCancelled() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cancelled
}

// stream writes the call's answer as an event stream: each round's
// events as they come, the requests of an InputRequiredResult, and the
// final answer.
func (c *bridgeCall) stream(w *bufio.Writer) {
	a := c.a
	defer c.finish()
	c.st.W = w
	for round := 1; ; round++ {
		msg, ok := c.relayRound()
		if !ok {
			return // the agent went away, or the answer was lost (said)
		}
		if !isInputRequired(msg) {
			out, _ := c.legacyAnswer(fasthttp.StatusOK, msg)
			c.st.Event(out)
			c.a.Answered(c.a.S.Writer().Final(&c.a.Msg, out), out)
			return
		}
		if round >= maxInputRounds {
			c.fail(exchange.Failure{Code: wire.CodeProxyError, Msg: "the upstream asked for input " + strconv.Itoa(round) +
				" times; mcpheal gives up (at most " + strconv.Itoa(maxInputRounds) + " rounds)"})
			return
		}
		inputs, ok := c.askAgent(msg)
		if !ok || c.isCancelled() {
			return
		}
		a.Renew()
		c.prepare(c.b.Up.UpcallID("round"), inputs, gjson.GetBytes(msg, "result.requestState").Raw)
		if out := c.round(round + 1); out.Kind != exchange.OutUpstream {
			if !c.isCancelled() {
				c.fail(a.Fail(out))
			}
			return
		}
	}
}

// round runs one round upstream through the attempt loop; traced, it is a
// span under the agent request's, its exchanges and any heal beneath it.
func (c *bridgeCall) round(n int) exchange.Outcome {
	a := c.a
	if c.b.Trace == nil || a.R == nil || a.R.Tctx == nil {
		return a.Loop()
	}
	parent := a.R.Tctx
	ctx, sp := c.b.Trace.Child(parent, "mcpheal bridge round", attribute.Int("mcpheal.bridge.round", n))
	a.R.Tctx = ctx
	out := a.Loop()
	a.R.Tctx = parent
	sp.End()
	return out
}

// fail ends the call's stream with mcpheal's error.
func (c *bridgeCall) fail(f exchange.Failure) {
	c.st.Event(wire.AppendError(nil, f.Code, c.a.Msg.ID, f.Msg))
}

// relayRound passes a round's notifications to the agent and returns its
// answer. ok is false when the agent went away or the upstream ended the
// round without an answer (the agent was told).
func (c *bridgeCall) relayRound() ([]byte, bool) {
	a := c.a
	if !a.Resp.IsStream() {
		return append([]byte(nil), a.Resp.Body()...), true
	}
	var msg []byte
	switch a.EachEvent(func(data []byte) (bool, bool) {
		if wire.IsResponse(data) {
			msg = append([]byte(nil), data...)
			return true, true
		}
		return false, c.st.Event(data)
	}) {
	case exchange.EventsTooLarge:
		c.fail(exchange.Failure{Code: wire.CodeTooLarge, Msg: "an upstream event passed max_sse_line"})
	case exchange.EventsOverBudget:
		c.fail(a.OverBudget())
	case exchange.EventsCut:
		if !c.isCancelled() {
			c.fail(a.Cut())
		}
	case exchange.EventsDone:
		a.LetGo() // its connection serves the next round, or the next call
		return msg, true
	}
	return nil, false
}

// legacyAnswer maps a 2026-07-28 answer to what a session-era agent
// expects: its own id; a method-not-found is HTTP 200 in the session era
// (a 404 would tell the agent its session is gone); a missing resource is
// -32002 again; a session-era server's refusal makes the era be asked
// again.
func (c *bridgeCall) legacyAnswer(status int, msg []byte) ([]byte, int) {
	mid := c.a.Msg.ID
	if era.ModernRefused(status, msg) {
		c.b.Eras.Forget()
	}
	r := gjson.ParseBytes(msg)
	if !r.IsObject() {
		return wire.AppendError(nil, wire.CodeProxyError, mid, "the upstream answered something that is not JSON-RPC"), fasthttp.StatusBadGateway
	}
	if e := r.Get("error"); e.Exists() {
		code := e.Get("code").Int()
		switch {
		case code == -32602 && c.a.Msg.Method == "resources/read" && e.Get("data.uri").Exists():
			return wire.AppendError(nil, -32002, mid, "Resource not found: "+e.Get("data.uri").String()), fasthttp.StatusOK
		case code == -32021:
			return wire.AppendError(nil, -32600, mid, "The upstream (MCP 2026-07-28) needs a client capability the agent did not declare: "+
				e.Get("message").Str), fasthttp.StatusOK
		}
		if status == fasthttp.StatusNotFound || status == fasthttp.StatusBadRequest {
			status = fasthttp.StatusOK
		}
	}
	id := r.Get("id")
	if !id.Exists() {
		return msg, status
	}
	out := make([]byte, 0, len(msg)+len(mid))
	out = append(out, msg[:id.Index]...)
	out = append(out, mid...)
	return append(out, msg[id.Index+len(id.Raw):]...), status
}

// isInputRequired reports an InputRequiredResult.
func isInputRequired(msg []byte) bool {
	return gjson.GetBytes(msg, "result.resultType").Str == "input_required"
}

// inputAsk is one request of an InputRequiredResult sent to the agent.
type inputAsk struct {
	key string // its key in inputRequests, raw JSON
	id  string // the JSON-RPC id the agent got
	p   *pendingInput
}

// askAgent sends the agent the requests of an InputRequiredResult and
// returns its answers as inputResponses (raw JSON object).
func (c *bridgeCall) askAgent(msg []byte) ([]byte, bool) {
	b, sess := c.b, c.a.Sess
	var asks []inputAsk
	defer func() {
		for _, a := range asks {
			b.inputs.Delete(a.id)
		}
	}()
	ok := true
	gjson.GetBytes(msg, "result.inputRequests").ForEach(func(k, v gjson.Result) bool {
		id := inputID()
		p := &pendingInput{sess: sess, answer: make(chan []byte, 1)}
		b.inputs.Store(id, p)
		asks = append(asks, inputAsk{key: k.Raw, id: id, p: p})
		req := append([]byte(`{"jsonrpc":"2.0","id":`), id...)
		req = append(req, `,"method":`...)
		req = append(req, v.Get("method").Raw...)
		if params := v.Get("params"); params.IsObject() {
			req = append(req, `,"params":`...)
			req = append(req, legacyInputParams(v.Get("method").Str, params, id)...)
		}
		ok = c.st.Event(append(req, '}'))
		return ok
	})
	if !ok {
		return nil, false
	}
	return c.collect(msg, asks)
}

// collect waits for the agent's answers to the input requests and
// returns them as inputResponses.
func (c *bridgeCall) collect(msg []byte, asks []inputAsk) ([]byte, bool) {
	s := c.a.S
	out := []byte{'{'}
	deadline := time.NewTimer(s.Cfg.ResponseTimeout)
	defer deadline.Stop()
	for i, a := range asks {
		var ans []byte
		select {
		case ans = <-a.p.answer:
		case <-deadline.C:
			c.fail(exchange.Failure{Code: wire.CodeUpstreamDown, Msg: "the agent did not answer the upstream's request for input in time"})
			return nil, false
		case <-s.Done:
			return nil, false
		}
		r := gjson.ParseBytes(ans)
		res := r.Get("result")
		if !res.Exists() {
			// 2026-07-28 has no place for an error answer: an elicitation
			// is cancelled, anything else fails the call.
			method := gjson.GetBytes(msg, "result.inputRequests."+gjson.Escape(gjson.Parse(a.key).Str)+".method").Str
			if method != "elicitation/create" {
				c.fail(exchange.Failure{Code: -32603, Msg: "the agent answered the upstream's " + method +
					" request with an error, which MCP 2026-07-28 cannot carry: " + r.Get("error.message").Str})
				return nil, false
			}
			res = gjson.Parse(`{"action":"cancel"}`)
		}
		if i > 0 {
			out = append(out, ',')
		}
		out = append(out, a.key...)
		out = append(out, ':')
		out = append(out, res.Raw...)
	}
	return append(out, '}'), true
}

// legacyInputParams maps the params of a 2026-07-28 input request to the
// session-era request's: a URL elicitation needs an elicitationId there.
func legacyInputParams(method string, params gjson.Result, id string) []byte {
	if method == "elicitation/create" && params.Get("mode").Str == "url" && !params.Get("elicitationId").Exists() {
		raw := params.Raw
		i := strings.LastIndexByte(raw, '}')
		eid := strings.Trim(id, `"`)
		return []byte(raw[:i] + `,"elicitationId":` + strconv.Quote(eid) + raw[i:])
	}
	return []byte(params.Raw)
}
