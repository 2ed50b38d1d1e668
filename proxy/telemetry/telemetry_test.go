package telemetry

import (
	"context"
	"errors"
	"testing"
)

func envOf(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

// TestEnabled: tracing is off unless the environment or the config file
// turns it on, and the environment's OTEL_SDK_DISABLED and
// OTEL_TRACES_EXPORTER=none turn it off whatever else says.
func TestEnabled(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		cfg  Config
		env  map[string]string
		want bool
		err  bool
	}{
		{"nothing", Config{}, nil, false, false},
		{"endpoint in the file", Config{Endpoint: "http://c:4318"}, nil, true, false},
		{"endpoint in the environment", Config{}, map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, true, false},
		{"traces endpoint in the environment", Config{}, map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, true, false},
		{"exporter otlp", Config{}, map[string]string{"OTEL_TRACES_EXPORTER": "otlp"}, true, false},
		{"exporter none beats the file", Config{Endpoint: "http://c:4318"}, map[string]string{"OTEL_TRACES_EXPORTER": "none"}, false, false},
		{"SDK disabled", Config{Endpoint: "http://c:4318"}, map[string]string{"OTEL_SDK_DISABLED": "true"}, false, false},
		{"exporter zipkin", Config{}, map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}, false, true},
	}
	for _, c := range cases {
		got, err := Enabled(c.cfg, envOf(c.env))
		if got != c.want || (err != nil) != c.err {
			t.Errorf("%s: Enabled = %v, %v; want %v (error %v)", c.name, got, err, c.want, c.err)
		}
	}
}

// TestNew: off, New returns no provider; on, one; a protocol or sampler
// mcpheal cannot honour is an error, not a silent fallback.
func TestNew(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	if tp, stop, err := New(ctx, Config{}, "v", envOf(nil)); tp != nil || stop != nil || err != nil {
		t.Errorf("New with nothing set = %v, %v; want nil, nil", tp, err)
	}
	tp, stop, err := New(ctx, Config{Endpoint: "http://127.0.0.1:1", Sampler: "traceidratio", SamplerArg: "0.5"}, "v", envOf(nil))
	if err != nil || tp == nil {
		t.Fatalf("New with an endpoint = %v, %v; want a provider", tp, err)
	}
	_ = stop(ctx)
	for _, c := range []struct {
		cfg Config
		env map[string]string
	}{
		{Config{Endpoint: "http://c:4318"}, map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}},
		{Config{Endpoint: "http://c:4318", Sampler: "sometimes"}, nil},
		{Config{Endpoint: "http://c:4318", Sampler: "traceidratio", SamplerArg: "2"}, nil},
	} {
		if _, _, err := New(ctx, c.cfg, "v", envOf(c.env)); !errors.Is(err, ErrUnsupported) {
			t.Errorf("New(%+v, %v) = %v; want ErrUnsupported", c.cfg, c.env, err)
		}
	}
}
