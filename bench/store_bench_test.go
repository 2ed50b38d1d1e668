package bench

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/mcpheal/mcpheal/proxy"
	"github.com/mcpheal/mcpheal/session/redisstore"
	"github.com/mcpheal/mcpheal/session/redisstore/redistest"
)

// BenchmarkSessionStore measures a healthy session's echo call through
// mcpheal with the in-memory session store and with the Redis one (a real
// redis-server on loopback), side by side: the Redis store must cost
// nothing in steady state, because a held session never reads it. It
// reports ns/op, allocs/op and the 99th percentile of the per-call latency
// (p99-µs).
func BenchmarkSessionStore(b *testing.B) {
	up := serveLoopback(b, fakeUpstream{}.serve)
	rs := redistest.Start(b)
	st, err := redisstore.New(redisstore.Config{Addr: rs.Addr, Prefix: "default"})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { st.Close() })
	stores := []struct {
		name string
		mod  func(*proxy.Config)
	}{
		{"memory", nil},
		{"redis", func(c *proxy.Config) { c.Shared = st }},
	}
	for _, conc := range []int{1, 32} {
		for _, store := range stores {
			b.Run(fmt.Sprintf("%s/c%d", store.name, conc), func(b *testing.B) {
				url := startProxyWith(b, "http://"+up+"/mcp", store.mod)
				c := newEchoClient(b, url[len("http://"):len(url)-len("/mcp")])
				if err := c.run(conc, 4*uint64(conc)); err != nil { // warm pools
					b.Fatal(err)
				}
				lat := make([]time.Duration, b.N+conc)
				b.ReportAllocs()
				b.ResetTimer()
				if err := c.timed(conc, uint64(b.N), lat); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				lat = lat[:b.N]
				slices.Sort(lat)
				b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds())/1e3, "p99-µs")
			})
		}
	}
}

// timed is run, recording each call's latency in lat (one slot per call).
func (c *echoClient) timed(conc int, n uint64, lat []time.Duration) error {
	var (
		next atomic.Uint64
		wg   sync.WaitGroup
		errs = make(chan error, conc)
	)
	for range conc {
		wg.Go(func() {
			req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
			defer fasthttp.ReleaseRequest(req)
			defer fasthttp.ReleaseResponse(resp)
			c.prepare(req, nil)
			var body []byte
			for id := next.Add(1); id <= n; id = next.Add(1) {
				body = AppendCallBody(body[:0], id)
				req.SetBodyRaw(body)
				start := time.Now()
				err := c.hc.Do(req, resp)
				lat[id-1] = time.Since(start)
				if err != nil || resp.StatusCode() != fasthttp.StatusOK {
					errs <- fmt.Errorf("call %d: %v, status %d", id, err, resp.StatusCode())
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}
