package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"github.com/tidwall/gjson"

	"github.com/mcpheal/mcpheal/bench"
)

// What a production deployment does to the proxy itself (docs/security.md "Under
// attack"): a flood of idle connections at a lowered descriptor limit, a
// flood of 2026-07-28 subscriptions/listen on the held route, and requests
// naming huge tools with tracing on and a collector that takes its time.

// floodFDs is the descriptor limit the connection flood runs mcpheal at.
const floodFDs = 512

// prlimitNOFILE sets pid's descriptor limit (soft and hard), as prlimit(1)
// does: mcpheal reads it again within a second.
func prlimitNOFILE(pid, n int) error {
	lim := syscall.Rlimit{Cur: uint64(n), Max: uint64(n)}
	_, _, errno := syscall.RawSyscall6(syscall.SYS_PRLIMIT64, uintptr(pid), uintptr(syscall.RLIMIT_NOFILE),
		uintptr(unsafe.Pointer(&lim)), 0, 0, 0)
	if errno != 0 {
		return errno
	}
	return nil
}

// 12. Connection flood: 4 × the descriptor limit of idle TCP connections,
// then a victim's calls and a newcomer while they stay open.
func (h *harness) attackConns() hostileAttack {
	const flood = 4 * floodFDs
	var victim bench.Session
	return hostileAttack{
		name: "connection flood",
		sends: fmt.Sprintf("%d idle TCP connections (no request) with mcpheal's descriptor limit lowered to %d, kept open while a victim session makes 5 calls and a new agent comes",
			flood, floodFDs),
		cap: "agents' connections ≤ ¾ of the descriptor limit; at the cap the one idle longest is closed for a new one (mcpheal_connections_shed_total)",
		setup: func(ctx context.Context, a *attackRun) error {
			var err error
			if victim, err = bench.Initialize(ctx, a.hc, a.url, true); err != nil {
				return err
			}
			if err := victim.Call(ctx, a.hc, 1); err != nil {
				return err
			}
			if err := prlimitNOFILE(a.pid, floodFDs); err != nil {
				return fmt.Errorf("prlimit: %w", err)
			}
			time.Sleep(1100 * time.Millisecond) // mcpheal reads its limit again once a second
			return nil
		},
		run: func(ctx context.Context, a *attackRun) error {
			var conns []net.Conn
			defer func() {
				for _, c := range conns {
					_ = c.Close()
				}
			}()
			failed := 0
			for range flood {
				c, err := net.DialTimeout("tcp", a.addr, time.Second)
				if err != nil {
					failed++
					continue
				}
				conns = append(conns, c)
			}
			ok := 0
			for i := range 5 {
				if err := victim.Call(ctx, a.hc, uint64(10+i)); err == nil {
					ok++
				}
			}
			a.check(ok == 5, "%d of the victim's 5 calls answered during the flood", ok)
			a.newcomer(ctx, "during the flood")
			shed, err := a.metric(ctx, "mcpheal_connections_shed_total")
			if err != nil {
				return err
			}
			a.res.Got = fmt.Sprintf("%d connections open (%d dials failed); mcpheal shed %d; %d sockets in mcpheal", len(conns), failed, int(shed), a.sockets())
			a.check(shed > 0, "mcpheal shed idle connections (%d)", int(shed))
			a.check(a.sockets() < floodFDs, "mcpheal holds %d sockets, under its limit of %d", a.sockets(), floodFDs)
			return nil
		},
		after: func(ctx context.Context, a *attackRun) error {
			a.newcomer(ctx, "after the flood")
			// Each connection fasthttp serves holds a read buffer (4 KiB) and a
			// goroutine until its first byte, none counted in the budget.
			a.peakWithin(floodFDs*16<<10, fmt.Sprintf("%d connections' buffers and goroutines", floodFDs))
			return nil
		},
	}
}

// listenBody is a 2026-07-28 subscriptions/listen of client i.
func listenBody(i, id int) []byte {
	return []byte(`{"jsonrpc":"2.0","id":` + strconv.Itoa(id) + `,"method":"subscriptions/listen","params":{"notifications":{"toolsListChanged":true},` +
		`"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientInfo":{"name":"listener-` +
		strconv.Itoa(i) + `","version":"1"},"io.modelcontextprotocol/clientCapabilities":{}}}}`)
}

// openListen posts body and keeps the stream open if it is one; else it
// returns the error answer's code.
func (a *attackRun) openListen(ctx context.Context, body []byte) (io.Closer, int64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, a.url, bytes.NewReader(body))
	if err != nil {
		return nil, 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("MCP-Protocol-Version", "2026-07-28")
	req.Header.Set("Mcp-Method", "subscriptions/listen")
	resp, err := a.hc.Do(req)
	if err != nil {
		return nil, 0, err
	}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		first := make([]byte, 512)
		n, _ := resp.Body.Read(first)
		if bytes.Contains(first[:n], []byte("subscriptions/acknowledged")) {
			return resp.Body, 0, nil
		}
	}
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	return nil, gjson.GetBytes(bench.Answer(raw), "error.code").Int(), nil
}

// 13. Listens: 2000 subscriptions/listen of 40 2026-07-28 agents on the
// held route, all kept open.
func (h *harness) attackListens() hostileAttack {
	const clients, each = 40, 50
	return hostileAttack{
		name: "listen flood",
		sends: fmt.Sprintf("%d subscriptions/listen (MCP 2026-07-28, held route) from %d agents, %d each, 32 at a time, every one kept open",
			clients*each, clients, each),
		cap: "40 KiB of memory_budget per open listen (-32017 beyond), 32 per held session (-32015)",
		run: func(ctx context.Context, a *attackRun) error {
			var mu sync.Mutex
			var open []io.Closer
			var t tally
			defer func() {
				for _, c := range open {
					_ = c.Close()
				}
			}()
			parallel(clients*each, 32, func(i int) {
				c, code, err := a.openListen(ctx, listenBody(i%clients, 100+i))
				key := "listen open"
				switch {
				case err != nil:
					key = "error " + err.Error()
				case c == nil:
					key = "refused " + strconv.FormatInt(code, 10)
				}
				t.add(key, "")
				if c != nil {
					mu.Lock()
					open = append(open, c)
					mu.Unlock()
				}
			})
			a.got(&t, "")
			a.check(len(open) <= clients*32, "%d listens open, at most 32 for each of the %d agents", len(open), clients)
			a.check(len(open)*(40<<10) <= a.pass.Budget, "%d listens open × 40 KiB within memory_budget %s", len(open), mib(a.pass.Budget))
			a.newcomer(ctx, "with the listens open")
			return nil
		},
		after: func(ctx context.Context, a *attackRun) error {
			a.peakWithin(32<<20, "the listening agents' own connections' buffers, beyond the 40 KiB counted for each")
			return nil
		},
	}
}

// slowCollector is an OTLP/HTTP endpoint that reads each export, then
// answers it after exportDelay: a collector that cannot keep up.
type slowCollector struct {
	url     string
	exports int64
	mu      sync.Mutex
}

const exportDelay = 2 * time.Second

func (c *slowCollector) count() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.exports
}

func startSlowCollector() (*slowCollector, func(), error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, nil, err
	}
	c := &slowCollector{url: "http://" + ln.Addr().String()}
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		c.mu.Lock()
		c.exports++
		c.mu.Unlock()
		select {
		case <-time.After(exportDelay):
		case <-r.Context().Done():
		}
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.WriteHeader(http.StatusOK)
	})}
	go func() { _ = srv.Serve(ln) }()
	return c, func() { _ = srv.Close() }, nil
}

// 14. Tracing: 150 calls naming a 3.9 MB tool, tracing on, the collector
// slow.
func (h *harness) attackTracing() hostileAttack {
	const n, size = 150, 3900 << 10
	return hostileAttack{
		name:  "tracing, slow collector",
		sends: fmt.Sprintf("%d tools/call naming a %s tool, 16 at a time, tracing on, the OTLP collector answering each export after %s", n, mib(size), exportDelay),
		cap:   "a span copies at most 128 bytes of what the agent sent; attribute values ≤ 256 bytes; the export queue ≤ 2048 spans",
		env:   func() []string { return []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + h.slowCollector.url} },
		run: func(ctx context.Context, a *attackRun) error {
			s, err := bench.Initialize(ctx, a.hc, a.url, true)
			if err != nil {
				return err
			}
			name := strings.Repeat("t", size)
			body := []byte(`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"` + name + `","arguments":{}}}`)
			var t tally
			parallel(n, 16, func(int) {
				x := a.post(ctx, s.ID, body)
				t.add(x.key(), x.msg)
			})
			a.got(&t, "")
			a.newcomer(ctx, "after the calls")
			return nil
		},
		after: func(ctx context.Context, a *attackRun) error {
			a.peakWithin(16*2*size, "16 request bodies in flight, each read and parsed")
			// Spans go out every 5 s (the SDK's batch timeout).
			deadline := time.Now().Add(8 * time.Second)
			for h.slowCollector.count() == 0 && time.Now().Before(deadline) && ctx.Err() == nil {
				time.Sleep(50 * time.Millisecond)
			}
			a.check(h.slowCollector.count() > 0, "tracing was on: the collector received %d exports", h.slowCollector.count())
			return nil
		},
	}
}
