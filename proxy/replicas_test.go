package proxy

// Replicas (docs/deployment.md "Replicas"): several mcpheal processes behind a
// round-robin balancer share sessions through a session.Shared store, with
// a real Go SDK upstream that counts its initializes and tool runs, and a
// real Go SDK client whose consecutive requests land on different replicas.
// Each test runs with the in-memory store and with a real redis-server.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/mcpheal/mcpheal/proxy/internal/conf"
	"github.com/mcpheal/mcpheal/proxy/internal/heal"
	"github.com/mcpheal/mcpheal/proxy/internal/peers"
	"github.com/mcpheal/mcpheal/session"
	"github.com/mcpheal/mcpheal/session/redisstore"
	"github.com/mcpheal/mcpheal/session/redisstore/redistest"
)

// countingShared counts every call that reaches the store.
type countingShared struct {
	session.Shared
	calls atomic.Int64
}

func (c *countingShared) Load(ctx context.Context, id session.ClientID) (session.State, error) {
	c.calls.Add(1)
	return c.Shared.Load(ctx, id)
}

func (c *countingShared) Advance(ctx context.Context, id session.ClientID, from uint64, up session.UpstreamID) (session.State, bool, error) {
	c.calls.Add(1)
	return c.Shared.Advance(ctx, id, from, up)
}

func (c *countingShared) Lead(ctx context.Context, id session.ClientID, gen uint64, ttl time.Duration) (bool, error) {
	c.calls.Add(1)
	return c.Shared.Lead(ctx, id, gen, ttl)
}

func (c *countingShared) Key(id session.ClientID) string { return c.Shared.(session.Watcher).Key(id) }

func (c *countingShared) Watch(ctx context.Context, fn func(session.Event)) {
	c.Shared.(session.Watcher).Watch(ctx, fn)
}

func (c *countingShared) Tell(ctx context.Context, e session.Event) error {
	return c.Shared.(session.Watcher).Tell(ctx, e)
}

var _ session.Watcher = (*countingShared)(nil)

// sharedKinds runs f with a fresh in-memory store and with a fresh Redis
// one (srv nil for memory).
func sharedKinds(t *testing.T, f func(t *testing.T, sh *countingShared, srv *redistest.Server)) {
	t.Run("memory", func(t *testing.T) {
		t.Parallel()
		f(t, &countingShared{Shared: session.NewMemShared()}, nil)
	})
	t.Run("redis", func(t *testing.T) {
		t.Parallel()
		srv := redistest.Start(t)
		st, err := redisstore.New(redisstore.Config{Addr: srv.Addr, Prefix: "default", Timeout: 200 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		f(t, &countingShared{Shared: st}, srv)
	})
}

// replicaSet is n mcpheal replicas with one key ring and one store, behind a
// round-robin balancer.
type replicaSet struct {
	t      *testing.T
	up     string
	keys   string
	shared session.Shared
	procs  []*proxyProcess
	lb     *balancer
	mod    func(*conf.Config) // more configuration, if set
}

func startFleet(t *testing.T, n int, up string, shared session.Shared, mod ...func(*conf.Config)) *replicaSet {
	f := &replicaSet{t: t, up: up, keys: testKeys(1), shared: shared}
	if len(mod) > 0 {
		f.mod = mod[0]
	}
	addrs := make([]string, n)
	for i := range n {
		p := f.start("127.0.0.1:0")
		f.procs = append(f.procs, p)
		addrs[i] = p.ln.Addr().String()
	}
	f.lb = startBalancer(t, addrs)
	return f
}

func (f *replicaSet) start(addr string) *proxyProcess {
	return startProxyAt(f.t, addr, f.up, func(c *conf.Config) {
		c.SessionKeys = f.keys
		c.Shared = f.shared
		if f.mod != nil {
			f.mod(c)
		}
	})
}

// url is the balancer's MCP endpoint; replica(i) one replica's own.
func (f *replicaSet) url() string { return "http://" + f.lb.addr + "/mcp" }

func (f *replicaSet) replica(i int) string { return "http://" + f.procs[i].ln.Addr().String() + "/mcp" }

// restart kills replica i (kill -9: no goodbye) and starts a new process
// on its address.
func (f *replicaSet) restart(i int) {
	addr := f.procs[i].ln.Addr().String()
	f.procs[i].kill()
	f.procs[i] = f.start(addr)
}

// check asserts the invariant of every fault test on every replica.
func (f *replicaSet) check() {
	f.t.Helper()
	for i, p := range f.procs {
		if st := p.s.Stats(); st.UnsafeResends != 0 || st.Panics != 0 {
			f.t.Errorf("replica %d: %d unsafe resends, %d panics", i, st.UnsafeResends, st.Panics)
		}
	}
}

// initsByReplica describes, for a failure message, the upstream
// initializes and heals each replica made.
func (f *replicaSet) initsByReplica() string {
	var b strings.Builder
	for i, p := range f.procs {
		st := p.s.Stats()
		fmt.Fprintf(&b, " replica %d: %d initializes, %d heals;", i, st.UpstreamInits, st.Heals)
	}
	return b.String()
}

// initRequests describes, for a failure message, the initializes the
// upstream received: their JSON-RPC ids tell the agent's from mcpheal's.
func initRequests(up *peers.Server) string {
	var b strings.Builder
	for _, r := range up.Requests() {
		if r.RPCMethod == "initialize" {
			fmt.Fprintf(&b, " initialize id %s;", r.RPCID)
		}
	}
	return b.String()
}

// balancer is a round-robin HTTP balancer: each request goes to the next
// replica; one that refuses the connection is skipped (nginx's
// proxy_next_upstream error). No connection reuse, so consecutive requests
// of one client really alternate.
type balancer struct {
	addr   string
	addrs  []string
	next   atomic.Uint64
	served []atomic.Int64 // requests answered, per replica
	tr     *http.Transport
}

func startBalancer(t *testing.T, addrs []string) *balancer {
	b := &balancer{addrs: addrs, served: make([]atomic.Int64, len(addrs)),
		tr: &http.Transport{DisableKeepAlives: true}}
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
	for i := range len(b.addrs) {
		k := int((start + uint64(i)) % uint64(len(b.addrs)))
		out, _ := http.NewRequestWithContext(r.Context(), r.Method, "http://"+b.addrs[k]+r.URL.RequestURI(), bytes.NewReader(body))
		out.Header = r.Header.Clone()
		resp, err := b.tr.RoundTrip(out)
		var op *net.OpError
		if errors.As(err, &op) && op.Op == "dial" {
			continue // a dead replica
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		b.served[k].Add(1)
		for k, v := range resp.Header {
			w.Header()[k] = v
		}
		w.WriteHeader(resp.StatusCode)
		rc := http.NewResponseController(w)
		buf := make([]byte, 32<<10)
		for {
			n, err := resp.Body.Read(buf)
			if n > 0 {
				_, _ = w.Write(buf[:n])
				_ = rc.Flush()
			}
			if err != nil {
				break
			}
		}
		resp.Body.Close()
		return
	}
	http.Error(w, "no replica answers", http.StatusBadGateway)
}

// TestFleetHealsOncePerDeath: the client's calls go round robin over three
// replicas, and only the agent's own initialize reaches the upstream: the
// other replicas adopt its upstream session from the store. The upstream
// restarts (every session gone): the next calls, on every replica, cost
// exactly one upstream initialize fleet-wide. Healthy calls never touch
// the store.
func TestFleetHealsOncePerDeath(t *testing.T) {
	t.Parallel()
	sharedKinds(t, func(t *testing.T, sh *countingShared, _ *redistest.Server) {
		up := peers.StartGoSDK(t, peers.GoSDKOpts{})
		f := startFleet(t, 3, up.URL(), sh)
		cs := peers.GoSDKClient(t, f.url())
		for i := range 9 {
			peers.CallEcho(t, cs, "spread "+strconv.Itoa(i))
		}
		for i := range f.procs {
			if n := f.lb.served[i].Load(); n < 3 {
				t.Fatalf("replica %d served %d requests; the balancer did not spread them", i, n)
			}
		}
		if n := up.Inits(); n != 1 {
			t.Fatalf("%d upstream initializes for one agent session on three replicas, want 1", n)
		}

		calls := sh.calls.Load()
		for i := range 9 {
			peers.CallEcho(t, cs, "steady "+strconv.Itoa(i))
		}
		if n := sh.calls.Load() - calls; n != 0 {
			t.Fatalf("%d store calls for 9 calls on a healthy session, want 0", n)
		}

		up.Restart()
		peers.CallEcho(t, cs, "after the upstream restart")
		// Every replica follows the heal at once (events), before any
		// request of its own fails.
		for i, p := range f.procs {
			peers.Wait(t, "replica "+strconv.Itoa(i)+" to follow the heal", func() bool {
				sess, ok := p.s.sessions.Store.Peek(session.ClientID(cs.ID()))
				if !ok {
					return false
				}
				_, gen := sess.Current()
				return gen == 2
			})
		}
		for i := range 8 {
			peers.CallEcho(t, cs, "after the upstream restart "+strconv.Itoa(i))
		}
		if n := up.Inits(); n != 2 {
			t.Fatalf("%d upstream initializes after one upstream restart, want 2 (one heal fleet-wide);%s%s", n, f.initsByReplica(), initRequests(up))
		}
		if n := up.ToolCalls("echo"); n != 27 {
			t.Fatalf("echo ran %d times for 27 calls", n)
		}
		f.check()
	})
}

// TestFleetSurvivesReplicaDeaths: one replica is killed mid-run, then every
// replica is restarted. The client never sees an error and, with a shared
// store, no new upstream session is made: the restarted replicas adopt the
// live one.
func TestFleetSurvivesReplicaDeaths(t *testing.T) {
	t.Parallel()
	sharedKinds(t, func(t *testing.T, sh *countingShared, _ *redistest.Server) {
		up := peers.StartGoSDK(t, peers.GoSDKOpts{})
		f := startFleet(t, 3, up.URL(), sh)
		cs := peers.GoSDKClient(t, f.url())
		for i := range 6 {
			peers.CallEcho(t, cs, "before "+strconv.Itoa(i))
		}
		f.procs[1].kill()
		for i := range 6 {
			peers.CallEcho(t, cs, "one replica dead "+strconv.Itoa(i))
		}
		for i := range f.procs {
			f.restart(i)
		}
		for i := range 6 {
			peers.CallEcho(t, cs, "all restarted "+strconv.Itoa(i))
		}
		if n := up.Inits(); n != 1 {
			t.Fatalf("%d upstream initializes, want only the agent's: restarted replicas adopt its session", n)
		}
		if n := up.ToolCalls("echo"); n != 18 {
			t.Fatalf("echo ran %d times for 18 calls", n)
		}
		f.check()
	})
}

// TestFleetDeleteEndsEverywhere: the agent ends its session on one replica;
// the replicas that hold it, and one that never saw it, answer 404 from
// then on, and the upstream is not asked to re-create it.
func TestFleetDeleteEndsEverywhere(t *testing.T) {
	t.Parallel()
	sharedKinds(t, func(t *testing.T, sh *countingShared, _ *redistest.Server) {
		up := peers.StartGoSDK(t, peers.GoSDKOpts{})
		f := startFleet(t, 3, up.URL(), sh)
		sid := peers.RawInitialize(t, f.replica(0))
		list := `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`
		for i := range 3 {
			if resp, body := peers.RawPost(t, f.replica(i), sid, list); resp.StatusCode != http.StatusOK {
				t.Fatalf("tools/list on replica %d: %d %s", i, resp.StatusCode, body)
			}
		}
		req, _ := http.NewRequest(http.MethodDelete, f.replica(2), nil)
		req.Header.Set("Mcp-Session-Id", sid)
		if resp, body := peers.RawDo(t, req); resp.StatusCode != http.StatusOK {
			t.Fatalf("DELETE: %d %s", resp.StatusCode, body)
		}
		// The replicas that hold it hear of the end at once (events), not
		// only when their upstream session fails.
		for i := range 2 {
			peers.Wait(t, "replica "+strconv.Itoa(i)+" to drop the ended session", func() bool {
				return !f.procs[i].s.sessions.Store.Has(session.ClientID(sid))
			})
		}
		f.procs = append(f.procs, f.start("127.0.0.1:0")) // never saw the session
		for i := range 4 {
			if resp, body := peers.RawPost(t, f.replica(i), sid, list); resp.StatusCode != http.StatusNotFound {
				t.Fatalf("tools/list on replica %d after DELETE on replica 2: %d %s, want 404", i, resp.StatusCode, body)
			}
		}
		if n := up.Inits(); n != 1 {
			t.Fatalf("%d upstream initializes: an ended session was re-created", n)
		}
		f.check()
	})
}

// TestFleetStoreDown: Redis stops. Healthy sessions do not notice; an
// upstream restart is healed by each replica on its own (at most one
// initialize per replica); Redis comes back empty and every replica
// restarts: sessions heal from their sealed ids alone.
func TestFleetStoreDown(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	st, err := redisstore.New(redisstore.Config{Addr: srv.Addr, Prefix: "default", Timeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	up := peers.StartGoSDK(t, peers.GoSDKOpts{})
	f := startFleet(t, 3, up.URL(), st)
	cs := peers.GoSDKClient(t, f.url())
	for i := range 6 {
		peers.CallEcho(t, cs, "before "+strconv.Itoa(i))
	}
	srv.Stop()
	for i := range 6 {
		peers.CallEcho(t, cs, "store down "+strconv.Itoa(i))
	}
	up.Restart()
	for i := range 6 {
		peers.CallEcho(t, cs, "store down, upstream restarted "+strconv.Itoa(i))
	}
	if n := up.Inits(); n < 2 || n > 4 {
		t.Fatalf("%d upstream initializes; want the agent's and at most one heal per replica;%s%s", n, f.initsByReplica(), initRequests(up))
	}
	inits := up.Inits()
	srv.Restart() // empty
	for i := range f.procs {
		f.restart(i)
	}
	for i := range 6 {
		peers.CallEcho(t, cs, "store back empty, replicas restarted "+strconv.Itoa(i))
	}
	if n := up.Inits() - inits; n != 1 {
		t.Fatalf("%d upstream initializes after the restarts, want 1", n)
	}
	if n := up.ToolCalls("echo"); n != 24 {
		t.Fatalf("echo ran %d times for 24 calls", n)
	}
	f.check()
}

// TestFleetConcurrentHeals: many agents' calls fail at once on every
// replica after an upstream restart; each session is re-created once.
func TestFleetConcurrentHeals(t *testing.T) {
	t.Parallel()
	sharedKinds(t, func(t *testing.T, sh *countingShared, _ *redistest.Server) {
		up := peers.StartGoSDK(t, peers.GoSDKOpts{})
		f := startFleet(t, 3, up.URL(), sh)
		const agents = 4
		var css [agents]*mcp.ClientSession
		for i := range css {
			css[i] = peers.GoSDKClient(t, f.url())
		}
		up.InitDelay.Store(int64(50 * time.Millisecond)) // the heals of one session overlap on every replica
		up.Restart()
		var wg sync.WaitGroup
		for i := range css {
			for j := range 6 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					text := "agent " + strconv.Itoa(i) + " call " + strconv.Itoa(j)
					res, err := peers.GoSDKCall(t, css[i], "echo", map[string]any{"text": text})
					if err != nil || peers.ResultText(res) != text {
						t.Errorf("echo(%q) = %q, %v", text, peers.ResultText(res), err)
					}
				}()
			}
		}
		wg.Wait()
		for i, p := range f.procs {
			t.Logf("replica %d: served %d heals %d adopted %v lost %v", i, f.lb.served[i].Load(), p.s.Stats().Heals, testutil.ToFloat64(p.s.sessions.Fleet.Stats.Adopted), testutil.ToFloat64(p.s.sessions.Fleet.Stats.Lost))
		}
		if n := up.Inits(); n != 2*agents {
			t.Fatalf("%d upstream initializes for %d agents and one upstream restart, want %d", n, agents, 2*agents)
		}
		f.check()
	})
}

// TestFleetSessionStateAcrossReplicas: the agent subscribes to a resource
// on one replica; tools that sample run with each sampling answer posted
// through another replica than the call; the upstream restarts and a call
// heals on whichever replica it reaches: that replica replays the
// subscription it never saw (from the store), the agent's GET stream,
// held by yet another replica, follows the heal, and the update reaches
// the agent. One upstream initialize per death.
func TestFleetSessionStateAcrossReplicas(t *testing.T) {
	t.Parallel()
	sharedKinds(t, func(t *testing.T, sh *countingShared, _ *redistest.Server) {
		up := peers.StartGoSDK(t, peers.GoSDKOpts{State: true})
		f := startFleet(t, 3, up.URL(), sh)
		var updated inbox
		cs := peers.GoSDKClientWith(t, f.url(), &mcp.ClientOptions{
			ResourceUpdatedHandler: func(_ context.Context, req *mcp.ResourceUpdatedNotificationRequest) {
				updated.add(req.Params.URI)
			},
			CreateMessageHandler: func(_ context.Context, req *mcp.CreateMessageRequest) (*mcp.CreateMessageResult, error) {
				var prompt string
				if len(req.Params.Messages) == 1 {
					if tc, ok := req.Params.Messages[0].Content.(*mcp.TextContent); ok {
						prompt = tc.Text
					}
				}
				return &mcp.CreateMessageResult{Model: "test", Role: "assistant", Content: &mcp.TextContent{Text: "sampled " + prompt}}, nil
			},
		})
		sample := func(prompt string) {
			t.Helper()
			res, err := peers.GoSDKCall(t, cs, "sample", map[string]any{"prompt": prompt})
			if err != nil {
				t.Fatalf("sample(%q): %v", prompt, err)
			}
			if got, want := peers.ResultText(res), "sampled "+prompt; got != want {
				t.Fatalf("sample(%q) = %q, want %q", prompt, got, want)
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), peers.Timeout)
		defer cancel()
		if err := cs.Subscribe(ctx, &mcp.SubscribeParams{URI: peers.ResourceURI}); err != nil {
			t.Fatalf("Subscribe: %v", err)
		}
		for i := range 3 {
			sample("before " + strconv.Itoa(i))
		}
		nudge(t, "resources/updated before the restart", func() { up.UpdateResource(peers.ResourceURI) },
			func() bool { return updated.count(peers.ResourceURI) > 0 })

		up.Restart()
		for i := range 3 {
			sample("after " + strconv.Itoa(i))
		}
		seen := updated.count(peers.ResourceURI)
		nudge(t, "resources/updated after the restart", func() { up.UpdateResource(peers.ResourceURI) },
			func() bool { return updated.count(peers.ResourceURI) > seen })
		if n := up.Inits(); n != 2 {
			t.Fatalf("%d upstream initializes, want 2 (the agent's, one heal)", n)
		}
		if got := journalParams(up, "resources/subscribe", "uri"); !slices.Equal(got, []string{peers.ResourceURI}) {
			t.Fatalf("replayed resources/subscribe = %q, want [%s] once", got, peers.ResourceURI)
		}
		if n := up.ToolCalls("sample"); n != 6 {
			t.Fatalf("sample ran %d times for 6 calls", n)
		}
		f.check()
	})
}

// TestFleetGetStreamMoves: the agent's GET stream is held by one replica;
// the agent opens it again through another (its connection to the first was
// lost, or the balancer moved it). The upstream allows one GET per session
// (the Go SDK answers 409 to a second), so the first replica lets go when
// told, and the second opens it: the agent gets its stream, not a 409.
func TestFleetGetStreamMoves(t *testing.T) {
	t.Parallel()
	sharedKinds(t, func(t *testing.T, sh *countingShared, _ *redistest.Server) {
		up := peers.StartGoSDK(t, peers.GoSDKOpts{})
		f := startFleet(t, 2, up.URL(), sh)
		sid := peers.RawInitialize(t, f.replica(0))
		open := func(url string) *http.Response {
			t.Helper()
			req, _ := http.NewRequest(http.MethodGet, url, nil)
			req.Header.Set("Accept", "text/event-stream")
			req.Header.Set("Mcp-Session-Id", sid)
			req.Header.Set("MCP-Protocol-Version", "2025-11-25")
			resp, err := http.DefaultTransport.RoundTrip(req)
			if err != nil {
				t.Fatalf("GET %s: %v", url, err)
			}
			t.Cleanup(func() { resp.Body.Close() })
			return resp
		}
		first := open(f.replica(0))
		if first.StatusCode != http.StatusOK {
			t.Fatalf("GET on replica 0: %d", first.StatusCode)
		}
		ended := make(chan struct{})
		go func() {
			_, _ = io.Copy(io.Discard, first.Body)
			close(ended)
		}()
		second := open(f.replica(1))
		if second.StatusCode != http.StatusOK {
			body, _ := io.ReadAll(second.Body)
			t.Fatalf("GET on replica 1 while replica 0 holds the stream: %d %s, want 200", second.StatusCode, body)
		}
		select {
		case <-ended:
		case <-time.After(5 * time.Second):
			t.Fatal("replica 0's stream still open 5 s after replica 1 took it")
		}
		if n := up.Inits(); n != 1 {
			t.Fatalf("%d upstream initializes, want 1", n)
		}
		f.check()
	})
}

// TestFleetStoreFrozen: Redis stops answering without closing its
// connections (an overloaded or partitioned store). Healthy calls do not
// notice; an upstream restart still heals, each store call giving up after
// redis.timeout, so no call takes much longer than the store's timeouts.
func TestFleetStoreFrozen(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	st, err := redisstore.New(redisstore.Config{Addr: srv.Addr, Prefix: "default", Timeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	up := peers.StartGoSDK(t, peers.GoSDKOpts{})
	sh := &countingShared{Shared: st}
	f := startFleet(t, 3, up.URL(), sh)
	cs := peers.GoSDKClient(t, f.url())
	for i := range 3 {
		peers.CallEcho(t, cs, "before "+strconv.Itoa(i))
	}
	srv.Freeze()
	defer srv.Thaw()
	calls := sh.calls.Load()
	for i := range 6 {
		peers.CallEcho(t, cs, "store frozen "+strconv.Itoa(i))
	}
	if n := sh.calls.Load() - calls; n != 0 {
		t.Errorf("%d store calls for 6 healthy calls with the store frozen, want 0", n)
	}
	up.Restart()
	for i := range 6 {
		start := time.Now()
		peers.CallEcho(t, cs, "store frozen, upstream restarted "+strconv.Itoa(i))
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("call %d took %v with the store frozen", i, d)
		}
	}
	if n := up.Inits(); n < 2 || n > 4 {
		t.Fatalf("%d upstream initializes; want the agent's and at most one heal per replica;%s%s", n, f.initsByReplica(), initRequests(up))
	}
	f.check()
}

// TestFleetLeaseHolderDied: a process took the lease on the session's next
// generation and died before recording a session. The fleet waits out the
// lease (leaseTTL), not the whole heal budget, then heals.
func TestFleetLeaseHolderDied(t *testing.T) {
	t.Parallel()
	sh := &countingShared{Shared: session.NewMemShared()}
	up := peers.StartGoSDK(t, peers.GoSDKOpts{})
	f := startFleet(t, 2, up.URL(), sh)
	cs := peers.GoSDKClient(t, f.url())
	peers.CallEcho(t, cs, "before")
	if ok, _ := sh.Lead(context.Background(), session.ClientID(cs.ID()), 1, heal.LeaseTTL); !ok {
		t.Fatal("could not take the lease")
	}
	up.Restart()
	start := time.Now()
	peers.CallEcho(t, cs, "after the dead leader's lease")
	if d := time.Since(start); d < heal.LeaseTTL-500*time.Millisecond || d > heal.LeaseTTL+2*time.Second {
		t.Errorf("the call took %v; want about leaseTTL (%v)", d, heal.LeaseTTL)
	}
	if n := up.Inits(); n != 2 {
		t.Errorf("%d upstream initializes, want 2", n)
	}
	f.check()
}

// TestFleetHeldSession: a 2026-07-28 agent (go-sdk 1.8 as it comes) of a
// session-era upstream, through three replicas with one store. Each
// replica holds its own upstream session for it (the upstream allows one
// GET stream per session, and each replica's listens need one: a listen
// on either of two replicas gets its resource updates); a replica
// restarted in place (kill -9) takes over its predecessor's from the
// store, with no upstream initialize; an upstream restart costs one heal
// per replica. Every call runs once. The held id never opens from an
// agent's Mcp-Session-Id.
func TestFleetHeldSession(t *testing.T) {
	t.Parallel()
	sharedKinds(t, func(t *testing.T, sh *countingShared, _ *redistest.Server) {
		up := peers.StartGoSDK(t, peers.GoSDKOpts{State: true})
		f := startFleet(t, 3, up.URL(), sh)
		cs := peers.GoSDK2026Client(t, f.url(), nil)
		if cs.ID() != "" {
			t.Fatalf("the agent holds session %q: it did not speak 2026-07-28", cs.ID())
		}
		calls := 0
		echo := func(what string, n int) {
			t.Helper()
			for i := range n {
				peers.CallEcho(t, cs, what+" "+strconv.Itoa(i))
				calls++
			}
		}
		echo("spread", 6)
		for i := range f.procs {
			if n := f.lb.served[i].Load(); n < 2 {
				t.Fatalf("replica %d served %d requests; the balancer did not spread them", i, n)
			}
		}
		if n := up.Inits(); n != 3 {
			t.Fatalf("%d upstream initializes for one agent on three replicas, want 3 (one each);%s", n, f.initsByReplica())
		}
		for i := range f.procs {
			f.restart(i)
		}
		echo("all restarted", 6)
		if n := up.Inits(); n != 3 {
			t.Fatalf("%d upstream initializes after every replica restarted, want still 3: each takes over its predecessor's;%s", n, f.initsByReplica())
		}

		up.Restart()
		echo("after the upstream restart", 6)
		if n := up.Inits(); n != 6 {
			t.Fatalf("%d upstream initializes after one upstream restart, want 6 (one heal per replica);%s%s", n, f.initsByReplica(), initRequests(up))
		}
		if n := up.ToolCalls("echo"); n != int64(calls) {
			t.Fatalf("echo ran %d times for %d calls", n, calls)
		}

		// The held id, known to the process, opens nothing from outside.
		var held session.ClientID
		for _, sess := range f.procs[0].s.sessions.Store.Sessions() {
			held = sess.ID
		}
		if held == "" || held[0] != heal.HeldPrefix {
			t.Fatalf("replica 0 holds %q, want a held session", held)
		}
		req, _ := http.NewRequest(http.MethodPost, f.replica(0), strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Mcp-Session-Id", string(held))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Fatalf("a request naming the held session's id got %d, want 404", resp.StatusCode)
		}

		// One client on two replicas: each listen gets the update.
		var n0, n1 heldCounts
		ctx, cancel := context.WithTimeout(context.Background(), peers.Timeout)
		defer cancel()
		for i, n := range []*heldCounts{&n0, &n1} {
			c := peers.GoSDK2026Client(t, f.replica(i), heldClientOpts(n))
			if err := c.Subscribe(ctx, &mcp.SubscribeParams{URI: peers.ResourceURI}); err != nil {
				t.Fatalf("subscribe on replica %d: %v", i, err)
			}
		}
		nudge(t, "resources/updated through a listen on each of two replicas", func() { up.UpdateResource(peers.ResourceURI) },
			func() bool { return n0.updates.Load() > 0 && n1.updates.Load() > 0 })
		f.check()
	})
}

// TestStoppedReplicaLeavesSessions: a replica stopped gracefully (SIGTERM:
// an upgrade, a scale-down) DELETEs none of the upstream sessions it
// holds; they belong to the fleet. The other replica serves the session
// on, with its state (the log level set through the stopped one), without
// an initialize, and so does the replica restarted. It DELETEd them all:
// live upstream sessions 2 → 0, every agent's state lost.
func TestStoppedReplicaLeavesSessions(t *testing.T) {
	t.Parallel()
	sharedKinds(t, func(t *testing.T, sh *countingShared, _ *redistest.Server) {
		up := peers.StartGoSDK(t, peers.GoSDKOpts{State: true})
		f := startFleet(t, 2, up.URL(), sh)
		a, b := f.replica(0), f.replica(1)
		sid := peers.RawInitialize(t, a)
		if resp, body := peers.RawPost(t, a, sid, `{"jsonrpc":"2.0","id":2,"method":"logging/setLevel","params":{"level":"debug"}}`); resp.StatusCode != http.StatusOK {
			t.Fatalf("setLevel: %d %s", resp.StatusCode, body)
		}
		inits := up.Inits()

		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := f.procs[0].s.Shutdown(ctx); err != nil {
			t.Fatal(err)
		}
		f.procs[0].kill() // the process exits
		for _, r := range up.Requests() {
			if r.HTTPMethod == http.MethodDelete {
				t.Fatalf("the stopped replica DELETEd upstream session %s", r.SessionID)
			}
		}
		resp, body := peers.RawPost(t, b, sid, `{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"log","arguments":{"level":"debug","text":"still-debug"}}}`)
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "still-debug") {
			t.Fatalf("the other replica, on the session: %d %s; want the debug message the session's level lets through", resp.StatusCode, body)
		}
		f.procs[0] = f.start(strings.TrimSuffix(strings.TrimPrefix(a, "http://"), "/mcp"))
		if resp, body := peers.RawPost(t, a, sid, `{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"echo","arguments":{"text":"back"}}}`); resp.StatusCode != http.StatusOK {
			t.Fatalf("the restarted replica: %d %s", resp.StatusCode, body)
		}
		if n := up.Inits() - inits; n != 0 {
			t.Errorf("%d upstream initializes after the stop, want 0:%s", n, f.initsByReplica())
		}
		f.check()
	})
}
