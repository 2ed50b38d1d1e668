package stream

import (
	"bufio"
	"context"
	"net"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/mcpheal/mcpheal/classify"
	"github.com/mcpheal/mcpheal/classify/sse"
	"github.com/mcpheal/mcpheal/proxy/internal/exchange"
	"github.com/mcpheal/mcpheal/proxy/internal/heal"
	"github.com/mcpheal/mcpheal/proxy/internal/link"
	"github.com/mcpheal/mcpheal/proxy/internal/obs"
	"github.com/mcpheal/mcpheal/proxy/internal/wire"
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
type Stream struct {
	S      *exchange.Env
	Up     Upstream     // all it sends upstream beside the attempt that opens it
	Healer *heal.Healer // heals the session when the stream finds it gone
	Set    *Set         // the streams of the upstream, this one among them
	conn   net.Conn     // the agent's connection: each write is bounded by WriteTimeout
	Sess   *session.Session
	Hdr    *fasthttp.RequestHeader // the agent's GET headers, for reopens and heals
	Out    *wire.Queue             // rewritten events, pump → writer, counted in memory_budget
	// Lossy: an event the budget cannot queue is dropped, and the stream
	// goes on (the held route's hub, whose listens drop what their agents
	// do not read); otherwise the stream ends.
	Lossy bool
	Quit  chan struct{} // closed by stop
	Done  chan struct{} // closed when the pump has ended
	once  sync.Once
	// resume: the agent's GET carried a Last-Event-ID of the live
	// generation, so it resumes one upstream stream (most often a call's):
	// it ends with that stream, is not moved across heals, and does not
	// take the place of the standalone stream.
	resume bool

	mu   sync.Mutex // protects resp, gen, opened, healing
	resp *upstream.Response
	gen  uint64
	// opened is closed (and replaced) whenever an upstream stream opens;
	// healing: the pump itself heals the session.
	opened  chan struct{}
	healing bool
	// Wake cuts short the wait before a reopen: a heal made the session
	// the stream reopens on (healed).
	Wake chan struct{}
}

// streamRoute is the route of an agent's GET: its standalone stream
// (serve), or the resumption of an answer mcpheal keeps (serveLog). It
// holds the streams open, which a heal moves to the new upstream session.
type Route struct {
	Env *exchange.Env // the exchange its GETs' attempts go through
	Up  Upstream      // all it sends upstream beside its requests' attempts
	Set Set
	// The stages it uses itself; it reaches no other.
	Sessions *heal.Sessions
	Healer   *heal.Healer
	Answers  *exchange.AnswerLogs
}

// Upstream is what the stream route sends upstream itself, beside the
// attempt (exchange.NewAttempt) that opens an agent's GET stream: the
// GETs that open it again at their own pace (asking the breaker first,
// telling the link what they found), and the headers they carry. The
// front door gives it the link (link.Link); it reaches nothing else of
// it.
type Upstream interface {
	RequestDrops() *wire.NameSet
	SetOperatorHeaders(h *fasthttp.RequestHeader)
	Retry(p link.Pace, budget time.Duration) link.Retry
	Allow() (bool, time.Duration)
	Build(req *fasthttp.Request, c *link.Upcall)
	Do(req *fasthttp.Request, resp *upstream.Response, deadline time.Time) error
	RecordHealth(cls classify.Class)
}

// Serve opens the upstream GET for the agent's stream. If that first
// open fails the agent gets the upstream's answer (405: the server has no GET
// stream; 409: one is already open) or the proxy's own; once open, the stream
// outlives upstream sessions.
func (sr *Route) Serve(ctx *fasthttp.RequestCtx, r *exchange.Request) (reroute bool) {
	s, sess := sr.Env, r.Sess
	g := &Stream{S: s, Up: sr.Up, Healer: sr.Healer, Set: &sr.Set, Sess: sess, Hdr: new(fasthttp.RequestHeader), Wake: make(chan struct{}, 1),
		Out: wire.NewQueue(s.Mem, QueueLen), Quit: make(chan struct{}), Done: make(chan struct{})}
	r.Hdr.CopyTo(g.Hdr)
	wire.StripRequestHeader(g.Hdr, sr.Up.RequestDrops())
	sr.Up.SetOperatorHeaders(g.Hdr)
	_, gen := sess.Current()
	agentLast := r.Hdr.PeekBytes(wire.HdrLastEventID)
	last := wire.UpstreamEventID(agentLast, gen)
	if len(agentLast) > 0 && last == "" {
		s.Writer().EndResumption(ctx, &wire.Message{Get: true})
		return false
	}
	g.resume = last != ""
	// An agent opening another GET has usually abandoned its previous one
	// (the proxy notices a departed agent only on its next write), and most
	// servers allow one GET per session (409 otherwise): the newest wins. A
	// GET resuming another upstream stream evicts only if the upstream
	// refuses it.
	evicted := !g.resume && sr.Set.Evict(sess.ID, s.Cfg.MaxStreams-1)
	if !g.resume {
		sr.Sessions.Fleet.ClaimStream(sess) // and in the other processes of the fleet
	}

	a := exchange.NewAttempt(s, ctx, r)
	defer a.Release()
	a.Heals = true
	g.Hdr.CopyTo(&a.Req.Header)
	setLastEventID(a.Req, last)
	ok, reroute := a.Run()
	// The stream replaced here closes at once; one another process of the
	// fleet holds closes when that process hears the claim, which may take
	// longer under load: asked again for up to exchange.ConflictWait, at
	// the pace an answer stream's resumption asks again after a 409.
	retry := sr.Up.Retry(link.PaceRequest, exchange.ConflictWait)
	for !ok && ctx.Response.StatusCode() == fasthttp.StatusConflict {
		if !evicted && !sr.Set.Evict(sess.ID, 0) && sr.Sessions.Fleet == nil {
			break // the conflicting GET is not the proxy's
		}
		evicted = true
		// The upstream has not yet seen the replaced stream's connection close.
		if !retry.Wait() {
			break
		}
		a.S.Mem.Give(a.Charged) // the refusal buffered for the agent is replaced
		a.Charged = 0
		a.Next()
		ok, reroute = a.Run()
	}
	if !ok {
		return reroute // run answered the agent itself (an error, or the upstream's refusal), or the era changed
	}
	a.Unwatch()
	g.resp, g.gen = a.Resp, a.Gen
	a.Resp = nil // the stream's now
	sr.Set.Add(sess.ID, g)
	if s.Bg.Add(1) {
		go g.Pump()
	} else { // closing: the stream ends at once
		close(g.Done)
		upstream.ReleaseResponse(g.resp)
	}
	g.conn = ctx.Conn()
	s.Writer().Relay(ctx, g.write)
	return false
}

// write relays events and keepalive comments to the agent until it goes
// away or the stream is stopped.
func (g *Stream) write(w *bufio.Writer) {
	defer g.Set.Remove(g.Sess.ID, g)
	defer g.Stop()
	out := exchange.AgentStream{S: g.S, W: w, Conn: g.conn}
	out.Pump(g.Out, g.Done, g.Quit, true)
}

// Pump reads the upstream GET stream, and when it ends opens the next one:
// in the same session with Last-Event-ID, or after healing the session.
func (g *Stream) Pump() {
	defer g.S.Bg.Done()
	defer close(g.Done) // g.out stays open: an inject racing the end must not panic
	defer func() {
		if p := recover(); p != nil {
			g.S.Count.Panics.Add(1)
			g.S.Log.Error().Interface("panic", p).Msg("stream pump panicked")
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
		er := wire.EventRewriter{Gen: gen, Fr: sse.Framer{Max: g.S.Cfg.MaxSSELine}}
		er.Meter.Mem = g.S.Mem
		lost := false // a Lossy stream let go of an event the budget could not hold whole
		for {
			if er.Fr.Buffered() == 0 && er.Fr.Held() > wire.FreeHold {
				er.Fr.Reset(wire.FreeHold) // a large event has passed: its room is not kept
			}
			n, err := resp.Read(buf)
			er.Fr.Feed(buf[:n])
			// An event is framed whole: counted past FreeHold, with its
			// rewritten copy on its way to the agent.
			if held := er.Meter.Hold(2 * er.Fr.Held()); !held && g.Lossy {
				// The event goes with the stream, which opens again after
				// a pause, without Last-Event-ID: a server that keeps
				// events would send this one again.
				g.S.Log.Warn().Str(obs.LogSession, g.Sess.ID.Short()).Int64("budget", g.S.Mem.Limit).
					Msg("GET stream event would pass the memory budget held whole; dropped, stream opened again")
				lost = true
				break
			} else if !held {
				g.S.Log.Warn().Str(obs.LogSession, g.Sess.ID.Short()).Int64("budget", g.S.Mem.Limit).
					Msg("GET stream event would pass the memory budget held whole; stream ended")
				er.Meter.Release()
				g.mu.Lock()
				g.resp = nil
				g.mu.Unlock()
				upstream.ReleaseResponse(resp)
				return
			}
			var out []byte
			var ferr error
			for {
				ev, ok, e := er.Next()
				if e != nil || !ok {
					ferr = e
					break
				}
				out = er.Event(out, ev)
			}
			if sent := g.send(out); sent == wire.OverBudget && g.Lossy {
				g.S.Log.Warn().Str(obs.LogSession, g.Sess.ID.Short()).Int64("budget", g.S.Mem.Limit).
					Msg("GET stream events would pass the memory budget; dropped")
			} else if sent == wire.OverBudget {
				// The agent reads slower than the upstream writes, and
				// what waits for it would pass the budget: its stream
				// ends (Reopen sees it stopped), and its SDK opens another.
				g.S.Log.Warn().Str(obs.LogSession, g.Sess.ID.Short()).Int64("budget", g.S.Mem.Limit).
					Msg("GET stream events waiting for a slow agent would pass the memory budget; stream ended")
				g.Stop()
				break
			} else if sent != wire.Queued {
				break
			}
			if ferr != nil {
				// An event past max_sse_line: reopening would bring it
				// back. The agent's stream ends; its SDK decides.
				g.S.Log.Warn().Str(obs.LogSession, g.Sess.ID.Short()).Int("limit", g.S.Cfg.MaxSSELine).
					Msg("GET stream event too large; stream ended")
				er.Meter.Release()
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
		er.Meter.Release()
		g.mu.Lock()
		g.resp = nil
		g.mu.Unlock()
		upstream.ReleaseResponse(resp)
		lastID, retryMs := er.LastID, er.RetryMs
		if lost {
			lastID, retryMs = "", int(lostPause/time.Millisecond)
		}
		if g.resume || !g.Reopen(lastID, retryMs) {
			return
		}
	}
}

// send queues an event for the agent (wire.Queue.Put): Queued, or
// Stopped once the stream is stopped, or OverBudget.
func (g *Stream) send(ev []byte) int {
	if len(ev) == 0 {
		return wire.Queued
	}
	return g.Out.Put(ev, g.Quit)
}

// lostPause is how long a Lossy stream that let an event go waits before
// it opens again: the budget was full.
const lostPause = time.Second

// QueueLen is how many events a stream queues for its agent's writer.
const QueueLen = 16

// Reopen opens the next upstream GET. It waits the server's retry: interval
// (or a backoff while the upstream is down), heals a session found gone, and
// gives up only when the stream is stopped, the session ended, or the
// upstream says it has no GET stream.
func (g *Stream) Reopen(lastID string, retryMs int) bool {
	delay := time.Duration(retryMs) * time.Millisecond
	retry := g.Up.Retry(link.PaceListen, 0) // no budget: it tries while the agent listens
	g.mu.Lock()
	prevGen := g.gen
	g.mu.Unlock()
	for {
		select {
		case <-g.Quit:
			return false
		default:
		}
		if delay > 0 && !g.sleep(delay) {
			return false
		}
		delay = retry.Next()
		if g.Sess.Removed() {
			return false
		}
		up, gen := g.Sess.Current()
		if gen != prevGen {
			lastID = "" // event ids do not cross generations
		}
		resp, cls := g.open(up, lastID)
		switch {
		case resp != nil:
			g.mu.Lock()
			g.resp, g.gen = resp, gen
			if g.opened != nil {
				close(g.opened)
				g.opened = nil
			}
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
			retry.Reset()
		case cls == classify.Protocol || cls == classify.Auth:
			return false // 405, 409, 401…: the agent's SDK decides
		}
	}
}

// open sends one upstream GET; it returns the stream, or the class of the
// failure.
func (g *Stream) open(up session.UpstreamID, lastID string) (*upstream.Response, classify.Class) {
	return openGET(g.Up, g.Hdr, up, g.Sess.Recipe.ProtocolVersion, lastID, time.Now().Add(g.S.Cfg.ResponseTimeout))
}

// openGET sends one upstream GET with the agent's headers hdr on upstream
// session up, its head due by deadline; it returns the stream, or the
// class of the failure.
func openGET(s Upstream, hdr *fasthttp.RequestHeader, up session.UpstreamID, version, lastID string,
	deadline time.Time) (*upstream.Response, classify.Class) {
	if ok, _ := s.Allow(); !ok {
		return nil, classify.TransportDead
	}
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	s.Build(req, &link.Upcall{Hdr: hdr, Method: fasthttp.MethodGet, Session: up, Version: version, LastEventID: lastID})
	resp := upstream.AcquireResponse()
	err := s.Do(req, resp, deadline)
	cls := classify.TransportDead
	switch {
	case err != nil:
	case resp.IsStream(): // a quiet stream: judge its head only
		cls = classify.Classify(resp.StatusCode(), resp.Header.ContentType(), nil)
	default:
		cls = classify.Classify(resp.StatusCode(), resp.Header.ContentType(), resp.Body())
	}
	s.RecordHealth(cls)
	if cls == classify.OK && resp.IsStream() {
		return resp, cls
	}
	upstream.ReleaseResponse(resp)
	return nil, cls
}

// heal re-creates the session under the agent's credential, as a request
// would.
func (g *Stream) heal(seen uint64) bool {
	ctx, cancel := contextWithTimeout(g.S.Cfg.HealTimeout, g.Quit)
	defer cancel()
	g.mu.Lock()
	g.healing = true // its own heal does not wait for it (awaitGen)
	g.mu.Unlock()
	defer func() {
		g.mu.Lock()
		g.healing = false
		g.mu.Unlock()
	}()
	_, _, err := g.Healer.Heal(ctx, g.Sess, seen, obs.ReasonSessionGone, g.Hdr)
	return err == nil
}

// sleep waits d before a reopen, less if a heal wakes the stream: a
// server keeps no notification it sent while no GET stream was open (a
// tools/list_changed right after the heal), so the stream reopens on the
// healed session at once. False when the stream or mcpheal stops.
func (g *Stream) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-g.Wake:
	case <-g.Quit:
		return false
	case <-g.S.Done:
		return false
	}
	return true
}

// awaitGen waits until the stream is open upstream on generation gen or
// later, until deadline: false if it is not by then (the upstream refused
// it, or the stream ended). A stream whose pump heals the session itself
// is not waited for.
func (g *Stream) awaitGen(gen uint64, deadline time.Time) bool {
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	for {
		g.mu.Lock()
		if g.healing || g.resp != nil && g.gen >= gen {
			g.mu.Unlock()
			return true
		}
		if g.opened == nil {
			g.opened = make(chan struct{})
		}
		opened := g.opened
		g.mu.Unlock()
		select {
		case <-opened:
		case <-g.Done:
			return false
		case <-g.Quit:
			return false
		case <-t.C:
			return false
		}
	}
}

// reconnectBefore cuts the upstream stream if it belongs to a generation
// older than gen, and wakes one waiting to reopen; the pump then reopens
// on the new session.
func (g *Stream) reconnectBefore(gen uint64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.resp != nil && g.gen < gen {
		g.resp.Interrupt()
	}
	if g.resp == nil && g.Wake != nil {
		select {
		case g.Wake <- struct{}{}:
		default:
		}
	}
}

// Stop ends the stream: the pump and the writer return.
func (g *Stream) Stop() {
	g.once.Do(func() {
		close(g.Quit)
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
		req.Header.DelBytes(wire.HdrLastEventID)
		return
	}
	req.Header.SetBytesK(wire.HdrLastEventID, id)
}

// ServeLog answers an agent's GET whose Last-Event-ID names event seq of
// the answer logged in l: the events after it, then the rest as it comes,
// with keepalive comments while none does, until the answer ends.
func (sr *Route) ServeLog(ctx *fasthttp.RequestCtx, r *exchange.Request, l *exchange.AnswerLog, seq int) {
	s := sr.Env
	if !l.Attach() {
		s.Count.AgentResumes[obs.OutcomeFailed].Add(1)
		s.Writer().EndResumption(ctx, &r.Msg)
		return
	}
	s.Count.AgentResumes[obs.OutcomeOK].Add(1)
	conn := ctx.Conn()
	s.Writer().Stream(ctx, &r.Msg, r.Sess, classify.OK, func(w *bufio.Writer) {
		defer l.Detach()
		t := time.NewTicker(s.Cfg.StreamKeepalive)
		defer t.Stop()
		out := exchange.AgentStream{S: s, W: w, Conn: conn}
		var evs []byte
		for {
			var wake <-chan struct{}
			var end, lost bool
			evs, seq, wake, end, lost = l.Since(evs[:0], seq)
			if lost {
				s.Log.Warn().Str(obs.LogSession, r.Sess.ID.Short()).Int("resume_buffer", s.Cfg.ResumeBuffer).
					Msg("agent resumed an answer from further back than mcpheal kept; its stream ends")
			}
			if len(evs) > 0 && !out.Write(evs) {
				return
			}
			if end {
				return
			}
			select {
			case <-wake:
			case <-t.C:
				if !out.Write(exchange.KeepaliveComment) {
					return
				}
			case <-s.Done:
				return
			}
		}
	})
}
