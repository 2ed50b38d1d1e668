package bench

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"
)

// largeEventUpstream answers initialize as fakeUpstream does and every
// tools/call with one SSE event carrying a text result of size bytes,
// written in 64 KiB pieces the way a server streams a large write.
func largeEventUpstream(size int) http.HandlerFunc {
	ev := []byte(`event: message` + "\n" + `data: {"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"` +
		strings.Repeat("x", size) + `"}]}}` + "\n\n")
	return func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		switch {
		case bytes.Contains(body, []byte(`"initialize"`)):
			w.Header().Set("Mcp-Session-Id", "large-session")
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write(fakeInit)
			return
		case !bytes.Contains(body, []byte(`"tools/call"`)):
			w.WriteHeader(http.StatusAccepted)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for i := 0; i < len(ev); i += 64 << 10 {
			_, _ = w.Write(ev[i:min(i+64<<10, len(ev))])
		}
	}
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkLargeEvent relays one tools/call answered by a single SSE event
// of 12 MB (a legitimate large tool result): direct, through a plain TCP
// relay (io.Copy both ways: what any proxy costs at least, since the bytes
// cross the kernel twice more), and through mcpheal. cpu-ms/op is the whole
// process's CPU (client, upstream, and the relay or mcpheal when in the
// path). B/op bounds the memory the relay needs per answer.
func BenchmarkLargeEvent(b *testing.B) {
	for _, size := range []int{1 << 20, 12 << 20} {
		up := serveHTTPLoopback(b, largeEventUpstream(size))
		for _, target := range []string{"direct", "tcprelay", "mcpheal"} {
			b.Run(fmt.Sprintf("%s/%dMB", target, size>>20), func(b *testing.B) {
				addr := up
				switch target {
				case "mcpheal":
					addr = proxyAddr(b, up)
				case "tcprelay":
					addr = tcpRelay(b, up)
				}
				c := newEchoClient(b, addr)
				hc := &http.Client{Timeout: time.Minute}
				call := func() {
					req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/mcp",
						strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"big"}}`))
					req.Header.Set("Content-Type", "application/json")
					req.Header.Set("Accept", "application/json, text/event-stream")
					req.Header.Set("Mcp-Session-Id", c.sid)
					req.Header.Set("Mcp-Protocol-Version", ProtocolVersion)
					resp, err := hc.Do(req)
					if err != nil {
						b.Fatal(err)
					}
					n, err := io.Copy(io.Discard, resp.Body)
					_ = resp.Body.Close()
					if err != nil || n < int64(size) {
						b.Fatalf("answer of %d bytes, %v; want more than %d", n, err, size)
					}
				}
				call() // warm up
				b.SetBytes(int64(size))
				b.ReportAllocs()
				start := cpuTime()
				b.ResetTimer()
				for b.Loop() {
					call()
				}
				b.StopTimer()
				b.ReportMetric(float64((cpuTime()-start).Microseconds())/1000/float64(b.N), "cpu-ms/op")
			})
		}
	}
}

// serveHTTPLoopback serves h with net/http on a fresh loopback port until
// the benchmark ends, and returns its host:port.
func serveHTTPLoopback(tb testing.TB, h http.Handler) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	tb.Cleanup(func() { _ = srv.Close() })
	return ln.Addr().String()
}

// tcpRelay forwards every connection to target with io.Copy both ways until
// the benchmark ends, and returns its host:port.
func tcpRelay(tb testing.TB, target string) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				u, err := net.Dial("tcp", target)
				if err != nil {
					return
				}
				defer u.Close()
				go func() { _, _ = io.Copy(u, c) }()
				_, _ = io.Copy(c, u)
			}()
		}
	}()
	return ln.Addr().String()
}
