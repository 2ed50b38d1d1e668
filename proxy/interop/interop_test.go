//go:build unix

package interop

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mcpheal/mcpheal/proxy"
)

// codeMayHaveRun is the JSON-RPC error code mcpheal answers a tools/call
// that may or may not have run and that it will not replay (docs/healing.md, "Replay
// rules").
const codeMayHaveRun = -32011

// sameAsDirect checks that what an agent saw through mcpheal (got) is what
// the same client saw talking to the server directly (want).
func sameAsDirect(t *testing.T, got, want result) {
	t.Helper()
	if !want.OK {
		t.Fatalf("directly: %v", want)
	}
	if !got.OK {
		t.Fatalf("through mcpheal: %v; directly it worked", got)
	}
	switch want.Op {
	case "connect":
		if got.ServerName != want.ServerName || got.InstructionsLen != want.InstructionsLen || got.InstructionsSha256 != want.InstructionsSha256 {
			t.Errorf("initialize through mcpheal: server %q, instructions %d bytes sha256 %.12s; directly: %q, %d bytes sha256 %.12s",
				got.ServerName, got.InstructionsLen, got.InstructionsSha256, want.ServerName, want.InstructionsLen, want.InstructionsSha256)
		}
	case "list":
		if got.Count != want.Count || strings.Join(got.Names, ",") != strings.Join(want.Names, ",") {
			t.Errorf("tools/list through mcpheal: %d tools %v; directly: %d tools %v", got.Count, got.Names, want.Count, want.Names)
		}
	case "call":
		if got.IsError != want.IsError || got.TextLen != want.TextLen || got.TextSha256 != want.TextSha256 {
			t.Errorf("tools/call through mcpheal: isError %v, %d bytes sha256 %.12s (%.40q); directly: isError %v, %d bytes sha256 %.12s (%.40q)",
				got.IsError, got.TextLen, got.TextSha256, got.TextHead, want.IsError, want.TextLen, want.TextSha256, want.TextHead)
		}
	}
}

// pair is one client flavour connected to a server twice: directly and
// through mcpheal.
type pair struct{ direct, proxied agent }

func newPair(t *testing.T, flavour, serverURL, proxyURL string) pair {
	t.Helper()
	return pair{
		direct:  newAgent(t, flavour, serverURL, "direct-"+flavour),
		proxied: newAgent(t, flavour, proxyURL, "proxied-"+flavour),
	}
}

// both runs op on both agents, compares, and returns the proxied result.
func (p pair) both(t *testing.T, op func(agent) result) result {
	t.Helper()
	want, got := op(p.direct), op(p.proxied)
	sameAsDirect(t, got, want)
	return got
}

func connect(a agent) result { return a.connect() }
func list(a agent) result    { return a.list() }

// TestPlainUse: each real client works through mcpheal exactly as it does
// directly against each real server (npm's and, for the npm clients, the
// Python stack's: TestPyPlainUse runs the Python clients): the same
// initialize, the same tools, the same tool result.
func TestPlainUse(t *testing.T) {
	t.Parallel()
	servers := []struct {
		name      string
		start     func(*testing.T) *server
		tool      string
		args      map[string]any
		wantTools int // 0: whatever the server lists directly to that client
	}{
		{"ts-sdk-v1-server", func(t *testing.T) *server { return startV1Server(t, v1Opts{}) }, "echo", map[string]any{"text": "plain use"}, 3},
		{"server-everything", func(t *testing.T) *server { return startEverything(t) }, "echo", map[string]any{"message": "plain use"}, 0},
		{"fastmcp", func(t *testing.T) *server { return startFastMCP(t) }, "echo", map[string]any{"text": "plain use"}, 2},
		{"fastmcp-py", func(t *testing.T) *server { return startPyServer(t, pyServerOpts{impl: pyFastMCP}) }, "echo", map[string]any{"text": "plain use"}, 7},
		{"mcpserver-py-json", func(t *testing.T) *server { return startPyServer(t, pyServerOpts{impl: pyMCPServer, json: true}) }, "echo", map[string]any{"text": "plain use"}, 7},
	}
	for _, sv := range servers {
		t.Run(sv.name, func(t *testing.T) {
			t.Parallel()
			srv := sv.start(t)
			proxyURL := startProxy(t, srv.url())
			for _, flavour := range flavours {
				t.Run(flavour, func(t *testing.T) {
					t.Parallel()
					p := newPair(t, flavour, srv.url(), proxyURL)
					p.both(t, connect)
					l := p.both(t, list)
					if sv.wantTools != 0 && l.Count != sv.wantTools {
						t.Errorf("tools/list: %d tools, want %d", l.Count, sv.wantTools)
					}
					c := p.both(t, func(a agent) result { return a.call(sv.tool, sv.args) })
					if c.IsError || !strings.Contains(c.TextHead, "plain use") {
						t.Errorf("tools/call %s: isError %v, text %q, want it to echo %q", sv.tool, c.IsError, c.TextHead, "plain use")
					}
				})
			}
		})
	}
}

// TestInitializeOver4KiB: an initialize answered as one SSE event of more
// than 4 KiB (12 KB of instructions, multi-byte UTF-8 included) reaches every
// client whole. mcpheal once cut such answers at 4096 bytes; mcp-remote then
// waited 30 s for its initialize and gave up.
func TestInitializeOver4KiB(t *testing.T) {
	t.Parallel()
	srv := startV1Server(t, v1Opts{instructions: 12288})
	ct, body := rawInitialize(t, srv.url())
	checkBigEvent(t, "initialize", ct, body)
	proxyURL := startProxy(t, srv.url())
	for _, flavour := range flavours {
		t.Run(flavour, func(t *testing.T) {
			t.Parallel()
			p := newPair(t, flavour, srv.url(), proxyURL)
			c := p.both(t, connect)
			if c.InstructionsLen != 12288 {
				t.Errorf("instructions: %d bytes, want 12288", c.InstructionsLen)
			}
		})
	}
}

// TestToolsListOver4KiB: a tools/list answered as one SSE event of more than
// 4 KiB (server-everything's 13+ tools, about 8 KB; the TS v1 server's 43
// tools) lists as many tools through mcpheal as directly.
func TestToolsListOver4KiB(t *testing.T) {
	t.Parallel()
	servers := []struct {
		name  string
		start func(*testing.T) *server
	}{
		{"server-everything", func(t *testing.T) *server { return startEverything(t) }},
		{"ts-sdk-v1-server", func(t *testing.T) *server { return startV1Server(t, v1Opts{fillers: 40}) }},
	}
	for _, sv := range servers {
		t.Run(sv.name, func(t *testing.T) {
			t.Parallel()
			srv := sv.start(t)
			ct, body := rawToolsList(t, srv.url())
			checkBigEvent(t, "tools/list", ct, body)
			proxyURL := startProxy(t, srv.url())
			for _, flavour := range flavours {
				t.Run(flavour, func(t *testing.T) {
					t.Parallel()
					p := newPair(t, flavour, srv.url(), proxyURL)
					p.both(t, connect)
					if l := p.both(t, list); l.Count < 10 {
						t.Errorf("tools/list: %d tools, want the server's full list", l.Count)
					}
				})
			}
		})
	}
}

// TestUpstreamRestart: the server restarts (SIGKILL, then the same port)
// between two calls. Through mcpheal the client's next call works, after
// exactly one new upstream session; the same client talking to the server
// directly fails (it resends the dead session id), which shows that mcpheal
// is what heals.
func TestUpstreamRestart(t *testing.T) {
	t.Parallel()
	for _, flavour := range flavours {
		t.Run(flavour, func(t *testing.T) {
			t.Parallel()
			srv := startV1Server(t, v1Opts{restartable: true})
			proxyURL := startProxy(t, srv.url())
			p := newPair(t, flavour, srv.url(), proxyURL)
			p.both(t, connect)
			p.both(t, list)
			p.both(t, func(a agent) result { return a.call("echo", map[string]any{"text": "before"}) })

			srv.restart()

			for _, text := range []string{"after restart", "and again"} {
				r := p.proxied.call("echo", map[string]any{"text": text})
				if !r.OK || r.IsError || r.TextHead != text {
					t.Fatalf("through mcpheal after the restart: %v, text %q; want %q", r, r.TextHead, text)
				}
			}
			// mcp-remote appends " (via mcp-remote 0.15.1)" to the clientInfo
			// name, and opens a session of its own ("mcp-remote-fallback-test").
			name := "INITIALIZE proxied-" + flavour
			if n := srv.proc.out.count(func(l string) bool { return l == name || strings.HasPrefix(l, name+" (via ") }); n != 1 {
				t.Errorf("the restarted server saw %d initialize from mcpheal, want 1 (one heal)", n)
			}

			// None of these clients heals by itself: each resends the dead
			// session id (the server answers 400 "No valid session ID").
			if direct := p.direct.call("echo", map[string]any{"text": "after restart"}); direct.OK {
				t.Errorf("directly after the restart %s got %q: it healed by itself, so this test no longer shows that mcpheal is what heals", flavour, direct.TextHead)
			} else {
				t.Logf("directly after the restart %s: %v", flavour, direct)
			}
		})
	}
}

// TestToolCallInFlightWhenServerDies: the server dies (SIGKILL) while a tool
// without annotations runs, and comes back on the same port. The tool must
// not run a second time: mcpheal answers JSON-RPC -32011 ("may or may not
// have run") instead of replaying, and the agent's session keeps working.
// The server dies after its SSE answer's head, either before any event or
// after a first event (a log notification the tool sends as it starts).
func TestToolCallInFlightWhenServerDies(t *testing.T) {
	t.Parallel()
	for _, flavour := range flavours {
		for _, notify := range []bool{false, true} {
			name := flavour + "/no-event-yet"
			if notify {
				name = flavour + "/after-first-event"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				countFile := filepath.Join(t.TempDir(), "work.count")
				srv := startV1Server(t, v1Opts{countFile: countFile, restartable: true})
				s, proxyURL := startProxyServer(t, srv.url())
				a := newAgent(t, flavour, proxyURL, "proxied-"+flavour)
				if r := a.connect(); !r.OK {
					t.Fatalf("through mcpheal: %v", r)
				}
				if r := a.list(); !r.OK {
					t.Fatalf("through mcpheal: %v", r) // mcpheal learns the tools' annotations here
				}

				wait := a.callAsync("work", map[string]any{"tag": flavour, "ms": 3000, "notify": notify})
				if !waitForLines(countFile, 1, 20*time.Second) {
					t.Fatalf("the work tool did not start within 10 s; client says %v", wait())
				}
				time.Sleep(300 * time.Millisecond) // let the notification, if any, reach mcpheal
				srv.restart()
				r := wait()
				if !r.hasCode(codeMayHaveRun) {
					t.Errorf("tools/call in flight when the server died: %v (text %q); want JSON-RPC error %d", r, r.TextHead, codeMayHaveRun)
				}

				after := a.call("echo", map[string]any{"text": "still here"})
				if !after.OK || after.TextHead != "still here" {
					t.Errorf("the next call through mcpheal: %v, text %q; want the session to work", after, after.TextHead)
				}
				// Both calls have their answers, each given after its last
				// exchange ended, and none that may have run was sent again:
				// no send is left to run the tool later.
				if n := s.Stats().UnsafeResends; n != 0 {
					t.Errorf("mcpheal sent a request that is not replay-safe again %d times", n)
				}
				if n := countLines(countFile); n != 1 {
					t.Errorf("the work tool ran %d times across both server lives, want exactly 1", n)
				}
			})
		}
	}
}

// TestLargeSingleEventResult: a 12 MiB tool result, one SSE event, reaches
// every client whole and byte-identical to what the client gets directly.
func TestLargeSingleEventResult(t *testing.T) {
	t.Parallel()
	const size = 12 << 20
	srv := startV1Server(t, v1Opts{})
	proxyURL := startProxy(t, srv.url())
	// One flavour at a time: three 12 MiB answers at once from one node
	// process on a 2-core machine would test the machine.
	for _, flavour := range flavours {
		t.Run(flavour, func(t *testing.T) {
			p := newPair(t, flavour, srv.url(), proxyURL)
			p.both(t, connect)
			var took []time.Duration // directly, through mcpheal
			defer func() { t.Logf("12 MiB tool result took %v (directly, through mcpheal)", took) }()
			c := p.both(t, func(a agent) result {
				start := time.Now()
				defer func() { took = append(took, time.Since(start).Round(time.Millisecond)) }()
				return a.call("big", map[string]any{"bytes": size})
			})
			if c.TextLen != size {
				t.Errorf("big result: %d bytes, want %d", c.TextLen, size)
			}
		})
	}
}

// checkBigEvent checks that a fixture answers what its scenario is about: an
// SSE answer holding one event over 4 KiB.
func checkBigEvent(t *testing.T, what, contentType string, body []byte) {
	t.Helper()
	var sizes []int
	for ev := range strings.SplitSeq(strings.ReplaceAll(string(body), "\r\n", "\n"), "\n\n") {
		if ev != "" {
			sizes = append(sizes, len(ev))
		}
	}
	t.Logf("fixture: %s answered %q, %d bytes, event sizes %v", what, contentType, len(body), sizes)
	if !strings.HasPrefix(contentType, "text/event-stream") || len(sizes) == 0 || slices.Max(sizes) <= 4096 {
		t.Fatalf("fixture: %s is not answered as an SSE event over 4096 bytes", what)
	}
}

// waitForLines waits until file has at least n lines.
func waitForLines(file string, n int, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if countLines(file) >= n {
			return true
		}
		time.Sleep(20 * time.Millisecond)
	}
	return false
}

func countLines(file string) int {
	b, _ := os.ReadFile(file)
	return bytes.Count(b, []byte("\n"))
}

// rawPost sends one JSON-RPC message as the TS SDK client does and returns
// the answer's content type, session id and body.
func rawPost(t *testing.T, url, session, body string) (string, string, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if session != "" {
		req.Header.Set("Mcp-Session-Id", session)
		req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	}
	resp, err := (&http.Client{Timeout: opTimeout}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.Header.Get("Content-Type"), resp.Header.Get("Mcp-Session-Id"), b
}

const rawInit = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`

// rawInitialize is the server's own answer to an initialize, to check that
// a fixture answers the way its scenario needs.
func rawInitialize(t *testing.T, url string) (string, []byte) {
	t.Helper()
	ct, _, body := rawPost(t, url, "", rawInit)
	return ct, body
}

// rawToolsList is the server's own answer to a tools/list.
func rawToolsList(t *testing.T, url string) (string, []byte) {
	t.Helper()
	_, sid, _ := rawPost(t, url, "", rawInit)
	rawPost(t, url, sid, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	ct, _, body := rawPost(t, url, sid, `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`)
	return ct, body
}

// result is what an agent saw for one operation, the same shape for every
// client: testdata/client.mjs prints it, mcp-remote's raw answers are
// reduced to it. Lengths are UTF-8 bytes.
type result struct {
	Op      string `json:"op"`
	OK      bool   `json:"ok"`
	Code    *int   `json:"code"` // JSON-RPC error code (an HTTP status for the SDKs' HTTP errors)
	Message string `json:"message"`
	Kind    string `json:"kind"` // the error's class, or "timeout"

	ServerName         string `json:"serverName"`
	InstructionsLen    int    `json:"instructionsLen"`
	InstructionsSha256 string `json:"instructionsSha256"`

	Count int      `json:"count"`
	Names []string `json:"names"`

	IsError    bool   `json:"isError"`
	TextLen    int    `json:"textLen"`
	TextSha256 string `json:"textSha256"`
	TextHead   string `json:"textHead"`

	// The Python agents (testdata/python) also answer these: the progress
	// notifications a call received, the string Hermes handed its model,
	// and the events and waitEvent counts.
	ProgressCount  int    `json:"progressCount"`
	Raw            string `json:"raw"`
	ToolsChanged   int    `json:"toolsChanged"`
	ToolsRefreshed int    `json:"toolsRefreshed"`
	Reconnects     int    `json:"reconnects"`
	Logs           int    `json:"logs"`
}

func (r result) String() string {
	if r.OK {
		return fmt.Sprintf("%s ok", r.Op)
	}
	code := "none"
	if r.Code != nil {
		code = strconv.Itoa(*r.Code)
	}
	return fmt.Sprintf("%s failed: code %s, %s: %s", r.Op, code, r.Kind, r.Message)
}

// hasCode says whether r is an error with JSON-RPC code c.
func (r result) hasCode(c int) bool { return !r.OK && r.Code != nil && *r.Code == c }

// agent is one MCP client session, driven one operation at a time.
type agent interface {
	connect() result
	list() result
	call(name string, args map[string]any) result
	// callAsync sends a tools/call and returns a function that waits for
	// its answer.
	callAsync(name string, args map[string]any) func() result
}

// flavours are the clients every scenario runs.
var flavours = []string{"ts-sdk-v1", "ts-sdk-v2", "mcp-remote"}

// newAgent starts a client of the given flavour for url; name is the
// clientInfo name the server sees.
func newAgent(t testing.TB, flavour, url, name string) agent {
	t.Helper()
	switch flavour {
	case "ts-sdk-v1":
		return startSDKClient(t, "v1", url, name)
	case "ts-sdk-v2":
		return startSDKClient(t, "v2", url, name)
	case "mcp-remote":
		return startRemote(t, url, name)
	case "hermes":
		return startHermes(t, url, name)
	case "py-sdk", "py-client-auto", "py-client-legacy", "fastmcp-py":
		return startPyClient(t, flavour, url, name)
	}
	t.Fatalf("unknown client %q", flavour)
	return nil
}

// sdkClient is testdata/client.mjs: the TS SDK's Client and
// StreamableHTTPClientTransport (v1 @modelcontextprotocol/sdk, v2
// @modelcontextprotocol/client).
type sdkClient struct {
	t    testing.TB
	p    *nodeProc
	next int // first stdout line not yet consumed
	// timeout bounds the wait for each answer; zero means opTimeout.
	timeout time.Duration
}

func startSDKClient(t testing.TB, version, url, name string) *sdkClient {
	t.Helper()
	env := []string{"CLIENT_NAME=" + name, fmt.Sprintf("REQUEST_TIMEOUT_MS=%d", sdkTimeout.Milliseconds())}
	return &sdkClient{t: t, p: startNode(t, "client-"+version+" "+name, env, "client.mjs", version, url)}
}

func (c *sdkClient) send(cmd map[string]any) {
	c.t.Helper()
	b, err := json.Marshal(cmd)
	if err != nil {
		c.t.Fatal(err)
	}
	c.p.send(c.t, b)
}

func (c *sdkClient) wait(op string) result {
	c.t.Helper()
	wait := c.timeout
	if wait == 0 {
		wait = opTimeout
	}
	i, line, ok := c.p.out.waitFor(c.next, wait, func(l string) bool { return strings.HasPrefix(l, "RESULT ") })
	if !ok {
		return result{Op: op, Kind: "timeout", Message: fmt.Sprintf("no answer within %v; client stderr:\n%s", wait, c.p.stderr.String())}
	}
	c.next = i + 1
	var r result
	if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "RESULT ")), &r); err != nil {
		c.t.Fatalf("client output %q: %v", line, err)
	}
	return r
}

func (c *sdkClient) do(cmd map[string]any) result {
	c.t.Helper()
	c.send(cmd)
	return c.wait(cmd["op"].(string))
}

func (c *sdkClient) connect() result { return c.do(map[string]any{"op": "connect"}) }
func (c *sdkClient) list() result    { return c.do(map[string]any{"op": "list"}) }

func (c *sdkClient) call(name string, args map[string]any) result {
	return c.callAsync(name, args)()
}

func (c *sdkClient) callAsync(name string, args map[string]any) func() result {
	c.send(map[string]any{"op": "call", "name": name, "arguments": args})
	return func() result { return c.wait("call") }
}

// remote is mcp-remote, the stdio↔Streamable HTTP bridge desktop hosts run:
// the test writes JSON-RPC lines to its stdin as a stdio host would and
// reads its stdout.
type remote struct {
	t      testing.TB
	p      *nodeProc
	name   string
	lastID int
}

func startRemote(t testing.TB, url, name string) *remote {
	t.Helper()
	// MCP_REMOTE_CONFIG_DIR keeps its OAuth state away from ~/.mcp-auth.
	env := []string{"MCP_REMOTE_CONFIG_DIR=" + t.TempDir()}
	p := startNode(t, "mcp-remote "+name, env, "node_modules/mcp-remote/dist/proxy.js", url, "--transport", "http-only")
	return &remote{t: t, p: p, name: name}
}

// rpcMessage is one JSON-RPC line from mcp-remote's stdout.
type rpcMessage struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	Result json.RawMessage `json:"result"`
	Error  *struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// request sends a request and returns a function that waits for the answer
// with its id (a stdio host matches answers by id too). A nil message means
// no answer within opTimeout.
func (r *remote) request(method string, params any) func() (*rpcMessage, int) {
	r.t.Helper()
	r.lastID++
	id := strconv.Itoa(r.lastID)
	b, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": r.lastID, "method": method, "params": params})
	if err != nil {
		r.t.Fatal(err)
	}
	r.p.send(r.t, b)
	return func() (*rpcMessage, int) {
		var m rpcMessage
		_, line, ok := r.p.out.waitFor(0, opTimeout, func(l string) bool {
			var probe struct {
				ID     json.RawMessage `json:"id"`
				Method string          `json:"method"`
			}
			return json.Unmarshal([]byte(l), &probe) == nil && probe.Method == "" && string(probe.ID) == id
		})
		if !ok {
			return nil, 0
		}
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			r.t.Fatalf("mcp-remote output: %v", err)
		}
		return &m, len(line)
	}
}

// toResult reduces an answer to a result; fill reads a successful one.
func (r *remote) toResult(op string, m *rpcMessage, fill func(*result) error) result {
	if m == nil {
		return result{Op: op, Kind: "timeout", Message: fmt.Sprintf("no answer within %v; mcp-remote stderr:\n%s", opTimeout, r.p.stderr.String())}
	}
	if m.Error != nil {
		code := m.Error.Code
		return result{Op: op, Code: &code, Kind: "JSON-RPC error", Message: m.Error.Message}
	}
	res := result{Op: op, OK: true}
	if err := fill(&res); err != nil {
		return result{Op: op, Kind: "bad result", Message: err.Error()}
	}
	return res
}

func (r *remote) connect() result {
	m, _ := r.request("initialize", map[string]any{
		"protocolVersion": "2025-11-25",
		"capabilities":    map[string]any{},
		"clientInfo":      map[string]any{"name": r.name, "version": "1.0.0"},
	})()
	res := r.toResult("connect", m, func(res *result) error {
		var v struct {
			ServerInfo   struct{ Name string } `json:"serverInfo"`
			Instructions string                `json:"instructions"`
		}
		if err := json.Unmarshal(m.Result, &v); err != nil {
			return err
		}
		res.ServerName = v.ServerInfo.Name
		res.InstructionsLen, res.InstructionsSha256 = digest(v.Instructions)
		return nil
	})
	if res.OK {
		b := []byte(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)
		r.p.send(r.t, b)
	}
	return res
}

func (r *remote) list() result {
	var names []string
	cursor := ""
	for {
		params := map[string]any{}
		if cursor != "" {
			params["cursor"] = cursor
		}
		m, _ := r.request("tools/list", params)()
		var next string
		res := r.toResult("list", m, func(*result) error {
			var v struct {
				Tools      []struct{ Name string } `json:"tools"`
				NextCursor string                  `json:"nextCursor"`
			}
			if err := json.Unmarshal(m.Result, &v); err != nil {
				return err
			}
			for _, tool := range v.Tools {
				names = append(names, tool.Name)
			}
			next = v.NextCursor
			return nil
		})
		if !res.OK || next == "" {
			res.Names, res.Count = names, len(names)
			return res
		}
		cursor = next
	}
}

func (r *remote) call(name string, args map[string]any) result {
	return r.callAsync(name, args)()
}

func (r *remote) callAsync(name string, args map[string]any) func() result {
	wait := r.request("tools/call", map[string]any{"name": name, "arguments": args})
	return func() result {
		m, _ := wait()
		return r.toResult("call", m, func(res *result) error {
			var v struct {
				IsError bool `json:"isError"`
				Content []struct {
					Type string `json:"type"`
					Text string `json:"text"`
				} `json:"content"`
			}
			if err := json.Unmarshal(m.Result, &v); err != nil {
				return err
			}
			var text strings.Builder
			for _, c := range v.Content {
				if c.Type == "text" {
					text.WriteString(c.Text)
				}
			}
			res.IsError = v.IsError
			res.TextLen, res.TextSha256 = digest(text.String())
			res.TextHead = text.String()[:min(200, text.Len())]
			return nil
		})
	}
}

// digest is a string's UTF-8 length and SHA-256, as client.mjs computes them.
func digest(s string) (int, string) {
	h := sha256.Sum256([]byte(s))
	return len(s), hex.EncodeToString(h[:])
}

// TestOneSessionServer: a server that allows one session (the TS SDK v1's
// transport created once: a second initialize gets 400 "Server already
// initialized"). Through mcpheal an agent's session, mcpheal's start-up
// probe and its keepalive pings never ask it for a second session; after a
// restart (a new server, a new single session) the agent's next call heals
// into it with one initialize. Counted server-side.
func TestOneSessionServer(t *testing.T) {
	t.Parallel()
	srv := startServer(t, "onesession", freeFixedPort(t), nil, "onesession.mjs")
	_, url := startProxyConfig(t, proxy.Config{Upstream: srv.url(), Keepalive: 100 * time.Millisecond}, &tail{max: 64 << 10})
	_, sid, initAns := rawPost(t, url, "", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25",`+
		`"capabilities":{},"clientInfo":{"name":"agent","version":"1"}}}`)
	if sid == "" {
		t.Fatalf("no session: %s", initAns)
	}
	rawPost(t, url, sid, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	echo := `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo","arguments":{"text":"one"}}}`
	if _, _, body := rawPost(t, url, sid, echo); !strings.Contains(string(body), `"one"`) {
		t.Fatalf("echo: %s", body)
	}
	// Quiet: mcpheal's keepalive pings the session, three times.
	from := 0
	for i := range 3 {
		n, _, ok := srv.proc.out.waitFor(from, 10*time.Second, func(l string) bool { return l == "PING" })
		if !ok {
			t.Fatalf("keepalive ping %d did not reach the server", i+1)
		}
		from = n + 1
	}
	if _, _, body := rawPost(t, url, sid, echo); !strings.Contains(string(body), `"one"`) {
		t.Fatalf("echo after the pings: %s", body)
	}
	count := func(prefix string) int {
		return srv.proc.out.count(func(l string) bool { return strings.HasPrefix(l, prefix) })
	}
	if n, r := count("INITIALIZE "), count("REFUSED "); n != 1 || r != 0 {
		t.Fatalf("the one-session server saw %d initializes and refused %d; want 1 and 0", n, r)
	}

	srv.restart()
	if _, _, body := rawPost(t, url, sid, echo); !strings.Contains(string(body), `"one"`) {
		t.Fatalf("echo after the restart: %s", body)
	}
	if n, r := count("INITIALIZE "), count("REFUSED "); n != 1 || r != 0 {
		t.Errorf("the restarted server saw %d initializes and refused %d; want 1 (the heal) and 0", n, r)
	}
}
