package proxy

// Hostile input: what an agent or an upstream can send to take memory,
// CPU or another agent's session. Each test names the attack it guards.

import (
	"errors"
	"io"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/mcpheal/mcpheal/classify/sse"
	"github.com/mcpheal/mcpheal/proxy/internal/conf"
	"github.com/mcpheal/mcpheal/proxy/internal/peers"
	"github.com/mcpheal/mcpheal/proxy/internal/wire"
	"github.com/mcpheal/mcpheal/session"
)

// TestNestedJSONBounded: a 4 MB body of '[' (gjson's validator recursed
// once per level: ~330 MB for one such request) is refused with 400 at
// small cost, before any session is looked up.
func TestNestedJSONBounded(t *testing.T) {
	up := startScripted(t, nil)
	_, url := startProxy(t, up.URL(), nil)
	body := strings.Repeat("[", 4<<20)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	resp, raw := peers.RawPost(t, url, "", body)
	runtime.ReadMemStats(&after)
	if code, _, _ := rpcError(t, raw); resp.StatusCode != http.StatusBadRequest || code != wire.CodeInvalidRequest ||
		!strings.Contains(string(raw), "max_json_depth") {
		t.Fatalf("4 MB of '[': %d %s; want 400 naming max_json_depth", resp.StatusCode, raw)
	}
	// The body itself is read into memory a few times (client, server);
	// the validator must add nothing in proportion to the depth.
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 64<<20 {
		t.Fatalf("one nested body allocated %d MB", grew>>20)
	}
	if !jsonDepthOK([]byte(`{"a":"[[[[[[[[","b":[{"c":"\"]]]]"}]}`), 3) {
		t.Fatal("brackets inside strings counted as nesting")
	}
}

// TestInitializeBodyCapped: an initialize body past max_init_body is
// refused with 413 (each session keeps its initialize for the session's
// life), and identical ones are kept once.
func TestInitializeBodyCapped(t *testing.T) {
	t.Parallel()
	up := startScripted(t, nil)
	s, url := startProxy(t, up.URL(), func(c *conf.Config) { c.MaxInitBody = 4 << 10 })
	fat := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"` +
		strings.Repeat("f", 8<<10) + `","version":"1"}}}`
	resp, raw := peers.RawPost(t, url, "", fat)
	if code, msg, _ := rpcError(t, raw); resp.StatusCode != http.StatusRequestEntityTooLarge || code != wire.CodeInvalidRequest ||
		!strings.Contains(msg, "max_init_body") {
		t.Fatalf("8 KiB initialize: %d %s; want 413 naming max_init_body", resp.StatusCode, raw)
	}
	if n := up.inits.Load(); n != 0 {
		t.Fatalf("the upstream saw %d initializes, want 0", n)
	}
	peers.RawInitialize(t, url)
	runtime.GC() // interning must outlive a collection
	peers.RawInitialize(t, url)
	ss := s.sessions.Store.Sessions()
	if len(ss) != 2 || unsafe.StringData(ss[0].Recipe.InitBody) != unsafe.StringData(ss[1].Recipe.InitBody) {
		t.Fatal("two identical initialize bodies are kept twice")
	}
}

// TestFloodKeepsSessionsAtWork: with the session cap reached by a flood of
// bare initializes, a session at work is never evicted to admit more (it
// once was: LRU), and the flood gets 503 naming the cap.
func TestFloodKeepsSessionsAtWork(t *testing.T) {
	t.Parallel()
	up := startScripted(t, nil)
	_, url := startProxy(t, up.URL(), func(c *conf.Config) { c.MaxSessions = 10 })
	victim := peers.RawInitialize(t, url)
	if status, _ := callTool(t, url, victim, "lookup"); status != http.StatusOK {
		t.Fatalf("victim's first call: %d", status)
	}
	refused := 0
	for range 30 {
		resp, raw := peers.RawPost(t, url, "",
			`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"junk","version":"1"}}}`)
		if code, _, _ := rpcError(t, raw); resp.StatusCode == http.StatusOK && code != 0 {
			if code != wire.CodeTooMany || resp.Header.Get("Retry-After") == "" {
				t.Fatalf("refused initialize: %s", raw)
			}
			refused++
		}
	}
	if refused != 21 {
		t.Fatalf("%d of 30 junk initializes refused, want 21 (cap 10, the victim holds one)", refused)
	}
	if status, ans := callTool(t, url, victim, "lookup"); status != http.StatusOK || ans.Get("error").Exists() {
		t.Fatalf("victim after the flood: %d %s; want its session intact", status, ans.Raw)
	}
}

// TestSessionHeaderTwice: a request with two Mcp-Session-Id headers is
// refused with 400; the upstream sees neither.
func TestSessionHeaderTwice(t *testing.T) {
	t.Parallel()
	up := startScripted(t, nil)
	_, url := startProxy(t, up.URL(), nil)
	sid := peers.RawInitialize(t, url)
	req := peers.PostRequest(t, url, sid, `{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"lookup"}}`)
	req.Header.Add("Mcp-Session-Id", "another")
	resp, raw := peers.RawDo(t, req)
	if code, _, id := rpcError(t, raw); resp.StatusCode != http.StatusBadRequest || code != wire.CodeInvalidRequest || id != "3" {
		t.Fatalf("two session headers: %d %s; want 400 -32600 with id 3", resp.StatusCode, raw)
	}
	if n := up.Runs("lookup"); n != 0 {
		t.Fatalf("lookup ran %d times", n)
	}
}

// TestUpstreamSessionIDTwice: an upstream that sends Mcp-Session-Id twice
// leaks neither copy: the agent sees its own id, once.
func TestUpstreamSessionIDTwice(t *testing.T) {
	t.Parallel()
	up := startScripted(t, nil)
	_, url := startProxy(t, up.URL(), nil)
	sid := peers.RawInitialize(t, url)
	resp, _ := peers.RawPost(t, url, sid, `{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"dup_sid"}}`)
	if got := resp.Header.Values("Mcp-Session-Id"); len(got) != 1 || got[0] != sid {
		t.Fatalf("Mcp-Session-Id = %q, want only the agent's %q", got, sid)
	}
}

// TestOversizedAnswerNotReplayed: a JSON answer past max_answer is the
// upstream's answer, too large: the agent gets 502 -32016 naming the cap,
// the tool ran once although --replay-tool names it, and nothing counts as
// an outage (it once opened the breaker for every session).
func TestOversizedAnswerNotReplayed(t *testing.T) {
	t.Parallel()
	up := startScripted(t, nil)
	s, url := startProxy(t, up.URL(), func(c *conf.Config) {
		c.MaxAnswer = 1 << 20
		c.ReplayTools = []string{"huge_json"}
	})
	sid := peers.RawInitialize(t, url)
	for range 3 {
		resp, raw := peers.RawPost(t, url, sid, `{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"huge_json"}}`)
		if code, msg, _ := rpcError(t, raw); resp.StatusCode != http.StatusOK || code != wire.CodeTooLarge ||
			!strings.Contains(msg, "max_answer") {
			t.Fatalf("huge_json: %d %s; want 200 -32016 naming max_answer", resp.StatusCode, raw)
		}
	}
	if n := up.Runs("huge_json"); n != 3 {
		t.Fatalf("huge_json ran %d times for 3 calls, want 3", n)
	}
	if st := s.Stats(); st.UpstreamDown != 0 || st.Heals != 0 || s.breakerState() != 0 {
		t.Fatalf("stats %+v, breaker %d: an answer too large is no outage", st, s.breakerState())
	}
}

// TestEndlessSSELineStreams: an upstream event that never ends (no line
// end, no blank line) no longer pins a core and grows memory: the agent
// gets the answer's head and the bytes as they come, and mcpheal holds one
// read buffer.
func TestEndlessSSELineStreams(t *testing.T) {
	t.Parallel()
	up := startScripted(t, nil)
	_, url := startProxy(t, up.URL(), nil)
	sid := peers.RawInitialize(t, url)
	req := peers.PostRequest(t, url, sid, `{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"endless"}}`)
	start := time.Now()
	resp, err := peers.RawClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || time.Since(start) > 2*time.Second {
		t.Fatalf("head: %d after %v", resp.StatusCode, time.Since(start))
	}
	n, _ := io.CopyN(io.Discard, resp.Body, 512<<10)
	if n != 512<<10 {
		t.Fatalf("relayed %d bytes of the endless line, want 512 KiB as they come", n)
	}
}

// TestSlowAgentLetGo: an agent that never reads its answer loses its
// connection after write_timeout, instead of pinning the answer in memory
// (it once held it until the agent went away, and longer).
func TestSlowAgentLetGo(t *testing.T) {
	t.Parallel()
	up := startScripted(t, nil)
	s, url := startProxy(t, up.URL(), func(c *conf.Config) {
		c.WriteTimeout = 300 * time.Millisecond
		c.MaxAnswer = 64 << 20
	})
	sid := peers.RawInitialize(t, url)
	peers.RawClient.CloseIdleConnections()
	addr := strings.TrimSuffix(strings.TrimPrefix(url, "http://"), "/mcp")
	peers.Wait(t, "no connection open", func() bool { return s.srv.GetOpenConnectionsCount() == 0 })
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.(*net.TCPConn).SetReadBuffer(4096)
	body := `{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"huge_json"}}`
	req := "POST /mcp HTTP/1.1\r\nHost: " + addr + "\r\nContent-Type: application/json\r\n" +
		"Accept: application/json, text/event-stream\r\nMcp-Session-Id: " + sid + "\r\nMcp-Protocol-Version: 2025-11-25\r\n" +
		"Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body
	if _, err := c.Write([]byte(req)); err != nil {
		t.Fatal(err)
	}
	peers.Wait(t, "the huge answer", func() bool { return up.Runs("huge_json") == 1 })
	// The agent reads nothing: past write_timeout, mcpheal lets go of the
	// connection and the 16 MiB answer it could not write.
	peers.Wait(t, "the stalled connection closed", func() bool { return s.srv.GetOpenConnectionsCount() == 0 })
}

// TestDeleteAndGetNeedTheSessionsCredential: a DELETE or a GET of a session
// id under no credential or another one is answered as for an unknown
// session: it neither ends the victim's session nor takes its GET stream
// (both once happened before the upstream could refuse).
func TestDeleteAndGetNeedTheSessionsCredential(t *testing.T) {
	t.Parallel()
	up := startAuthServer(t, map[string]string{"victim-token-0001": "alice", "attacker-token-01": "mallory"})
	s, url := startProxy(t, up.url, nil)
	sid := authInit(t, url, "victim-token-0001")
	stream := openAuthGet(t, url, sid, "victim-token-0001")
	defer stream.Body.Close()
	peers.Wait(t, "the victim's stream", func() bool { return s.streams.Set.Count(session.ClientID(sid)) == 1 })
	for _, tok := range []string{"", "attacker-token-01"} {
		for _, method := range []string{http.MethodDelete, http.MethodGet} {
			req, _ := http.NewRequest(method, url, nil)
			req.Header.Set("Mcp-Session-Id", sid)
			req.Header.Set("Accept", "text/event-stream")
			if tok != "" {
				req.Header.Set("Authorization", "Bearer "+tok)
			}
			if resp, raw := peers.RawDo(t, req); resp.StatusCode != http.StatusNotFound {
				t.Fatalf("%s under %q: %d %s; want 404", method, tok, resp.StatusCode, raw)
			}
		}
	}
	if n := s.streams.Set.Count(session.ClientID(sid)); n != 1 {
		t.Fatalf("the victim's GET streams: %d, want its own 1", n)
	}
	resp, body := authPost(t, url, sid, "victim-token-0001", echoCall)
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "secret-answer") {
		t.Fatalf("victim after the attempts: %d %s", resp.StatusCode, body)
	}
}

// openAuthGet opens the agent's GET stream under a bearer token.
func openAuthGet(t *testing.T, url, sid, token string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	req.Header.Set("Mcp-Session-Id", sid)
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("MCP-Protocol-Version", "2025-11-25")
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := peers.RawClient.Do(req)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("victim's GET: %v %v", resp, err)
	}
	return resp
}

// TestMemoryBudget: fat sessions (150 with initialize bodies near
// max_init_body once took RSS from 12 MB to 632 MB) stop at the memory
// budget with 503 naming it, the sessions already admitted keep working,
// and the budget comes back as sessions end. A buffered answer that would
// pass the budget is refused, not held.
func TestMemoryBudget(t *testing.T) {
	t.Parallel()
	up := startScripted(t, nil)
	s, url := startProxy(t, up.URL(), func(c *conf.Config) {
		c.MemoryBudget = 8 << 20
		c.MaxAnswer = 64 << 20
	})
	admitted, refused := []string{}, 0
	for i := range 150 {
		body := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"` +
			strings.Repeat(string(rune('a'+i%26)), 60<<10) + strconv.Itoa(i) + `","version":"1"}}}`
		resp, raw := peers.RawPost(t, url, "", body)
		code, _, _ := rpcError(t, raw)
		switch {
		case resp.StatusCode == http.StatusOK && code == 0:
			admitted = append(admitted, resp.Header.Get("Mcp-Session-Id"))
		case resp.StatusCode == http.StatusOK && code == wire.CodeTooMany:
			if !strings.Contains(string(raw), "memory_budget") {
				t.Fatalf("refused initialize: %s", raw)
			}
			refused++
		default:
			t.Fatalf("initialize %d: %d %s", i, resp.StatusCode, raw)
		}
	}
	// 8 MiB / (60 KiB + overhead) is ~130 sessions.
	if len(admitted) < 120 || len(admitted) > 136 || refused != 150-len(admitted) {
		t.Fatalf("%d admitted, %d refused; want about 130 admitted under an 8 MiB budget", len(admitted), refused)
	}
	if used := s.mem.Used.Load(); used > 8<<20 {
		t.Fatalf("budget used %d, over its limit", used)
	}
	if status, _ := callTool(t, url, admitted[0], "lookup"); status != http.StatusOK {
		t.Fatalf("an admitted session at the budget: %d", status)
	}
	// A 16 MiB answer cannot be buffered under an 8 MiB budget.
	resp, raw := peers.RawPost(t, url, admitted[0], `{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"huge_json"}}`)
	if code, msg, _ := rpcError(t, raw); resp.StatusCode != http.StatusOK || code != wire.CodeBudget ||
		!strings.Contains(msg, "memory_budget") {
		t.Fatalf("huge answer at the budget: %d %.200s", resp.StatusCode, raw)
	}
	for _, sid := range admitted[:20] {
		req, _ := http.NewRequest(http.MethodDelete, url, nil)
		req.Header.Set("Mcp-Session-Id", sid)
		peers.RawDo(t, req)
	}
	if resp, _ := peers.RawPost(t, url, "", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"late","version":"1"}}}`); resp.StatusCode != http.StatusOK {
		t.Fatalf("initialize after 20 sessions ended: %d; the budget must come back", resp.StatusCode)
	}
}

// TestCutHeldLineNotCompleted: an SSE line mcpheal must hold (an id) that
// passes max_sse_line ends the answer with -32016, and its bytes are
// dropped: they once reached the agent completed by the error event's
// blank line, as a 32 MiB event id.
func TestCutHeldLineNotCompleted(t *testing.T) {
	t.Parallel()
	er := wire.EventRewriter{Gen: 1, Max: 1 << 10}
	_, _, err := er.Stream(nil, []byte("id: "+strings.Repeat("x", 4<<10)))
	if !errors.Is(err, sse.ErrTooLarge) {
		t.Fatalf("err = %v, want ErrTooLarge", err)
	}
	out, mid := er.EndStream([]byte("data: {}\n\n"), false)
	if string(out) != "data: {}\n\n" || mid {
		t.Fatalf("endStream kept %q (mid-line %v)", out, mid)
	}
}

// TestLogLinesBounded: an agent's method and tool name are its own, and
// may be megabytes: the log lines mcpheal writes of them carry at most
// maxSpanText bytes of each, as spans do. Before, ten requests with a 3 MB
// tool name added 15 MB of log lines of 3 MB each.
func TestLogLinesBounded(t *testing.T) {
	t.Parallel()
	up := peers.StartGoSDK(t, peers.GoSDKOpts{})
	relay := peers.NewTCPRelay(t, up.Addr())
	_, url, logs := startProxyLog(t, relay.URL(), nil)
	sid := peers.RawInitialize(t, url)
	name := "t" + strings.Repeat("x", 1<<20)
	relay.CutRequest(`"name":"t`) // the call is cut on its way: mcpheal logs that it did not replay it
	resp, body := peers.RawPost(t, url, sid, `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"`+name+`"}}`)
	if code, _, _ := rpcError(t, body); resp.StatusCode != http.StatusOK || code != wire.CodeMaybeExecuted {
		t.Fatalf("tools/call cut on its way upstream: %d %.200s; want -32011", resp.StatusCode, body)
	}
	var named int
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, `"tool":"txxx`) {
			named++
		}
		if len(line) > 4<<10 {
			t.Errorf("a log line of %d bytes: %.200s…", len(line), line)
		}
	}
	if named == 0 {
		t.Fatalf("no log line names the tool:\n%.2000s", logs.String())
	}
}
