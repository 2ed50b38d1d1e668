package main

import (
	"compress/gzip"
	"context"
	"flag"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// sinkStats is the OTLP sink's /stats answer: what it received and
// decoded so far.
type sinkStats struct {
	Exports  uint64 `json:"exports"`  // POST /v1/traces decoded
	Rejected uint64 `json:"rejected"` // anything else it was sent
	Bytes    uint64 `json:"bytes"`    // protobuf bytes decoded
	Spans    uint64 `json:"spans"`
	Server   uint64 `json:"server"`   // spans of kind SERVER: mcpheal's agent requests
	Client   uint64 `json:"client"`   // spans of kind CLIENT: its upstream exchanges
	Internal uint64 `json:"internal"` // the rest (heals, replays, waits)
}

// otlpSink is the collector mcpheal-traced exports to: OTLP/HTTP with
// protobuf bodies, as the OpenTelemetry SDK's exporter sends them, each
// export decoded with the OTLP definitions and its spans counted. It keeps
// no span, so that its memory does not grow with the run.
type otlpSink struct {
	exports, rejected, bytes        atomic.Uint64
	spans, server, client, internal atomic.Uint64
}

func (s *otlpSink) stats() sinkStats {
	return sinkStats{Exports: s.exports.Load(), Rejected: s.rejected.Load(), Bytes: s.bytes.Load(),
		Spans: s.spans.Load(), Server: s.server.Load(), Client: s.client.Load(), Internal: s.internal.Load()}
}

// export serves POST /v1/traces: 200 with an empty ExportTraceServiceResponse
// for an export it decoded, 400 for anything else.
func (s *otlpSink) export(w http.ResponseWriter, r *http.Request) {
	var body io.Reader = r.Body
	if r.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			s.reject(w)
			return
		}
		defer zr.Close()
		body = zr
	}
	b, err := io.ReadAll(io.LimitReader(body, 64<<20))
	var req coltracepb.ExportTraceServiceRequest
	if err != nil || r.Header.Get("Content-Type") != "application/x-protobuf" || proto.Unmarshal(b, &req) != nil {
		s.reject(w)
		return
	}
	var n, server, client, internal uint64
	for _, rs := range req.ResourceSpans {
		for _, ss := range rs.ScopeSpans {
			for _, sp := range ss.Spans {
				n++
				switch sp.Kind {
				case tracepb.Span_SPAN_KIND_SERVER:
					server++
				case tracepb.Span_SPAN_KIND_CLIENT:
					client++
				default:
					internal++
				}
			}
		}
	}
	s.spans.Add(n)
	s.server.Add(server)
	s.client.Add(client)
	s.internal.Add(internal)
	s.bytes.Add(uint64(len(b)))
	s.exports.Add(1)
	out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

func (s *otlpSink) reject(w http.ResponseWriter) {
	s.rejected.Add(1)
	http.Error(w, "not an OTLP/HTTP protobuf traces export", http.StatusBadRequest)
}

// runOTLPSink is the "otlp-sink" subcommand: otlpSink on -listen
// (POST /v1/traces, GET /stats) until SIGTERM. It is a process of its own
// so that decoding the spans is charged to neither mcpheal nor the
// harness: its CPU per request is reported beside mcpheal-traced's.
func runOTLPSink(args []string) error {
	fs := flag.NewFlagSet("otlp-sink", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:0", "address to serve on")
	if err := fs.Parse(args); err != nil {
		return err
	}
	s := new(otlpSink)
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/traces", s.export)
	mux.HandleFunc("GET /stats", func(w http.ResponseWriter, _ *http.Request) { writeJSON(w, s.stats()) })
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) { s.reject(w) })
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	return serveUntilSignal(*listen, func(ln net.Listener) error { return srv.Serve(ln) },
		func(ctx context.Context) error { return srv.Shutdown(ctx) })
}
