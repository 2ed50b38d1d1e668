package proxy

// Regression tests for the ways a tool could run twice or an answer be cut,
// each against a scripted upstream that counts executions server-side (the
// invariant: a tool that is not replay-safe runs at most once per agent
// call). The scripted upstream decodes requests with encoding/json, as real
// servers do: the last of duplicate keys wins.

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"github.com/mcpheal/mcpheal/proxy/internal/conf"
	"github.com/mcpheal/mcpheal/proxy/internal/peers"
	"github.com/mcpheal/mcpheal/proxy/internal/wire"
	"github.com/mcpheal/mcpheal/session"
)

// scripted is an MCP server on net/http whose tools misbehave on purpose:
//
//	lookup     readOnlyHint, answers its argument
//	charge     runs, then answers HTTP 200 with a JSON-RPC error whose text
//	           mentions a session (a tool's own failure, not the session's)
//	gw503      runs, then answers 503 as Envoy does when the backend reset
//	           after the request ("reset before headers")
//	shutting   answers 503 "Gateway is shutting down" (supergateway) the
//	           first time without running, then runs
//	crash_tool runs, then cuts the connection without answering
//	progress_crash runs, sends a progress notification as SSE, then cuts
//	           the stream before its answer
//
// Sessions are "s-<n>"; Expire forgets them all.
type scripted struct {
	srv   *http.Server
	ln    net.Listener
	addr  string
	inits atomic.Int64
	lists atomic.Int64 // tools/list calls

	mu       sync.Mutex // protects runs, sessions, shutting
	runs     map[string]int
	sessions map[string]bool
	shutting bool

	// initSSE answers initialize as SSE in pieces of 1000 bytes with
	// instructions of this size (0: a small JSON answer).
	initSSE int
	// listSSE answers tools/list as SSE in pieces of 1000 bytes with this
	// many extra tools.
	listSSE int
	// listOpen answers tools/list as one SSE response event, then keeps
	// the stream open until this is closed.
	listOpen chan struct{}
	// dropInitialized: this many notifications/initialized are met by
	// closing the connection, as a restarting server does.
	dropInitialized atomic.Int64
	initializedN    atomic.Int64 // notifications/initialized received
	// bigEvent is the size of the one event the big_progress and
	// big_request tools send before their answer (a progress notification,
	// a sampling request), each in a line of its own; hold, when set,
	// keeps them from answering until it is closed, so that calls hold
	// their events at once (big_request holds the last bytes of its
	// request's line back until then: its receiver holds the line
	// unfinished).
	bigEvent int
	hold     chan struct{}
}

func startScripted(t testing.TB, mod func(*scripted)) *scripted {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sc := &scripted{ln: ln, addr: ln.Addr().String(), runs: map[string]int{}, sessions: map[string]bool{}, shutting: true}
	if mod != nil {
		mod(sc)
	}
	sc.srv = &http.Server{Handler: sc, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = sc.srv.Serve(ln) }()
	t.Cleanup(func() { _ = sc.srv.Close() })
	return sc
}

func (sc *scripted) URL() string { return "http://" + sc.addr + "/mcp" }

// Runs returns how many times tool ran.
func (sc *scripted) Runs(tool string) int {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return sc.runs[tool]
}

// Expire forgets every session: the next request on one gets 404.
func (sc *scripted) Expire() {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	clear(sc.sessions)
}

// Stop closes the listener and every connection: dials are refused.
func (sc *scripted) Stop() { _ = sc.srv.Close() }

func (sc *scripted) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.WriteHeader(http.StatusMethodNotAllowed)
		return
	}
	var msg struct {
		ID     json.RawMessage `json:"id"`
		Method string          `json:"method"`
		Params struct {
			Name      string         `json:"name"`
			Arguments map[string]any `json:"arguments"`
		} `json:"params"`
	}
	if err := json.NewDecoder(r.Body).Decode(&msg); err != nil {
		http.Error(w, "bad json", http.StatusBadRequest)
		return
	}
	if msg.Method == "initialize" {
		sc.initialize(w, msg.ID)
		return
	}
	sc.mu.Lock()
	live := sc.sessions[r.Header.Get("Mcp-Session-Id")]
	sc.mu.Unlock()
	if !live {
		http.Error(w, "session not found", http.StatusNotFound)
		return
	}
	switch msg.Method {
	case "notifications/initialized":
		sc.initializedN.Add(1)
		if sc.dropInitialized.Add(-1) >= 0 {
			if c, _, err := http.NewResponseController(w).Hijack(); err == nil {
				_ = c.Close()
			}
			return
		}
		w.WriteHeader(http.StatusAccepted)
	case "ping":
		writeJSON(w, msg.ID, `{}`)
	case "tools/list":
		sc.toolsList(w, msg.ID)
	case "tools/call":
		sc.call(w, r, msg.ID, msg.Params.Name, fmt.Sprint(msg.Params.Arguments["q"]))
	default:
		writeJSON(w, msg.ID, `{}`)
	}
}

func (sc *scripted) initialize(w http.ResponseWriter, id json.RawMessage) {
	n := sc.inits.Add(1)
	sid := fmt.Sprintf("s-%d", n)
	sc.mu.Lock()
	sc.sessions[sid] = true
	sc.mu.Unlock()
	w.Header().Set("Mcp-Session-Id", sid)
	result := `{"protocolVersion":"2025-11-25","capabilities":{"tools":{}},"serverInfo":{"name":"scripted","version":"1"},"instructions":"` +
		strings.Repeat("i", sc.initSSE) + `"}`
	if sc.initSSE == 0 {
		writeJSON(w, id, result)
		return
	}
	writeSSE(w, id, result)
}

func (sc *scripted) toolsList(w http.ResponseWriter, id json.RawMessage) {
	sc.lists.Add(1)
	tools := []string{
		`{"name":"lookup","inputSchema":{"type":"object"},"annotations":{"readOnlyHint":true}}`,
		`{"name":"charge","inputSchema":{"type":"object"}}`,
		`{"name":"crash_tool","inputSchema":{"type":"object"}}`,
	}
	for i := range sc.listSSE {
		tools = append(tools, fmt.Sprintf(`{"name":"extra_%d","description":"%s","inputSchema":{"type":"object"}}`,
			i, strings.Repeat("d", 200)))
	}
	result := `{"tools":[` + strings.Join(tools, ",") + `]}`
	if sc.listOpen != nil {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = fmt.Fprintf(w, "event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":%s,\"result\":%s}\n\n", id, result)
		_ = http.NewResponseController(w).Flush()
		<-sc.listOpen
		return
	}
	if sc.listSSE == 0 {
		writeJSON(w, id, result)
		return
	}
	writeSSE(w, id, result)
}

func (sc *scripted) call(w http.ResponseWriter, r *http.Request, id json.RawMessage, tool, q string) {
	sc.mu.Lock()
	if tool == "shutting" && sc.shutting {
		sc.shutting = false
		sc.mu.Unlock()
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte("Gateway is shutting down"))
		return
	}
	sc.runs[tool]++
	sc.mu.Unlock()
	switch tool {
	case "charge":
		w.Header().Set("Content-Type", "application/json")
		_, _ = fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"error":{"code":-32000,"message":"charged $20 but payment gateway session expired"}}`, id)
	case "gw503":
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte("upstream connect error or disconnect/reset before headers. reset reason: connection termination"))
	case "crash_tool":
		if c, _, err := http.NewResponseController(w).Hijack(); err == nil {
			_ = c.Close()
		}
	case "huge_json":
		// A JSON answer of 16 MiB: past a small max_answer, and more than
		// the kernel buffers for an agent that does not read.
		w.Header().Set("Content-Type", "application/json")
		_, _ = fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":{"content":[{"type":"text","text":"%s"}]}}`,
			id, strings.Repeat("h", 16<<20))
	case "dup_sid":
		// Two Mcp-Session-Id headers: both must be replaced.
		w.Header().Add("Mcp-Session-Id", "UPSTREAM-SECOND-ID")
		writeJSON(w, id, `{"content":[]}`)
	case "endless":
		// A data line that never ends, arriving slowly.
		w.Header().Set("Content-Type", "text/event-stream")
		rc := http.NewResponseController(w)
		_, _ = io.WriteString(w, "data: {\"jsonrpc\":\"2.0\",\"id\":"+string(id)+",\"result\":{\"text\":\"")
		chunk := strings.Repeat("e", 16<<10)
		for i := 0; i < 64; i++ {
			if _, err := io.WriteString(w, chunk); err != nil {
				return
			}
			_ = rc.Flush()
			time.Sleep(5 * time.Millisecond)
		}
		<-r.Context().Done()
	case "big_progress", "big_request":
		w.Header().Set("Content-Type", "text/event-stream")
		pad := strings.Repeat("b", sc.bigEvent)
		ev := `{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":1,"progress":1,"message":"` + pad + `"}}`
		if tool == "big_request" {
			ev = `{"jsonrpc":"2.0","id":"ask-1","method":"sampling/createMessage","params":{"maxTokens":1,"messages":[{"role":"user","content":{"type":"text","text":"` + pad + `"}}]}}`
		}
		line := "event: message\ndata: " + ev + "\n\n"
		rest := ""
		if tool == "big_request" && sc.hold != nil {
			line, rest = line[:len(line)-16], line[len(line)-16:]
		}
		_, _ = io.WriteString(w, line)
		_ = http.NewResponseController(w).Flush()
		if sc.hold != nil {
			select {
			case <-sc.hold:
			case <-r.Context().Done():
				return
			}
		}
		_, _ = io.WriteString(w, rest)
		_, _ = fmt.Fprintf(w, "event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":%s,\"result\":{\"content\":[{\"type\":\"text\",\"text\":\"done\"}]}}\n\n", id)
	case "progress_crash":
		// A progress notification, then the server dies mid-answer.
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"progressToken\":1,\"progress\":1}}\n\n")
		_ = http.NewResponseController(w).Flush()
		time.Sleep(20 * time.Millisecond)
		panic(http.ErrAbortHandler) // cuts the chunked answer without its end
	default:
		writeJSON(w, id, `{"content":[{"type":"text","text":`+fmt.Sprintf("%q", tool+":"+q)+`}]}`)
	}
}

func writeJSON(w http.ResponseWriter, id json.RawMessage, result string) {
	w.Header().Set("Content-Type", "application/json")
	_, _ = fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":%s}`, id, result)
}

// writeSSE answers as a TS SDK server does without an event store: a
// notification first, then the response event, in flushed pieces of 1000
// bytes so that no read upstream sees a whole event.
func writeSSE(w http.ResponseWriter, id json.RawMessage, result string) {
	w.Header().Set("Content-Type", "text/event-stream")
	stream := "event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{\"level\":\"info\",\"data\":\"hi\"}}\n\n" +
		"event: message\ndata: " + fmt.Sprintf(`{"jsonrpc":"2.0","id":%s,"result":%s}`, id, result) + "\n\n"
	rc := http.NewResponseController(w)
	for i := 0; i < len(stream); i += 1000 {
		_, _ = w.Write([]byte(stream[i:min(i+1000, len(stream))]))
		_ = rc.Flush()
		time.Sleep(time.Millisecond)
	}
}

// callTool sends a tools/call through the proxy and returns the status and
// the JSON-RPC answer.
func callTool(t testing.TB, url, sid, tool string) (int, gjson.Result) {
	t.Helper()
	body := fmt.Sprintf(`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":%q,"arguments":{"q":"x"}}}`, tool)
	resp, raw := peers.RawPost(t, url, sid, body)
	return resp.StatusCode, rpcAnswer(raw)
}

// TestToolErrorMentioningSessionNotReplayed: a tool's own JSON-RPC error
// whose text mentions a session ("payment gateway session expired", HTTP
// 200) is the tool's answer, not the session's death: it passes through
// and the tool ran once.
func TestToolErrorMentioningSessionNotReplayed(t *testing.T) {
	t.Parallel()
	up := startScripted(t, nil)
	_, url := startProxy(t, up.URL(), nil)
	sid := peers.RawInitialize(t, url)
	status, ans := callTool(t, url, sid, "charge")
	if status != http.StatusOK || !strings.Contains(ans.Get("error.message").Str, "payment gateway session expired") {
		t.Fatalf("charge: %d %s; want the tool's own error", status, ans.Raw)
	}
	if n := up.Runs("charge"); n != 1 {
		t.Fatalf("charge ran %d times, want 1", n)
	}
	if n := up.inits.Load(); n != 1 {
		t.Fatalf("%d initializes, want 1: nothing was healed", n)
	}
}

// TestGateway503AfterRunNotReplayed: a gateway's 503 after the tool ran
// (Envoy's "reset before headers") is no proof that it did not run: the
// agent gets -32011 and the tool ran once, not once per backoff step.
func TestGateway503AfterRunNotReplayed(t *testing.T) {
	t.Parallel()
	up := startScripted(t, nil)
	_, url := startProxy(t, up.URL(), func(c *conf.Config) { c.HealTimeout = 2 * time.Second })
	sid := peers.RawInitialize(t, url)
	status, ans := callTool(t, url, sid, "gw503")
	if status != http.StatusOK || ans.Get("error.code").Int() != wire.CodeMaybeExecuted {
		t.Fatalf("gw503: %d %s; want 200 with -32011", status, ans.Raw)
	}
	if n := up.Runs("gw503"); n != 1 {
		t.Fatalf("gw503 ran %d times, want 1", n)
	}
}

// TestServerRefusal503Retried: supergateway's 503 "Gateway is shutting
// down" is the server refusing before dispatch: the call is retried and
// runs once.
func TestServerRefusal503Retried(t *testing.T) {
	t.Parallel()
	up := startScripted(t, nil)
	_, url := startProxy(t, up.URL(), nil)
	sid := peers.RawInitialize(t, url)
	status, ans := callTool(t, url, sid, "shutting")
	if status != http.StatusOK || ans.Get("result.content.0.text").Str != "shutting:x" {
		t.Fatalf("shutting: %d %s; want the tool's result", status, ans.Raw)
	}
	if n := up.Runs("shutting"); n != 1 {
		t.Fatalf("shutting ran %d times, want 1", n)
	}
}

// TestDuplicateKeysRefused: with duplicate keys mcpheal would judge one
// value and the server run the other (servers keep the last): judged
// read-only as "lookup", run as "crash_tool", replayed. Such a request is
// refused with 400 and reaches no tool.
func TestDuplicateKeysRefused(t *testing.T) {
	t.Parallel()
	up := startScripted(t, nil)
	_, url := startProxy(t, up.URL(), nil)
	sid := peers.RawInitialize(t, url)
	for _, body := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"lookup","name":"crash_tool"}}`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/list","method":"tools/call","params":{"name":"crash_tool"}}`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"lookup"},"params":{"name":"crash_tool"}}`,
		`{"jsonrpc":"2.0","id":1,"id":2,"method":"tools/call","params":{"name":"crash_tool"}}`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"lookup","na\u006de":"crash_tool"}}`,
		// Go's encoding/json matches keys ignoring case and keeps the last.
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"lookup","NAME":"crash_tool"}}`,
		`{"jsonrpc":"2.0","id":1,"method":"ping","Method":"tools/call","params":{"name":"crash_tool"}}`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"lookup"},"p\u0061rams":{"name":"crash_tool"}}`,
	} {
		resp, raw := peers.RawPost(t, url, sid, body)
		if code, _, _ := rpcError(t, raw); resp.StatusCode != http.StatusBadRequest || code != wire.CodeInvalidRequest {
			t.Errorf("%s: %d %s; want 400 -32600", body, resp.StatusCode, raw)
		}
	}
	if n := up.Runs("crash_tool") + up.Runs("lookup"); n != 0 {
		t.Fatalf("tools ran %d times, want 0", n)
	}
}

// TestLargeSSEInitialize: an initialize answered as SSE with 12 KB of
// instructions (fastmcp; the TS SDK without an event store), arriving in
// 1000-byte pieces, reaches the agent whole, and a heal reads it whole.
func TestLargeSSEInitialize(t *testing.T) {
	t.Parallel()
	up := startScripted(t, func(sc *scripted) { sc.initSSE = 12 << 10 })
	_, url := startProxy(t, up.URL(), nil)
	resp, raw := peers.RawPost(t, url, "",
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`)
	ins := rpcAnswer(raw).Get("result.instructions").Str
	if resp.StatusCode != http.StatusOK || len(ins) != 12<<10 {
		t.Fatalf("initialize: %d, %d bytes of instructions (body %d bytes); want 200 and %d", resp.StatusCode, len(ins), len(raw), 12<<10)
	}
	sid := resp.Header.Get("Mcp-Session-Id")
	up.Expire()
	status, ans := callTool(t, url, sid, "lookup")
	if status != http.StatusOK || ans.Get("result.content.0.text").Str != "lookup:x" {
		t.Fatalf("after expiry: %d %s; want a healed call", status, ans.Raw)
	}
	if n := up.inits.Load(); n != 2 {
		t.Fatalf("%d initializes, want 2 (one heal)", n)
	}
}

// TestToolsLearnedBeforeAnswerPasses: a tools/list response that goes to
// the agent while its upstream stream stays open has taught the proxy its
// tools already: an agent's next call, sent the moment the answer arrives,
// must find lookup replay-safe (it once raced the relay's next read, and a
// read-only tool cut by a crash was refused instead of replayed).
func TestToolsLearnedBeforeAnswerPasses(t *testing.T) {
	t.Parallel()
	open := make(chan struct{})
	up := startScripted(t, func(sc *scripted) { sc.listOpen = open })
	defer close(open)
	s, url := startProxy(t, up.URL(), nil)
	sid := peers.RawInitialize(t, url)
	resp, err := http.DefaultClient.Do(peers.PostRequest(t, url, sid, `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("tools/list stream ended before its response: %v", err)
		}
		if strings.HasPrefix(line, "data: ") && strings.Contains(line, `"result"`) {
			break
		}
	}
	sess, ok := s.sessions.Store.Get(session.ClientID(sid))
	if !ok {
		t.Fatalf("session %s not in the store", sid)
	}
	if !sess.Replayable("lookup") || sess.Replayable("charge") {
		t.Fatalf("with the answer at the agent: lookup replayable %v, charge %v; want true, false",
			sess.Replayable("lookup"), sess.Replayable("charge"))
	}
}

// TestHealKeepsSessionWhenInitializedLost: the connection carrying a heal's
// notifications/initialized breaks. The notification is sent again; the
// upstream session the initialize made is kept, not thrown away for
// another initialize (which once left one upstream session per lost
// notification behind).
func TestHealKeepsSessionWhenInitializedLost(t *testing.T) {
	t.Parallel()
	up := startScripted(t, nil)
	_, url := startProxy(t, up.URL(), nil)
	sid := peers.RawInitialize(t, url)
	up.Expire()
	up.dropInitialized.Store(1)
	status, ans := callTool(t, url, sid, "lookup")
	if status != http.StatusOK || ans.Get("result.content.0.text").Str != "lookup:x" {
		t.Fatalf("lookup after a heal whose initialized was lost: %d %s", status, ans.Raw)
	}
	if n := up.inits.Load(); n != 2 {
		t.Fatalf("%d upstream initializes, want 2 (the agent's and one heal)", n)
	}
	if n := up.initializedN.Load(); n != 3 {
		t.Fatalf("%d notifications/initialized, want 3 (the agent's, the lost one, its resend)", n)
	}
	if n := up.Runs("lookup"); n != 1 {
		t.Fatalf("lookup ran %d times, want 1", n)
	}
}

// TestLargeSSEToolsListAcrossHeal: a tools/list answered as SSE and larger
// than any read (40 tools, ~10 KB in 1000-byte pieces) is read whole after
// a heal, so an unchanged list is not reported as changed.
func TestLargeSSEToolsListAcrossHeal(t *testing.T) {
	t.Parallel()
	up := startScripted(t, func(sc *scripted) { sc.listSSE = 40 })
	s, url, logs := startProxyLog(t, up.URL(), nil)
	sid := peers.RawInitialize(t, url)
	resp, raw := peers.RawPost(t, url, sid, `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`)
	if n := len(rpcAnswer(raw).Get("result.tools").Array()); resp.StatusCode != http.StatusOK || n != 43 {
		t.Fatalf("tools/list: %d, %d tools; want 43", resp.StatusCode, n)
	}
	up.Expire()
	if status, ans := callTool(t, url, sid, "lookup"); status != http.StatusOK || ans.Get("error").Exists() {
		t.Fatalf("after expiry: %d %s", status, ans.Raw)
	}
	peers.Wait(t, "the tools/list after the heal", func() bool { return up.lists.Load() == 2 })
	s.Close() // waits for the background work: checkTools has compared
	if l := logs.String(); strings.Contains(l, "tool list changed") {
		t.Fatalf("an unchanged tool list was reported as changed:\n%s", l)
	}
}

// TestStaleConnectionToolRunsOnce: a tools/call that is not replay-safe,
// sent after the pooled connection idled past the stale threshold, on a
// server that runs it and dies. It must run once: never resent on a fresh
// connection (the old stale-connection resend), and not replayed after the
// heal when that resend's dial was refused.
func TestStaleConnectionToolRunsOnce(t *testing.T) {
	t.Parallel()
	up := startScripted(t, nil)
	_, url := startProxy(t, up.URL(), func(c *conf.Config) { c.HealTimeout = time.Second })
	sid := peers.RawInitialize(t, url)
	if status, _ := callTool(t, url, sid, "lookup"); status != http.StatusOK {
		t.Fatalf("warm-up call: %d", status)
	}
	time.Sleep(1200 * time.Millisecond) // past upstream's stale threshold (1 s)
	status, ans := callTool(t, url, sid, "crash_tool")
	if status != http.StatusOK || ans.Get("error.code").Int() != wire.CodeMaybeExecuted {
		t.Fatalf("crash_tool: %d %s; want 200 with -32011", status, ans.Raw)
	}
	if n := up.Runs("crash_tool"); n != 1 {
		t.Fatalf("crash_tool ran %d times, want 1", n)
	}
}

// TestStreamCutBeforeAnswer: a tools/call answered as SSE whose stream is
// cut after a progress notification and before the response. The agent
// has already received the notification, so the answer is on its way: it
// ends with mcpheal's -32011 event instead of leaving the call to the
// agent's timeout, and the tool ran once.
func TestStreamCutBeforeAnswer(t *testing.T) {
	t.Parallel()
	up := startScripted(t, nil)
	_, url := startProxy(t, up.URL(), nil)
	sid := peers.RawInitialize(t, url)
	start := time.Now()
	resp, raw := peers.RawPost(t, url, sid,
		`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"progress_crash","arguments":{}}}`)
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(raw), "notifications/progress") {
		t.Fatalf("progress_crash: %d %q; want the progress notification relayed", resp.StatusCode, raw)
	}
	ans := rpcAnswer(raw)
	if ans.Get("error.code").Int() != wire.CodeMaybeExecuted || ans.Get("id").Raw != "7" {
		t.Fatalf("answer %s (stream %q); want -32011 for id 7", ans.Raw, raw)
	}
	if n := up.Runs("progress_crash"); n != 1 {
		t.Fatalf("progress_crash ran %d times, want 1", n)
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Fatalf("took %v: the agent waited for the cut stream", el)
	}
}
