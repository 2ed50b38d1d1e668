package proxy

// An agent that goes away while its request waits on the upstream: the
// upstream exchange ends at once (it once ran on to response_timeout, 5
// min, for nobody), nothing is sent again, and agents that stay, pipeline
// or are merely slow are not mistaken for gone ones.

import (
	"bufio"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"

	"github.com/mcpheal/mcpheal/classify"
	"github.com/mcpheal/mcpheal/proxy/internal/conf"
	"github.com/mcpheal/mcpheal/proxy/internal/exchange"
	"github.com/mcpheal/mcpheal/proxy/internal/obs"
	"github.com/mcpheal/mcpheal/proxy/internal/peers"
)

// slowUpstream is a stub whose tools/call and resources/read run until
// release is closed or their request ends; every other method answers at
// once. It counts runs and notes when a run's request ended early.
type slowUpstream struct {
	url     string
	runs    atomic.Int64
	ended   chan time.Time // a run's request ended before its answer
	release chan struct{}
}

func startSlowUpstream(t *testing.T, sse bool) *slowUpstream {
	t.Helper()
	u := &slowUpstream{ended: make(chan time.Time, 8), release: make(chan struct{})}
	u.url = startStub(t, nil, func(w http.ResponseWriter, r *http.Request, method string) {
		if method != "tools/call" && method != "resources/read" {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"jsonrpc":"2.0","id":2,"result":{"resources":[]}}`)
			return
		}
		u.runs.Add(1)
		if sse { // the head at once, the answer when the tool is done (TS SDK)
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(http.StatusOK)
			_ = http.NewResponseController(w).Flush()
		}
		select {
		case <-r.Context().Done():
			u.ended <- time.Now()
			return
		case <-u.release:
		}
		const answer = `{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"done"}]}}`
		if sse {
			_, _ = io.WriteString(w, "event: message\ndata: "+answer+"\n\n")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, answer)
	})
	t.Cleanup(func() {
		select {
		case <-u.release:
		default:
			close(u.release)
		}
	})
	return u
}

// metricValue is the value of one of the server's single-series metrics
// as /metrics exposes it.
func metricValue(s *Server, name string) float64 {
	return testutil.ToFloat64(serverMetric{s, name})
}

type serverMetric struct {
	s    *Server
	name string
}

func (m serverMetric) Describe(chan<- *prometheus.Desc) {}

func (m serverMetric) Collect(ch chan<- prometheus.Metric) {
	all := make(chan prometheus.Metric)
	go func() {
		collectServer(all, m.s)
		close(all)
	}()
	for x := range all {
		if strings.Contains(x.Desc().String(), `"`+m.name+`"`) {
			ch <- x
		}
	}
}

// TestAgentGoneInterruptsUpstream: an agent that closes its connection
// 200 ms into a call ends the upstream's exchange within a second or two,
// whether the upstream had sent nothing yet or an SSE head; the tool ran
// once (a replay-safe method is not sent again either), nothing counts as
// an outage, it is counted in mcpheal_agent_gone_total, and other agents
// go on.
func TestAgentGoneInterruptsUpstream(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		sse  bool
		body string
	}{
		{"json tools/call", false, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"slow","arguments":{}}}`},
		{"sse tools/call", true, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"slow","arguments":{}}}`},
		{"json resources/read", false, `{"jsonrpc":"2.0","id":1,"method":"resources/read","params":{"uri":"file:///slow"}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			up := startSlowUpstream(t, tc.sse)
			s, url := startProxy(t, up.url, nil)
			sid := peers.RawInitialize(t, url)
			c, addr := dialAgent(t, url)
			if _, err := io.WriteString(c, rawRequest(addr, sid, tc.body)); err != nil {
				t.Fatal(err)
			}
			peers.Wait(t, "the call upstream", func() bool { return up.runs.Load() == 1 })
			time.Sleep(200 * time.Millisecond)
			closed := time.Now()
			_ = c.Close()
			select {
			case at := <-up.ended:
				d := at.Sub(closed)
				if d > 2*time.Second {
					t.Fatalf("the upstream saw its request end %v after the agent left, want under 2 s", d)
				}
				t.Logf("the upstream saw its request end %v after the agent left", d)
			case <-time.After(10 * time.Second):
				t.Fatal("the upstream's request still runs 10 s after the agent left")
			}
			peers.Wait(t, "the agent counted gone", func() bool { return s.Stats().AgentGone == 1 })
			if got := metricValue(s, "mcpheal_agent_gone_total"); got != 1 {
				t.Fatalf("mcpheal_agent_gone_total = %v, want 1", got)
			}
			// Another agent's session, and the same one, still work.
			other := peers.RawInitialize(t, url)
			for _, id := range []string{other, sid} {
				resp, raw := peers.RawPost(t, url, id, `{"jsonrpc":"2.0","id":2,"method":"resources/list"}`)
				if resp.StatusCode != http.StatusOK || !strings.Contains(string(raw), `"resources"`) {
					t.Fatalf("resources/list after the agent left: %d %s", resp.StatusCode, raw)
				}
			}
			if n := up.runs.Load(); n != 1 {
				t.Fatalf("the slow method ran %d times, want 1", n)
			}
			st := s.Stats()
			if st.UnsafeResends != 0 || st.Replays != 0 || st.UpstreamDown != 0 || s.breakerState() != 0 {
				t.Fatalf("stats %+v, breaker %d: an agent leaving is no outage and sends nothing again", st, s.breakerState())
			}
		})
	}
}

// TestAgentPipelinesWhileWaiting: an agent that sends its next request on
// the same connection while the first waits on the upstream (HTTP/1.1
// pipelining) is not taken for gone, and the watch takes none of its
// bytes: both answers arrive, in order.
func TestAgentPipelinesWhileWaiting(t *testing.T) {
	t.Parallel()
	up := startSlowUpstream(t, false)
	s, url := startProxy(t, up.url, nil)
	sid := peers.RawInitialize(t, url)
	c, addr := dialAgent(t, url)
	if _, err := io.WriteString(c, rawRequest(addr, sid, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"slow","arguments":{}}}`)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(exchange.WatchAfter + 300*time.Millisecond) // the watch peeks now
	if _, err := io.WriteString(c, rawRequest(addr, sid, `{"jsonrpc":"2.0","id":2,"method":"resources/list"}`)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	close(up.release)
	br := bufio.NewReader(c)
	_ = c.SetReadDeadline(time.Now().Add(peers.Timeout))
	for _, want := range []string{`"text":"done"`, `"resources"`} {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("answer with %s: %v", want, err)
		}
		raw, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(raw), want) {
			t.Fatalf("answer %d %s, want one with %s", resp.StatusCode, raw, want)
		}
	}
	if st := s.Stats(); st.AgentGone != 0 || up.runs.Load() != 1 {
		t.Fatalf("agent gone %d, runs %d; want 0 and 1", st.AgentGone, up.runs.Load())
	}
}

// TestSlowAnswerReachesAgent: an agent that waits past the watch's start
// gets its answer, and its keep-alive connection serves the next requests
// (the watch's wake-up deadline does not linger on it).
func TestSlowAnswerReachesAgent(t *testing.T) {
	t.Parallel()
	for _, sse := range []bool{false, true} {
		up := startSlowUpstream(t, sse)
		s, url := startProxy(t, up.url, nil)
		sid := peers.RawInitialize(t, url)
		c, addr := dialAgent(t, url)
		br := bufio.NewReader(c)
		read := func(want string) {
			t.Helper()
			_ = c.SetReadDeadline(time.Now().Add(peers.Timeout))
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("sse %v: answer with %s: %v", sse, want, err)
			}
			raw, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusOK || !strings.Contains(string(raw), want) {
				t.Fatalf("sse %v: answer %d %s, want one with %s", sse, resp.StatusCode, raw, want)
			}
		}
		start := time.Now()
		time.AfterFunc(1200*time.Millisecond, func() { close(up.release) })
		if _, err := io.WriteString(c, rawRequest(addr, sid, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"slow","arguments":{}}}`)); err != nil {
			t.Fatal(err)
		}
		read(`"text":"done"`)
		if d := time.Since(start); d < time.Second {
			t.Fatalf("sse %v: answered after %v; the upstream held it 1.2 s", sse, d)
		}
		for i := range 3 {
			time.Sleep(time.Duration(i) * 100 * time.Millisecond)
			if _, err := io.WriteString(c, rawRequest(addr, sid, `{"jsonrpc":"2.0","id":2,"method":"resources/list"}`)); err != nil {
				t.Fatal(err)
			}
			read(`"resources"`)
		}
		if n := s.Stats().AgentGone; n != 0 {
			t.Fatalf("sse %v: %d agents counted gone, want 0", sse, n)
		}
	}
}

// TestDecideAgentGone: whatever else is known of an exchange, a request
// whose agent has gone is abandoned: never healed, retried or refused with
// an answer nobody reads.
func TestDecideAgentGone(t *testing.T) {
	t.Parallel()
	for cls := range classify.Class(obs.NumClasses) {
		for _, bits := range []exchange.Facts{{}, {Dispatched: true}, {ReplaySafe: true}, {Session: true, MayHeal: true}, {TooLarge: true}} {
			f := bits
			f.Class, f.AgentGone = cls, true
			if got := exchange.Decide(f); got != exchange.ActAbandon {
				t.Errorf("decide(%+v) = %v, want %v", f, got, exchange.ActAbandon)
			}
		}
	}
}

// TestWatchForgetsGoneAgent: a pooled attempt whose agent went away does
// not carry that into its next request, even one on a connection it cannot
// watch (TLS, a RequestCtx made by Init): the fuzzer's next ping was once
// abandoned as "agent closed its connection".
func TestWatchForgetsGoneAgent(t *testing.T) {
	t.Parallel()
	w := exchange.NewAgentWatch()
	w.Gone.Store(true)
	if !w.Stop() {
		t.Fatal("stop after the agent left = false, want true")
	}
	w.Gone.Store(true) // set late, after stop: arm must still start clean
	w.Arm(nil, nil)    // no socket: not watched
	if w.Gone.Load() || w.Stop() {
		t.Fatal("the next request, not watched, inherits the last agent's departure")
	}
}

// TestPooledWatchStartsClean: an attempt's watch goes back to the pool
// with it; whatever its last user left (an agent that left, and no
// unwatch: the answer drain once forgot it), the next attempt watches
// nobody and takes no agent for gone (a held session's initialize, which
// has no agent connection, once failed with "the agent closed its
// connection").
func TestPooledWatchStartsClean(t *testing.T) {
	s, err := New(conf.Config{Upstream: "http://127.0.0.1:9/mcp", Listen: "127.0.0.1:0"}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	r := &exchange.Request{}
	a := exchange.NewAttempt(s.env, nil, r)
	w := a.Watch
	w.Gone.Store(true)
	a.Release()
	for range 100 {
		b := exchange.NewAttempt(s.env, nil, r)
		same, gone := b.Watch == w, b.AgentGone()
		b.Release()
		if gone {
			t.Fatalf("a new attempt (its watch the last one's: %v) takes its agent for gone", same)
		}
		if same {
			return
		}
	}
}
