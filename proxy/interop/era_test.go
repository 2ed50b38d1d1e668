//go:build unix

package interop

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// The bridge tests: session-era (2025-11-25) clients, which connect with
// initialize and hold a session, against testdata/eraserver.mjs, a TS SDK v2
// server that speaks only MCP 2026-07-28 (no initialize, no sessions, no GET
// stream; server→client requests come back as InputRequiredResult). Directly
// every such client fails at connect; through mcpheal, which detects the
// upstream's era with server/discover and bridges, each works as it would
// against a session-era server.

// updateWithin bounds how long a resource update may take to reach an agent
// through its GET stream, nudges included.
const updateWithin = 10 * time.Second

// TestEraDirect: directly, every legacy client fails to connect to the
// 2026-07-28-only server (HTTP 400 -32022 to its initialize), which is what
// makes the bridge needed; the same clients connect to the same server run
// dual-era (the control), so the failure is the era, not the fixture.
func TestEraDirect(t *testing.T) {
	t.Parallel()
	only := startEraServer(t, eraOpts{})
	dual := startEraServer(t, eraOpts{dual: true})
	for _, flavour := range flavours {
		t.Run(flavour+"/2026-only", func(t *testing.T) {
			t.Parallel()
			name := "direct-" + flavour
			r := newEraAgent(t, flavour, only.url(), name).connect()
			if r.OK {
				t.Fatalf("directly, %s connected to a 2026-07-28-only server (server %q): the bridge tests no longer show that mcpheal is what makes it work", flavour, r.ServerName)
			}
			msg, _, _ := strings.Cut(r.Message, "\n    at ")
			t.Logf("directly, %s: connect failed: %.600s", flavour, msg)
			// The refusal must be the server's answer to an initialize (mcp-remote
			// sends its own, "mcp-remote-fallback-test", first): -32022, the
			// protocol version is not supported. mcp-remote reports it on stderr,
			// which the timeout's message carries.
			if serverLines(only.proc, "INITIALIZE "+name)+serverLines(only.proc, "INITIALIZE mcp-remote-fallback-test") == 0 {
				t.Errorf("the server saw no initialize from %s: the connect failed before reaching it", flavour)
			}
			if !strings.Contains(r.Message, "-32022") {
				t.Errorf("directly, %s failed without the server's -32022 (unsupported protocol version): %v", flavour, r)
			}
		})
		t.Run(flavour+"/dual-era", func(t *testing.T) {
			t.Parallel()
			a := newEraAgent(t, flavour, dual.url(), "control-"+flavour)
			if r := a.connect(); !r.OK || r.ServerName != eraServerName {
				t.Fatalf("directly against the dual-era server: %v, server %q; want %q", r, r.ServerName, eraServerName)
			}
			if r := a.list(); !r.OK || !sameNames(r.Names, eraTools) {
				t.Errorf("tools/list directly against the dual-era server: %v, tools %v; want %v", r, r.Names, eraTools)
			}
			if r := a.call("echo", map[string]any{"text": "control"}); !r.OK || r.IsError || r.TextHead != "control" {
				t.Errorf("tools/call echo directly against the dual-era server: %v, text %q", r, r.TextHead)
			}
		})
	}
}

// TestEraBridge: through mcpheal, each legacy client uses the
// 2026-07-28-only server as a session-era one: connect (the initialize
// answered from server/discover), tools/list, tool calls that run once,
// progress, logging/setLevel, elicitation and sampling (the server's
// InputRequiredResult turned into requests to the agent), resource
// subscriptions (the agent's GET stream served from subscriptions/listen)
// and cancellation. The server never sees an initialize.
func TestEraBridge(t *testing.T) {
	t.Parallel()
	countFile := filepath.Join(t.TempDir(), "work.count")
	srv := startEraServer(t, eraOpts{countFile: countFile})
	proxyURL := startProxy(t, srv.url())

	t.Run("group", func(t *testing.T) {
		for _, flavour := range flavours {
			t.Run(flavour+"/basics", func(t *testing.T) {
				t.Parallel()
				a := newEraAgent(t, flavour, proxyURL, "bridged-"+flavour)
				mustConnect(t, a)
				if r := a.list(); !r.OK || !sameNames(r.Names, eraTools) {
					t.Errorf("tools/list: %v, %d tools %v; want %v", r, r.Count, r.Names, eraTools)
				}
				if r := a.call("echo", map[string]any{"text": "über 2026"}); !r.OK || r.IsError || r.TextHead != "über 2026" {
					t.Errorf("tools/call echo: %v, isError %v, text %q; want %q", r, r.IsError, r.TextHead, "über 2026")
				}
				for _, tag := range []string{"basics-" + flavour + "-1", "basics-" + flavour + "-2"} {
					if r := a.call("work", map[string]any{"tag": tag}); !r.OK || r.IsError || r.TextHead != "done "+tag {
						t.Errorf("tools/call work: %v, text %q; want %q", r, r.TextHead, "done "+tag)
					}
					if n := runs(countFile, tag); n != 1 {
						t.Errorf("work %s ran %d times, want 1", tag, n)
					}
				}
			})
		}
		for _, flavour := range sdkFlavours {
			t.Run(flavour+"/progress-and-logs", func(t *testing.T) {
				t.Parallel()
				c := newEraAgent(t, flavour, proxyURL, "progress-"+flavour).(*eraClient)
				mustConnect(t, c)
				progress := func() eraResult {
					t.Helper()
					r := c.ask(map[string]any{"op": "call", "name": "progress", "arguments": map[string]any{"steps": 3, "delayMs": 20}, "progress": true})
					if !r.OK || r.IsError || r.TextHead != "done 3" {
						t.Fatalf("tools/call progress: %v, text %q; want %q", r, r.TextHead, "done 3")
					}
					if r.ProgressCount == nil || *r.ProgressCount != 3 {
						t.Errorf("tools/call progress: the agent received %v progress notifications, want 3", deref(r.ProgressCount))
					}
					return r
				}
				logs := func() int {
					t.Helper()
					r := c.ask(map[string]any{"op": "logs"})
					if !r.OK {
						t.Fatalf("logs: %v", r)
					}
					return r.Logs
				}
				setLevel := func(level string) {
					t.Helper()
					if r := c.ask(map[string]any{"op": "setLevel", "level": level}); !r.OK {
						t.Fatalf("logging/setLevel %s: %v", level, r)
					}
				}

				progress()
				before := logs()
				t.Logf("log messages before any logging/setLevel: %d", before)
				setLevel("info")
				progress()
				if got := logs() - before; got != 3 {
					t.Errorf("after logging/setLevel info, a call that logs 3 messages at info delivered %d to the agent, want 3", got)
				}
				setLevel("error")
				before = logs()
				progress()
				if got := logs() - before; got != 0 {
					t.Errorf("after logging/setLevel error, a call that logs 3 messages at info delivered %d to the agent, want 0", got)
				}
			})
			t.Run(flavour+"/input-required", func(t *testing.T) {
				t.Parallel()
				c := newEraAgent(t, flavour, proxyURL, "input-"+flavour).(*eraClient)
				mustConnect(t, c)
				c.callText(t, "confirm", map[string]any{}, `confirmed {"ok":true}`)
				c.callText(t, "sample", map[string]any{"prompt": "say hi"}, "sampled sampled-by-agent")
				// A second round on the same session works as the first.
				c.callText(t, "confirm", map[string]any{}, `confirmed {"ok":true}`)
			})
			t.Run(flavour+"/subscribe", func(t *testing.T) {
				t.Parallel()
				c := newEraAgent(t, flavour, proxyURL, "subscribe-"+flavour).(*eraClient)
				mustConnect(t, c)
				const uri = "test://r1"
				if r := c.ask(map[string]any{"op": "subscribe", "uri": uri}); !r.OK {
					t.Fatalf("resources/subscribe %s: %v", uri, r)
				}
				if n := nudgeUntilUpdate(t, srv, c, uri, 0, updateWithin); n == 0 {
					t.Fatalf("no notifications/resources/updated for %s reached the agent within %v; the server saw %d subscriptions/listen naming it",
						uri, updateWithin, srv.proc.out.count(func(l string) bool { return strings.HasPrefix(l, "LISTEN ") && strings.Contains(l, uri) }))
				}
				if r := c.ask(map[string]any{"op": "unsubscribe", "uri": uri}); !r.OK {
					t.Fatalf("resources/unsubscribe %s: %v", uri, r)
				}
				time.Sleep(300 * time.Millisecond) // an update already on its way may still land
				before := c.updatesOf(t, uri)
				for range 3 {
					srv.nudge("notify-resource " + uri)
					time.Sleep(300 * time.Millisecond)
				}
				if got := c.updatesOf(t, uri) - before; got != 0 {
					t.Errorf("after resources/unsubscribe %s the agent received %d updates of it, want 0", uri, got)
				}
			})
			t.Run(flavour+"/cancel", func(t *testing.T) {
				t.Parallel()
				c := newEraAgent(t, flavour, proxyURL, "cancel-"+flavour).(*eraClient)
				mustConnect(t, c)
				tag := "cancel-" + flavour
				r := c.ask(map[string]any{"op": "call", "name": "slow", "arguments": map[string]any{"ms": 20000, "tag": tag}, "cancelAfterMs": 500})
				if r.OK {
					t.Fatalf("tools/call slow, cancelled after 500 ms, answered %q", r.TextHead)
				}
				line := "CANCELLED slow " + tag
				if _, _, ok := srv.proc.out.waitFor(0, 5*time.Second, func(l string) bool { return l == line }); !ok {
					t.Errorf("the agent cancelled tools/call slow (notifications/cancelled), but the tool was not aborted within 5 s (no %q from the server)", line)
				}
				c.callText(t, "echo", map[string]any{"text": "after cancel"}, "after cancel")
			})
		}
	})
	checkNoInitialize(t, srv.proc)
}

// TestEraBridgeUpstreamRestart: the 2026-07-28-only server restarts
// (SIGKILL, then the same port) mid-session. Through mcpheal the agent's
// session goes on: the next echo works, a work call runs exactly once, and
// a resource subscription made before the restart delivers updates again
// (the bridge reopens its subscriptions/listen). Neither server life sees an
// initialize.
func TestEraBridgeUpstreamRestart(t *testing.T) {
	t.Parallel()
	for _, flavour := range flavours {
		t.Run(flavour, func(t *testing.T) {
			t.Parallel()
			countFile := filepath.Join(t.TempDir(), "work.count")
			srv := startEraServer(t, eraOpts{countFile: countFile, restartable: true})
			proxyURL := startProxy(t, srv.url())
			a := newEraAgent(t, flavour, proxyURL, "restart-"+flavour)
			c, _ := a.(*eraClient)
			const uri = "test://r1"
			mustConnect(t, a)
			if r := a.call("work", map[string]any{"tag": "before"}); !r.OK || r.TextHead != "done before" {
				t.Fatalf("tools/call work before the restart: %v, text %q", r, r.TextHead)
			}
			updates := 0
			if c != nil {
				if r := c.ask(map[string]any{"op": "subscribe", "uri": uri}); !r.OK {
					t.Fatalf("resources/subscribe %s: %v", uri, r)
				}
				if updates = nudgeUntilUpdate(t, srv, c, uri, 0, updateWithin); updates == 0 {
					t.Fatalf("no notifications/resources/updated for %s reached the agent within %v, before any restart", uri, updateWithin)
				}
			}

			first := srv.proc
			srv.restart()

			if r := a.call("echo", map[string]any{"text": "after restart"}); !r.OK || r.IsError || r.TextHead != "after restart" {
				t.Fatalf("tools/call echo after the restart: %v, text %q", r, r.TextHead)
			}
			if r := a.call("work", map[string]any{"tag": "after"}); !r.OK || r.IsError || r.TextHead != "done after" {
				t.Errorf("tools/call work after the restart: %v, text %q", r, r.TextHead)
			}
			for _, tag := range []string{"before", "after"} {
				if n := runs(countFile, tag); n != 1 {
					t.Errorf("work %s ran %d times, want 1", tag, n)
				}
			}
			if c != nil {
				if n := nudgeUntilUpdate(t, srv, c, uri, updates, updateWithin); n == updates {
					t.Errorf("after the restart, no notifications/resources/updated for %s reached the agent within %v: the subscription did not survive", uri, updateWithin)
				}
			}
			checkNoInitialize(t, first, srv.proc)
		})
	}
}

// TestEraChangeAcrossRestart: a redeploy changes the server's era under a
// live session, dual-era → 2026-07-28-only and back. After the restart the
// agent's next calls work (mcpheal detects the era again) and run once; the
// 2026-07-28-only life never sees an initialize.
func TestEraChangeAcrossRestart(t *testing.T) {
	t.Parallel()
	for _, toDual := range []bool{false, true} {
		change := "to-2026-only"
		if toDual {
			change = "to-dual"
		}
		for _, flavour := range flavours {
			t.Run(change+"/"+flavour, func(t *testing.T) {
				t.Parallel()
				countFile := filepath.Join(t.TempDir(), "work.count")
				srv := startEraServer(t, eraOpts{countFile: countFile, restartable: true, dual: !toDual})
				proxyURL := startProxy(t, srv.url())
				a := newEraAgent(t, flavour, proxyURL, "era-change-"+flavour)
				mustConnect(t, a)
				if r := a.call("echo", map[string]any{"text": "before"}); !r.OK || r.IsError || r.TextHead != "before" {
					t.Fatalf("tools/call echo before the restart: %v, text %q", r, r.TextHead)
				}

				srv.setEra(toDual)
				srv.restart()

				if r := a.call("echo", map[string]any{"text": "after"}); !r.OK || r.IsError || r.TextHead != "after" {
					t.Fatalf("tools/call echo after the server changed era (%s): %v, text %q", change, r, r.TextHead)
				}
				if r := a.call("work", map[string]any{"tag": "after"}); !r.OK || r.IsError || r.TextHead != "done after" {
					t.Errorf("tools/call work after the server changed era: %v, text %q", r, r.TextHead)
				}
				if n := runs(countFile, "after"); n != 1 {
					t.Errorf("work after ran %d times, want 1", n)
				}
				if !toDual {
					checkNoInitialize(t, srv.proc)
				}
			})
		}
	}
}

// mustConnect connects a and fails t unless the agent sees the era server.
func mustConnect(t *testing.T, a agent) {
	t.Helper()
	if r := a.connect(); !r.OK || r.ServerName != eraServerName {
		t.Fatalf("connect through mcpheal: %v, server %q; want %q", r, r.ServerName, eraServerName)
	}
}

// deref shows an optional count.
func deref(p *int) any {
	if p == nil {
		return "no"
	}
	return *p
}

// eraServerName is the serverInfo name testdata/eraserver.mjs announces.
const eraServerName = "mcpheal-interop-era"

// eraTools are the tools testdata/eraserver.mjs lists, in its order.
var eraTools = []string{"echo", "work", "progress", "confirm", "sample", "slow"}

// sdkFlavours are the clients that run every bridge scenario; mcp-remote,
// driven by raw JSON-RPC lines, runs connect, list and call only.
var sdkFlavours = []string{"ts-sdk-v1", "ts-sdk-v2"}

// eraOpts shapes one testdata/eraserver.mjs (TS SDK v2 server).
type eraOpts struct {
	// countFile, if set, receives one line per execution of the "work" tool.
	countFile string
	// restartable picks a port outside the ephemeral range (see v1Opts).
	restartable bool
	// dual serves both eras (the SDK's legacy 'stateless'), not 2026-07-28
	// only (legacy 'reject').
	dual bool
}

func startEraServer(t testing.TB, o eraOpts) *server {
	t.Helper()
	port := 0
	if o.restartable {
		port = freeFixedPort(t)
	}
	legacy := "reject"
	if o.dual {
		legacy = "stateless"
	}
	name := "eraserver-" + legacy
	return startServer(t, name, port, []string{"COUNT_FILE=" + o.countFile, "LEGACY=" + legacy}, "eraserver.mjs")
}

// setEra makes the server's next life (after restart) serve both eras
// (dual) or 2026-07-28 only: a redeploy that changes the protocol era.
func (s *server) setEra(dual bool) {
	legacy := "LEGACY=reject"
	if dual {
		legacy = "LEGACY=stateless"
	}
	// exec keeps the last value of a duplicated key.
	s.env = append(s.env, legacy)
}

// nudge writes one command line to the server's stdin (eraserver.mjs:
// "notify-resource <uri>", "notify-tools").
func (s *server) nudge(cmd string) {
	s.t.Helper()
	s.proc.send(s.t, []byte(cmd))
}

// serverLines counts the lines of p's stdout that equal line or start with
// line+" ".
func serverLines(p *nodeProc, line string) int {
	return p.out.count(func(l string) bool { return l == line || strings.HasPrefix(l, line+" ") })
}

// checkNoInitialize fails t if any of the server lives procs saw an
// initialize of an agent's: a 2026-07-28-only server refuses it, so a
// bridge that lets one through has already failed the agent once.
// mcpheal's own question of the era (an initialize from the client
// mcpheal-era-probe, to tell a server of 2026-07-28 alone from one of both
// eras that lists 2026-07-28 alone) is not an agent's.
func checkNoInitialize(t *testing.T, procs ...*nodeProc) {
	t.Helper()
	for _, p := range procs {
		if n := serverLines(p, "INITIALIZE") - serverLines(p, "INITIALIZE mcpheal-era-probe"); n != 0 {
			t.Errorf("%s saw %d initialize; the bridge must never send initialize to a 2026-07-28-only server", p.name, n)
		}
	}
}

// eraResult is a client.mjs answer with the fields of the bridge ops.
type eraResult struct {
	result
	ProgressCount *int     `json:"progressCount"`
	Updates       []string `json:"updates"`
	Logs          int      `json:"logs"`
}

// eraClient is testdata/client.mjs with CLIENT_CAPABILITIES=1: it declares
// sampling, elicitation (form) and roots and answers them.
type eraClient struct{ *sdkClient }

func startEraClient(t testing.TB, version, url, name string) *eraClient {
	t.Helper()
	env := []string{"CLIENT_NAME=" + name, fmt.Sprintf("REQUEST_TIMEOUT_MS=%d", sdkTimeout.Milliseconds()), "CLIENT_CAPABILITIES=1"}
	return &eraClient{&sdkClient{t: t, p: startNode(t, "client-"+version+" "+name, env, "client.mjs", version, url)}}
}

// newEraAgent is newAgent with the SDK clients from startEraClient.
func newEraAgent(t testing.TB, flavour, url, name string) agent {
	t.Helper()
	switch flavour {
	case "ts-sdk-v1":
		return startEraClient(t, "v1", url, name)
	case "ts-sdk-v2":
		return startEraClient(t, "v2", url, name)
	}
	return newAgent(t, flavour, url, name)
}

// ask sends one command and reads its answer with the bridge ops' fields.
func (c *eraClient) ask(cmd map[string]any) eraResult {
	c.t.Helper()
	c.send(cmd)
	op, _ := cmd["op"].(string)
	i, line, ok := c.p.out.waitFor(c.next, opTimeout, func(l string) bool { return strings.HasPrefix(l, "RESULT ") })
	if !ok {
		return eraResult{result: result{Op: op, Kind: "timeout", Message: fmt.Sprintf("no answer within %v; client stderr:\n%s", opTimeout, c.p.stderr.String())}}
	}
	c.next = i + 1
	var r eraResult
	if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "RESULT ")), &r); err != nil {
		c.t.Fatalf("client output %q: %v", line, err)
	}
	return r
}

// callText calls a tool and fails t unless it answers text want.
func (c *eraClient) callText(t *testing.T, name string, args map[string]any, want string) {
	t.Helper()
	r := c.ask(map[string]any{"op": "call", "name": name, "arguments": args})
	if !r.OK || r.IsError || r.TextHead != want {
		t.Errorf("tools/call %s: %v, isError %v, text %q; want %q", name, r, r.IsError, r.TextHead, want)
	}
}

// updatesOf says how many notifications/resources/updated for uri the
// client has received.
func (c *eraClient) updatesOf(t *testing.T, uri string) int {
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

// nudgeUntilUpdate makes srv publish an update of uri every 300 ms until the
// client has received more than have of them, or d passes. The agent's GET
// stream delivers it, and the bridge may still be opening the upstream
// subscriptions/listen when the first nudge goes out. It returns the count.
func nudgeUntilUpdate(t *testing.T, srv *server, c *eraClient, uri string, have int, d time.Duration) int {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		srv.nudge("notify-resource " + uri)
		time.Sleep(300 * time.Millisecond)
		if n := c.updatesOf(t, uri); n > have || time.Now().After(deadline) {
			return n
		}
	}
}

// sameNames says whether got lists exactly the names in want, in any order.
func sameNames(got, want []string) bool {
	a, b := slices.Clone(got), slices.Clone(want)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}
