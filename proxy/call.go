package proxy

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/mcpheal/mcpheal/classify"
	"github.com/mcpheal/mcpheal/session"
	"github.com/mcpheal/mcpheal/upstream"
)

// upcall is one request mcpheal makes on an agent's behalf: the initialize
// and notifications/initialized of a heal, the journal replay, the
// tools/list after a heal, a keepalive ping, an upstream GET stream, a
// DELETE, the bridge's 2026-07-28 requests. All of them are built by
// [link.build] and, when their answer is read whole, sent by [link.call].
type upcall struct {
	// hdr holds the agent's headers that identify it upstream (the
	// session's recipe headers, or those of the request being healed); nil
	// for none. Hop-by-hop headers and the ones each request sets itself are
	// dropped from it.
	hdr *fasthttp.RequestHeader
	// method is the HTTP method; zero means POST.
	method string
	// session is the upstream session id to send; zero sends none.
	session session.UpstreamID
	// version is the MCP-Protocol-Version to send; zero sends none.
	version string
	// body is the JSON-RPC message of a POST.
	body []byte
	// lastEventID resumes an upstream stream (GET only).
	lastEventID string
	// mcpMethod and mcpName are the Mcp-Method and Mcp-Name headers of a
	// 2026-07-28 request; zero sends none.
	mcpMethod, mcpName string
	deadline           time.Time
	// checked sends on a connection whose peer is known to be there (one
	// that idled is peeked first: upstream.Client.DoOnce), for a second
	// try after a failure on a pooled connection.
	checked bool
	// ctx carries the span of the work this request is part of (a heal,
	// a journal replay): its trace context goes upstream. Nil: none.
	ctx context.Context
	// name names its span: the JSON-RPC method it sends.
	name string
}

// build fills req for c.
func (l *link) build(req *fasthttp.Request, c *upcall) {
	if c.hdr != nil {
		c.hdr.CopyTo(&req.Header)
	}
	h := &req.Header
	h.ResetConnectionClose()
	// The agent's fields may have changed since they were parsed (a
	// request's session id was set on them): their own list is read.
	if l.ownsAuthorization() {
		stripListed(h, upcallDropWithAuth)
	} else {
		stripListed(h, upcallDrops)
	}
	h.Del("Content-Type") // these two fasthttp keeps apart: no list to reorder
	h.Del("Content-Length")
	l.setOperatorHeaders(h)
	switch c.method {
	case "", fasthttp.MethodPost:
		h.SetMethod(fasthttp.MethodPost)
		h.SetContentTypeBytes(mimeJSON)
		h.Set("Accept", "application/json, text/event-stream")
		req.SetBodyRaw(c.body)
	case fasthttp.MethodGet:
		h.SetMethod(fasthttp.MethodGet)
		h.Set("Accept", "text/event-stream")
		if c.lastEventID != "" {
			h.SetBytesK(hdrLastEventID, c.lastEventID)
		}
	default:
		h.SetMethod(c.method)
	}
	if c.session != "" {
		h.SetBytesK(hdrSessionID, string(c.session))
	}
	if c.version != "" {
		h.SetBytesK(hdrProtocolVersion, c.version)
	}
	if c.mcpMethod != "" {
		h.Set("Mcp-Method", c.mcpMethod)
	}
	if c.mcpName != "" {
		h.Set("Mcp-Name", mcpNameValue(c.mcpName))
	}
}

// ownHeaders are the headers each upcall sets itself, never taken from the
// agent's (with Content-Type and Content-Length, which fasthttp keeps apart
// and build sets or computes).
var ownHeaders = []string{"Mcp-Session-Id", "Mcp-Protocol-Version", "Last-Event-Id", "Accept", "Mcp-Method", "Mcp-Name"}

// upcallDrops are the agent's fields an upcall never sends: the hop-by-hop
// ones and those it sets itself.
var (
	upcallDrops        = newNameSet(append(append([]string(nil), reqDropHeaders.names...), ownHeaders...)...)
	upcallDropWithAuth = newNameSet(append(append([]string(nil), reqDropWithAuth.names...), ownHeaders...)...)
)

// reply is the answer to an upcall, read whole.
type reply struct {
	status int
	class  classify.Class
	// msg is the JSON-RPC message: a JSON body, or the data of the SSE
	// event that answered. Owned by the reply.
	msg []byte
	// session is the upstream's Mcp-Session-Id header, if any.
	session session.UpstreamID
	// sessionErr: the upstream's Mcp-Session-Id passed maxUpstreamID
	// (the session was DELETEd; session is empty).
	sessionErr error
	// challenge is the upstream's WWW-Authenticate, if any.
	challenge string
	// wait is a Busy answer's Retry-After (retryAfter).
	wait time.Duration
}

// call sends c and reads and classifies its answer. An error means no
// answer came: its class is TransportDead or Timeout.
func (l *link) call(c *upcall) (reply, error) {
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	resp := upstream.AcquireResponse()
	defer upstream.ReleaseResponse(resp)
	l.build(req, c)
	sp := l.trace.exchange(c.ctx, req, orStr(c.name, c.method))
	send := l.do
	if c.checked {
		send = l.doOnce
	}
	if err := send(req, resp, c.deadline); err != nil {
		endExchange(sp, 0, failClass(err), err)
		return reply{class: failClass(err)}, err
	}
	rep := reply{status: resp.StatusCode()}
	defer func() { endExchange(sp, rep.status, rep.class, nil) }()
	rep.session, rep.sessionErr = l.sessionOf(&resp.Header, req.Header.PeekBytes(hdrAuthorization))
	rep.challenge = string(resp.Header.Peek("WWW-Authenticate"))
	stream := resp.IsStream()
	var er eventRewriter
	_, msg, err := readAnswer(resp, &er, l.cfg.MaxAnswer)
	if err != nil {
		rep.class = classify.TransportDead
		return rep, err
	}
	ct := resp.Header.ContentType()
	if stream {
		ct = mimeJSON // msg is the answering event's data
	}
	rep.class = classify.Classify(rep.status, ct, msg)
	if rep.status == fasthttp.StatusServiceUnavailable && len(resp.Header.Peek("Retry-After")) > 0 {
		rep.class = classify.Busy // it says when to come back (attempt.judge)
	}
	if rep.class == classify.Busy {
		rep.wait = retryAfter(&resp.Header, time.Now())
	}
	l.count.class(rep.class)
	rep.msg = append([]byte(nil), msg...)
	return rep, nil
}

// failClass is the class of an exchange that got no answer.
func failClass(err error) classify.Class {
	var ce *credentialError
	if errors.As(err, &ce) {
		return classify.Protocol // nothing was sent: the upstream is not at fault
	}
	if upstream.IsTimeout(err) {
		return classify.Timeout
	}
	return classify.TransportDead
}

// isEventStreamCT reports whether a Content-Type is text/event-stream.
func isEventStreamCT(ct []byte) bool { return hasMediaType(ct, mimeEventStream) }

// describe says what a reply was, for an error.
func (r *reply) describe() string {
	return "answered " + strconv.Itoa(r.status) + " " + r.class.String()
}
