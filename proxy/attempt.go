package proxy

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
	"github.com/mcpheal/mcpheal/session"
	"github.com/mcpheal/mcpheal/upstream"
)

// attempt is one agent request on its way upstream: the loop
// send → judge → decide → act runs until the request has its outcome.
// Every route sends through it: the session-era pass-through and the
// 2026-07-28 pass-through ([Server.forward], whose answer [attempt.answer]
// writes), and the bridge (bridge.go), which writes its own translation.
type attempt struct {
	s    *env
	ctx  *fasthttp.RequestCtx // the agent's; nil once the handler has returned (a bridged call's later rounds)
	r    *request
	sess *session.Session // the agent's session; nil for 2026-07-28 pass-through
	msg  message          // by value: the attempt is pooled, so nothing escapes
	req  *fasthttp.Request
	resp *upstream.Response
	up   session.UpstreamID
	gen  uint64
	// heals: the upstream holds a session for this request that mcpheal
	// may re-create (a session-era upstream; not the bridge).
	heals bool

	// replaySafe: the request may run twice without harm (replayable);
	// decided once, before the first send.
	replaySafe bool
	healed     bool // this request healed the session once
	adopted    bool // this request took another process's heal once (fleet.go)
	// mayHaveRun: an exchange of this request may have reached the
	// upstream's dispatcher (see facts.dispatched).
	mayHaveRun bool
	budget     time.Time // end of the heal budget; zero until the first failure
	waited     bool      // waited out a busy upstream's Retry-After once (actWait)
	wait       upstream.Backoff
	// probing: this request is its session's probe of an outage (see
	// session.Probe); it must end the probe before it answers.
	probing bool

	// tryAnswer is the upstream's answer to the exchange in flight.
	tryAnswer
	outPos    int
	eof       bool     // the upstream stream has ended
	readWhole bool     // the SSE answer was read up to its response: a.out is all the agent gets
	conn      net.Conn // the agent's connection, while sseBody writes to it
	charged   int64    // taken from the memory budget for a buffered answer
	// log keeps the streamed answer for its agent to resume (answerlog.go);
	// draining: the agent's connection dropped and drain, not fasthttp,
	// owns the attempt now.
	log      *answerLog
	draining bool
	// watch notices the agent going away while it waits (agentwatch.go); nil
	// for attempts that are not pooled. It stays with the pooled attempt.
	watch *agentWatch
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
	rw         eventRewriter
	buf        []byte // one upstream read
	out        []byte
	first      []byte
	firstWhole bool // first is a complete event, not a prefix past peekLimit
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
	t.rw.meter.release()
	t.rw.fr.Reset(64 << 10)
	*t = tryAnswer{rw: eventRewriter{fr: t.rw.fr, held: t.rw.held[:0], idBuf: t.rw.idBuf[:0]}, buf: t.buf, out: t.out[:0]}
}

var attemptPool = sync.Pool{New: func() any { return new(attempt) }}

// newAttempt takes a pooled attempt for r, with its upstream request and
// response; ctx may be nil (no agent connection to watch or answer).
func newAttempt(s *env, ctx *fasthttp.RequestCtx, r *request) *attempt {
	a := attemptPool.Get().(*attempt)
	// Its answer state was reset by release (or is new): its buffers stay.
	*a = attempt{s: s, ctx: ctx, r: r, sess: r.sess, msg: r.msg, watch: a.watch, tryAnswer: a.tryAnswer}
	if a.watch == nil {
		a.watch = newAgentWatch()
	} else if a.watch.state.Load() != watchIdle || a.watch.gone.Load() {
		a.watch.stop() // whatever its last user left: an attempt starts watching nobody
	}
	a.req = fasthttp.AcquireRequest()
	a.resp = upstream.AcquireResponse()
	a.resp.SetBudget(s.mem) // a JSON answer is counted from its first byte until written
	if a.sess != nil {
		a.up, a.gen = a.sess.Current()
	}
	a.replaySafe = replayable(&a.msg, a.sess, s.replayTools)
	return a
}

// release returns the attempt, its request and response and its buffers.
func (a *attempt) release() {
	fasthttp.ReleaseRequest(a.req)
	if a.resp != nil {
		upstream.ReleaseResponse(a.resp)
	}
	a.s.mem.give(a.charged)
	if cap(a.out) > 64<<10 {
		a.out = nil // do not pin large buffers (golang/go#23199)
	}
	if cap(a.rw.held) > 64<<10 {
		a.rw.held = nil
	}
	a.tryAnswer.reset()
	*a = attempt{tryAnswer: a.tryAnswer, watch: a.watch}
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
func (a *attempt) run() (owned, reroute bool) {
	a.watchAgent()
	out := a.loop()
	if out.kind == outUpstream && a.heals && a.eraRefused() && a.s.eras.bridged(a.r.hdr.PeekBytes(hdrAuthorization)) {
		a.unwatch()
		return false, true
	}
	if a.answer(out) {
		a.r = nil          // the request goes back to its pool when the handler returns
		return true, false // the body stops the watch once written (Close)
	}
	a.unwatch()
	return false, false
}

// loop is send → judge → decide → act. Each turn either ends with the
// outcome the agent gets, or sends the request again: after a heal, or
// after waiting out a failure that proves no harm.
func (a *attempt) loop() outcome {
	defer a.endProbe()
	if a.heals && a.sess.NeedsInit() {
		// Restored from its sealed id: create its upstream session first,
		// under a credential it is bound to only.
		if a.r.standing != bound {
			return outcome{kind: outGone}
		}
		if out, ok := a.heal(reasonRestored); !ok {
			return out
		}
	}
	for {
		if ok, wait := a.s.link.breaker.Allow(); !ok {
			if a.budget.IsZero() {
				// A new request waits out a young outage (a redeploy) to
				// its end, and fails fast past it.
				end := a.s.link.outageEnd()
				if !time.Now().Before(end) {
					return outcome{kind: outBreakerOpen, wait: wait}
				}
				a.budget = end
			}
			// Already waiting out the outage within its heal budget: it
			// goes on waiting (the outage watcher wakes it when the
			// upstream takes connections again), and is answered as the
			// docs/healing.md says of an outage, at the budget's end.
			if !a.backoff() {
				return outcome{kind: outDown, why: "upstream unreachable"}
			}
			continue
		}
		err := a.send()
		if err == nil {
			a.sent()
		}
		f := a.judge(err)
		if a.xspan != nil {
			endExchange(a.xspan, a.resp.StatusCode(), f.class, err)
			a.xspan = nil
		}
		a.mayHaveRun = a.mayHaveRun || f.dispatched
		if !f.agentGone && !f.credential { // neither says anything of the upstream
			a.s.count.class(f.class)
			a.s.link.recordHealth(f.class)
		}
		act := decide(f)
		if f.class == classify.Busy {
			a.s.link.noteBusy(a.resp.StatusCode(), act == actWait)
		}
		switch act {
		case actAbandon:
			return outcome{kind: outAgentGone}
		case actPass:
			return outcome{kind: outUpstream, class: f.class}
		case actRefuse:
			return outcome{kind: outRefused, class: f.class, err: err}
		case actFail:
			return outcome{kind: outDown, why: "upstream dropped the new session at once"}
		case actTooLarge:
			return outcome{kind: outTooLarge, class: f.class, err: err}
		case actCredential:
			return outcome{kind: outCredential, err: err}
		case actRetry:
			if !a.backoff() {
				return outcome{kind: outDown, why: "upstream unreachable"}
			}
		case actWait:
			a.waited = true
			if !a.s.link.sleep(retryAfter(&a.resp.Header, time.Now())) {
				return outcome{kind: outDown, why: "mcpheal is shutting down"}
			}
			if a.agentGone() {
				return outcome{kind: outAgentGone}
			}
		case actHeal:
			if out, ok := a.heal(reasonSessionGone); !ok {
				return out
			}
			a.endProbe() // the requests it held go next, on the new session
			if out, ok := a.afterHeal(); !ok {
				return out
			}
		}
		a.s.count.replays.Add(1)
	}
}

// send makes one exchange. A request that is not replay-safe goes with
// doOnce: never resent by the client, never on a connection whose
// liveness is in doubt.
func (a *attempt) send() error {
	if a.mayHaveRun && !a.replaySafe {
		// decide never lets this happen; count it so that every test can
		// assert it did not.
		a.s.count.unsafeResends.Add(1)
		a.s.log.Error().Str(logMethod, logText(a.msg.method)).Str(logTool, logText(a.msg.tool)).
			Msg("BUG: a request that may have run is sent again")
	}
	if a.heals {
		setSessionHeader(a.req, a.up)
	}
	a.tries++
	if a.s.trace != nil && a.r != nil && a.r.tctx != nil {
		a.xspan = a.s.trace.exchange(a.r.tctx, a.req, a.spanName(), attribute.Int("mcpheal.try", a.tries))
	}
	a.s.count.bytesIn.Add(uint64(len(a.req.Body())))
	deadline := time.Now().Add(a.s.cfg.ResponseTimeout)
	if a.replaySafe {
		return a.s.link.do(a.req, a.resp, deadline)
	}
	return a.s.link.doOnce(a.req, a.resp, deadline)
}

// sent runs once an exchange of the request has reached the upstream and
// its answer began: what was put off until the agent's request went first
// (Session.DueTools) goes now.
func (a *attempt) sent() {
	if a.sess != nil {
		a.s.healer.toolsDue(a.sess)
	}
}

// judge turns one exchange into the facts decide needs: the class of the
// answer (peeking at the first event of a POST's SSE answer), and whether
// the upstream may have run the request.
func (a *attempt) judge(err error) facts {
	if !a.replaySafe && a.msg.tool != "" {
		// mcpheal may have learnt the tool's annotations since the request
		// set out (its own tools/list of a held session, held.go).
		a.replaySafe = replayable(&a.msg, a.sess, a.s.replayTools)
	}
	f := facts{replaySafe: a.replaySafe, session: a.heals, healed: a.healed}
	if a.agentGone() {
		// Interrupted, or answered as the agent left: either way nobody
		// waits for this answer.
		f.agentGone, f.dispatched = true, err == nil || upstream.Delivered(err)
		return f
	}
	if err != nil {
		var ce *credentialError
		if errors.As(err, &ce) {
			f.class, f.credential = classify.Protocol, true // nothing was sent
			return f
		}
		f.class, f.dispatched = failClass(err), upstream.Delivered(err)
		var tl *upstream.TooLargeError
		if errors.As(err, &tl) || errors.Is(err, upstream.ErrOverBudget) || errors.Is(err, upstream.ErrHeadTooLarge) {
			f.class, f.tooLarge = classify.Protocol, true // it answered
		}
		return f
	}
	r := a.resp
	status, ct := r.StatusCode(), r.Header.ContentType()
	switch {
	case r.IsStream() && a.msg.get:
		// The standalone stream may stay quiet for minutes: judge the head.
		f.class = classify.Classify(status, ct, nil)
	case r.IsStream():
		if !a.peek() {
			// Cut, or ended unanswered: it may have run. Cut by the
			// watch, it is the agent that went away.
			f.class, f.dispatched, f.agentGone = classify.TransportDead, true, a.agentGone()
			return f
		}
		f.class = classify.Classify(status, ct, a.first)
	case !a.heals && status == fasthttp.StatusNotFound:
		f.class = classify.Protocol // no session id was sent: 404 is not about one
	default:
		f.class = classify.Classify(status, ct, r.Body())
	}
	switch f.class {
	case classify.SessionGone:
		// Rejected before dispatch (docs/healing.md "Replay rules"): never ran.
		f.mayHeal = a.heals && !a.healed && a.r.standing == bound
	case classify.TransportDead, classify.Busy:
		// A 502/503/504. Proof of no harm only if the body is a known
		// refusal by the server itself; a gateway's error page is not. A
		// rate limit (429) turns requests away before they run.
		body := a.first // a streamed answer: its first event (Body would drain it)
		if !r.IsStream() {
			body = r.Body()
		}
		f.dispatched = status != fasthttp.StatusTooManyRequests && !classify.Refused(status, ct, body)
		if status == fasthttp.StatusServiceUnavailable && len(r.Header.Peek("Retry-After")) > 0 {
			f.class = classify.Busy // it says when to come back: a wait, not an outage
		}
		if f.class == classify.Busy {
			if a.budget.IsZero() {
				a.budget = time.Now().Add(a.s.cfg.HealTimeout)
			}
			now := time.Now()
			f.waited, f.waitFits = a.waited, now.Add(retryAfter(&r.Header, now)).Before(a.budget)
		}
	}
	return f
}

// peek reads a POST's SSE answer up to its first event with data, through
// the rewriter set up for it (peekFirst); false when the stream ended or
// broke first.
func (a *attempt) peek() bool {
	a.rw.gen, a.rw.max = a.gen, a.s.cfg.MaxSSELine
	a.rw.meter.mem = a.s.mem
	if !a.heals {
		a.rw.gen = 1 // nothing to renumber: no session, or the bridge's own
	}
	a.rw.watch = a.msg.method == "tools/list" && a.sess != nil
	if a.heals && a.msg.isRequest() && !a.msg.batch && a.s.cfg.ResumeBuffer > 0 {
		a.rw.own = ownStreams.Add(1) // its agent may resume it (answerlog.go)
	}
	// A call that sends nothing for stream_keepalive is judged on its head
	// and streamed, so that its agent gets keepalive comments (idle.go): a
	// session error comes at once, never after that long.
	a.quiet = a.msg.isRequest()
	var ok bool
	a.out, a.first, a.firstWhole, ok = peekFirst((*upstreamStream)(a), &a.rw, a.out[:0], a.readBuf())
	if a.quietArmed {
		_ = a.resp.SetReadDeadline(time.Time{})
	}
	a.quiet, a.quietArmed = false, false
	return ok
}

// readBuf returns the attempt's buffer for one upstream read.
func (t *tryAnswer) readBuf() []byte {
	if cap(t.buf) < readBuf {
		t.buf = make([]byte, readBuf)
	}
	return t.buf[:readBuf]
}

// heal re-initializes the upstream session (single-flight per session) and
// points the request at the new one. When healing fails, ok is false and
// out is what the agent gets.
func (a *attempt) heal(reason int) (out outcome, ok bool) {
	a.next()
	if a.budget.IsZero() {
		a.budget = time.Now().Add(a.s.cfg.HealTimeout)
	}
	ctx, cancel := context.WithDeadline(a.traceContext(), a.budget)
	defer cancel()
	up, gen, err := a.s.healer.heal(ctx, a.sess, a.gen, reason, a.r.hdr)
	if err != nil {
		var (
			bo *breakerOpenError
			ce *credentialError
			he *healAuthError
			be *busyError
		)
		switch {
		case errors.As(err, &bo):
			return outcome{kind: outBreakerOpen, wait: bo.wait}, false
		case errors.As(err, &ce):
			return outcome{kind: outCredential, err: err}, false
		case errors.As(err, &he):
			return outcome{kind: outHealAuth, err: he}, false
		case errors.As(err, &be):
			return outcome{kind: outBusy, err: be}, false
		case errors.Is(err, errClosing):
			return outcome{kind: outDown, why: "mcpheal is shutting down"}, false
		case errors.Is(err, errRecipeRefused) || errors.Is(err, session.ErrClosed):
			// Its id would open again and heal into the same refusal.
			a.s.sessions.end(a.sess, errors.Is(err, errRecipeRefused))
			return outcome{kind: outGone}, false
		}
		return outcome{kind: outDown, why: "upstream unreachable while re-initializing the session"}, false
	}
	// A session adopted from another process may have died with this
	// one (an upstream restart): the request may then heal once more.
	a.up, a.gen = up, gen
	if !a.sess.WasAdopted(gen) || a.adopted {
		a.healed = true
	}
	a.adopted = true
	return outcome{}, true
}

// afterHeal decides what a request does once its session healed: most are
// replayed; a few have nothing left to do on the new session.
func (a *attempt) afterHeal() (outcome, bool) {
	switch {
	case a.msg.get && len(a.req.Header.PeekBytes(hdrLastEventID)) > 0:
		// Its Last-Event-ID named the dead session's events.
		return outcome{kind: outEndResumption}, false
	case !a.msg.get && !a.msg.isRequest():
		// A notification or a response to a dead session: the new session
		// never asked for it; acknowledge and drop it.
		return outcome{kind: outAccepted}, false
	}
	return outcome{}, true
}

// backoff waits before the next try, within the heal budget. It reports
// false when the budget is spent. One request per session waits out the
// outage by trying (session.Probe); the others wait for it.
func (a *attempt) backoff() bool {
	a.next()
	if a.budget.IsZero() {
		a.budget = time.Now().Add(a.s.cfg.HealTimeout)
	}
	if a.wait.Min == 0 {
		a.wait = upstream.Backoff{Min: 10 * time.Millisecond, Max: time.Second}
	}
	left := time.Until(a.budget)
	if left <= 0 {
		return false
	}
	if a.s.trace != nil && a.r != nil && a.r.tctx != nil {
		_, sp := a.s.trace.child(a.r.tctx, "mcpheal wait", attribute.String("mcpheal.wait", "outage"))
		defer sp.End()
	}
	if a.sess != nil && !a.probing {
		lead, done := a.sess.Probe()
		if !lead {
			return a.awaitProbe(done, left)
		}
		a.probing = true
	}
	return a.s.link.sleep(min(a.wait.Next(), left))
}

// traceContext is the context of the request's span, for work done on
// its behalf (a heal); Background when tracing is off.
func (a *attempt) traceContext() context.Context {
	if a.r != nil && a.r.tctx != nil {
		return a.r.tctx
	}
	return context.Background()
}

// spanName names an exchange's span as MCP's conventions name a client
// span: the method, and the tool it calls. It is a copy: the message's
// members are views into the agent's body, which outlives no handler.
func (a *attempt) spanName() string {
	switch {
	case a.msg.get:
		return "GET stream"
	case a.msg.tool != "":
		return spanText(a.msg.method) + " " + spanText(a.msg.tool)
	case a.msg.method == "":
		return "response"
	}
	return spanText(a.msg.method)
}

// awaitProbe waits, within the heal budget, for the request probing the
// session's outage, then points this request at the session's current
// upstream id: the probe may have healed it meanwhile.
func (a *attempt) awaitProbe(done <-chan struct{}, left time.Duration) bool {
	t := time.NewTimer(left)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		return false
	case <-a.s.done:
		return false
	}
	a.up, a.gen = a.sess.Current()
	return true
}

// endProbe releases the requests waiting on this one's probe, if it is one.
func (a *attempt) endProbe() {
	if a.probing {
		a.probing = false
		a.sess.ProbeDone()
	}
}

// abandon ends the attempt's exchange in flight as if its agent had gone
// (a bridged call the agent cancelled): decide gives up on it and nothing
// is sent again. It may run on another goroutine than the attempt's.
func (a *attempt) abandon() {
	a.watch.gone.Store(true)
	a.resp.Interrupt()
}

// renew readies the attempt for another request on the same route (a
// bridged call's next round): that the upstream ran the last one says
// nothing of this one.
func (a *attempt) renew() {
	a.next()
	a.mayHaveRun, a.healed, a.adopted, a.eof = false, false, false, false
	a.budget, a.wait = time.Time{}, upstream.Backoff{}
}

// peeked returns, once, the whole events the first exchange's peek read
// (judge), for a route that reads the events itself (the bridge).
func (t *tryAnswer) peeked() [][]byte {
	if len(t.out) == 0 {
		return nil
	}
	var fr sse.Framer
	fr.Feed(t.out)
	t.out = t.out[:0]
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
	eventsDone       = iota // fn said the answer is complete
	eventsGone              // fn could not write to the agent
	eventsCut               // the upstream stream ended first
	eventsTooLarge          // an upstream event passed max_sse_line
	eventsOverBudget        // holding an upstream event whole would pass memory_budget
	eventsQuiet             // nothing came before the read deadline fn set, or a wake
)

// eachEvent reads the SSE answer's events, the first exchange's peek
// first, and gives fn the data of each that has any, until fn reports the
// answer done (done) or the agent gone (!ok), or the stream ends. It is how
// a route that reads the events itself (the bridges) reads them; data is
// valid until fn returns. A stream of a session mcpheal holds that ends
// before its response is resumed upstream as the relay resumes it
// (resume.go), from the last event id it read.
func (a *attempt) eachEvent(fn func(data []byte) (done, ok bool)) int {
	fr := &a.rw.fr // it holds what the attempt's peek read past its first events
	fr.Max = a.s.cfg.MaxSSELine
	var data []byte
	a.rw.meter.mem = a.s.mem
	// The peek's events were rewritten (their ids noted by the rewriter
	// then); those framed here are the upstream's own, noted here.
	feed := func(ev []byte) (int, bool) {
		if data = sse.Data(data[:0], ev); len(data) == 0 {
			return 0, false
		}
		done, ok := fn(data)
		if cap(data) > freeHold {
			data = nil // a large event's copy is not kept for the next
		}
		switch {
		case !ok:
			return eventsGone, true
		case done:
			return eventsDone, true
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
				return eventsTooLarge
			}
			if !ok {
				break
			}
			a.rw.noteEvent(ev)
			if end, stop := feed(ev); stop {
				return end
			}
		}
		if a.resp.TakeWake() {
			return eventsQuiet // a route's own reason to look up (held_call.go inject)
		}
		if fr.Buffered() == 0 && fr.Held() > freeHold {
			fr.Reset(freeHold) // a large event has passed: its room is not kept
		}
		n, err := a.resp.Read(a.readBuf())
		fr.Feed(a.buf[:n])
		// An event is held whole until it ends, then copied for fn (data)
		// and translated by it: counted past freeHold, with its copies.
		if !a.rw.meter.hold(fr.Held() + 2*max(cap(data), fr.Buffered())) {
			return eventsOverBudget
		}
		if err != nil && n == 0 {
			if err != io.EOF && upstream.IsTimeout(err) { // IsTimeout allocates: not on every stream's end
				a.resp.TakeWake()
				return eventsQuiet // only a route that set a deadline, or woke it, sees it
			}
			if us := (*upstreamStream)(a); us.resumable() && us.resume(err) {
				continue // the rest of the answer, on a GET with Last-Event-ID
			}
			return eventsCut
		}
	}
}

// next prepares the attempt for another exchange. A session the upstream
// opened for an answer that is dropped (a failed initialize, a 2026-07-28
// request to a session-era server) is DELETEd: nobody will use its id.
func (a *attempt) next() {
	if a.sess == nil {
		a.s.link.dropMinted(a.resp)
	}
	a.resp.Close()
	a.resp.Response.Reset()
	a.tryAnswer.reset()
}

// agentGone reports whether the agent closed its connection while the
// attempt waited on the upstream.
func (a *attempt) agentGone() bool { return a.watch != nil && a.watch.gone.Load() }

// eraRefused reports an upstream answer that refuses the request as of the
// session era (legacyRefused); the era is then asked again.
func (a *attempt) eraRefused() bool {
	r := a.resp
	if r.StatusCode() != fasthttp.StatusBadRequest || r.IsStream() || !legacyRefused(fasthttp.StatusBadRequest, r.Body()) {
		return false
	}
	a.s.eras.forget()
	return true
}
