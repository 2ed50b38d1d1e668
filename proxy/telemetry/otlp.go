package telemetry

import (
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	resourcepb "go.opentelemetry.io/proto/otlp/resource/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// exporter sends spans by OTLP over HTTP, protobuf-encoded (the OTLP/HTTP
// spec), the one way mcpheal exports them. It is written here rather than
// taken from otlptracehttp, which links gRPC (through its configuration
// package) and with it html/template, whose reflection turns off the
// linker's removal of unused methods for the whole program: the binary
// was twice the size (docs/observability.md "Traces"; TestNoGRPC keeps it so).
//
// An export is one POST of an ExportTraceServiceRequest; a 429, 502, 503
// or 504 is tried once more after its Retry-After (1 s if none), within
// the export's timeout. A failed export drops its spans, as the batch
// processor would.
type exporter struct {
	url     string
	headers map[string]string
	gzip    bool
	timeout time.Duration
	client  *http.Client
}

// exporterConfig reads the exporter's settings: the environment's
// OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT, _HEADERS, _TIMEOUT and
// _COMPRESSION, else cfg's endpoint and headers.
func exporterConfig(cfg Config, lookup func(string) (string, bool)) (*exporter, error) {
	e := &exporter{headers: map[string]string{}, timeout: 10 * time.Second}
	switch {
	case env(lookup, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "":
		e.url = env(lookup, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
	case env(lookup, "OTEL_EXPORTER_OTLP_ENDPOINT") != "":
		e.url = strings.TrimSuffix(env(lookup, "OTEL_EXPORTER_OTLP_ENDPOINT"), "/") + "/v1/traces"
	case cfg.Endpoint != "":
		e.url = cfg.Endpoint
		if !strings.HasSuffix(e.url, "/v1/traces") {
			e.url = strings.TrimSuffix(e.url, "/") + "/v1/traces"
		}
	default:
		e.url = "http://localhost:4318/v1/traces"
	}
	if u, err := url.Parse(e.url); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("%w: OTLP endpoint %q: want an http(s) URL", ErrUnsupported, e.url)
	}
	h := firstEnv(lookup, "OTEL_EXPORTER_OTLP_TRACES_HEADERS", "OTEL_EXPORTER_OTLP_HEADERS")
	if h == "" {
		for k, v := range cfg.Headers {
			e.headers[k] = v
		}
	}
	for _, kv := range strings.Split(h, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			continue
		}
		k = strings.TrimSpace(k)
		if dv, err := url.QueryUnescape(strings.TrimSpace(v)); err == nil && k != "" {
			e.headers[k] = dv
		}
	}
	if t := firstEnv(lookup, "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT"); t != "" {
		ms, err := strconv.Atoi(t)
		if err != nil || ms <= 0 {
			return nil, fmt.Errorf("%w: OTLP timeout %q: want milliseconds", ErrUnsupported, t)
		}
		e.timeout = time.Duration(ms) * time.Millisecond
	}
	switch c := firstEnv(lookup, "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "OTEL_EXPORTER_OTLP_COMPRESSION"); c {
	case "", "none":
	case "gzip":
		e.gzip = true
	default:
		return nil, fmt.Errorf("%w: OTLP compression %q (gzip or none)", ErrUnsupported, c)
	}
	e.client = &http.Client{Timeout: e.timeout}
	return e, nil
}

func firstEnv(lookup func(string) (string, bool), keys ...string) string {
	for _, k := range keys {
		if v := env(lookup, k); v != "" {
			return v
		}
	}
	return ""
}

// ExportSpans implements sdktrace.SpanExporter.
func (e *exporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	if len(spans) == 0 {
		return nil
	}
	body := encodeRequest(spans)
	if e.gzip {
		var b bytes.Buffer
		zw := gzip.NewWriter(&b)
		_, _ = zw.Write(body)
		_ = zw.Close()
		body = b.Bytes()
	}
	ctx, cancel := context.WithTimeout(ctx, e.timeout)
	defer cancel()
	for try := 0; ; try++ {
		wait, err := e.post(ctx, body)
		if err == nil || wait < 0 || try == 1 {
			return err
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return err
		}
	}
}

// post sends one export; a retriable refusal returns how long to wait,
// any other failure a negative wait.
func (e *exporter) post(ctx context.Context, body []byte) (time.Duration, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.url, bytes.NewReader(body))
	if err != nil {
		return -1, err
	}
	req.Header.Set("Content-Type", "application/x-protobuf")
	req.Header.Set("User-Agent", "mcpheal")
	if e.gzip {
		req.Header.Set("Content-Encoding", "gzip")
	}
	for k, v := range e.headers {
		req.Header.Set(k, v)
	}
	resp, err := e.client.Do(req)
	if err != nil {
		return -1, fmt.Errorf("otlp export: %w", err)
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	switch {
	case resp.StatusCode/100 == 2:
		return 0, nil
	case resp.StatusCode == 429 || resp.StatusCode == 502 || resp.StatusCode == 503 || resp.StatusCode == 504:
		wait := time.Second
		if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s >= 0 {
			wait = min(time.Duration(s)*time.Second, e.timeout)
		}
		return wait, fmt.Errorf("otlp export: the collector answered %d", resp.StatusCode)
	}
	return -1, fmt.Errorf("otlp export: the collector answered %d", resp.StatusCode)
}

// Shutdown implements sdktrace.SpanExporter.
func (e *exporter) Shutdown(context.Context) error {
	e.client.CloseIdleConnections()
	return nil
}

// encodeRequest is an ExportTraceServiceRequest of spans, grouped by
// resource and instrumentation scope: field 1 (resource_spans), once per
// resource, encoded by hand so that the collector service's package (and
// its gRPC stubs) is not linked.
func encodeRequest(spans []sdktrace.ReadOnlySpan) []byte {
	type scopeKey struct {
		res   *resource.Resource
		scope instrumentation.Scope
	}
	var resOrder []*resource.Resource
	byRes := map[*resource.Resource]*tracepb.ResourceSpans{}
	byScope := map[scopeKey]*tracepb.ScopeSpans{}
	for _, s := range spans {
		res := s.Resource()
		rs := byRes[res]
		if rs == nil {
			rs = &tracepb.ResourceSpans{Resource: &resourcepb.Resource{Attributes: keyValues(res.Attributes())},
				SchemaUrl: res.SchemaURL()}
			byRes[res] = rs
			resOrder = append(resOrder, res)
		}
		k := scopeKey{res, s.InstrumentationScope()}
		ss := byScope[k]
		if ss == nil {
			sc := s.InstrumentationScope()
			ss = &tracepb.ScopeSpans{Scope: &commonpb.InstrumentationScope{Name: sc.Name, Version: sc.Version,
				Attributes: keyValues(sc.Attributes.ToSlice())}, SchemaUrl: sc.SchemaURL}
			byScope[k] = ss
			rs.ScopeSpans = append(rs.ScopeSpans, ss)
		}
		ss.Spans = append(ss.Spans, span(s))
	}
	var out []byte
	for _, res := range resOrder {
		b, err := proto.Marshal(byRes[res])
		if err != nil {
			continue
		}
		out = protowire.AppendTag(out, 1, protowire.BytesType)
		out = protowire.AppendBytes(out, b)
	}
	return out
}

func span(s sdktrace.ReadOnlySpan) *tracepb.Span {
	sc := s.SpanContext()
	tid, sid := sc.TraceID(), sc.SpanID()
	p := &tracepb.Span{
		TraceId: tid[:], SpanId: sid[:], TraceState: sc.TraceState().String(), Name: s.Name(),
		Kind:              tracepb.Span_SpanKind(s.SpanKind()), // the SDK numbers kinds as OTLP does
		StartTimeUnixNano: uint64(s.StartTime().UnixNano()), EndTimeUnixNano: uint64(s.EndTime().UnixNano()),
		Attributes: keyValues(s.Attributes()), DroppedAttributesCount: uint32(s.DroppedAttributes()),
		DroppedEventsCount: uint32(s.DroppedEvents()), DroppedLinksCount: uint32(s.DroppedLinks()),
		Flags: uint32(sc.TraceFlags()) | 0x100, // bit 8: whether the parent is remote is known
	}
	if ps := s.Parent(); ps.IsValid() {
		psid := ps.SpanID()
		p.ParentSpanId = psid[:]
		if ps.IsRemote() {
			p.Flags |= 0x200
		}
	}
	for _, ev := range s.Events() {
		p.Events = append(p.Events, &tracepb.Span_Event{TimeUnixNano: uint64(ev.Time.UnixNano()), Name: ev.Name,
			Attributes: keyValues(ev.Attributes), DroppedAttributesCount: uint32(ev.DroppedAttributeCount)})
	}
	for _, l := range s.Links() {
		ltid, lsid := l.SpanContext.TraceID(), l.SpanContext.SpanID()
		p.Links = append(p.Links, &tracepb.Span_Link{TraceId: ltid[:], SpanId: lsid[:], TraceState: l.SpanContext.TraceState().String(),
			Attributes: keyValues(l.Attributes), DroppedAttributesCount: uint32(l.DroppedAttributeCount)})
	}
	st := s.Status()
	switch st.Code {
	case codes.Error:
		p.Status = &tracepb.Status{Code: tracepb.Status_STATUS_CODE_ERROR, Message: st.Description}
	case codes.Ok:
		p.Status = &tracepb.Status{Code: tracepb.Status_STATUS_CODE_OK}
	}
	return p
}

func keyValues(kvs []attribute.KeyValue) []*commonpb.KeyValue {
	out := make([]*commonpb.KeyValue, 0, len(kvs))
	for _, kv := range kvs {
		out = append(out, &commonpb.KeyValue{Key: string(kv.Key), Value: anyValue(kv.Value)})
	}
	return out
}

func anyValue(v attribute.Value) *commonpb.AnyValue {
	switch v.Type() {
	case attribute.BOOL:
		return &commonpb.AnyValue{Value: &commonpb.AnyValue_BoolValue{BoolValue: v.AsBool()}}
	case attribute.INT64:
		return &commonpb.AnyValue{Value: &commonpb.AnyValue_IntValue{IntValue: v.AsInt64()}}
	case attribute.FLOAT64:
		return &commonpb.AnyValue{Value: &commonpb.AnyValue_DoubleValue{DoubleValue: v.AsFloat64()}}
	case attribute.BOOLSLICE:
		return array(v.AsBoolSlice(), func(b bool) *commonpb.AnyValue { return anyValue(attribute.BoolValue(b)) })
	case attribute.INT64SLICE:
		return array(v.AsInt64Slice(), func(n int64) *commonpb.AnyValue { return anyValue(attribute.Int64Value(n)) })
	case attribute.FLOAT64SLICE:
		return array(v.AsFloat64Slice(), func(f float64) *commonpb.AnyValue { return anyValue(attribute.Float64Value(f)) })
	case attribute.STRINGSLICE:
		return array(v.AsStringSlice(), func(s string) *commonpb.AnyValue { return anyValue(attribute.StringValue(s)) })
	}
	return &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: v.Emit()}}
}

// array is an OTLP array of vs, each converted by one.
func array[T any](vs []T, one func(T) *commonpb.AnyValue) *commonpb.AnyValue {
	out := make([]*commonpb.AnyValue, len(vs))
	for i, v := range vs {
		out[i] = one(v)
	}
	return &commonpb.AnyValue{Value: &commonpb.AnyValue_ArrayValue{ArrayValue: &commonpb.ArrayValue{Values: out}}}
}
