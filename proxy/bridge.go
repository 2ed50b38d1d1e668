package proxy

import (
	"bufio"
	"bytes"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"

	"github.com/mcpheal/mcpheal/classify"
	"github.com/mcpheal/mcpheal/classify/sse"
	"github.com/mcpheal/mcpheal/session"
	"github.com/mcpheal/mcpheal/upstream"
)

// The bridge (README "Legacy agents, 2026-07-28 servers"): a session-era
// agent in front of an upstream that speaks only MCP 2026-07-28. mcpheal
// owns the agent's session; upstream every request is self-contained:
//
//   - initialize is answered from server/discover; notifications/initialized
//     and ping locally;
//   - logging/setLevel and resources/subscribe|unsubscribe are recorded in
//     the session's journal and answered locally: the level goes into every
//     request's _meta, the subscriptions into the GET stream's
//     subscriptions/listen (bridge_listen.go);
//   - every other request gets the 2026-07-28 envelope (_meta with the
//     agent's protocol version, clientInfo and capabilities from its
//     initialize) and headers (MCP-Protocol-Version, Mcp-Method, Mcp-Name);
//   - an InputRequiredResult becomes the session-era server→client
//     requests on the call's SSE answer (sampling, elicitation, roots); the
//     agent's answers go into the retry's inputResponses;
//   - notifications/cancelled closes the upstream request;
//   - what cannot be translated gets a JSON-RPC error that names it.

// legacyVersions are the session-era versions an agent may ask for; the
// bridge answers initialize with the agent's own, or the newest.
var legacyVersions = []string{"2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"}

// maxInputRounds bounds the InputRequiredResult rounds of one call (the
// TypeScript and Go SDK clients stop at 10 too).
const maxInputRounds = 10

// bridgeState is the bridge's per-process bookkeeping.
type bridgeState struct {
	inputs  sync.Map // raw JSON id of a request sent to an agent → *pendingInput
	calls   sync.Map // callKey → *bridgeCallState, for notifications/cancelled
	listens sync.Map // session.ClientID → *listenState (bridge_listen.go)
}

// pendingInput is a server→client request the bridge sent an agent,
// waiting for its answer.
type pendingInput struct {
	sess   *session.Session
	answer chan []byte // the agent's response message, once
}

// bridgeCallState is a bridged call in flight.
type bridgeCallState struct {
	mu        sync.Mutex
	resp      *upstream.Response // the upstream exchange of the current round, or nil
	cancelled bool
}

func callKey(id session.ClientID, rawID string) string { return string(id) + "\x00" + rawID }

// bridgeInitialize answers a legacy agent's initialize for a 2026-07-28
// upstream from what server/discover said, and creates its session.
func (s *Server) bridgeInitialize(ctx *fasthttp.RequestCtx, m *message) {
	d := s.eras.info.Load()
	if d == nil {
		writeError(ctx, fasthttp.StatusServiceUnavailable, codeUpstreamDown, m.idOrNull(), "upstream unreachable")
		return
	}
	body := ctx.PostBody()
	version := gjson.GetBytes(body, "params.protocolVersion").Str
	if !contains(legacyVersions, version) {
		version = legacyVersions[0]
	}
	init := session.Intern(body)
	sess := session.New(s.sealID(ctx.Request.Header.PeekBytes(hdrAuthorization), version, body), session.Recipe{
		InitBody:        init.Value(),
		Interned:        init,
		ProtocolVersion: version,
		Credential:      s.fingerprint(ctx.Request.Header.PeekBytes(hdrAuthorization)).String(),
		Header:          recipeHeaders(&ctx.Request.Header),
	}, "")
	if !s.mem.take(sessionCost(sess)) {
		writeError(ctx, fasthttp.StatusServiceUnavailable, codeTooMany, m.idOrNull(),
			"Too many sessions: mcpheal's memory_budget for this upstream is reached; retry later")
		return
	}
	if err := s.store.Add(sess); err != nil {
		s.mem.give(sessionCost(sess))
		writeError(ctx, fasthttp.StatusServiceUnavailable, codeTooMany, m.idOrNull(),
			"Too many sessions: mcpheal's session cap is reached; retry later")
		return
	}
	s.index(sess)
	out := append([]byte(`{"jsonrpc":"2.0","id":`), m.id...)
	out = append(out, `,"result":{"protocolVersion":`...)
	out = strconv.AppendQuote(out, version)
	out = append(out, `,"capabilities":`...)
	out = append(out, d.capabilities...)
	out = append(out, `,"serverInfo":`...)
	out = append(out, d.serverInfo...)
	if d.instructions != nil {
		out = append(out, `,"instructions":`...)
		out = append(out, d.instructions...)
	}
	out = append(out, "}}"...)
	ctx.SetStatusCode(fasthttp.StatusOK)
	ctx.SetContentTypeBytes(mimeJSON)
	ctx.Response.Header.SetBytesK(hdrSessionID, string(sess.ID))
	ctx.Response.SetBody(out)
	s.count.request(m, classify.OK)
	s.log.Debug().Str(logSession, sess.ID.Short()).Str("protocol", version).Msg("session created (bridged to 2026-07-28)")
}

// bridgePost handles one POST of a legacy agent on a bridged session.
func (s *Server) bridgePost(ctx *fasthttp.RequestCtx, sess *session.Session, m message) {
	body := ctx.PostBody()
	switch {
	case m.batch:
		writeError(ctx, fasthttp.StatusBadRequest, codeInvalidRequest, "null",
			"JSON-RPC batches are not supported: the upstream speaks MCP 2026-07-28, which has none")
		return
	case m.method == "" && m.id != "":
		s.bridgeInput(ctx, sess, m.id, body)
		return
	case m.id == "": // a notification
		if m.method == "notifications/cancelled" {
			s.bridgeCancel(sess, gjson.GetBytes(body, "params.requestId").Raw)
		}
		// notifications/initialized, roots/list_changed…: 2026-07-28 has
		// no place for them.
		ctx.SetStatusCode(fasthttp.StatusAccepted)
		return
	}
	switch m.method {
	case "ping":
		s.bridgeResult(ctx, &m, "{}")
	case "initialize":
		writeError(ctx, fasthttp.StatusBadRequest, codeInvalidRequest, m.id, "Invalid Request: the session is already initialized")
	case "logging/setLevel":
		p := gjson.GetBytes(body, "params")
		if !p.Get("level").Exists() {
			writeError(ctx, fasthttp.StatusOK, -32602, m.id, "Invalid params: level is required")
			return
		}
		sess.SetLevel(p.Raw)
		s.saveJournal(sess)
		s.bridgeResult(ctx, &m, "{}")
	case "resources/subscribe", "resources/unsubscribe":
		uri := gjson.GetBytes(body, "params.uri").Str
		if uri == "" {
			writeError(ctx, fasthttp.StatusOK, -32602, m.id, "Invalid params: uri is required")
			return
		}
		sess.Subscribe(uri, m.method == "resources/subscribe")
		s.saveJournal(sess)
		s.listenChanged(sess.ID)
		s.bridgeResult(ctx, &m, "{}")
	default:
		s.bridgeCall(ctx, sess, m)
	}
}

// bridgeResult answers a request locally with result (raw JSON).
func (s *Server) bridgeResult(ctx *fasthttp.RequestCtx, m *message, result string) {
	ctx.SetStatusCode(fasthttp.StatusOK)
	ctx.SetContentTypeBytes(mimeJSON)
	out := append([]byte(`{"jsonrpc":"2.0","id":`), m.id...)
	out = append(out, `,"result":`...)
	out = append(out, result...)
	ctx.Response.SetBody(append(out, '}'))
	s.count.request(m, classify.OK)
}

// bridgeInput takes an agent's answer to a request the bridge sent it.
func (s *Server) bridgeInput(ctx *fasthttp.RequestCtx, sess *session.Session, id string, body []byte) {
	v, ok := s.bridge.inputs.Load(id)
	if ok {
		p := v.(*pendingInput)
		if p.sess == sess {
			select {
			case p.answer <- append([]byte(nil), body...):
			default: // answered already
			}
		}
	}
	ctx.SetStatusCode(fasthttp.StatusAccepted)
}

// bridgeCancel closes the upstream request of the agent's call rawID.
func (s *Server) bridgeCancel(sess *session.Session, rawID string) {
	v, ok := s.bridge.calls.Load(callKey(sess.ID, rawID))
	if !ok {
		return
	}
	c := v.(*bridgeCallState)
	c.mu.Lock()
	c.cancelled = true
	if c.resp != nil {
		c.resp.Interrupt()
	}
	c.mu.Unlock()
}

// envelope returns body as a 2026-07-28 request: id replaced by id, the
// params' _meta completed with the session's protocol version, client info,
// client capabilities and log level, and inputResponses and requestState
// set when not empty.
func envelope(body []byte, id string, sess *session.Session, inputs []byte, state string) []byte {
	r := gjson.ParseBytes(body)
	init := gjson.Parse(sess.Recipe.InitBody)
	out := append([]byte(`{"jsonrpc":"2.0","id":`), id...)
	out = append(out, `,"method":`...)
	out = append(out, r.Get("method").Raw...)
	out = append(out, `,"params":{`...)
	n := 0
	var meta gjson.Result
	r.Get("params").ForEach(func(k, v gjson.Result) bool {
		switch k.Str {
		case "_meta":
			meta = v
			return true
		case "inputResponses", "requestState":
			return true
		}
		if n > 0 {
			out = append(out, ',')
		}
		out = append(out, k.Raw...)
		out = append(out, ':')
		out = append(out, v.Raw...)
		n++
		return true
	})
	comma := func() {
		if n > 0 {
			out = append(out, ',')
		}
		n++
	}
	if len(inputs) > 0 {
		comma()
		out = append(out, `"inputResponses":`...)
		out = append(out, inputs...)
	}
	if state != "" {
		comma()
		out = append(out, `"requestState":`...)
		out = append(out, state...)
	}
	comma()
	out = append(out, `"_meta":{"io.modelcontextprotocol/protocolVersion":"`+statelessVersion+`"`...)
	if ci := init.Get("params.clientInfo"); ci.IsObject() {
		out = append(out, `,"io.modelcontextprotocol/clientInfo":`...)
		out = append(out, ci.Raw...)
	}
	out = append(out, `,"io.modelcontextprotocol/clientCapabilities":`...)
	if cc := init.Get("params.capabilities"); cc.IsObject() {
		out = append(out, cc.Raw...)
	} else {
		out = append(out, "{}"...)
	}
	if lvl := gjson.Get(sess.Journal().Level, "level"); lvl.Type == gjson.String {
		out = append(out, `,"io.modelcontextprotocol/logLevel":`...)
		out = append(out, lvl.Raw...)
	}
	meta.ForEach(func(k, v gjson.Result) bool {
		if !strings.HasPrefix(k.Str, "io.modelcontextprotocol/") {
			out = append(out, ',')
			out = append(out, k.Raw...)
			out = append(out, ':')
			out = append(out, v.Raw...)
		}
		return true
	})
	return append(out, "}}}"...)
}

// mcpNameOf returns the Mcp-Name header value of a 2026-07-28 request.
func mcpNameOf(method string, body []byte) string {
	switch method {
	case "tools/call", "prompts/get":
		return gjson.GetBytes(body, "params.name").Str
	case "resources/read":
		return gjson.GetBytes(body, "params.uri").Str
	}
	return ""
}

// bridgeCall sends a legacy agent's request upstream as a 2026-07-28 one
// and answers the agent, InputRequiredResult rounds included. The answer
// is an event stream (progress, log messages and requests to the agent go
// on it as they come), or JSON when the upstream answered JSON at once.
func (s *Server) bridgeCall(ctx *fasthttp.RequestCtx, sess *session.Session, m message) {
	c := &bridgeCallState{}
	key := callKey(sess.ID, m.id)
	s.bridge.calls.Store(key, c)
	agentBody := append([]byte(nil), ctx.PostBody()...)
	hdr := new(fasthttp.RequestHeader)
	ctx.Request.Header.CopyTo(hdr)
	b := &bridgeRun{s: s, sess: sess, m: m, mid: strings.Clone(m.id), body: agentBody, hdr: hdr, call: c}
	b.m.id, b.m.method, b.m.tool = b.mid, strings.Clone(m.method), strings.Clone(m.tool)
	resp, err := b.send(b.mid, nil, "")
	if err == nil && !resp.IsStream() {
		// JSON at once: unless it asks for input, it is the answer.
		msg := resp.Body()
		if !isInputRequired(msg) {
			b.finishJSON(ctx, resp.StatusCode(), msg)
			upstream.ReleaseResponse(resp)
			s.bridge.calls.Delete(key)
			return
		}
	}
	if err != nil {
		s.bridge.calls.Delete(key)
		b.fail(ctx, err)
		return
	}
	// An event stream from here on.
	ctx.SetStatusCode(fasthttp.StatusOK)
	ctx.SetContentTypeBytes(mimeEventStream)
	ctx.Response.Header.Set("Cache-Control", "no-cache")
	ctx.Response.Header.SetBytesK(hdrSessionID, string(sess.ID))
	conn := ctx.Conn()
	ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
		defer s.bridge.calls.Delete(key)
		b.w, b.conn = w, conn
		b.stream(resp)
	})
}

// bridgeRun is one bridged call: its rounds upstream and its answer.
type bridgeRun struct {
	s    *Server
	sess *session.Session
	m    message
	mid  string // the agent's id, raw JSON
	body []byte // the agent's request
	hdr  *fasthttp.RequestHeader
	call *bridgeCallState
	w    *bufio.Writer
	conn net.Conn
}

// send sends one round upstream (id: its JSON-RPC id) and returns the
// answer's head, its body read unless it is a stream. Failures that
// provably delivered nothing are retried within the heal budget.
func (b *bridgeRun) send(id string, inputs []byte, state string) (*upstream.Response, error) {
	s := b.s
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	s.build(req, &upcall{hdr: b.hdr, body: envelope(b.body, id, b.sess, inputs, state), version: statelessVersion,
		mcpMethod: b.m.method, mcpName: mcpNameOf(b.m.method, b.body)})
	budget := time.Now().Add(s.cfg.HealTimeout)
	delay := 10 * time.Millisecond
	for {
		if ok, wait := s.breaker.Allow(); !ok {
			return nil, &breakerOpenError{wait: wait}
		}
		resp := upstream.AcquireResponse()
		b.call.mu.Lock()
		if b.call.cancelled {
			b.call.mu.Unlock()
			upstream.ReleaseResponse(resp)
			return nil, errCancelled
		}
		b.call.resp = resp
		b.call.mu.Unlock()
		do := s.doOnce
		if replaySafe(b.m.method) {
			do = s.do
		}
		err := do(req, resp, time.Now().Add(s.cfg.ResponseTimeout))
		b.call.mu.Lock()
		b.call.resp = nil
		b.call.mu.Unlock()
		if err == nil {
			s.upSuccess()
			return resp, nil
		}
		upstream.ReleaseResponse(resp)
		s.upFailure()
		if (upstream.Delivered(err) && !replaySafe(b.m.method)) || time.Now().Add(delay).After(budget) || !s.sleep(delay) {
			return nil, err
		}
		delay = min(2*delay, time.Second)
	}
}

var errCancelled = errors.New("cancelled by the agent")

// replaySafe reports a method that reads only, so that it may be sent again
// after an exchange that may have delivered it.
func replaySafe(method string) bool {
	switch method {
	case "tools/list", "prompts/list", "resources/list", "resources/templates/list", "resources/read",
		"prompts/get", "completion/complete":
		return true
	}
	return false
}

// fail answers the agent for a call that got no answer upstream.
func (b *bridgeRun) fail(ctx *fasthttp.RequestCtx, err error) {
	var bo *breakerOpenError
	switch {
	case errors.Is(err, errCancelled):
		ctx.SetStatusCode(fasthttp.StatusAccepted) // the agent gave up on it
	case errors.As(err, &bo):
		writeError(ctx, fasthttp.StatusServiceUnavailable, codeUpstreamDown, b.mid, "upstream unavailable (circuit breaker open)")
	case upstream.Delivered(err):
		b.s.count.replaysRefused.Add(1)
		writeError(ctx, fasthttp.StatusOK, codeMaybeExecuted, b.mid,
			"upstream connection lost after the request was sent; "+b.m.method+" may or may not have run and was not retried")
	default:
		writeError(ctx, fasthttp.StatusServiceUnavailable, codeUpstreamDown, b.mid, "upstream unreachable")
	}
}

// finishJSON answers the agent with the upstream's JSON answer, mapped to
// the session era.
func (b *bridgeRun) finishJSON(ctx *fasthttp.RequestCtx, status int, msg []byte) {
	out, status := b.legacyAnswer(status, msg)
	ctx.SetStatusCode(status)
	ctx.SetContentTypeBytes(mimeJSON)
	ctx.Response.Header.SetBytesK(hdrSessionID, string(b.sess.ID))
	ctx.Response.SetBody(out)
	b.s.count.request(&b.m, classify.Classify(status, mimeJSON, out))
}

// legacyAnswer maps a 2026-07-28 answer to what a session-era agent
// expects: its own id; a method-not-found is HTTP 200 in the session era
// (a 404 would tell the agent its session is gone); a missing resource is
// -32002 again; a session-era server's refusal makes the era be asked
// again.
func (b *bridgeRun) legacyAnswer(status int, msg []byte) ([]byte, int) {
	if modernRefused(status, msg) {
		b.s.forgetEra()
	}
	r := gjson.ParseBytes(msg)
	if !r.IsObject() {
		return appendError(nil, codeProxyError, b.mid, "the upstream answered something that is not JSON-RPC"), fasthttp.StatusBadGateway
	}
	if e := r.Get("error"); e.Exists() {
		code := e.Get("code").Int()
		switch {
		case code == -32602 && b.m.method == "resources/read" && e.Get("data.uri").Exists():
			return appendError(nil, -32002, b.mid, "Resource not found: "+e.Get("data.uri").String()), fasthttp.StatusOK
		case code == -32021:
			return appendError(nil, -32600, b.mid, "The upstream (MCP 2026-07-28) needs a client capability the agent did not declare: "+
				e.Get("message").Str), fasthttp.StatusOK
		}
		if status == fasthttp.StatusNotFound || status == fasthttp.StatusBadRequest {
			status = fasthttp.StatusOK
		}
	}
	id := r.Get("id")
	if !id.Exists() {
		return msg, status
	}
	out := make([]byte, 0, len(msg)+len(b.mid))
	out = append(out, msg[:id.Index]...)
	out = append(out, b.mid...)
	return append(out, msg[id.Index+len(id.Raw):]...), status
}

// isInputRequired reports an InputRequiredResult.
func isInputRequired(msg []byte) bool {
	return gjson.GetBytes(msg, "result.resultType").Str == "input_required"
}

// stream writes the call's answer as an event stream: each round's
// events as they come, the requests of an InputRequiredResult, and the
// final answer.
func (b *bridgeRun) stream(resp *upstream.Response) {
	s := b.s
	roundID := b.mid
	for round := 1; ; round++ {
		msg, ok := b.relayRound(resp, roundID)
		upstream.ReleaseResponse(resp)
		if !ok {
			return // the agent went away, or the answer was lost (said)
		}
		if !isInputRequired(msg) {
			out, _ := b.legacyAnswer(fasthttp.StatusOK, msg)
			b.event(out)
			s.count.request(&b.m, classify.Classify(fasthttp.StatusOK, mimeJSON, out))
			return
		}
		if round >= maxInputRounds {
			b.event(appendError(nil, codeProxyError, b.mid, "the upstream asked for input "+strconv.Itoa(round)+
				" times; mcpheal gives up (at most "+strconv.Itoa(maxInputRounds)+" rounds)"))
			return
		}
		inputs, ok := b.askAgent(msg)
		if !ok {
			return
		}
		roundID = s.upcallID("round")
		state := gjson.GetBytes(msg, "result.requestState").Raw
		var err error
		if resp, err = b.send(roundID, inputs, state); err != nil {
			if !errors.Is(err, errCancelled) {
				b.event(appendError(nil, codeMaybeExecuted, b.mid, "upstream connection lost while the call was answered; "+
					b.m.method+" may or may not have run and was not retried"))
			}
			return
		}
	}
}

// relayRound passes a round's notifications to the agent and returns its
// answer (the message answering roundID). ok is false when the agent went
// away or the upstream ended the round without an answer (the agent was
// told).
func (b *bridgeRun) relayRound(resp *upstream.Response, roundID string) ([]byte, bool) {
	if !resp.IsStream() {
		return append([]byte(nil), resp.Body()...), true
	}
	fr := sse.Framer{Max: b.s.cfg.MaxSSELine}
	buf := make([]byte, 16<<10)
	var data []byte
	for {
		n, err := resp.Read(buf)
		fr.Feed(buf[:n])
		for {
			ev, ok, ferr := fr.Next()
			if ferr != nil {
				b.event(appendError(nil, codeTooLarge, b.mid, "an upstream event passed max_sse_line"))
				return nil, false
			}
			if !ok {
				break
			}
			data = sse.Data(data[:0], ev)
			if len(data) == 0 {
				continue
			}
			if answers(data, roundID) {
				return append([]byte(nil), data...), true
			}
			if !b.event(data) {
				return nil, false
			}
		}
		if err != nil {
			cancelled := false
			b.call.mu.Lock()
			cancelled = b.call.cancelled
			b.call.mu.Unlock()
			if !cancelled {
				b.event(appendError(nil, codeMaybeExecuted, b.mid, "upstream stream ended before its answer; "+
					b.m.method+" may or may not have run and was not retried"))
			}
			return nil, false
		}
	}
}

// event writes one message to the agent as an SSE event.
func (b *bridgeRun) event(msg []byte) bool {
	b.s.armWrite(b.conn)
	if _, err := b.w.WriteString("event: message\ndata: "); err != nil {
		return false
	}
	if _, err := b.w.Write(bytes.ReplaceAll(msg, []byte("\n"), []byte(" "))); err != nil {
		return false
	}
	if _, err := b.w.WriteString("\n\n"); err != nil {
		return false
	}
	b.s.count.bytesOut.Add(uint64(len(msg)))
	return b.w.Flush() == nil
}

// askAgent sends the agent the requests of an InputRequiredResult and
// returns its answers as inputResponses (raw JSON object).
func (b *bridgeRun) askAgent(msg []byte) ([]byte, bool) {
	s := b.s
	type ask struct {
		key string // raw JSON key
		id  string
		p   *pendingInput
	}
	var asks []ask
	defer func() {
		for _, a := range asks {
			s.bridge.inputs.Delete(a.id)
		}
	}()
	ok := true
	gjson.GetBytes(msg, "result.inputRequests").ForEach(func(k, v gjson.Result) bool {
		id := s.upcallID("input")
		p := &pendingInput{sess: b.sess, answer: make(chan []byte, 1)}
		s.bridge.inputs.Store(id, p)
		asks = append(asks, ask{key: k.Raw, id: id, p: p})
		req := append([]byte(`{"jsonrpc":"2.0","id":`), id...)
		req = append(req, `,"method":`...)
		req = append(req, v.Get("method").Raw...)
		params := v.Get("params")
		if params.IsObject() {
			req = append(req, `,"params":`...)
			req = append(req, legacyInputParams(v.Get("method").Str, params, id)...)
		}
		req = append(req, '}')
		ok = b.event(req)
		return ok
	})
	if !ok {
		return nil, false
	}
	out := []byte{'{'}
	deadline := time.NewTimer(b.s.cfg.ResponseTimeout)
	defer deadline.Stop()
	for i, a := range asks {
		var ans []byte
		select {
		case ans = <-a.p.answer:
		case <-deadline.C:
			b.event(appendError(nil, codeUpstreamDown, b.mid, "the agent did not answer the upstream's request for input in time"))
			return nil, false
		case <-s.done:
			return nil, false
		}
		r := gjson.ParseBytes(ans)
		res := r.Get("result")
		if !res.Exists() {
			// 2026-07-28 has no place for an error answer: an elicitation
			// is cancelled, anything else fails the call.
			method := gjson.GetBytes(msg, "result.inputRequests."+gjson.Escape(gjson.Parse(a.key).Str)+".method").Str
			if method != "elicitation/create" {
				b.event(appendError(nil, -32603, b.mid, "the agent answered the upstream's "+method+
					" request with an error, which MCP 2026-07-28 cannot carry: "+r.Get("error.message").Str))
				return nil, false
			}
			res = gjson.Parse(`{"action":"cancel"}`)
		}
		if i > 0 {
			out = append(out, ',')
		}
		out = append(out, a.key...)
		out = append(out, ':')
		out = append(out, res.Raw...)
	}
	return append(out, '}'), true
}

// legacyInputParams maps the params of a 2026-07-28 input request to the
// session-era request's: a URL elicitation needs an elicitationId there.
func legacyInputParams(method string, params gjson.Result, id string) []byte {
	if method == "elicitation/create" && params.Get("mode").Str == "url" && !params.Get("elicitationId").Exists() {
		raw := params.Raw
		i := strings.LastIndexByte(raw, '}')
		eid := strings.Trim(id, `"`)
		return []byte(raw[:i] + `,"elicitationId":` + strconv.Quote(eid) + raw[i:])
	}
	return []byte(params.Raw)
}

func contains(list []string, v string) bool {
	for _, x := range list {
		if x == v {
			return true
		}
	}
	return false
}
