package proxy

import (
	"bufio"
	"context"
	"net"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/mcpheal/mcpheal/classify"
	"github.com/mcpheal/mcpheal/classify/sse"
	"github.com/mcpheal/mcpheal/session"
	"github.com/mcpheal/mcpheal/upstream"
)

// getStream is an agent's standalone SSE stream (GET), held open across
// upstream deaths (docs/streams.md "Streams and session state across a heal"):
//
//	agent ◀── writer: events, ": keepalive" every StreamKeepalive ──┐
//	                                                              events
//	upstream GET ──▶ pump: read, rewrite ids ─────────────────────┘
//	     ▲              │ stream ended / cut
//	     └── reopen ◀───┘ same generation: Last-Event-ID, honouring retry:
//	                      session gone: heal, then the new session's GET
//
// The pump owns the upstream side, the writer the agent side; the writer
// stops the pump when the agent goes away.
type getStream struct {
	s    *env
	set  *streamSet // the streams of the upstream, this one among them
	conn net.Conn   // the agent's connection: each write is bounded by WriteTimeout
	sess *session.Session
	hdr  *fasthttp.RequestHeader // the agent's GET headers, for reopens and heals
	out  chan []byte             // rewritten events, pump → writer
	quit chan struct{}           // closed by stop
	done chan struct{}           // closed when the pump has ended
	once sync.Once
	// resume: the agent's GET carried a Last-Event-ID of the live
	// generation, so it resumes one upstream stream (most often a call's):
	// it ends with that stream, is not moved across heals, and does not
	// take the place of the standalone stream.
	resume bool

	mu   sync.Mutex // protects resp, gen
	resp *upstream.Response
	gen  uint64
}

// streamRoute is the route of an agent's GET: its standalone stream
// (serve), or the resumption of an answer mcpheal keeps (serveLog). It
// holds the streams open, which a heal moves to the new upstream session.
type streamRoute struct {
	env *env
	set streamSet
}

// serve opens the upstream GET for the agent's stream. If that first
// open fails the agent gets the upstream's answer (405: the server has no GET
// stream; 409: one is already open) or the proxy's own; once open, the stream
// outlives upstream sessions.
func (sr *streamRoute) serve(ctx *fasthttp.RequestCtx, r *request) (reroute bool) {
	s, sess := sr.env, r.sess
	g := &getStream{s: s, set: &sr.set, sess: sess, hdr: new(fasthttp.RequestHeader),
		out: make(chan []byte, 16), quit: make(chan struct{}), done: make(chan struct{})}
	r.hdr.CopyTo(g.hdr)
	stripRequestHeader(g.hdr, s.link.requestDrops())
	s.link.setOperatorHeaders(g.hdr)
	_, gen := sess.Current()
	agentLast := r.hdr.PeekBytes(hdrLastEventID)
	last := upstreamEventID(agentLast, gen)
	if len(agentLast) > 0 && last == "" {
		s.count.request(&message{get: true}, classify.OK)
		endResumption(ctx)
		return false
	}
	g.resume = last != ""
	// An agent opening another GET has usually abandoned its previous one
	// (the proxy notices a departed agent only on its next write), and most
	// servers allow one GET per session (409 otherwise): the newest wins. A
	// GET resuming another upstream stream evicts only if the upstream
	// refuses it.
	evicted := !g.resume && sr.set.evict(sess.ID, s.cfg.MaxStreams-1)
	if !g.resume {
		s.sessions.fleet.claimStream(sess) // and in the other processes of the fleet
	}

	a := newAttempt(s, ctx, r)
	defer a.release()
	a.heals = true
	g.hdr.CopyTo(&a.req.Header)
	setLastEventID(a.req, last)
	ok, reroute := a.run()
	// The stream replaced here closes at once; one another process of the
	// fleet holds closes when that process hears the claim, which may take
	// longer under load: up to 2 s.
	until := time.Now().Add(2 * time.Second)
	for try := 1; !ok && ctx.Response.StatusCode() == fasthttp.StatusConflict && time.Now().Before(until); try++ {
		if !evicted && !sr.set.evict(sess.ID, 0) && s.sessions.fleet == nil {
			break // the conflicting GET is not the proxy's
		}
		evicted = true
		// The upstream has not yet seen the replaced stream's connection close.
		if !s.link.sleep(min(time.Duration(try)*20*time.Millisecond, 200*time.Millisecond)) {
			break
		}
		a.s.mem.give(a.charged) // the refusal buffered for the agent is replaced
		a.charged = 0
		a.next()
		ok, reroute = a.run()
	}
	if !ok {
		return reroute // run answered the agent itself (an error, or the upstream's refusal), or the era changed
	}
	a.unwatch()
	g.resp, g.gen = a.resp, a.gen
	a.resp = nil // the stream's now
	ctx.Response.Header.Set("Cache-Control", "no-cache")
	sr.set.add(sess.ID, g)
	if s.bg.Add(1) {
		go g.pump()
	} else { // closing: the stream ends at once
		close(g.done)
		upstream.ReleaseResponse(g.resp)
	}
	g.conn = ctx.Conn()
	ctx.SetBodyStreamWriter(g.write)
	return false
}

// write relays events and keepalive comments to the agent until it goes
// away or the stream is stopped.
func (g *getStream) write(w *bufio.Writer) {
	defer g.set.remove(g.sess.ID, g)
	defer g.stop()
	out := agentStream{s: g.s, w: w, conn: g.conn}
	out.pump(g.out, g.done, g.quit, true)
}

// pump reads the upstream GET stream, and when it ends opens the next one:
// in the same session with Last-Event-ID, or after healing the session.
func (g *getStream) pump() {
	defer g.s.bg.Done()
	defer close(g.done) // g.out stays open: an inject racing the end must not panic
	defer func() {
		if p := recover(); p != nil {
			g.s.count.panics.Add(1)
			g.s.log.Error().Interface("panic", p).Msg("stream pump panicked")
		}
	}()
	buf := make([]byte, 16<<10)
	for {
		g.mu.Lock()
		resp, gen := g.resp, g.gen
		g.mu.Unlock()
		// Whole events only: the writer's keepalive comments and injected
		// events then always fall between two events, and an event cut
		// with its stream is dropped, never spliced onto the next stream.
		er := eventRewriter{gen: gen, fr: sse.Framer{Max: g.s.cfg.MaxSSELine}}
		for {
			n, err := resp.Read(buf)
			er.fr.Feed(buf[:n])
			var out []byte
			var ferr error
			for {
				ev, ok, e := er.next()
				if e != nil || !ok {
					ferr = e
					break
				}
				out = er.event(out, ev)
			}
			if len(out) > 0 && !g.send(out) {
				break
			}
			if ferr != nil {
				// An event past max_sse_line: reopening would bring it
				// back. The agent's stream ends; its SDK decides.
				g.s.log.Warn().Str(logSession, g.sess.ID.Short()).Int("limit", g.s.cfg.MaxSSELine).
					Msg("GET stream event too large; stream ended")
				g.mu.Lock()
				g.resp = nil
				g.mu.Unlock()
				upstream.ReleaseResponse(resp)
				return
			}
			if err != nil {
				break // ended or cut: reopen
			}
		}
		g.mu.Lock()
		g.resp = nil
		g.mu.Unlock()
		upstream.ReleaseResponse(resp)
		if g.resume || !g.reopen(er.lastID, er.retryMs) {
			return
		}
	}
}

// send queues an event for the agent; false once the stream is stopped.
func (g *getStream) send(ev []byte) bool {
	select {
	case g.out <- ev:
		return true
	case <-g.quit:
		return false
	}
}

// reopen opens the next upstream GET. It waits the server's retry: interval
// (or a backoff while the upstream is down), heals a session found gone, and
// gives up only when the stream is stopped, the session ended, or the
// upstream says it has no GET stream.
func (g *getStream) reopen(lastID string, retryMs int) bool {
	delay := time.Duration(retryMs) * time.Millisecond
	wait := upstream.Backoff{Min: 100 * time.Millisecond, Max: 5 * time.Second}
	g.mu.Lock()
	prevGen := g.gen
	g.mu.Unlock()
	for {
		select {
		case <-g.quit:
			return false
		default:
		}
		if delay > 0 && !sleepUnless(delay, g.quit, g.s.done) {
			return false
		}
		delay = wait.Next()
		if g.sess.Removed() {
			return false
		}
		up, gen := g.sess.Current()
		if gen != prevGen {
			lastID = "" // event ids do not cross generations
		}
		resp, cls := g.open(up, lastID)
		switch {
		case resp != nil:
			g.mu.Lock()
			g.resp, g.gen = resp, gen
			g.mu.Unlock()
			return true
		case cls == classify.SessionGone && up == "":
			// A server without sessions has none to lose: its 404 says
			// it has no GET stream, and a heal would only ask again.
			return false
		case cls == classify.SessionGone:
			if !g.heal(gen) {
				continue // budget spent; keep trying while the agent listens
			}
			delay = 0
			wait.Reset()
		case cls == classify.Protocol || cls == classify.Auth:
			return false // 405, 409, 401…: the agent's SDK decides
		}
	}
}

// open sends one upstream GET; it returns the stream, or the class of the
// failure.
func (g *getStream) open(up session.UpstreamID, lastID string) (*upstream.Response, classify.Class) {
	if ok, _ := g.s.link.breaker.Allow(); !ok {
		return nil, classify.TransportDead
	}
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	g.s.link.build(req, &upcall{hdr: g.hdr, method: fasthttp.MethodGet, session: up, version: g.sess.Recipe.ProtocolVersion, lastEventID: lastID})
	resp := upstream.AcquireResponse()
	err := g.s.link.do(req, resp, time.Now().Add(g.s.cfg.ResponseTimeout))
	cls := classify.TransportDead
	switch {
	case err != nil:
	case resp.IsStream(): // a quiet stream: judge its head only
		cls = classify.Classify(resp.StatusCode(), resp.Header.ContentType(), nil)
	default:
		cls = classify.Classify(resp.StatusCode(), resp.Header.ContentType(), resp.Body())
	}
	g.s.link.recordHealth(cls)
	if cls == classify.OK && resp.IsStream() {
		return resp, cls
	}
	upstream.ReleaseResponse(resp)
	return nil, cls
}

// heal re-creates the session under the agent's credential, as a request
// would.
func (g *getStream) heal(seen uint64) bool {
	ctx, cancel := contextWithTimeout(g.s.cfg.HealTimeout, g.quit)
	defer cancel()
	_, _, err := g.s.healer.heal(ctx, g.sess, seen, reasonSessionGone, g.hdr)
	return err == nil
}

// reconnectBefore cuts the upstream stream if it belongs to a generation
// older than gen; the pump then reopens on the new session.
func (g *getStream) reconnectBefore(gen uint64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.resp != nil && g.gen < gen {
		g.resp.Interrupt()
	}
}

// stop ends the stream: the pump and the writer return.
func (g *getStream) stop() {
	g.once.Do(func() {
		close(g.quit)
		g.mu.Lock()
		if g.resp != nil {
			g.resp.Interrupt()
		}
		g.mu.Unlock()
	})
}

// contextWithTimeout is a context that ends after d or when quit closes.
func contextWithTimeout(d time.Duration, quit <-chan struct{}) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	go func() { // ends with ctx, at the latest after d
		select {
		case <-quit:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

func setLastEventID(req *fasthttp.Request, id string) {
	if id == "" {
		req.Header.DelBytes(hdrLastEventID)
		return
	}
	req.Header.SetBytesK(hdrLastEventID, id)
}

// serveLog answers an agent's GET whose Last-Event-ID names event seq of
// the answer logged in l: the events after it, then the rest as it comes,
// with keepalive comments while none does, until the answer ends.
func (sr *streamRoute) serveLog(ctx *fasthttp.RequestCtx, r *request, l *answerLog, seq int) {
	s := sr.env
	s.count.request(&r.msg, classify.OK)
	if !l.attach() {
		s.count.agentResumes[outcomeFailed].Add(1)
		endResumption(ctx)
		return
	}
	s.count.agentResumes[outcomeOK].Add(1)
	ctx.Response.Header.SetContentTypeBytes(mimeEventStream)
	ctx.Response.Header.Set("Cache-Control", "no-cache")
	ctx.Response.Header.Set("X-Accel-Buffering", "no")
	ctx.Response.Header.SetBytesK(hdrSessionID, string(r.sess.ID))
	conn := ctx.Conn()
	ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
		defer l.detach()
		t := time.NewTicker(s.cfg.StreamKeepalive)
		defer t.Stop()
		out := agentStream{s: s, w: w, conn: conn}
		var evs []byte
		for {
			var wake <-chan struct{}
			var end, lost bool
			evs, seq, wake, end, lost = l.since(evs[:0], seq)
			if lost {
				s.log.Warn().Str(logSession, r.sess.ID.Short()).Int("resume_buffer", s.cfg.ResumeBuffer).
					Msg("agent resumed an answer from further back than mcpheal kept; its stream ends")
			}
			if len(evs) > 0 && !out.write(evs) {
				return
			}
			if end {
				return
			}
			select {
			case <-wake:
			case <-t.C:
				if !out.write(keepaliveComment) {
					return
				}
			case <-s.done:
				return
			}
		}
	})
}
