package proxy

import (
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpheal/mcpheal/proxy/internal/conf"
	"github.com/mcpheal/mcpheal/proxy/internal/peers"
)

// Tests of the upstream connection an answer leaves for the next exchange
// (upstream.Response.ReadEnd): a server ends an answer's event stream
// right after its response, and mcpheal reads that end rather than close
// the stream unread, which costs the connection. Each counts the
// connections the upstream accepted, through a TCP relay.

// TestUpcallsReuseTheirConnection: mcpheal's own requests read a Go SDK
// server's event-stream answer to its end, which the server writes right
// after the response, so that the connection serves the next exchange
// instead of being closed with the stream unread: ten keepalive pings, and
// three heals (each an initialize, its notification, the replay), open at
// most one connection between them, not one or two each.
func TestUpcallsReuseTheirConnection(t *testing.T) {
	t.Parallel()
	t.Run("keepalive", func(t *testing.T) {
		up, relay, url := goSDKBehindRelay(t, func(c *conf.Config) { c.Keepalive = 20 * time.Millisecond })
		peers.RawInitialize(t, url)
		before, pings := relay.Accepted(), up.Calls("ping")
		peers.Wait(t, "ten keepalive pings", func() bool { return up.Calls("ping") >= pings+10 })
		if n := relay.Accepted() - before; n > 1 {
			t.Errorf("ten keepalive pings opened %d connections; want at most 1", n)
		}
	})
	t.Run("heal", func(t *testing.T) {
		up, relay, url := goSDKBehindRelay(t, nil)
		sid := peers.RawInitialize(t, url)
		footprintCall(t, url, sid, "live")
		before := relay.Accepted()
		for i := range 3 {
			up.ExpireSessions()
			footprintCall(t, url, sid, "heal"+strconv.Itoa(i))
		}
		if n := up.ToolCalls("echo"); n != 4 {
			t.Errorf("echo ran %d times; want 4, once per call", n)
		}
		// A heal DELETEs the session it replaced in the background, while
		// the call is replayed: that may take a connection of its own, once.
		if n := relay.Accepted() - before; n > 1 {
			t.Errorf("three heals opened %d connections; want at most 1", n)
		}
	})
}

// TestRoutesReuseTheirConnection: ten calls on each route that reads an
// upstream event stream up to its response open no connection each: the
// session-era pass-through (which relays the stream to its end), the held
// route (a 2026-07-28 agent of a session-era Go SDK server) and the bridge
// (a session-era agent of a 2026-07-28 Go SDK server), which both stop at
// the response. Before, the held route and the bridge opened one a call
// (ten for ten).
func TestRoutesReuseTheirConnection(t *testing.T) {
	t.Parallel()
	calls := func(t *testing.T, relay *peers.TCPRelay, cs *mcp.ClientSession) {
		t.Helper()
		call := func() {
			if res, err := peers.GoSDKCall(t, cs, "echo", map[string]any{"text": "x"}); err != nil || peers.ResultText(res) != "x" {
				t.Fatalf("echo: %v, %v", res, err)
			}
		}
		call()
		before := relay.Accepted()
		for range 10 {
			call()
		}
		// The agent's next call may come before the last call's attempt has
		// let its stream go (after the agent's answer): the pool then holds
		// a second connection, and both serve the calls that follow.
		if n := relay.Accepted() - before; n > 2 {
			t.Errorf("ten calls opened %d connections; want at most 2", n)
		}
	}
	t.Run("session", func(t *testing.T) {
		_, relay, url := goSDKBehindRelay(t, nil)
		calls(t, relay, peers.GoSDKClient(t, url))
	})
	t.Run("held", func(t *testing.T) {
		_, relay, url := goSDKBehindRelay(t, nil)
		calls(t, relay, peers.GoSDK2026Client(t, url, nil))
	})
	t.Run("bridge", func(t *testing.T) {
		up := startModern(t)
		u, err := url.Parse(up.url)
		if err != nil {
			t.Fatal(err)
		}
		relay := peers.NewTCPRelay(t, u.Host)
		_, proxyURL := startProxy(t, "http://"+relay.Addr()+u.Path, nil)
		cs, err := legacyClient(t, proxyURL, nil)
		if err != nil {
			t.Fatal(err)
		}
		calls(t, relay, cs)
		if n := up.echoes.Load(); n != 11 {
			t.Errorf("echo ran %d times; want 11, once per call", n)
		}
	})
}

// goSDKBehindRelay starts a Go SDK server, a counting TCP relay in front of
// it, and mcpheal in front of the relay (mod, when set, changes its
// configuration); it returns the server, the relay and mcpheal's URL.
func goSDKBehindRelay(t *testing.T, mod func(*conf.Config)) (*peers.Server, *peers.TCPRelay, string) {
	t.Helper()
	up := peers.StartGoSDK(t, peers.GoSDKOpts{})
	relay := peers.NewTCPRelay(t, up.Addr())
	_, url := startProxy(t, relay.URL(), mod)
	return up, relay, url
}
