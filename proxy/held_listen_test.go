package proxy

import (
	"context"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/mcpheal/mcpheal/proxy/internal/conf"
	"github.com/mcpheal/mcpheal/proxy/internal/peers"
	"github.com/mcpheal/mcpheal/proxy/internal/route/held"
	"github.com/mcpheal/mcpheal/proxy/internal/wire"
)

// Tests of a held session's GET stream and its listens (held_listen.go).

// TestShutdownEndsHeldListens: a 2026-07-28 agent's subscriptions/listen
// stays open until its agent leaves; a shutdown ends it at once instead of
// waiting its whole drain timeout for it (it took the full 20 s, and the
// process exited 2).
func TestShutdownEndsHeldListens(t *testing.T) {
	t.Parallel()
	up := peers.StartGoSDK(t, peers.GoSDKOpts{State: true})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	r, err := NewRouter(addr, []conf.Config{{Upstream: up.URL(), Listen: addr, AdminListen: conf.AdminOff}}, nopLog())
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- r.Serve(ln) }()
	body := `{"jsonrpc":"2.0","id":9,"method":"subscriptions/listen","params":{"notifications":{"toolsListChanged":true},` +
		`"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientInfo":{"name":"l","version":"1"},` +
		`"io.modelcontextprotocol/clientCapabilities":{}}}}`
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/mcp", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("MCP-Protocol-Version", "2026-07-28")
	req.Header.Set("Mcp-Method", "subscriptions/listen")
	resp, err := peers.RawClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	first := make([]byte, 256)
	if n, err := resp.Body.Read(first); err != nil || !strings.Contains(string(first[:n]), "subscriptions/acknowledged") {
		t.Fatalf("listen: %d %q %v; want its acknowledgment", resp.StatusCode, first[:n], err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	start := time.Now()
	if err := r.Shutdown(ctx); err != nil {
		t.Errorf("Shutdown: %v", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("Shutdown took %v with a listen open; want it ended at once", took)
	}
	<-served
}

// openListen opens a subscriptions/listen on the held route and returns
// the open answer, or the error answer's body.
func openListen(t *testing.T, url string, id int) (*http.Response, string) {
	t.Helper()
	body := `{"jsonrpc":"2.0","id":` + strconv.Itoa(id) + `,"method":"subscriptions/listen","params":{"notifications":{"toolsListChanged":true},` +
		`"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientInfo":{"name":"l","version":"1"},` +
		`"io.modelcontextprotocol/clientCapabilities":{}}}}`
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("MCP-Protocol-Version", "2026-07-28")
	req.Header.Set("Mcp-Method", "subscriptions/listen")
	resp, err := peers.RawClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	first := make([]byte, 512)
	n, _ := resp.Body.Read(first)
	if strings.Contains(string(first[:n]), "subscriptions/acknowledged") {
		t.Cleanup(func() { resp.Body.Close() })
		return resp, ""
	}
	resp.Body.Close()
	return nil, string(first[:n])
}

// TestHeldListensBounded: a held session takes at most maxListens
// subscriptions/listen, each counted in the memory budget while open and
// given back when it ends; past either limit the agent is told which. They
// had neither: 12 000 listens took 470 MB at a 64 MiB budget.
func TestHeldListensBounded(t *testing.T) {
	t.Parallel()
	t.Run("per session", func(t *testing.T) {
		t.Parallel()
		up := peers.StartGoSDK(t, peers.GoSDKOpts{State: true})
		// A closed listen is noticed at its next write: a keepalive.
		s, url := startProxy(t, up.URL(), func(c *conf.Config) { c.StreamKeepalive = 50 * time.Millisecond })
		before := s.mem.Used.Load()
		var open []*http.Response
		for i := range held.MaxListens {
			resp, errBody := openListen(t, url, 100+i)
			if resp == nil {
				t.Fatalf("listen %d: %s", i, errBody)
			}
			open = append(open, resp)
		}
		if _, errBody := openListen(t, url, 999); !strings.Contains(errBody, strconv.Itoa(wire.CodeTooMany)) {
			t.Fatalf("listen past maxListens: %q; want -32015", errBody)
		}
		counted := s.mem.Used.Load() - before
		if counted < held.MaxListens*held.ListenCost {
			t.Errorf("%d bytes counted for %d listens, want at least %d", counted, held.MaxListens, held.MaxListens*held.ListenCost)
		}
		for _, resp := range open {
			resp.Body.Close()
		}
		if !waitFor(5*time.Second, func() bool { return s.mem.Used.Load()-before < held.ListenCost }) {
			t.Errorf("budget after the listens closed: %d bytes above the start, want < %d", s.mem.Used.Load()-before, held.ListenCost)
		}
	})
	t.Run("memory budget", func(t *testing.T) {
		t.Parallel()
		up := peers.StartGoSDK(t, peers.GoSDKOpts{State: true})
		_, url := startProxy(t, up.URL(), func(c *conf.Config) { c.MemoryBudget = 6 * held.ListenCost })
		refused := ""
		for i := range 10 {
			if resp, errBody := openListen(t, url, 200+i); resp == nil {
				refused = errBody
				break
			}
		}
		if !strings.Contains(refused, strconv.Itoa(wire.CodeBudget)) {
			t.Fatalf("listens past a budget of %d bytes: refusal %q; want -32017", 6*held.ListenCost, refused)
		}
	})
}

// TestHeldRefusalsBounded: a session-era upstream that floods a held
// session's GET stream with requests (which no 2026-07-28 agent can get
// outside a call) is refused at most maxRefusing at a time; each refusal
// was a goroutine and a POST of its own, without bound (227 MB of heap).
// A call of the agent goes on meanwhile.
func TestHeldRefusalsBounded(t *testing.T) {
	t.Parallel()
	const flood = 2000
	release := make(chan struct{})
	var inFlight, most, refusals atomic.Int64
	url := startStub(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		for i := range flood {
			_, _ = io.WriteString(w, `data: {"jsonrpc":"2.0","id":"flood-`+strconv.Itoa(i)+`","method":"sampling/createMessage","params":{}}`+"\n\n")
		}
		_ = http.NewResponseController(w).Flush()
		<-r.Context().Done()
	}, func(w http.ResponseWriter, r *http.Request, method string) {
		switch method {
		case "server/discover":
			http.Error(w, "Bad Request: Server not initialized", http.StatusBadRequest)
		case "":
			// A refusal of one of the flood's requests: held open.
			refusals.Add(1)
			n := inFlight.Add(1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
			}
			select {
			case <-release:
			case <-r.Context().Done():
			}
			inFlight.Add(-1)
			w.WriteHeader(http.StatusAccepted)
		default:
			w.Header().Set("Content-Type", "application/json")
			body, _ := io.ReadAll(r.Body)
			_, _ = io.WriteString(w, `{"jsonrpc":"2.0","id":`+gjson.GetBytes(body, "id").Raw+`,"result":{"tools":[]}}`)
		}
	})
	_, purl := startProxy(t, url, nil)
	if st, res := heldPost(t, purl, "", "tools/list", "", 1); st != http.StatusOK {
		t.Fatalf("tools/list: %d %s", st, res.Raw)
	}
	if !waitFor(5*time.Second, func() bool { return inFlight.Load() >= held.MaxRefusing }) {
		t.Fatalf("%d refusals in flight, want %d", inFlight.Load(), held.MaxRefusing)
	}
	if st, res := heldPost(t, purl, "", "tools/list", "", 2); st != http.StatusOK {
		t.Fatalf("tools/list during the flood: %d %s", st, res.Raw)
	}
	if m := most.Load(); m > held.MaxRefusing {
		t.Errorf("%d refusals in flight at once, want at most %d", m, held.MaxRefusing)
	}
	close(release)
	if n := refusals.Load(); n >= flood {
		t.Errorf("%d refusals for a flood of %d while %d were pending: not bounded", n, flood, held.MaxRefusing)
	}
}

// TestHeldSlowListenHoldsNoOther: a listen whose agent reads nothing does
// not hold the session's other listens. Each notification was handed to
// the listens in turn, waiting up to write_timeout for room in a full
// one: every other listen waited with it, until the slow one's own write
// timed out. The upstream sends a prompts/list_changed (16 KiB) every
// 5 ms on its GET stream; one listen reads nothing, the other reads, and
// must never wait a second for the next.
func TestHeldSlowListenHoldsNoOther(t *testing.T) {
	t.Parallel()
	pad := strings.Repeat("x", 16<<10)
	up := startStubWith(t, `{"prompts":{"listChanged":true}}`, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		for {
			if _, err := io.WriteString(w, "data: "+`{"jsonrpc":"2.0","method":"notifications/prompts/list_changed","params":{"_meta":{"pad":"`+pad+`"}}}`+"\n\n"); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}, nil)
	_, url, logs := startProxyLog(t, up, func(c *conf.Config) { c.WriteTimeout = 10 * time.Second; c.Keepalive = -1 })
	body := `{"jsonrpc":"2.0","id":5,"method":"subscriptions/listen","params":{"notifications":{"promptsListChanged":true},` +
		`"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientInfo":{"name":"l","version":"1"},` +
		`"io.modelcontextprotocol/clientCapabilities":{}}}}`
	host := strings.TrimPrefix(strings.TrimSuffix(url, "/mcp"), "http://")
	slow, err := net.Dial("tcp", host)
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	_ = slow.(*net.TCPConn).SetReadBuffer(4 << 10)
	if _, err := io.WriteString(slow, "POST /mcp HTTP/1.1\r\nHost: "+host+"\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\n"+
		"Mcp-Protocol-Version: 2026-07-28\r\nMcp-Method: subscriptions/listen\r\nContent-Length: "+strconv.Itoa(len(body))+"\r\n\r\n"+body); err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(strings.Replace(body, `"id":5`, `"id":6`, 1)))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("MCP-Protocol-Version", "2026-07-28")
	req.Header.Set("Mcp-Method", "subscriptions/listen")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // past the 20 s below
	defer cancel()
	resp, err := (&http.Client{Transport: &http.Transport{}}).Do(req.WithContext(ctx))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	// The reading listen's notifications, as they come: the longest wait
	// between two over 2 s.
	seen := make(chan time.Time, 1024)
	go func() {
		buf := make([]byte, 64<<10)
		var pending []byte
		for {
			n, err := resp.Body.Read(buf)
			pending = append(pending, buf[:n]...)
			for {
				i := strings.Index(string(pending), "notifications/prompts/list_changed")
				if i < 0 {
					break
				}
				pending = pending[i+len("notifications/prompts/list_changed"):]
				select {
				case seen <- time.Now():
				default:
				}
			}
			if err != nil {
				close(seen)
				return
			}
		}
	}()
	// Until the slow listen's queue has been full for 2 s (mcpheal says
	// so when it drops a notification for it), at most 20 s.
	dropped := func() bool { return strings.Contains(logs.String(), "listen: agent not reading; notification dropped") }
	var last, full time.Time
	longest, count := time.Duration(0), 0
	limit := time.After(20 * time.Second)
	for done := false; !done; {
		select {
		case at, ok := <-seen:
			if !ok {
				t.Fatal("the reading listen ended")
			}
			if !last.IsZero() && at.Sub(last) > longest {
				longest = at.Sub(last)
			}
			last, count = at, count+1
		case <-time.After(time.Second):
			t.Fatalf("the reading listen waited a second for a notification (%d so far) while the other read nothing", count)
		case <-limit:
			t.Fatal("in 20 s no notification was dropped for the listen that reads nothing")
		}
		if full.IsZero() && dropped() {
			full = time.Now()
		}
		done = !full.IsZero() && time.Since(full) > 2*time.Second
	}
	if count < 10 || longest > time.Second {
		t.Errorf("the reading listen got %d notifications, the longest wait %v; want a steady flow", count, longest)
	}
	t.Logf("the reading listen got %d notifications, the longest wait %v", count, longest)
}
