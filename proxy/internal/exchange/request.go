package exchange

import (
	"context"
	"strconv"
	"sync"

	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/mcpheal/mcpheal/classify"
	"github.com/mcpheal/mcpheal/proxy/internal/heal"
	"github.com/mcpheal/mcpheal/proxy/internal/obs"
	"github.com/mcpheal/mcpheal/proxy/internal/wire"
	"github.com/mcpheal/mcpheal/session"
)

// RequestPool holds the guard's requests: one per agent request, which the
// attempt points to, so that none is allocated on the hot path. Nothing
// may hold a request once its handler has returned (an answer body that
// outlives it lets go of it: attempt.run).
var RequestPool = sync.Pool{New: func() any { return new(Request) }}

func PutRequest(r *Request) {
	*r = Request{}
	RequestPool.Put(r)
}

// StartSpan begins the span of a guarded agent request, under the agent's
// trace context, and puts it in r.
func StartSpan(tr *obs.Tracing, r *Request) {
	parent := obs.Propagator.Extract(context.Background(), obs.HeaderCarrier{H: r.Hdr})
	if !trace.SpanContextFromContext(parent).IsValid() && len(r.Body) > 0 {
		parent = obs.Propagator.Extract(context.Background(), obs.MetaCarrier{Body: r.Body})
	}
	// The message's members are views into the agent's body, which
	// fasthttp reuses once the handler returns; a span keeps its strings
	// until it is exported: they are copied.
	m := wire.Message{Method: obs.SpanText(r.Msg.Method), ID: obs.SpanText(r.Msg.ID), Tool: obs.SpanText(r.Msg.Tool), Get: r.Msg.Get}
	name, method := m.Method, m.Method
	switch {
	case m.Get:
		name, method = "GET stream", "GET"
	case r.Del:
		name, method = "DELETE session", "DELETE"
	case m.Method == "" && m.ID != "":
		name = "response"
	case m.Tool != "":
		name += " " + m.Tool
	}
	attrs := []attribute.KeyValue{tr.Upstream, attribute.String("mcp.method.name", method),
		attribute.String("network.protocol.name", "http")}
	if m.ID != "" {
		attrs = append(attrs, attribute.String("jsonrpc.request.id", m.ID))
	}
	if m.Tool != "" {
		attrs = append(attrs, attribute.String("gen_ai.tool.name", m.Tool), attribute.String("gen_ai.operation.name", "execute_tool"))
	}
	if r.Sess != nil {
		attrs = append(attrs, attribute.String("mcp.session.id", r.Sess.ID.Short()),
			attribute.String("mcp.protocol.version", r.Sess.Recipe.ProtocolVersion))
	}
	r.Tctx, r.span = tr.Tracer.Start(parent, name, trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(attrs...))
}

// end ends a request's span with its outcome: the class of the answer the
// agent got, an error status for mcpheal's own errors.
func (r *Request) EndSpan() {
	if r.span != nil {
		r.span.End()
		r.span = nil
	}
}

// Outcome records on the request's span what the agent got.
func (r *Request) Outcome(kind outcomeKind, cls classify.Class, code int) {
	if r == nil || r.span == nil {
		return
	}
	r.span.SetAttributes(attribute.String("mcpheal.class", cls.String()))
	if kind != OutUpstream && kind != outAccepted && kind != outEndResumption {
		r.span.SetAttributes(attribute.Int("rpc.jsonrpc.error_code", code))
		r.span.SetStatus(codes.Error, "mcpheal answered "+strconv.Itoa(code))
	}
}

// Request is one agent request as the guard let it through: what every
// later stage reads instead of going back to the RequestCtx, which only
// the answer writes. Its slices are views into the agent's request, valid
// until the handler returns.
type Request struct {
	Msg  wire.Message
	Body []byte
	Hdr  *fasthttp.RequestHeader
	Auth []byte // the agent's Authorization
	// stateless: MCP 2026-07-28 traffic, which has no sessions (a
	// server/discover, or the 2026-07-28 protocol version header).
	Stateless bool
	Del       bool             // a DELETE
	Sess      *session.Session // nil: no session (initialize, 2026-07-28 traffic)
	Standing  heal.Standing    // of the credential to sess
	// ownCredential: the credential is the one sess's headers hold for
	// its own work (keepalive, heals on its behalf).
	OwnCredential bool
	// heldID is the id of the held session a held initialize opens, and
	// heldGen the last generation the fleet's store knew of it (held.go).
	HeldID  session.ClientID
	HeldGen uint64
	// tctx carries span, the request's span (trace.go); both nil when
	// tracing is off.
	Tctx context.Context
	span trace.Span
	// journal is the change the request makes to its session's journal
	// once the upstream accepts it, and reserved the memory the guard
	// took for it (given back unless the change is recorded).
	Journal  session.JournalChange
	Reserved int64
}
