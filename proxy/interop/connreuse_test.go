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
// TestRoutesReuseTheirConnection say it of the Go SDK's). Each answers a
// request with an event stream and ends it after the response; mcpheal
// reads that end before it lets the answer go, so the connection serves
// the next exchange. Counted at a TCP relay in front of the server: ten
// keepalive pings open at most one connection; ten calls of a 2026-07-28
// agent (the Go SDK's), which take the held route, and of a session-era
// one, which pass through, at most two (the agent's next call may come
// before the last one let its stream go).
//
// Not parallel at the top (the Python servers', see python_use_test.go);
// its subtests run in parallel.
func TestServersKeepTheirConnection(t *testing.T) {
	servers := []struct {
		name  string
		start func(*testing.T) *server
	}{
		{"ts-sdk-v1-server", func(t *testing.T) *server { return startV1Server(t, v1Opts{}) }},
		{"fastmcp", func(t *testing.T) *server { return startFastMCP(t) }},
		{"fastmcp-py", func(t *testing.T) *server { return startPyServer(t, pyServerOpts{impl: pyFastMCP}) }},
		{"mcpserver-py", func(t *testing.T) *server { return startPyServer(t, pyServerOpts{impl: pyMCPServer}) }},
	}
	for _, sv := range servers {
		t.Run(sv.name, func(t *testing.T) {
			t.Parallel()
			srv := sv.start(t)
			// behindRelay starts mcpheal (keepalive every interval, or
			// off) in front of a relay in front of the server.
			behindRelay := func(keepalive time.Duration) (*proxy.Server, *peers.TCPRelay, string) {
				u, err := url.Parse(srv.url())
				if err != nil {
					t.Fatal(err)
				}
				relay := peers.NewTCPRelay(t, u.Host)
				s, proxyURL := startProxyConfig(t, proxy.Config{Upstream: "http://" + relay.Addr() + u.Path, Keepalive: keepalive},
					&tail{max: 64 << 10})
				return s, relay, proxyURL
			}
			t.Run("keepalive", func(t *testing.T) {
				s, relay, proxyURL := behindRelay(20 * time.Millisecond)
				rawInitialize(t, proxyURL)
				before, pings := relay.Accepted(), s.Stats().Keepalives
				peers.Wait(t, "ten keepalive pings", func() bool { return s.Stats().Keepalives >= pings+10 })
				n := relay.Accepted() - before
				t.Logf("%s: ten keepalive pings opened %d connections", sv.name, n)
				if n > 1 {
					t.Errorf("ten keepalive pings opened %d connections; want at most 1", n)
				}
			})
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
			t.Run("held", func(t *testing.T) {
				_, relay, proxyURL := behindRelay(-1)
				calls(t, relay, peers.GoSDK2026Client(t, proxyURL, nil), sv.name+": held route")
			})
			t.Run("session", func(t *testing.T) {
				_, relay, proxyURL := behindRelay(-1)
				calls(t, relay, peers.GoSDKClient(t, proxyURL), sv.name+": session pass-through")
			})
		})
	}
}
