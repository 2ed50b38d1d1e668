package proxy

import (
	"context"
	"strconv"
	"sync"

	"github.com/mcpheal/mcpheal/classify"
	"github.com/mcpheal/mcpheal/session"
	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// requestPool holds the guard's requests: one per agent request, which the
// attempt points to, so that none is allocated on the hot path. Nothing
// may hold a request once its handler has returned (an answer body that
// outlives it lets go of it: attempt.run).
var requestPool = sync.Pool{New: func() any { return new(request) }}

func putRequest(r *request) {
	*r = request{}
	requestPool.Put(r)
}

// start begins the span of a guarded agent request, under the agent's
// trace context, and puts it in r.
func (tr *tracing) start(r *request) {
	parent := propagator.Extract(context.Background(), headerCarrier{r.hdr})
	if !trace.SpanContextFromContext(parent).IsValid() && len(r.body) > 0 {
		parent = propagator.Extract(context.Background(), metaCarrier{r.body})
	}
	// The message's members are views into the agent's body, which
	// fasthttp reuses once the handler returns; a span keeps its strings
	// until it is exported: they are copied.
	m := message{method: spanText(r.msg.method), id: spanText(r.msg.id), tool: spanText(r.msg.tool), get: r.msg.get}
	name, method := m.method, m.method
	switch {
	case m.get:
		name, method = "GET stream", "GET"
	case r.del:
		name, method = "DELETE session", "DELETE"
	case m.method == "" && m.id != "":
		name = "response"
	case m.tool != "":
		name += " " + m.tool
	}
	attrs := []attribute.KeyValue{tr.upstream, attribute.String("mcp.method.name", method),
		attribute.String("network.protocol.name", "http")}
	if m.id != "" {
		attrs = append(attrs, attribute.String("jsonrpc.request.id", m.id))
	}
	if m.tool != "" {
		attrs = append(attrs, attribute.String("gen_ai.tool.name", m.tool), attribute.String("gen_ai.operation.name", "execute_tool"))
	}
	if r.sess != nil {
		attrs = append(attrs, attribute.String("mcp.session.id", r.sess.ID.Short()),
			attribute.String("mcp.protocol.version", r.sess.Recipe.ProtocolVersion))
	}
	r.tctx, r.span = tr.tracer.Start(parent, name, trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(attrs...))
}

// end ends a request's span with its outcome: the class of the answer the
// agent got, an error status for mcpheal's own errors.
func (r *request) endSpan() {
	if r.span != nil {
		r.span.End()
		r.span = nil
	}
}

// outcome records on the request's span what the agent got.
func (r *request) outcome(kind outcomeKind, cls classify.Class, code int) {
	if r == nil || r.span == nil {
		return
	}
	r.span.SetAttributes(attribute.String("mcpheal.class", cls.String()))
	if kind != outUpstream && kind != outAccepted && kind != outEndResumption {
		r.span.SetAttributes(attribute.Int("rpc.jsonrpc.error_code", code))
		r.span.SetStatus(codes.Error, "mcpheal answered "+strconv.Itoa(code))
	}
}

// request is one agent request as the guard let it through: what every
// later stage reads instead of going back to the RequestCtx, which only
// the answer writes. Its slices are views into the agent's request, valid
// until the handler returns.
type request struct {
	msg  message
	body []byte
	hdr  *fasthttp.RequestHeader
	auth []byte // the agent's Authorization
	// stateless: MCP 2026-07-28 traffic, which has no sessions (a
	// server/discover, or the 2026-07-28 protocol version header).
	stateless bool
	// onHeldRoute: a 2026-07-28 request that goes on a session mcpheal
	// holds for its agent (held.go); sess is that session, nil until
	// created.
	onHeldRoute bool
	del         bool             // a DELETE
	sess        *session.Session // nil: no session (initialize, 2026-07-28 traffic)
	standing    standing         // of the credential to sess
	// ownCredential: the credential is the one sess's headers hold for
	// its own work (keepalive, heals on its behalf).
	ownCredential bool
	// heldID is the id of the held session a held initialize opens, and
	// heldGen the last generation the fleet's store knew of it (held.go).
	heldID  session.ClientID
	heldGen uint64
	// tctx carries span, the request's span (trace.go); both nil when
	// tracing is off.
	tctx context.Context
	span trace.Span
	// journal is the change the request makes to its session's journal
	// once the upstream accepts it, and reserved the memory the guard
	// took for it (given back unless the change is recorded).
	journal  session.JournalChange
	reserved int64
}
