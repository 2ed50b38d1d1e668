package exchange

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
	"github.com/mcpheal/mcpheal/proxy/internal/heal"
	"github.com/mcpheal/mcpheal/proxy/internal/link"
	"github.com/mcpheal/mcpheal/proxy/internal/obs"
	"github.com/mcpheal/mcpheal/proxy/internal/wire"
	"github.com/mcpheal/mcpheal/session"
	"github.com/mcpheal/mcpheal/upstream"
)

// outcome is how an agent's request ends: the one answer it gets.
type Outcome struct {
	Kind  outcomeKind
	Class classify.Class // of the upstream's answer (outUpstream, outRefused)
	Err   error          // why the exchange failed (outRefused, outTooLarge, outCredential), for the log
	Why   string         // outDown: what was unreachable
	wait  time.Duration  // outBreakerOpen: until the breaker half-opens
}

type outcomeKind int

const (
	// outUpstream: the upstream's answer, passed through (docs/healing.md "What it
	// does with each answer").
	OutUpstream outcomeKind = iota
	// outRefused: -32011, the request may have run and was not retried.
	outRefused
	// outDown: 503 + Retry-After, the upstream stayed unreachable for the
	// heal budget; the agent's session stays valid.
	OutDown
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
	OutTooLarge
	// outAgentGone: the agent closed its connection while its request
	// waited; the answer written goes nowhere (unless the agent only
	// half-closed it).
	OutAgentGone
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
type Failure struct {
	Status, Code int
	Msg          string
	RetryAfter   int
	Challenge    string // WWW-Authenticate, for a 401
}

// fail turns out into mcpheal's error, counting and logging it once.
func (a *Attempt) Fail(out Outcome) Failure {
	c, m := a.S.Count, &a.Msg
	switch out.Kind {
	case outRefused:
		c.ReplaysRefused.Add(1)
		c.Request(m, out.Class)
		return a.refusal(out.Class, out.Err)
	case OutDown:
		c.UpstreamDown.Add(1)
		c.Request(m, classify.TransportDead)
		return Failure{Status: fasthttp.StatusServiceUnavailable, Code: wire.CodeUpstreamDown, Msg: out.Why + ": " + a.S.Link.Up.Origin(), RetryAfter: 1}
	case outBreakerOpen:
		c.UpstreamDown.Add(1)
		c.Request(m, classify.TransportDead)
		return Failure{Status: fasthttp.StatusServiceUnavailable, Code: wire.CodeUpstreamDown, Msg: "upstream " + a.S.Cfg.Name +
			" unavailable (circuit breaker open): " + a.S.Link.Up.Origin(), RetryAfter: int((out.wait + time.Second - 1) / time.Second)}
	case outGone:
		c.Request(m, classify.SessionGone)
		return Failure{Status: fasthttp.StatusNotFound, Code: wire.CodeSessionNotFound, Msg: "Session not found"}
	case OutTooLarge:
		c.Request(m, out.Class)
		if errors.Is(out.Err, upstream.ErrOverBudget) {
			a.S.Log.Warn().Int("bytes", len(a.Resp.Body())).Int64("budget", a.S.Mem.Limit).Msg("answer not buffered: memory budget")
			return Failure{Status: fasthttp.StatusServiceUnavailable, Code: wire.CodeBudget, Msg: "upstream answer not relayed (at least " +
				strconv.Itoa(len(a.Resp.Body())) + " bytes): mcpheal's memory_budget is reached; retry later", RetryAfter: 1}
		}
		a.S.Log.Warn().Str(obs.LogMethod, obs.LogText(m.Method)).Str(obs.LogTool, obs.LogText(m.Tool)).Err(out.Err).
			Msg("upstream answer too large; not relayed")
		return Failure{Status: fasthttp.StatusBadGateway, Code: wire.CodeTooLarge, Msg: "upstream answer larger than mcpheal's max_answer limit (" + out.Err.Error() + ")"}
	case outCredential:
		c.Request(m, classify.Auth)
		var ce *link.CredentialError
		if errors.As(out.Err, &ce) && ce.Refused() {
			// Only the operator can mend it: no Retry-After.
			return Failure{Status: fasthttp.StatusBadGateway, Code: wire.CodeCredential, Msg: "mcpheal could not get its credential for upstream " +
				a.S.Cfg.Name + ": " + ce.Err.Error() + "; " + m.Method + " was not sent"}
		}
		return Failure{Status: fasthttp.StatusServiceUnavailable, Code: wire.CodeCredential, Msg: "mcpheal could not get its credential for upstream " +
			a.S.Cfg.Name + " (" + errorText(out.Err) + "); " + m.Method + " was not sent; retry later", RetryAfter: 1}
	case outFull:
		c.Request(m, classify.OK)
		return AdmissionFailure(out.Err)
	case outHealAuth:
		c.Request(m, classify.Auth)
		he := out.Err.(*heal.HealAuthError)
		if a.S.Link.OwnsAuthorization() && a.S.Cfg.Credentials != nil {
			return Failure{Status: fasthttp.StatusBadGateway, Code: wire.CodeCredential, Msg: "the upstream refused mcpheal's own credential " +
				"while re-creating the session (" + strconv.Itoa(he.Status) + ")"}
		}
		return Failure{Status: he.Status, Code: wire.CodeUnauthorized, Msg: "the upstream refused this request's credential while re-creating " +
			"the session (" + strconv.Itoa(he.Status) + "); the session stays valid", Challenge: string(a.S.Challenges.Own(a.R.Hdr, []byte(he.Challenge)))}
	case outBusy:
		c.Request(m, classify.Busy)
		be := out.Err.(*heal.BusyError)
		code, words := wire.CodeUpstreamDown, "it gave no reason"
		if e := gjson.GetBytes(be.Msg, "error"); e.IsObject() {
			words = strconv.Quote(e.Get("message").Str)
			if c := e.Get("code").Int(); c != 0 {
				code = int(c)
			}
		}
		return Failure{Status: be.Status, Code: code, Msg: "the upstream is at capacity and did not re-create the session (" +
			strconv.Itoa(be.Status) + ", " + words + "); " + m.Method + " was not sent; the session stays valid; retry later",
			RetryAfter: max(int((be.Wait+time.Second-1)/time.Second), 1)}
	case outInvalid:
		c.Request(m, classify.Protocol)
		return Failure{Status: fasthttp.StatusBadGateway, Code: wire.CodeUpstreamInvalid, Msg: "the upstream's answer to " + m.Method +
			" cannot be used: " + out.Err.Error()}
	case OutAgentGone:
		return Failure{Status: fasthttp.StatusOK, Code: wire.CodeMaybeExecuted, Msg: "the agent closed its connection while " + m.Method +
			" waited for the upstream; mcpheal ended the exchange, and the request may or may not have run"}
	}
	return Failure{Status: fasthttp.StatusBadGateway, Code: wire.CodeProxyError, Msg: "mcpheal internal error"}
}

// admissionFailure is the answer to a new session that the store's caps
// or the memory budget have no room for.
func AdmissionFailure(err error) Failure {
	switch {
	case errors.Is(err, session.ErrCredentialFull):
		return Failure{Status: fasthttp.StatusTooManyRequests, Code: wire.CodeTooMany, RetryAfter: 10,
			Msg: "Too many sessions for this credential (max_sessions_per_credential); retry later"}
	case errors.Is(err, heal.ErrBudget):
		return Failure{Status: fasthttp.StatusServiceUnavailable, Code: wire.CodeTooMany, RetryAfter: 10,
			Msg: "Too many sessions: mcpheal's memory_budget for this upstream is reached; retry later"}
	}
	return Failure{Status: fasthttp.StatusServiceUnavailable, Code: wire.CodeTooMany, RetryAfter: 10,
		Msg: "Too many sessions: mcpheal's session cap (max_sessions) is reached; retry later"}
}

// writeFailure writes mcpheal's error f as the JSON answer to m, with
// the status agentStatus gives it.
func WriteFailure(ctx *fasthttp.RequestCtx, m *wire.Message, f Failure) {
	status := agentStatus(m, f.Status)
	if status == fasthttp.StatusAccepted {
		ctx.Response.Reset()
		ctx.SetStatusCode(status)
		return
	}
	wire.WriteError(ctx, status, f.Code, m.IdOrNull(), f.Msg)
	if f.RetryAfter > 0 {
		ctx.Response.Header.Set("Retry-After", strconv.Itoa(f.RetryAfter))
	}
	if f.Challenge != "" {
		ctx.Response.Header.Set("WWW-Authenticate", f.Challenge)
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
func agentStatus(m *wire.Message, status int) int {
	if status < 500 && status != fasthttp.StatusTooManyRequests || m.Get {
		return status
	}
	if m.IsRequest() || m.Batch {
		return fasthttp.StatusOK
	}
	return fasthttp.StatusAccepted
}

// cut is the error that ends an SSE answer whose upstream stream ended
// before its response: the request is safe to send again (-32010), or it
// may have run and was not (-32011).
func (a *Attempt) Cut() Failure {
	if a.replaySafe {
		return Failure{Code: wire.CodeUpstreamDown, Msg: "upstream connection lost before the answer; " + a.Msg.Method + " is safe to retry"}
	}
	a.S.Count.ReplaysRefused.Add(1)
	return Failure{Code: wire.CodeMaybeExecuted, Msg: (*upstreamStream)(a).ended() + ", after " + a.Msg.Method +
		" was sent; it may or may not have run and was not retried"}
}

// overBudgetEvent is the error that ends an answer stream whose next event
// mcpheal would have to hold whole past memory_budget (holdMeter). The
// request ran, or may have: it is not sent again.
func OverBudgetEvent(a *Attempt) Failure {
	a.S.Log.Warn().Str(obs.LogMethod, obs.LogText(a.Msg.Method)).Int64("budget", a.S.Mem.Limit).
		Msg("answer stream cut: an event to hold whole would pass the memory budget")
	return Failure{Code: wire.CodeBudget, Msg: "an upstream event of " + a.Msg.Method + "'s answer would pass mcpheal's " +
		"memory_budget held whole; the answer was cut, and the request was not sent again"}
}

// errorText is err's message for an agent: the credential error's own
// (never a secret: upstream.TokenError keeps only status and code).
func errorText(err error) string {
	var ce *link.CredentialError
	if errors.As(err, &ce) {
		return ce.Err.Error()
	}
	return err.Error()
}

// answer writes the agent's answer for out and counts it: the upstream's
// answer relayed here (respond), mcpheal's own through the Writer. It
// reports whether the answer is a body that now owns a.
func (a *Attempt) Answer(out Outcome) bool {
	w := a.S.Writer()
	switch out.Kind {
	case OutUpstream:
		w.Count(&a.Msg, out.Class)
		a.R.Outcome(OutUpstream, out.Class, 0)
		if out.Class == classify.OK && a.Sess != nil {
			a.accepted()
		}
		if out.Class == classify.Busy && a.Resp.IsStream() {
			// A busy server's words as an event stream it may hold open:
			// they are its first event, given as the JSON answer they are.
			busyRetryAfter(&a.Ctx.Response.Header, &a.Resp.Header)
			writeJSONAnswer(a.Ctx, a.Resp.StatusCode(), sse.Data(nil, a.First), a.Sess, a.S.Mem)
			return false
		}
		return a.respond()
	case outAccepted:
		w.Status(a.Ctx, &a.Msg, fasthttp.StatusAccepted, classify.OK)
		return false
	case outEndResumption:
		w.EndResumption(a.Ctx, &a.Msg)
		return false
	case OutAgentGone:
		a.Ctx.SetConnectionClose()
	}
	if a.Sess == nil {
		a.S.Link.DropMinted(a.Resp) // an answer not passed on: a session it opened is nobody's
	}
	f := a.Fail(out)
	a.R.Outcome(out.Kind, out.Class, f.Code)
	if out.Kind == outRefused && a.streamBegan() {
		// The upstream's event stream began (a priming event, retry:,
		// comments) and ended before its answer: the agent gets what came
		// and mcpheal's error as its last event, as it would get the
		// stream itself directly, and the retry: it carried with it.
		a.respondHead()
		a.Out = sse.AppendEvent(a.Out, "message", wire.AppendError(nil, f.Code, a.Msg.IdOrNull(), f.Msg))
		a.Ctx.Response.SetBody(a.Out)
		a.S.Count.BytesOut.Add(uint64(len(a.Out)))
		return false
	}
	w.Fail(a.Ctx, &a.Msg, classify.Unknown, f)
	return false
}

// streamBegan reports whether the answer in a.resp is a POST's event
// stream that the upstream began with status 200 and events (a.out).
func (a *Attempt) streamBegan() bool {
	return !a.Msg.Get && len(a.Out) > 0 && (a.head != nil || a.Resp.IsStream() && a.Resp.StatusCode() == fasthttp.StatusOK)
}

// refusal is the answer to an ambiguous failure of a request that is
// unsafe to run twice. HTTP 200 keeps the agent's transport alive (the
// Python SDK tears its transport down on other 4xx/5xx); the JSON-RPC
// error fails the call.
func (a *Attempt) refusal(cls classify.Class, err error) Failure {
	cause := "the upstream connection was lost"
	switch {
	case cls == classify.Timeout:
		cause = "the upstream did not answer in time"
	case err == nil && (a.Resp.IsStream() || a.head != nil):
		cause = (*upstreamStream)(a).ended()
	case err == nil:
		cause = "the upstream answered " + strconv.Itoa(a.Resp.StatusCode()) + " (a gateway's error, not the server's refusal)"
	}
	a.S.Log.Warn().Str(obs.LogMethod, obs.LogText(a.Msg.Method)).Str(obs.LogTool, obs.LogText(a.Msg.Tool)).Stringer(obs.LogClass, cls).
		Err(err).Str("cause", cause).Msg("not replayed: the request may have run")
	return Failure{Status: fasthttp.StatusOK, Code: wire.CodeMaybeExecuted, Msg: cause + " after " + a.Msg.Method +
		" was sent; it may or may not have run and was not retried"}
}

// Answered does what the answer a route translated for its agent (msg,
// of class cls, handed to the Writer, which counted it) does on the
// session when the upstream accepted the request: a rotated credential
// moves; a tools/list teaches which tools are replay-safe.
func (a *Attempt) Answered(cls classify.Class, msg []byte) {
	if cls == classify.OK {
		a.accepted()
		if a.Msg.Method == "tools/list" {
			heal.LearnTools(a.Sess, msg)
		}
	}
}

// accepted runs when the upstream accepted the request on the session: it
// records the journal entry the request made, and moves the session to
// the request's credential when it came under a rotated one (docs/security.md
// "Security": the upstream is the judge).
func (a *Attempt) accepted() {
	if !a.Msg.Get && a.Msg.IsRequest() && a.Msg.Method != "initialize" {
		// The upstream took a call beyond the initialize: admission keeps
		// the session (a flood of bare initializes only displaces itself).
		a.S.Sessions.Store.Used(a.Sess)
	}
	if a.R.Journal != (session.JournalChange{}) {
		a.S.Sessions.Journal(a.Sess, a.R.Journal, a.R.Reserved)
		a.R.Journal, a.R.Reserved = session.JournalChange{}, 0
	}
	if a.R.Standing == heal.Rotating || (!a.R.OwnCredential && !a.S.Link.OwnsAuthorization()) {
		// Another principal the upstream accepted, or a new token of the
		// session's (a renewed JWT): the session's own work goes on with
		// it. Without an agent credential to forward (mcpheal owns it)
		// there is none to keep.
		a.S.Sessions.Rebind(a.Sess, a.R.Auth, &a.Req.Header)
		a.R.Standing, a.R.OwnCredential = heal.Bound, true
	}
}

// respond writes the upstream answer to the agent: status and headers
// (hop-by-hop dropped, every session id copy replaced), then the body whole
// or as a stream relayed event by event. It reports whether a stream now
// owns a.resp.
func (a *Attempt) respond() bool {
	s, ctx, r := a.S, a.Ctx, a.Resp
	a.respondHead()
	if a.readWhole {
		// An SSE answer read up to its response (initializeAnswer): the
		// events up to it are the answer.
		ctx.Response.SetBody(a.Out)
		s.Count.BytesOut.Add(uint64(len(a.Out)))
		return false
	}
	if !r.IsStream() {
		if a.Msg.Method == "tools/list" && a.Sess != nil {
			heal.LearnTools(a.Sess, r.Body())
		}
		s.Count.BytesOut.Add(uint64(len(r.Body())))
		if !a.Msg.Get {
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
		if !s.Mem.Take(n) {
			WriteFailure(ctx, &a.Msg, a.Fail(Outcome{Kind: OutTooLarge, Class: classify.Protocol, Err: upstream.ErrOverBudget}))
			return false
		}
		a.Charged = n
		ctx.Response.SetBody(r.Body())
		return false
	}
	ctx.Response.Header.Set("X-Accel-Buffering", "no")
	if a.Msg.Get && a.Sess != nil && r.StatusCode() == fasthttp.StatusOK {
		return true // serveStream holds this stream open across heals
	}
	answered := !a.Msg.Get && a.FirstWhole && wire.IsResponse(sse.Data(nil, a.First))
	var err error
	if a.Out, err = a.Rw.StartStream(a.Out); err != nil {
		a.Out = a.settle(a.Out, err, nil)
	}
	// A tools/list response framed whole by the peek goes out with a.out
	// before the relay reads again: learn its tools now, or the agent's
	// next call could overtake them.
	a.learn()
	if answered && a.finish() {
		// The answer is complete: one buffered write, no chunking.
		a.learn()
		ctx.Response.SetBody(a.Out)
		s.Count.BytesOut.Add(uint64(len(a.Out)))
		return false
	}
	a.outPos, a.conn = 0, ctx.Conn()
	if a.Rw.Own != 0 {
		// The agent may come back for it: keep what it is sent, and let a
		// dropped connection end the relay's writes, not the call.
		a.log = s.Answers.open(a)
		a.log.Append(a.Out)
		a.watchForLog()
	}
	ctx.Response.SetBodyStream((*sseBody)(a), -1)
	return true
}

// respondHead writes the upstream answer's status and headers to the
// agent: hop-by-hop ones dropped, every session id copy replaced.
func (a *Attempt) respondHead() {
	ctx, h := a.Ctx, &a.Resp.Header
	if a.head != nil {
		h = a.head // resumed: the stream's own head, not the resuming GET's
	}
	ctx.Response.Reset()
	h.CopyTo(&ctx.Response.Header)
	// The upstream id never leaks: a sole copy is overwritten in place by
	// SetBytesK below, more than one are all deleted first.
	wire.StripResponseHeader(h, &ctx.Response.Header, a.Sess != nil)
	if a.Sess != nil {
		ctx.Response.Header.SetBytesK(wire.HdrSessionID, string(a.Sess.ID))
	} else {
		a.S.Link.DropMinted(a.Resp)
	}
	a.S.Challenges.Pass(ctx, h)
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
func (a *Attempt) learn() {
	if a.Rw.Response != nil {
		heal.LearnTools(a.Sess, a.Rw.Response)
		a.Rw.Response = nil
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
func (a *Attempt) finish() bool {
	r := a.Resp
	if !r.Arrived(endWait) || r.SetReadDeadline(time.Now().Add(finishWait)) != nil {
		return false
	}
	buf := a.readBuf()
	for first := true; len(a.Out) < wire.PeekLimit && (first || r.Buffered() > 0 || r.Complete()); first = false {
		n, err := r.Read(buf)
		// A read that times out here stopped inside the chunked framing
		// and cannot go on: the answer ends with what came. Its response
		// has passed, so the agent loses at most a trailing notification.
		res, aliased := a.relay(a.Out, buf[:n], err)
		if aliased {
			res = append(a.Out, res...)
		}
		if a.Out = res; a.eof {
			return true
		}
	}
	_ = r.SetReadDeadline(time.Time{})
	return false
}

// relay turns p, read from the upstream stream with rerr, into the agent's
// bytes: an unchanged prefix of p itself (aliased), or out with them
// appended. It is the one step of every relay loop (finish, sseBody).
func (a *Attempt) relay(out, p []byte, rerr error) (res []byte, aliased bool) {
	res, aliased, serr := a.Rw.Stream(out, p)
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
func (a *Attempt) settle(res []byte, serr, rerr error) []byte {
	a.eof = true
	inject := !a.Rw.Answered && a.Msg.IsRequest()
	res, midLine := a.Rw.EndStream(res, !inject)
	a.learn()
	if !inject {
		return res
	}
	// The stream ended before the answer: without one the agent's call
	// would wait for its own timeout. It gets mcpheal's error instead.
	f := a.Cut()
	switch {
	case errors.Is(serr, wire.ErrHoldBudget):
		f = OverBudgetEvent(a)
	case serr != nil:
		f = Failure{Code: wire.CodeTooLarge, Msg: "upstream answer has an SSE line larger than mcpheal's limit of " +
			strconv.Itoa(a.Rw.Max) + " bytes (max_sse_line); the answer was cut"}
	}
	a.S.Log.Warn().Str(obs.LogMethod, obs.LogText(a.Msg.Method)).Str(obs.LogTool, obs.LogText(a.Msg.Tool)).Int("code", f.Code).AnErr("cut", rerr).
		AnErr("too_large", serr).Msg("SSE answer ended before its response")
	// End the agent's current event first: a blank line, after ending a
	// line cut mid-way (its event is lost either way).
	if midLine {
		res = append(res, '\n')
	}
	res = append(res, '\n')
	return sse.AppendEvent(res, "message", wire.AppendError(nil, f.Code, a.Msg.IdOrNull(), f.Msg))
}

// handedOn runs when what the relay made of the stream so far has gone to
// the agent (or its log): a large output buffer is not kept, and what the
// memory budget counted of a line held whole is given back
// (eventRewriter.handedOn).
func (a *Attempt) handedOn() {
	if cap(a.Out) > wire.FreeHold {
		a.Out = nil
	}
	a.Rw.HandedOn()
}

// sseBody is a POST's streamed SSE answer as the agent's response body.
// fasthttp writes each Read as one chunk and flushes it, so every event
// reaches the agent as it arrives, on the connection's own goroutine: no
// body-writer goroutine and pipe per answer (SetBodyStreamWriter). From
// SetBodyStream on, the body owns a and a.resp; fasthttp calls Close once,
// when the answer is written or the agent has gone, and Close releases both.
type sseBody Attempt

// errStreamPanic ends an answer whose relay panicked.
var errStreamPanic = errors.New("mcpheal: SSE relay panicked")

// Read returns the next rewritten events of the upstream's stream, reading
// upstream only when what it read before has been handed out.
func (b *sseBody) Read(p []byte) (n int, err error) {
	a := (*Attempt)(b)
	defer func() {
		if v := recover(); v != nil {
			a.S.Count.Panics.Add(1)
			a.S.Log.Error().Interface("panic", v).Msg("SSE relay panicked")
			n, err = 0, errStreamPanic
		}
	}()
	for a.outPos == len(a.Out) {
		a.handedOn()
		if a.eof {
			return 0, io.EOF
		}
		// p is fasthttp's copy buffer: read into it; what passes through
		// unchanged stays where it is, without a copy.
		n, rerr := (*upstreamStream)(a).Read(p)
		res, aliased := a.relay(a.Out[:0], p[:n], rerr)
		if a.log != nil {
			a.log.Append(res)
		}
		if aliased {
			if len(res) > 0 {
				a.S.Count.BytesOut.Add(uint64(len(res)))
				return len(res), nil
			}
			continue
		}
		a.Out, a.outPos = res, 0
	}
	n = copy(p, a.Out[a.outPos:])
	a.outPos += n
	a.S.Count.BytesOut.Add(uint64(n))
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
	a := (*Attempt)(b)
	defer func() {
		if v := recover(); v != nil {
			a.S.Count.Panics.Add(1)
			a.S.Log.Error().Interface("panic", v).Msg("SSE relay panicked")
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
		n, err := iw.write(p, a.Rw.Mode != wire.LinePassing)
		total += int64(n)
		a.S.Count.BytesOut.Add(uint64(n))
		return err
	}
	if err = write(a.Out[a.outPos:]); err != nil {
		return total, b.left(err)
	}
	a.outPos = len(a.Out)
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
	a := (*Attempt)(b)
	a.handedOn()
	n, rerr := (*upstreamStream)(a).Read(buf)
	res, aliased := a.relay(a.Out[:0], buf[:n], rerr)
	if !aliased {
		a.Out = res[:0] // keep a grown buffer
	}
	if a.log != nil {
		a.log.Append(res)
	}
	return res
}

// left is what WriteTo does when the agent's connection dropped (err): an
// answer its agent may resume goes on for it, read by drain into the log
// (answerlog.go), unless it has ended or can no longer be resumed.
func (b *sseBody) left(err error) error {
	a := (*Attempt)(b)
	if a.log == nil || a.eof || a.log.isOver() || !a.S.Bg.Add(1) {
		return err
	}
	a.log.agentLeft()
	a.draining = true // Close starts drain: fasthttp is done with the attempt then
	// The message's members are views into the agent's request, which
	// fasthttp reuses once the answer is done: drain keeps copies.
	a.Msg.ID, a.Msg.Method, a.Msg.Tool = strings.Clone(a.Msg.ID), strings.Clone(a.Msg.Method), strings.Clone(a.Msg.Tool)
	return err
}

// drain reads the rest of an answer whose agent's connection dropped into
// its log, until the answer ends, the log is dropped, or the window passes
// with nobody reading (answerLog.windowEnded abandons the exchange), then
// releases the attempt.
func (b *sseBody) drain() {
	a := (*Attempt)(b)
	defer a.S.Bg.Done()
	quit, shut := make(chan struct{}), make(chan struct{})
	go func() { // shutdown ends the call too
		defer close(shut)
		select {
		case <-a.S.Done:
			if a.log.share != nil {
				// A fleet's answer is handed over, not ended: its lease
				// runs out, and the replica its agent reaches takes it
				// over (answershare.go).
				a.log.share.Release()
			}
			a.Abandon()
		case <-quit:
		}
	}()
	defer func() {
		if v := recover(); v != nil {
			a.S.Count.Panics.Add(1)
			a.S.Log.Error().Interface("panic", v).Msg("answer drain panicked")
		}
		close(quit)
		<-shut // nothing touches the attempt once it is released
		a.log.Finish()
		a.Release()
	}()
	buf := a.readBuf()
	for !a.eof && !a.log.isOver() {
		b.pull(buf)
	}
}

// Close releases the upstream response (closing its stream if the agent
// left early) and the attempt.
func (b *sseBody) Close() error {
	a := (*Attempt)(b)
	if a.draining {
		// The agent is gone: its watch ends here, or it would cut the
		// drain's upstream read, and leave its flag to the attempt's next
		// user.
		a.Unwatch()
		go b.drain() // it owns the attempt now
		return nil
	}
	a.Unwatch() // first: an agent found gone after the end is not news to the log
	if a.log != nil {
		a.log.Finish()
	}
	wire.ArmWrite(a.conn, a.S.Cfg.WriteTimeout) // the chunked answer's end is written after Close
	a.Release()
	return nil
}

// jsonBody is a POST's JSON answer as the agent's response body, written
// from the upstream's buffer. From SetBodyStream on, the body owns a and
// a.resp; fasthttp calls Close once, when the answer is written or the agent
// has gone, and Close releases both, and with a.resp the body's memory
// budget charge.
type jsonBody Attempt

// Read copies the rest of the body to p (fasthttp uses WriteTo).
func (b *jsonBody) Read(p []byte) (int, error) {
	a := (*Attempt)(b)
	rest := a.Resp.Body()[a.outPos:]
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
	a := (*Attempt)(b)
	n, err := w.Write(a.Resp.Body()[a.outPos:])
	a.outPos += n
	return int64(n), err
}

// Close releases the upstream response and the attempt.
func (b *jsonBody) Close() error {
	a := (*Attempt)(b)
	a.Unwatch()
	a.Release()
	return nil
}

// writeJSONAnswer writes a JSON answer mcpheal built itself (a bridged answer),
// with the session's id, counted in the memory budget until written. It
// reports false when the budget had no room (the agent got -32017).
func writeJSONAnswer(ctx *fasthttp.RequestCtx, status int, body []byte, sess *session.Session, mem *wire.Budget) bool {
	if !mem.Take(int64(len(body))) {
		// body answers a request: its id is the request's.
		req := wire.Message{ID: gjson.GetBytes(body, "id").Raw, Method: "request"}
		WriteFailure(ctx, &req, Failure{Status: fasthttp.StatusServiceUnavailable, Code: wire.CodeBudget,
			Msg: "answer not relayed: mcpheal's memory_budget is reached; retry later", RetryAfter: 1})
		return false
	}
	writeBudgetBody(ctx, status, &BudgetBody{B: body, Mem: mem, N: int64(len(body))}, sess)
	return true
}

// writeBudgetBody writes body, held in the memory budget already, as the
// JSON answer under status, with sess's id when sess is not nil.
func writeBudgetBody(ctx *fasthttp.RequestCtx, status int, body *BudgetBody, sess *session.Session) {
	ctx.SetStatusCode(status)
	ctx.SetContentTypeBytes(wire.MimeJSON)
	if sess != nil {
		ctx.Response.Header.SetBytesK(wire.HdrSessionID, string(sess.ID))
	}
	ctx.Response.SetBodyStream(body, len(body.B))
}

// budgetBody is an answer mcpheal built itself, counted in the memory
// budget (n bytes) until fasthttp has written it or the agent has gone:
// fasthttp calls Close once, either way.
type BudgetBody struct {
	B   []byte
	pos int
	Mem *wire.Budget
	N   int64
}

// Read copies the rest of the body to p (fasthttp uses WriteTo).
func (bb *BudgetBody) Read(p []byte) (int, error) {
	if bb.pos == len(bb.B) {
		return 0, io.EOF
	}
	n := copy(p, bb.B[bb.pos:])
	bb.pos += n
	return n, nil
}

// WriteTo writes the body in one Write.
func (bb *BudgetBody) WriteTo(w io.Writer) (int64, error) {
	n, err := w.Write(bb.B[bb.pos:])
	bb.pos += n
	return int64(n), err
}

// Close gives the body's memory back to the budget.
func (bb *BudgetBody) Close() error {
	bb.Mem.Give(bb.N)
	bb.N, bb.B = 0, nil
	return nil
}

// initializeAnswer returns the JSON-RPC message that answers the agent's
// initialize: a JSON body, or the response event of an SSE answer (read
// on past the first event when that was not it, counted in the memory
// budget until the answer is written). ok is false when the answer passed
// max_answer or the budget.
func (a *Attempt) InitializeAnswer() (msg []byte, ok bool) {
	r := a.Resp
	if !r.IsStream() {
		return r.Body(), true
	}
	if a.FirstWhole {
		if d := sse.Data(nil, a.First); wire.IsResponse(d) {
			return d, true
		}
	}
	n := len(a.Out)
	raw, msg, err := wire.ReadAnswer(r, &a.Rw, a.S.Cfg.MaxAnswer)
	if err != nil || !a.S.Mem.Take(int64(len(raw)+len(msg))) {
		return nil, false
	}
	a.Charged += int64(len(raw) + len(msg))
	a.Out = append(a.Out[:n], raw...)
	a.readWhole = true // read up to its response; the rest of the stream is not relayed
	return msg, true
}

// open starts the log of a's answer, whose events carry a.rw.own.
func (ls *AnswerLogs) open(a *Attempt) *AnswerLog {
	key := "m" + strconv.FormatUint(a.Rw.Own, 36) // as appendOwnID writes it
	l := &AnswerLog{Key: key, sess: a.Sess.ID, Ls: ls, Mem: a.S.Mem, Max: a.S.Cfg.ResumeBuffer,
		Window: a.S.Cfg.ResumeWindow, call: a, Wake: make(chan struct{})}
	if a.Sess != nil {
		l.share = ls.share(l, a)
	}
	ls.Mu.Lock()
	if ls.M == nil {
		ls.M = make(map[string]*AnswerLog)
	}
	ls.M[key] = l
	ls.Mu.Unlock()
	return l
}

// share starts sharing the answer logged in l, nil when answers are not
// shared (or not now).
func (ls *AnswerLogs) share(l *AnswerLog, a *Attempt) *AnswerShare {
	if ls.Shared == nil || time.Now().UnixNano() < ls.holdOff.Load() {
		return nil
	}
	sh := ls.newShare(l.Key)
	sh.log, sh.sess, sh.request = l, a.Sess.ID, strings.Clone(a.Msg.IdOrNull())
	sh.upstream, sh.version = a.up, a.Sess.Recipe.ProtocolVersion
	return sh
}

// upstreamLastID is the upstream's id of the last event of the answer that
// ended (answerCall).
func (a *Attempt) upstreamLastID() string { return a.Rw.LastID }
