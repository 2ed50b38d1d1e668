package proxy

// Fault-injection tests for upstream care (docs/healing.md "Keeping upstream
// healthy"): a real go-sdk upstream, a peers.TCPRelay between it and the proxy
// playing the middlebox, real agents.
//
// These tests do not run in parallel: each one ends with a goroutine census
// (peers.CheckGoroutines), which is only exact while no other test runs. Go runs
// every sequential test of the package before releasing the parallel ones,
// so the census sees this test's goroutines only.

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"

	"github.com/mcpheal/mcpheal/proxy/internal/conf"
	"github.com/mcpheal/mcpheal/proxy/internal/link"
	"github.com/mcpheal/mcpheal/proxy/internal/obs"
	"github.com/mcpheal/mcpheal/proxy/internal/peers"
	"github.com/mcpheal/mcpheal/proxy/internal/wire"
)

// TestResetIdleConnectionRetriedFresh: a middlebox that dropped an idle flow
// answers the proxy's next request on it with a reset. Nothing was delivered,
// so the proxy sends the request again on a fresh connection: an agent that
// idles past the middlebox's limit between calls never notices.
func TestResetIdleConnectionRetriedFresh(t *testing.T) {
	peers.CheckGoroutines(t)
	up := peers.StartGoSDK(t, peers.GoSDKOpts{})
	rl := peers.NewTCPRelay(t, up.Addr())
	rl.ResetIdle(time.Second)
	s, url := startProxy(t, rl.URL(), nil)
	cs := peers.GoSDKClient(t, url)

	start := time.Now()
	peers.CallEcho(t, cs, "warm")
	base := time.Since(start)
	var worst time.Duration
	for round := 1; round <= 3; round++ {
		time.Sleep(2 * time.Second) // past the relay's 1 s and upstream.staleIdle
		start := time.Now()
		// Rounds 1 and 3 idle into a replay-safe tools/list: it meets the
		// reset and is sent again fresh. Round 2 idles into echo, which is
		// not replay-safe: it never goes on the doubtful connection.
		if round != 2 {
			if _, err := cs.ListTools(context.Background(), nil); err != nil {
				t.Fatalf("round %d: ListTools: %v", round, err)
			}
		}
		peers.CallEcho(t, cs, "round "+strconv.Itoa(round))
		took := time.Since(start)
		if took > base+time.Second {
			t.Errorf("round %d took %v, more than a second over the first call's %v", round, took, base)
		}
		worst = max(worst, took-base)
	}
	if n := rl.Resets(); n < 2 {
		t.Fatalf("the relay reset %d connections, want at least one per tools/list round (2): the fault never happened", n)
	}
	if n := up.ToolCalls("echo"); n != 4 {
		t.Errorf("upstream ran echo %d times, want 4: a reset request must never be delivered twice or lost", n)
	}
	if n := up.Inits(); n != 1 {
		t.Errorf("upstream initializes = %d, want 1: a dead socket is not a dead session", n)
	}
	if st := s.Stats(); st.Heals != 0 || st.UpstreamDown != 0 {
		t.Errorf("stats %+v: want no heal and no 503", st)
	}
	noPanics(t, s)
	t.Logf("first call %v; worst extra latency after a reset %v; %d resets", base, worst, rl.Resets())
}

// TestBlackholedConnectionNeverReused: a middlebox that forgets an idle flow
// silently swallows whatever is sent on it. The proxy cannot tell that from a
// slow tool: a request sent into the hole gets no answer until the response
// deadline, and a tools/call may then have run, so it is not replayed (see
// TestBlackholeReplayableRetriedAfterDeadline). What keeps agents safe is
// that pooled connections close after MaxIdleConn, below the middlebox's idle
// limit (30 s by default, against the usual 60–350 s): no request ever goes
// into a forgotten flow. Scaled down here: relay 600 ms, MaxIdleConn 200 ms.
func TestBlackholedConnectionNeverReused(t *testing.T) {
	peers.CheckGoroutines(t)
	const healTimeout = 2 * time.Second
	up := peers.StartGoSDK(t, peers.GoSDKOpts{})
	rl := peers.NewTCPRelay(t, up.Addr())
	rl.Blackhole(600 * time.Millisecond)
	s, url := startProxy(t, rl.URL(), func(c *conf.Config) {
		c.MaxIdleConn = 200 * time.Millisecond
		c.HealTimeout = healTimeout
	})
	cs := peers.GoSDKClient(t, url)
	peers.CallEcho(t, cs, "before")
	dialed := rl.Accepted()
	time.Sleep(time.Second) // every pooled connection is now past the relay's limit

	start := time.Now()
	peers.CallEcho(t, cs, "after")
	took := time.Since(start)
	if took > healTimeout {
		t.Errorf("call after idling took %v, want within heal_timeout %v", took, healTimeout)
	}
	if n := rl.Holes(); n != 0 {
		t.Errorf("the proxy sent bytes into %d flows idle past the middlebox's limit, want none (MaxIdleConn below it)", n)
	}
	if rl.Accepted() == dialed {
		t.Errorf("no new upstream connection for the call after idling: a stale one was reused")
	}
	noPanics(t, s)
	t.Logf("call after idling past the blackhole limit: %v", took)
}

// TestBlackholeReplayableRetriedAfterDeadline: when a pooled connection idles
// into a blackhole anyway (MaxIdleConn above the middlebox's limit), the
// response deadline bounds the damage: a replay-safe request (ping) is sent
// again on a fresh connection and succeeds within heal_timeout, while a
// tools/call, which may have run for all the proxy knows, is answered -32011
// rather than risk running twice.
func TestBlackholeReplayableRetriedAfterDeadline(t *testing.T) {
	peers.CheckGoroutines(t)
	const (
		respTimeout = 300 * time.Millisecond
		healTimeout = 2 * time.Second
	)
	up := peers.StartGoSDK(t, peers.GoSDKOpts{})
	rl := peers.NewTCPRelay(t, up.Addr())
	rl.Blackhole(500 * time.Millisecond)
	s, url := startProxy(t, rl.URL(), func(c *conf.Config) {
		c.ResponseTimeout = respTimeout
		c.HealTimeout = healTimeout
		// The era check after an outage would take the pooled connection
		// this test sends into the hole.
		c.EraBridge = "off"
	})
	sid := peers.RawInitialize(t, url)
	ping := `{"jsonrpc":"2.0","id":"ping-1","method":"ping"}`
	if resp, body := peers.RawPost(t, url, sid, ping); resp.StatusCode != http.StatusOK || !rpcAnswer(body).Get("result").Exists() {
		t.Fatalf("ping: %d %q", resp.StatusCode, body)
	}

	time.Sleep(700 * time.Millisecond) // the pooled connection idles into the hole
	start := time.Now()
	resp, body := peers.RawPost(t, url, sid, ping)
	took := time.Since(start)
	if resp.StatusCode != http.StatusOK || !rpcAnswer(body).Get("result").Exists() {
		t.Fatalf("ping after idling: %d %q, want 200 with a result", resp.StatusCode, body)
	}
	if rl.Holes() == 0 || took < respTimeout {
		t.Fatalf("ping took %v with %d blackholed flows: the request never met the hole", took, rl.Holes())
	}
	if took > healTimeout {
		t.Errorf("ping took %v, want within heal_timeout %v", took, healTimeout)
	}

	time.Sleep(700 * time.Millisecond)
	resp, body = peers.RawPost(t, url, sid, echoBody("blackholed"))
	if code, _, _ := rpcError(t, []byte(rpcAnswer(body).Raw)); resp.StatusCode != http.StatusOK || code != wire.CodeMaybeExecuted {
		t.Errorf("tools/call into a blackhole: %d %q, want 200 with error %d", resp.StatusCode, body, wire.CodeMaybeExecuted)
	}
	if n := up.ToolCalls("echo"); n != 0 {
		t.Errorf("upstream ran echo %d times, want 0", n)
	}
	noPanics(t, s)
	t.Logf("ping through a blackholed pooled connection: %v (response timeout %v)", took, respTimeout)
}

// TestStreamedToolsListKeepsConnection: a tools/list answered as an SSE
// stream reaches the agent whole, without a panic in the stream writer, and
// its upstream connection goes back to the pool (found by the blackhole
// test: learnTools drained and released the stream with Response.Body).
func TestStreamedToolsListKeepsConnection(t *testing.T) {
	peers.CheckGoroutines(t)
	up := peers.StartGoSDK(t, peers.GoSDKOpts{})
	rl := peers.NewTCPRelay(t, up.Addr())
	s, url := startProxy(t, rl.URL(), nil)
	sid := peers.RawInitialize(t, url)
	list := `{"jsonrpc":"2.0","id":"list-1","method":"tools/list"}`
	conns := rl.Accepted()
	for i := range 3 {
		resp, body := peers.RawPost(t, url, sid, list)
		if n := len(rpcAnswer(body).Get("result.tools").Array()); resp.StatusCode != http.StatusOK || n != 4 {
			t.Fatalf("tools/list %d: %d, %d tools, body %q; want 200 and 4 tools", i, resp.StatusCode, n, body)
		}
	}
	noPanics(t, s)
	if n := rl.Accepted() - conns; n != 0 {
		t.Errorf("%d new upstream connections for 3 sequential tools/list, want 0 (kept alive and reused)", n)
	}
}

// TestKeepaliveLeavesGoneSessions: the upstream expires quiet sessions
// before the keepalive comes round; the keepalive ping finds the session
// gone and leaves it: nothing is re-created for an agent that may have
// left (a server with a session cap would hold it against one that is
// there). The agent's next call heals it, with one upstream initialize,
// and gets its answer.
//
// The agent is raw HTTP: a go-sdk client's standalone GET stream ends with
// the upstream session, and the proxy's stream reopen would heal it.
func TestKeepaliveLeavesGoneSessions(t *testing.T) {
	peers.CheckGoroutines(t)
	up := peers.StartGoSDK(t, peers.GoSDKOpts{SessionTimeout: 600 * time.Millisecond})
	s, url := startProxy(t, up.URL(), func(c *conf.Config) { c.Keepalive = 900 * time.Millisecond })
	sid := peers.RawInitialize(t, url)
	first := lastUpstreamID(t, up)
	rawEcho(t, url, sid, "before")

	peers.Wait(t, "a keepalive that finds the session gone", func() bool { return s.count.Keepalive[obs.KeepaliveGone].Load() >= 1 })
	if n := up.Inits(); n != 1 {
		t.Errorf("upstream initializes before the agent's next call = %d, want 1 (the agent's own)", n)
	}
	rawEcho(t, url, sid, "after")
	if n := up.Inits(); n != 2 {
		t.Errorf("upstream initializes after the agent's next call = %d, want 2 (its heal)", n)
	}
	if n := s.count.Heals[obs.ReasonSessionGone][obs.OutcomeOK].Load(); n != 1 {
		t.Errorf("heals = %d, want 1 (the agent's call)", n)
	}
	if n := s.count.Keepalive[obs.KeepaliveFailed].Load(); n != 0 {
		t.Errorf("failed keepalives = %d, want 0", n)
	}
	var probed bool
	for _, r := range up.Requests() {
		if r.SessionID == first && r.RPCMethod == "ping" {
			probed = strings.HasPrefix(string(r.RPCID), `"mcpheal-keepalive-`)
			if !probed {
				t.Errorf("keepalive ping id %s, want a proxy-namespaced string id", r.RPCID)
			}
		}
	}
	if !probed {
		t.Errorf("no keepalive ping reached the expired upstream session")
	}
	noPanics(t, s)
}

// TestKeepaliveKeepsSessionAlive: with keepalive shorter than the upstream's
// idle timeout, a session left quiet for several timeouts keeps its upstream
// session: no heal, one initialize, one upstream session id throughout.
func TestKeepaliveKeepsSessionAlive(t *testing.T) {
	peers.CheckGoroutines(t)
	// A wide ratio (10×), so that a loaded machine stalling a ping by a
	// few hundred milliseconds does not expire the session.
	const timeout = time.Second
	up := peers.StartGoSDK(t, peers.GoSDKOpts{SessionTimeout: timeout})
	s, url := startProxy(t, up.URL(), func(c *conf.Config) { c.Keepalive = 100 * time.Millisecond })
	cs := peers.GoSDKClient(t, url)
	peers.CallEcho(t, cs, "first")
	time.Sleep(3 * timeout)
	peers.CallEcho(t, cs, "last")

	ids := map[string]int{}
	for _, r := range up.Requests() {
		if r.SessionID != "" {
			ids[r.SessionID]++
		}
	}
	if len(ids) != 1 || up.Inits() != 1 {
		t.Errorf("upstream session ids %v and %d initializes, want one id and 1 initialize", ids, up.Inits())
	}
	if n := s.count.Keepalive[obs.KeepaliveOK].Load(); n < 3 {
		t.Errorf("%d keepalive pings answered over %v of quiet, want ≥ 3", n, 3*timeout)
	}
	if n := s.count.Keepalive[obs.KeepaliveFailed].Load() + s.count.Keepalive[obs.KeepaliveGone].Load(); n != 0 {
		t.Errorf("%d keepalives failed or healed, want 0", n)
	}
	if st := s.Stats(); st.Heals != 0 {
		t.Errorf("heals = %d, want 0", st.Heals)
	}
	noPanics(t, s)
}

// TestBreakerFailsFastAndProbesOncePerCooldown: the upstream host dies for
// good. After the breaker's threshold (5 infrastructure failures over at
// least 5 s, the defaults) agents get mcpheal's error at once (HTTP 200,
// agentStatus), with Retry-After and a JSON-RPC error naming the upstream; one probe per cooldown reaches the
// upstream, and the cooldown grows. When the upstream is back, the first
// call after the cooldown heals the session and succeeds.
func TestBreakerFailsFastAndProbesOncePerCooldown(t *testing.T) {
	peers.CheckGoroutines(t)
	const name = "care-upstream"
	up := peers.StartGoSDK(t, peers.GoSDKOpts{})
	rl := peers.NewTCPRelay(t, up.Addr())
	s, url := startProxy(t, rl.URL(), func(c *conf.Config) {
		c.Name = name
		c.Keepalive = -1 // no background probe: every upstream attempt is an agent's
		c.HealTimeout = time.Second
	})
	hc := careClient(t)
	sid := peers.RawInitialize(t, url)
	if a := carePost(t, hc, url, sid, echoBody("up")); rpcText(a.body) != "up" {
		t.Fatalf("echo before the outage: %d %q", a.status, a.body)
	}

	// The host dies, and the one that replaces it has no sessions.
	rl.Down()
	up.Restart()
	downAt := time.Now()
	var openAt time.Time
	for openAt.IsZero() {
		if time.Since(downAt) > 10*time.Second {
			t.Fatalf("breaker still %v after 10 s of failures", upstreamState(s))
		}
		a := carePost(t, hc, url, sid, echoBody("down"))
		switch {
		case a.breakerOpen():
			openAt = time.Now()
		case a.status == http.StatusOK && rpcText(a.body) == "down":
			t.Fatalf("echo succeeded while the upstream was down")
		default:
			time.Sleep(100 * time.Millisecond)
		}
	}
	if el := openAt.Sub(downAt); el < 5*time.Second {
		t.Errorf("breaker opened %v after the first failure, want ≥ 5 s (MinStreak)", el)
	}

	// Open: fail fast; half-open: one probe. The first probe finds the
	// upstream still down; then it comes back, and the next probe heals.
	var fast []time.Duration
	var back, successAt time.Time
	inits := up.Inits()
	refused := rl.Refused()
	for successAt.IsZero() {
		if time.Since(openAt) > 8*time.Second {
			t.Fatalf("no successful call %v after the breaker opened (state %v)", time.Since(openAt), upstreamState(s))
		}
		start, conns := time.Now(), rl.Accepted()
		a := carePost(t, hc, url, sid, echoBody("probe"))
		probe := rl.Accepted() != conns
		switch {
		case a.breakerOpen():
			if err := a.checkBreakerAnswer(name); err != "" {
				t.Fatalf("while open: %s", err)
			}
			if !probe { // a probe that failed early ends in a 503 too, after its try
				fast = append(fast, a.took)
			}
		case a.status == http.StatusOK && rpcText(a.body) == "probe":
			if back.IsZero() {
				t.Fatalf("echo succeeded while the upstream was down")
			}
			successAt = start
		default: // a probe's failure while still down
		}
		if back.IsZero() && rl.Refused() > refused {
			rl.Pass()
			back = time.Now()
		}
		if len(fast) > 30 { // the first 30 back to back, then at an agent's pace
			time.Sleep(20 * time.Millisecond)
		}
	}

	// Every upstream connection attempt since the breaker opened, until the
	// successful call started: exactly one probe per cooldown.
	var last time.Time
	var after []peers.RelayAttempt
	for _, at := range rl.Attempts() {
		switch {
		case at.At.Before(openAt):
			last = at.At // the failure that opened it
		case at.At.Before(successAt):
			after = append(after, at)
		}
	}
	if len(after) != 1 || !after[0].Refused {
		t.Fatalf("upstream connection attempts during the first two cooldowns: %+v, want exactly one (the failed probe)", after)
	}
	probe1 := after[0].At
	var probe2 time.Time
	for _, at := range rl.Attempts() {
		if !at.At.Before(successAt) {
			probe2 = at.At
			break
		}
	}
	// Cooldowns are 1 s then 2 s, ±20 % jitter; allow a little clock slack.
	if gap := probe1.Sub(last); gap < 750*time.Millisecond {
		t.Errorf("first probe %v after the breaker opened, want ≥ 800 ms (first cooldown)", gap)
	}
	if gap := probe2.Sub(probe1); gap < 1500*time.Millisecond {
		t.Errorf("second probe %v after the first, want ≥ 1.6 s (doubled cooldown)", gap)
	}
	if n := up.Inits() - inits; n != 1 {
		t.Errorf("%d upstream initializes for the recovery, want 1 (one heal)", n)
	}
	if st := upstreamState(s); st != "closed" {
		t.Errorf("breaker %s after a successful call, want closed", st)
	}

	noPanics(t, s)
	if len(fast) < 30 {
		t.Fatalf("only %d fail-fast answers measured", len(fast))
	}
	// A fail-fast answer should take < 5 ms. On a shared 2-core machine a single
	// answer can stall for 100+ ms (measured under load 8), so: the median
	// within 5 ms, nine in ten within a generous 50 ms. An answer that
	// waited on the upstream (a dial, a 10 ms backoff) fails both.
	slices.Sort(fast)
	median, p90, worst := fast[len(fast)/2], fast[len(fast)*9/10], fast[len(fast)-1]
	if median > 5*time.Millisecond {
		t.Errorf("fail-fast median %v, want < 5 ms", median)
	}
	if p90 > 50*time.Millisecond {
		t.Errorf("fail-fast 90th percentile %v, want < 50 ms (a generous bound for this machine)", p90)
	}
	t.Logf("opened %v after the outage; %d fail-fast answers: median %v, p90 %v, max %v; probes at +%v and +%v (one attempt per cooldown); recovered %v after the upstream came back",
		openAt.Sub(downAt).Round(time.Millisecond), len(fast), median, p90, worst,
		probe1.Sub(last).Round(time.Millisecond), probe2.Sub(probe1).Round(time.Millisecond),
		successAt.Sub(back).Round(time.Millisecond))
}

// TestSessionTTLDeletesUpstream: a client session idle past session_ttl is
// dropped, and its upstream session DELETEd; one in use outlives the TTL.
func TestSessionTTLDeletesUpstream(t *testing.T) {
	peers.CheckGoroutines(t)
	const ttl = time.Second
	up := peers.StartGoSDK(t, peers.GoSDKOpts{})
	s, url := startProxy(t, up.URL(), func(c *conf.Config) { c.SessionTTL = ttl })
	sid := peers.RawInitialize(t, url)
	upID := lastUpstreamID(t, up)
	for range 8 { // 2 s of use, twice the TTL
		time.Sleep(ttl / 4)
		rawEcho(t, url, sid, "in use")
	}
	idleFrom := time.Now()
	peers.Wait(t, "the upstream DELETE of the expired session", func() bool {
		for _, r := range up.Requests() {
			if r.HTTPMethod == http.MethodDelete && r.SessionID == upID {
				return true
			}
		}
		return false
	})
	idle := time.Since(idleFrom)
	if idle < ttl-50*time.Millisecond || idle > ttl+time.Second {
		t.Errorf("upstream DELETE after %v idle, want just past the TTL %v", idle, ttl)
	}
	if n := s.Stats().Sessions; n != 0 {
		t.Errorf("%d sessions left, want 0", n)
	}
	// The expired session's sealed id still opens: it comes back, on a new
	// upstream session, at its next use.
	inits := up.Inits()
	resp, body := peers.RawPost(t, url, sid, `{"jsonrpc":"2.0","id":9,"method":"ping"}`)
	if resp.StatusCode != http.StatusOK || !rpcAnswer(body).Get("result").Exists() {
		t.Errorf("expired session's next use: %d %q, want it restored", resp.StatusCode, body)
	}
	if n := up.Inits() - inits; n != 1 {
		t.Errorf("%d upstream initializes for the restore, want 1", n)
	}
	noPanics(t, s)
	t.Logf("upstream DELETE %v after the last use (ttl %v)", idle.Round(time.Millisecond), ttl)
}

// TestShutdownDeletesUpstreamSessions: Shutdown ends every upstream session
// the proxy holds before it returns.
func TestShutdownDeletesUpstreamSessions(t *testing.T) {
	peers.CheckGoroutines(t)
	up := peers.StartGoSDK(t, peers.GoSDKOpts{})
	s, url := startProxy(t, up.URL(), nil)
	var ids []string
	for range 3 {
		peers.RawInitialize(t, url)
		ids = append(ids, lastUpstreamID(t, up))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	took := time.Since(start)
	deleted := map[string]bool{}
	for _, r := range up.Requests() {
		if r.HTTPMethod == http.MethodDelete {
			deleted[r.SessionID] = true
		}
	}
	for _, id := range ids {
		if !deleted[id] {
			t.Errorf("upstream session %s not DELETEd by Shutdown (DELETEs seen: %v)", id, deleted)
		}
	}
	if took > 2*time.Second {
		t.Errorf("Shutdown took %v with a healthy upstream, want < 2 s", took)
	}
	noPanics(t, s)
	t.Logf("Shutdown DELETEd %d upstream sessions in %v", len(ids), took)
}

// TestShutdownBoundedWhenUpstreamHangs: Shutdown's DELETEs are bounded by a
// few seconds of the proxy's own, even with no deadline from the caller and
// an upstream that swallows every request.
func TestShutdownBoundedWhenUpstreamHangs(t *testing.T) {
	peers.CheckGoroutines(t)
	up := peers.StartGoSDK(t, peers.GoSDKOpts{})
	rl := peers.NewTCPRelay(t, up.Addr())
	s, url := startProxy(t, rl.URL(), nil)
	peers.RawInitialize(t, url)
	peers.RawInitialize(t, url)
	rl.Blackhole(0)
	start := time.Now()
	_ = s.Shutdown(context.Background())
	took := time.Since(start)
	if took > 4500*time.Millisecond {
		t.Errorf("Shutdown took %v against a hung upstream, want a few seconds at most (3 s)", took)
	}
	if rl.Holes() == 0 {
		t.Errorf("no DELETE reached the hung upstream: the bound was not exercised")
	}
	t.Logf("Shutdown against a hung upstream returned after %v", took)
}

// ---------------------------------------------------------------------------
// helpers

// careClient is an agent's HTTP client with keep-alive, so that measured
// latencies are the proxy's, not connection setup.
func careClient(t testing.TB) *http.Client {
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: peers.Timeout}
}

// careAnswer is one answer to carePost.
type careAnswer struct {
	status int
	header http.Header
	body   []byte
	took   time.Duration
}

// carePost POSTs a JSON-RPC message on a session, as peers.RawPost does, with
// client hc, and times the exchange.
func carePost(t testing.TB, hc *http.Client, url, sid, body string) careAnswer {
	t.Helper()
	req := peers.PostRequest(t, url, sid, body)
	start := time.Now()
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("POST %s: read body: %v", url, err)
	}
	return careAnswer{status: resp.StatusCode, header: resp.Header, body: b, took: time.Since(start)}
}

// breakerOpen reports whether a is the proxy's fail-fast answer.
func (a careAnswer) breakerOpen() bool {
	e := rpcAnswer(a.body)
	return a.status == http.StatusOK && e.Get("error.code").Int() == wire.CodeUpstreamDown &&
		strings.Contains(e.Get("error.message").Str, "circuit breaker open")
}

// checkBreakerAnswer describes what is wrong with a fail-fast answer, or "".
func (a careAnswer) checkBreakerAnswer(upstream string) string {
	ra, err := strconv.Atoi(a.header.Get("Retry-After"))
	if err != nil || ra < 1 || ra > 60 {
		return fmt.Sprintf("Retry-After %q, want 1..60 seconds", a.header.Get("Retry-After"))
	}
	if msg := rpcAnswer(a.body).Get("error.message").Str; !strings.Contains(msg, upstream) {
		return fmt.Sprintf("error message %q does not name the upstream %q", msg, upstream)
	}
	if id := rpcAnswer(a.body).Get("id"); !id.Exists() || id.Type == gjson.Null {
		return fmt.Sprintf("answer %s lost the request id", a.body)
	}
	return ""
}

var careSeq atomic.Int64

// echoBody is a tools/call of the go-sdk peer's echo tool with a fresh id.
func echoBody(text string) string {
	return fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"echo","arguments":{"text":%q}}}`,
		careSeq.Add(1), text)
}

// rawEcho calls echo on a session with peers.RawPost and fails the test unless
// text comes back.
func rawEcho(t testing.TB, url, sid, text string) {
	t.Helper()
	resp, body := peers.RawPost(t, url, sid, echoBody(text))
	if resp.StatusCode != http.StatusOK || rpcText(body) != text {
		t.Fatalf("echo(%q): %d %q", text, resp.StatusCode, body)
	}
}

// rpcAnswer returns the JSON-RPC answer in a JSON or SSE body.
func rpcAnswer(body []byte) gjson.Result {
	if len(body) > 0 && body[0] != '{' {
		body = findResponse(body)
	}
	return gjson.ParseBytes(body)
}

// rpcText returns the text of a tools/call answer's first content.
func rpcText(body []byte) string {
	return rpcAnswer(body).Get("result.content.0.text").Str
}

// lastUpstreamID returns the upstream session id of the newest session a
// peer saw initialized (its notifications/initialized).
func lastUpstreamID(t testing.TB, p *peers.Server) string {
	t.Helper()
	reqs := p.Requests()
	for i := len(reqs) - 1; i >= 0; i-- {
		if reqs[i].RPCMethod == "notifications/initialized" && reqs[i].SessionID != "" {
			return reqs[i].SessionID
		}
	}
	t.Fatal("the upstream saw no session initialized")
	return ""
}

// noPanics fails t if the proxy recovered from a panic.
func noPanics(t testing.TB, s *Server) {
	t.Helper()
	if n := s.Stats().Panics; n != 0 {
		t.Errorf("the proxy recovered from %d panics (see its log)", n)
	}
}

// upstreamState names the proxy's breaker state.
func upstreamState(s *Server) string { return s.link.Breaker.State().String() }

// TestRetryAfter: a busy upstream's Retry-After is read as seconds or an
// HTTP date, at most a minute, 1 s when it says nothing usable. A number
// too large for a Duration once multiplied (2^63-1, 18446744074) is a
// minute: before, it wrapped to −1 s and 0.29 s, and the request went
// again at once.
func TestRetryAfter(t *testing.T) {
	now := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		value string
		want  time.Duration
	}{
		{"", time.Second},
		{"0", 0},
		{"7", 7 * time.Second},
		{" 30 ", 30 * time.Second},
		{"61", time.Minute},
		{"9223372036854775807", time.Minute},
		{"18446744074", time.Minute},
		{"18446744073709551616", time.Minute},
		{"99999999999999999999999999", time.Minute},
		{"-5", time.Second},
		{"soon", time.Second},
		{"Fri, 27 Nov 2026 12:00:20 GMT", 20 * time.Second},
		{"Fri, 27 Nov 2026 11:00:00 GMT", 0},
		{"Sat, 28 Nov 2026 12:00:00 GMT", time.Minute},
	} {
		var h fasthttp.ResponseHeader
		if tc.value != "" {
			h.Set("Retry-After", tc.value)
		}
		if got := link.RetryAfter(&h, now); got != tc.want {
			t.Errorf("retryAfter(%q) = %v, want %v", tc.value, got, tc.want)
		}
	}
}
