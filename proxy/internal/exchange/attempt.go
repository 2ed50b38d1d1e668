package exchange

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/mcpheal/mcpheal/classify"
	"github.com/mcpheal/mcpheal/classify/sse"
	"github.com/mcpheal/mcpheal/proxy/internal/era"
	"github.com/mcpheal/mcpheal/proxy/internal/heal"
	"github.com/mcpheal/mcpheal/proxy/internal/link"
	"github.com/mcpheal/mcpheal/proxy/internal/obs"
	"github.com/mcpheal/mcpheal/proxy/internal/wire"
	"github.com/mcpheal/mcpheal/session"
	"github.com/mcpheal/mcpheal/upstream"
)

// attempt is one agent request on its way upstream: the loop
// send → judge → decide → act runs until the request has its outcome.
// Every route sends through it: the session-era pass-through and the
// 2026-07-28 pass-through ([Server.forward], whose answer [attempt.answer]
// writes), and the bridge (bridge.go), which writes its own translation.
type Attempt struct {
	S    *Env
	Ctx  *fasthttp.RequestCtx // the agent's; nil once the handler has returned (a bridged call's later rounds)
	R    *Request
	Sess *session.Session // the agent's session; nil for 2026-07-28 pass-through
	Msg  wire.Message     // by value: the attempt is pooled, so nothing escapes
	Req  *fasthttp.Request
	Resp *upstream.Response
	up   session.UpstreamID
	Gen  uint64
	// heals: the upstream holds a session for this request that mcpheal
	// may re-create (a session-era upstream; not the bridge).
	Heals bool

	// replaySafe: the request may run twice without harm (replayable);
	// decided once, before the first send.
	replaySafe bool
	healed     bool // this request healed the session once
	adopted    bool // this request took another process's heal once (fleet.go)
	// mayHaveRun: an exchange of this request may have reached the
	// upstream's dispatcher (see facts.dispatched).
	mayHaveRun bool
	// retry paces the request's tries within its heal budget, which
	// begins at the first failure (link.Retry).
	retry link.Retry
	// probing: this request is its session's probe of an outage (see
	// session.Probe); it must end the probe before it answers.
	probing bool

	// tryAnswer is the upstream's answer to the exchange in flight.
	tryAnswer
	outPos    int
	eof       bool     // the upstream stream has ended
	readWhole bool     // the SSE answer was read up to its response: a.out is all the agent gets
	conn      net.Conn // the agent's connection, while sseBody writes to it
	Charged   int64    // taken from the memory budget for a buffered answer
	// log keeps the streamed answer for its agent to resume (answerlog.go);
	// draining: the agent's connection dropped and drain, not fasthttp,
	// owns the attempt now.
	log      *AnswerLog
	draining bool
	// watch notices the agent going away while it waits (agentwatch.go); nil
	// for attempts that are not pooled. It stays with the pooled attempt.
	Watch *agentWatch
	// xspan is the span of the exchange in flight (trace.go); nil when
	// tracing is off. tries counts the exchanges.
	xspan trace.Span
	tries int
}

// tryAnswer is the upstream's answer to one exchange of an attempt (a
// try), as the attempt reads it: each try starts it over (reset), keeping
// its buffers.
type tryAnswer struct {
	// The SSE answer of a POST: rw frames and rewrites it; out holds the
	// rewritten events not yet handed to the agent (from attempt.outPos);
	// first is the raw first event with data, valid until rw is fed again.
	Rw         wire.EventRewriter
	Buf        []byte // one upstream read
	Out        []byte
	First      []byte
	FirstWhole bool // first is a complete event, not a prefix past peekLimit
	// Resuming the answer stream upstream (resume.go): rerr is the read
	// error held back while the bytes read with it are relayed; resumeWhy,
	// once set, why the stream cannot be resumed; resumedAt the event id
	// resumed after, resumes the resumptions since it last changed,
	// resumeBy the end of their budget; head, the head of the stream as the
	// upstream began it, kept once a.resp holds a resuming GET's.
	head      *fasthttp.ResponseHeader
	rerr      error
	resumeWhy string
	resumedAt string
	resumes   int
	resumeBy  time.Time
	// quiet: the first event is being peeked at; the first read that would
	// wait for it arms a read deadline of stream_keepalive (quietArmed),
	// whose expiry ends the peek (errQuiet), not the stream. An answer
	// whose events came with its head (the usual short one) sets none.
	quiet, quietArmed bool
}

// reset starts the answer over for another exchange: what it learnt of
// the last stream is that stream's; its buffers stay.
func (t *tryAnswer) reset() {
	if t.Rw.Meter.Charged != 0 {
		t.Rw.Meter.Release()
	}
	t.Rw.Fr.Reset(64 << 10)
	*t = tryAnswer{Rw: wire.EventRewriter{Fr: t.Rw.Fr, Held: t.Rw.Held[:0], IdBuf: t.Rw.IdBuf[:0]}, Buf: t.Buf, Out: t.Out[:0]}
}

var attemptPool = sync.Pool{New: func() any { return new(Attempt) }}

// newAttempt takes a pooled attempt for r, with its upstream request and
// response; ctx may be nil (no agent connection to watch or answer).
func NewAttempt(s *Env, ctx *fasthttp.RequestCtx, r *Request) *Attempt {
	a := attemptPool.Get().(*Attempt)
	// Its answer state was reset by release (or is new): its buffers stay.
	*a = Attempt{S: s, Ctx: ctx, R: r, Sess: r.Sess, Msg: r.Msg, Watch: a.Watch, tryAnswer: a.tryAnswer,
		retry: s.Link.Retry(link.PaceRequest, s.Cfg.HealTimeout)}
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
	a.replaySafe = replayable(&a.Msg, a.Sess, s.ReplayTools)
	return a
}

// release returns the attempt, its request and response and its buffers.
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
	a.tryAnswer.reset()
	*a = Attempt{tryAnswer: a.tryAnswer, Watch: a.Watch}
	attemptPool.Put(a)
}

// run loops until the agent has an answer, then writes it: the one exit of
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
	if out.Kind == OutUpstream && a.Heals && a.eraRefused() && a.S.Eras.Bridged(a.R.Hdr.PeekBytes(wire.HdrAuthorization)) {
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

// loop is send → judge → decide → act. Each turn either ends with the
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
		if ok, wait := a.S.Link.Breaker.Allow(); !ok {
			if !a.retry.Begun() {
				// A new request waits out a young outage (a redeploy) to
				// its end, and fails fast past it.
				end := a.S.Link.OutageEnd()
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
			a.S.Healer.ToolsDue(a.Sess)
		}
		f := a.judge(err)
		if a.xspan != nil {
			obs.EndExchange(a.xspan, a.Resp.StatusCode(), f.Class, err)
			a.xspan = nil
		}
		a.mayHaveRun = a.mayHaveRun || f.Dispatched
		if !f.AgentGone && !f.credential { // neither says anything of the upstream
			a.S.Count.Class(f.Class)
			a.S.Link.RecordHealth(f.Class)
		}
		act := Decide(f)
		if f.Class == classify.Busy {
			a.S.Link.NoteBusy(a.Resp.StatusCode(), act == actWait)
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
	if a.S.Trace != nil && a.R != nil && a.R.Tctx != nil {
		a.xspan = a.S.Trace.Exchange(a.R.Tctx, a.Req, a.spanName(), attribute.Int("mcpheal.try", a.tries))
	}
	a.S.Count.BytesIn.Add(uint64(len(a.Req.Body())))
	deadline := time.Now().Add(a.S.Cfg.ResponseTimeout)
	if a.replaySafe {
		return a.S.Link.Do(a.Req, a.Resp, deadline)
	}
	return a.S.Link.DoOnce(a.Req, a.Resp, deadline)
}

// judge turns one exchange into the facts decide needs: the class of the
// answer (peeking at the first event of a POST's SSE answer), and whether
// the upstream may have run the request.
func (a *Attempt) judge(err error) Facts {
	if !a.replaySafe && a.Msg.Tool != "" {
		// mcpheal may have learnt the tool's annotations since the request
		// set out (its own tools/list of a held session, held.go).
		a.replaySafe = replayable(&a.Msg, a.Sess, a.S.ReplayTools)
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

// peek reads a POST's SSE answer up to its first event with data, through
// the rewriter set up for it (peekFirst); false when the stream ended or
// broke first.
func (a *Attempt) peek() bool {
	a.Rw.Gen, a.Rw.Max = a.Gen, a.S.Cfg.MaxSSELine
	a.Rw.Meter.Mem = a.S.Mem
	if !a.Heals {
		a.Rw.Gen = 1 // nothing to renumber: no session, or the bridge's own
	}
	a.Rw.Watch = a.Msg.Method == "tools/list" && a.Sess != nil
	if a.Heals && a.Msg.IsRequest() && !a.Msg.Batch && a.S.Cfg.ResumeBuffer > 0 {
		a.Rw.Own = ownStreams.Add(1) // its agent may resume it (answerlog.go)
	}
	// A call that sends nothing for stream_keepalive is judged on its head
	// and streamed, so that its agent gets keepalive comments (idle.go): a
	// session error comes at once, never after that long.
	a.quiet = a.Msg.IsRequest()
	var ok bool
	a.Out, a.First, a.FirstWhole, ok = wire.PeekFirst((*upstreamStream)(a), &a.Rw, a.Out[:0], a.readBuf())
	if a.quietArmed {
		_ = a.Resp.SetReadDeadline(time.Time{})
	}
	a.quiet, a.quietArmed = false, false
	return ok
}

// readBuf returns the attempt's buffer for one upstream read.
func (t *tryAnswer) readBuf() []byte {
	if cap(t.Buf) < wire.ReadBuf {
		t.Buf = make([]byte, wire.ReadBuf)
	}
	return t.Buf[:wire.ReadBuf]
}

// heal re-initializes the upstream session (single-flight per session) and
// points the request at the new one. When healing fails, ok is false and
// out is what the agent gets.
func (a *Attempt) heal(reason int) (out Outcome, ok bool) {
	a.Next()
	ctx, cancel := context.WithDeadline(a.traceContext(), a.retry.Begin())
	defer cancel()
	up, gen, err := a.S.Healer.Heal(ctx, a.Sess, a.Gen, reason, a.R.Hdr)
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
			a.S.Sessions.End(a.Sess, errors.Is(err, heal.ErrRecipeRefused))
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
	if a.S.Trace != nil && a.R != nil && a.R.Tctx != nil {
		_, sp := a.S.Trace.Child(a.R.Tctx, "mcpheal wait", attribute.String("mcpheal.wait", "outage"))
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

// abandon ends the attempt's exchange in flight as if its agent had gone
// (a bridged call the agent cancelled): decide gives up on it and nothing
// is sent again. It may run on another goroutine than the attempt's.
func (a *Attempt) Abandon() {
	a.Watch.Gone.Store(true)
	a.Resp.Interrupt()
}

// renew readies the attempt for another request on the same route (a
// bridged call's next round): that the upstream ran the last one says
// nothing of this one.
func (a *Attempt) Renew() {
	a.Next()
	a.mayHaveRun, a.healed, a.adopted, a.eof = false, false, false, false
	a.retry = a.S.Link.Retry(link.PaceRequest, a.S.Cfg.HealTimeout)
}

// peeked returns, once, the whole events the first exchange's peek read
// (judge), for a route that reads the events itself (the bridge).
func (t *tryAnswer) peeked() [][]byte {
	if len(t.Out) == 0 {
		return nil
	}
	var fr sse.Framer
	fr.Feed(t.Out)
	t.Out = t.Out[:0]
	var evs [][]byte
	for {
		ev, ok, _ := fr.Next()
		if !ok {
			return evs
		}
		evs = append(evs, ev)
	}
}

// How eachEvent ended.
const (
	EventsDone       = iota // fn said the answer is complete
	EventsGone              // fn could not write to the agent
	EventsCut               // the upstream stream ended first
	EventsTooLarge          // an upstream event passed max_sse_line
	EventsOverBudget        // holding an upstream event whole would pass memory_budget
	EventsQuiet             // nothing came before the read deadline fn set, or a wake
)

// eachEvent reads the SSE answer's events, the first exchange's peek
// first, and gives fn the data of each that has any, until fn reports the
// answer done (done) or the agent gone (!ok), or the stream ends. It is how
// a route that reads the events itself (the bridges) reads them; data is
// valid until fn returns. A stream of a session mcpheal holds that ends
// before its response is resumed upstream as the relay resumes it
// (resume.go), from the last event id it read.
func (a *Attempt) EachEvent(fn func(data []byte) (done, ok bool)) int {
	fr := &a.Rw.Fr // it holds what the attempt's peek read past its first events
	fr.Max = a.S.Cfg.MaxSSELine
	var data []byte
	a.Rw.Meter.Mem = a.S.Mem
	// The peek's events were rewritten (their ids noted by the rewriter
	// then); those framed here are the upstream's own, noted here.
	feed := func(ev []byte) (int, bool) {
		if data = sse.Data(data[:0], ev); len(data) == 0 {
			return 0, false
		}
		done, ok := fn(data)
		if cap(data) > wire.FreeHold {
			data = nil // a large event's copy is not kept for the next
		}
		switch {
		case !ok:
			return EventsGone, true
		case done:
			return EventsDone, true
		}
		return 0, false
	}
	for {
		for _, ev := range a.peeked() {
			if end, stop := feed(ev); stop {
				return end
			}
		}
		for {
			ev, ok, ferr := fr.Next()
			if ferr != nil {
				return EventsTooLarge
			}
			if !ok {
				break
			}
			a.Rw.NoteEvent(ev)
			if end, stop := feed(ev); stop {
				return end
			}
		}
		if a.Resp.TakeWake() {
			return EventsQuiet // a route's own reason to look up (held_call.go inject)
		}
		if fr.Buffered() == 0 && fr.Held() > wire.FreeHold {
			fr.Reset(wire.FreeHold) // a large event has passed: its room is not kept
		}
		n, err := a.Resp.Read(a.readBuf())
		fr.Feed(a.Buf[:n])
		// An event is held whole until it ends, then copied for fn (data)
		// and translated by it: counted past freeHold, with its copies.
		if !a.Rw.Meter.Hold(fr.Held() + 2*max(cap(data), fr.Buffered())) {
			return EventsOverBudget
		}
		if err != nil && n == 0 {
			if err != io.EOF && upstream.IsTimeout(err) { // IsTimeout allocates: not on every stream's end
				a.Resp.TakeWake()
				return EventsQuiet // only a route that set a deadline, or woke it, sees it
			}
			if us := (*upstreamStream)(a); us.resumable() && us.resume(err) {
				continue // the rest of the answer, on a GET with Last-Event-ID
			}
			return EventsCut
		}
	}
}

// next prepares the attempt for another exchange. A session the upstream
// opened for an answer that is dropped (a failed initialize, a 2026-07-28
// request to a session-era server) is DELETEd: nobody will use its id.
func (a *Attempt) Next() {
	if a.Sess == nil {
		a.S.Link.DropMinted(a.Resp)
	}
	a.Resp.Close()
	a.Resp.Response.Reset()
	a.tryAnswer.reset()
}

// agentGone reports whether the agent closed its connection while the
// attempt waited on the upstream.
func (a *Attempt) AgentGone() bool { return a.Watch != nil && a.Watch.Gone.Load() }

// eraRefused reports an upstream answer that refuses the request as of the
// session era (legacyRefused); the era is then asked again.
func (a *Attempt) eraRefused() bool {
	r := a.Resp
	if r.StatusCode() != fasthttp.StatusBadRequest || r.IsStream() || !era.LegacyRefused(fasthttp.StatusBadRequest, r.Body()) {
		return false
	}
	a.S.Eras.Forget()
	return true
}
