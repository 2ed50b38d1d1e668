package main

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/trace"
)

// TestTracedProxyExportsToSink: with mcpheal-traced's environment, the
// proxy subcommand's tracer provider (built from OTEL_* as the binary
// builds it) samples every span and exports it by OTLP/HTTP to the sink,
// which decodes and counts it by kind; stopping the provider flushes the
// last batch. Without those variables tracing stays off.
func TestTracedProxyExportsToSink(t *testing.T) {
	sink := new(otlpSink)
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/traces", sink.export)
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) { sink.reject(w) })
	srv := httptest.NewServer(mux) // 127.0.0.1
	defer srv.Close()

	for _, k := range []string{"OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"} {
		t.Setenv(k, "")
	}
	if tp, stop, err := startTracing(zerolog.Nop()); err != nil || tp != nil {
		t.Fatalf("startTracing without OTEL_* = %v, %v; want off", tp, err)
	} else {
		stop()
	}
	for _, kv := range tracingVars(srv.URL) {
		k, v, _ := bytes.Cut([]byte(kv), []byte("="))
		t.Setenv(string(k), string(v))
	}
	tp, stop, err := startTracing(zerolog.Nop())
	if err != nil || tp == nil {
		t.Fatalf("startTracing with mcpheal-traced's environment = %v, %v; want on", tp, err)
	}
	tr := tp.Tracer("test")
	// No parent, as for an agent that sends no trace context: always_on
	// samples it anyway (the default, parentbased_always_on, would too;
	// traceidratio would not).
	ctx, server := tr.Start(context.Background(), "tools/call echo", trace.WithSpanKind(trace.SpanKindServer))
	_, client := tr.Start(ctx, "tools/call echo", trace.WithSpanKind(trace.SpanKindClient))
	_, heal := tr.Start(ctx, "mcpheal heal")
	if !server.SpanContext().IsSampled() {
		t.Fatal("the request span is not sampled")
	}
	client.End()
	heal.End()
	server.End()
	stop()
	stop() // once only
	st := sink.stats()
	if st.Spans != 3 || st.Server != 1 || st.Client != 1 || st.Internal != 1 || st.Exports == 0 || st.Rejected != 0 {
		t.Fatalf("sink stats %+v; want 3 spans (1 server, 1 client, 1 internal), none rejected", st)
	}

	resp, err := http.Post(srv.URL+"/v1/traces", "application/x-protobuf", bytes.NewReader([]byte{0xff, 0xff}))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || sink.stats().Rejected != 1 {
		t.Fatalf("garbage export: status %d, rejected %d; want 400 and counted", resp.StatusCode, sink.stats().Rejected)
	}
}
