package proxy

// A server at capacity or rate-limiting (classify.Busy): the Python SDK's
// 503 "Too many open sessions" at its session cap, a 429 with or without
// Retry-After. mcpheal waits the server's Retry-After once when it fits the
// heal budget and the request is harmless to send again, else passes the
// server's answer on at once; never an outage, never the breaker.

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcpheal/mcpheal/proxy/internal/peers"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/tidwall/gjson"
)

// busyAnswer is one answer the capacity server gives instead of serving.
type busyAnswer struct {
	status     int
	retryAfter string
	body       string
}

// pythonFull is the Python SDK's answer at max_sessions.
const pythonFull = `{"jsonrpc":"2.0","id":"server-error","error":{"code":-32600,"message":"Too many open sessions"}}`

// capacityServer is a Go SDK server (tool counter: not replay-safe, counts
// its executions) behind a gate that answers the next requests of a method
// with the answers queued for it, before the server sees them.
type capacityServer struct {
	url  string
	srv  *mcp.Server
	runs atomic.Int64 // executions of counter

	mu     sync.Mutex
	queue  map[string][]busyAnswer
	posted map[string]int // requests that reached the gate, by method
}

func startCapacityServer(t *testing.T) *capacityServer {
	t.Helper()
	c := &capacityServer{queue: map[string][]busyAnswer{}, posted: map[string]int{}}
	c.srv = mcp.NewServer(&mcp.Implementation{Name: "capacity", Version: "1"}, nil)
	mcp.AddTool(c.srv, &mcp.Tool{Name: "counter"}, func(context.Context, *mcp.CallToolRequest, peers.NoIn) (*mcp.CallToolResult, any, error) {
		c.runs.Add(1)
		return peers.Text("counted"), nil, nil
	})
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return c.srv }, &mcp.StreamableHTTPOptions{JSONResponse: true})
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		method := gjson.GetBytes(body, "method").Str
		c.mu.Lock()
		c.posted[method]++
		var a *busyAnswer
		if q := c.queue[method]; len(q) > 0 {
			a, c.queue[method] = &q[0], q[1:]
		}
		c.mu.Unlock()
		if a != nil {
			if a.retryAfter != "" {
				w.Header().Set("Retry-After", a.retryAfter)
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(a.status)
			_, _ = io.WriteString(w, a.body)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(hs.Close)
	c.url = hs.URL + "/mcp"
	return c
}

// busyNext queues answers for the next requests of method.
func (c *capacityServer) busyNext(method string, as ...busyAnswer) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.queue[method] = append(c.queue[method], as...)
}

func (c *capacityServer) sent(method string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.posted[method]
}

// expire ends every session, as an idle expiry does.
func (c *capacityServer) expire() {
	for ss := range c.srv.Sessions() {
		_ = ss.Close()
	}
}

const counterCall = `{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"counter","arguments":{}}}`

// TestBusyUpstream: each way a server says it is at capacity, what the
// agent gets, how often the server is asked, and what ran.
func TestBusyUpstream(t *testing.T) {
	t.Parallel()
	t.Run("refused unseen, Retry-After fits: one wait, one resend, one run", func(t *testing.T) {
		t.Parallel()
		up := startCapacityServer(t)
		s, url := startProxy(t, up.url, nil)
		sid := peers.RawInitialize(t, url)
		up.busyNext("tools/call", busyAnswer{503, "1", pythonFull})
		start := time.Now()
		resp, body := peers.RawPost(t, url, sid, counterCall)
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "counted") {
			t.Fatalf("%d %s; want the call's result after the wait", resp.StatusCode, body)
		}
		if el := time.Since(start); el < 900*time.Millisecond {
			t.Errorf("answered after %v: the Retry-After of 1 s was not waited", el)
		}
		if n, runs := up.sent("tools/call"), up.runs.Load(); n != 2 || runs != 1 {
			t.Errorf("tools/call sent %d times, ran %d; want 2 and 1", n, runs)
		}
		if st := s.breakerState(); st != 0 {
			t.Errorf("breaker state %d, want closed", st)
		}
	})
	t.Run("Retry-After past the heal budget: the server's answer at once", func(t *testing.T) {
		t.Parallel()
		up := startCapacityServer(t)
		s, url := startProxy(t, up.url, nil) // heal budget 5 s
		sid := peers.RawInitialize(t, url)
		for range 3 {
			up.busyNext("tools/call", busyAnswer{503, "30", pythonFull})
			start := time.Now()
			resp, body := peers.RawPost(t, url, sid, counterCall)
			if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "30" ||
				!strings.Contains(string(body), "Too many open sessions") {
				t.Fatalf("%d Retry-After %q %s; want the server's 503, its words and its Retry-After", resp.StatusCode,
					resp.Header.Get("Retry-After"), body)
			}
			if el := time.Since(start); el > 2*time.Second {
				t.Errorf("answered after %v: it waited", el)
			}
		}
		if n := up.sent("tools/call"); n != 3 {
			t.Errorf("tools/call sent %d times for 3 calls, want 3", n)
		}
		if st := s.breakerState(); st != 0 {
			t.Errorf("breaker state %d after 3 busy answers, want closed", st)
		}
		// The server's live sessions still work, and so does mcpheal.
		if resp, body := peers.RawPost(t, url, sid, counterCall); resp.StatusCode != http.StatusOK {
			t.Fatalf("after: %d %s", resp.StatusCode, body)
		}
	})
	t.Run("429 without Retry-After: one wait of 1 s, then its answer with Retry-After", func(t *testing.T) {
		t.Parallel()
		up := startCapacityServer(t)
		_, url := startProxy(t, up.url, nil)
		sid := peers.RawInitialize(t, url)
		up.busyNext("tools/call", busyAnswer{429, "", `{"jsonrpc":"2.0","id":5,"error":{"code":-32000,"message":"rate limited"}}`},
			busyAnswer{429, "", `{"jsonrpc":"2.0","id":5,"error":{"code":-32000,"message":"rate limited"}}`})
		resp, body := peers.RawPost(t, url, sid, counterCall)
		if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" || !strings.Contains(string(body), "rate limited") {
			t.Fatalf("%d Retry-After %q %s; want the server's 429 with a Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"), body)
		}
		if n, runs := up.sent("tools/call"), up.runs.Load(); n != 2 || runs != 0 {
			t.Errorf("tools/call sent %d times, ran %d; want 2 (one resend) and 0", n, runs)
		}
	})
	t.Run("busy in its own words but maybe run: not sent again", func(t *testing.T) {
		t.Parallel()
		up := startCapacityServer(t)
		_, url := startProxy(t, up.url, nil)
		sid := peers.RawInitialize(t, url)
		up.busyNext("tools/call", busyAnswer{503, "1", `{"jsonrpc":"2.0","id":5,"error":{"code":-32603,"message":"Overloaded"}}`})
		resp, body := peers.RawPost(t, url, sid, counterCall)
		if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), "Overloaded") {
			t.Fatalf("%d %s; want the server's 503", resp.StatusCode, body)
		}
		if n := up.sent("tools/call"); n != 1 {
			t.Errorf("tools/call sent %d times, want 1: the server did not say it never ran it", n)
		}
	})
	t.Run("at capacity when a heal re-creates the session", func(t *testing.T) {
		t.Parallel()
		up := startCapacityServer(t)
		s, url := startProxy(t, up.url, nil)
		sid := peers.RawInitialize(t, url)
		up.expire()
		up.busyNext("initialize", busyAnswer{503, "30", pythonFull})
		inits := up.sent("initialize")
		start := time.Now()
		resp, body := peers.RawPost(t, url, sid, counterCall)
		if resp.StatusCode != http.StatusOK || resp.Header.Get("Retry-After") != "30" ||
			!strings.Contains(string(body), "Too many open sessions") || gjson.GetBytes(body, "error.code").Int() != -32600 {
			t.Fatalf("%d Retry-After %q %s; want 200, the server's words and code, Retry-After 30", resp.StatusCode,
				resp.Header.Get("Retry-After"), body)
		}
		if el := time.Since(start); el > 2*time.Second {
			t.Errorf("answered after %v", el)
		}
		if n := up.sent("initialize") - inits; n != 1 {
			t.Errorf("%d initializes for the heal, want 1", n)
		}
		if st := s.breakerState(); st != 0 {
			t.Errorf("breaker state %d, want closed", st)
		}
		// Room again: the session heals on the next call, which runs once.
		if resp, body := peers.RawPost(t, url, sid, counterCall); resp.StatusCode != http.StatusOK || up.runs.Load() != 1 {
			t.Fatalf("after: %d %s, %d runs", resp.StatusCode, body, up.runs.Load())
		}
	})
}
