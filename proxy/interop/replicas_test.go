//go:build unix

package interop

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcpheal/mcpheal/session/redisstore"
	"github.com/mcpheal/mcpheal/session/redisstore/redistest"
)

// TestReplicas (docs/deployment.md "Replicas"): each real client (the TS SDK v1 and v2
// clients, mcp-remote) talks to three mcpheal replicas sharing a real
// redis-server, through a round-robin balancer, so that its consecutive
// requests land on different replicas. Then the server restarts, one
// replica is killed, and the other two restart. Expected: every call
// succeeds and runs once; the server sees the client's initialize and one
// more for the heal after its restart, none for the replicas' restarts.
func TestReplicas(t *testing.T) {
	t.Parallel()
	for _, flavour := range flavours {
		t.Run(flavour, func(t *testing.T) {
			t.Parallel()
			rs := redistest.Start(t)
			st, err := redisstore.New(redisstore.Config{Addr: rs.Addr, Prefix: "default"})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { st.Close() })
			countFile := filepath.Join(t.TempDir(), "work.count")
			srv := startV1Server(t, v1Opts{countFile: countFile, restartable: true})
			keys := keyRing(t)
			var procs []*proxyProcess
			var addrs []string
			for range 3 {
				addr := "127.0.0.1:" + strconv.Itoa(freeFixedPort(t))
				procs = append(procs, startProxyAt(t, addr, srv.url(), keys, st))
				addrs = append(addrs, addr)
			}
			lb := startBalancer(t, addrs)

			agentName := "replicas-" + flavour
			a := newAgent(t, flavour, "http://"+lb.addr+"/mcp", agentName)
			initLine := "INITIALIZE " + agentName
			inits := func() int {
				return srv.proc.out.count(func(l string) bool { return l == initLine || strings.HasPrefix(l, initLine+" (via ") })
			}
			var tags []string
			work := func(tag string) {
				t.Helper()
				tags = append(tags, tag)
				if r := a.call("work", map[string]any{"tag": tag}); !r.OK || r.IsError || r.TextHead != "done "+tag {
					t.Fatalf("work %q through three replicas: %v, text %q", tag, r, r.TextHead)
				}
			}
			if r := a.connect(); !r.OK {
				t.Fatalf("connect through three replicas: %v", r)
			}
			for i := range 6 {
				work("spread-" + strconv.Itoa(i))
			}
			for i := range addrs {
				if n := lb.served[i].Load(); n < 2 {
					t.Fatalf("replica %d served %d requests: the balancer did not spread them", i, n)
				}
			}
			if n := inits(); n != 1 {
				t.Fatalf("the server saw %d initialize on three replicas, want 1", n)
			}

			srv.restart()
			for i := range 4 {
				work("server-restarted-" + strconv.Itoa(i))
			}
			if n := srv.proc.out.count(func(l string) bool { return strings.HasPrefix(l, "INITIALIZE "+agentName) }); n != 1 {
				t.Fatalf("the restarted server saw %d initialize for the session, want 1 (one heal for three replicas)", n)
			}

			procs[0].kill()
			for i := range 3 {
				work("one-replica-dead-" + strconv.Itoa(i))
			}
			for _, i := range []int{1, 2} {
				procs[i].kill()
				procs[i] = startProxyAt(t, addrs[i], srv.url(), keys, st)
			}
			for i := range 3 {
				work("replicas-restarted-" + strconv.Itoa(i))
			}
			if n := srv.proc.out.count(func(l string) bool { return strings.HasPrefix(l, "INITIALIZE "+agentName) }); n != 1 {
				t.Errorf("the server saw %d initialize after the replicas restarted, want still 1: they adopt the live session", n)
			}
			for _, tag := range tags {
				if n := runs(countFile, tag); n != 1 {
					t.Errorf("work %q ran %d times, want exactly 1", tag, n)
				}
			}
		})
	}
}

// balancer is a round-robin HTTP balancer over mcpheal replicas: each
// request goes to the next replica, one that refuses the connection is
// skipped (nginx's proxy_next_upstream error), and no connection is
// reused, so that consecutive requests of one client alternate. A
// replica's answer cut mid-way cuts the agent's connection too, as nginx
// does. pick, when set, chooses the first replica tried for a request
// (-1: the next in turn), so that a test can make certain of what round
// robin does (N-1)/N of the time; every request served is logged.
type balancer struct {
	addr   string
	addrs  []string
	next   atomic.Uint64
	served []atomic.Int64
	tr     *http.Transport
	pick   func(r *http.Request, body []byte) int

	mu  sync.Mutex // protects log
	log []balanced
}

// balanced is one request a balancer passed on.
type balanced struct {
	replica     int
	method      string // the HTTP method
	rpc         string // the JSON-RPC method of a POST
	lastEventID string
}

// servedBy counts the requests replica i served that match.
func (b *balancer) servedBy(i int, match func(balanced) bool) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for _, r := range b.log {
		if r.replica == i && match(r) {
			n++
		}
	}
	return n
}

func startBalancer(t *testing.T, addrs []string) *balancer {
	t.Helper()
	b := &balancer{addrs: addrs, served: make([]atomic.Int64, len(addrs)), tr: &http.Transport{DisableKeepAlives: true}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b.addr = ln.Addr().String()
	srv := &http.Server{Handler: b}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		_ = srv.Close()
	})
	return b
}

func (b *balancer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	start := b.next.Add(1)
	if b.pick != nil {
		if k := b.pick(r, body); k >= 0 {
			start = uint64(k)
		}
	}
	for i := range len(b.addrs) {
		k := int((start + uint64(i)) % uint64(len(b.addrs)))
		out, _ := http.NewRequestWithContext(r.Context(), r.Method, "http://"+b.addrs[k]+r.URL.RequestURI(), bytes.NewReader(body))
		out.Header = r.Header.Clone()
		resp, err := b.tr.RoundTrip(out)
		var op *net.OpError
		if errors.As(err, &op) && op.Op == "dial" {
			continue
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		b.served[k].Add(1)
		var msg struct {
			Method string `json:"method"`
		}
		_ = json.Unmarshal(body, &msg)
		b.mu.Lock()
		b.log = append(b.log, balanced{replica: k, method: r.Method, rpc: msg.Method, lastEventID: r.Header.Get("Last-Event-ID")})
		b.mu.Unlock()
		for name, v := range resp.Header {
			w.Header()[name] = v
		}
		w.WriteHeader(resp.StatusCode)
		rc := http.NewResponseController(w)
		buf := make([]byte, 32<<10)
		var rerr error
		for rerr == nil {
			var n int
			n, rerr = resp.Body.Read(buf)
			if n > 0 {
				_, _ = w.Write(buf[:n])
				_ = rc.Flush()
			}
		}
		resp.Body.Close()
		if !errors.Is(rerr, io.EOF) {
			panic(http.ErrAbortHandler) // cut: the agent's connection goes too
		}
		return
	}
	http.Error(w, "no replica answers", http.StatusBadGateway)
}
