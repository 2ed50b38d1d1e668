package proxy

import (
	"bufio"
	"bytes"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"

	"github.com/mcpheal/mcpheal/classify"
	"github.com/mcpheal/mcpheal/classify/sse"
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
	mu   sync.Mutex
	resp *upstream.Response // the upstream listen, while open
	quit chan struct{}
	once sync.Once
}

func (l *listenState) stop() {
	l.once.Do(func() {
		close(l.quit)
		l.mu.Lock()
		if l.resp != nil {
			l.resp.Interrupt()
		}
		l.mu.Unlock()
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

// bridgeListen serves a bridged agent's GET stream. The newest stream of
// a session wins, as for a session-era upstream.
func (s *Server) bridgeListen(ctx *fasthttp.RequestCtx, sess *session.Session) {
	l := &listenState{quit: make(chan struct{})}
	if old, loaded := s.bridge.listens.Swap(sess.ID, l); loaded {
		old.(*listenState).stop()
	}
	hdr := new(fasthttp.RequestHeader)
	ctx.Request.Header.CopyTo(hdr)
	ctx.SetStatusCode(fasthttp.StatusOK)
	ctx.SetContentTypeBytes(mimeEventStream)
	ctx.Response.Header.Set("Cache-Control", "no-cache")
	s.count.request(&message{get: true}, classify.OK)
	out := make(chan []byte, 16)
	if s.bg.Add(1) {
		go s.listenPump(sess, l, hdr, out)
	}
	conn := ctx.Conn()
	ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
		defer s.bridge.listens.CompareAndDelete(sess.ID, l)
		defer l.stop()
		s.listenWrite(w, conn, l, out)
	})
}

// listenChanged reopens the session's listen after its subscriptions
// changed.
func (s *Server) listenChanged(id session.ClientID) {
	if v, ok := s.bridge.listens.Load(id); ok {
		v.(*listenState).reopen()
	}
}

// stopListens ends every bridged GET stream (shutdown).
func (s *Server) stopListens() {
	s.bridge.listens.Range(func(k, v any) bool {
		s.bridge.listens.Delete(k)
		v.(*listenState).stop()
		return true
	})
}

// stopListen ends the session's bridged GET stream.
func (s *Server) stopListen(id session.ClientID) {
	if v, ok := s.bridge.listens.LoadAndDelete(id); ok {
		v.(*listenState).stop()
	}
}

func (s *Server) listenWrite(w *bufio.Writer, conn net.Conn, l *listenState, out <-chan []byte) {
	t := time.NewTicker(s.cfg.StreamKeepalive)
	defer t.Stop()
	// A first comment sends the head at once: clients wait for it before
	// they go on (the Go SDK's connect does).
	b := keepaliveComment
	for {
		s.armWrite(conn)
		if _, err := w.Write(b); err != nil || w.Flush() != nil {
			return
		}
		s.count.bytesOut.Add(uint64(len(b)))
		select {
		case msg := <-out:
			b = append(append([]byte("event: message\ndata: "), msg...), "\n\n"...)
		case <-t.C:
			b = keepaliveComment
		case <-l.quit:
			return
		case <-s.done:
			return
		}
	}
}

// listenPump keeps one upstream listen open for the agent's stream and
// hands its notifications to the writer.
func (s *Server) listenPump(sess *session.Session, l *listenState, hdr *fasthttp.RequestHeader, out chan<- []byte) {
	defer s.bg.Done()
	buf := make([]byte, 16<<10)
	var data []byte
	delay := time.Duration(0)
	for {
		if delay > 0 {
			select {
			case <-l.quit:
				return
			case <-s.done:
				return
			case <-time.After(delay):
			}
		}
		select {
		case <-l.quit:
			return
		default:
		}
		body, any := listenBody(s.eras.info.Load(), sess)
		if !any {
			// Nothing to listen to: the agent's stream stays open with
			// keepalives until a subscription opens one.
			delay = time.Second
			continue
		}
		req := fasthttp.AcquireRequest()
		s.build(req, &upcall{hdr: hdr, body: envelope(body, s.upcallID("listen"), sess, nil, ""), version: statelessVersion,
			mcpMethod: "subscriptions/listen"})
		resp := upstream.AcquireResponse()
		l.mu.Lock()
		l.resp = resp
		l.mu.Unlock()
		err := s.do(req, resp, time.Now().Add(s.cfg.ResponseTimeout))
		fasthttp.ReleaseRequest(req)
		if err != nil || resp.StatusCode() != fasthttp.StatusOK || !resp.IsStream() {
			if err == nil && modernRefused(resp.StatusCode(), resp.Body()) {
				s.forgetEra()
			}
			l.mu.Lock()
			l.resp = nil
			l.mu.Unlock()
			upstream.ReleaseResponse(resp)
			delay = min(max(2*delay, 100*time.Millisecond), 5*time.Second)
			continue
		}
		delay = 0
		fr := sse.Framer{Max: s.cfg.MaxSSELine}
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
				select {
				case out <- append([]byte(nil), data...):
				case <-l.quit:
				}
			}
			if rerr != nil {
				break
			}
		}
		l.mu.Lock()
		l.resp = nil
		l.mu.Unlock()
		upstream.ReleaseResponse(resp)
		delay = 50 * time.Millisecond // ended or reopened: again, at once but not in a tight loop
	}
}

// listenBody is the subscriptions/listen request for the session: every
// list-changed notification the server offers, and the resources the
// agent subscribed to. any is false when there is nothing to listen to.
func listenBody(d *discovery, sess *session.Session) (body []byte, any bool) {
	if d == nil {
		return nil, false
	}
	caps := gjson.ParseBytes(d.capabilities)
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
