//go:build unix

package interop

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// The Python tests' top-level functions do not call t.Parallel: they run
// before the parallel tests start, their subtests in parallel among
// themselves. Queued among the other parallel tests, their many subtests
// would keep a parallel test's servers, started before its own subtests,
// waiting past their lifetime (guard.mjs).

// pyTarget is one server the Python agents meet, and the echo call it
// answers.
type pyTarget struct {
	name      string
	start     func(*testing.T) *server
	tool      string
	args      map[string]any
	wantTools int // 0: whatever the server lists directly
}

// pyTargets are the Python servers, in both answer shapes and with and
// without an event store, and the TS servers of TestPlainUse.
func pyTargets(text string) []pyTarget {
	echo := map[string]any{"text": text}
	py := func(o pyServerOpts) func(*testing.T) *server {
		return func(t *testing.T) *server { return startPyServer(t, o) }
	}
	return []pyTarget{
		{"fastmcp-py", py(pyServerOpts{impl: pyFastMCP}), "echo", echo, 7},
		{"fastmcp-py-json-events", py(pyServerOpts{impl: pyFastMCP, json: true, eventStore: true}), "echo", echo, 7},
		{"mcpserver-py-events", py(pyServerOpts{impl: pyMCPServer, eventStore: true}), "echo", echo, 7},
		{"mcpserver-py-json", py(pyServerOpts{impl: pyMCPServer, json: true}), "echo", echo, 7},
		{"ts-sdk-v1-server", func(t *testing.T) *server { return startV1Server(t, v1Opts{}) }, "echo", echo, 3},
		{"server-everything", func(t *testing.T) *server { return startEverything(t) }, "echo", map[string]any{"message": text}, 0},
		{"fastmcp", func(t *testing.T) *server { return startFastMCP(t) }, "echo", echo, 2},
	}
}

// TestPyPlainUse: each Python agent works through mcpheal exactly as it
// does directly against each server, Python and TS: the same initialize,
// the same tools, the same tool result.
func TestPyPlainUse(t *testing.T) {
	for _, sv := range pyTargets("plain use") {
		t.Run(sv.name, func(t *testing.T) {
			t.Parallel()
			srv := sv.start(t)
			proxyURL := startProxy(t, srv.url())
			for _, flavour := range pyFlavours {
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

// notWorse checks that what an agent saw through mcpheal (got) is what it
// saw directly (want) whenever that worked; a failure directly (the agent
// or server cannot do it) only asks mcpheal not to hang.
func notWorse(t *testing.T, what string, got, want result) {
	t.Helper()
	if !want.OK {
		t.Logf("%s directly: %v; through mcpheal: %v", what, want, got)
		if got.Kind == "timeout" {
			t.Errorf("%s through mcpheal: %v", what, got)
		}
		return
	}
	if !got.OK || got.IsError != want.IsError || got.TextSha256 != want.TextSha256 {
		t.Errorf("%s through mcpheal: %v, isError %v, text %q; directly: isError %v, text %q",
			what, got, got.IsError, got.TextHead, want.IsError, want.TextHead)
	}
}

// TestPyServerFeatures: what the Python servers do inside a call reaches
// each Python agent through mcpheal as it does directly: an elicitation
// (the server asks the agent's user), progress notifications, a tool error,
// and notifications/tools/list_changed after the tool list changed (the
// agent then lists the new tool). Each agent pair has its own server.
func TestPyServerFeatures(t *testing.T) {
	for _, impl := range []string{pyFastMCP, pyMCPServer} {
		for _, flavour := range pyFlavours {
			t.Run(impl+"/"+flavour, func(t *testing.T) {
				t.Parallel()
				srv := startPyServer(t, pyServerOpts{impl: impl})
				p := newPair(t, flavour, srv.url(), startProxy(t, srv.url()))
				p.both(t, connect)
				p.both(t, list)

				ask := func(a agent) result { return a.call("ask", map[string]any{"question": "go on?"}) }
				notWorse(t, "ask (elicitation)", ask(p.proxied), ask(p.direct))

				fail := func(a agent) result { return a.call("fail", map[string]any{"text": "no such row"}) }
				want, got := fail(p.direct), fail(p.proxied)
				if got.OK != want.OK || got.IsError != want.IsError || got.TextSha256 != want.TextSha256 {
					t.Errorf("fail through mcpheal: %v, isError %v, text %q; directly: %v, isError %v, text %q",
						got, got.IsError, got.TextHead, want, want.IsError, want.TextHead)
				}

				long := func(a agent) result {
					return a.(*sdkClient).do(map[string]any{"op": "call", "name": "long", "arguments": map[string]any{"steps": 3, "ms": 20}, "progress": true})
				}
				want, got = long(p.direct), long(p.proxied)
				notWorse(t, "long (progress)", got, want)
				if got.ProgressCount < want.ProgressCount {
					t.Errorf("progress notifications: %d through mcpheal, %d directly", got.ProgressCount, want.ProgressCount)
				}

				changed := func(a agent) (string, result) {
					c := a.call("change_tools", map[string]any{})
					if !c.OK {
						return "", c
					}
					event := "toolsChanged"
					if flavour == "hermes" {
						event = "toolsRefreshed" // Hermes lists the tools again itself
					}
					if pyModern(flavour) { // a notification comes on the call's own stream, if at all
						return c.TextHead, events(a)
					}
					return c.TextHead, waitEvent(a, event, 1, 10*time.Second)
				}
				wantName, wantEv := changed(p.direct)
				gotName, gotEv := changed(p.proxied)
				t.Logf("change_tools directly: %q, then %v (tools/list_changed %d, refreshed %d); through mcpheal: %q, then %v (%d, %d)",
					wantName, wantEv, wantEv.ToolsChanged, wantEv.ToolsRefreshed, gotName, gotEv, gotEv.ToolsChanged, gotEv.ToolsRefreshed)
				if wantEv.OK && !gotEv.OK {
					t.Errorf("the tool list change reached the agent directly (%v) but not through mcpheal (%v)", wantEv, gotEv)
				}
				if gotEv.ToolsChanged < wantEv.ToolsChanged || gotEv.ToolsRefreshed < wantEv.ToolsRefreshed {
					t.Errorf("tools/list_changed: through mcpheal %d received, %d refreshed; directly %d, %d",
						gotEv.ToolsChanged, gotEv.ToolsRefreshed, wantEv.ToolsChanged, wantEv.ToolsRefreshed)
				}
				wantList, gotList := list(p.direct), list(p.proxied)
				if slices.Contains(wantList.Names, wantName) && !slices.Contains(gotList.Names, gotName) {
					t.Errorf("after change_tools directly the agent lists %s (%v); through mcpheal not %s (%v)", wantName, wantList.Names, gotName, gotList.Names)
				}
			})
		}
	}
}

// TestPyUpstreamRestart: a Python server restarts (SIGKILL, then the same
// port) between two calls of the write tool, which is not replay-safe.
// Through mcpheal each Python agent's next call works, each write ran
// exactly once (counted server-side), and the restarted server saw at most
// one initialize from mcpheal. What the same agent gets directly is logged:
// Hermes reconnects by itself, the SDK clients keep the dead session.
func TestPyUpstreamRestart(t *testing.T) {
	for _, impl := range []string{pyFastMCP, pyMCPServer} {
		for _, flavour := range pyFlavours {
			t.Run(impl+"/"+flavour, func(t *testing.T) {
				t.Parallel()
				countFile := filepath.Join(t.TempDir(), "writes")
				srv := startPyServer(t, pyServerOpts{impl: impl, countFile: countFile, restartable: true})
				p := newPair(t, flavour, srv.url(), startProxy(t, srv.url()))
				p.both(t, connect)
				p.both(t, list)
				for _, a := range []struct {
					agent
					tag string
				}{{p.direct, "before-direct"}, {p.proxied, "before-proxied"}} {
					if r := a.call("write", map[string]any{"tag": a.tag}); !r.OK || r.TextHead != "wrote "+a.tag {
						t.Fatalf("write %s: %v, text %q", a.tag, r, r.TextHead)
					}
				}

				srv.restart()

				for _, tag := range []string{"after-1", "after-2"} {
					r := p.proxied.call("write", map[string]any{"tag": tag})
					if !r.OK || r.TextHead != "wrote "+tag {
						t.Fatalf("through mcpheal after the restart: %v, text %q", r, r.TextHead)
					}
				}
				// A session-era agent's session is healed with one initialize;
				// a 2026-07-28 agent has no session to heal.
				wantInit := 1
				if pyModern(flavour) {
					wantInit = 0
				}
				proxied := "INITIALIZE " + pyClientInfoName(flavour, "proxied-"+flavour)
				if n := srv.proc.out.count(func(l string) bool { return l == proxied }); n != wantInit {
					t.Errorf("the restarted server saw %d initializes from mcpheal for the agent, want %d", n, wantInit)
				}
				if flavour == "hermes" {
					if ev := events(p.proxied); ev.Reconnects != 0 {
						t.Errorf("Hermes through mcpheal asked for %d reconnects of its own, want 0: mcpheal heals", ev.Reconnects)
					}
				}
				direct := p.direct.call("write", map[string]any{"tag": "after-direct"})
				t.Logf("directly after the restart %s: %v, text %q", flavour, direct, direct.TextHead)
				if flavour == "hermes" {
					t.Logf("Hermes directly asked for %d reconnects of its own", events(p.direct).Reconnects)
				}
				for _, tag := range []string{"before-direct", "before-proxied", "after-1", "after-2"} {
					if n := runs(countFile, tag); n != 1 {
						t.Errorf("write %s ran %d times, want 1", tag, n)
					}
				}
			})
		}
	}
}

// TestHermesCLI: what a Hermes user types, against mcpheal in front of a
// Python server: `hermes mcp add NAME --url URL` (answering its two
// questions: no authentication, enable every tool) saves the server, and
// `hermes mcp test NAME` connects and lists its tools. Both run Hermes'
// own CLI from its venv with a fresh HERMES_HOME.
func TestHermesCLI(t *testing.T) {
	for _, impl := range []string{pyFastMCP, pyMCPServer} {
		t.Run(impl, func(t *testing.T) {
			t.Parallel()
			srv := startPyServer(t, pyServerOpts{impl: impl})
			url := startProxy(t, srv.url())
			home := t.TempDir()
			hermes := func(stdin string, args ...string) string {
				t.Helper()
				ctx, cancel := context.WithTimeout(context.Background(), pyOpTimeout)
				defer cancel()
				cmd := exec.CommandContext(ctx, filepath.Join(pyDir, ".venv", "hermes", "bin", "hermes"), args...)
				cmd.Dir = home
				cmd.Env = append(os.Environ(), "HERMES_HOME="+home, "NO_COLOR=1")
				cmd.Stdin = strings.NewReader(stdin)
				out, err := cmd.CombinedOutput()
				if err != nil {
					t.Fatalf("hermes %s: %v\n%s", strings.Join(args, " "), err, out)
				}
				return string(out)
			}

			out := hermes("n\n\n", "mcp", "add", "wp", "--url", url)
			if !strings.Contains(out, "Found 7 tool(s)") || !strings.Contains(out, "Saved 'wp'") {
				t.Fatalf("hermes mcp add did not connect and save the server:\n%s", out)
			}
			config, err := os.ReadFile(filepath.Join(home, "config.yaml"))
			if err != nil || !strings.Contains(string(config), "url: "+url) {
				t.Fatalf("config.yaml after hermes mcp add (%v) has no url %s:\n%.2000s", err, url, config)
			}

			out = hermes("", "mcp", "test", "wp")
			if !strings.Contains(out, "Connected (") || !strings.Contains(out, "Tools discovered: 7") {
				t.Fatalf("hermes mcp test:\n%s", out)
			}
			for _, tool := range []string{"echo", "write", "ask", "change_tools"} {
				if !strings.Contains(out, tool) {
					t.Errorf("hermes mcp test does not list %s:\n%s", tool, out)
				}
			}
			if n := srv.proc.out.count(func(l string) bool { return l == "INITIALIZE "+hermesClientName }); n != 2 {
				t.Errorf("the server saw %d initializes from Hermes, want 2 (add, test)", n)
			}
		})
	}
}

// TestPyEraProbeSlowInitialize: a server of both eras (the mcp SDK's
// MCPServer) that holds every initialize 6 s, longer than mcpheal's era
// probe waits (5 s), is not taken for a server of 2026-07-28 alone: a
// session-era agent meets its session era through mcpheal as it does
// directly: its initialize reaches the server, and the server's
// elicitation reaches it (a bridged agent's would fail: "unavailable on
// 2026-07-28 connections").
func TestPyEraProbeSlowInitialize(t *testing.T) {
	t.Parallel()
	srv := startPyServer(t, pyServerOpts{impl: pyMCPServer, slowInitialize: 6 * time.Second})
	p := newPair(t, "py-client-legacy", srv.url(), startProxy(t, srv.url()))
	p.both(t, connect)
	if n := srv.proc.out.count(func(l string) bool { return l == "INITIALIZE proxied-py-client-legacy" }); n != 1 {
		t.Errorf("the server saw %d initializes from the agent through mcpheal, want 1", n)
	}
	ask := func(a agent) result { return a.call("ask", map[string]any{"question": "go on?"}) }
	sameAsDirect(t, ask(p.proxied), ask(p.direct))
}
