package proxy

import (
	"context"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/mcpheal/mcpheal/classify"
)

// Traces (docs/observability.md "Traces"). With Config.Tracer set, every agent request is
// a span, continuing the agent's W3C trace context (its traceparent and
// tracestate headers, or the request's params._meta, where MCP 2026-07-28
// agents put them), with a child span for each upstream exchange, for a
// heal (its reason, generation and outcome; the initialize and the journal
// replay under it) and for a wait out of an outage. Every request mcpheal
// sends for the agent's, a heal's initialize and the replay included,
// carries the trace context upstream. Attributes follow the OpenTelemetry
// semantic conventions for MCP and HTTP; a session is named by a short
// hash of its id, never a token or the upstream's id.
//
// Off (a nil *tracing), each stage pays one nil check: no context, no
// span, no allocation.
type tracing struct {
	tracer   trace.Tracer
	upstream attribute.KeyValue // mcpheal.upstream: the upstream's name
	server   []attribute.KeyValue
}

// propagator reads and writes W3C trace context (traceparent, tracestate).
var propagator = propagation.TraceContext{}

// newTracing returns the tracing of an upstream, or nil when cfg has no
// tracer.
func newTracing(cfg *Config, host, port string) *tracing {
	if cfg.Tracer == nil {
		return nil
	}
	p, _ := strconv.Atoi(port)
	return &tracing{
		tracer:   cfg.Tracer.Tracer("github.com/mcpheal/mcpheal/proxy"),
		upstream: attribute.String("mcpheal.upstream", cfg.Name),
		server:   []attribute.KeyValue{attribute.String("server.address", host), attribute.Int("server.port", p)},
	}
}

// headerCarrier is an agent's or an upstream request's header as a
// propagation carrier.
type headerCarrier struct{ h *fasthttp.RequestHeader }

func (c headerCarrier) Get(k string) string { return string(c.h.Peek(k)) }
func (c headerCarrier) Set(k, v string)     { c.h.Set(k, v) }
func (c headerCarrier) Keys() []string {
	var keys []string
	for k := range c.h.All() {
		keys = append(keys, string(k))
	}
	return keys
}

// metaCarrier is a request's params._meta as a propagation carrier, read
// only (MCP 2026-07-28 agents put traceparent and tracestate there).
type metaCarrier struct{ body []byte }

func (c metaCarrier) Get(k string) string {
	return gjson.GetBytes(c.body, "params._meta."+gjson.Escape(k)).Str
}
func (metaCarrier) Set(string, string) {}
func (metaCarrier) Keys() []string     { return []string{"traceparent", "tracestate"} }

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

// maxSpanText bounds what a span copies of an agent's request (method,
// id, tool name): the agent chooses them, and a span lives until it is
// exported, a slow collector's queue included.
const maxSpanText = 128

// spanText is a copy of s of at most maxSpanText bytes, cut at a rune
// boundary and marked with "…" when cut.
func spanText(s string) string {
	if len(s) <= maxSpanText {
		return strings.Clone(s)
	}
	cut := maxSpanText
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…" // a new string: the agent's body is not kept
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

// exchange begins the span of one upstream exchange of a request (a child
// of ctx) and writes its trace context into the upstream request's
// headers. It returns nil when tracing is off or ctx has no span.
func (tr *tracing) exchange(ctx context.Context, req *fasthttp.Request, name string, attrs ...attribute.KeyValue) trace.Span {
	if tr == nil || ctx == nil {
		return nil
	}
	attrs = append(attrs, tr.server...)
	attrs = append(attrs, tr.upstream, attribute.String("http.request.method", string(req.Header.Method())))
	ctx, sp := tr.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
	propagator.Inject(ctx, headerCarrier{&req.Header})
	return sp
}

// endExchange ends an exchange's span with what came back.
func endExchange(sp trace.Span, status int, cls classify.Class, err error) {
	if sp == nil {
		return
	}
	if status > 0 {
		sp.SetAttributes(attribute.Int("http.response.status_code", status))
	}
	sp.SetAttributes(attribute.String("mcpheal.class", cls.String()))
	if err != nil {
		sp.RecordError(err)
		sp.SetStatus(codes.Error, err.Error())
	}
	sp.End()
}

// child begins an internal span under ctx (a heal, a journal replay, a
// wait): ctx is returned as it is when tracing is off.
func (tr *tracing) child(ctx context.Context, name string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	if tr == nil {
		return ctx, nil
	}
	attrs = append(attrs, tr.upstream)
	return tr.tracer.Start(ctx, name, trace.WithAttributes(attrs...))
}

// traceID returns the trace id of ctx's span, for a log line that an
// operator can find in the traces; "" for none.
func traceID(ctx context.Context) string {
	if ctx == nil {
		return ""
	}
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		return sc.TraceID().String()
	}
	return ""
}
