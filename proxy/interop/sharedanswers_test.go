//go:build unix

package interop

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/redis/go-redis/v9"

	"github.com/mcpheal/mcpheal/session/redisstore/redistest"
)

// Answers shared by a fleet (docs/streams.md "Across replicas"): two
// mcpheal binaries share a real redis-server behind the round-robin
// balancer, and real clients resume a call's answer on their own after
// their connection to it dropped. The work tool is not replay-safe; every
// test counts its runs server-side.

// mcphealBuild is the mcpheal binary, built once for the run.
var mcphealBuild struct {
	once sync.Once
	dir  string
	err  error
}

// mcphealBinary builds cmd mcpheal, once, and returns its path.
func mcphealBinary(t testing.TB) string {
	t.Helper()
	mcphealBuild.once.Do(func() {
		dir, err := os.MkdirTemp("", "mcpheal-interop-")
		if err != nil {
			mcphealBuild.err = err
			return
		}
		mcphealBuild.dir = dir
		gobin, err := exec.LookPath("go")
		if err != nil {
			gobin = filepath.Join(runtime.GOROOT(), "bin", "go")
		}
		out, err := exec.Command(gobin, "build", "-o", filepath.Join(dir, "mcpheal"), "github.com/mcpheal/mcpheal").CombinedOutput()
		if err != nil {
			mcphealBuild.err = fmt.Errorf("go build mcpheal: %v\n%s", err, out)
		}
	})
	if mcphealBuild.err != nil {
		t.Fatal(mcphealBuild.err)
	}
	return filepath.Join(mcphealBuild.dir, "mcpheal")
}

// removeMcphealBinary removes what mcphealBinary built (TestMain).
func removeMcphealBinary() {
	if mcphealBuild.dir != "" {
		_ = os.RemoveAll(mcphealBuild.dir)
	}
}

// replica is one mcpheal process of a fleet.
type replica struct {
	addr, admin string
	cmd         *exec.Cmd
	out         *tail
	exited      chan struct{}
}

// startReplica runs the mcpheal binary on addr in front of upstream, with
// the session key ring keys and the Redis at redisAddr as its session
// store; cleanup kills it.
func startReplica(t *testing.T, addr, upstream, keys, redisAddr string) *replica {
	t.Helper()
	p := &replica{addr: addr, admin: "127.0.0.1:" + strconv.Itoa(freeFixedPort(t)), out: &tail{max: 64 << 10}, exited: make(chan struct{})}
	p.cmd = exec.Command(mcphealBinary(t), "--upstream", upstream, "--listen", addr, "--admin-listen", p.admin,
		"--log-format", "json", "--log-level", "debug", "--session-store", "redis", "--redis-addr", redisAddr)
	p.cmd.Env = append(os.Environ(), "MCPHEAL_SESSION_KEYS="+keys)
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		_ = p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			t.Logf("mcpheal %s log:\n%s", addr, p.out.String())
		}
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		if resp, err := http.Get("http://" + p.admin + "/healthz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return p
			}
		}
		select {
		case <-p.exited:
			t.Fatalf("mcpheal on %s exited at start:\n%s", addr, p.out.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("mcpheal on %s not healthy within 10 s:\n%s", addr, p.out.String())
		}
	}
}

// kill is SIGKILL: no drain, no last write to Redis, connections reset by
// the kernel.
func (p *replica) kill() {
	_ = p.cmd.Process.Kill()
	<-p.exited
}

// shared returns the replica's mcpheal_shared_answers_total by result.
func (p *replica) shared(t *testing.T) map[string]int {
	t.Helper()
	resp, err := http.Get("http://" + p.admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	m := map[string]int{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		l := sc.Text()
		if !strings.HasPrefix(l, "mcpheal_shared_answers_total{") {
			continue
		}
		i := strings.Index(l, `result="`)
		j := strings.LastIndexByte(l, ' ')
		if i < 0 || j < 0 {
			continue
		}
		name := l[i+len(`result="`):]
		name = name[:strings.IndexByte(name, '"')]
		v, _ := strconv.ParseFloat(l[j+1:], 64)
		m[name] = int(v)
	}
	return m
}

// fleet is two replicas sharing a real redis-server behind a balancer
// that sends every tools/call to replica 0 (the one a test kills or
// expects to relay the answer) and each resumption (a GET with
// Last-Event-ID) to replica 1; the rest goes round robin.
type fleet struct {
	rs       *redistest.Server
	rdb      *redis.Client
	replicas []*replica
	lb       *balancer
}

func startFleet(t *testing.T, upstream string) *fleet {
	t.Helper()
	f := &fleet{rs: redistest.Start(t)}
	f.rdb = redis.NewClient(&redis.Options{Addr: f.rs.Addr})
	t.Cleanup(func() { f.rdb.Close() })
	keys := keyRing(t)
	var addrs []string
	for range 2 {
		addr := "127.0.0.1:" + strconv.Itoa(freeFixedPort(t))
		f.replicas = append(f.replicas, startReplica(t, addr, upstream, keys, f.rs.Addr))
		addrs = append(addrs, addr)
	}
	f.lb = startBalancer(t, addrs)
	f.lb.pick = func(r *http.Request, body []byte) int {
		switch {
		case r.Method == http.MethodPost && bytes.Contains(body, []byte(`"tools/call"`)):
			return 0
		case r.Method == http.MethodGet && r.Header.Get("Last-Event-ID") != "":
			return 1
		}
		return -1
	}
	return f
}

// waitLogged waits until the shared store holds at least one event of an
// answer: the relaying replica has written it (answers wait shareLinger
// before their first write).
func (f *fleet) waitLogged(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		keys, err := f.rdb.Keys(context.Background(), "*:a:m*:e").Result()
		if err == nil {
			for _, k := range keys {
				if n, _ := f.rdb.XLen(context.Background(), k).Result(); n > 0 {
					return
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no answer event in the shared store within 10 s (keys %v, err %v)", keys, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// resumed reports the resumptions replica i served.
func (f *fleet) resumed(i int) int {
	return f.lb.servedBy(i, func(r balanced) bool { return r.method == http.MethodGet && r.lastEventID != "" })
}

// sharedClients are the clients of these tests: they all resume a
// dropped answer on their own, with GET and Last-Event-ID.
var sharedClients = []string{"ts-sdk-v1", "ts-sdk-v2", "mcp-remote", "go-sdk"}

// newSharedAgent is newAgent, with the Go SDK client besides (in the
// session era: a 2026-07-28 agent takes the held route, whose answers
// have no Last-Event-ID to resume).
func newSharedAgent(t *testing.T, flavour, url, name string) agent {
	t.Helper()
	if flavour == "go-sdk" {
		return &goResumer{t: t, url: url, name: name}
	}
	return newAgent(t, flavour, url, name)
}

// TestAnswerResumedOnAnotherReplica: the agent's connection drops right
// after the first event of a not-replay-safe call (a TypeScript SDK v1
// server that keeps no events: nothing but mcpheal can give the rest), and
// its resumption reaches the other replica. Every client gets the result
// from the shared log, and the tool ran once. Before answers were shared,
// the other replica gave it an empty stream.
func TestAnswerResumedOnAnotherReplica(t *testing.T) {
	t.Parallel()
	for _, flavour := range sharedClients {
		t.Run(flavour, func(t *testing.T) {
			t.Parallel()
			countFile := filepath.Join(t.TempDir(), "work.count")
			srv := startV1Server(t, v1Opts{countFile: countFile})
			f := startFleet(t, srv.url())
			cut := startCutRelay(t, "http://"+f.lb.addr+"/mcp")
			a := newSharedAgent(t, flavour, cut.url, "shared-"+flavour)
			if r := a.connect(); !r.OK {
				t.Fatalf("connect: %v", r)
			}
			tag := "other-" + flavour
			cut.after("work " + tag + " started")
			r := a.call("work", map[string]any{"tag": tag, "ms": 500, "notify": true})
			if n := cut.cuts.Load(); n != 1 {
				t.Fatalf("the relay cut %d connections, want 1 (call: %v)", n, r)
			}
			if !r.OK || r.TextHead != "done "+tag {
				t.Errorf("call resumed on the other replica: %v, text %q; want the tool's result", r, r.TextHead)
			}
			if n := runs(countFile, tag); n != 1 {
				t.Errorf("the work tool ran %d times, want exactly 1", n)
			}
			if n := f.resumed(1); n < 1 {
				t.Errorf("replica 1 served %d resumptions, want at least 1", n)
			}
			if n := f.replicas[1].shared(t)["served"]; n < 1 {
				t.Errorf("replica 1 served %d resumptions from the shared log, want at least 1", n)
			}
		})
	}
}

// TestAnswerReplicaLost: the replica relaying a not-replay-safe call is
// killed (SIGKILL) after the call's first event reached the agent and the
// shared log. The agent's resumption reaches the other replica, which
// takes the answer over once the lost replica's lease runs out: from a
// server that keeps events (the TypeScript SDK v1 server with its
// InMemoryEventStore, the Go SDK server with a MemoryEventStore) it asks
// for the rest with the server's last event id and the agent gets the
// result; from one that keeps none, -32011 saying why. The tool runs once
// either way: nothing is sent again.
func TestAnswerReplicaLost(t *testing.T) {
	t.Parallel()
	servers := []struct {
		name   string
		events bool
		start  func(t *testing.T) (url string, runs func(tag string) int)
	}{
		{"ts-v1-server/event-store", true, func(t *testing.T) (string, func(string) int) {
			countFile := filepath.Join(t.TempDir(), "work.count")
			return startV1Server(t, v1Opts{countFile: countFile, eventStore: true}).url(), func(tag string) int { return runs(countFile, tag) }
		}},
		{"ts-v1-server/no-event-store", false, func(t *testing.T) (string, func(string) int) {
			countFile := filepath.Join(t.TempDir(), "work.count")
			return startV1Server(t, v1Opts{countFile: countFile}).url(), func(tag string) int { return runs(countFile, tag) }
		}},
		{"go-sdk-server/event-store", true, startGoWorkServer},
	}
	for _, sv := range servers {
		for _, flavour := range []string{"ts-sdk-v1", "ts-sdk-v2", "go-sdk"} {
			t.Run(sv.name+"/"+flavour, func(t *testing.T) {
				t.Parallel()
				url, ran := sv.start(t)
				f := startFleet(t, url)
				tap := startCutRelay(t, "http://"+f.lb.addr+"/mcp")
				a := newSharedAgent(t, flavour, tap.url, "lost-"+flavour)
				if r := a.connect(); !r.OK {
					t.Fatalf("connect: %v", r)
				}
				tag := "lost-" + flavour
				started := tap.watch("work " + tag + " started")
				wait := a.callAsync("work", map[string]any{"tag": tag, "ms": 1500, "notify": true})
				select {
				case <-started:
				case <-time.After(opTimeout):
					t.Fatalf("the call's first event never reached the agent: %v", wait())
				}
				f.waitLogged(t)
				f.replicas[0].kill()
				r := wait()
				if n := ran(tag); n != 1 {
					t.Errorf("the work tool ran %d times, want exactly 1", n)
				}
				if sv.events {
					if !r.OK || r.TextHead != "done "+tag {
						t.Errorf("call whose replica was lost: %v, text %q; want the tool's result", r, r.TextHead)
					}
				} else if !r.hasCode(codeMayHaveRun) || !strings.Contains(r.Message, "replica relaying this answer was lost") {
					t.Errorf("call whose replica was lost, the server keeping no events: %v; want -32011 saying why", r)
				}
				if n := f.replicas[1].shared(t)["taken"]; n != 1 {
					t.Errorf("replica 1 took %d answers over, want 1", n)
				}
			})
		}
	}
}

// TestAnswerSharedRedisDown: Redis stops in the middle of a streamed
// answer. The answer reaches its agent in full, on time (the shared log is
// written beside the relay, never on its path), and a cut agent still
// resumes it on the replica that relays it; the replica says it fell back
// to its own log. Once Redis is back, answers are shared again: a
// resumption on the other replica gets its result.
func TestAnswerSharedRedisDown(t *testing.T) {
	t.Parallel()
	countFile := filepath.Join(t.TempDir(), "work.count")
	srv := startV1Server(t, v1Opts{countFile: countFile})
	f := startFleet(t, srv.url())
	f.lb.pick = func(r *http.Request, body []byte) int {
		if r.Method == http.MethodPost && bytes.Contains(body, []byte(`"tools/call"`)) {
			return 0
		}
		return -1
	}
	cut := startCutRelay(t, "http://"+f.lb.addr+"/mcp")
	a := newAgent(t, "ts-sdk-v1", cut.url, "redis-down")
	if r := a.connect(); !r.OK {
		t.Fatalf("connect: %v", r)
	}

	// Redis stops once the answer is in it: the answer goes on.
	// The tool sleeps 3 s: the answer's lease is renewed (written) at
	// least once while Redis is down.
	started := cut.watch("work down started")
	wait := a.callAsync("work", map[string]any{"tag": "down", "ms": 3000, "notify": true})
	<-started
	begun := time.Now()
	f.waitLogged(t)
	f.rs.Stop()
	if r := wait(); !r.OK || r.TextHead != "done down" {
		t.Fatalf("call while Redis stopped: %v, text %q", r, r.TextHead)
	}
	if d := time.Since(begun); d > 4500*time.Millisecond {
		t.Errorf("the answer came %v after its first event, its tool sleeping 3 s: the relay waited on Redis", d)
	}
	if n := f.replicas[0].shared(t)["fallback"]; n < 1 {
		t.Errorf("replica 0 reported %d answers fallen back to its own log, want at least 1", n)
	}

	// Cut mid-answer with Redis down: the resumption is served by replica
	// 0 from its own log (the balancer sends every request there now).
	// The call lasts past the 500 ms after which an answer that is not
	// shared has its agent's connection watched.
	f.lb.pick = func(*http.Request, []byte) int { return 0 }
	cut.after("work down-cut started")
	if r := a.call("work", map[string]any{"tag": "down-cut", "ms": 1000, "notify": true}); !r.OK || r.TextHead != "done down-cut" {
		t.Errorf("call cut while Redis is down, resumed on its replica: %v, text %q", r, r.TextHead)
	}

	// Redis is back: once the hold-off after the failure passed, answers
	// are shared again, and a resumption on the other replica works.
	f.rs.Restart()
	f.lb.pick = func(r *http.Request, body []byte) int {
		if r.Method == http.MethodGet && r.Header.Get("Last-Event-ID") != "" {
			return 1
		}
		return 0
	}
	written := f.replicas[0].shared(t)["written"]
	deadline := time.Now().Add(20 * time.Second)
	for i := 0; f.replicas[0].shared(t)["written"] == written; i++ {
		if time.Now().After(deadline) {
			t.Fatal("no answer shared within 20 s of Redis coming back")
		}
		if r := a.call("work", map[string]any{"tag": "probe-" + strconv.Itoa(i), "ms": 200, "notify": true}); !r.OK {
			t.Fatalf("call after Redis came back: %v", r)
		}
	}
	cut.after("work back started")
	if r := a.call("work", map[string]any{"tag": "back", "ms": 500, "notify": true}); !r.OK || r.TextHead != "done back" {
		t.Errorf("call cut after Redis came back, resumed on the other replica: %v, text %q", r, r.TextHead)
	}
	for _, tag := range []string{"down", "down-cut", "back"} {
		if n := runs(countFile, tag); n != 1 {
			t.Errorf("work %q ran %d times, want exactly 1", tag, n)
		}
	}
}

// startGoWorkServer is the Go SDK server with a MemoryEventStore and the
// work tool of testdata/v1server.mjs: it counts its runs, sends a
// progress notification "work <tag> started" when asked, sleeps ms, and
// answers "done <tag>".
func startGoWorkServer(t *testing.T) (string, func(tag string) int) {
	t.Helper()
	var mu sync.Mutex
	count := map[string]int{}
	srv := mcp.NewServer(&mcp.Implementation{Name: "go-work", Version: "1.0.0"}, nil)
	mcp.AddTool(srv, &mcp.Tool{Name: "work", Description: "not replay-safe"},
		func(ctx context.Context, req *mcp.CallToolRequest, in goWorkIn) (*mcp.CallToolResult, any, error) {
			mu.Lock()
			count[in.Tag]++
			mu.Unlock()
			if in.Notify {
				tok := req.Params.GetProgressToken()
				if tok == nil {
					tok = "work-" + in.Tag
				}
				_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: tok, Progress: 1,
					Message: "work " + in.Tag + " started"})
			}
			select {
			case <-time.After(time.Duration(in.Ms) * time.Millisecond):
			case <-ctx.Done():
				return nil, nil, ctx.Err()
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "done " + in.Tag}}}, nil, nil
		})
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv },
		&mcp.StreamableHTTPOptions{EventStore: mcp.NewMemoryEventStore(nil)})
	hs := httptest.NewServer(h)
	t.Cleanup(func() {
		hs.CloseClientConnections()
		hs.Close()
	})
	return hs.URL + "/mcp", func(tag string) int {
		mu.Lock()
		defer mu.Unlock()
		return count[tag]
	}
}

type goWorkIn struct {
	Tag    string `json:"tag"`
	Ms     int    `json:"ms,omitempty"`
	Notify bool   `json:"notify,omitempty"`
}

// goResumer is the Go SDK client as an agent in the session era
// (ProtocolVersion 2025-11-25), resuming a dropped answer on its own
// (goAgent, ownanswers_test.go, speaks 2026-07-28 and never retries).
type goResumer struct {
	t    *testing.T
	url  string
	name string
	cs   *mcp.ClientSession
}

func (g *goResumer) connect() result {
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	c := mcp.NewClient(&mcp.Implementation{Name: g.name, Version: "1.0.0"}, nil)
	cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: g.url}, &mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"})
	if err != nil {
		return goResult("connect", err)
	}
	g.cs = cs
	g.t.Cleanup(func() { _ = cs.Close() })
	return result{Op: "connect", OK: true}
}

func (g *goResumer) list() result {
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	res, err := g.cs.ListTools(ctx, nil)
	if err != nil {
		return goResult("list", err)
	}
	return result{Op: "list", OK: true, Count: len(res.Tools)}
}

func (g *goResumer) call(name string, args map[string]any) result { return g.callAsync(name, args)() }

func (g *goResumer) callAsync(name string, args map[string]any) func() result {
	done := make(chan result, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
		defer cancel()
		res, err := g.cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
		if err != nil {
			done <- goResult("call", err)
			return
		}
		r := result{Op: "call", OK: true, IsError: res.IsError}
		for _, c := range res.Content {
			if tc, ok := c.(*mcp.TextContent); ok {
				r.TextHead += tc.Text
			}
		}
		done <- r
	}()
	return func() result { return <-done }
}

var _ agent = (*goResumer)(nil)
