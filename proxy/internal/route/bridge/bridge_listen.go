package bridge

import (
	"bufio"
	"bytes"
	"strconv"
	"sync"
	"time"

	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"

	"github.com/mcpheal/mcpheal/classify"
	"github.com/mcpheal/mcpheal/classify/sse"
	"github.com/mcpheal/mcpheal/proxy/internal/era"
	"github.com/mcpheal/mcpheal/proxy/internal/exchange"
	"github.com/mcpheal/mcpheal/proxy/internal/link"
	"github.com/mcpheal/mcpheal/proxy/internal/obs"
	"github.com/mcpheal/mcpheal/proxy/internal/wire"
	"github.com/mcpheal/mcpheal/session"
	"github.com/mcpheal/mcpheal/upstream"
)

// A bridged agent's GET stream is served from subscriptions/listen: one
// upstream listen with every list-changed notification the server offers
// and the resources the agent subscribed to. A change of those
// subscriptions reopens it (2026-07-28 has no way to change a listen's
// filter); so does its end.

// listenState is one bridged GET stream.
type listenState struct {
	mu   sync.Mutex // protects resp
	resp *upstream.Response
	quit chan struct{}
	once sync.Once
}

func (l *listenState) stop() {
	l.once.Do(func() {
		close(l.quit)
		l.reopen()
	})
}

// reopen ends the current upstream listen; the pump opens the next one.
func (l *listenState) reopen() {
	l.mu.Lock()
	if l.resp != nil {
		l.resp.Interrupt()
	}
	l.mu.Unlock()
}

func (l *listenState) set(resp *upstream.Response) {
	l.mu.Lock()
	l.resp = resp
	l.mu.Unlock()
}

// listen serves a bridged agent's GET stream. The newest stream of a
// session wins, as for a session-era upstream.
func (b *Route) listen(ctx *fasthttp.RequestCtx, r *exchange.Request) {
	s, sess := b.S, r.Sess
	l := &listenState{quit: make(chan struct{})}
	if old, loaded := b.listens.Swap(sess.ID, l); loaded {
		old.(*listenState).stop()
	}
	hdr := new(fasthttp.RequestHeader)
	r.Hdr.CopyTo(hdr)
	out := wire.NewQueue(s.Mem, 16)
	if s.Bg.Add(1) {
		go b.listenPump(sess, l, hdr, out)
	}
	st := exchange.AgentStream{S: s, Conn: ctx.Conn()}
	s.Writer().Stream(ctx, &r.Msg, nil, classify.OK, func(w *bufio.Writer) {
		defer b.listens.CompareAndDelete(sess.ID, l)
		defer l.stop()
		st.W = w
		st.Pump(out, nil, l.quit, true)
	})
}

// listenChanged reopens the session's listen after its subscriptions
// changed.
func (b *Route) listenChanged(id session.ClientID) {
	if v, ok := b.listens.Load(id); ok {
		v.(*listenState).reopen()
	}
}

// StopListens ends every bridged GET stream (shutdown).
func (b *Route) StopListens() {
	b.listens.Range(func(k, v any) bool {
		b.listens.Delete(k)
		v.(*listenState).stop()
		return true
	})
}

// StopListen ends the session's bridged GET stream.
func (b *Route) StopListen(id session.ClientID) {
	if v, ok := b.listens.LoadAndDelete(id); ok {
		v.(*listenState).stop()
	}
}

// listenPump keeps one upstream listen open for the agent's stream and
// hands its notifications, framed as events, to the writer.
func (b *Route) listenPump(sess *session.Session, l *listenState, hdr *fasthttp.RequestHeader, out *wire.Queue) {
	s := b.S
	defer s.Bg.Done()
	retry := b.Up.Retry(link.PaceListen, 0) // no budget: it tries while the agent listens
	delay := time.Duration(0)
	for {
		if delay > 0 && !wire.SleepUnless(delay, l.quit, s.Done) {
			return
		}
		select {
		case <-l.quit:
			return
		default:
		}
		body, any := listenBody(b.Eras.Info.Load(), sess)
		if !any {
			// Nothing to listen to: the agent's stream stays open with
			// keepalives until a subscription opens one.
			delay = time.Second
			continue
		}
		if b.listenOnce(sess, l, hdr, body, out) {
			retry.Reset()
			delay = 50 * time.Millisecond // ended or reopened: again, at once but not in a tight loop
		} else {
			delay = retry.Next()
		}
	}
}

// listenOnce opens one upstream listen and relays it until it ends. It
// reports false when the listen could not be opened.
func (b *Route) listenOnce(sess *session.Session, l *listenState, hdr *fasthttp.RequestHeader, body []byte, out *wire.Queue) bool {
	s := b.S
	req := fasthttp.AcquireRequest()
	b.Up.Build(req, &link.Upcall{Hdr: hdr, Body: wire.Envelope(body, b.Up.UpcallID("listen"), sess, nil, ""), Version: wire.StatelessVersion,
		McpMethod: "subscriptions/listen"})
	resp := upstream.AcquireResponse()
	defer upstream.ReleaseResponse(resp)
	l.set(resp)
	defer l.set(nil)
	err := b.Up.Do(req, resp, time.Now().Add(s.Cfg.ResponseTimeout))
	fasthttp.ReleaseRequest(req)
	if err != nil || resp.StatusCode() != fasthttp.StatusOK || !resp.IsStream() {
		if err == nil && era.ModernRefused(resp.StatusCode(), resp.Body()) {
			b.Eras.Forget()
		}
		return false
	}
	fr := sse.Framer{Max: s.Cfg.MaxSSELine}
	buf := make([]byte, 16<<10)
	var data []byte
	for {
		n, rerr := resp.Read(buf)
		fr.Feed(buf[:n])
		for {
			ev, ok, ferr := fr.Next()
			if ferr != nil || !ok {
				break
			}
			data = sse.Data(data[:0], ev)
			if len(data) == 0 || bytes.Contains(data, []byte(`"notifications/subscriptions/acknowledged"`)) {
				continue
			}
			if gjson.GetBytes(data, "method").Type != gjson.String {
				continue // the listen's own result: it ends
			}
			if out.Put(sse.AppendEvent(nil, "message", data), l.quit) == wire.OverBudget {
				// The agent reads slower than the upstream writes: its
				// stream ends, and its SDK opens another.
				s.Log.Warn().Str(obs.LogSession, sess.ID.Short()).Int64("budget", s.Mem.Limit).
					Msg("bridged GET stream events waiting for a slow agent would pass the memory budget; stream ended")
				l.stop()
				return true
			}
		}
		if rerr != nil {
			return true
		}
	}
}

// listenBody is the subscriptions/listen request for the session: every
// list-changed notification the server offers, and the resources the
// agent subscribed to. any is false when there is nothing to listen to.
func listenBody(d *era.Discovery, sess *session.Session) (body []byte, any bool) {
	if d == nil {
		return nil, false
	}
	caps := gjson.ParseBytes(d.Capabilities)
	b := []byte(`{"jsonrpc":"2.0","id":0,"method":"subscriptions/listen","params":{"notifications":{`)
	n := 0
	flag := func(name string) {
		if n > 0 {
			b = append(b, ',')
		}
		b = append(b, `"`+name+`":true`...)
		n++
	}
	if caps.Get("tools.listChanged").Bool() {
		flag("toolsListChanged")
	}
	if caps.Get("prompts.listChanged").Bool() {
		flag("promptsListChanged")
	}
	if caps.Get("resources.listChanged").Bool() {
		flag("resourcesListChanged")
	}
	if subs := sess.Journal().Subscriptions; len(subs) > 0 && caps.Get("resources.subscribe").Bool() {
		if n > 0 {
			b = append(b, ',')
		}
		b = append(b, `"resourceSubscriptions":[`...)
		for i, uri := range subs {
			if i > 0 {
				b = append(b, ',')
			}
			b = strconv.AppendQuote(b, uri)
		}
		b = append(b, ']')
		n++
	}
	return append(b, "}}}"...), n > 0
}
