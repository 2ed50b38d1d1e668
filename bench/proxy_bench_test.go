package bench

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"unsafe"

	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/mcpheal/mcpheal/proxy"
)

// fakeUpstream is a fasthttp MCP server for the micro-benchmarks: it answers
// initialize with a session id and echoes tools/call, as JSON or as one SSE
// event. It allocates nothing per request, so that the difference between
// the direct and the proxied allocs/op is the proxy's.
type fakeUpstream struct{ sse bool }

var (
	fakeInit = []byte(`{"jsonrpc":"2.0","id":"init","result":{"protocolVersion":"` + ProtocolVersion +
		`","capabilities":{"tools":{}},"serverInfo":{"name":"fake","version":"1"}}}`)
	ctJSON = []byte("application/json")
	ctSSE  = []byte("text/event-stream")
)

func (f fakeUpstream) serve(ctx *fasthttp.RequestCtx) {
	body := ctx.PostBody()
	s := unsafe.String(unsafe.SliceData(body), len(body))
	switch gjson.Get(s, "method").Str {
	case "initialize":
		ctx.Response.Header.Set("Mcp-Session-Id", "fake-session")
		ctx.Response.Header.SetContentTypeBytes(ctJSON)
		ctx.Response.SetBodyRaw(fakeInit)
		return
	case "tools/call":
	default:
		ctx.SetStatusCode(fasthttp.StatusAccepted)
		return
	}
	id := gjson.Get(s, "id").Raw
	if f.sse {
		ctx.Response.Header.SetContentTypeBytes(ctSSE)
		ctx.Response.AppendBodyString("event: message\ndata: ")
	} else {
		ctx.Response.Header.SetContentTypeBytes(ctJSON)
	}
	ctx.Response.AppendBodyString(`{"jsonrpc":"2.0","id":`)
	ctx.Response.AppendBodyString(id)
	ctx.Response.AppendBodyString(`,"result":{"content":[{"type":"text","text":"bench-`)
	ctx.Response.AppendBodyString(id)
	ctx.Response.AppendBodyString(`"}]}}`)
	if f.sse {
		ctx.Response.AppendBodyString("\n\n")
	}
}

// serveLoopback serves h on a fresh loopback port until the test ends.
func serveLoopback(tb testing.TB, h fasthttp.RequestHandler) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	srv := &fasthttp.Server{Handler: h, NoDefaultServerHeader: true, NoDefaultContentType: true}
	go func() { _ = srv.Serve(ln) }()
	tb.Cleanup(func() { _ = srv.Shutdown() })
	return ln.Addr().String()
}

// echoClient sends echo calls on one session and checks each answer.
type echoClient struct {
	hc  *fasthttp.HostClient
	sid string
}

func newEchoClient(tb testing.TB, addr string) *echoClient {
	tb.Helper()
	c := &echoClient{hc: &fasthttp.HostClient{Addr: addr, MaxConns: 1024}}
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	c.prepare(req, initBody)
	if err := c.hc.Do(req, resp); err != nil || resp.StatusCode() != fasthttp.StatusOK {
		tb.Fatalf("initialize via %s: %v, status %d", addr, err, resp.StatusCode())
	}
	c.sid = string(resp.Header.Peek("Mcp-Session-Id"))
	return c
}

func (c *echoClient) prepare(req *fasthttp.Request, body []byte) {
	req.Reset()
	req.SetRequestURI("http://" + c.hc.Addr + "/mcp")
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.SetContentTypeBytes(ctJSON)
	req.Header.Set("Accept", "application/json, text/event-stream")
	if c.sid != "" {
		req.Header.Set("Mcp-Session-Id", c.sid)
		req.Header.Set("Mcp-Protocol-Version", ProtocolVersion)
	}
	req.SetBody(body)
}

// worker sends calls until the shared counter passes n.
func (c *echoClient) worker(next *atomic.Uint64, n uint64) error {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	c.prepare(req, nil)
	var body, want []byte
	for id := next.Add(1); id <= n; id = next.Add(1) {
		body = AppendCallBody(body[:0], id)
		req.SetBodyRaw(body)
		if err := c.hc.Do(req, resp); err != nil {
			return err
		}
		want = fmt.Appendf(want[:0], `"text":"bench-%d"`, id)
		if resp.StatusCode() != fasthttp.StatusOK || !bytes.Contains(resp.Body(), want) {
			return fmt.Errorf("call %d: status %d body %.200s", id, resp.StatusCode(), resp.Body())
		}
	}
	return nil
}

// run sends n calls from conc goroutines.
func (c *echoClient) run(conc int, n uint64) error {
	var (
		next atomic.Uint64
		wg   sync.WaitGroup
		errs = make(chan error, conc)
	)
	for range conc {
		wg.Go(func() {
			if err := c.worker(&next, n); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// BenchmarkRequestPath measures one echo call, direct to a fasthttp fake
// upstream and through mcpheal (proxy.Server), with JSON and SSE answers, at
// 1 and 100 concurrent clients; mcpheal-traced is mcpheal with tracing on,
// every request sampled, its spans batched by the SDK's batch processor
// to an exporter that counts and drops them (spans/op): the cost of making
// the spans, without encoding or sending them. allocs/op counts the whole
// process (client, fake upstream and proxy), and mallocs/op is the same
// count with its fraction (the testing package truncates allocs/op to an
// integer): mcpheal's own share is its figure minus the direct one.
func BenchmarkRequestPath(b *testing.B) {
	for _, variant := range []string{"json", "sse"} {
		up := serveLoopback(b, fakeUpstream{sse: variant == "sse"}.serve)
		targets := map[string]string{"direct": up}
		for _, target := range []string{"direct", "mcpheal", "mcpheal-traced"} {
			for _, conc := range []int{1, 100} {
				b.Run(fmt.Sprintf("%s/%s/c%d", target, variant, conc), func(b *testing.B) {
					addr := targets[target]
					var exp *countingExporter
					switch target {
					case "mcpheal":
						addr = proxyAddr(b, up)
					case "mcpheal-traced":
						var tp trace.TracerProvider
						tp, exp = countingTracer(b)
						addr = tracedProxyAddr(b, up, tp)
					}
					c := newEchoClient(b, addr)
					if err := c.run(conc, 2*uint64(conc)); err != nil { // warm pools
						b.Fatal(err)
					}
					if exp != nil { // the warm-up's spans are not the timed calls
						if err := exp.flush(); err != nil {
							b.Fatal(err)
						}
					}
					b.ReportAllocs()
					var ms0, ms1 runtime.MemStats
					runtime.ReadMemStats(&ms0)
					spans0 := exp.count()
					b.ResetTimer()
					if err := c.run(conc, uint64(b.N)+2*uint64(conc)); err != nil {
						b.Fatal(err)
					}
					b.StopTimer()
					runtime.ReadMemStats(&ms1)
					b.ReportMetric(float64(ms1.Mallocs-ms0.Mallocs)/float64(b.N), "mallocs/op")
					if exp != nil {
						if err := exp.flush(); err != nil {
							b.Fatal(err)
						}
						b.ReportMetric(float64(exp.count()-spans0)/float64(b.N), "spans/op")
					}
				})
			}
		}
	}
}

// countingExporter is a span exporter that counts the spans it is given
// and keeps none.
type countingExporter struct {
	n     atomic.Int64
	flush func() error // the provider's ForceFlush
}

func (e *countingExporter) ExportSpans(_ context.Context, spans []sdktrace.ReadOnlySpan) error {
	e.n.Add(int64(len(spans)))
	return nil
}

func (*countingExporter) Shutdown(context.Context) error { return nil }

// count is the number of spans exported so far; 0 for a nil exporter.
func (e *countingExporter) count() int64 {
	if e == nil {
		return 0
	}
	return e.n.Load()
}

// countingTracer returns a tracer provider as mcpheal's with every request
// sampled (always_on) and the SDK's batch processor at its defaults, but
// exporting to a countingExporter; it is shut down when the test ends.
func countingTracer(tb testing.TB) (trace.TracerProvider, *countingExporter) {
	exp := new(countingExporter)
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()), sdktrace.WithBatcher(exp))
	exp.flush = func() error { return tp.ForceFlush(context.Background()) }
	tb.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp, exp
}

// proxyAddr starts mcpheal in front of the upstream at upAddr and returns its
// host:port.
func proxyAddr(tb testing.TB, upAddr string) string {
	url := startProxy(tb, "http://"+upAddr+"/mcp")
	return url[len("http://") : len(url)-len("/mcp")]
}

// tracedProxyAddr is proxyAddr with tracing on, to tp.
func tracedProxyAddr(tb testing.TB, upAddr string, tp trace.TracerProvider) string {
	url := startProxyWith(tb, "http://"+upAddr+"/mcp", func(c *proxy.Config) { c.Tracer = tp })
	return url[len("http://") : len(url)-len("/mcp")]
}

// TestRequestPathSetup runs a few calls of each micro-benchmark case, so
// that the benchmark's plumbing is tested (quickly, under -race) in CI.
func TestRequestPathSetup(t *testing.T) {
	t.Parallel()
	for _, sse := range []bool{false, true} {
		up := serveLoopback(t, fakeUpstream{sse: sse}.serve)
		tp, exp := countingTracer(t)
		for _, addr := range []string{up, proxyAddr(t, up), tracedProxyAddr(t, up, tp)} {
			if err := newEchoClient(t, addr).run(4, 20); err != nil {
				t.Errorf("run(sse=%v, %s) = %v", sse, addr, err)
			}
		}
		// The traced proxy's 21 requests (initialize and 20 calls): a
		// request span and an upstream exchange span each.
		if err := exp.flush(); err != nil {
			t.Fatal(err)
		}
		if n := exp.count(); n < 2*21 {
			t.Errorf("sse=%v: %d spans exported for 21 traced requests; want at least 42", sse, n)
		}
	}
}
