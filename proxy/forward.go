package proxy

import (
	"errors"
	"net"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/mcpheal/mcpheal/classify"
	"github.com/mcpheal/mcpheal/session"
	"github.com/mcpheal/mcpheal/upstream"
)

// attempt is one agent request on its way upstream: the loop
// send → judge → decide → act runs until the agent has its answer.
type attempt struct {
	s    *Server
	ctx  *fasthttp.RequestCtx
	sess *session.Session // nil: session-less (2026-07-28) pass-through
	msg  message          // by value: the attempt is pooled, so nothing escapes
	req  *fasthttp.Request
	resp *upstream.Response
	up   session.UpstreamID
	gen  uint64

	// replaySafe: the request may run twice without harm (see replayable);
	// decided once, before the first send.
	replaySafe bool
	healed     bool // this request healed the session once
	adopted    bool // this request took another process's heal once (shared.go)
	// mayHaveRun: an exchange of this request may have reached the
	// upstream's dispatcher (see facts.dispatched).
	mayHaveRun bool
	budget     time.Time // end of the heal budget; zero until the first failure
	delay      time.Duration
	// probing: this request is its session's probe of an outage (see
	// session.Probe); it must end the probe before it answers.
	probing bool

	// The SSE answer of a POST: rw frames and rewrites it; out holds the
	// rewritten events not yet handed to the agent (from outPos); first is
	// the raw first event with data, valid until rw is fed again.
	rw         eventRewriter
	buf        []byte // one upstream read
	out        []byte
	outPos     int
	first      []byte
	firstWhole bool     // first is a complete event, not a prefix past peekLimit
	eof        bool     // the upstream stream has ended
	conn       net.Conn // the agent's connection, while sseBody writes to it
	charged    int64    // taken from the memory budget for a buffered answer
	// watch notices the agent going away while it waits (gone.go); nil
	// for attempts that are not pooled. It stays with the pooled attempt.
	watch *agentWatch
}

var attemptPool = sync.Pool{New: func() any { return new(attempt) }}

// forward sends the agent's request upstream (swapping the session id) and
// gives the agent one answer: the upstream's, after a heal and replay if
// the rules allow, or mcpheal's own error. sess is nil for session-less
// (2026-07-28) traffic.
func (s *Server) forward(ctx *fasthttp.RequestCtx, sess *session.Session, msg message) {
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	s.copyRequest(ctx, req)
	a := attemptPool.Get().(*attempt)
	*a = attempt{s: s, ctx: ctx, sess: sess, msg: msg, req: req,
		rw: eventRewriter{fr: a.rw.fr, held: a.rw.held[:0]}, buf: a.buf, out: a.out[:0], watch: a.watch}
	if a.watch == nil {
		a.watch = newAgentWatch()
	}
	a.resp = upstream.AcquireResponse()
	a.resp.SetBudget(&s.mem) // a JSON answer is counted from its first byte until written
	if sess != nil {
		a.up, a.gen = sess.Current()
	}
	if a.run() {
		// The answer's body (sseBody, jsonBody) now owns a and a.resp:
		// nothing here may touch them again.
		return
	}
	upstream.ReleaseResponse(a.resp)
	a.s.mem.give(a.charged)
	a.release()
}

// release returns the attempt and its buffers to the pool.
func (a *attempt) release() {
	o, b, h := a.out, a.buf, a.rw.held
	if cap(o) > 64<<10 {
		o = nil // do not pin large buffers (golang/go#23199)
	}
	if cap(h) > 64<<10 {
		h = nil
	}
	a.rw.fr.Reset(64 << 10)
	*a = attempt{rw: eventRewriter{fr: a.rw.fr, held: h[:0]}, buf: b, out: o[:0], watch: a.watch}
	attemptPool.Put(a)
}

// run loops until the agent has an answer, then writes it: the one exit of
// every request. It reports whether that answer is a body that now owns a
// and a.resp. The agent's connection is watched from the first send until
// the answer is written.
func (a *attempt) run() bool {
	a.replaySafe = a.replayable()
	a.watchAgent()
	out := a.loop()
	a.endProbe()
	if a.answer(out) {
		return true // the body stops the watch once written (Close)
	}
	a.unwatch()
	return false
}

// loop is send → judge → decide → act. Each turn either ends with the
// outcome the agent gets, or sends the request again: after a heal, or
// after waiting out a failure that proves no harm.
func (a *attempt) loop() outcome {
	if a.sess != nil && a.sess.NeedsInit() {
		// Restored from its sealed id: create its upstream session first,
		// under the credential it is bound to only.
		if !a.mayHeal() {
			return outcome{kind: outGone}
		}
		if out, ok := a.heal(reasonRestored); !ok {
			return out
		}
	}
	for {
		if ok, wait := a.s.breaker.Allow(); !ok {
			return outcome{kind: outBreakerOpen, wait: wait}
		}
		err := a.send()
		f := a.judge(err)
		a.mayHaveRun = a.mayHaveRun || f.dispatched
		if !f.agentGone { // an interrupted exchange says nothing of the upstream
			a.s.count.class(f.class)
			a.s.recordHealth(f.class)
		}
		switch decide(f) {
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
		case actRetry:
			if !a.backoff() {
				return outcome{kind: outDown, why: "upstream unreachable"}
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
// DoOnce: never resent by the client, never on a connection whose
// liveness is in doubt.
func (a *attempt) send() error {
	if a.mayHaveRun && !a.replaySafe {
		// decide never lets this happen; count it so that every test can
		// assert it did not.
		a.s.count.unsafeResends.Add(1)
		a.s.log.Error().Str(logMethod, a.msg.method).Str("tool", a.msg.tool).
			Msg("BUG: a request that may have run is sent again")
	}
	setSessionHeader(a.req, a.up)
	a.s.count.bytesIn.Add(uint64(len(a.req.Body())))
	deadline := time.Now().Add(a.s.cfg.ResponseTimeout)
	if a.replaySafe {
		return a.s.do(a.req, a.resp, deadline)
	}
	return a.s.doOnce(a.req, a.resp, deadline)
}

// judge turns one exchange into the facts decide needs: the class of the
// answer (peeking at the first event of a POST's SSE answer), and whether
// the upstream may have run the request.
func (a *attempt) judge(err error) facts {
	f := facts{replaySafe: a.replaySafe, session: a.sess != nil, healed: a.healed}
	if a.agentGone() {
		// Interrupted, or answered as the agent left: either way nobody
		// waits for this answer.
		f.agentGone, f.dispatched = true, err == nil || upstream.Delivered(err)
		return f
	}
	if err != nil {
		f.class, f.dispatched = failClass(err), upstream.Delivered(err)
		var tl *upstream.TooLargeError
		if errors.As(err, &tl) || errors.Is(err, upstream.ErrOverBudget) {
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
		a.rw.gen, a.rw.max = a.gen, a.s.cfg.MaxSSELine
		a.rw.watch = a.msg.method == "tools/list" && a.sess != nil
		var ok bool
		a.out, a.first, a.firstWhole, ok = peekFirst(r, &a.rw, a.out[:0], a.readBuf())
		if !ok {
			// Cut, or ended unanswered: it may have run.
			f.class, f.dispatched = classify.TransportDead, true
			return f
		}
		f.class = classify.Classify(status, ct, a.first)
	case a.sess == nil && status == fasthttp.StatusNotFound:
		f.class = classify.Protocol // no session id was sent: 404 is not about one
	default:
		f.class = classify.Classify(status, ct, r.Body())
	}
	switch f.class {
	case classify.SessionGone:
		// Rejected before dispatch (README "Replay rules"): never ran.
		f.mayHeal = a.sess != nil && !a.healed && a.mayHeal()
	case classify.TransportDead:
		// A 502/503/504. Proof of no harm only if the body is a known
		// refusal by the server itself; a gateway's error page is not.
		body := a.first // a streamed answer: its first event (Body would drain it)
		if !r.IsStream() {
			body = r.Body()
		}
		f.dispatched = !classify.Refused(status, ct, body)
	}
	return f
}

// readBuf returns the attempt's buffer for one upstream read.
func (a *attempt) readBuf() []byte {
	if cap(a.buf) < readBuf {
		a.buf = make([]byte, readBuf)
	}
	return a.buf[:readBuf]
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

// replayable reports whether the request may run twice without harm
// (README "Replay rules").
func (a *attempt) replayable() bool {
	m := a.msg
	if m.batch {
		return false // its elements are not judged one by one: one may be a tools/call
	}
	if m.get || !m.isRequest() {
		return true // a GET stream, a notification, an answer: nothing runs twice
	}
	switch m.method {
	case "ping", "initialize", "tools/list", "resources/list", "resources/templates/list",
		"resources/read", "prompts/list", "prompts/get", "completion/complete",
		"logging/setLevel", "resources/subscribe", "resources/unsubscribe", "server/discover":
		return true
	case "tools/call":
		return a.s.replayTools[m.tool] || (a.sess != nil && a.sess.Replayable(m.tool))
	}
	return false
}

// next prepares the attempt for another exchange.
func (a *attempt) next() {
	a.resp.Close()
	a.resp.Response.Reset()
	a.rw.fr.Reset(64 << 10)
	a.out, a.first, a.firstWhole = a.out[:0], nil, false
}
