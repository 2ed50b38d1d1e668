package held

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"

	"github.com/mcpheal/mcpheal/classify"
	"github.com/mcpheal/mcpheal/classify/sse"
	"github.com/mcpheal/mcpheal/proxy/internal/exchange"
	"github.com/mcpheal/mcpheal/proxy/internal/heal"
	"github.com/mcpheal/mcpheal/proxy/internal/link"
	"github.com/mcpheal/mcpheal/proxy/internal/obs"
	"github.com/mcpheal/mcpheal/proxy/internal/route/stream"
	"github.com/mcpheal/mcpheal/proxy/internal/wire"
	"github.com/mcpheal/mcpheal/session"
)

// A 2026-07-28 agent's subscriptions/listen on a held session is served
// from the session's GET stream: one upstream GET per held session (a
// getStream, which reopens it across heals), shared by every listen on
// it, each of which gets the notifications its filter asks for; the
// resources a listen names are subscribed upstream (resources/subscribe,
// kept in the session's journal, so a heal restores them) while a listen
// wants them.

// heldHub is the GET stream of a held session and its listens. It is
// open for the session's life: a request the upstream sends there, outside
// any call, is refused at once rather than left for the upstream to time
// out on (fan).
type Hub struct {
	g       *stream.Stream
	mu      sync.Mutex
	listens map[*heldListen]struct{}
	uris    map[string]int // subscribed upstream → listens that want it
}

// heldListen is one agent's listen.
type heldListen struct {
	h     *Route
	sess  *session.Session
	id    string // raw JSON id of the listen request
	key   string // in held.calls
	tools bool
	// prompts and resources: the list-changed notifications it wants.
	prompts, resources bool
	uris               map[string]bool
	out                *wire.Queue
	quit               chan struct{}
	once               sync.Once
	st                 exchange.AgentStream
	charged            bool // listenCost taken from the memory budget, given back by unlisten
}

// MaxRefusing bounds the refusals of upstream requests in flight, over
// every held session: each is a POST that may wait up to 5 s.
const MaxRefusing = 8

// A listen holds a goroutine, its agent's connection and buffers: about
// listenCost bytes, counted in the memory budget while it is open, and at
// most maxListens of them per held session.
const (
	ListenCost = 40 << 10
	MaxListens = 32
)

// listenFilter is what a listen asks for (params.notifications), and what
// mcpheal honours of it: what the upstream's capabilities offer.
func (h *Route) listenFilter(r *exchange.Request, caps gjson.Result) *heldListen {
	f := gjson.GetBytes(r.Body, "params.notifications")
	l := &heldListen{h: h, sess: r.Sess, id: string(append([]byte(nil), r.Msg.ID...)), uris: map[string]bool{},
		out: wire.NewQueue(h.S.Mem, 64), quit: make(chan struct{})}
	l.tools = f.Get("toolsListChanged").Bool() && caps.Get("tools.listChanged").Bool()
	l.prompts = f.Get("promptsListChanged").Bool() && caps.Get("prompts.listChanged").Bool()
	l.resources = f.Get("resourcesListChanged").Bool() && caps.Get("resources.listChanged").Bool()
	if caps.Get("resources.subscribe").Bool() {
		for _, u := range f.Get("resourceSubscriptions").Array() {
			if u.Type == gjson.String && u.Str != "" {
				l.uris[u.Str] = true
			}
		}
	}
	return l
}

// listen serves subscriptions/listen: an event stream that begins with
// notifications/subscriptions/acknowledged (the honoured filter) and
// carries every matching notification of the held session until the agent
// closes it or cancels it.
func (h *Route) listen(ctx *fasthttp.RequestCtx, r *exchange.Request) {
	s := h.S
	caps := gjson.ParseBytes(h.capabilities(r.Sess))
	l := h.listenFilter(r, caps)
	hub := h.hub(r.Sess)
	hub.mu.Lock()
	n := len(hub.listens)
	hub.mu.Unlock()
	switch {
	case n >= MaxListens:
		s.Writer().Fail(ctx, &r.Msg, classify.OK, heldFailure(exchange.Failure{Code: wire.CodeTooMany, RetryAfter: 10,
			Msg: "too many subscriptions/listen open on this agent's session (" + strconv.Itoa(MaxListens) + "); close one first"}))
		return
	case !s.Mem.Take(ListenCost):
		s.Writer().Fail(ctx, &r.Msg, classify.OK, heldFailure(exchange.Failure{Code: wire.CodeBudget, RetryAfter: 1,
			Msg: "subscriptions/listen not opened: mcpheal's memory_budget is reached; retry later"}))
		return
	}
	l.charged = true
	for uri := range l.uris {
		if err := hub.want(h, r, uri); err != nil {
			delete(l.uris, uri)
			s.Log.Warn().Str(obs.LogSession, r.Sess.ID.Short()).Err(err).Msg("listen: resource not subscribed")
		}
	}
	hub.mu.Lock()
	hub.listens[l] = struct{}{}
	hub.mu.Unlock()
	l.key = heldCallKey(r.Auth, r.Body, l.id)
	h.calls.Store(l.key, l)
	l.st = exchange.AgentStream{S: s, Conn: ctx.Conn()}
	ack := append([]byte(`{"jsonrpc":"2.0","method":"notifications/subscriptions/acknowledged","params":{"notifications":{`), l.filter()...)
	ack = append(ack, `},"_meta":{"io.modelcontextprotocol/subscriptionId":`...)
	ack = append(ack, l.id...)
	ack = append(ack, "}}}"...)
	s.Writer().Stream(ctx, &r.Msg, nil, classify.OK, func(w *bufio.Writer) {
		defer h.unlisten(l)
		l.st.W = w
		if !l.st.Event(ack) {
			return
		}
		l.st.Pump(l.out, nil, l.quit, false)
	})
}

// filter is the honoured filter's members, raw JSON.
func (l *heldListen) filter() []byte {
	var out []byte
	add := func(k string, on bool) {
		if on {
			if len(out) > 0 {
				out = append(out, ',')
			}
			out = append(out, `"`+k+`":true`...)
		}
	}
	add("toolsListChanged", l.tools)
	add("promptsListChanged", l.prompts)
	add("resourcesListChanged", l.resources)
	if len(l.uris) > 0 {
		if len(out) > 0 {
			out = append(out, ',')
		}
		out = append(out, `"resourceSubscriptions":[`...)
		n := 0
		for uri := range l.uris {
			if n > 0 {
				out = append(out, ',')
			}
			out = strconv.AppendQuote(out, uri)
			n++
		}
		out = append(out, ']')
	}
	return out
}

// cancelByAgent ends the listen (notifications/cancelled naming it).
func (l *heldListen) cancelByAgent() { l.stop() }

func (l *heldListen) stop() { l.once.Do(func() { close(l.quit) }) }

// StopListens ends every agent's listen (shutdown): a listen stays open
// until its agent leaves, and would hold the drain for its whole timeout.
func (h *Route) StopListens() {
	h.mu.Lock()
	hubs := make([]*Hub, 0, len(h.Hubs))
	for _, hub := range h.Hubs {
		hubs = append(hubs, hub)
	}
	h.mu.Unlock()
	for _, hub := range hubs {
		hub.mu.Lock()
		for l := range hub.listens {
			l.stop()
		}
		hub.mu.Unlock()
	}
}

// unlisten ends a listen: its resources no other listen wants are
// unsubscribed.
func (h *Route) unlisten(l *heldListen) {
	l.stop()
	h.calls.CompareAndDelete(l.key, l)
	h.mu.Lock()
	if l.charged {
		l.charged = false
		h.S.Mem.Give(ListenCost)
	}
	h.mu.Unlock()
	h.mu.Lock()
	hub := h.Hubs[l.sess]
	h.mu.Unlock()
	if hub == nil {
		return
	}
	hub.mu.Lock()
	delete(hub.listens, l)
	var drop []string
	for uri := range l.uris {
		if hub.uris[uri]--; hub.uris[uri] <= 0 {
			delete(hub.uris, uri)
			drop = append(drop, uri)
		}
	}
	hub.mu.Unlock()
	for _, uri := range drop {
		h.journalled(context.Background(), heal.RecipeHeader(l.sess), l.sess, session.JournalChange{URI: uri},
			"resources/unsubscribe", `{"uri":`+strconv.Quote(uri)+`}`)
	}
}

// hub returns the held session's hub, opening its GET stream.
func (h *Route) hub(sess *session.Session) *Hub {
	h.mu.Lock()
	defer h.mu.Unlock()
	if hub := h.Hubs[sess]; hub != nil {
		return hub
	}
	s := h.S
	g := &stream.Stream{S: s, Up: h.Up, Healer: h.Healer, Set: h.Streams, Sess: sess, Hdr: heal.RecipeHeader(sess), Out: wire.NewQueue(s.Mem, stream.QueueLen), Lossy: true,
		Quit: make(chan struct{}), Wake: make(chan struct{}, 1),
		Done: make(chan struct{})}
	hub := &Hub{g: g, listens: map[*heldListen]struct{}{}, uris: map[string]int{}}
	if sess.Removed() {
		// Released already (under h.mu, after it left the store): its
		// stream never opens, and nothing is kept for it.
		close(g.Done)
		return hub
	}
	h.Hubs[sess] = hub
	h.Streams.Add(sess.ID, g) // a heal moves it to the new session
	if s.Bg.Add(2) {
		go func() {
			defer h.Streams.Remove(sess.ID, g)
			if g.Reopen("", 0) {
				g.Pump()
			} else {
				s.Bg.Done()
				close(g.Done)
			}
		}()
		go hub.fan(h)
	} else {
		close(g.Done)
	}
	return hub
}

// fan gives each listen the events of the hub's GET stream its filter
// asks for, with its subscription id. A request from the upstream on it
// for a user's input (asksAUser) goes to the session's call in flight when
// there is one only (a server that asks within a tool, on its GET
// stream); any other has no agent to ask (2026-07-28 carries requests for
// input only in a call's answer): it is refused.
func (hub *Hub) fan(h *Route) {
	defer h.S.Bg.Done()
	defer hub.g.Out.Close()
	var data []byte
	for {
		var ev []byte
		select {
		case ev = <-hub.g.Out.C:
			hub.g.Out.Took(ev) // each listen queues its own copy
		case <-hub.g.Done:
			return
		}
		var fr sse.Framer
		fr.Feed(ev)
		for {
			one, ok, _ := fr.Next()
			if !ok {
				break
			}
			if data = sse.Data(data[:0], one); len(data) > 0 {
				hub.deliver(h, data)
			}
		}
	}
}

// deliver sends one upstream message to the listens that want it.
func (hub *Hub) deliver(h *Route, msg []byte) {
	m := gjson.ParseBytes(msg)
	method := m.Get("method").Str
	if id := m.Get("id"); id.Exists() && method != "" {
		h.ask(hub.g.Sess, msg, id.Raw, method)
		return
	}
	uri := ""
	switch method {
	case "notifications/tools/list_changed":
		if h.S.Bg.Add(1) { // what the new list says of its tools' annotations
			go h.Healer.RefreshTools(hub.g.Sess, heal.RecipeHeader(hub.g.Sess), false)
		}
	case "notifications/prompts/list_changed", "notifications/resources/list_changed":
	case "notifications/resources/updated":
		uri = m.Get("params.uri").Str
	default:
		return
	}
	hub.mu.Lock()
	var to []*heldListen
	for l := range hub.listens {
		switch {
		case method == "notifications/tools/list_changed" && l.tools,
			method == "notifications/prompts/list_changed" && l.prompts,
			method == "notifications/resources/list_changed" && l.resources,
			uri != "" && l.uris[uri]:
			to = append(to, l)
		}
	}
	hub.mu.Unlock()
	for _, l := range to {
		b := WithSubscription(msg, l.id)
		// A listen whose agent left 64 notifications unread gets no more
		// until it reads: the session's other listens do not wait on it.
		switch l.out.TryPut(sse.AppendEvent(nil, "message", b)) {
		case wire.Late:
			h.S.Log.Warn().Str(obs.LogSession, l.sess.ID.Short()).Msg("listen: agent not reading; notification dropped")
		case wire.OverBudget:
			h.S.Log.Warn().Str(obs.LogSession, l.sess.ID.Short()).Int64("budget", h.S.Mem.Limit).
				Msg("listen: notification would pass the memory budget; dropped")
		}
	}
}

// WithSubscription returns a notification with params._meta naming the
// listen it is delivered on.
func WithSubscription(msg []byte, listenID string) []byte {
	p := gjson.GetBytes(msg, "params")
	meta := `"_meta":{"io.modelcontextprotocol/subscriptionId":` + listenID + `}`
	if !p.IsObject() {
		out := append([]byte(nil), msg[:len(msg)-1]...) // without the closing brace
		return append(out, `,"params":{`+meta+`}}`...)
	}
	i := p.Index + 1 // past the params' opening brace
	out := append([]byte(nil), msg[:i]...)
	out = append(out, meta...)
	if hasMembers(p.Raw) {
		out = append(out, ',')
	}
	return append(out, msg[i:]...)
}

// want subscribes uri upstream for a listen, unless another listen of the
// hub already did.
func (hub *Hub) want(h *Route, r *exchange.Request, uri string) error {
	hub.mu.Lock()
	n := hub.uris[uri]
	hub.uris[uri] = n + 1
	hub.mu.Unlock()
	if n > 0 {
		return nil
	}
	err := h.journalled(r.Tctx, r.Hdr, r.Sess, session.JournalChange{URI: uri, Subscribed: true},
		"resources/subscribe", `{"uri":`+strconv.Quote(uri)+`}`)
	if err != nil {
		hub.mu.Lock()
		if hub.uris[uri]--; hub.uris[uri] <= 0 {
			delete(hub.uris, uri)
		}
		hub.mu.Unlock()
	}
	return err
}

// ask gives a request the upstream sent on a held session's GET stream
// to the session's one call in flight (inject), in the background: the
// call's stream may take a moment to begin, and the hub's other events do
// not wait for it. Anything else, or past maxRefusing such requests at a
// time, is refused.
func (h *Route) ask(sess *session.Session, msg []byte, id, method string) {
	var c *heldCall
	if asksAUser(method) {
		c = h.onlyCall(sess)
	}
	if c == nil {
		h.refuse(sess, id, method)
		return
	}
	if h.refusing.Add(1) > MaxRefusing || !h.S.Bg.Add(1) {
		h.refusing.Add(-1)
		h.refuse(sess, id, method)
		return
	}
	msg, id, method = bytes.Clone(msg), strings.Clone(id), strings.Clone(method) // the hub's buffer is reused
	go func() {
		defer h.S.Bg.Done()
		ok := c.inject(msg)
		h.refusing.Add(-1) // before refuse, which takes a place of its own
		if !ok {
			h.refuse(sess, id, method)
		}
	}()
}

// asksAUser reports the requests a server makes on its GET stream within
// a tool (elicitation, sampling). A roots/list there is most often the
// server's own business (server-everything asks 350 ms after initialize,
// on a timer): given to whatever call is in flight it would add a round to
// a call that never asked.
func asksAUser(method string) bool {
	return method == "elicitation/create" || method == "sampling/createMessage"
}

// onlyCall returns the call in flight on a held session (waiting for its
// answer or for its agent's input), nil when there is none or more than
// one: whose request it would be is then a guess.
func (h *Route) onlyCall(sess *session.Session) *heldCall {
	var one *heldCall
	n := 0
	find := func(_, v any) bool {
		if c, ok := v.(*heldCall); ok && c.sess == sess && one != c {
			one, n = c, n+1
		}
		return n < 2
	}
	h.calls.Range(find)
	h.parked.Range(find)
	if n != 1 {
		return nil
	}
	return one
}

// refuse answers a request the upstream sent on a held session's GET
// stream: no agent can answer it.
func (h *Route) refuse(sess *session.Session, id, method string) {
	s := h.S
	if h.refusing.Add(1) > MaxRefusing {
		// An upstream that floods its GET stream with requests gets no
		// more answers than this at a time; the rest it times out itself.
		h.refusing.Add(-1)
		return
	}
	if !s.Bg.Add(1) {
		h.refusing.Add(-1)
		return
	}
	go func() {
		defer s.Bg.Done()
		defer h.refusing.Add(-1)
		up, gen := sess.Current()
		text, _ := json.Marshal(method + " outside a call cannot reach an MCP 2026-07-28 agent")
		body := []byte(`{"jsonrpc":"2.0","id":` + id + `,"error":{"code":-32601,"message":` + string(text) + `}}`)
		// The upstream's own id again (events.go); none for a session
		// that is gone.
		restored, live := wire.AnswerRoute(body, id, gen)
		if !live {
			return
		}
		if restored != nil {
			body = restored
		}
		_, _ = h.Up.Call(&link.Upcall{Hdr: heal.RecipeHeader(sess), Session: up, Version: sess.Recipe.ProtocolVersion,
			Body: body, Deadline: time.Now().Add(5 * time.Second), Name: "response"})
	}()
}
