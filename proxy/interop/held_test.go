//go:build unix

package interop

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The held-route tests: an agent of MCP 2026-07-28 (the TS SDK v2 client
// pinned to that revision, testdata/client2026.mjs: no initialize, no
// session, server→client requests answered in a retry's inputResponses,
// cancellation by closing the request's connection) against servers of the
// session era only: server-everything (TS SDK v1), fastmcp, and two TS SDK
// v1 fixtures of ours (v1server.mjs, v1inputs.mjs). Directly the pinned
// client fails at connect (ERA_NEGOTIATION_FAILED); through mcpheal, which
// answers server/discover itself and holds an upstream session for the
// agent (docs/eras.md "2026-07-28 agents, session-era servers"), it works, and
// keeps working across a restart of the server and the end of the session
// it holds.

const (
	// heldVersion is the protocol revision the pinned client speaks.
	heldVersion = "2026-07-28"
	// codeEraFailed is the TS SDK v2's error for a server that does not
	// offer the pinned revision.
	codeEraFailed = "ERA_NEGOTIATION_FAILED"
	// everythingURI is a resource server-everything lists; any URI can be
	// subscribed there.
	everythingURI = "demo://resource/static/document/architecture.md"
	// fastmcpURI is the resource testdata/fastmcp.mjs serves with HELD_TOOLS=1.
	fastmcpURI = "test://held/r1"
)

// heldResult is a client2026.mjs answer.
type heldResult struct {
	result
	SdkCode       string          `json:"sdkCode"`
	Era           string          `json:"era"`
	Version       string          `json:"version"`
	SessionID     *string         `json:"sessionId"`
	ProgressCount *int            `json:"progressCount"`
	Honored       json.RawMessage `json:"honored"`
	Updates       []string        `json:"updates"`
	Inputs        []heldInput     `json:"inputs"`
	Prompts       []string        `json:"prompts"`
	Resources     []string        `json:"resources"`
	Templates     []string        `json:"templates"`
}

// heldInput is one server request the client's handlers answered.
type heldInput struct {
	Method string `json:"method"`
	Text   string `json:"text"`
}

func (r heldResult) String() string {
	if r.OK {
		return r.Op + " ok"
	}
	code := "none"
	if r.Code != nil {
		code = strconv.Itoa(*r.Code)
	}
	if r.SdkCode != "" {
		code = r.SdkCode
	}
	// The SDK's validation errors are indented JSON: one line reads better.
	return fmt.Sprintf("%s failed: code %s, %s: %.1500s", r.Op, code, r.Kind, strings.Join(strings.Fields(r.Message), " "))
}

// heldClient is testdata/client2026.mjs: the TS SDK v2 client pinned to
// 2026-07-28, declaring sampling, elicitation and roots.
type heldClient struct {
	t    testing.TB
	p    *nodeProc
	next int // first stdout line not yet consumed
}

func startHeldClient(t testing.TB, url, name string) *heldClient {
	t.Helper()
	env := []string{"CLIENT_NAME=" + name, fmt.Sprintf("REQUEST_TIMEOUT_MS=%d", sdkTimeout.Milliseconds())}
	return &heldClient{t: t, p: startNode(t, "client2026 "+name, env, "client2026.mjs", url)}
}

func (c *heldClient) send(cmd map[string]any) {
	c.t.Helper()
	b, err := json.Marshal(cmd)
	if err != nil {
		c.t.Fatal(err)
	}
	c.p.send(c.t, b)
}

// wait reads the answer to the oldest command not yet answered (the client
// runs its commands one at a time, in order).
func (c *heldClient) wait(op string) heldResult {
	c.t.Helper()
	i, line, ok := c.p.out.waitFor(c.next, opTimeout, func(l string) bool { return strings.HasPrefix(l, "RESULT ") })
	if !ok {
		return heldResult{result: result{Op: op, Kind: "timeout", Message: fmt.Sprintf("no answer within %v; client stderr:\n%s", opTimeout, c.p.stderr.String())}}
	}
	c.next = i + 1
	var r heldResult
	if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "RESULT ")), &r); err != nil {
		c.t.Fatalf("client output %q: %v", line, err)
	}
	return r
}

func (c *heldClient) ask(cmd map[string]any) heldResult {
	c.t.Helper()
	c.send(cmd)
	return c.wait(cmd["op"].(string))
}

func (c *heldClient) connect() heldResult { return c.ask(map[string]any{"op": "connect"}) }
func (c *heldClient) list() heldResult    { return c.ask(map[string]any{"op": "list"}) }

func (c *heldClient) call(name string, args map[string]any) heldResult {
	c.t.Helper()
	return c.ask(map[string]any{"op": "call", "name": name, "arguments": args})
}

// callAsync sends a tools/call and returns a function that waits for its
// answer.
func (c *heldClient) callAsync(name string, args map[string]any) func() heldResult {
	c.t.Helper()
	c.send(map[string]any{"op": "call", "name": name, "arguments": args})
	return func() heldResult { return c.wait("call") }
}

// mustConnect connects through mcpheal and fails t unless the client speaks
// 2026-07-28 with the server named want, and holds no session id.
func (c *heldClient) mustConnect(t *testing.T, want string) heldResult {
	t.Helper()
	r := c.connect()
	if !r.OK {
		t.Fatalf("connect through mcpheal: %v", r)
	}
	if r.Era != "modern" || r.Version != heldVersion || r.ServerName != want {
		t.Fatalf("connect through mcpheal: era %q, version %q, server %q; want modern, %s, %q", r.Era, r.Version, r.ServerName, heldVersion, want)
	}
	if r.SessionID != nil {
		t.Errorf("the pinned client got a session id (%q): the held session's id must never reach a 2026-07-28 agent", *r.SessionID)
	}
	return r
}

// callText calls a tool and fails t unless it answers without isError and
// its text contains each of want.
func (c *heldClient) callText(t *testing.T, name string, args map[string]any, want ...string) heldResult {
	t.Helper()
	r := c.call(name, args)
	if !r.OK || r.IsError {
		t.Errorf("tools/call %s: %v, isError %v, text %q", name, r, r.IsError, r.TextHead)
		return r
	}
	for _, w := range want {
		if !strings.Contains(r.TextHead, w) {
			t.Errorf("tools/call %s: text %q; want it to contain %q", name, r.TextHead, w)
		}
	}
	return r
}

// updatesOf says how many notifications/resources/updated for uri the
// client has received.
func (c *heldClient) updatesOf(t *testing.T, uri string) int {
	t.Helper()
	r := c.ask(map[string]any{"op": "updates"})
	if !r.OK {
		t.Fatalf("updates: %v", r)
	}
	n := 0
	for _, u := range r.Updates {
		if u == uri {
			n++
		}
	}
	return n
}

// waitUpdates polls the client until it has received more than have updates
// of uri, or d passes; poke, if not nil, runs before each poll (it makes the
// server publish one). It returns the count.
func (c *heldClient) waitUpdates(t *testing.T, uri string, have int, d time.Duration, poke func()) int {
	t.Helper()
	start := time.Now()
	for {
		if poke != nil {
			poke()
		}
		time.Sleep(300 * time.Millisecond)
		if n := c.updatesOf(t, uri); n > have || time.Since(start) > d {
			t.Logf("%d updates of %s after %v", n, uri, time.Since(start).Round(time.Millisecond))
			return n
		}
	}
}

// heldServer is one session-era server of the held-route tests.
type heldServer struct {
	name string
	// start runs it on port (0: any), with countFile for its work tool (if
	// it has one), printing "SESSION <id>" for each session it opens
	// (testdata/sessionlog.mjs).
	start func(t *testing.T, port int, countFile string) *server
	// serverName is the serverInfo name it announces.
	serverName string
	// echo is a tool call and the text its answer contains.
	echo     string
	echoArgs func(text string) map[string]any
	// work says whether it has the work tool (not replay-safe, counted).
	work bool
	// progress, if set, is a tool call that sends 3 progress notifications
	// when asked for progress.
	progress     string
	progressArgs map[string]any
	// sample, if set, is a tool call that sends sampling/createMessage on
	// its answer: it reaches the agent only if the upstream session was
	// opened with the agent's capabilities (server-everything lists it only
	// then).
	sample     string
	sampleArgs map[string]any
	// lists are how many prompts, resources and resource templates it
	// lists (nil: not checked).
	lists []int
	// read is a resource it serves and the file holding its text
	// (testdata-relative), or the text itself.
	read, readFile, readText string
}

var (
	heldEverything = heldServer{
		name: "server-everything",
		start: func(t *testing.T, port int, _ string) *server {
			return startServer(t, "server-everything", port, nil, "--import", "./sessionlog.mjs",
				"node_modules/@modelcontextprotocol/server-everything/dist/index.js", "streamableHttp")
		},
		serverName:   "mcp-servers/everything",
		echo:         "echo",
		echoArgs:     func(text string) map[string]any { return map[string]any{"message": text} },
		progress:     "trigger-long-running-operation",
		progressArgs: map[string]any{"duration": 0.3, "steps": 3},
		sample:       "trigger-sampling-request",
		sampleArgs:   map[string]any{"prompt": "after a heal", "maxTokens": 5},
		read:         everythingURI,
		readFile:     "node_modules/@modelcontextprotocol/server-everything/dist/docs/architecture.md",
	}
	heldFastMCP = heldServer{
		name: "fastmcp",
		start: func(t *testing.T, port int, countFile string) *server {
			return startServer(t, "fastmcp", port, []string{"HELD_TOOLS=1", "COUNT_FILE=" + countFile},
				"--import", "./sessionlog.mjs", "fastmcp.mjs")
		},
		serverName:   "mcpheal-interop-fastmcp",
		echo:         "echo",
		echoArgs:     func(text string) map[string]any { return map[string]any{"text": text} },
		work:         true,
		progress:     "slow",
		progressArgs: map[string]any{"tag": "progress", "ms": 300},
		lists:        []int{0, 1, 0},
		read:         fastmcpURI,
		readText:     "r1",
	}
	heldV1 = heldServer{
		name: "ts-sdk-v1-server",
		start: func(t *testing.T, port int, countFile string) *server {
			return startServer(t, "v1server", port, []string{"COUNT_FILE=" + countFile, "INSTRUCTIONS_BYTES=200", "FILLER_TOOLS=0"},
				"--import", "./sessionlog.mjs", "v1server.mjs")
		},
		serverName: "mcpheal-interop-v1",
		echo:       "echo",
		echoArgs:   func(text string) map[string]any { return map[string]any{"text": text} },
		work:       true,
	}
)

// sessions returns the ids of the sessions a server life opened, in order.
func sessions(p *nodeProc) []string {
	p.out.mu.Lock()
	defer p.out.mu.Unlock()
	var ids []string
	for _, l := range p.out.lines {
		if id, ok := strings.CutPrefix(l, "SESSION "); ok {
			ids = append(ids, id)
		}
	}
	return ids
}

// expire ends the server's session id as a server that expires idle
// sessions does: a DELETE of its own, straight to the server. The server
// then answers the id as unknown (server-everything and v1server.mjs 400
// "No valid session ID provided", fastmcp 404 "Session not found").
func expire(t *testing.T, srv *server, id string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodDelete, srv.url(), nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Mcp-Session-Id", id)
	req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	resp, err := (&http.Client{Timeout: opTimeout}).Do(req)
	if err != nil {
		t.Fatalf("DELETE of session %s at %s: %v", id, srv.name, err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode >= 300 {
		t.Fatalf("DELETE of session %s at %s: HTTP %d", id, srv.name, resp.StatusCode)
	}
}

// lastSession returns the id of the last session a server life opened,
// failing t if it opened none.
func lastSession(t *testing.T, srv *server) string {
	t.Helper()
	ids := sessions(srv.proc)
	if len(ids) == 0 {
		t.Fatalf("%s printed no SESSION line: it opened no session", srv.name)
	}
	return ids[len(ids)-1]
}

// TestHeldBasics: directly, the pinned client cannot connect to any of the
// session-era servers (ERA_NEGOTIATION_FAILED: they refuse server/discover
// and it does not fall back). Through mcpheal it connects (mcpheal answers
// server/discover from the initialize of the session it holds: the
// server's name and instructions), lists the same tools a session-era
// client with the same capabilities lists directly, calls a tool, lists
// prompts, resources and templates and reads a resource (results MCP
// 2026-07-28 makes cacheable: ttlMs, cacheScope), and gets a tool's
// progress notifications; the server sees one session for the
// agent, and a second agent (another clientInfo) gets its own.
func TestHeldBasics(t *testing.T) {
	t.Parallel()
	for _, hs := range []heldServer{heldEverything, heldFastMCP, heldV1} {
		t.Run(hs.name, func(t *testing.T) {
			t.Parallel()
			srv := hs.start(t, 0, "")
			_, proxyURL := startProxyServer(t, srv.url())

			direct := startHeldClient(t, srv.url(), "held-direct").connect()
			if direct.OK {
				t.Fatalf("directly, the pinned client connected to %s (server %q, era %q): the held route tests no longer show that mcpheal is what makes it work",
					hs.name, direct.ServerName, direct.Era)
			}
			if direct.SdkCode != codeEraFailed {
				t.Errorf("directly, the pinned client failed to connect to %s with %v; want %s", hs.name, direct, codeEraFailed)
			}
			if n := len(sessions(srv.proc)); n != 0 {
				t.Errorf("directly, the pinned client made %s open %d sessions; it must not initialize at all", hs.name, n)
			}

			// What a session-era client with the same capabilities lists.
			legacy := startEraClient(t, "v2", srv.url(), "held-legacy")
			wantConnect := legacy.connect()
			want := legacy.list()
			if !want.OK || want.Count == 0 {
				t.Fatalf("a session-era client's tools/list, directly: %v", want)
			}
			before := len(sessions(srv.proc))

			if !wantConnect.OK {
				t.Fatalf("a session-era client's connect, directly: %v", wantConnect)
			}
			c := startHeldClient(t, proxyURL, "held-basics")
			if r := c.mustConnect(t, hs.serverName); r.InstructionsLen != wantConnect.InstructionsLen {
				t.Errorf("instructions through mcpheal (server/discover): %d bytes; a session-era client gets %d directly", r.InstructionsLen, wantConnect.InstructionsLen)
			}
			if got := c.list(); !got.OK || !sameNames(got.Names, want.Names) {
				t.Errorf("tools/list through mcpheal: %v, %d tools %v; a session-era client lists %d directly: %v",
					got, got.Count, got.Names, want.Count, want.Names)
			}
			c.callText(t, hs.echo, hs.echoArgs("über held"), "über held")
			c.callText(t, hs.echo, hs.echoArgs("again"), "again")
			if hs.lists != nil || hs.name == heldEverything.name {
				r := c.ask(map[string]any{"op": "lists"})
				got := []int{len(r.Prompts), len(r.Resources), len(r.Templates)}
				switch {
				case !r.OK:
					t.Errorf("prompts/list, resources/list, resources/templates/list through mcpheal: %v", r)
				case hs.lists != nil && !slices.Equal(got, hs.lists):
					t.Errorf("through mcpheal: %v prompts, resources, templates; want %v", got, hs.lists)
				case hs.lists == nil && slices.Contains(got, 0):
					t.Errorf("through mcpheal: %v prompts, resources, templates; want some of each", got)
				}
			}
			if hs.read != "" {
				want := hs.readText
				if hs.readFile != "" {
					b, err := os.ReadFile(filepath.Join(testdata, hs.readFile))
					if err != nil {
						t.Fatal(err)
					}
					want = string(b)
				}
				r := c.ask(map[string]any{"op": "read", "uri": hs.read})
				if !r.OK || r.TextLen != len(want) || !strings.HasPrefix(want, r.TextHead) {
					t.Errorf("resources/read %s through mcpheal: %v, %d bytes %.40q; want %d bytes %.40q", hs.read, r, r.TextLen, r.TextHead, len(want), want)
				}
			}
			if hs.progress != "" {
				r := c.ask(map[string]any{"op": "call", "name": hs.progress, "arguments": hs.progressArgs, "progress": true})
				if !r.OK || r.IsError || r.ProgressCount == nil || *r.ProgressCount != 3 {
					t.Errorf("tools/call %s with a progressToken: %v, isError %v, %v progress notifications; want 3", hs.progress, r, r.IsError, deref(r.ProgressCount))
				}
			}
			if n := len(sessions(srv.proc)) - before; n != 1 {
				t.Errorf("%s opened %d sessions for one pinned agent through mcpheal; want 1 (held, and shared by its requests)", hs.name, n)
			}

			other := startHeldClient(t, proxyURL, "held-basics-other")
			other.mustConnect(t, hs.serverName)
			other.callText(t, hs.echo, hs.echoArgs("other agent"), "other agent")
			if n := len(sessions(srv.proc)) - before; n != 2 {
				t.Errorf("%s has %d sessions for two pinned agents with different clientInfo; want 2 (one each)", hs.name, n)
			}
		})
	}
}

// TestHeldInputs: a server's sampling, elicitation and roots requests,
// sent on the tools/call's own SSE answer, reach the pinned agent as an
// InputRequiredResult; its handlers answer them, its automatic retry (new
// id, inputResponses, requestState) resumes the parked upstream call, and
// the tool's result carries the agent's answers. server-everything's
// trigger-sampling-request and trigger-elicitation-request, and
// v1inputs.mjs's roots-in-call and all-three (three requests in parallel:
// three rounds).
func TestHeldInputs(t *testing.T) {
	t.Parallel()
	t.Run("server-everything", func(t *testing.T) {
		t.Parallel()
		srv := heldEverything.start(t, 0, "")
		_, proxyURL := startProxyServer(t, srv.url())
		c := startHeldClient(t, proxyURL, "held-inputs")
		c.mustConnect(t, heldEverything.serverName)
		for round := range 2 { // the second round on the same held session works as the first
			prompt := "prompt " + strconv.Itoa(round)
			c.callText(t, "trigger-sampling-request", map[string]any{"prompt": prompt, "maxTokens": 5}, "sampled-by-held-agent", "held-test-model")
			c.callText(t, "trigger-elicitation-request", map[string]any{}, "held-agent")
		}
		r := c.ask(map[string]any{"op": "inputs"})
		var got []string
		for _, in := range r.Inputs {
			got = append(got, in.Method+": "+in.Text)
		}
		want := []string{
			"sampling/createMessage: Resource trigger-sampling-request context: prompt 0",
			"elicitation/create: Please provide inputs for the following fields:",
			"sampling/createMessage: Resource trigger-sampling-request context: prompt 1",
			"elicitation/create: Please provide inputs for the following fields:",
		}
		if !slices.Equal(got, want) {
			t.Errorf("the agent's handlers answered %q; want %q", got, want)
		}
	})
	t.Run("v1inputs", func(t *testing.T) {
		t.Parallel()
		srv := startServer(t, "v1inputs", 0, nil, "v1inputs.mjs")
		_, proxyURL := startProxyServer(t, srv.url())
		c := startHeldClient(t, proxyURL, "held-inputs")
		c.mustConnect(t, "mcpheal-interop-v1inputs")
		c.callText(t, "roots-in-call", map[string]any{}, "file:///tmp/mcpheal-held")
		c.callText(t, "all-three", map[string]any{}, `"name":"held-agent"`, "sampled-by-held-agent", "file:///tmp/mcpheal-held")
		r := c.ask(map[string]any{"op": "inputs"})
		var methods []string
		for _, in := range r.Inputs {
			methods = append(methods, in.Method)
		}
		tail := methods[min(1, len(methods)):]
		slices.Sort(tail)
		if len(methods) != 4 || methods[0] != "roots/list" ||
			!slices.Equal(tail, []string{"elicitation/create", "roots/list", "sampling/createMessage"}) {
			t.Errorf("the agent's handlers answered %q; want roots/list, then elicitation/create, sampling/createMessage and roots/list in any order", methods)
		}
	})
}

// TestHeldCancel: the pinned agent aborts a tools/call (AbortSignal; the
// SDK closes the request's connection and sends nothing else), either while
// the upstream's SSE answer has carried no message yet ("quiet") or after it
// relayed progress notifications ("streaming"). mcpheal tells the upstream
// (notifications/cancelled), whose tool then stops: the server prints
// CANCELLED, never COMPLETED. The agent's next call works. fastmcp (its
// tool's context.signal) and v1inputs.mjs (extra.signal).
func TestHeldCancel(t *testing.T) {
	t.Parallel()
	for _, sv := range []struct {
		name, serverName string
		start            func(t *testing.T) *server
		next             string // a tool call after the cancel, and its text
		nextArgs         map[string]any
		nextText         string
	}{
		{"fastmcp", heldFastMCP.serverName, func(t *testing.T) *server { return heldFastMCP.start(t, 0, "") },
			"echo", map[string]any{"text": "after cancel"}, "after cancel"},
		{"v1inputs", "mcpheal-interop-v1inputs", func(t *testing.T) *server { return startServer(t, "v1inputs", 0, nil, "v1inputs.mjs") },
			"roots-in-call", map[string]any{}, "file:///tmp/mcpheal-held"},
	} {
		t.Run(sv.name, func(t *testing.T) {
			t.Parallel()
			srv := sv.start(t)
			_, proxyURL := startProxyServer(t, srv.url())
			c := startHeldClient(t, proxyURL, "held-cancel")
			c.mustConnect(t, sv.serverName)
			for _, streaming := range []bool{false, true} {
				tag := "quiet"
				if streaming {
					tag = "streaming"
				}
				r := c.ask(map[string]any{"op": "call", "name": "slow", "arguments": map[string]any{"tag": tag, "ms": 4000},
					"cancelAfterMs": 800, "progress": streaming})
				if r.OK {
					t.Fatalf("%s: tools/call slow, aborted after 800 ms, answered %q", tag, r.TextHead)
				}
				if streaming && (r.ProgressCount == nil || *r.ProgressCount == 0) {
					t.Errorf("%s: the agent received no progress before it aborted the call (%v): the case is not the one this test is about", tag, r)
				}
				_, line, ok := srv.proc.out.waitFor(0, 6*time.Second, func(l string) bool { return strings.HasSuffix(l, " slow "+tag) })
				switch {
				case !ok:
					t.Errorf("%s: the agent aborted tools/call slow, but within 6 s the tool neither stopped nor finished", tag)
				case line != "CANCELLED slow "+tag:
					t.Errorf("%s: the agent aborted tools/call slow, but the tool ran to the end (%q): the upstream was not told (notifications/cancelled)", tag, line)
				}
				c.callText(t, sv.next, sv.nextArgs, sv.nextText)
			}
		})
	}
}

// TestHeldListenAndRestart: the pinned agent's subscriptions/listen
// delivers the server's notifications/resources/updated (mcpheal serves it
// from the held session's GET stream and resources/subscribe). Then the
// server restarts (SIGKILL, the same port): the agent's next calls work
// (mcpheal heals the held session: one new session upstream, with the
// agent's capabilities: a sampling request still reaches it), and the
// listen, still open, delivers updates from the new server life (the
// subscription was restored). server-everything (updates every 5 s after
// its toggle-subscriber-updates tool, per session) and fastmcp
// (FastMCP.sendResourceUpdated on a stdin command).
func TestHeldListenAndRestart(t *testing.T) {
	t.Parallel()
	for _, sv := range []struct {
		hs   heldServer
		uri  string
		poke func(t *testing.T, srv *server, c *heldClient) func()
	}{
		{heldEverything, everythingURI, func(t *testing.T, _ *server, c *heldClient) func() {
			// One call per server life: the server then sends an update of
			// every URI the session subscribed, at once and every 5 s.
			c.callText(t, "toggle-subscriber-updates", map[string]any{}, "Started simulated resource updated notifications")
			return nil
		}},
		{heldFastMCP, fastmcpURI, func(t *testing.T, srv *server, _ *heldClient) func() {
			return func() { srv.nudge("notify-resource " + fastmcpURI) }
		}},
	} {
		t.Run(sv.hs.name, func(t *testing.T) {
			t.Parallel()
			srv := sv.hs.start(t, freeFixedPort(t), "")
			s, proxyURL := startProxyServer(t, srv.url())
			c := startHeldClient(t, proxyURL, "held-listen")
			c.mustConnect(t, sv.hs.serverName)
			c.callText(t, sv.hs.echo, sv.hs.echoArgs("before"), "before")
			r := c.ask(map[string]any{"op": "listen", "resourceSubscriptions": []string{sv.uri}})
			if !r.OK || !strings.Contains(string(r.Honored), sv.uri) {
				t.Fatalf("subscriptions/listen %s: %v, honoured %s", sv.uri, r, r.Honored)
			}
			time.Sleep(300 * time.Millisecond) // the held session's GET stream opens in the background
			n := c.waitUpdates(t, sv.uri, 0, 12*time.Second, sv.poke(t, srv, c))
			if n == 0 {
				t.Fatalf("no notifications/resources/updated for %s reached the listen within 12 s", sv.uri)
			}

			first := srv.proc
			heals := s.Stats().Heals
			srv.restart()

			c.callText(t, sv.hs.echo, sv.hs.echoArgs("after restart"), "after restart")
			c.callText(t, sv.hs.echo, sv.hs.echoArgs("and again"), "and again")
			if sv.hs.sample != "" {
				c.callText(t, sv.hs.sample, sv.hs.sampleArgs, "sampled-by-held-agent")
			}
			if got := len(sessions(first)); got != 1 {
				t.Errorf("the first server life had %d sessions for the agent; want 1", got)
			}
			if got := len(sessions(srv.proc)); got != 1 {
				t.Errorf("after the restart the server opened %d sessions for the agent; want 1 (one heal)", got)
			}
			if s.Stats().Heals <= heals {
				t.Errorf("mcpheal counted no heal across the restart")
			}
			if m := c.waitUpdates(t, sv.uri, n, 12*time.Second, sv.poke(t, srv, c)); m == n {
				t.Errorf("after the restart, no notifications/resources/updated for %s reached the listen within 12 s: the subscription did not survive", sv.uri)
			}
		})
	}
}

// TestHeldSessionExpiry: the server forgets the session mcpheal holds for
// the agent (a DELETE of the test's own, as a server that expires idle
// sessions does) between two calls. The agent's next call works, healed
// onto a new upstream session (opened with the agent's capabilities: a
// sampling request still reaches it); with a tool that is not replay-safe
// (work), each call runs exactly once, the one after the expiry included.
func TestHeldSessionExpiry(t *testing.T) {
	t.Parallel()
	for _, hs := range []heldServer{heldEverything, heldFastMCP, heldV1} {
		t.Run(hs.name, func(t *testing.T) {
			t.Parallel()
			countFile := filepath.Join(t.TempDir(), "work.count")
			srv := hs.start(t, 0, countFile)
			s, proxyURL := startProxyServer(t, srv.url())
			c := startHeldClient(t, proxyURL, "held-expiry")
			c.mustConnect(t, hs.serverName)
			c.callText(t, hs.echo, hs.echoArgs("before"), "before")
			if hs.work {
				c.callText(t, "work", map[string]any{"tag": "before"}, "done before")
			}
			id := lastSession(t, srv)
			heals := s.Stats().Heals

			expire(t, srv, id)

			if hs.work {
				c.callText(t, "work", map[string]any{"tag": "after"}, "done after")
			}
			c.callText(t, hs.echo, hs.echoArgs("after expiry"), "after expiry")
			c.callText(t, hs.echo, hs.echoArgs("and again"), "and again")
			if hs.sample != "" {
				c.callText(t, hs.sample, hs.sampleArgs, "sampled-by-held-agent")
			}
			if ids := sessions(srv.proc); len(ids) != 2 || ids[1] == id {
				t.Errorf("the server opened sessions %q; want the expired one, then exactly one new (one heal)", ids)
			}
			if s.Stats().Heals <= heals {
				t.Errorf("mcpheal counted no heal after the session expired")
			}
			if n := s.Stats().UnsafeResends; n != 0 {
				t.Errorf("mcpheal sent a request that is not replay-safe again %d times", n)
			}
			if hs.work {
				// Each call was answered after its last exchange ended: no
				// send of it is left in flight to run it later.
				for _, tag := range []string{"before", "after"} {
					if n := runs(countFile, tag); n != 1 {
						t.Errorf("work %s ran %d times, want exactly 1", tag, n)
					}
				}
			}
		})
	}
}

// TestHeldCallInFlightWhenServerDies: the server dies (SIGKILL) while a
// tool that is not replay-safe runs for the pinned agent, and comes back
// on the same port. The tool must not run again: the agent gets JSON-RPC
// -32011 ("may or may not have run"), and its next calls work on a healed
// session. fastmcp and v1server.mjs, each with a work tool that counts its
// executions in a file.
func TestHeldCallInFlightWhenServerDies(t *testing.T) {
	t.Parallel()
	for _, hs := range []heldServer{heldFastMCP, heldV1} {
		t.Run(hs.name, func(t *testing.T) {
			t.Parallel()
			countFile := filepath.Join(t.TempDir(), "work.count")
			srv := hs.start(t, freeFixedPort(t), countFile)
			s, proxyURL := startProxyServer(t, srv.url())
			c := startHeldClient(t, proxyURL, "held-inflight")
			c.mustConnect(t, hs.serverName)
			if r := c.list(); !r.OK {
				t.Logf("tools/list: %v", r) // mcpheal would learn the tools' annotations here; work has none either way
			}

			wait := c.callAsync("work", map[string]any{"tag": "inflight", "ms": 3000})
			if !waitForLines(countFile, 1, 20*time.Second) {
				t.Fatalf("the work tool did not start within 20 s; the client says %v", wait())
			}
			time.Sleep(300 * time.Millisecond)
			srv.restart()
			r := wait()
			if !r.hasCode(codeMayHaveRun) {
				t.Errorf("tools/call work in flight when the server died: %v (text %q); want JSON-RPC error %d", r, r.TextHead, codeMayHaveRun)
			}

			c.callText(t, hs.echo, hs.echoArgs("still here"), "still here")
			c.callText(t, "work", map[string]any{"tag": "next"}, "done next")
			// Every call has its answer, given after its last exchange
			// ended, and none that may have run was sent again: no send is
			// left to run one later.
			if n := s.Stats().UnsafeResends; n != 0 {
				t.Errorf("mcpheal sent a request that is not replay-safe again %d times", n)
			}
			if n := runs(countFile, "inflight"); n != 1 {
				t.Errorf("the work call in flight ran %d times across both server lives, want exactly 1", n)
			}
			if n := runs(countFile, "next"); n != 1 {
				t.Errorf("the next work call ran %d times, want exactly 1", n)
			}
		})
	}
}
