//go:build unix

package interop

import (
	"net/url"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpheal/mcpheal/proxy"
	"github.com/mcpheal/mcpheal/proxy/internal/peers"
)

// TestServersKeepTheirConnection: what docs/healing.md "One connection for
// mcpheal's own requests" says, on the TypeScript and Python servers (the
// proxy package's TestUpcallsReuseTheirConnection and
// TestRoutesReuseTheirConnection say it of the Go SDK's), counted at a TCP
// relay in front of each: ten keepalive pings open at most one connection;
// ten calls at most two (the agent's next call may come before the last
// one let its stream go), those of a 2026-07-28 agent (the Go SDK's),
// which take the held route, those of a session-era one, which pass
// through, and those a session-era agent makes through the bridge to the
// TypeScript SDK v2's 2026-07-28 server.
//
// What each case guards, measured by undoing the fix: without the read of
// an event stream's end (upstream.Response.ReadEnd), keepalive opened 8 or
// 9 connections to FastMCP (npm, Python) and the Python SDK's server, and
// held calls 9 to the TypeScript SDK v1 server and 10 to FastMCP (npm);
// the others opened none either way (the TypeScript SDK v1 server's pings,
// the Python servers' held calls). Without the read of a chunked JSON
// answer's trailer section (upstream.Client.readBody), the bridged calls
// opened 10. The pass-through, which relays every stream to its end, and
// the Python SDK's server answering JSON with a Content-Length, opened none
// either way: they are counted for the route's and the answer shape's sake.
//
// Not parallel at the top (the Python servers', see python_use_test.go);
// its subtests run in parallel.
func TestServersKeepTheirConnection(t *testing.T) {
	servers := []struct {
		name  string
		start func(*testing.T) *server
		// only2026: the server speaks 2026-07-28 only; a session-era
		// agent's calls take the bridge, and there is no session to ping.
		only2026 bool
	}{
		{"ts-sdk-v1-server", func(t *testing.T) *server { return startV1Server(t, v1Opts{}) }, false},
		{"fastmcp", func(t *testing.T) *server { return startFastMCP(t) }, false},
		{"fastmcp-py", func(t *testing.T) *server { return startPyServer(t, pyServerOpts{impl: pyFastMCP}) }, false},
		{"mcpserver-py", func(t *testing.T) *server { return startPyServer(t, pyServerOpts{impl: pyMCPServer}) }, false},
		{"mcpserver-py-json", func(t *testing.T) *server { return startPyServer(t, pyServerOpts{impl: pyMCPServer, json: true}) }, false},
		{"ts-sdk-v2-2026", func(t *testing.T) *server { return startEraServer(t, eraOpts{}) }, true},
	}
	for _, sv := range servers {
		t.Run(sv.name, func(t *testing.T) {
			t.Parallel()
			srv := sv.start(t)
			// behindRelay starts mcpheal (keepalive every interval, or
			// off) in front of a relay in front of the server, for t.
			behindRelay := func(t *testing.T, keepalive time.Duration) (*proxy.Server, *peers.TCPRelay, string) {
				u, err := url.Parse(srv.url())
				if err != nil {
					t.Fatal(err)
				}
				relay := peers.NewTCPRelay(t, u.Host)
				s, proxyURL := startProxyConfig(t, proxy.Config{Upstream: "http://" + relay.Addr() + u.Path, Keepalive: keepalive},
					&tail{max: 64 << 10})
				return s, relay, proxyURL
			}
			calls := func(t *testing.T, relay *peers.TCPRelay, cs *mcp.ClientSession, what string) {
				t.Helper()
				call := func() {
					if res, err := peers.GoSDKCall(t, cs, "echo", map[string]any{"text": "x"}); err != nil || peers.ResultText(res) != "x" {
						t.Fatalf("%s: echo: %v, %v", what, res, err)
					}
				}
				call()
				before := relay.Accepted()
				for range 10 {
					call()
				}
				n := relay.Accepted() - before
				t.Logf("%s: ten calls opened %d connections", what, n)
				if n > 2 {
					t.Errorf("%s: ten calls opened %d connections; want at most 2", what, n)
				}
			}
			if sv.only2026 {
				_, relay, proxyURL := behindRelay(t, -1)
				calls(t, relay, peers.GoSDKClient(t, proxyURL), sv.name+": bridge")
				return
			}
			t.Run("keepalive", func(t *testing.T) {
				// Pings apart enough that one is answered before the next
				// goes: overlapping ones would need a connection each.
				s, relay, proxyURL := behindRelay(t, 200*time.Millisecond)
				rawInitialize(t, proxyURL)
				before, pings := relay.Accepted(), s.Stats().Keepalives
				peers.Wait(t, "ten keepalive pings", func() bool { return s.Stats().Keepalives >= pings+10 })
				n := relay.Accepted() - before
				t.Logf("%s: ten keepalive pings opened %d connections", sv.name, n)
				if n > 1 {
					t.Errorf("ten keepalive pings opened %d connections; want at most 1", n)
				}
			})
			t.Run("held", func(t *testing.T) {
				_, relay, proxyURL := behindRelay(t, -1)
				calls(t, relay, peers.GoSDK2026Client(t, proxyURL, nil), sv.name+": held route")
			})
			t.Run("session", func(t *testing.T) {
				_, relay, proxyURL := behindRelay(t, -1)
				calls(t, relay, peers.GoSDKClient(t, proxyURL), sv.name+": session pass-through")
			})
		})
	}
}
