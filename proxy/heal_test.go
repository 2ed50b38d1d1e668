package proxy

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/mcpheal/mcpheal/proxy/internal/conf"
	"github.com/mcpheal/mcpheal/proxy/internal/peers"
	"github.com/mcpheal/mcpheal/proxy/internal/wire"
	"github.com/mcpheal/mcpheal/upstream"
)

// TestHealGoSDKExpiry: the upstream expires the session (Go SDK
// SessionTimeout); the agent's next call succeeds on a new upstream session.
func TestHealGoSDKExpiry(t *testing.T) {
	t.Parallel()
	up := peers.StartGoSDK(t, peers.GoSDKOpts{SessionTimeout: 300 * time.Millisecond})
	s, url := startProxy(t, up.URL(), nil)
	cs := peers.GoSDKClient(t, url)
	peers.CallEcho(t, cs, "before")
	time.Sleep(700 * time.Millisecond) // idle past the upstream's SessionTimeout
	peers.CallEcho(t, cs, "after")
	// The client's GET stream is held open across the expiry: the proxy
	// re-creates the session for it as soon as the stream dies (so server
	// notifications keep flowing), possibly more than once while idle.
	if got, heals := up.Inits(), s.Stats().Heals; got < 2 || heals < 1 || uint64(got) != heals+1 {
		t.Fatalf("upstream initializes = %d, heals = %d; want one initialize per heal plus the first", got, heals)
	}
}

// TestHealGoSDKRestart: the upstream process restarts (all sessions lost);
// the agent's calls keep succeeding.
func TestHealGoSDKRestart(t *testing.T) {
	t.Parallel()
	up := peers.StartGoSDK(t, peers.GoSDKOpts{})
	_, url := startProxy(t, up.URL(), nil)
	cs := peers.GoSDKClient(t, url)
	for i := range 3 {
		peers.CallEcho(t, cs, "round")
		up.Restart()
		_ = i
	}
	peers.CallEcho(t, cs, "last")
}

// TestHealRestartWhileDown: the upstream is down for a while when the call
// comes; within the heal budget the call waits and succeeds.
func TestHealRestartWhileDown(t *testing.T) {
	t.Parallel()
	up := peers.StartGoSDK(t, peers.GoSDKOpts{})
	_, url := startProxy(t, up.URL(), nil)
	cs := peers.GoSDKClient(t, url)
	peers.CallEcho(t, cs, "before")
	up.Stop()
	go func() {
		time.Sleep(400 * time.Millisecond)
		up.Start()
	}()
	start := time.Now()
	peers.CallEcho(t, cs, "during")
	if el := time.Since(start); el < 300*time.Millisecond {
		t.Fatalf("call took %v although the upstream was down for 400ms", el)
	}
}

// TestHealMCPGoStateful: mcp-go WithStateful(true) answers 404 "Invalid
// session ID" once it forgets the session; the agent does not notice.
func TestHealMCPGoStateful(t *testing.T) {
	t.Parallel()
	up := peers.StartMCPGo(t, true)
	_, url := startProxy(t, up.URL(), nil)
	c := peers.McpGoClient(t, url)
	peers.McpGoCallEcho(t, c, "one")
	up.ExpireSessions()
	peers.McpGoCallEcho(t, c, "two")
	up.Restart()
	peers.McpGoCallEcho(t, c, "three")
	if got := up.Inits(); got != 3 {
		t.Fatalf("upstream initializes = %d, want 3", got)
	}
}

// TestHealDialects: servers that say "session gone" with 400 (TS example
// template) or with HTTP 200 and a JSON-RPC error (WordPress), bare or SSE.
func TestHealDialects(t *testing.T) {
	t.Parallel()
	for _, d := range []peers.Dialect{peers.DialectTS400, peers.DialectWP200, peers.DialectSSE200} {
		t.Run(d.String(), func(t *testing.T) {
			t.Parallel()
			up := peers.StartDialect(t, d)
			_, url := startProxy(t, up.URL(), nil)
			sid := peers.RawInitialize(t, url)
			call := `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"echo","arguments":{"text":"dialect"}}}`
			peers.RawPost(t, url, sid, call)
			up.ExpireSessions()
			resp, body := peers.RawPost(t, url, sid, call)
			if resp.StatusCode != 200 || !strings.Contains(string(body), `"dialect"`) || strings.Contains(string(body), "expired") {
				t.Fatalf("after expiry: %d %q", resp.StatusCode, body)
			}
			if got := up.Inits(); got != 2 {
				t.Fatalf("upstream initializes = %d, want 2", got)
			}
			if resp.Header.Get("Mcp-Session-Id") != sid {
				t.Fatalf("session id changed to %q", resp.Header.Get("Mcp-Session-Id"))
			}
		})
	}
}

// TestHealConcurrentOneInit: 50 concurrent calls on one dead session cause
// exactly one upstream initialize, and all succeed.
func TestHealConcurrentOneInit(t *testing.T) {
	t.Parallel()
	up := peers.StartGoSDK(t, peers.GoSDKOpts{})
	s, url := startProxy(t, up.URL(), nil)
	cs := peers.GoSDKClient(t, url)
	peers.CallEcho(t, cs, "warm")
	up.ExpireSessions()
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := peers.GoSDKCall(t, cs, "echo", map[string]any{"text": "c"})
			if err != nil || peers.ResultText(res) != "c" {
				t.Errorf("call %d: %v %v", i, peers.ResultText(res), err)
			}
		}()
	}
	wg.Wait()
	if got := up.Inits(); got != 2 {
		t.Fatalf("upstream initializes = %d, want 2 (exactly one heal)", got)
	}
	if st := s.Stats(); st.Heals != 1 {
		t.Fatalf("heals = %d, want 1", st.Heals)
	}
}

// TestNoReplayAmbiguousToolCall: the upstream dies after reading a
// non-idempotent tools/call. It ran once; the agent gets an error saying it
// may or may not have run, and the session still works afterwards.
func TestNoReplayAmbiguousToolCall(t *testing.T) {
	t.Parallel()
	up := peers.StartGoSDK(t, peers.GoSDKOpts{})
	s, url := startProxy(t, up.URL(), nil)
	cs := peers.GoSDKClient(t, url)
	peers.CallEcho(t, cs, "warm")
	up.KillOnCounter.Store(true)
	_, err := peers.GoSDKCall(t, cs, "counter", map[string]any{})
	if err == nil || !strings.Contains(err.Error(), "may or may not have run") {
		t.Fatalf("counter after crash: err = %v, want 'may or may not have run'", err)
	}
	if got := up.Counter(); got != 1 {
		t.Fatalf("counter ran %d times, want exactly 1", got)
	}
	if s.Stats().ReplaysRefused != 1 {
		t.Fatalf("replays refused = %d, want 1", s.Stats().ReplaysRefused)
	}
	peers.CallEcho(t, cs, "still alive") // heals onto the restarted server
	if got := up.Counter(); got != 1 {
		t.Fatalf("counter = %d after the next call, want 1", got)
	}
}

// TestReplayReadOnlyToolCall: the same crash during a tool the upstream
// annotated readOnlyHint: the proxy heals and replays, and the call succeeds.
func TestReplayReadOnlyToolCall(t *testing.T) {
	t.Parallel()
	up := peers.StartGoSDK(t, peers.GoSDKOpts{})
	_, url := startProxy(t, up.URL(), nil)
	cs := peers.GoSDKClient(t, url)
	if _, err := cs.ListTools(context.Background(), nil); err != nil { // the proxy learns the annotations
		t.Fatal(err)
	}
	up.KillOnCounter.Store(true)
	res, err := peers.GoSDKCall(t, cs, "ro_counter", map[string]any{})
	if err != nil {
		t.Fatalf("ro_counter after crash: %v", err)
	}
	if got := up.Counter(); got != 2 || peers.ResultText(res) != "2" {
		t.Fatalf("counter = %d, result %q; want 2 runs (replayed) and result 2", got, peers.ResultText(res))
	}
}

// TestUpstreamDownPastBudget: an upstream down for longer than the heal
// budget gives 503 with Retry-After and a JSON-RPC error carrying the id;
// the session stays valid and heals once the upstream is back.
func TestUpstreamDownPastBudget(t *testing.T) {
	t.Parallel()
	up := peers.StartGoSDK(t, peers.GoSDKOpts{})
	_, url := startProxy(t, up.URL(), func(c *conf.Config) { c.HealTimeout = 300 * time.Millisecond })
	sid := peers.RawInitialize(t, url)
	up.Stop()
	start := time.Now()
	resp, body := peers.RawPost(t, url, sid, `{"jsonrpc":"2.0","id":"d-1","method":"tools/list"}`)
	el := time.Since(start)
	code, _, id := rpcError(t, body)
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Retry-After") == "" ||
		code != wire.CodeUpstreamDown || id != `"d-1"` {
		t.Fatalf("upstream down: %d Retry-After %q %s", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
	if el < 200*time.Millisecond || el > 2*time.Second {
		t.Fatalf("503 after %v, want about the 300ms budget", el)
	}
	up.Start()
	resp, body = peers.RawPost(t, url, sid, `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`)
	if resp.StatusCode != 200 || !strings.Contains(string(body), "echo") {
		t.Fatalf("after the upstream came back: %d %q", resp.StatusCode, body)
	}
}

// TestRecipeRefused: after a restart the upstream negotiates another
// protocol version than the session's; the proxy does not hand the agent a
// session it did not negotiate, it answers 404 so that the agent's SDK
// starts over, and the agent's fresh initialize works.
func TestRecipeRefused(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	version, epoch := "2025-06-18", 1
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		v, e := version, epoch
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		switch m := gjson.GetBytes(body, "method").Str; {
		case m == "initialize":
			w.Header().Set("Mcp-Session-Id", fmt.Sprintf("s-%d", e))
			fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":{"protocolVersion":%q,"capabilities":{},"serverInfo":{"name":"v","version":"1"}}}`,
				gjson.GetBytes(body, "id").Raw, v)
		case r.Header.Get("Mcp-Session-Id") != fmt.Sprintf("s-%d", e):
			http.Error(w, "session not found", http.StatusNotFound)
		case m == "notifications/initialized":
			w.WriteHeader(http.StatusAccepted)
		default:
			fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":{}}`, gjson.GetBytes(body, "id").Raw)
		}
	}))
	t.Cleanup(srv.Close)
	_, url := startProxy(t, srv.URL+"/mcp", nil)
	sid := peers.RawInitialize(t, url)
	mu.Lock()
	version, epoch = "2025-03-26", 2 // "restart" with another version
	mu.Unlock()
	resp, body := peers.RawPost(t, url, sid, `{"jsonrpc":"2.0","id":3,"method":"ping"}`)
	if code, _, id := rpcError(t, body); resp.StatusCode != http.StatusNotFound || code != wire.CodeSessionNotFound || id != "3" {
		t.Fatalf("recipe refused: %d %s; want 404 Session not found with id 3", resp.StatusCode, body)
	}
	resp, _ = peers.RawPost(t, url, sid, `{"jsonrpc":"2.0","id":4,"method":"ping"}`)
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("the refused session still answers %d", resp.StatusCode)
	}
	sid2 := peers.RawInitialize(t, url)
	if resp, body := peers.RawPost(t, url, sid2, `{"jsonrpc":"2.0","id":5,"method":"ping"}`); resp.StatusCode != 200 {
		t.Fatalf("fresh session: %d %q", resp.StatusCode, body)
	}
}

// TestOutageOneRetryPerSession: calls on one session pile up while the
// upstream is down. When it is back, one of them finds the session gone and
// heals it; the others go once, on the new session: the restarted upstream
// sees the dead session id on one tools/call, not on every waiting one, and
// exactly one initialize.
func TestOutageOneRetryPerSession(t *testing.T) {
	t.Parallel()
	up := peers.StartGoSDK(t, peers.GoSDKOpts{})
	s, url := startProxy(t, up.URL(), nil)
	cs := peers.GoSDKClient(t, url)
	peers.CallEcho(t, cs, "warm")
	dead := lastUpstreamID(t, up)
	inits := up.Inits()
	up.Stop()
	const n = 20
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			text := fmt.Sprint("call-", i)
			res, err := peers.GoSDKCall(t, cs, "echo", map[string]any{"text": text})
			if err != nil || peers.ResultText(res) != text {
				t.Errorf("call %d: %q, %v", i, peers.ResultText(res), err)
			}
		}()
	}
	// Every call waits: one probes the outage, the others wait for it
	// (a call not yet refused when the upstream came back would send the
	// dead session id on its own).
	sess := s.sessions.Store.Sessions()[0]
	if !waitFor(peers.Timeout, func() bool { return sess.ProbeWaiters() >= n-1 }) {
		t.Fatalf("%d calls wait on the outage's probe; want %d (and one probing)", sess.ProbeWaiters(), n-1)
	}
	before := len(up.Requests())
	start := time.Now()
	up.Start()
	// When the first request reaches the restarted upstream says when
	// mcpheal noticed it; how long the 20 calls then take depends on the
	// machine's load.
	for len(up.Requests()) == before && time.Since(start) < 5*time.Second {
		time.Sleep(time.Millisecond)
	}
	noticed := time.Since(start)
	wg.Wait()
	onDead := 0
	for _, r := range up.Requests()[before:] {
		if r.RPCMethod == "tools/call" && r.SessionID == dead {
			onDead++
		}
	}
	if onDead != 1 {
		t.Errorf("tools/call with the dead session id after the restart = %d, want 1", onDead)
	}
	if got := up.Inits() - inits; got != 1 {
		t.Errorf("initializes after the restart = %d, want 1", got)
	}
	if noticed > 250*time.Millisecond {
		t.Errorf("the first request reached the upstream %v after it came back; the outage watcher should notice within ~10 ms, not at the probe's next backoff step (~570 ms)", noticed)
	}
}

// TestRedeployWaitedOut: the upstream is gone for a redeploy shorter than
// heal_timeout, long enough for the circuit breaker to open. Every call the
// agent makes meanwhile, before and after the breaker opened, waits for the
// upstream and gets its answer (a refused connection sent nothing: latency,
// not errors), and each tool runs once. An outage older than heal_timeout
// is not waited out: a call then gets mcpheal's error at once. Before, the
// calls after the breaker opened failed at once, and the first waited its
// 15 s budget out and failed.
func TestRedeployWaitedOut(t *testing.T) {
	t.Parallel()
	const window = 3 * time.Second
	up := peers.StartGoSDK(t, peers.GoSDKOpts{})
	s, url := startProxy(t, up.URL(), func(c *conf.Config) {
		c.HealTimeout = window
		c.Keepalive = -1
		c.Breaker = upstream.BreakerConfig{Threshold: 3, MinStreak: 200 * time.Millisecond}
	})
	cs := peers.GoSDKClient(t, url)
	peers.CallEcho(t, cs, "warm")
	up.Stop()
	var wg sync.WaitGroup
	var calls atomic.Int64
	call := func(i int) {
		defer wg.Done()
		calls.Add(1)
		text := fmt.Sprint("redeploy-", i)
		res, err := peers.GoSDKCall(t, cs, "echo", map[string]any{"text": text})
		if err != nil || peers.ResultText(res) != text {
			t.Errorf("call %d during the redeploy: %q, %v; want its answer", i, peers.ResultText(res), err)
		}
	}
	wg.Add(1)
	go call(0)
	if !waitFor(window, func() bool { return upstreamState(s) == "open" }) {
		t.Fatalf("breaker %s during the outage; want open", upstreamState(s))
	}
	for i := 1; i <= 5; i++ { // while the breaker is open
		wg.Add(1)
		go call(i)
	}
	if !waitFor(window, func() bool { return s.inflight.Load() >= 6 }) {
		t.Fatalf("%d requests in flight; want the 6 calls waiting", s.inflight.Load())
	}
	up.Start()
	wg.Wait()
	if n := up.ToolCalls("echo"); n != 1+calls.Load() {
		t.Errorf("echo ran %d times for %d calls, want once each", n, 1+calls.Load())
	}

	// Past the window: fail fast, with the upstream's name and Retry-After.
	up.Stop()
	callAfter := time.Now()
	for upstreamState(s) != "open" || time.Since(callAfter) < window {
		_, _ = peers.GoSDKCall(t, cs, "echo", map[string]any{"text": "down"})
		if time.Since(callAfter) > 4*window {
			t.Fatalf("breaker %s %v into the outage", upstreamState(s), time.Since(callAfter))
		}
	}
	start := time.Now()
	_, err := peers.GoSDKCall(t, cs, "echo", map[string]any{"text": "late"})
	if took := time.Since(start); err == nil || took > time.Second {
		t.Errorf("a call %v into an outage of %v budget: %v after %v; want mcpheal's error at once", time.Since(callAfter), window, err, took)
	}
}
