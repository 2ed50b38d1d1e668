//go:build unix

package bench

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/mcpheal/mcpheal/proxy"
	"github.com/mcpheal/mcpheal/session/redisstore"
	"github.com/mcpheal/mcpheal/session/redisstore/redistest"
)

// streamedUpstream answers every tools/call with an SSE answer mcpheal
// streams (its first event comes alone, the rest pause after it): events
// progress notifications of about 200 bytes, then the result.
type streamedUpstream struct {
	events int
	pause  time.Duration // after the first event
}

func (u streamedUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	switch {
	case bytes.Contains(body, []byte(`"initialize"`)):
		w.Header().Set("Mcp-Session-Id", "streamed-session")
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(fakeInit)
		return
	case !bytes.Contains(body, []byte(`"tools/call"`)):
		w.WriteHeader(http.StatusAccepted)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	rc := http.NewResponseController(w)
	msg := strings.Repeat("m", 120)
	for i := 1; i <= u.events; i++ {
		_, _ = fmt.Fprintf(w, `data: {"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":1,"progress":%d,"message":"%s"}}`+"\n\n", i, msg)
		_ = rc.Flush()
		if i == 1 {
			time.Sleep(u.pause)
		}
	}
	_, _ = io.WriteString(w, `data: {"jsonrpc":"2.0","id":2,"result":{"content":[{"type":"text","text":"done"}]}}`+"\n\n")
}

// cpuNow is the process's user and system CPU time.
func cpuNow() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkStreamedAnswer measures a streamed answer of 8 events and its
// result through mcpheal whose agent stays to the end, with the memory
// session store (answers logged locally only) and with a real
// redis-server (answers shared by a fleet, docs/streams.md "Across
// replicas"), at 32 concurrent agents. The upstream pauses 1 ms after the
// first event (an answer over before shareLinger: never written to Redis)
// or 30 ms (written, then deleted at its end). cpu-µs/op is the whole
// process's CPU time per call (client, upstream, mcpheal and, for redis,
// not the redis-server), and mallocs/op its allocations; per event, divide
// by 9.
func BenchmarkStreamedAnswer(b *testing.B) {
	var rs *redistest.Server
	for _, store := range []string{"memory", "redis"} {
		for _, pause := range []time.Duration{time.Millisecond, 30 * time.Millisecond} {
			b.Run(fmt.Sprintf("%s/pause-%v", store, pause), func(b *testing.B) {
				hs := httptest.NewServer(streamedUpstream{events: 8, pause: pause})
				b.Cleanup(hs.Close)
				up := hs.URL + "/mcp"
				mod := func(*proxy.Config) {}
				if store == "redis" {
					if rs == nil {
						rs = redistest.Start(b)
					}
					st, err := redisstore.New(redisstore.Config{Addr: rs.Addr, Prefix: b.Name()})
					if err != nil {
						b.Fatal(err)
					}
					b.Cleanup(func() { st.Close() })
					mod = func(c *proxy.Config) { c.Shared = st }
				}
				url := startProxyWith(b, up, mod)
				c := newEchoClient(b, url[len("http://"):len(url)-len("/mcp")])
				const conc = 32
				if err := c.runStreamed(conc, 2*conc); err != nil {
					b.Fatal(err)
				}
				var ms0, ms1 runtime.MemStats
				runtime.ReadMemStats(&ms0)
				cpu0 := cpuNow()
				b.ResetTimer()
				if err := c.runStreamed(conc, b.N); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				cpu := cpuNow() - cpu0
				runtime.ReadMemStats(&ms1)
				b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/op")
				b.ReportMetric(float64(ms1.Mallocs-ms0.Mallocs)/float64(b.N), "mallocs/op")
			})
		}
	}
}

// runStreamed sends n calls from conc goroutines and checks each got its
// 8 events and result.
func (c *echoClient) runStreamed(conc, n int) error {
	var wg sync.WaitGroup
	errs := make(chan error, conc)
	per := (n + conc - 1) / conc
	for range conc {
		wg.Go(func() {
			if err := c.streamed(per); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

func (c *echoClient) streamed(n int) error {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	c.prepare(req, nil)
	var call []byte
	for i := 1; i <= n; i++ {
		call = AppendCallBody(call[:0], uint64(i))
		req.SetBodyRaw(call)
		if err := c.hc.Do(req, resp); err != nil {
			return err
		}
		body := resp.Body()
		if bytes.Count(body, []byte("notifications/progress")) != 8 || !bytes.Contains(body, []byte(`"text":"done"`)) {
			return fmt.Errorf("call %d: %.300s", i, body)
		}
	}
	return nil
}
