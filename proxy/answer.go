package proxy

import (
	"errors"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"

	"github.com/mcpheal/mcpheal/classify"
	"github.com/mcpheal/mcpheal/classify/sse"
	"github.com/mcpheal/mcpheal/session"
	"github.com/mcpheal/mcpheal/upstream"
)

// outcome is how an agent's request ends: the one answer it gets.
type outcome struct {
	kind  outcomeKind
	class classify.Class // of the upstream's answer (outUpstream, outRefused)
	err   error          // why the exchange failed (outRefused, outTooLarge, outCredential), for the log
	why   string         // outDown: what was unreachable
	wait  time.Duration  // outBreakerOpen: until the breaker half-opens
}

type outcomeKind int

const (
	// outUpstream: the upstream's answer, passed through (docs/healing.md "What it
	// does with each answer").
	outUpstream outcomeKind = iota
	// outRefused: -32011, the request may have run and was not retried.
	outRefused
	// outDown: 503 + Retry-After, the upstream stayed unreachable for the
	// heal budget; the agent's session stays valid.
	outDown
	// outBreakerOpen: 503 + Retry-After at once, the circuit is open.
	outBreakerOpen
	// outGone: 404 on the client id, the upstream refused the recorded
	// initialize; the agent's SDK starts over.
	outGone
	// outAccepted: 202 for a notification or response addressed to a dead
	// upstream session.
	outAccepted
	// outEndResumption: an empty event stream for a GET resuming a dead
	// session's events.
	outEndResumption
	// outTooLarge: 502, the upstream's answer passed max_answer; or 503,
	// it passed the memory budget as it was read.
	outTooLarge
	// outAgentGone: the agent closed its connection while its request
	// waited; the answer written goes nowhere (unless the agent only
	// half-closed it).
	outAgentGone
	// outCredential: -32018, mcpheal could not get the upstream
	// credential it owns; nothing was sent.
	outCredential
	// outFull: 429 or 503 -32015, a new session the caps or the memory
	// budget have no room for (err says which).
	outFull
	// outInvalid: 502 -32020, an upstream answer mcpheal cannot carry
	// (err says why).
	outInvalid
	// outHealAuth: the upstream's 401 or 403 (and its challenge) to the
	// recorded initialize under this request's credential; the session
	// stays.
	outHealAuth
	// outBusy: the upstream's 429 or 503 at capacity to the recorded
	// initialize, after waiting out its Retry-After once if that fit: its
	// status, words and Retry-After; the session stays.
	outBusy
)

// failure is mcpheal's own answer for an outcome that is not the
// upstream's: the HTTP status (for a JSON answer), the JSON-RPC error, and
// Retry-After (0: none). It is the one table of mcpheal's errors (docs/observability.md
// "Errors mcpheal answers itself"), for every route, JSON or SSE.
type failure struct {
	status, code int
	msg          string
	retryAfter   int
	challenge    string // WWW-Authenticate, for a 401
}

// fail turns out into mcpheal's error, counting and logging it once.
func (a *attempt) fail(out outcome) failure {
	c, m := a.s.count, &a.msg
	switch out.kind {
	case outRefused:
		c.replaysRefused.Add(1)
		c.request(m, out.class)
		return a.refusal(out.class, out.err)
	case outDown:
		c.upstreamDown.Add(1)
		c.request(m, classify.TransportDead)
		return failure{status: fasthttp.StatusServiceUnavailable, code: codeUpstreamDown, msg: out.why + ": " + a.s.link.up.Origin(), retryAfter: 1}
	case outBreakerOpen:
		c.upstreamDown.Add(1)
		c.request(m, classify.TransportDead)
		return failure{status: fasthttp.StatusServiceUnavailable, code: codeUpstreamDown, msg: "upstream " + a.s.cfg.Name +
			" unavailable (circuit breaker open): " + a.s.link.up.Origin(), retryAfter: int((out.wait + time.Second - 1) / time.Second)}
	case outGone:
		c.request(m, classify.SessionGone)
		return failure{status: fasthttp.StatusNotFound, code: codeSessionNotFound, msg: "Session not found"}
	case outTooLarge:
		c.request(m, out.class)
		if errors.Is(out.err, upstream.ErrOverBudget) {
			a.s.log.Warn().Int("bytes", len(a.resp.Body())).Int64("budget", a.s.mem.limit).Msg("answer not buffered: memory budget")
			return failure{status: fasthttp.StatusServiceUnavailable, code: codeBudget, msg: "upstream answer not relayed (at least " +
				strconv.Itoa(len(a.resp.Body())) + " bytes): mcpheal's memory_budget is reached; retry later", retryAfter: 1}
		}
		a.s.log.Warn().Str(logMethod, logText(m.method)).Str(logTool, logText(m.tool)).Err(out.err).
			Msg("upstream answer too large; not relayed")
		return failure{status: fasthttp.StatusBadGateway, code: codeTooLarge, msg: "upstream answer larger than mcpheal's max_answer limit (" + out.err.Error() + ")"}
	case outCredential:
		c.request(m, classify.Auth)
		var ce *credentialError
		if errors.As(out.err, &ce) && ce.refused() {
			// Only the operator can mend it: no Retry-After.
			return failure{status: fasthttp.StatusBadGateway, code: codeCredential, msg: "mcpheal could not get its credential for upstream " +
				a.s.cfg.Name + ": " + ce.err.Error() + "; " + m.method + " was not sent"}
		}
		return failure{status: fasthttp.StatusServiceUnavailable, code: codeCredential, msg: "mcpheal could not get its credential for upstream " +
			a.s.cfg.Name + " (" + errorText(out.err) + "); " + m.method + " was not sent; retry later", retryAfter: 1}
	case outFull:
		c.request(m, classify.OK)
		return admissionFailure(out.err)
	case outHealAuth:
		c.request(m, classify.Auth)
		he := out.err.(*healAuthError)
		if a.s.link.ownsAuthorization() && a.s.cfg.Credentials != nil {
			return failure{status: fasthttp.StatusBadGateway, code: codeCredential, msg: "the upstream refused mcpheal's own credential " +
				"while re-creating the session (" + strconv.Itoa(he.status) + ")"}
		}
		return failure{status: he.status, code: codeUnauthorized, msg: "the upstream refused this request's credential while re-creating " +
			"the session (" + strconv.Itoa(he.status) + "); the session stays valid", challenge: string(a.s.challenges.own(a.r.hdr, []byte(he.challenge)))}
	case outBusy:
		c.request(m, classify.Busy)
		be := out.err.(*busyError)
		code, words := codeUpstreamDown, "it gave no reason"
		if e := gjson.GetBytes(be.msg, "error"); e.IsObject() {
			words = strconv.Quote(e.Get("message").Str)
			if c := e.Get("code").Int(); c != 0 {
				code = int(c)
			}
		}
		return failure{status: be.status, code: code, msg: "the upstream is at capacity and did not re-create the session (" +
			strconv.Itoa(be.status) + ", " + words + "); " + m.method + " was not sent; the session stays valid; retry later",
			retryAfter: max(int((be.wait+time.Second-1)/time.Second), 1)}
	case outInvalid:
		c.request(m, classify.Protocol)
		return failure{status: fasthttp.StatusBadGateway, code: codeUpstreamInvalid, msg: "the upstream's answer to " + m.method +
			" cannot be used: " + out.err.Error()}
	case outAgentGone:
		return failure{status: fasthttp.StatusOK, code: codeMaybeExecuted, msg: "the agent closed its connection while " + m.method +
			" waited for the upstream; mcpheal ended the exchange, and the request may or may not have run"}
	}
	return failure{status: fasthttp.StatusBadGateway, code: codeProxyError, msg: "mcpheal internal error"}
}

// admissionFailure is the answer to a new session that the store's caps
// or the memory budget have no room for.
func admissionFailure(err error) failure {
	switch {
	case errors.Is(err, session.ErrCredentialFull):
		return failure{status: fasthttp.StatusTooManyRequests, code: codeTooMany, retryAfter: 10,
			msg: "Too many sessions for this credential (max_sessions_per_credential); retry later"}
	case errors.Is(err, errBudget):
		return failure{status: fasthttp.StatusServiceUnavailable, code: codeTooMany, retryAfter: 10,
			msg: "Too many sessions: mcpheal's memory_budget for this upstream is reached; retry later"}
	}
	return failure{status: fasthttp.StatusServiceUnavailable, code: codeTooMany, retryAfter: 10,
		msg: "Too many sessions: mcpheal's session cap (max_sessions) is reached; retry later"}
}

// writeFailure writes mcpheal's error f as the JSON answer to m, with
// the status agentStatus gives it.
func writeFailure(ctx *fasthttp.RequestCtx, m *message, f failure) {
	status := agentStatus(m, f.status)
	if status == fasthttp.StatusAccepted {
		ctx.Response.Reset()
		ctx.SetStatusCode(status)
		return
	}
	writeError(ctx, status, f.code, m.idOrNull(), f.msg)
	if f.retryAfter > 0 {
		ctx.Response.Header.Set("Retry-After", strconv.Itoa(f.retryAfter))
	}
	if f.challenge != "" {
		ctx.Response.Header.Set("WWW-Authenticate", f.challenge)
	}
}

// agentStatus is the HTTP status that mcpheal's own answer of the given
// status goes to the agent with (docs/observability.md "Errors mcpheal
// answers itself"). An operational failure (the upstream down, the breaker
// open, a cap or the memory budget reached, an answer mcpheal could not
// carry: a 5xx or a 429) to a JSON-RPC request goes as HTTP 200 with its
// JSON-RPC error and Retry-After, because that is the one answer every
// real client surfaces to its caller at once: the MCP Python SDK 1.x
// (Hermes' client) raises on any other status inside its transport task,
// where the pending call is never answered and waits for its own timeout.
// The same failure for a notification or a response is 202: it is
// dropped, as MCP's rule for a notification to a dead session has it,
// because that SDK tears its whole transport down on anything else. A GET
// stream, a refusal of the agent's own input (400, 413, …), a credential
// challenge (401, 403) and a session the agent must start again (404)
// keep their status.
func agentStatus(m *message, status int) int {
	if status < 500 && status != fasthttp.StatusTooManyRequests || m.get {
		return status
	}
	if m.isRequest() || m.batch {
		return fasthttp.StatusOK
	}
	return fasthttp.StatusAccepted
}

// cut is the error that ends an SSE answer whose upstream stream ended
// before its response: the request is safe to send again (-32010), or it
// may have run and was not (-32011).
func (a *attempt) cut() failure {
	if a.replaySafe {
		return failure{code: codeUpstreamDown, msg: "upstream connection lost before the answer; " + a.msg.method + " is safe to retry"}
	}
	a.s.count.replaysRefused.Add(1)
	return failure{code: codeMaybeExecuted, msg: (*upstreamStream)(a).ended() + ", after " + a.msg.method +
		" was sent; it may or may not have run and was not retried"}
}

// overBudgetEvent is the error that ends an answer stream whose next event
// mcpheal would have to hold whole past memory_budget (holdMeter). The
// request ran, or may have: it is not sent again.
func overBudgetEvent(a *attempt) failure {
	a.s.log.Warn().Str(logMethod, logText(a.msg.method)).Int64("budget", a.s.mem.limit).
		Msg("answer stream cut: an event to hold whole would pass the memory budget")
	return failure{code: codeBudget, msg: "an upstream event of " + a.msg.method + "'s answer would pass mcpheal's " +
		"memory_budget held whole; the answer was cut, and the request was not sent again"}
}

// errorText is err's message for an agent: the credential error's own
// (never a secret: upstream.TokenError keeps only status and code).
func errorText(err error) string {
	var ce *credentialError
	if errors.As(err, &ce) {
		return ce.err.Error()
	}
	return err.Error()
}

// answer writes the agent's answer for out and counts it. It reports
// whether the answer is a body that now owns a.
func (a *attempt) answer(out outcome) bool {
	switch out.kind {
	case outUpstream:
		a.s.count.request(&a.msg, out.class)
		a.r.outcome(outUpstream, out.class, 0)
		if out.class == classify.OK && a.sess != nil {
			a.accepted()
		}
		if out.class == classify.Busy && a.resp.IsStream() {
			// A busy server's words as an event stream it may hold open:
			// they are its first event, given as the JSON answer they are.
			busyRetryAfter(&a.ctx.Response.Header, &a.resp.Header)
			writeJSONAnswer(a.ctx, a.resp.StatusCode(), sse.Data(nil, a.first), a.sess, a.s.mem)
			return false
		}
		return a.respond()
	case outAccepted:
		a.s.count.request(&a.msg, classify.OK)
		a.ctx.SetStatusCode(fasthttp.StatusAccepted)
		return false
	case outEndResumption:
		a.s.count.request(&a.msg, classify.OK)
		endResumption(a.ctx)
		return false
	case outAgentGone:
		a.ctx.SetConnectionClose()
	}
	if a.sess == nil {
		a.s.link.dropMinted(a.resp) // an answer not passed on: a session it opened is nobody's
	}
	f := a.fail(out)
	a.r.outcome(out.kind, out.class, f.code)
	if out.kind == outRefused && a.streamBegan() {
		// The upstream's event stream began (a priming event, retry:,
		// comments) and ended before its answer: the agent gets what came
		// and mcpheal's error as its last event, as it would get the
		// stream itself directly, and the retry: it carried with it.
		a.respondHead()
		a.out = sse.AppendEvent(a.out, "message", appendError(nil, f.code, a.msg.idOrNull(), f.msg))
		a.ctx.Response.SetBody(a.out)
		a.s.count.bytesOut.Add(uint64(len(a.out)))
		return false
	}
	writeFailure(a.ctx, &a.msg, f)
	return false
}

// streamBegan reports whether the answer in a.resp is a POST's event
// stream that the upstream began with status 200 and events (a.out).
func (a *attempt) streamBegan() bool {
	return !a.msg.get && len(a.out) > 0 && (a.head != nil || a.resp.IsStream() && a.resp.StatusCode() == fasthttp.StatusOK)
}

// refusal is the answer to an ambiguous failure of a request that is
// unsafe to run twice. HTTP 200 keeps the agent's transport alive (the
// Python SDK tears its transport down on other 4xx/5xx); the JSON-RPC
// error fails the call.
func (a *attempt) refusal(cls classify.Class, err error) failure {
	cause := "the upstream connection was lost"
	switch {
	case cls == classify.Timeout:
		cause = "the upstream did not answer in time"
	case err == nil && (a.resp.IsStream() || a.head != nil):
		cause = (*upstreamStream)(a).ended()
	case err == nil:
		cause = "the upstream answered " + strconv.Itoa(a.resp.StatusCode()) + " (a gateway's error, not the server's refusal)"
	}
	a.s.log.Warn().Str(logMethod, logText(a.msg.method)).Str(logTool, logText(a.msg.tool)).Stringer(logClass, cls).
		Err(err).Str("cause", cause).Msg("not replayed: the request may have run")
	return failure{status: fasthttp.StatusOK, code: codeMaybeExecuted, msg: cause + " after " + a.msg.method +
		" was sent; it may or may not have run and was not retried"}
}

// answered counts the answer a route translated for its agent (msg, with
// status) and does what an accepted request does on the session (a
// rotated credential moves; a tools/list teaches which tools are
// replay-safe).
func (a *attempt) answered(msg []byte, status int) {
	cls := classify.Classify(status, mimeJSON, msg)
	a.s.count.request(&a.msg, cls)
	if cls == classify.OK {
		a.accepted()
		if a.msg.method == "tools/list" {
			learnTools(a.sess, msg)
		}
	}
}

// accepted runs when the upstream accepted the request on the session: it
// records the journal entry the request made, and moves the session to
// the request's credential when it came under a rotated one (docs/security.md
// "Security": the upstream is the judge).
func (a *attempt) accepted() {
	if !a.msg.get && a.msg.isRequest() && a.msg.method != "initialize" {
		// The upstream took a call beyond the initialize: admission keeps
		// the session (a flood of bare initializes only displaces itself).
		a.s.sessions.store.Used(a.sess)
	}
	if a.r.journal != (session.JournalChange{}) {
		a.s.sessions.journal(a.sess, a.r.journal, a.r.reserved)
		a.r.journal, a.r.reserved = session.JournalChange{}, 0
	}
	if a.r.standing == rotating || (!a.r.ownCredential && !a.s.link.ownsAuthorization()) {
		// Another principal the upstream accepted, or a new token of the
		// session's (a renewed JWT): the session's own work goes on with
		// it. Without an agent credential to forward (mcpheal owns it)
		// there is none to keep.
		a.s.sessions.rebind(a.sess, a.r.auth, &a.req.Header)
		a.r.standing, a.r.ownCredential = bound, true
	}
}

// respond writes the upstream answer to the agent: status and headers
// (hop-by-hop dropped, every session id copy replaced), then the body whole
// or as a stream relayed event by event. It reports whether a stream now
// owns a.resp.
func (a *attempt) respond() bool {
	s, ctx, r := a.s, a.ctx, a.resp
	a.respondHead()
	if a.readWhole {
		// An SSE answer read up to its response (initializeAnswer): the
		// events up to it are the answer.
		ctx.Response.SetBody(a.out)
		s.count.bytesOut.Add(uint64(len(a.out)))
		return false
	}
	if !r.IsStream() {
		if a.msg.method == "tools/list" && a.sess != nil {
			learnTools(a.sess, r.Body())
		}
		s.count.bytesOut.Add(uint64(len(r.Body())))
		if !a.msg.get {
			// Written from the upstream's buffer, never copied; the budget
			// charge it took as it was read (forward: SetBudget) stays
			// until fasthttp has written it, or the agent has gone, and
			// calls jsonBody.Close. write_timeout bounds that wait.
			ctx.Response.SetBodyStream((*jsonBody)(a), len(r.Body()))
			return true
		}
		// A GET's JSON answer (a refusal) is copied, since its caller
		// releases a.resp at once; the copy and the upstream's are
		// counted until the handler ends.
		n := 2 * int64(len(r.Body()))
		if !s.mem.take(n) {
			writeFailure(ctx, &a.msg, a.fail(outcome{kind: outTooLarge, class: classify.Protocol, err: upstream.ErrOverBudget}))
			return false
		}
		a.charged = n
		ctx.Response.SetBody(r.Body())
		return false
	}
	ctx.Response.Header.Set("X-Accel-Buffering", "no")
	if a.msg.get && a.sess != nil && r.StatusCode() == fasthttp.StatusOK {
		return true // serveStream holds this stream open across heals
	}
	answered := !a.msg.get && a.firstWhole && isResponse(sse.Data(nil, a.first))
	var err error
	if a.out, err = a.rw.startStream(a.out); err != nil {
		a.out = a.settle(a.out, err, nil)
	}
	// A tools/list response framed whole by the peek goes out with a.out
	// before the relay reads again: learn its tools now, or the agent's
	// next call could overtake them.
	a.learn()
	if answered && a.finish() {
		// The answer is complete: one buffered write, no chunking.
		a.learn()
		ctx.Response.SetBody(a.out)
		s.count.bytesOut.Add(uint64(len(a.out)))
		return false
	}
	a.outPos, a.conn = 0, ctx.Conn()
	if a.rw.own != 0 {
		// The agent may come back for it: keep what it is sent, and let a
		// dropped connection end the relay's writes, not the call.
		a.log = s.answers.open(a)
		a.log.append(a.out)
		a.unwatch()
	}
	ctx.Response.SetBodyStream((*sseBody)(a), -1)
	return true
}

// respondHead writes the upstream answer's status and headers to the
// agent: hop-by-hop ones dropped, every session id copy replaced.
func (a *attempt) respondHead() {
	ctx, h := a.ctx, &a.resp.Header
	if a.head != nil {
		h = a.head // resumed: the stream's own head, not the resuming GET's
	}
	ctx.Response.Reset()
	h.CopyTo(&ctx.Response.Header)
	// The upstream id never leaks: a sole copy is overwritten in place by
	// SetBytesK below, more than one are all deleted first.
	stripResponseHeader(h, &ctx.Response.Header, a.sess != nil)
	if a.sess != nil {
		ctx.Response.Header.SetBytesK(hdrSessionID, string(a.sess.ID))
	} else {
		a.s.link.dropMinted(a.resp)
	}
	a.s.challenges.pass(ctx, h)
	if st := h.StatusCode(); st == fasthttp.StatusTooManyRequests || st == fasthttp.StatusServiceUnavailable {
		busyRetryAfter(&ctx.Response.Header, h) // a busy upstream's answer (decide)
	}
}

// busyRetryAfter gives the agent of a busy upstream's answer the
// upstream's Retry-After, or 1 s when it named none: an agent is told when
// to come back.
func busyRetryAfter(dst, up *fasthttp.ResponseHeader) {
	if v := up.Peek("Retry-After"); len(v) > 0 {
		dst.SetBytesV("Retry-After", v)
		return
	}
	dst.Set("Retry-After", "1")
}

// learn learns the tools of a tools/list answer whose response event has
// passed through the relay.
func (a *attempt) learn() {
	if a.rw.response != nil {
		learnTools(a.sess, a.rw.response)
		a.rw.response = nil
	}
}

// finishWait bounds finish's reads, which only read what has already
// arrived (and the rest of a chunk that arrived in part).
const finishWait = 20 * time.Millisecond

// endWait is how long finish waits for more of an SSE answer whose
// response has passed: servers write the stream's end right after the
// response (the Go SDK in one more write; the TypeScript SDK v1's arrives
// with the response itself), so it is almost always on its way. Waiting lets the answer go out as one buffered
// write instead of chunks; a stream that stays open only costs its agent
// endWait, then is relayed as it comes.
const endWait = 2 * time.Millisecond

// finish reads what has arrived of an SSE answer whose response has passed
// (a server SHOULD end the stream after it, MCP 2025-11-25 §Sending
// Messages to the Server), waiting up to endWait for the first of it. It
// reports whether that included the stream's end: the answer then goes out
// as one buffered write. What has not arrived is streamed.
func (a *attempt) finish() bool {
	r := a.resp
	if !r.Arrived(endWait) || r.SetReadDeadline(time.Now().Add(finishWait)) != nil {
		return false
	}
	buf := a.readBuf()
	for first := true; len(a.out) < peekLimit && (first || r.Buffered() > 0 || r.Complete()); first = false {
		n, err := r.Read(buf)
		// A read that times out here stopped inside the chunked framing
		// and cannot go on: the answer ends with what came. Its response
		// has passed, so the agent loses at most a trailing notification.
		res, aliased := a.relay(a.out, buf[:n], err)
		if aliased {
			res = append(a.out, res...)
		}
		if a.out = res; a.eof {
			return true
		}
	}
	_ = r.SetReadDeadline(time.Time{})
	return false
}

// relay turns p, read from the upstream stream with rerr, into the agent's
// bytes: an unchanged prefix of p itself (aliased), or out with them
// appended. It is the one step of every relay loop (finish, sseBody).
func (a *attempt) relay(out, p []byte, rerr error) (res []byte, aliased bool) {
	res, aliased, serr := a.rw.stream(out, p)
	if serr == nil && rerr == nil {
		a.learn()
		return res, aliased
	}
	if aliased {
		res = append(out, res...)
	}
	return a.settle(res, serr, rerr), false
}

// settle ends the relay of an answer whose upstream stream ended or broke,
// or whose line passed max_sse_line: it sets a.eof, learns the tools of a
// tools/list answer, and ends an answer that has no response yet with
// mcpheal's error event.
func (a *attempt) settle(res []byte, serr, rerr error) []byte {
	a.eof = true
	inject := !a.rw.answered && a.msg.isRequest()
	res, midLine := a.rw.endStream(res, !inject)
	a.learn()
	if !inject {
		return res
	}
	// The stream ended before the answer: without one the agent's call
	// would wait for its own timeout. It gets mcpheal's error instead.
	f := a.cut()
	switch {
	case errors.Is(serr, errHoldBudget):
		f = overBudgetEvent(a)
	case serr != nil:
		f = failure{code: codeTooLarge, msg: "upstream answer has an SSE line larger than mcpheal's limit of " +
			strconv.Itoa(a.rw.max) + " bytes (max_sse_line); the answer was cut"}
	}
	a.s.log.Warn().Str(logMethod, logText(a.msg.method)).Str(logTool, logText(a.msg.tool)).Int("code", f.code).AnErr("cut", rerr).
		AnErr("too_large", serr).Msg("SSE answer ended before its response")
	// End the agent's current event first: a blank line, after ending a
	// line cut mid-way (its event is lost either way).
	if midLine {
		res = append(res, '\n')
	}
	res = append(res, '\n')
	return sse.AppendEvent(res, "message", appendError(nil, f.code, a.msg.idOrNull(), f.msg))
}

// handedOn runs when what the relay made of the stream so far has gone to
// the agent (or its log): a large output buffer is not kept, and what the
// memory budget counted of a line held whole is given back
// (eventRewriter.handedOn).
func (a *attempt) handedOn() {
	if cap(a.out) > freeHold {
		a.out = nil
	}
	a.rw.handedOn()
}

// sseBody is a POST's streamed SSE answer as the agent's response body.
// fasthttp writes each Read as one chunk and flushes it, so every event
// reaches the agent as it arrives, on the connection's own goroutine: no
// body-writer goroutine and pipe per answer (SetBodyStreamWriter). From
// SetBodyStream on, the body owns a and a.resp; fasthttp calls Close once,
// when the answer is written or the agent has gone, and Close releases both.
type sseBody attempt

// errStreamPanic ends an answer whose relay panicked.
var errStreamPanic = errors.New("mcpheal: SSE relay panicked")

// Read returns the next rewritten events of the upstream's stream, reading
// upstream only when what it read before has been handed out.
func (b *sseBody) Read(p []byte) (n int, err error) {
	a := (*attempt)(b)
	defer func() {
		if v := recover(); v != nil {
			a.s.count.panics.Add(1)
			a.s.log.Error().Interface("panic", v).Msg("SSE relay panicked")
			n, err = 0, errStreamPanic
		}
	}()
	for a.outPos == len(a.out) {
		a.handedOn()
		if a.eof {
			return 0, io.EOF
		}
		// p is fasthttp's copy buffer: read into it; what passes through
		// unchanged stays where it is, without a copy.
		n, rerr := (*upstreamStream)(a).Read(p)
		res, aliased := a.relay(a.out[:0], p[:n], rerr)
		if a.log != nil {
			a.log.append(res)
		}
		if aliased {
			if len(res) > 0 {
				a.s.count.bytesOut.Add(uint64(len(res)))
				return len(res), nil
			}
			continue
		}
		a.out, a.outPos = res, 0
	}
	n = copy(p, a.out[a.outPos:])
	a.outPos += n
	a.s.count.bytesOut.Add(uint64(n))
	return n, nil
}

// SupportsBodyWriteTo tells fasthttp to write the answer with WriteTo.
func (b *sseBody) SupportsBodyWriteTo() bool { return true }

// WriteTo relays the upstream's stream to w, which fasthttp turns into one
// flushed chunk per Write: one chunk per upstream read of up to readBuf
// bytes, so that what arrives together goes out together, and a large
// answer costs few system calls. What passes through unchanged is written
// from the read buffer itself.
func (b *sseBody) WriteTo(w io.Writer) (total int64, err error) {
	a := (*attempt)(b)
	defer func() {
		if v := recover(); v != nil {
			a.s.count.panics.Add(1)
			a.s.log.Error().Interface("panic", v).Msg("SSE relay panicked")
			err = errStreamPanic
		}
	}()
	iw := newIdleWriter(a, w)
	defer iw.stop()
	write := func(p []byte) error {
		if len(p) == 0 {
			return nil
		}
		// The agent's side is at a line boundary unless a line passes
		// through, part of it written (relay.go).
		n, err := iw.write(p, a.rw.mode != linePassing)
		total += int64(n)
		a.s.count.bytesOut.Add(uint64(n))
		return err
	}
	if err = write(a.out[a.outPos:]); err != nil {
		return total, b.left(err)
	}
	a.outPos = len(a.out)
	buf := a.readBuf()
	for !a.eof {
		if err = write(b.pull(buf)); err != nil {
			return total, b.left(err)
		}
	}
	return total, nil
}

// pull reads the upstream's stream once into buf and returns what of it
// goes to the agent, kept in the answer's log if it has one; valid until
// the next pull.
func (b *sseBody) pull(buf []byte) []byte {
	a := (*attempt)(b)
	a.handedOn()
	n, rerr := (*upstreamStream)(a).Read(buf)
	res, aliased := a.relay(a.out[:0], buf[:n], rerr)
	if !aliased {
		a.out = res[:0] // keep a grown buffer
	}
	if a.log != nil {
		a.log.append(res)
	}
	return res
}

// left is what WriteTo does when the agent's connection dropped (err): an
// answer its agent may resume goes on for it, read by drain into the log
// (answerlog.go), unless it has ended or can no longer be resumed.
func (b *sseBody) left(err error) error {
	a := (*attempt)(b)
	if a.log == nil || a.eof || a.log.isOver() || !a.s.bg.Add(1) {
		return err
	}
	a.log.agentLeft()
	a.draining = true // Close starts drain: fasthttp is done with the attempt then
	// The message's members are views into the agent's request, which
	// fasthttp reuses once the answer is done: drain keeps copies.
	a.msg.id, a.msg.method, a.msg.tool = strings.Clone(a.msg.id), strings.Clone(a.msg.method), strings.Clone(a.msg.tool)
	return err
}

// drain reads the rest of an answer whose agent's connection dropped into
// its log, until the answer ends, the log is dropped, or the window passes
// with nobody reading (answerLog.windowEnded abandons the exchange), then
// releases the attempt.
func (b *sseBody) drain() {
	a := (*attempt)(b)
	defer a.s.bg.Done()
	quit, shut := make(chan struct{}), make(chan struct{})
	go func() { // shutdown ends the call too
		defer close(shut)
		select {
		case <-a.s.done:
			a.abandon()
		case <-quit:
		}
	}()
	defer func() {
		if v := recover(); v != nil {
			a.s.count.panics.Add(1)
			a.s.log.Error().Interface("panic", v).Msg("answer drain panicked")
		}
		close(quit)
		<-shut // nothing touches the attempt once it is released
		a.log.finish()
		a.release()
	}()
	buf := a.readBuf()
	for !a.eof && !a.log.isOver() {
		b.pull(buf)
	}
}

// Close releases the upstream response (closing its stream if the agent
// left early) and the attempt.
func (b *sseBody) Close() error {
	a := (*attempt)(b)
	if a.draining {
		// The agent is gone: its watch ends here, or it would cut the
		// drain's upstream read, and leave its flag to the attempt's next
		// user.
		a.unwatch()
		go b.drain() // it owns the attempt now
		return nil
	}
	if a.log != nil {
		a.log.finish()
	}
	a.unwatch()
	armWrite(a.conn, a.s.cfg.WriteTimeout) // the chunked answer's end is written after Close
	a.release()
	return nil
}

// jsonBody is a POST's JSON answer as the agent's response body, written
// from the upstream's buffer. From SetBodyStream on, the body owns a and
// a.resp; fasthttp calls Close once, when the answer is written or the agent
// has gone, and Close releases both, and with a.resp the body's memory
// budget charge.
type jsonBody attempt

// Read copies the rest of the body to p (fasthttp uses WriteTo).
func (b *jsonBody) Read(p []byte) (int, error) {
	a := (*attempt)(b)
	rest := a.resp.Body()[a.outPos:]
	if len(rest) == 0 {
		return 0, io.EOF
	}
	n := copy(p, rest)
	a.outPos += n
	return n, nil
}

// SupportsBodyWriteTo tells fasthttp to write the answer with WriteTo.
func (b *jsonBody) SupportsBodyWriteTo() bool { return true }

// WriteTo writes the body in one Write.
func (b *jsonBody) WriteTo(w io.Writer) (int64, error) {
	a := (*attempt)(b)
	n, err := w.Write(a.resp.Body()[a.outPos:])
	a.outPos += n
	return int64(n), err
}

// Close releases the upstream response and the attempt.
func (b *jsonBody) Close() error {
	a := (*attempt)(b)
	a.unwatch()
	a.release()
	return nil
}

// writeJSONAnswer writes a JSON answer mcpheal built itself (a bridged answer),
// with the session's id, counted in the memory budget until written. It
// reports false when the budget had no room (the agent got -32017).
func writeJSONAnswer(ctx *fasthttp.RequestCtx, status int, body []byte, sess *session.Session, mem *budget) bool {
	if !mem.take(int64(len(body))) {
		// body answers a request: its id is the request's.
		req := message{id: gjson.GetBytes(body, "id").Raw, method: "request"}
		writeFailure(ctx, &req, failure{status: fasthttp.StatusServiceUnavailable, code: codeBudget,
			msg: "answer not relayed: mcpheal's memory_budget is reached; retry later", retryAfter: 1})
		return false
	}
	ctx.SetStatusCode(status)
	ctx.SetContentTypeBytes(mimeJSON)
	if sess != nil {
		ctx.Response.Header.SetBytesK(hdrSessionID, string(sess.ID))
	}
	ctx.Response.SetBodyStream(&budgetBody{b: body, mem: mem, n: int64(len(body))}, len(body))
	return true
}

// budgetBody is an answer mcpheal built itself, counted in the memory
// budget (n bytes) until fasthttp has written it or the agent has gone:
// fasthttp calls Close once, either way.
type budgetBody struct {
	b   []byte
	pos int
	mem *budget
	n   int64
}

// Read copies the rest of the body to p (fasthttp uses WriteTo).
func (bb *budgetBody) Read(p []byte) (int, error) {
	if bb.pos == len(bb.b) {
		return 0, io.EOF
	}
	n := copy(p, bb.b[bb.pos:])
	bb.pos += n
	return n, nil
}

// WriteTo writes the body in one Write.
func (bb *budgetBody) WriteTo(w io.Writer) (int64, error) {
	n, err := w.Write(bb.b[bb.pos:])
	bb.pos += n
	return int64(n), err
}

// Close gives the body's memory back to the budget.
func (bb *budgetBody) Close() error {
	bb.mem.give(bb.n)
	bb.n, bb.b = 0, nil
	return nil
}

// initializeAnswer returns the JSON-RPC message that answers the agent's
// initialize: a JSON body, or the response event of an SSE answer (read
// on past the first event when that was not it, counted in the memory
// budget until the answer is written). ok is false when the answer passed
// max_answer or the budget.
func (a *attempt) initializeAnswer() (msg []byte, ok bool) {
	r := a.resp
	if !r.IsStream() {
		return r.Body(), true
	}
	if a.firstWhole {
		if d := sse.Data(nil, a.first); isResponse(d) {
			return d, true
		}
	}
	n := len(a.out)
	raw, msg, err := readAnswer(r, &a.rw, a.s.cfg.MaxAnswer)
	if err != nil || !a.s.mem.take(int64(len(raw)+len(msg))) {
		return nil, false
	}
	a.charged += int64(len(raw) + len(msg))
	a.out = append(a.out[:n], raw...)
	a.readWhole = true // read up to its response; the rest of the stream is not relayed
	return msg, true
}

// endResumption answers a GET whose Last-Event-ID names a stream of a dead
// upstream session. That stream cannot be resumed, and a new standalone
// stream in its place would evict the agent's own (or be refused 409, and
// the go-sdk client then ends its session). An event stream that ends at
// once tells the agent's SDK the stream is over: a call it was resuming
// fails alone ("request terminated without response"), a standalone stream
// is reopened without Last-Event-ID.
func endResumption(ctx *fasthttp.RequestCtx) {
	ctx.Response.Header.SetContentTypeBytes(mimeEventStream)
	ctx.Response.Header.Set("Cache-Control", "no-cache")
	ctx.SetStatusCode(fasthttp.StatusOK)
}
