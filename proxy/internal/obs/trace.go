package obs

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
	"github.com/mcpheal/mcpheal/proxy/internal/conf"
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
type Tracing struct {
	Tracer   trace.Tracer
	Upstream attribute.KeyValue // mcpheal.upstream: the upstream's name
	server   []attribute.KeyValue
}

// Propagator reads and writes W3C trace context (traceparent, tracestate).
var Propagator = propagation.TraceContext{}

// NewTracing returns the tracing of an upstream, or nil when cfg has no
// tracer.
func NewTracing(cfg *conf.Config, host, port string) *Tracing {
	if cfg.Tracer == nil {
		return nil
	}
	p, _ := strconv.Atoi(port)
	return &Tracing{
		Tracer:   cfg.Tracer.Tracer("github.com/mcpheal/mcpheal/proxy"),
		Upstream: attribute.String("mcpheal.upstream", cfg.Name),
		server:   []attribute.KeyValue{attribute.String("server.address", host), attribute.Int("server.port", p)},
	}
}

// HeaderCarrier is an agent's or an upstream request's header as a
// propagation carrier.
type HeaderCarrier struct{ H *fasthttp.RequestHeader }

func (c HeaderCarrier) Get(k string) string { return string(c.H.Peek(k)) }
func (c HeaderCarrier) Set(k, v string)     { c.H.Set(k, v) }
func (c HeaderCarrier) Keys() []string {
	var keys []string
	for k := range c.H.All() {
		keys = append(keys, string(k))
	}
	return keys
}

// MetaCarrier is a request's params._meta as a propagation carrier, read
// only (MCP 2026-07-28 agents put traceparent and tracestate there).
type MetaCarrier struct{ Body []byte }

func (c MetaCarrier) Get(k string) string {
	return gjson.GetBytes(c.Body, "params._meta."+gjson.Escape(k)).Str
}
func (MetaCarrier) Set(string, string) {}
func (MetaCarrier) Keys() []string     { return []string{"traceparent", "tracestate"} }

// MaxSpanText bounds what a span copies of an agent's request (method,
// id, tool name): the agent chooses them, and a span lives until it is
// exported, a slow collector's queue included.
const MaxSpanText = 128

// SpanText is a copy of s of at most maxSpanText bytes, cut at a rune
// boundary and marked with "…" when cut.
func SpanText(s string) string {
	if len(s) <= MaxSpanText {
		return strings.Clone(s)
	}
	cut := MaxSpanText
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…" // a new string: the agent's body is not kept
}

// Exchange begins the span of one upstream exchange of a request (a child
// of ctx) and writes its trace context into the upstream request's
// headers. It returns nil when tracing is off or ctx has no span.
func (tr *Tracing) Exchange(ctx context.Context, req *fasthttp.Request, name string, attrs ...attribute.KeyValue) trace.Span {
	if tr == nil || ctx == nil {
		return nil
	}
	attrs = append(attrs, tr.server...)
	attrs = append(attrs, tr.Upstream, attribute.String("http.request.method", string(req.Header.Method())))
	ctx, sp := tr.Tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
	Propagator.Inject(ctx, HeaderCarrier{&req.Header})
	return sp
}

// EndExchange ends an exchange's span with what came back.
func EndExchange(sp trace.Span, status int, cls classify.Class, err error) {
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

// Child begins an internal span under ctx (a heal, a journal replay, a
// wait): ctx is returned as it is when tracing is off.
func (tr *Tracing) Child(ctx context.Context, name string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	if tr == nil {
		return ctx, nil
	}
	attrs = append(attrs, tr.Upstream)
	return tr.Tracer.Start(ctx, name, trace.WithAttributes(attrs...))
}

// TraceID returns the trace id of ctx's span, for a log line that an
// operator can find in the traces; "" for none.
func TraceID(ctx context.Context) string {
	if ctx == nil {
		return ""
	}
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		return sc.TraceID().String()
	}
	return ""
}
