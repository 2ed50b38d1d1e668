package proxy

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/mcpheal/mcpheal/classify"
	"github.com/mcpheal/mcpheal/session"
	"github.com/mcpheal/mcpheal/upstream"
)

// peekLimit caps how much of an SSE answer is held back to find its first
// event (a tools/list answer may be large; the first event decides).
const peekLimit = 1 << 20

// attempt is one request's walk through send → classify → heal → replay.
type attempt struct {
	s      *Server
	ctx    *fasthttp.RequestCtx
	sess   *session.Session // nil: stateless pass-through
	msg    message          // by value: the attempt is pooled, so nothing escapes
	req    *fasthttp.Request
	resp   *upstream.Response
	peek   []byte // first SSE event(s) of resp, forwarded before the rest
	out    []byte // rewritten events on their way to the agent
	outPos int    // how much of out sseBody has handed out
	eof    bool   // sseBody: the upstream stream has ended
	rw     eventRewriter
	up     session.UpstreamID
	gen    uint64
	budget time.Time // end of the heal budget; zero until the first failure
	healed bool
	// probing: this request is its session's probe of an outage (see
	// session.Probe); it must end the probe before it answers.
	probing bool
	delay   time.Duration
}

var attemptPool = sync.Pool{New: func() any { return new(attempt) }}

// forward sends the agent's request upstream (swapping the session id),
// classifies the answer, heals and replays when the rules allow, and passes
// the final answer back. sess is nil for session-less (2026-07-28) traffic.
func (s *Server) forward(ctx *fasthttp.RequestCtx, sess *session.Session, msg message) {
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	s.copyRequest(ctx, req)
	a := attemptPool.Get().(*attempt)
	*a = attempt{s: s, ctx: ctx, sess: sess, msg: msg, req: req, peek: a.peek[:0], out: a.out[:0],
		rw: eventRewriter{pending: a.rw.pending[:0]}}
	a.resp = upstream.AcquireResponse()
	if sess != nil {
		a.up, a.gen = sess.Current()
	}
	if a.run() {
		// The answer's body (sseBody, or serveStream's relay) now owns a
		// and a.resp: nothing here may touch them again.
		return
	}
	upstream.ReleaseResponse(a.resp)
	a.release()
}

// release returns the attempt and its peek buffer to the pool.
func (a *attempt) release() {
	p, o, pend := a.peek, a.out, a.rw.pending
	if cap(p) > 64<<10 {
		p = nil // do not pin large buffers (golang/go#23199)
	}
	if cap(o) > 64<<10 {
		o = nil
	}
	if cap(pend) > 64<<10 {
		pend = nil
	}
	*a = attempt{peek: p[:0], out: o[:0]}
	a.rw.pending = pend[:0]
	attemptPool.Put(a)
}

// run loops until the agent has an answer; it reports whether that answer
// is a stream that now owns a.resp.
func (a *attempt) run() bool {
	if a.loop() {
		return true // the probe, if a was one, ended before the answer
	}
	a.endProbe()
	return false
}

func (a *attempt) loop() bool {
	for {
		if !a.allowed() {
			return false
		}
		setSessionHeader(a.req, a.up)
		a.s.count.bytesIn.Add(uint64(len(a.req.Body())))
		err := a.s.do(a.req, a.resp, time.Now().Add(a.s.cfg.ResponseTimeout))
		cls := a.judge(err)
		a.s.count.class(cls)
		a.s.recordHealth(cls)
		switch cls {
		case classify.SessionGone:
			if a.sess == nil || a.healed || !a.mayHeal() {
				a.endProbe()
				if a.healed {
					a.upstreamDown("upstream dropped the new session at once")
					return false
				}
				break
			}
			healed := a.heal(reasonSessionGone)
			a.endProbe() // the requests it held go next, on the new session
			if !healed {
				return false
			}
			if a.msg.get && len(a.req.Header.PeekBytes(hdrLastEventID)) > 0 {
				// Its Last-Event-ID named the dead session's events.
				a.s.count.request(&a.msg, classify.OK)
				endResumption(a.ctx)
				return false
			}
			if !a.msg.get && !a.msg.isRequest() {
				// A notification or a response to a dead session: the new
				// session never asked for it; acknowledge and drop it.
				a.s.count.request(&a.msg, classify.OK)
				a.ctx.SetStatusCode(fasthttp.StatusAccepted)
				return false
			}
			a.s.count.replays.Add(1)
			continue
		case classify.TransportDead, classify.Timeout:
			if a.delivered(err) && !a.replayable() {
				a.refuse(cls, err)
				return false
			}
			if !a.backoff() {
				a.upstreamDown("upstream unreachable")
				return false
			}
			a.s.count.replays.Add(1)
			continue
		}
		a.endProbe()
		a.s.count.request(&a.msg, cls)
		if cls == classify.OK && a.sess != nil {
			a.accepted()
		}
		return a.s.respond(a)
	}
}

// accepted runs when the upstream accepted the request on the session: it
// journals session state, and moves the session's binding to the request's
// credential if that differs (token rotation: the upstream is the judge).
func (a *attempt) accepted() {
	if len(a.msg.method) > 9 {
		noteJournal(a.sess, &a.msg, a.ctx.PostBody())
	}
	auth := a.ctx.Request.Header.PeekBytes(hdrAuthorization)
	if _, hdr := a.sess.Binding(); headerValue(hdr, "Authorization") == b2s(auth) {
		return // the credential the session holds: no hashing on the hot path
	}
	fp := a.s.fingerprint(auth)
	if !sameCredential(a.sess, fp) {
		a.sess.Rebind(fp.String(), recipeHeaders(&a.req.Header))
		a.s.log.Info().Str(logSession, a.sess.ID.Short()).Msg("session credential rotated")
	}
}

// headerValue returns the value of the named header in hdr, or "".
func headerValue(hdr [][2]string, name string) string {
	for _, kv := range hdr {
		if strings.EqualFold(kv[0], name) {
			return kv[1]
		}
	}
	return ""
}

// allowed checks the upstream's circuit breaker; while it is open the agent
// gets 503 at once.
func (a *attempt) allowed() bool {
	ok, wait := a.s.breaker.Allow()
	if !ok {
		a.breakerOpen(wait)
	}
	return ok
}

// recordHealth feeds the breaker: a transport failure is an infrastructure
// failure; any HTTP answer shows the upstream is up.
func (s *Server) recordHealth(cls classify.Class) {
	if cls == classify.TransportDead || cls == classify.Timeout {
		s.upFailure()
	} else {
		s.upSuccess()
	}
}

// judge classifies the outcome of one exchange, peeking at the first event
// of a POST's SSE answer. The agent's GET stream is judged on its status.
func (a *attempt) judge(err error) classify.Class {
	if err != nil {
		if upstream.IsTimeout(err) {
			return classify.Timeout
		}
		return classify.TransportDead
	}
	r := a.resp
	status := r.StatusCode()
	if r.IsStream() && a.msg.get {
		// The standalone stream may stay quiet for minutes: judge the head.
		return classify.Classify(status, r.Header.ContentType(), nil)
	}
	if r.IsStream() {
		var perr error
		a.peek, perr = peekEvent(r, a.peek[:0], peekLimit)
		if perr != nil && perr != errPeekTooLarge {
			return classify.TransportDead // cut, or ended unanswered: it may have run
		}
		return classify.Classify(status, r.Header.ContentType(), a.peek)
	}
	if a.sess == nil && status == fasthttp.StatusNotFound {
		return classify.Protocol // no session id was sent: 404 is not about one
	}
	return classify.Classify(status, r.Header.ContentType(), r.Body())
}

// delivered reports whether a failed exchange may have reached the
// upstream's dispatcher. A 503 is a refusal before dispatch (a server
// shutting down, or at its session cap); a 502/504 from a gateway is not
// proof of anything.
func (a *attempt) delivered(err error) bool {
	if err != nil {
		return upstream.Delivered(err)
	}
	return a.resp.StatusCode() != fasthttp.StatusServiceUnavailable
}

// next prepares a.resp for another exchange.
func (a *attempt) next() {
	a.resp.Close()
	a.resp.Response.Reset()
	a.peek = a.peek[:0]
}

// backoff waits before the next try, within the heal budget. It reports
// false when the budget is spent.
func (a *attempt) backoff() bool {
	a.next()
	if a.budget.IsZero() {
		a.budget = time.Now().Add(a.s.cfg.HealTimeout)
	}
	if a.delay == 0 {
		a.delay = 10 * time.Millisecond
	}
	left := time.Until(a.budget)
	if left <= 0 {
		return false
	}
	if a.sess != nil && !a.probing {
		lead, done := a.sess.Probe()
		if !lead {
			return a.awaitProbe(done, left)
		}
		a.probing = true
	}
	if !a.s.sleep(min(a.delay, left)) {
		return false
	}
	a.delay = min(2*a.delay, time.Second)
	return true
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

// sleep waits d unless the server is closing.
// sleep waits d unless the server is closing; it ends early, reporting
// true, when the upstream answers again after failures, so that requests
// and heals waiting out an outage go at once instead of at their next
// backoff step.
func (s *Server) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-s.recovered():
		return true
	case <-s.done:
		return false
	}
}

// recovered returns a channel closed when the upstream next answers after
// a failure.
func (s *Server) recovered() <-chan struct{} {
	s.wakeMu.Lock()
	defer s.wakeMu.Unlock()
	return s.wake
}

// upSuccess records that the upstream answered: it feeds the breaker and
// wakes everyone waiting out a failure.
func (s *Server) upSuccess() {
	s.breaker.Success()
	if s.failing.Load() && s.failing.Swap(false) {
		s.wakeAll()
	}
}

// wakeAll ends every backoff wait now.
func (s *Server) wakeAll() {
	s.wakeMu.Lock()
	close(s.wake)
	s.wake = make(chan struct{})
	s.wakeMu.Unlock()
}

// upFailure records an infrastructure failure and makes sure the outage
// is being watched.
func (s *Server) upFailure() {
	s.lastFailure.Store(time.Now().UnixNano())
	s.failing.Store(true)
	s.breaker.Failure()
	if !s.watching.Load() && s.watching.CompareAndSwap(false, true) {
		s.bg.Add(1)
		go s.watchOutage()
	}
}

// Outage watching: while exchanges fail, one goroutine per upstream tries
// a TCP (and TLS) connection every watchEvery, and wakes the waiting
// requests the moment one succeeds. Each session has one request retrying
// (session.Probe) at a backoff that grows to a second; without the watcher,
// the end of an outage would be noticed up to that late. A connection that
// succeeds while the upstream still fails requests (a balancer with no
// backend) wakes the waiters at a cadence that doubles up to a second.
// The watcher stops when an exchange succeeds, when no exchange has failed
// for a heal budget (nobody waits longer), when the circuit breaker opens
// (then requests fail fast and the breaker sends one probe per cooldown), or
// when the server closes.
const watchEvery = 10 * time.Millisecond

func (s *Server) watchOutage() {
	defer s.bg.Done()
	defer s.watching.Store(false)
	t := time.NewTimer(watchEvery)
	defer t.Stop()
	pause := watchEvery
	for {
		select {
		case <-t.C:
		case <-s.done:
			return
		}
		quiet := time.Since(time.Unix(0, s.lastFailure.Load()))
		if !s.failing.Load() || quiet > s.cfg.HealTimeout || s.breaker.State() != upstream.Closed {
			return // an open breaker probes on its own schedule
		}
		next := watchEvery
		if s.up.Probe(time.Now().Add(time.Second)) == nil {
			s.wakeAll()
			next, pause = pause, min(2*pause, time.Second)
		}
		t.Reset(next)
	}
}

func setSessionHeader(req *fasthttp.Request, up session.UpstreamID) {
	if up == "" {
		req.Header.DelBytes(hdrSessionID)
		return
	}
	req.Header.SetBytesK(hdrSessionID, string(up))
}

// Hop-by-hop headers (RFC 9110 §7.6.1) and headers the proxy owns.
var (
	reqDropHeaders = []string{
		"Connection", "Keep-Alive", "Proxy-Connection", "Proxy-Authorization", "TE", "Trailer",
		"Transfer-Encoding", "Upgrade",
		// Bodies must come back uncompressed so they can be classified.
		"Accept-Encoding",
		// The proxy has checked Origin against its own names; the upstream
		// would compare it with a Host it no longer sees.
		"Origin",
	}
	respDropHeaders = []string{
		"Connection", "Keep-Alive", "Proxy-Connection", "Proxy-Authenticate", "TE", "Trailer",
		"Transfer-Encoding", "Upgrade",
	}
)

// copyRequest builds the upstream request from the agent's. The body is
// shared with ctx, which outlives every upstream exchange of this request.
func (s *Server) copyRequest(ctx *fasthttp.RequestCtx, req *fasthttp.Request) {
	ctx.Request.Header.CopyTo(&req.Header)
	req.Header.ResetConnectionClose()
	for _, h := range reqDropHeaders {
		req.Header.Del(h)
	}
	if s.ownsAuthorization() {
		req.Header.DelBytes(hdrAuthorization)
	}
	s.setOperatorHeaders(&req.Header)
	req.SetBodyRaw(ctx.PostBody())
}

// setOperatorHeaders sets Config.Headers, replacing the agent's.
func (s *Server) setOperatorHeaders(h *fasthttp.RequestHeader) {
	for k, v := range s.cfg.Headers {
		h.Set(k, v)
	}
}

// respond writes the upstream answer to the agent: status and headers
// (hop-by-hop dropped, session id swapped), then the body whole or as a
// stream flushed per read. It reports whether a stream now owns a.resp.
func (s *Server) respond(a *attempt) bool {
	ctx, r := a.ctx, a.resp
	ctx.Response.Reset()
	r.Header.CopyTo(&ctx.Response.Header)
	ctx.Response.Header.ResetConnectionClose()
	for _, h := range respDropHeaders {
		ctx.Response.Header.Del(h)
	}
	if a.sess != nil {
		ctx.Response.Header.SetBytesK(hdrSessionID, string(a.sess.ID))
	} else {
		s.dropMintedSession(r)
		ctx.Response.Header.DelBytes(hdrSessionID)
	}
	if a.msg.method == "tools/list" && a.sess != nil {
		learnTools(a.sess, r, a.peek)
	}
	if !r.IsStream() {
		ctx.Response.SetBody(r.Body())
		s.count.bytesOut.Add(uint64(len(r.Body())))
		return false
	}
	ctx.Response.Header.Set("X-Accel-Buffering", "no")
	if a.msg.get && a.sess != nil && r.StatusCode() == fasthttp.StatusOK {
		return true // serveStream holds this stream open across heals
	}
	a.rw.gen = a.gen
	if !a.msg.get && answered(a.peek) && a.finish() {
		// The answer is complete: one buffered write, no chunking.
		a.out = a.rw.feed(a.out[:0], a.peek)
		a.out = append(a.out, a.rw.pending...)
		ctx.Response.SetBody(a.out)
		s.count.bytesOut.Add(uint64(len(a.out)))
		return false
	}
	a.out, a.outPos, a.eof = a.rw.feed(a.out[:0], a.peek), 0, false
	ctx.Response.SetBodyStream((*sseBody)(a), -1)
	return true
}

// finishWait is how long an SSE answer whose response event has arrived may
// take to end before it is streamed instead: a server SHOULD end the stream
// after the response (MCP 2025-11-25 §Sending Messages to the Server), and
// the end is normally in the same packet.
const finishWait = 20 * time.Millisecond

// finish reads the rest of an SSE answer whose response has arrived, into
// a.peek, for a short while. It reports whether the stream ended; if not,
// what was read is forwarded first when the answer is streamed.
func (a *attempt) finish() bool {
	r := a.resp
	if r.SetReadDeadline(time.Now().Add(finishWait)) != nil {
		return false
	}
	ended := false
	for len(a.peek) < peekLimit {
		if cap(a.peek)-len(a.peek) < 512 {
			a.peek = append(a.peek, make([]byte, 4096)...)[:len(a.peek)]
		}
		n, err := r.Read(a.peek[len(a.peek):cap(a.peek)])
		a.peek = a.peek[:len(a.peek)+n]
		if err != nil {
			ended = errors.Is(err, io.EOF)
			break
		}
	}
	if !ended {
		// The server keeps the stream open after the response: stream the
		// rest. (A timeout while waiting for the next chunk leaves the
		// chunk reader where it was.)
		_ = r.SetReadDeadline(time.Time{})
	}
	return ended
}

// answered reports whether the first data event in an SSE prefix is a
// JSON-RPC response (the answer to the request, not a notification or a
// server→client request).
func answered(peek []byte) bool {
	from := 0
	end := dataEventEnd(peek, &from)
	if end < 0 {
		return false
	}
	d := eventData(peek[:end])
	return len(d) > 0 && !bytes.Contains(d, []byte(`"method"`)) &&
		(bytes.Contains(d, []byte(`"result"`)) || bytes.Contains(d, []byte(`"error"`)))
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

// Read returns the next rewritten bytes of the upstream's stream, reading
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
		if a.eof {
			return 0, io.EOF
		}
		// p is fasthttp's copy buffer: read into it, then the rewriter
		// copies the events out before p is written again.
		n, rerr := a.resp.Read(p)
		a.out, a.outPos = a.rw.feed(a.out[:0], p[:n]), 0
		if rerr != nil {
			// Cut or ended: what arrived goes out, including a final event
			// without its blank line, and the answer ends.
			a.out = append(a.out, a.rw.pending...)
			a.rw.pending = a.rw.pending[:0]
			a.eof = true
		}
	}
	n = copy(p, a.out[a.outPos:])
	a.outPos += n
	a.s.count.bytesOut.Add(uint64(n))
	return n, nil
}

// Close releases the upstream response (closing its stream if the agent
// left early) and the attempt.
func (b *sseBody) Close() error {
	a := (*attempt)(b)
	upstream.ReleaseResponse(a.resp)
	a.release()
	return nil
}
