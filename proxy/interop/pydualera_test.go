//go:build unix

package interop

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mcpheal/mcpheal/proxy"
)

// dualObs is what one agent met on a server of both eras.
type dualObs struct {
	inits     int    // initializes the server saw from the agent at connect
	ask       result // the server asks the agent's user (elicitation)
	changed   result // the tool list change reached the agent (GET stream)
	recall    result // recall after remember: per-session state
	healInits int    // initializes the restarted server saw from the agent
	afterHeal result // a call after the restart
}

// TestPyDualEra (docs/eras.md "Servers of both eras"): the Python servers
// (FastMCP 4.1.6, the mcp 2.3 SDK's MCPServer) serve both eras, and
// mcpheal must take them for servers of both eras: with era_bridge auto
// every agent passes through in its own era. A session-era agent (Hermes,
// the SDK's session client, mcp.Client in legacy mode) keeps its session
// with the server: its initialize reaches the server, the server's
// elicitation reaches it, its GET stream carries tools/list_changed, the
// server keeps per-session state for it (remember, then recall), and a
// restart is healed in its era (the restarted server sees its initialize
// again, from mcpheal); a 2026-07-28 agent (mcp.Client auto, FastMCP's
// client) passes through, as directly. Each is compared with the same
// client directly. (On every go test: Hermes, the SDK's session client and
// mcp.Client auto; with MCPHEAL_PY_FULL or MCPHEAL_PY_TABLE, every Python
// client.)
//
// With era_bridge prefer-2026 the session-era agents go through the
// bridge instead, and this is what changes. Asserted: the server sees no
// initialize from them, at connect or after a restart (mcpheal answers it
// from server/discover, and there is no upstream session to heal); their
// calls work, across the restart too; the server keeps no state for them
// (each request is its own 2026-07-28 request: recall finds nothing).
// Measured and logged, and only asked to come well under the client's
// timeout: neither server sends a request to the client on a 2026-07-28
// request, so the elicitation fails (MCPServer: an error, "no back-channel
// for server-initiated requests"; FastMCP: the tool answers "elicitation
// via server-initiated requests is unavailable on 2026-07-28
// connections"), and MCPServer's tools/list_changed no longer reaches the
// agent, where FastMCP's does.
func TestPyDualEra(t *testing.T) {
	impls := []string{pyMCPServer, pyFastMCP}
	var wg sync.WaitGroup
	for _, impl := range impls {
		for _, bridge := range []string{"auto", "prefer-2026"} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				t.Run(impl+"/"+bridge, func(t *testing.T) { runDualEra(t, impl, bridge) })
			}()
		}
	}
	wg.Wait()
}

func runDualEra(t *testing.T, impl, bridge string) {
	// Two servers of the same kind, one per side, so that what each sees
	// (initializes by client name: Hermes always names itself "mcp") is
	// one side's.
	var d, p *server
	gated(func() { d = startPyServer(t, pyServerOpts{impl: impl, restartable: true, stateTools: true}) })
	gated(func() { p = startPyServer(t, pyServerOpts{impl: impl, restartable: true, stateTools: true}) })
	_, purl := startProxyConfig(t, proxy.Config{Upstream: p.url(), HealTimeout: matrixHealTimeout, EraBridge: bridge}, &tail{max: 64 << 10})
	clients := []string{"hermes", "py-sdk", "py-client-auto"}
	if pyFull() {
		clients = pyClients
	}
	srvs := [2]*server{d, p}
	urls := [2]string{d.url(), purl}
	obs := make([][2]dualObs, len(clients))
	agents := make([][2]agent, len(clients))
	names := make([][2]string, len(clients))
	var wg sync.WaitGroup
	for i, c := range clients {
		for side := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				names[i][side] = [2]string{"direct-", "proxied-"}[side] + c
				gated(func() {
					agents[i][side] = newAgent(t, c, urls[side], names[i][side])
					if r := agents[i][side].connect(); !r.OK {
						t.Errorf("%s %s: connect: %v", c, sideName[side], r)
					}
				})
			}()
		}
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	// initsOf counts the initializes srv's current life saw from the agent,
	// once the server's line for the agents' last call has come (its
	// lines come in order).
	initsOf := func(side, i int, lastTool string, calls int) int {
		srv := srvs[side]
		if !waitCount(srv.proc.out, func(l string) bool { return l == "CALL "+lastTool }, calls, 10*time.Second) {
			t.Errorf("%s: the server did not print %d CALL %s lines", sideName[side], calls, lastTool)
		}
		line := "INITIALIZE " + pyClientInfoName(clients[i], names[i][side])
		return srv.proc.out.count(func(l string) bool { return l == line })
	}
	// Both sides at once, each agent of a side after the other, so that a
	// tool list change and its notification belong to one agent.
	for side := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i, c := range clients {
				a, o := agents[i][side], &obs[i][side]
				o.ask = a.call("ask", map[string]any{"question": "go on?"})
				o.changed = dualListChanged(a, c)
				a.call("remember", map[string]any{"value": c})
				o.recall = a.call("recall", map[string]any{})
			}
			for i := range clients {
				obs[i][side].inits = initsOf(side, i, "recall", len(clients))
			}
		}()
	}
	wg.Wait()
	for _, srv := range srvs {
		wg.Add(1)
		go func() { defer wg.Done(); srv.restart() }()
	}
	wg.Wait()
	for side := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i, c := range clients {
				start := time.Now()
				o := &obs[i][side]
				o.afterHeal = agents[i][side].call("echo", map[string]any{"text": "after the restart"})
				if side == proxied && time.Since(start) >= margin(c) {
					t.Errorf("%s through mcpheal: the call after the restart took %v", c, time.Since(start))
				}
			}
			n := 0
			for i := range clients {
				if obs[i][side].afterHeal.OK {
					n++
				}
			}
			for i := range clients {
				obs[i][side].healInits = initsOf(side, i, "echo", n)
			}
		}()
	}
	wg.Wait()

	for i, c := range clients {
		t.Run(c, func(t *testing.T) {
			d, p := obs[i][direct], obs[i][proxied]
			t.Logf("directly: %d initialize, ask %v %q, list change %v, recall %q, after the restart %v %q (%d initialize)",
				d.inits, d.ask, d.ask.TextHead, d.changed, d.recall.TextHead, d.afterHeal, d.afterHeal.TextHead, d.healInits)
			t.Logf("through mcpheal (%s): %d initialize, ask %v %q, list change %v, recall %q, after the restart %v %q (%d initialize)",
				bridge, p.inits, p.ask, p.ask.TextHead, p.changed, p.recall.TextHead, p.afterHeal, p.afterHeal.TextHead, p.healInits)
			modern := pyModern(c)
			if !p.afterHeal.OK || p.afterHeal.TextHead != "after the restart" {
				t.Errorf("through mcpheal, the call after the restart: %v, text %q", p.afterHeal, p.afterHeal.TextHead)
			}
			if modern || bridge == "auto" {
				// Passed through in its own era: what it gets directly.
				if p.inits != d.inits {
					t.Errorf("the server saw %d initializes from the agent through mcpheal, %d directly", p.inits, d.inits)
				}
				for _, f := range []struct {
					what     string
					got, dir result
				}{{"ask (elicitation)", p.ask, d.ask}, {"tools/list_changed", p.changed, d.changed}, {"recall (per-session state)", p.recall, d.recall}} {
					if f.dir.OK && (!f.got.OK || f.got.TextHead != f.dir.TextHead) {
						t.Errorf("%s through mcpheal: %v, text %q; directly %v, text %q", f.what, f.got, f.got.TextHead, f.dir, f.dir.TextHead)
					}
				}
				if !modern {
					if !d.recall.OK || d.recall.TextHead == "recalled " {
						t.Errorf("directly the server kept no state for a session-era agent (%v %q): the fixture does not show per-session state", d.recall, d.recall.TextHead)
					}
					if p.healInits != 1 {
						t.Errorf("the restarted server saw %d initializes from the agent through mcpheal, want 1: its session healed in the session era", p.healInits)
					}
				}
				return
			}
			// prefer-2026: a session-era agent bridged onto 2026-07-28.
			if p.inits != 0 || p.healInits != 0 {
				t.Errorf("bridged, the server saw %d initializes from the agent at connect and %d after the restart, want none: the bridge answers initialize itself", p.inits, p.healInits)
			}
			if d.inits != 1 {
				t.Errorf("directly the server saw %d initializes from the agent, want 1", d.inits)
			}
			if !p.recall.OK || p.recall.TextHead != "recalled " {
				t.Errorf("bridged, recall after remember: %v, text %q; want %q: the server keeps no state across 2026-07-28 requests", p.recall, p.recall.TextHead, "recalled ")
			}
			for _, f := range []struct {
				what string
				got  result
			}{{"ask (elicitation)", p.ask}, {"tools/list_changed", p.changed}} {
				if f.got.Kind == "timeout" {
					t.Errorf("bridged, %s: %v; want an answer well under the client's timeout", f.what, f.got)
				}
			}
		})
	}
}

// waitCount waits until l holds at least n lines that match says yes to,
// for at most d.
func waitCount(l *lineLog, match func(string) bool, n int, d time.Duration) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		l.mu.Lock()
		ch := l.changed
		l.mu.Unlock()
		if l.count(match) >= n {
			return true
		}
		select {
		case <-ch:
		case <-timer.C:
			return false
		}
	}
}

// dualListChanged calls change_tools and reports whether the agent then
// holds the new tool: a session-era agent told so on its GET stream
// (Hermes re-lists by itself), a 2026-07-28 agent by listing again.
func dualListChanged(a agent, client string) result {
	event := "toolsChanged"
	if client == "hermes" {
		event = "toolsRefreshed"
	}
	before := events(a)
	c := a.call("change_tools", map[string]any{})
	if !c.OK || c.IsError {
		return c
	}
	if !pyModern(client) {
		n := before.ToolsChanged
		if event == "toolsRefreshed" {
			n = before.ToolsRefreshed
		}
		if ev := waitEvent(a, event, n+1, 5*time.Second); !ev.OK {
			return result{Op: "changed", Kind: "not notified", Message: ev.Message}
		}
	}
	l := a.list()
	for _, name := range l.Names {
		if name == c.TextHead {
			return result{Op: "changed", OK: true, TextHead: "listed"}
		}
	}
	return result{Op: "changed", Kind: "not listed", Message: c.TextHead + " not in " + strings.Join(l.Names, ",")}
}
