package held

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/json"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"

	"github.com/mcpheal/mcpheal/classify"
	"github.com/mcpheal/mcpheal/classify/sse"
	"github.com/mcpheal/mcpheal/proxy/internal/conf"
	"github.com/mcpheal/mcpheal/proxy/internal/exchange"
	"github.com/mcpheal/mcpheal/proxy/internal/heal"
	"github.com/mcpheal/mcpheal/proxy/internal/link"
	"github.com/mcpheal/mcpheal/proxy/internal/wire"
	"github.com/mcpheal/mcpheal/session"
	"github.com/mcpheal/mcpheal/upstream"
)

// heldState begins every requestState mcpheal gives an agent for a parked
// call; any other is the server's own (a result of its that asked for
// input) and goes upstream with the agent's retry.
const heldState = "mcpheal."

// gatherInputs is how long a call's answer stream is read on after the
// upstream asked for input, for more it asks at once; maxAsks bounds the
// requests of one InputRequiredResult (the rest come in the next round).
const (
	gatherInputs = 50 * time.Millisecond
	maxAsks      = 32
)

// asideWait is how long a request the upstream sent on a held session's
// GET stream waits for the answer stream of the call it belongs to to
// begin (inject).
const asideWait = 500 * time.Millisecond

// heldCall is one 2026-07-28 agent request on its held session: its
// exchange upstream (an attempt), and its answer, which may come in
// several agent requests: an upstream request for input (sampling,
// elicitation, roots) parks the call, and the agent's retry with its
// inputResponses resumes it on the same upstream answer.
type heldCall struct {
	h       *Route
	a       *exchange.Attempt
	sess    *session.Session        // the held session it went on
	agentID string                  // the raw JSON id of the agent request now answered
	upID    string                  // the raw JSON id the upstream got
	hdr     *fasthttp.RequestHeader // the agent's; a copy once the call outlives its handler
	st      exchange.AgentStream
	// level is the least severity of the log messages the agent asked for
	// (its _meta's logLevel; -1: none). upToken is the progressToken the
	// upstream got, agentToken the one the agent now waits on (a retry
	// has its own).
	level               int
	upToken, agentToken string

	mu    sync.Mutex
	key   string    // in held.calls while the agent waits on it
	asks  []heldIDk // the upstream's requests the agent was asked to answer
	aside [][]byte  // requests the upstream sent on the session's GET stream for this call (inject)
	token string    // requestState, while parked
	timer *time.Timer
	ended bool
	// rewatch: the call was resumed; its stream watches the retry's
	// connection.
	rewatch bool
	// handoff closes when the stream writer that parked the call has
	// returned: the retry's writer starts after it.
	handoff chan struct{}
	// parkedCost is what a parked call holds (its buffers, the upstream's
	// request), counted in the memory budget while parked.
	parkedCost int64
}

// heldIDk is an upstream request for input, sent to the agent as one
// member of an InputRequiredResult.
//
// The keys are mcpheal's (mcpheal-1, mcpheal-2, …): a session-era server
// names none of its requests (docs/eras.md "What the session era cannot
// carry").
type heldIDk struct {
	key  string // its key in inputRequests
	upID string // the raw JSON id the upstream gave it
}

// call sends a 2026-07-28 agent's request on its held session and
// answers it: JSON when the upstream answered JSON, else an event stream
// of the upstream's notifications, ending with the answer or an
// InputRequiredResult.
func (h *Route) call(ctx *fasthttp.RequestCtx, r *exchange.Request) {
	s := h.S
	a := exchange.NewAttempt(s, ctx, r)
	a.Heals = true
	c := &heldCall{h: h, a: a, sess: r.Sess, agentID: strings.Clone(r.Msg.ID), hdr: r.Hdr}
	c.follow(r.Body)
	h.logAll(c, r)
	c.upToken = c.agentToken
	if r.Msg.ID != "" {
		c.upID = h.Up.UpcallID("call")
	}
	h.Up.CopyRequest(r.Hdr, Downgrade(r.Body, c.upID), a.Req)
	stripStateless(&a.Req.Header)
	a.Req.Header.SetBytesK(wire.HdrProtocolVersion, r.Sess.Recipe.ProtocolVersion)
	h.track(c, r.Auth, r.Body)
	a.WatchAgent()
	out := a.Loop()
	if out.Kind == exchange.OutUpstream && out.Class == classify.SessionGone {
		// The session the request healed into was lost too: a
		// session-era agent would start over, this one holds none.
		out = exchange.Outcome{Kind: exchange.OutDown, Why: "the upstream lost the session mcpheal re-created for this request"}
	}
	switch {
	case out.Kind != exchange.OutUpstream:
		if out.Kind == exchange.OutAgentGone {
			c.cancelUpstream()
		}
		f := heldFailure(a.Fail(out))
		r.Outcome(out.Kind, out.Class, f.Code)
		if out.Kind == exchange.OutAgentGone {
			ctx.SetConnectionClose()
		}
		s.Writer().Fail(ctx, &r.Msg, classify.Unknown, f)
		c.finish()
	case !a.Resp.IsStream():
		msg, status := c.modernAnswer(a.Resp.StatusCode(), a.Resp.Body())
		if status == fasthttp.StatusUnauthorized || status == fasthttp.StatusForbidden {
			h.Challenges.Pass(ctx, &a.Resp.Header) // the agent logs in, or asks for more scope
		}
		cls := exchange.ClassOf(status, msg)
		s.Writer().JSON(ctx, &a.Msg, cls, status, msg, nil)
		c.a.Answered(cls, msg)
		c.finish()
	case a.FirstWhole && wire.IsResponse(sse.Data(nil, a.First)) && modernStatus(sse.Data(nil, a.First)) != fasthttp.StatusOK:
		// The stream's first event is the answer, an error 2026-07-28 gives
		// its own status (-32601 404, -32021 400): a JSON answer with it,
		// not a stream already answered 200.
		msg, status := c.modernAnswer(fasthttp.StatusOK, sse.Data(nil, a.First))
		cls := exchange.ClassOf(status, msg)
		s.Writer().JSON(ctx, &a.Msg, cls, status, msg, nil)
		c.a.Answered(cls, msg)
		c.finish()
	default:
		a.Msg.ID, a.Msg.Method, a.Msg.Tool = strings.Clone(a.Msg.ID), strings.Clone(a.Msg.Method), strings.Clone(a.Msg.Tool)
		c.hdr = new(fasthttp.RequestHeader) // the agent's outlives no handler
		r.Hdr.CopyTo(c.hdr)
		a.Ctx, a.R = nil, &exchange.Request{Msg: a.Msg, Sess: r.Sess, Standing: heal.Bound, OwnCredential: true,
			Auth: append([]byte(nil), r.Auth...), Hdr: c.hdr, Tctx: r.Tctx}
		c.streamTo(ctx)
	}
}

// streamTo answers ctx with an event stream that c writes.
// Its request is counted when its answer comes (Writer.Final).
func (c *heldCall) streamTo(ctx *fasthttp.RequestCtx) {
	c.st = exchange.AgentStream{S: c.h.S, Conn: ctx.Conn()}
	c.h.S.Writer().Stream(ctx, &c.a.Msg, nil, classify.Unknown, c.stream)
}

// stream relays the upstream's events to the agent (relay), and ends the
// call unless it is parked for its agent's input.
func (c *heldCall) stream(w *bufio.Writer) {
	a := c.a
	c.st.W = w
	if c.rewatch {
		// A retry: its agent's connection is the one to watch now.
		c.rewatch = false
		a.Watch.Arm(c.st.Conn, a.Resp)
	}
	end, final, parked := c.relay()
	switch end {
	case exchange.EventsDone:
		if parked {
			close(c.handoff)
			return // the agent's retry resumes it (resume)
		}
		a.LetGo() // its connection serves the next call
		a.Answered(c.h.S.Writer().Final(&a.Msg, final), final)
	case exchange.EventsGone:
		c.cancelUpstream()
	case exchange.EventsCut:
		if a.AgentGone() { // the agent closed its connection: how 2026-07-28 cancels
			c.cancelUpstream()
			break
		}
		c.fail(a.Cut())
	case exchange.EventsTooLarge:
		c.fail(exchange.Failure{Code: wire.CodeTooLarge, Msg: "an upstream event passed max_sse_line"})
	case exchange.EventsOverBudget:
		c.fail(a.OverBudget())
	}
	c.finish()
}

// relay writes the upstream's notifications as they come, then its answer
// with the agent's id (final), or, when it asks for input, an
// InputRequiredResult that parks the call (parked). The session era asks
// one request at a time but may send several at once (the Go SDK sends a
// tool's elicitation, sampling and roots concurrently): after a request
// the stream is read on for gatherInputs, and what else it asks in that
// time, or on the session's GET stream (inject), goes to the agent in the
// same result, as 2026-07-28 has it. end is how the events ended.
func (c *heldCall) relay() (end int, final []byte, parked bool) {
	a := c.a
	var asks [][]byte
	tried := false
	gather := func(more ...[]byte) bool {
		asks = append(asks, more...)
		if len(asks) >= maxAsks || a.Resp.SetReadDeadline(time.Now().Add(gatherInputs)) != nil {
			parked, tried = c.park(asks), true
		}
		return tried
	}
	for {
		if more := c.takeAside(); len(more) > 0 {
			a.Resp.TakeWake() // what woke the stream is here
			if gather(more...) {
				break
			}
		}
		end = a.EachEvent(func(data []byte) (bool, bool) {
			switch {
			case wire.IsResponse(data):
				final, _ = c.modernAnswer(fasthttp.StatusOK, data)
				return true, c.st.Event(final)
			case isServerRequest(data):
				if gather(bytes.Clone(data)) {
					return true, parked
				}
				return false, true
			}
			if note := c.notification(data); note != nil {
				return false, c.st.Event(note)
			}
			return false, true
		})
		if end != exchange.EventsQuiet || tried {
			break
		}
		// Quiet: the gathering is over, or the upstream asked on the
		// session's GET stream (inject), which is taken first.
		if c.hasAside() {
			continue
		}
		if len(asks) > 0 {
			parked, tried = c.park(asks), true
			break
		}
		_ = a.Resp.SetReadDeadline(time.Time{}) // woken, and nothing to take
	}
	if len(asks) > 0 {
		_ = a.Resp.SetReadDeadline(time.Time{})
	}
	if tried {
		end = exchange.EventsGone // the agent did not get them: the writer cancels
		if parked {
			end = exchange.EventsDone
		}
	}
	return end, final, parked
}

// inject gives the call a request the upstream sent on its session's GET
// stream while the call was the session's only one in flight (a
// TypeScript SDK server's elicitInput): the agent gets it with the call's
// next InputRequiredResult. Its answer stream may not have begun yet (the
// head of it and the request come on two connections): inject waits for
// it up to asideWait, and reports false when it did not begin (a server
// that sends no head before its first event, as the Go SDK, gets its
// request refused rather than left unanswered) or the call ended.
func (c *heldCall) inject(msg []byte) bool {
	wait := upstream.Backoff{Min: 2 * time.Millisecond, Max: 50 * time.Millisecond}
	until := time.Now().Add(asideWait)
	for {
		switch c.injectNow(msg) {
		case injected:
			return true
		case injectEnded:
			return false
		}
		d := wait.Next()
		if time.Now().Add(d).After(until) || !wire.SleepUnless(d, nil, c.h.S.Done) {
			return false
		}
	}
}

// How injectNow went.
const (
	injected = iota
	injectEnded
	injectNotYet // the call's answer stream has not begun
)

// injectNow is one try of inject.
func (c *heldCall) injectNow(msg []byte) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	// Under c.mu: finish, which releases the attempt, comes after.
	switch {
	case c.ended || len(c.aside) >= maxAsks:
		return injectEnded
	case !c.a.Resp.Wake():
		return injectNotYet
	}
	c.aside = append(c.aside, bytes.Clone(msg))
	return injected
}

// takeAside returns the requests inject gave the call, and forgets them.
func (c *heldCall) takeAside() [][]byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	more := c.aside
	c.aside = nil
	return more
}

// hasAside reports whether inject gave the call requests not yet taken.
func (c *heldCall) hasAside() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.aside) > 0
}

// fail ends the call's stream with mcpheal's error.
func (c *heldCall) fail(f exchange.Failure) {
	c.st.Event(wire.AppendError(nil, f.Code, c.agentID, f.Msg))
}

// finish ends the call: its attempt goes back to the pool.
func (c *heldCall) finish() {
	c.a.Unwatch()
	c.mu.Lock()
	c.ended = true
	key := c.key
	c.key = ""
	c.mu.Unlock()
	if key != "" {
		c.h.calls.CompareAndDelete(key, c)
	}
	c.a.Release()
}

// follow takes what an agent request asks of the call's notifications:
// its log level and progress token.
func (c *heldCall) follow(body []byte) {
	c.level = -1
	if l := gjson.Get(wire.B2s(body), metaLogLevel); l.Type == gjson.String {
		c.level = logSeverity(l.Str)
	}
	c.agentToken = strings.Clone(gjson.Get(wire.B2s(body), "params._meta.progressToken").Raw)
}

// logLevels are MCP's log levels, least severe first.
var logLevels = [...]string{"debug", "info", "notice", "warning", "error", "critical", "alert", "emergency"}

func logSeverity(level string) int {
	for i, l := range logLevels {
		if l == level {
			return i
		}
	}
	return 0
}

// notification returns an upstream notification as the agent gets it, or
// nil when it does not want it: a log message below its level (or any, if
// it asked for none), a progress notification that names the token of the
// retry it now waits on; and nil for what is no JSON-RPC notification at
// all (an event of the TypeScript SDK v1 server's replayed stream has been
// seen to carry {}), which no 2026-07-28 client can read: mcpheal is its
// server, and writes only messages.
func (c *heldCall) notification(msg []byte) []byte {
	r := gjson.Parse(wire.B2s(msg))
	if r.Get("jsonrpc").Str != "2.0" || r.Get("method").Type != gjson.String {
		return nil
	}
	switch r.Get("method").Str {
	case "notifications/message":
		if c.level < 0 || logSeverity(r.Get("params.level").Str) < c.level {
			return nil
		}
	case "notifications/progress":
		tok := r.Get("params.progressToken")
		if tok.Raw == c.upToken && c.agentToken != "" && c.agentToken != c.upToken {
			out := make([]byte, 0, len(msg)+len(c.agentToken))
			out = append(out, msg[:tok.Index]...)
			out = append(out, c.agentToken...)
			return append(out, msg[tok.Index+len(tok.Raw):]...)
		}
	}
	return msg
}

// modernAnswer maps a session-era answer to what a 2026-07-28 agent
// expects: its own id, and never a 404 (it has no session to lose). The
// message returned is a copy; nil for an empty body.
func (c *heldCall) modernAnswer(status int, msg []byte) ([]byte, int) {
	if status == fasthttp.StatusNotFound {
		status = fasthttp.StatusBadGateway
		if gjson.GetBytes(msg, "error").Exists() {
			status = fasthttp.StatusOK
		}
	}
	if len(msg) == 0 {
		return nil, status
	}
	if !gjson.ValidBytes(msg) {
		// A session-era server's text (the Go SDK's 400 "JSON RPC not
		// handled"): a 2026-07-28 agent gets a JSON-RPC error.
		code, said := -32603, "the upstream answered "+strconv.Itoa(status)+": "+strings.TrimSpace(string(msg[:min(len(msg), 512)]))
		if status/100 == 4 && unknownMethodText(msg) {
			code, status = -32601, fasthttp.StatusNotFound
		}
		b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": json.RawMessage(conf.OrStr(c.agentID, "null")),
			"error": map[string]any{"code": code, "message": said}})
		return b, status
	}
	if st := modernStatus(msg); st != fasthttp.StatusOK {
		status = st
	}
	return ModernMessage(msg, c.agentID, cacheable(c.a.Msg.Method)), status
}

// modernStatus is the HTTP status 2026-07-28 gives an answer msg: 404 for
// -32601 (an unknown method), 400 for -32021 (a capability the agent did
// not declare), else 200.
func modernStatus(msg []byte) int {
	switch gjson.GetBytes(msg, "error.code").Int() {
	case -32601:
		return fasthttp.StatusNotFound
	case -32021:
		return fasthttp.StatusBadRequest
	}
	return fasthttp.StatusOK
}

// unknownMethodText reports a server's plain-text refusal of a method it
// does not know.
func unknownMethodText(b []byte) bool {
	t := bytes.ToLower(b[:min(len(b), 512)])
	for _, s := range []string{"not handled", "method not found", "unknown method", "unsupported"} {
		if bytes.Contains(t, []byte(s)) {
			return true
		}
	}
	return false
}

// cacheable reports the methods whose 2026-07-28 results say how long a
// client may keep them (ttlMs, cacheScope).
func cacheable(method string) bool {
	switch method {
	case "tools/list", "prompts/list", "resources/list", "resources/templates/list", "resources/read":
		return true
	}
	return false
}

// ModernMessage returns a copy of a session-era JSON-RPC response as
// MCP 2026-07-28 has it: with id agentID (unless empty), and its result's
// resultType, which every 2026-07-28 result carries ("complete", or
// "input_required" for one that carries inputRequests); a
// cacheable result also says it may not be kept (ttlMs 0, cacheScope
// private: a session-era server promised nothing).
func ModernMessage(msg []byte, agentID string, cacheable bool) []byte {
	r := gjson.Parse(wire.B2s(msg))
	id, res := r.Get("id"), r.Get("result")
	type splice struct {
		at, cut int
		with    string
	}
	var edits []splice
	if id.Exists() && id.Index > 0 && agentID != "" {
		edits = append(edits, splice{id.Index, len(id.Raw), agentID})
	}
	if res.IsObject() && res.Index > 0 {
		var with string
		switch {
		case res.Get("resultType").Exists():
		case res.Get("inputRequests").IsObject():
			// A server that asks for input the 2026-07-28 way in a
			// session-era result (the Go SDK's second round): it is one.
			with = `"resultType":"input_required",`
		default:
			with = `"resultType":"complete",`
		}
		if cacheable && !res.Get("ttlMs").Exists() && !res.Get("cacheScope").Exists() {
			with += `"ttlMs":0,"cacheScope":"private",`
		}
		if with != "" && !hasMembers(res.Raw) {
			with = with[:len(with)-1]
		}
		if with != "" {
			edits = append(edits, splice{res.Index + 1, 0, with})
		}
	}
	if len(edits) == 2 && edits[1].at < edits[0].at {
		edits[0], edits[1] = edits[1], edits[0]
	}
	out := make([]byte, 0, len(msg)+len(agentID)+32)
	pos := 0
	for _, e := range edits {
		out = append(out, msg[pos:e.at]...)
		out = append(out, e.with...)
		pos = e.at + e.cut
	}
	return append(out, msg[pos:]...)
}

// isServerRequest reports a JSON-RPC request (method and id) from the
// upstream: it asks the client for something.
func isServerRequest(msg []byte) bool {
	r := gjson.Parse(wire.B2s(msg))
	return r.Get("method").Type == gjson.String && r.Get("id").Exists()
}

// park ends the agent's answer with an InputRequiredResult carrying the
// upstream's requests, and keeps the upstream's answer open for the
// agent's retry, at most response_timeout. It reports whether the agent
// got it.
func (c *heldCall) park(reqs [][]byte) bool {
	h, a := c.h, c.a
	cost := int64(cap(a.Buf)+cap(a.Out)+a.Rw.Fr.Buffered()) + 4<<10
	for _, req := range reqs {
		cost += int64(len(req))
	}
	if !a.S.Mem.Take(cost) {
		c.fail(exchange.Failure{Code: wire.CodeBudget, Msg: "the upstream asked the agent for input, and mcpheal's memory_budget " +
			"has no room to hold the call open for the answer; " + a.Msg.Method + " may or may not have run"})
		return false // the writer cancels and ends the call
	}
	out := append([]byte(`{"jsonrpc":"2.0","id":`), c.agentID...)
	out = append(out, `,"result":{"resultType":"input_required","inputRequests":{`...)
	c.mu.Lock()
	c.parkedCost = cost
	for i, req := range reqs {
		r := gjson.Parse(wire.B2s(req))
		ask := heldIDk{key: "mcpheal-" + strconv.Itoa(len(c.asks)+1), upID: strings.Clone(r.Get("id").Raw)}
		c.asks = append(c.asks, ask)
		if i > 0 {
			out = append(out, ',')
		}
		out = strconv.AppendQuote(out, ask.key)
		out = append(out, `:{"method":`...)
		out = append(out, r.Get("method").Raw...)
		if p := r.Get("params"); p.IsObject() {
			out = append(out, `,"params":`...)
			out = append(out, p.Raw...)
		}
		out = append(out, '}')
	}
	c.token = heldState + rand.Text()
	token := c.token
	c.handoff = make(chan struct{})
	c.mu.Unlock()
	out = append(out, `},"requestState":`...)
	out = strconv.AppendQuote(out, token)
	out = append(out, "}}"...)
	// The agent's connection is its own again: the watch ends before
	// fasthttp reads it.
	a.Unwatch()
	h.untrack(c)
	h.parked.Store(token, c)
	a.S.Writer().Count(&a.Msg, classify.OK) // the call's stream carries its InputRequiredResult
	if !c.st.Event(out) {
		if h.parked.CompareAndDelete(token, c) {
			c.unpark()
		}
		return false // the writer cancels and ends the call
	}
	// The wait starts once the agent has the request: an expiry may end
	// the call only after this writer is done with it. A retry that came
	// first waits for this writer to return (handoff), and stops it.
	c.mu.Lock()
	c.timer = time.AfterFunc(a.S.Cfg.ResponseTimeout, func() { h.expire(token, c) })
	c.mu.Unlock()
	return true
}

// unpark stops a call's wait for its agent's retry, which it won.
func (c *heldCall) unpark() {
	c.mu.Lock()
	if c.timer != nil {
		c.timer.Stop()
	}
	cost := c.parkedCost
	c.parkedCost = 0
	c.mu.Unlock()
	c.h.S.Mem.Give(cost)
}

// expire gives up on a parked call whose agent did not come back.
func (h *Route) expire(token string, c *heldCall) {
	if !h.parked.CompareAndDelete(token, c) {
		return
	}
	c.unpark()
	c.cancelUpstream()
	c.finish()
}

// resume takes a 2026-07-28 agent's retry of a parked call: its
// inputResponses answer the upstream's requests, and the call's answer
// goes on, as an event stream, to this request.
func (h *Route) resume(ctx *fasthttp.RequestCtx, r *exchange.Request) {
	s := h.S
	token := gjson.GetBytes(r.Body, "params.requestState").Str
	v, ok := h.parked.Load(token)
	var c *heldCall
	if ok {
		c = v.(*heldCall)
		// Only the session (the credential and client) that was asked may
		// answer, and only for the same request.
		ok = c.a.Sess == r.Sess && c.a.Msg.Method == r.Msg.Method && c.a.Msg.Tool == r.Msg.Tool &&
			h.parked.CompareAndDelete(token, c)
	}
	if !ok {
		s.Writer().Fail(ctx, &r.Msg, classify.Protocol, exchange.Failure{Status: fasthttp.StatusOK, Code: -32602,
			Msg: "Invalid params: requestState names no call of this agent waiting for input (answered, or given up after response_timeout)"})
		return
	}
	<-c.handoff
	c.unpark()
	c.mu.Lock()
	asks := c.asks
	c.asks, c.token = nil, ""
	c.mu.Unlock()
	if !c.answerInputs(r, asks) {
		c.cancelUpstream()
		c.finish()
		s.Writer().Fail(ctx, &r.Msg, classify.TransportDead, exchange.Failure{Status: fasthttp.StatusOK, Code: wire.CodeMaybeExecuted,
			Msg: "the upstream did not take the agent's input; " + r.Msg.Method + " may or may not have run and was not retried"})
		return
	}
	c.agentID = strings.Clone(r.Msg.ID)
	c.follow(r.Body)
	h.track(c, r.Auth, r.Body)
	c.rewatch = true
	c.streamTo(ctx)
}

// heldCallKey names an agent request in held.calls: by its agent (its
// credential and the client its _meta names, the held key: heldKeyOf) and
// its id. A notifications/cancelled names its call the same way, so that
// another agent under the same credential (none, or a shared inbound
// token) cannot end a call or a listen that is not its own.
func heldCallKey(auth, body []byte, rawID string) string {
	k := KeyOf(auth, body)
	return string(k[:16]) + rawID
}

// answerInputs answers the upstream's requests for input with the retry's
// inputResponses (an error for one it lacks), each a POST on the session.
// It reports false when the upstream did not take one.
func (c *heldCall) answerInputs(r *exchange.Request, asks []heldIDk) bool {
	s := c.h.S
	inputs := gjson.GetBytes(r.Body, "params.inputResponses")
	up, gen := r.Sess.Current()
	for _, ask := range asks {
		body := append([]byte(`{"jsonrpc":"2.0","id":`), ask.upID...)
		if res := inputs.Get(gjson.Escape(ask.key)); res.IsObject() {
			body = append(body, `,"result":`...)
			body = append(body, res.Raw...)
		} else {
			body = append(body, `,"error":{"code":-32603,"message":"the agent gave no answer to this request"}`...)
		}
		body = append(body, '}')
		// The upstream's own id again (a session healed into numbers its
		// requests' ids apart: events.go); not live when the session that
		// asked is gone.
		restored, live := wire.AnswerRoute(body, ask.upID, gen)
		if !live {
			return false
		}
		if restored != nil {
			body = restored
		}
		rep, err := c.h.Up.Call(&link.Upcall{Hdr: r.Hdr, Session: up, Version: r.Sess.Recipe.ProtocolVersion, Body: body,
			Deadline: time.Now().Add(s.Cfg.ResponseTimeout), Ctx: r.Tctx, Name: "response"})
		if err != nil || rep.Status >= 300 {
			return false
		}
	}
	return true
}

// track makes the call cancellable by its agent (notifications/cancelled
// naming its id).
func (h *Route) track(c *heldCall, auth, body []byte) {
	if c.agentID == "" {
		return
	}
	c.mu.Lock()
	c.key = heldCallKey(auth, body, c.agentID)
	c.mu.Unlock()
	h.calls.Store(c.key, c)
}

// untrack is the end of what track did.
func (h *Route) untrack(c *heldCall) {
	c.mu.Lock()
	key := c.key
	c.key = ""
	c.mu.Unlock()
	if key != "" {
		h.calls.CompareAndDelete(key, c)
	}
}

// cancel ends the call that an agent's notifications/cancelled names: the
// upstream is told, and the exchange ends as if the agent had gone.
func (h *Route) cancel(r *exchange.Request) {
	h.S.Writer().Count(&r.Msg, classify.OK)
	id := gjson.GetBytes(r.Body, "params.requestId").Raw
	if v, ok := h.calls.Load(heldCallKey(r.Auth, r.Body, id)); ok {
		v.(heldCancel).cancelByAgent()
	}
}

// cancelByAgent ends the call the agent cancelled.
func (c *heldCall) cancelByAgent() {
	c.cancelUpstream()
	c.mu.Lock()
	if !c.ended {
		c.a.Abandon()
	}
	c.mu.Unlock()
}

// cancelUpstream tells the upstream the agent gave up on the call
// (notifications/cancelled), once, in the background.
func (c *heldCall) cancelUpstream() {
	c.mu.Lock()
	up := c.upID
	c.upID = "" // once
	c.mu.Unlock()
	s := c.h.S
	if up == "" || !s.Bg.Add(1) {
		return
	}
	sess := c.a.Sess
	hdr := new(fasthttp.RequestHeader)
	c.hdr.CopyTo(hdr)
	go func() {
		defer s.Bg.Done()
		cur, _ := sess.Current()
		body := `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":` + up +
			`,"reason":"the agent gave up on the request"}}`
		_, _ = c.h.Up.Call(&link.Upcall{Hdr: hdr, Session: cur, Version: sess.Recipe.ProtocolVersion, Body: []byte(body),
			Deadline: time.Now().Add(5 * time.Second), Name: "notifications/cancelled"})
	}()
}

// hasMembers reports whether a raw JSON object has a member.
func hasMembers(obj string) bool {
	for i := 1; i < len(obj); i++ {
		switch obj[i] {
		case ' ', '\t', '\n', '\r':
		case '}':
			return false
		default:
			return true
		}
	}
	return false
}
