package proxy

// The memory budget and JSON answers: counted from their first byte as
// they are read, and until the agent has taken them. Five concurrent
// chunked 100 MB answers once peaked at ~260-290 MB RSS uncounted (each
// read up to max_answer), and an answer waiting for a slow agent was
// uncounted once the handler returned.

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/mcpheal/mcpheal/proxy/internal/conf"
	"github.com/mcpheal/mcpheal/proxy/internal/peers"
	"github.com/mcpheal/mcpheal/proxy/internal/wire"
)

// chunkedUpstream answers tools/call with a chunked JSON answer of size
// bytes, written in 64 KiB pieces; it stops after stallAt bytes until
// release is closed.
type chunkedUpstream struct {
	url     string
	runs    atomic.Int64
	release chan struct{}
}

func startChunkedUpstream(t *testing.T, size, stallAt int) *chunkedUpstream {
	t.Helper()
	u := &chunkedUpstream{release: make(chan struct{})}
	const head, tail = `{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"`, `"}]}}`
	text := strings.Repeat("x", size-len(head)-len(tail))
	body := head + text + tail
	u.url = startStub(t, nil, func(w http.ResponseWriter, r *http.Request, method string) {
		if method != "tools/call" {
			w.WriteHeader(http.StatusAccepted)
			return
		}
		u.runs.Add(1)
		w.Header().Set("Content-Type", "application/json")
		rc := http.NewResponseController(w)
		for i := 0; i < len(body); i += 64 << 10 {
			if i == stallAt {
				select {
				case <-u.release:
				case <-r.Context().Done():
					return
				}
			}
			if _, err := io.WriteString(w, body[i:min(i+64<<10, len(body))]); err != nil {
				return
			}
			_ = rc.Flush()
		}
	})
	t.Cleanup(func() { u.open() })
	return u
}

// open lets every answer finish.
func (u *chunkedUpstream) open() {
	select {
	case <-u.release:
	default:
		close(u.release)
	}
}

// TestJSONAnswerChargedWhileRead: a chunked JSON answer counts against the
// memory budget (twice its bytes) while mcpheal reads it, not only once it
// is whole, and the charge comes back when the agent has it.
func TestJSONAnswerChargedWhileRead(t *testing.T) {
	t.Parallel()
	up := startChunkedUpstream(t, 3<<20, 2<<20)
	s, url := startProxy(t, up.url, nil)
	sid := peers.RawInitialize(t, url)
	base := s.mem.Used.Load()
	done := make(chan []byte, 1)
	go func() {
		resp, err := peers.RawClient.Do(peers.PostRequest(t, url, sid, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"big","arguments":{}}}`))
		if err != nil {
			done <- nil
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		done <- b
	}()
	peers.Wait(t, "the partial answer charged", func() bool { return s.mem.Used.Load()-base >= 4<<20 })
	up.open()
	if b := <-done; len(b) != 3<<20 {
		t.Fatalf("the agent got %d bytes, want the whole 3 MiB answer", len(b))
	}
	peers.Wait(t, "the charge given back", func() bool { return s.mem.Used.Load() == base })
}

// TestJSONAnswersPastBudget: concurrent chunked answers that would pass the
// budget between them are refused as they are read, with 503 -32017 naming
// memory_budget, before any of them is whole; none is replayed (although
// --replay-tool names it), and none counts as an outage.
func TestJSONAnswersPastBudget(t *testing.T) {
	t.Parallel()
	const calls = 5
	up := startChunkedUpstream(t, 4<<20, 2<<20)
	s, url := startProxy(t, up.url, func(c *conf.Config) {
		c.MemoryBudget = 16 << 20 // room for 4 stalled answers at most (2 MiB read, 4 MiB charged each)
		c.ReplayTools = []string{"big"}
	})
	sid := peers.RawInitialize(t, url)
	base := s.mem.Used.Load()
	type answer struct {
		status int
		raw    []byte
	}
	answers := make(chan answer, calls)
	var wg sync.WaitGroup
	for range calls {
		wg.Go(func() {
			resp, err := peers.RawClient.Do(peers.PostRequest(t, url, sid, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"big","arguments":{}}}`))
			if err != nil {
				answers <- answer{}
				return
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			answers <- answer{resp.StatusCode, b}
		})
	}
	// While every answer is stalled, one at least is refused already.
	first := <-answers
	if code, msg, _ := rpcError(t, first.raw); first.status != http.StatusOK || code != wire.CodeBudget ||
		!strings.Contains(msg, "memory_budget") {
		t.Fatalf("first answer while all stall: %d %.200s; want 200 -32017 naming memory_budget", first.status, first.raw)
	}
	if used := s.mem.Used.Load(); used > 16<<20 {
		t.Fatalf("budget used %d, past its limit", used)
	}
	up.open()
	wg.Wait()
	close(answers)
	for a := range answers {
		code, _, _ := rpcError(t, a.raw)
		if !(a.status == http.StatusOK && len(a.raw) == 4<<20) && !(a.status == http.StatusOK && code == wire.CodeBudget) {
			t.Fatalf("answer %d %.200s; want the whole answer or 200 -32017", a.status, a.raw)
		}
	}
	if n := up.runs.Load(); n != calls {
		t.Fatalf("the tool ran %d times for %d calls, want no replay", n, calls)
	}
	if st := s.Stats(); st.Replays != 0 || st.UpstreamDown != 0 || s.breakerState() != 0 {
		t.Fatalf("stats %+v, breaker %d: an answer past the budget is no outage", st, s.breakerState())
	}
	peers.Wait(t, "the charges given back", func() bool { return s.mem.Used.Load() == base })
}

// TestSlowAgentAnswerCharged: an answer waiting for an agent that does not
// read stays counted after the handler returns, until write_timeout lets
// it go.
func TestSlowAgentAnswerCharged(t *testing.T) {
	t.Parallel()
	const size = 16 << 20
	up := startChunkedUpstream(t, size, -1)
	s, url := startProxy(t, up.url, func(c *conf.Config) { c.WriteTimeout = 2 * time.Second })
	sid := peers.RawInitialize(t, url)
	base := s.mem.Used.Load()
	c, addr := dialAgent(t, url)
	_ = c.(*net.TCPConn).SetReadBuffer(4096)
	if _, err := io.WriteString(c, rawRequest(addr, sid, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"big","arguments":{}}}`)); err != nil {
		t.Fatal(err)
	}
	peers.Wait(t, "the handler done", func() bool { return up.runs.Load() == 1 && s.inflight.Load() == 0 })
	if held := s.mem.Used.Load() - base; held < 2*size {
		t.Fatalf("%d bytes charged while the answer waits for the agent, want at least %d", held, 2*size)
	}
	peers.Wait(t, "the answer let go", func() bool { return s.mem.Used.Load() == base })
}

// rawRequest is the bytes of one agent POST on session sid.
func rawRequest(addr, sid, body string) string {
	return "POST /mcp HTTP/1.1\r\nHost: " + addr + "\r\nContent-Type: application/json\r\n" +
		"Accept: application/json, text/event-stream\r\nMcp-Session-Id: " + sid + "\r\nMcp-Protocol-Version: 2025-11-25\r\n" +
		"Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
}

// dialAgent opens a raw agent connection to the proxy at url.
func dialAgent(t *testing.T, url string) (net.Conn, string) {
	t.Helper()
	addr := strings.TrimSuffix(strings.TrimPrefix(url, "http://"), "/mcp")
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c, addr
}

// bigEventCalls sends calls concurrent calls of tool, each of which the
// scripted server answers with one event of 6 MiB and holds until
// released, and returns how they were answered: the JSON-RPC error code
// of each (0: its result), once every call but at most through (the most
// the budget can let through at once) have been answered. peak is the
// most the budget counted. Which calls the budget lets through depends on
// how their reads interleave: concurrent calls that each grew part-way
// may all be refused.
func bigEventCalls(t *testing.T, s *Server, up *scripted, calls, through int, send func(i int) (int, gjson.Result)) (codes []int64, peak int64) {
	t.Helper()
	var stop atomic.Bool
	var peakAt atomic.Int64
	go func() {
		for !stop.Load() {
			if u := s.mem.Used.Load(); u > peakAt.Load() {
				peakAt.Store(u)
			}
			time.Sleep(50 * time.Microsecond)
		}
	}()
	defer stop.Store(true)
	var returned atomic.Int64
	type answer struct {
		status int
		msg    gjson.Result
	}
	answers := make(chan answer, calls)
	for i := range calls {
		go func() {
			st, msg := send(i)
			returned.Add(1)
			answers <- answer{st, msg}
		}()
	}
	peers.Wait(t, "every call but those the budget holds answered", func() bool { return returned.Load() >= int64(calls-through) })
	close(up.hold)
	for range calls {
		a := <-answers
		if a.status != http.StatusOK {
			t.Errorf("a call answered %d %s", a.status, a.msg.Raw)
		}
		codes = append(codes, a.msg.Get("error.code").Int())
	}
	return codes, peakAt.Load()
}

// TestHeldEventsInBudget: a session-era server answers each held call with
// one 6 MiB progress event. The held route reads its events whole and
// translates them: that is counted in memory_budget, so under a 32 MiB
// budget at most two calls hold their event at a time (each counted at
// least twice its 8 MiB buffer: one, most runs), and the others get -32017
// at once; each tool ran once, and the budget never passed its limit.
// Before, 60 such calls held 1.2 GB outside the budget.
func TestHeldEventsInBudget(t *testing.T) {
	t.Parallel()
	up := startScripted(t, func(sc *scripted) { sc.bigEvent = 6 << 20; sc.hold = make(chan struct{}) })
	s, url := startProxy(t, up.URL(), func(c *conf.Config) { c.MemoryBudget = 32 << 20; c.Keepalive = -1 })
	if st, msg := heldPost(t, url, "", "tools/list", "", 1); st != http.StatusOK || !msg.Get("result").Exists() {
		t.Fatalf("tools/list on the held route: %d %s", st, msg.Raw)
	}
	const calls = 6
	codes, peak := bigEventCalls(t, s, up, calls, 2, func(i int) (int, gjson.Result) {
		return heldPost(t, url, "", "tools/call", `"name":"big_progress",`, 10+i)
	})
	checkBigEventCalls(t, s, up, "big_progress", codes, peak, calls, 2)
}

// TestRewrittenLineInBudget: after a heal, a server→client request on a
// call's answer is renumbered (the line held whole, and its copy): with
// 6 MiB requests under a 24 MiB budget one call holds one at a time and
// the others get -32017; each tool ran once, and the budget never passed
// its limit. Before, 60 such calls held 963 MB outside the budget.
func TestRewrittenLineInBudget(t *testing.T) {
	t.Parallel()
	up := startScripted(t, func(sc *scripted) { sc.bigEvent = 6 << 20; sc.hold = make(chan struct{}) })
	s, url := startProxy(t, up.URL(), func(c *conf.Config) { c.MemoryBudget = 24 << 20; c.Keepalive = -1 })
	sid := peers.RawInitialize(t, url)
	up.Expire()
	if resp, body := peers.RawPost(t, url, sid, `{"jsonrpc":"2.0","id":2,"method":"ping"}`); resp.StatusCode != http.StatusOK {
		t.Fatalf("ping that heals: %d %s", resp.StatusCode, body)
	}
	const calls = 6
	codes, peak := bigEventCalls(t, s, up, calls, 1, func(i int) (int, gjson.Result) {
		resp, body := peers.RawPost(t, url, sid, fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"big_request"}}`, 10+i))
		msg := body
		if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
			for _, line := range strings.Split(string(body), "\n") {
				if d, ok := strings.CutPrefix(line, "data: "); ok && gjson.Get(d, "id").Raw != `"mcpheal-g2-sask-1"` {
					msg = []byte(d)
				}
			}
		}
		return resp.StatusCode, gjson.ParseBytes(msg)
	})
	checkBigEventCalls(t, s, up, "big_request", codes, peak, calls, 1)
}

// checkBigEventCalls checks what bigEventCalls saw.
func checkBigEventCalls(t *testing.T, s *Server, up *scripted, tool string, codes []int64, peak int64, calls, through int) {
	t.Helper()
	var done, refused int
	for _, c := range codes {
		switch c {
		case 0:
			done++
		case wire.CodeBudget:
			refused++
		default:
			t.Errorf("a call answered %d; want its result or -32017", c)
		}
	}
	if done > through || done+refused != calls {
		t.Errorf("%d answered, %d refused by the budget; want at most %d answered, the others refused", done, refused, through)
	}
	if peak > s.mem.Limit {
		t.Errorf("the budget counted %d bytes at its peak, past its limit of %d", peak, s.mem.Limit)
	}
	if n := up.Runs(tool); n != calls {
		t.Errorf("%s ran %d times for %d calls, want once each", tool, n, calls)
	}
}

// TestSlowAgentStreamInBudget: the events an agent's GET stream holds for
// it while it does not read are counted in memory_budget, and the stream
// ends before they would pass it (its SDK opens another); when the agent
// goes, what they held is given back. The upstream sends 1 MiB
// notifications, more than the 8 MiB budget could hold in the stream's
// queue (16 events): on a session-era server's GET stream (pass-through),
// on a 2026-07-28 server's subscriptions/listen (the bridge), and to a
// 2026-07-28 agent's subscriptions/listen of a session-era server (the
// held route, which drops notifications rather than ending the listen).
// Before, the queues held them uncounted.
func TestSlowAgentStreamInBudget(t *testing.T) {
	t.Parallel()
	pad := strings.Repeat("x", 1<<20)
	var floods atomic.Int64 // events the held route's server sent
	flood := func(w http.ResponseWriter, r *http.Request, first, each string) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, first)
		for i := 0; i < 64; i++ {
			if _, err := io.WriteString(w, "data: "+each+"\n\n"); err != nil {
				return
			}
			w.(http.Flusher).Flush()
		}
		<-r.Context().Done()
	}
	getStream := func(conn net.Conn, host, sid string) {
		fmt.Fprintf(conn, "GET /mcp HTTP/1.1\r\nHost: %s\r\nAccept: text/event-stream\r\nMcp-Session-Id: %s\r\nMcp-Protocol-Version: 2025-11-25\r\n\r\n", host, sid)
	}
	for _, route := range []struct {
		name  string
		ended []string // what mcpheal logs when the budget stops it (one of)
		start func(t *testing.T) string
		open  func(conn net.Conn, host, sid string) // the agent's stream, on conn
		// kept: what the route keeps after the agent goes (a held
		// session); zero: every byte given back.
		kept int64
		// after, if set, checks the route once the agent went.
		after func(t *testing.T, url string)
	}{
		{name: "session pass-through", ended: []string{"GET stream events waiting for a slow agent would pass the memory budget; stream ended"},
			start: func(t *testing.T) string {
				return startStub(t, func(w http.ResponseWriter, r *http.Request) {
					flood(w, r, "", `{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":"`+pad+`"}}`)
				}, nil)
			}, open: getStream},
		// A 2026-07-28 agent's subscriptions/listen of a session-era
		// server: notifications are dropped, the listen stays (the
		// listen's queue or the session's GET stream finds the budget
		// full first, as it comes).
		{name: "held", ended: []string{"listen: notification would pass the memory budget; dropped",
			"GET stream events would pass the memory budget; dropped",
			"GET stream event would pass the memory budget held whole; dropped, stream opened again"},
			start: func(t *testing.T) string {
				return startStubWith(t, `{"tools":{"listChanged":true}}`, func(w http.ResponseWriter, r *http.Request) {
					// 64 big notifications, then a small one every 50 ms,
					// on this stream or the next.
					w.Header().Set("Content-Type", "text/event-stream")
					w.WriteHeader(http.StatusOK)
					big := "data: " + `{"jsonrpc":"2.0","method":"notifications/tools/list_changed","params":{"_meta":{"pad":"` + pad + `"}}}` + "\n\n"
					small := "data: " + `{"jsonrpc":"2.0","method":"notifications/tools/list_changed","params":{}}` + "\n\n"
					for {
						ev := small
						if floods.Add(1) <= 64 {
							ev = big
						}
						if _, err := io.WriteString(w, ev); err != nil {
							return
						}
						w.(http.Flusher).Flush()
						if ev == small {
							select {
							case <-r.Context().Done():
								return
							case <-time.After(50 * time.Millisecond):
							}
						}
					}
				}, nil)
			}, open: func(conn net.Conn, host, _ string) {
				body := `{"jsonrpc":"2.0","id":9,"method":"subscriptions/listen","params":{"notifications":{"toolsListChanged":true},` +
					`"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientInfo":{"name":"l","version":"1"},` +
					`"io.modelcontextprotocol/clientCapabilities":{}}}}`
				fmt.Fprintf(conn, "POST /mcp HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\n"+
					"Mcp-Protocol-Version: 2026-07-28\r\nMcp-Method: subscriptions/listen\r\nContent-Length: %d\r\n\r\n%s", host, len(body), body)
			}, kept: 1 << 20,
			// The session's notifications still reach a listen that reads
			// (the session's GET stream, if the budget ended it, opened
			// again).
			after: func(t *testing.T, url string) {
				resp, errBody := openListen(t, url, 77)
				if resp == nil {
					t.Fatalf("a second listen: %s", errBody)
				}
				got := make(chan bool, 1)
				go func() {
					buf := make([]byte, 64<<10)
					var seen []byte
					for {
						n, err := resp.Body.Read(buf)
						seen = append(seen, buf[:n]...)
						if strings.Contains(string(seen), "notifications/tools/list_changed") {
							got <- true
							return
						}
						if err != nil {
							got <- false
							return
						}
					}
				}()
				select {
				case ok := <-got:
					if !ok {
						t.Fatal("the second listen ended without a notification")
					}
				case <-time.After(2 * peers.Timeout):
					t.Fatal("no notification reached a listen that reads after the budget stopped the first")
				}
			}},
		{name: "bridge", ended: []string{"bridged GET stream events waiting for a slow agent would pass the memory budget; stream ended"},
			open: getStream, start: func(t *testing.T) string {
				return startScriptedModern(t, &scriptedModern{
					discover: modernDiscover(`{"tools":{"listChanged":true}}`, ""),
					handle: func(w http.ResponseWriter, r *http.Request, c scriptedCall) {
						if c.method != "subscriptions/listen" {
							scriptedJSON(w, http.StatusOK, `{"jsonrpc":"2.0","id":`+c.msg.Get("id").Raw+`,"error":{"code":-32601,"message":"Method not found"}}`)
							return
						}
						flood(w, r, "data: "+`{"jsonrpc":"2.0","method":"notifications/subscriptions/acknowledged","params":{}}`+"\n\n",
							`{"jsonrpc":"2.0","method":"notifications/tools/list_changed","params":{"_meta":{"pad":"`+pad+`"}}}`)
					},
				}).url
			}},
	} {
		t.Run(route.name, func(t *testing.T) {
			t.Parallel()
			s, url, logs := startProxyLog(t, route.start(t), func(c *conf.Config) { c.MemoryBudget = 8 << 20; c.Keepalive = -1 })
			sid := ""
			if route.name != "held" { // a 2026-07-28 agent has no session
				sid = agentInitialize(t, url, "")
			}
			base := s.mem.Used.Load() // the session's own cost included

			// The agent opens its GET stream and reads nothing.
			host := strings.TrimPrefix(strings.TrimSuffix(url, "/mcp"), "http://")
			conn, err := net.Dial("tcp", host)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			_ = conn.(*net.TCPConn).SetReadBuffer(4 << 10)
			route.open(conn, host, sid)

			// The end says the queued events were counted up to the budget
			// (the budget itself never lets Used pass Limit: Take).
			peers.Wait(t, "the stream stopped at the budget", func() bool {
				for _, l := range route.ended {
					if strings.Contains(logs.String(), l) {
						return true
					}
				}
				return false
			})
			conn.Close()
			peers.Wait(t, "what the stream held given back", func() bool { return s.mem.Used.Load() <= base+route.kept })
			if route.after != nil {
				route.after(t, url)
			}
		})
	}
}
