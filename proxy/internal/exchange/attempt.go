package exchange

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/mcpheal/mcpheal/classify"
	"github.com/mcpheal/mcpheal/proxy/internal/era"
	"github.com/mcpheal/mcpheal/proxy/internal/heal"
	"github.com/mcpheal/mcpheal/proxy/internal/link"
	"github.com/mcpheal/mcpheal/proxy/internal/obs"
	"github.com/mcpheal/mcpheal/proxy/internal/wire"
	"github.com/mcpheal/mcpheal/session"
	"github.com/mcpheal/mcpheal/upstream"
)

// Attempt is one agent request on its way upstream: the loop
// send → judge → decide → act runs until the request has its outcome.
// Every route sends through it: the session-era pass-through and the
// 2026-07-28 pass-through ([Server.forward], whose answer [Attempt.Answer]
// writes), and the bridge (bridge.go), which writes its own translation.
// It is three parts: the call (what is sent: call.go), the answer stream
// (what one try brings back, and its relay to the agent: stream.go,
// relay.go, body.go, resume.go), and the loop's own state below.
type Attempt struct {
	call
	answerStream

	healed  bool // this request healed the session once
	adopted bool // this request took another process's heal once (fleet.go)
	// mayHaveRun: an exchange of this request may have reached the
	// upstream's dispatcher (see facts.dispatched).
	mayHaveRun bool
	// retry paces the request's tries within its heal budget, which
	// begins at the first failure (link.Retry).
	retry link.Retry
	// probing: this request is its session's probe of an outage (see
	// session.Probe); it must end the probe before it answers.
	probing bool
	Charged int64 // taken from the memory budget for a buffered answer
	// xspan is the span of the exchange in flight (trace.go); nil when
	// tracing is off. tries counts the exchanges.
	xspan trace.Span
	tries int
}

var attemptPool = sync.Pool{New: func() any { return new(Attempt) }}

// NewAttempt takes a pooled attempt for r, with its upstream request and
// response; ctx may be nil (no agent connection to watch or answer).
func NewAttempt(s *Env, ctx *fasthttp.RequestCtx, r *Request) *Attempt {
	a := attemptPool.Get().(*Attempt)
	// Its answer state was reset by release (or is new): its buffers stay.
	*a = Attempt{call: call{S: s, Ctx: ctx, R: r, Sess: r.Sess, Msg: r.Msg, Watch: a.Watch}, answerStream: a.answerStream,
		retry: s.stages.Link.Retry(link.PaceRequest, s.Cfg.HealTimeout)}
	a.answerStream.call, a.owner = &a.call, a
	if a.Watch == nil {
		a.Watch = NewAgentWatch()
	} else if a.Watch.state.Load() != watchIdle || a.Watch.Gone.Load() {
		a.Watch.Stop() // whatever its last user left: an attempt starts watching nobody
	}
	a.Req = fasthttp.AcquireRequest()
	a.Resp = upstream.AcquireResponse()
	a.Resp.SetBudget(s.Mem) // a JSON answer is counted from its first byte until written
	if a.Sess != nil {
		a.up, a.Gen = a.Sess.Current()
	}
	a.replaySafe = replayable(&a.Msg, a.Sess, s.stages.ReplayTools)
	return a
}

// Release returns the attempt, its request and response and its buffers.
func (a *Attempt) Release() {
	fasthttp.ReleaseRequest(a.Req)
	if a.Resp != nil {
		upstream.ReleaseResponse(a.Resp)
	}
	a.S.Mem.Give(a.Charged)
	if cap(a.Out) > 64<<10 {
		a.Out = nil // do not pin large buffers (golang/go#23199)
	}
	if cap(a.Rw.Held) > 64<<10 {
		a.Rw.Held = nil
	}
	a.answerStream.reset()
	a.Resp = nil
	*a = Attempt{call: call{Watch: a.Watch}, answerStream: a.answerStream}
	attemptPool.Put(a)
}

// Loop is send → judge → decide → act. Each turn either ends with the
// outcome the agent gets, or sends the request again: after a heal, or
// after waiting out a failure that proves no harm.
func (a *Attempt) Loop() Outcome {
	defer a.endProbe()
	if a.Heals && a.Sess.NeedsInit() {
		// Restored from its sealed id: create its upstream session first,
		// under a credential it is bound to only.
		if a.R.Standing != heal.Bound {
			return Outcome{Kind: outGone}
		}
		if out, ok := a.heal(obs.ReasonRestored); !ok {
			return out
		}
	}
	for {
		if ok, wait := a.S.stages.Link.Breaker.Allow(); !ok {
			if !a.retry.Begun() {
				// A new request waits out a young outage (a redeploy) to
				// its end, and fails fast past it.
				end := a.S.stages.Link.OutageEnd()
				if !time.Now().Before(end) {
					return Outcome{Kind: outBreakerOpen, wait: wait}
				}
				a.retry.Until(end)
			}
			// Already waiting out the outage within its heal budget: it
			// goes on waiting (the outage watcher wakes it when the
			// upstream takes connections again), and is answered as the
			// docs/healing.md says of an outage, at the budget's end.
			if !a.backoff() {
				return Outcome{Kind: OutDown, Why: "upstream unreachable"}
			}
			continue
		}
		err := a.send()
		if err == nil && a.Sess != nil && a.Sess.ToolsPending.Load() != 0 {
			// The request reached the upstream: what was put off until it
			// went first (Session.DueTools) goes now.
			a.S.stages.Healer.ToolsDue(a.Sess)
		}
		f := a.judge(err)
		if a.xspan != nil {
			obs.EndExchange(a.xspan, a.Resp.StatusCode(), f.Class, err)
			a.xspan = nil
		}
		a.mayHaveRun = a.mayHaveRun || f.Dispatched
		if !f.AgentGone && !f.credential { // neither says anything of the upstream
			a.S.Count.Class(f.Class)
			a.S.stages.Link.RecordHealth(f.Class)
		}
		act := Decide(f)
		if f.Class == classify.Busy {
			a.S.stages.Link.NoteBusy(a.Resp.StatusCode(), act == actWait)
		}
		switch act {
		case ActAbandon:
			return Outcome{Kind: OutAgentGone}
		case actPass:
			return Outcome{Kind: OutUpstream, Class: f.Class}
		case actRefuse:
			return Outcome{Kind: outRefused, Class: f.Class, Err: err}
		case actFail:
			return Outcome{Kind: OutDown, Why: "upstream dropped the new session at once"}
		case actTooLarge:
			return Outcome{Kind: OutTooLarge, Class: f.Class, Err: err}
		case actCredential:
			return Outcome{Kind: outCredential, Err: err}
		case actRetry:
			if !a.backoff() {
				return Outcome{Kind: OutDown, Why: "upstream unreachable"}
			}
		case actWait:
			if !a.retry.WaitBusy(link.RetryAfter(&a.Resp.Header, time.Now())) {
				return Outcome{Kind: OutDown, Why: "mcpheal is shutting down"}
			}
			if a.AgentGone() {
				return Outcome{Kind: OutAgentGone}
			}
		case actHeal:
			if out, ok := a.heal(obs.ReasonSessionGone); !ok {
				return out
			}
			a.endProbe() // the requests it held go next, on the new session
			if out, ok := a.afterHeal(); !ok {
				return out
			}
		}
		a.S.Count.Replays.Add(1)
	}
}

// send makes one exchange. A request that is not replay-safe goes with
// doOnce: never resent by the client, never on a connection whose
// liveness is in doubt.
func (a *Attempt) send() error {
	if a.mayHaveRun && !a.replaySafe {
		// decide never lets this happen; count it so that every test can
		// assert it did not.
		a.S.Count.UnsafeResends.Add(1)
		a.S.Log.Error().Str(obs.LogMethod, obs.LogText(a.Msg.Method)).Str(obs.LogTool, obs.LogText(a.Msg.Tool)).
			Msg("BUG: a request that may have run is sent again")
	}
	if a.Heals {
		wire.SetSessionHeader(a.Req, a.up)
	}
	a.tries++
	if a.S.stages.Trace != nil && a.R != nil && a.R.Tctx != nil {
		a.xspan = a.S.stages.Trace.Exchange(a.R.Tctx, a.Req, a.spanName(), attribute.Int("mcpheal.try", a.tries))
	}
	a.S.Count.BytesIn.Add(uint64(len(a.Req.Body())))
	deadline := time.Now().Add(a.S.Cfg.ResponseTimeout)
	if a.replaySafe {
		return a.S.stages.Link.Do(a.Req, a.Resp, deadline)
	}
	return a.S.stages.Link.DoOnce(a.Req, a.Resp, deadline)
}

// judge turns one exchange into the facts decide needs: the class of the
// answer (peeking at the first event of a POST's SSE answer), and whether
// the upstream may have run the request.
func (a *Attempt) judge(err error) Facts {
	if !a.replaySafe && a.Msg.Tool != "" {
		// mcpheal may have learnt the tool's annotations since the request
		// set out (its own tools/list of a held session, held.go).
		a.replaySafe = replayable(&a.Msg, a.Sess, a.S.stages.ReplayTools)
	}
	f := Facts{ReplaySafe: a.replaySafe, Session: a.Heals, healed: a.healed}
	if a.AgentGone() {
		// Interrupted, or answered as the agent left: either way nobody
		// waits for this answer.
		f.AgentGone, f.Dispatched = true, err == nil || upstream.Delivered(err)
		return f
	}
	if err != nil {
		var ce *link.CredentialError
		if errors.As(err, &ce) {
			f.Class, f.credential = classify.Protocol, true // nothing was sent
			return f
		}
		f.Class, f.Dispatched = link.FailClass(err), upstream.Delivered(err)
		var tl *upstream.TooLargeError
		if errors.As(err, &tl) || errors.Is(err, upstream.ErrOverBudget) || errors.Is(err, upstream.ErrHeadTooLarge) {
			f.Class, f.TooLarge = classify.Protocol, true // it answered
		}
		return f
	}
	r := a.Resp
	status, ct := r.StatusCode(), r.Header.ContentType()
	switch {
	case r.IsStream() && a.Msg.Get:
		// The standalone stream may stay quiet for minutes: judge the head.
		f.Class = classify.Classify(status, ct, nil)
	case r.IsStream():
		if !a.peek() {
			// Cut, or ended unanswered: it may have run. Cut by the
			// watch, it is the agent that went away.
			f.Class, f.Dispatched, f.AgentGone = classify.TransportDead, true, a.AgentGone()
			return f
		}
		f.Class = classify.Classify(status, ct, a.First)
	case !a.Heals && status == fasthttp.StatusNotFound:
		f.Class = classify.Protocol // no session id was sent: 404 is not about one
	default:
		f.Class = classify.Classify(status, ct, r.Body())
	}
	switch f.Class {
	case classify.SessionGone:
		// Rejected before dispatch (docs/healing.md "Replay rules"): never ran.
		f.MayHeal = a.Heals && !a.healed && a.R.Standing == heal.Bound
	case classify.TransportDead, classify.Busy:
		// A 502/503/504. Proof of no harm only if the body is a known
		// refusal by the server itself; a gateway's error page is not. A
		// rate limit (429) turns requests away before they run.
		body := a.First // a streamed answer: its first event (Body would drain it)
		if !r.IsStream() {
			body = r.Body()
		}
		f.Dispatched = status != fasthttp.StatusTooManyRequests && !classify.Refused(status, ct, body)
		if status == fasthttp.StatusServiceUnavailable && len(r.Header.Peek("Retry-After")) > 0 {
			f.Class = classify.Busy // it says when to come back: a wait, not an outage
		}
		if f.Class == classify.Busy {
			f.waited, f.waitFits = a.retry.BusyWait(link.RetryAfter(&r.Header, time.Now()))
		}
	}
	return f
}

// heal re-initializes the upstream session (single-flight per session) and
// points the request at the new one. When healing fails, ok is false and
// out is what the agent gets.
func (a *Attempt) heal(reason int) (out Outcome, ok bool) {
	a.Next()
	ctx, cancel := context.WithDeadline(a.traceContext(), a.retry.Begin())
	defer cancel()
	up, gen, err := a.S.stages.Healer.Heal(ctx, a.Sess, a.Gen, reason, a.R.Hdr)
	if err != nil {
		var (
			bo *heal.BreakerOpenError
			ce *link.CredentialError
			he *heal.HealAuthError
			be *heal.BusyError
		)
		switch {
		case errors.As(err, &bo):
			return Outcome{Kind: outBreakerOpen, wait: bo.Wait}, false
		case errors.As(err, &ce):
			return Outcome{Kind: outCredential, Err: err}, false
		case errors.As(err, &he):
			return Outcome{Kind: outHealAuth, Err: he}, false
		case errors.As(err, &be):
			return Outcome{Kind: outBusy, Err: be}, false
		case errors.Is(err, heal.ErrClosing):
			return Outcome{Kind: OutDown, Why: "mcpheal is shutting down"}, false
		case errors.Is(err, heal.ErrRecipeRefused) || errors.Is(err, session.ErrClosed):
			// Its id would open again and heal into the same refusal.
			a.S.stages.Sessions.End(a.Sess, errors.Is(err, heal.ErrRecipeRefused))
			return Outcome{Kind: outGone}, false
		}
		return Outcome{Kind: OutDown, Why: "upstream unreachable while re-initializing the session"}, false
	}
	// A session adopted from another process may have died with this
	// one (an upstream restart): the request may then heal once more.
	a.up, a.Gen = up, gen
	if !a.Sess.WasAdopted(gen) || a.adopted {
		a.healed = true
	}
	a.adopted = true
	return Outcome{}, true
}

// afterHeal decides what a request does once its session healed: most are
// replayed; a few have nothing left to do on the new session.
func (a *Attempt) afterHeal() (Outcome, bool) {
	switch {
	case a.Msg.Get && len(a.Req.Header.PeekBytes(wire.HdrLastEventID)) > 0:
		// Its Last-Event-ID named the dead session's events.
		return Outcome{Kind: outEndResumption}, false
	case !a.Msg.Get && !a.Msg.IsRequest():
		// A notification or a response to a dead session: the new session
		// never asked for it; acknowledge and drop it.
		return Outcome{Kind: outAccepted}, false
	}
	return Outcome{}, true
}

// backoff waits before the next try, within the heal budget. It reports
// false when the budget is spent. One request per session waits out the
// outage by trying (session.Probe); the others wait for it.
func (a *Attempt) backoff() bool {
	a.Next()
	left := time.Until(a.retry.Begin())
	if left <= 0 {
		return false
	}
	if a.S.stages.Trace != nil && a.R != nil && a.R.Tctx != nil {
		_, sp := a.S.stages.Trace.Child(a.R.Tctx, "mcpheal wait", attribute.String("mcpheal.wait", "outage"))
		defer sp.End()
	}
	if a.Sess != nil && !a.probing {
		lead, done := a.Sess.Probe()
		if !lead {
			return a.awaitProbe(done, left)
		}
		a.probing = true
	}
	return a.retry.Wait()
}

// traceContext is the context of the request's span, for work done on
// its behalf (a heal); Background when tracing is off.
func (a *Attempt) traceContext() context.Context {
	if a.R != nil && a.R.Tctx != nil {
		return a.R.Tctx
	}
	return context.Background()
}

// spanName names an exchange's span as MCP's conventions name a client
// span: the method, and the tool it calls. It is a copy: the message's
// members are views into the agent's body, which outlives no handler.
func (a *Attempt) spanName() string {
	switch {
	case a.Msg.Get:
		return "GET stream"
	case a.Msg.Tool != "":
		return obs.SpanText(a.Msg.Method) + " " + obs.SpanText(a.Msg.Tool)
	case a.Msg.Method == "":
		return "response"
	}
	return obs.SpanText(a.Msg.Method)
}

// awaitProbe waits, within the heal budget, for the request probing the
// session's outage, then points this request at the session's current
// upstream id: the probe may have healed it meanwhile.
func (a *Attempt) awaitProbe(done <-chan struct{}, left time.Duration) bool {
	t := time.NewTimer(left)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		return false
	case <-a.S.Done:
		return false
	}
	a.up, a.Gen = a.Sess.Current()
	return true
}

// endProbe releases the requests waiting on this one's probe, if it is one.
func (a *Attempt) endProbe() {
	if a.probing {
		a.probing = false
		a.Sess.ProbeDone()
	}
}

// Renew readies the attempt for another request on the same route (a
// bridged call's next round): that the upstream ran the last one says
// nothing of this one.
func (a *Attempt) Renew() {
	a.Next()
	a.mayHaveRun, a.healed, a.adopted = false, false, false
	a.retry = a.S.stages.Link.Retry(link.PaceRequest, a.S.Cfg.HealTimeout)
}

// Next prepares the attempt for another exchange. A session the upstream
// opened for an answer that is dropped (a failed initialize, a 2026-07-28
// request to a session-era server) is DELETEd: nobody will use its id.
func (a *Attempt) Next() {
	if a.Sess == nil {
		a.S.stages.Link.DropMinted(a.Resp)
	}
	a.Resp.Close()
	a.Resp.Response.Reset()
	a.answerStream.reset()
}

// eraRefused reports an upstream answer that refuses the request as of the
// session era (legacyRefused); the era is then asked again.
func (a *Attempt) eraRefused() bool {
	r := a.Resp
	if r.StatusCode() != fasthttp.StatusBadRequest || r.IsStream() || !era.LegacyRefused(fasthttp.StatusBadRequest, r.Body()) {
		return false
	}
	a.S.stages.Eras.Forget()
	return true
}

// WatchAgent starts watching the agent's connection while the attempt
// waits on the upstream (attempts that are not pooled, such as a GET
// stream's, have no watch).
func (a *Attempt) WatchAgent() {
	if a.Watch != nil {
		a.Watch.Arm(a.Ctx.Conn(), a.Resp)
	}
}
