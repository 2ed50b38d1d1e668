package link

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/trace"

	"github.com/mcpheal/mcpheal/classify"
	"github.com/mcpheal/mcpheal/proxy/internal/conf"
	"github.com/mcpheal/mcpheal/proxy/internal/obs"
	"github.com/mcpheal/mcpheal/proxy/internal/wire"
	"github.com/mcpheal/mcpheal/session"
	"github.com/mcpheal/mcpheal/upstream"
)

// Upcall is one request mcpheal makes on an agent's behalf: the initialize
// and notifications/initialized of a heal, the journal replay, the
// tools/list after a heal, a keepalive ping, an upstream GET stream, a
// DELETE, the bridge's 2026-07-28 requests. All of them are built by
// [link.build] and, when their answer is read whole, sent by [link.call].
type Upcall struct {
	// hdr holds the agent's headers that identify it upstream (the
	// session's recipe headers, or those of the request being healed); nil
	// for none. Hop-by-hop headers and the ones each request sets itself are
	// dropped from it.
	Hdr *fasthttp.RequestHeader
	// method is the HTTP method; zero means POST.
	Method string
	// session is the upstream session id to send; zero sends none.
	Session session.UpstreamID
	// version is the MCP-Protocol-Version to send; zero sends none.
	Version string
	// body is the JSON-RPC message of a POST.
	Body []byte
	// lastEventID resumes an upstream stream (GET only).
	LastEventID string
	// mcpMethod and mcpName are the Mcp-Method and Mcp-Name headers of a
	// 2026-07-28 request; zero sends none.
	McpMethod, McpName string
	Deadline           time.Time
	// checked sends on a connection whose peer is known to be there (one
	// that idled is peeked first: upstream.Client.DoOnce), for a second
	// try after a failure on a pooled connection.
	Checked bool
	// ctx carries the span of the work this request is part of (a heal,
	// a journal replay): its trace context goes upstream. Nil: none.
	Ctx context.Context
	// name names its span: the JSON-RPC method it sends.
	Name string
}

// Build fills req for c.
func (l *Link) Build(req *fasthttp.Request, c *Upcall) {
	if c.Hdr != nil {
		c.Hdr.CopyTo(&req.Header)
	}
	h := &req.Header
	h.ResetConnectionClose()
	// The agent's fields may have changed since they were parsed (a
	// request's session id was set on them): their own list is read.
	if l.OwnsAuthorization() {
		wire.StripListed(h, upcallDropWithAuth)
	} else {
		wire.StripListed(h, upcallDrops)
	}
	h.Del("Content-Type") // these two fasthttp keeps apart: no list to reorder
	h.Del("Content-Length")
	l.SetOperatorHeaders(h)
	switch c.Method {
	case "", fasthttp.MethodPost:
		h.SetMethod(fasthttp.MethodPost)
		h.SetContentTypeBytes(wire.MimeJSON)
		h.Set("Accept", "application/json, text/event-stream")
		req.SetBodyRaw(c.Body)
	case fasthttp.MethodGet:
		h.SetMethod(fasthttp.MethodGet)
		h.Set("Accept", "text/event-stream")
		if c.LastEventID != "" {
			h.SetBytesK(wire.HdrLastEventID, c.LastEventID)
		}
	default:
		h.SetMethod(c.Method)
	}
	if c.Session != "" {
		h.SetBytesK(wire.HdrSessionID, string(c.Session))
	}
	if c.Version != "" {
		h.SetBytesK(wire.HdrProtocolVersion, c.Version)
	}
	if c.McpMethod != "" {
		h.Set("Mcp-Method", c.McpMethod)
	}
	if c.McpName != "" {
		h.Set("Mcp-Name", wire.McpNameValue(c.McpName))
	}
}

// ownHeaders are the headers each upcall sets itself, never taken from the
// agent's (with Content-Type and Content-Length, which fasthttp keeps apart
// and build sets or computes).
var ownHeaders = []string{"Mcp-Session-Id", "Mcp-Protocol-Version", "Last-Event-Id", "Accept", "Mcp-Method", "Mcp-Name"}

// upcallDrops are the agent's fields an upcall never sends: the hop-by-hop
// ones and those it sets itself.
var (
	upcallDrops        = wire.NewNameSet(append(append([]string(nil), wire.ReqDropHeaders.Names...), ownHeaders...)...)
	upcallDropWithAuth = wire.NewNameSet(append(append([]string(nil), wire.ReqDropWithAuth.Names...), ownHeaders...)...)
)

// Reply is the answer to an upcall, read whole.
type Reply struct {
	Status int
	Class  classify.Class
	// msg is the JSON-RPC message: a JSON body, or the data of the SSE
	// event that answered. Owned by the reply.
	Msg []byte
	// session is the upstream's Mcp-Session-Id header, if any.
	Session session.UpstreamID
	// sessionErr: the upstream's Mcp-Session-Id passed maxUpstreamID
	// (the session was DELETEd; session is empty).
	SessionErr error
	// challenge is the upstream's WWW-Authenticate, if any.
	Challenge string
	// wait is a Busy answer's Retry-After (retryAfter).
	Wait time.Duration
}

// Call sends c and reads and classifies its answer. An error means no
// answer came: its class is TransportDead or Timeout.
func (l *Link) Call(c *Upcall) (Reply, error) {
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	resp := upstream.AcquireResponse()
	defer upstream.ReleaseResponse(resp)
	l.Build(req, c)
	var sp trace.Span // tracing off: no span, and nothing built for one
	if l.Trace != nil {
		sp = l.Trace.Exchange(c.Ctx, req, conf.OrStr(c.Name, c.Method))
	}
	send := l.Do
	if c.Checked {
		send = l.DoOnce
	}
	if err := send(req, resp, c.Deadline); err != nil {
		if sp != nil {
			obs.EndExchange(sp, 0, FailClass(err), err)
		}
		return Reply{Class: FailClass(err)}, err
	}
	rep := Reply{Status: resp.StatusCode()}
	if sp != nil {
		defer func() { obs.EndExchange(sp, rep.Status, rep.Class, nil) }()
	}
	rep.Session, rep.SessionErr = l.SessionOf(&resp.Header, req.Header.PeekBytes(wire.HdrAuthorization))
	rep.Challenge = string(resp.Header.Peek("WWW-Authenticate"))
	stream := resp.IsStream()
	var er wire.EventRewriter
	_, msg, err := wire.ReadAnswer(resp, &er, l.Cfg.MaxAnswer)
	if err != nil {
		rep.Class = classify.TransportDead
		return rep, err
	}
	ct := resp.Header.ContentType()
	if stream {
		ct = wire.MimeJSON // msg is the answering event's data
	}
	rep.Class = classify.Classify(rep.Status, ct, msg)
	if rep.Status == fasthttp.StatusServiceUnavailable && len(resp.Header.Peek("Retry-After")) > 0 {
		rep.Class = classify.Busy // it says when to come back (attempt.judge)
	}
	if rep.Class == classify.Busy {
		rep.Wait = RetryAfter(&resp.Header, time.Now())
	}
	l.count.Class(rep.Class)
	rep.Msg = append([]byte(nil), msg...)
	return rep, nil
}

// FailClass is the class of an exchange that got no answer.
func FailClass(err error) classify.Class {
	var ce *CredentialError
	if errors.As(err, &ce) {
		return classify.Protocol // nothing was sent: the upstream is not at fault
	}
	if upstream.IsTimeout(err) {
		return classify.Timeout
	}
	return classify.TransportDead
}

// Describe says what a reply was, for an error.
func (r *Reply) Describe() string {
	return "answered " + strconv.Itoa(r.Status) + " " + r.Class.String()
}
