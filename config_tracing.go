package main

// Traces (docs/observability.md "Traces"): the config file's tracing section, for the same
// settings as the standard OTEL_* environment variables, which win where
// both are set. Tracing is off unless one of them turns it on; a change
// applies at restart only.

import (
	"context"
	"os"
	"runtime/debug"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"
	"go.yaml.in/yaml/v3"

	"github.com/mcpheal/mcpheal/proxy"
	"github.com/mcpheal/mcpheal/proxy/telemetry"
)

var tracingKeys = []string{"endpoint", "headers", "service_name", "sampler", "sampler_arg"}

// tracing reads the tracing mapping.
func (p *parser) tracing(v *yaml.Node, f *fileConfig) {
	p.mapping(v, "tracing.", tracingKeys, func(k string, _, tv *yaml.Node) {
		key := "tracing." + k
		switch k {
		case "endpoint":
			f.Tracing.Endpoint = p.expand(tv, key, p.str(tv, key))
		case "headers":
			f.Tracing.Headers = p.headers(tv, key)
		case "service_name":
			f.Tracing.ServiceName = p.str(tv, key)
		case "sampler":
			f.Tracing.Sampler = p.str(tv, key)
			switch f.Tracing.Sampler {
			case "always_on", "always_off", "traceidratio", "parentbased_always_on", "parentbased_always_off",
				"parentbased_traceidratio":
			default:
				p.errorf(tv, key, "want always_on, always_off, traceidratio, parentbased_always_on, parentbased_always_off "+
					"or parentbased_traceidratio, got %q", f.Tracing.Sampler)
			}
		case "sampler_arg":
			f.Tracing.SamplerArg = p.str(tv, key)
		}
	})
}

// startTracing builds the tracer provider of the file's tracing section
// and the environment, and gives it to every upstream. It returns the
// function that flushes the spans at exit; nil when tracing is off.
func startTracing(ctx context.Context, rc *resolved, log zerolog.Logger) (func(), error) {
	tp, shutdown, err := telemetry.New(ctx, rc.tracing, mcphealVersion(), os.LookupEnv)
	if err != nil || tp == nil {
		return func() {}, err
	}
	setTracer(rc.ups, tp)
	rc.tracer = tp
	otel.SetErrorHandler(exportErrors(log))
	log.Info().Msg("traces: exporting spans by OTLP over HTTP (docs/observability.md \"Traces\")")
	return func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := shutdown(sctx); err != nil {
			log.Warn().Err(err).Msg("traces: the last spans were not exported")
		}
	}, nil
}

// exportErrors logs the OpenTelemetry SDK's errors (a collector that does
// not answer, a refused export) as mcpheal's own log lines, one a second
// at most: the SDK's default handler prints plain text, which breaks a
// JSON log.
func exportErrors(log zerolog.Logger) otel.ErrorHandlerFunc {
	var last atomic.Int64
	return func(err error) {
		if now := time.Now().UnixNano(); now-last.Load() >= int64(time.Second) {
			last.Store(now)
			log.Warn().Err(err).Msg("traces: export failed; spans are dropped, mcpheal goes on")
		}
	}
}

// setTracer gives every upstream the tracer provider (nil: none).
func setTracer(ups []proxy.Config, tp trace.TracerProvider) {
	for i := range ups {
		ups[i].Tracer = tp
	}
}

// mcphealVersion is the module version the binary was built from, for the
// service.version resource attribute.
func mcphealVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "(devel)"
}

// sameTracing reports whether two tracing sections say the same.
func sameTracing(a, b telemetry.Config) bool {
	if a.Endpoint != b.Endpoint || a.ServiceName != b.ServiceName || a.Sampler != b.Sampler ||
		a.SamplerArg != b.SamplerArg || len(a.Headers) != len(b.Headers) {
		return false
	}
	for k, v := range a.Headers {
		if b.Headers[k] != v {
			return false
		}
	}
	return true
}
