// Package telemetry builds the OpenTelemetry tracer provider that mcpheal
// sends its spans to (docs/observability.md "Traces"), configured the way every
// OpenTelemetry user expects: the standard OTEL_* environment variables,
// and the config file's tracing keys for the same settings, which apply
// where the environment sets nothing. Tracing is off unless configured.
//
// Spans leave by OTLP over HTTP (protobuf), batched, through mcpheal's own
// exporter (otlp.go: the SDK's links gRPC); the sampler and the resource
// (service name and attributes) are the SDK's own readings of the
// environment, the exporter's endpoint, headers, timeout and compression
// the OTLP exporter variables.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// Config is the config file's tracing section. Each field applies only
// where its environment variable is unset.
type Config struct {
	// Endpoint is the OTLP/HTTP base URL, e.g. http://collector:4318
	// (OTEL_EXPORTER_OTLP_ENDPOINT; /v1/traces is appended) or the traces
	// URL itself (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT). Setting it turns
	// tracing on.
	Endpoint string
	// Headers are sent with every export (OTEL_EXPORTER_OTLP_HEADERS), e.g.
	// a collector's API key.
	Headers map[string]string
	// ServiceName is the service.name resource attribute
	// (OTEL_SERVICE_NAME); zero means "mcpheal".
	ServiceName string
	// Sampler and SamplerArg choose the sampler (OTEL_TRACES_SAMPLER,
	// OTEL_TRACES_SAMPLER_ARG): always_on, always_off, traceidratio,
	// parentbased_always_on (the default), parentbased_always_off,
	// parentbased_traceidratio.
	Sampler, SamplerArg string
}

// ErrUnsupported is the error of a setting this build cannot honour.
var ErrUnsupported = errors.New("unsupported tracing setting")

// Enabled reports whether tracing is on for cfg and the environment
// (lookup): OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none turn it
// off, OTEL_TRACES_EXPORTER=otlp on; without either, an endpoint in the
// environment or cfg turns it on.
func Enabled(cfg Config, lookup func(string) (string, bool)) (bool, error) {
	if v, _ := lookup("OTEL_SDK_DISABLED"); strings.EqualFold(strings.TrimSpace(v), "true") {
		return false, nil
	}
	if v, ok := lookup("OTEL_TRACES_EXPORTER"); ok && v != "" {
		switch strings.TrimSpace(v) {
		case "none":
			return false, nil
		case "otlp":
			return true, nil
		}
		return false, fmt.Errorf("%w: OTEL_TRACES_EXPORTER=%q (mcpheal exports otlp, or none)", ErrUnsupported, v)
	}
	return env(lookup, "OTEL_EXPORTER_OTLP_ENDPOINT") != "" || env(lookup, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "" ||
		cfg.Endpoint != "", nil
}

// New returns the tracer provider for cfg and the environment, and the
// function that flushes and stops it; a nil provider when tracing is off.
// version is mcpheal's, for the service.version resource attribute.
func New(ctx context.Context, cfg Config, version string, lookup func(string) (string, bool)) (trace.TracerProvider, func(context.Context) error, error) {
	on, err := Enabled(cfg, lookup)
	if err != nil || !on {
		return nil, nil, err
	}
	for _, k := range []string{"OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"} {
		if p := env(lookup, k); p != "" && p != "http/protobuf" {
			return nil, nil, fmt.Errorf("%w: %s=%q (mcpheal exports http/protobuf)", ErrUnsupported, k, p)
		}
	}
	exp, err := exporterConfig(cfg, lookup)
	if err != nil {
		return nil, nil, err
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(attribute.String("service.name", orStr(cfg.ServiceName, "mcpheal")),
			attribute.String("service.version", version)),
		resource.WithFromEnv(), // OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES win
		resource.WithTelemetrySDK())
	if err != nil {
		return nil, nil, fmt.Errorf("tracing resource: %w", err)
	}
	// The queue is bounded (spans dropped when full, as the SDK does) and
	// so is each span: mcpheal copies at most 128 bytes of what an agent
	// sent into one (proxy/trace.go), and attribute values are cut at 256.
	limits := sdktrace.NewSpanLimits()
	if env(lookup, "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT") == "" && env(lookup, "OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT") == "" {
		limits.AttributeValueLengthLimit = 256
	}
	popts := []sdktrace.TracerProviderOption{sdktrace.WithBatcher(exp, sdktrace.WithMaxQueueSize(2048)),
		sdktrace.WithResource(res), sdktrace.WithRawSpanLimits(limits)}
	if env(lookup, "OTEL_TRACES_SAMPLER") == "" && cfg.Sampler != "" {
		s, err := sampler(cfg.Sampler, cfg.SamplerArg)
		if err != nil {
			return nil, nil, err
		}
		popts = append(popts, sdktrace.WithSampler(s))
	}
	tp := sdktrace.NewTracerProvider(popts...)
	return tp, tp.Shutdown, nil
}

// sampler is the SDK's sampler of an OTEL_TRACES_SAMPLER name.
func sampler(name, arg string) (sdktrace.Sampler, error) {
	ratio := 1.0
	if arg != "" {
		r, err := strconv.ParseFloat(arg, 64)
		if err != nil || r < 0 || r > 1 {
			return nil, fmt.Errorf("%w: sampler argument %q: want a ratio from 0 to 1", ErrUnsupported, arg)
		}
		ratio = r
	}
	switch name {
	case "always_on":
		return sdktrace.AlwaysSample(), nil
	case "always_off":
		return sdktrace.NeverSample(), nil
	case "traceidratio":
		return sdktrace.TraceIDRatioBased(ratio), nil
	case "parentbased_always_on":
		return sdktrace.ParentBased(sdktrace.AlwaysSample()), nil
	case "parentbased_always_off":
		return sdktrace.ParentBased(sdktrace.NeverSample()), nil
	case "parentbased_traceidratio":
		return sdktrace.ParentBased(sdktrace.TraceIDRatioBased(ratio)), nil
	}
	return nil, fmt.Errorf("%w: sampler %q", ErrUnsupported, name)
}

func env(lookup func(string) (string, bool), k string) string {
	v, _ := lookup(k)
	return strings.TrimSpace(v)
}

func orStr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
