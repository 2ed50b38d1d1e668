package telemetry

import (
	"compress/gzip"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// TestExporterConfig: the OTLP exporter variables, as the OpenTelemetry
// specification reads them, win over the config file's tracing keys.
func TestExporterConfig(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		cfg  Config
		env  map[string]string
		url  string
		hdr  map[string]string
		err  bool
	}{
		{"default", Config{}, nil, "http://localhost:4318/v1/traces", nil, false},
		{"base endpoint", Config{}, map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318/"}, "http://c:4318/v1/traces", nil, false},
		{"traces endpoint as is", Config{Endpoint: "http://file:4318"}, map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://c/otlp"}, "https://c/otlp", nil, false},
		{"file endpoint", Config{Endpoint: "http://file:4318"}, nil, "http://file:4318/v1/traces", nil, false},
		{"headers, decoded", Config{Headers: map[string]string{"x-file": "1"}}, map[string]string{"OTEL_EXPORTER_OTLP_HEADERS": "api-key=a%20b, x-two = 2"},
			"http://localhost:4318/v1/traces", map[string]string{"api-key": "a b", "x-two": "2"}, false},
		{"file headers", Config{Headers: map[string]string{"x-file": "1"}}, nil, "http://localhost:4318/v1/traces", map[string]string{"x-file": "1"}, false},
		{"not a URL", Config{}, map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "c:4318"}, "", nil, true},
		{"bad timeout", Config{}, map[string]string{"OTEL_EXPORTER_OTLP_TIMEOUT": "5s"}, "", nil, true},
		{"unknown compression", Config{}, map[string]string{"OTEL_EXPORTER_OTLP_COMPRESSION": "zstd"}, "", nil, true},
	}
	for _, c := range cases {
		e, err := exporterConfig(c.cfg, envOf(c.env))
		if (err != nil) != c.err {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if err != nil {
			continue
		}
		if e.url != c.url {
			t.Errorf("%s: url %q, want %q", c.name, e.url, c.url)
		}
		for k, v := range c.hdr {
			if e.headers[k] != v {
				t.Errorf("%s: header %s = %q, want %q (all: %v)", c.name, k, e.headers[k], v, e.headers)
			}
		}
	}
}

// collector is an OTLP/HTTP endpoint that decodes what it receives; its
// first refuse answers get 503 with Retry-After 0.
type collector struct {
	mu      sync.Mutex
	refuse  int
	posts   int
	got     []*tracepb.ResourceSpans
	headers []http.Header
}

func (c *collector) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.posts++
	if c.refuse > 0 {
		c.refuse--
		w.Header().Set("Retry-After", "0")
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	var body io.Reader = r.Body
	if r.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		body = zr
	}
	b, _ := io.ReadAll(body)
	var req coltracepb.ExportTraceServiceRequest
	if r.Header.Get("Content-Type") != "application/x-protobuf" || proto.Unmarshal(b, &req) != nil {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	c.got = append(c.got, req.ResourceSpans...)
	c.headers = append(c.headers, r.Header.Clone())
	w.WriteHeader(http.StatusOK)
}

// TestExporter: spans reach an OTLP/HTTP collector as the protobuf its
// service definition reads (decoded here with the collector's own message
// type), gzip-compressed when asked, with the configured headers, once
// more after a 503.
func TestExporter(t *testing.T) {
	t.Parallel()
	c := &collector{refuse: 1}
	srv := httptest.NewServer(c)
	t.Cleanup(srv.Close)
	e, err := exporterConfig(Config{}, envOf(map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": srv.URL + "/v1/traces",
		"OTEL_EXPORTER_OTLP_HEADERS": "api-key=k1", "OTEL_EXPORTER_OTLP_COMPRESSION": "gzip"}))
	if err != nil {
		t.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(e))
	tr := tp.Tracer("mcpheal-test", trace.WithInstrumentationVersion("1"))
	ctx, parent := tr.Start(context.Background(), "request", trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(attribute.String("mcp.method.name", "tools/call"), attribute.Int("n", 7),
			attribute.StringSlice("list", []string{"a", "b"}), attribute.Bool("ok", true), attribute.Float64("f", 1.5)))
	_, child := tr.Start(ctx, "exchange", trace.WithSpanKind(trace.SpanKindClient))
	child.AddEvent("retry", trace.WithAttributes(attribute.Int("try", 2)))
	child.SetStatus(codes.Error, "upstream down")
	child.End()
	parent.End()
	if err := tp.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.posts != 3 { // the first export refused once, then each span's
		t.Errorf("%d posts, want 3 (one refused, then two exports)", c.posts)
	}
	spans := map[string]*tracepb.Span{}
	for _, rs := range c.got {
		for _, ss := range rs.ScopeSpans {
			if ss.Scope.GetName() != "mcpheal-test" || ss.Scope.GetVersion() != "1" {
				t.Errorf("scope %v", ss.Scope)
			}
			for _, sp := range ss.Spans {
				spans[sp.Name] = sp
			}
		}
		if len(rs.GetResource().GetAttributes()) == 0 {
			t.Error("no resource attributes")
		}
	}
	req, ex := spans["request"], spans["exchange"]
	if req == nil || ex == nil {
		t.Fatalf("spans received: %v", spans)
	}
	if string(ex.ParentSpanId) != string(req.SpanId) || string(ex.TraceId) != string(req.TraceId) || len(req.TraceId) != 16 {
		t.Errorf("parentage: request %x/%x, exchange %x/%x parent %x", req.TraceId, req.SpanId, ex.TraceId, ex.SpanId, ex.ParentSpanId)
	}
	if req.Kind != tracepb.Span_SPAN_KIND_SERVER || ex.Kind != tracepb.Span_SPAN_KIND_CLIENT {
		t.Errorf("kinds %v %v", req.Kind, ex.Kind)
	}
	if ex.Status.GetCode() != tracepb.Status_STATUS_CODE_ERROR || ex.Status.GetMessage() != "upstream down" {
		t.Errorf("status %v", ex.Status)
	}
	if len(ex.Events) != 1 || ex.Events[0].Name != "retry" || ex.Events[0].Attributes[0].GetValue().GetIntValue() != 2 {
		t.Errorf("events %v", ex.Events)
	}
	attrs := map[string]string{}
	for _, kv := range req.Attributes {
		attrs[kv.Key] = kv.Value.String()
	}
	if len(attrs) != 5 || req.EndTimeUnixNano < req.StartTimeUnixNano || time.Since(time.Unix(0, int64(req.StartTimeUnixNano))) > time.Minute {
		t.Errorf("request span: attributes %v, times %d–%d", attrs, req.StartTimeUnixNano, req.EndTimeUnixNano)
	}
	for _, h := range c.headers {
		if h.Get("Api-Key") != "k1" {
			t.Errorf("headers %v", h)
		}
	}
}
