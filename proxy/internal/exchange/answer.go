package exchange

import (
	"errors"
	"strconv"
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

// Fail turns out into mcpheal's error, counting and logging it once.
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
		return Failure{Status: fasthttp.StatusServiceUnavailable, Code: wire.CodeUpstreamDown, Msg: out.Why + ": " + a.S.stages.Link.Up.Origin(), RetryAfter: 1}
	case outBreakerOpen:
		c.UpstreamDown.Add(1)
		c.Request(m, classify.TransportDead)
		return Failure{Status: fasthttp.StatusServiceUnavailable, Code: wire.CodeUpstreamDown, Msg: "upstream " + a.S.Cfg.Name +
			" unavailable (circuit breaker open): " + a.S.stages.Link.Up.Origin(), RetryAfter: int((out.wait + time.Second - 1) / time.Second)}
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
		if a.S.stages.Link.OwnsAuthorization() && a.S.Cfg.Credentials != nil {
			return Failure{Status: fasthttp.StatusBadGateway, Code: wire.CodeCredential, Msg: "the upstream refused mcpheal's own credential " +
				"while re-creating the session (" + strconv.Itoa(he.Status) + ")"}
		}
		return Failure{Status: he.Status, Code: wire.CodeUnauthorized, Msg: "the upstream refused this request's credential while re-creating " +
			"the session (" + strconv.Itoa(he.Status) + "); the session stays valid", Challenge: string(a.S.stages.Challenges.Own(a.R.Hdr, []byte(he.Challenge)))}
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

// AdmissionFailure is the answer to a new session that the store's caps
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

// errorText is err's message for an agent: the credential error's own
// (never a secret: upstream.TokenError keeps only status and code).
func errorText(err error) string {
	var ce *link.CredentialError
	if errors.As(err, &ce) {
		return ce.Err.Error()
	}
	return err.Error()
}

// Answer writes the agent's answer for out and counts it: the upstream's
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
		a.S.stages.Link.DropMinted(a.Resp) // an answer not passed on: a session it opened is nobody's
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
		cause = (*upstreamStream)(&a.answerStream).ended()
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
		a.S.stages.Sessions.Store.Used(a.Sess)
	}
	if a.R.Journal != (session.JournalChange{}) {
		a.S.stages.Sessions.Journal(a.Sess, a.R.Journal, a.R.Reserved)
		a.R.Journal, a.R.Reserved = session.JournalChange{}, 0
	}
	if a.R.Standing == heal.Rotating || (!a.R.OwnCredential && !a.S.stages.Link.OwnsAuthorization()) {
		// Another principal the upstream accepted, or a new token of the
		// session's (a renewed JWT): the session's own work goes on with
		// it. Without an agent credential to forward (mcpheal owns it)
		// there is none to keep.
		a.S.stages.Sessions.Rebind(a.Sess, a.R.Auth, &a.Req.Header)
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
			ctx.Response.SetBodyStream((*jsonBody)(&a.answerStream), len(r.Body()))
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
		a.log = s.stages.Answers.open(&a.answerStream)
		a.log.Append(a.Out)
		a.watchForLog()
	}
	ctx.Response.SetBodyStream((*sseBody)(&a.answerStream), -1)
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
		a.S.stages.Link.DropMinted(a.Resp)
	}
	a.S.stages.Challenges.Pass(ctx, h)
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

// InitializeAnswer returns the JSON-RPC message that answers the agent's
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

// Run loops until the agent has an answer, then writes it: the one exit of
// every pass-through request. It reports whether that answer is a body
// that now owns a (released when fasthttp has written it). The agent's
// connection is watched from the first send until the answer is written.
// With reroute set nothing was written: the upstream now speaks only
// 2026-07-28 (a deploy changed its era) and refused the request before
// running it, an outcome for the route stage, which sends it again
// through the bridge.
func (a *Attempt) Run() (owned, reroute bool) {
	a.WatchAgent()
	out := a.Loop()
	if out.Kind == OutUpstream && a.Heals && a.eraRefused() && a.S.stages.Eras.Bridged(a.R.Hdr.PeekBytes(wire.HdrAuthorization)) {
		a.Unwatch()
		return false, true
	}
	if a.Answer(out) {
		a.R = nil          // the request goes back to its pool when the handler returns
		return true, false // the body stops the watch once written (Close)
	}
	a.Unwatch()
	return false, false
}
