package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	rpprof "runtime/pprof"
	"sync"
	"syscall"
	"time"

	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/trace"

	"github.com/mcpheal/mcpheal/bench"
	"github.com/mcpheal/mcpheal/proxy"
	"github.com/mcpheal/mcpheal/proxy/telemetry"
)

// readyLine is what a child prints on stdout once it is listening.
const readyLine = "ready"

// upstreamStats is the upstream child's /admin/stats answer.
type upstreamStats struct {
	Initializes int64 `json:"initializes"`
	Sessions    int64 `json:"sessions"`
	CPUus       int64 `json:"cpu_us,omitempty"` // mode large: the process's CPU time so far (getrusage)
}

// runUpstream is the "upstream" subcommand: the Go SDK echo server (JSON or
// SSE answers), the stub, the large-event server (large.go), the hostile
// server (hostile_upstream.go) or the observe server (observe.go), on -listen,
// until SIGTERM, when it shuts down gracefully as a restarted server would.
// /admin/stats and /admin/expire serve the harness.
func runUpstream(args []string) error {
	fs := flag.NewFlagSet("upstream", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:0", "address to serve on")
	mode := fs.String("mode", "json", "json, sse, stub, large, hostile or observe")
	events := fs.String("events", "", "mode observe: the file every initialize and tool execution is appended to (observe.go)")
	size := fs.Int("size", 12<<20, "mode large: bytes of tool-result text in the one SSE event of every tools/call answer")
	if err := fs.Parse(args); err != nil {
		return err
	}
	mux := http.NewServeMux()
	switch *mode {
	case "json", "sse":
		echo := bench.NewEcho(*mode == "json")
		mux.Handle("/mcp", echo.Handler)
		mux.HandleFunc("/admin/stats", func(w http.ResponseWriter, _ *http.Request) {
			writeJSON(w, upstreamStats{Initializes: echo.Initializes(), Sessions: int64(echo.Sessions())})
		})
		mux.HandleFunc("POST /admin/expire", func(w http.ResponseWriter, _ *http.Request) {
			writeJSON(w, map[string]int{"expired": echo.ExpireAll()})
		})
	case "stub":
		stub := new(bench.Stub)
		mux.Handle("/mcp", stub)
		mux.HandleFunc("/admin/stats", func(w http.ResponseWriter, _ *http.Request) {
			writeJSON(w, upstreamStats{Initializes: int64(stub.Sessions())})
		})
	case "large":
		up := &largeUpstream{ev: newLargeEvent(*size)}
		mux.Handle("/mcp", up)
		mux.HandleFunc("/admin/stats", func(w http.ResponseWriter, _ *http.Request) {
			writeJSON(w, upstreamStats{Initializes: up.inits.Load(), CPUus: selfCPU().Microseconds()})
		})
	case "hostile":
		newHostileUpstream().register(mux)
	case "observe":
		obs, err := observeServer(*events)
		if err != nil {
			return err
		}
		mux.Handle("/mcp", obs)
	default:
		return fmt.Errorf("upstream -mode %q: want json, sse, stub, large, hostile or observe", *mode)
	}
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	return serveUntilSignal(*listen, func(ln net.Listener) error { return srv.Serve(ln) },
		func(ctx context.Context) error { return srv.Shutdown(ctx) })
}

// proxyStats is the proxy child's /stats answer: the proxy's counters and
// the Go runtime's allocation counters of the whole process.
type proxyStats struct {
	proxy.Stats
	Mallocs   uint64 `json:"mallocs"`
	HeapInuse uint64 `json:"heap_inuse"`
	NumGC     uint32 `json:"num_gc"`
}

// relay is what the "proxy" subcommand serves: mcpheal, or the bare
// pass-through that measures the floor under it.
type relay interface {
	Serve(net.Listener) error
	Shutdown(context.Context) error
	Stats() proxy.Stats
}

// runProxy is the "proxy" subcommand: mcpheal (proxy.New with main.go's
// defaults and an info-level JSON logger to stderr) on -listen, plus
// /stats and /debug/pprof on -stats, so that its CPU, memory and
// allocations are its own process's. With MCPBENCH_PROXY=passthrough in
// its environment it serves the bare fasthttp relay instead
// (passthrough.go). It runs with the environment it is given, as the
// mcpheal binary does: the harness gives it the image's (image.go), and
// mcpheal-traced the OTEL_* variables that turn tracing on
// (startTracing).
func runProxy(args []string) error {
	fs := flag.NewFlagSet("proxy", flag.ContinueOnError)
	upstream := fs.String("upstream", "", "upstream MCP endpoint")
	listen := fs.String("listen", "127.0.0.1:0", "agent-facing address")
	statsAddr := fs.String("stats", "127.0.0.1:0", "address of /stats and /debug/pprof")
	memRate := fs.Int("memprofilerate", runtime.MemProfileRate, "runtime.MemProfileRate (bytes per allocation sample)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	runtime.MemProfileRate = *memRate
	var p relay
	var err error
	var tp trace.TracerProvider
	stopTracing := func() {}
	if os.Getenv("MCPBENCH_PROXY") == "passthrough" {
		p, err = newPassthrough(*upstream)
	} else {
		log := zerolog.New(os.Stderr).Level(zerolog.InfoLevel).With().Timestamp().Logger()
		// Every benchmark session comes from one agent without a credential, so
		// the per-credential cap (default 1000) would stop the storm and the
		// memory run: it is raised to the session cap.
		cfg := proxy.Config{Upstream: *upstream, Listen: *listen, MaxSessionsPerCredential: 100_000}
		if tp, stopTracing, err = startTracing(log); err != nil {
			return err
		}
		defer stopTracing()
		cfg.Tracer = tp
		p, err = proxy.New(cfg, log)
	}
	if err != nil {
		return err
	}
	sln, err := net.Listen("tcp", *statsAddr)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/stats", func(w http.ResponseWriter, _ *http.Request) {
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		writeJSON(w, proxyStats{Stats: p.Stats(), Mallocs: ms.Mallocs, HeapInuse: ms.HeapInuse, NumGC: ms.NumGC})
	})
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	// The allocation profile is published by GC; collect first so that two
	// reads bracket exactly the allocations between them.
	mux.HandleFunc("/debug/allocs-now", func(w http.ResponseWriter, _ *http.Request) {
		runtime.GC()
		_ = rpprof.Lookup("allocs").WriteTo(w, 0)
	})
	// With tracing on, the harness flushes the spans of a run before it
	// reads the CPU time after it, so that exporting them is charged to the
	// run whose requests they describe and the sink has them all.
	mux.HandleFunc("POST /flush-traces", func(w http.ResponseWriter, r *http.Request) {
		f, ok := tp.(interface{ ForceFlush(context.Context) error })
		if !ok {
			http.Error(w, "tracing is off", http.StatusNotFound)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
		defer cancel()
		if err := f.ForceFlush(ctx); err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		writeJSON(w, map[string]bool{"flushed": true})
	})
	statsSrv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = statsSrv.Serve(sln) }()
	return serveUntilSignal(*listen, p.Serve, func(ctx context.Context) error {
		_ = statsSrv.Shutdown(ctx)
		err := p.Shutdown(ctx)
		stopTracing() // the last batch of spans, after the last request
		return err
	})
}

// startTracing builds mcpheal's tracer provider from the environment as
// the mcpheal binary does (main.go, startTracing: telemetry.New with
// os.LookupEnv; the proxy subcommand has no config file, so its tracing
// section is empty): nil unless OTEL_* turns tracing on. The function it
// returns flushes and stops the provider, once; it does nothing when
// tracing is off.
func startTracing(log zerolog.Logger) (trace.TracerProvider, func(), error) {
	tp, shutdown, err := telemetry.New(context.Background(), telemetry.Config{}, buildVersion(), os.LookupEnv)
	if err != nil || tp == nil {
		return nil, func() {}, err
	}
	log.Info().Msg("traces: exporting spans by OTLP over HTTP (docs/observability.md \"Traces\")")
	var once sync.Once
	return tp, func() {
		once.Do(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := shutdown(ctx); err != nil {
				log.Warn().Err(err).Msg("traces: the last spans were not exported")
			}
		})
	}, nil
}

// buildVersion is the module version this binary was built from (the
// service.version resource attribute, as mcpheal's own).
func buildVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "(devel)"
}

// serveUntilSignal listens on addr, prints readyLine, serves until SIGTERM
// or SIGINT, then shuts down within a few seconds.
func serveUntilSignal(addr string, serve func(net.Listener) error, shutdown func(context.Context) error) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	errc := make(chan error, 1)
	go func() { errc <- serve(ln) }()
	fmt.Println(readyLine)
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if err := shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return nil
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}
