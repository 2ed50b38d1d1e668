package proxy

import (
	"net/http"
	"strings"
	"testing"

	"github.com/mcpheal/mcpheal/proxy/internal/era"
	"github.com/mcpheal/mcpheal/proxy/internal/peers"
)

// Tests of the era probe (era.go).

// TestEraUnderAgentCredential: a 2026-07-28-only upstream that wants a
// credential for everything, server/discover included. mcpheal's own
// probe gets 401, which says nothing of the era: it was taken for a
// session-era server, and a 2026-07-28 agent was put on the held route
// (mcpheal sent the upstream an initialize it never asked for). Now the
// unauthenticated agent gets the upstream's 401 and challenge as it would
// directly, and once it has a credential the era is learnt under it: a
// session-era agent is bridged, a 2026-07-28 one passes through, and no
// initialize ever reaches the upstream.
func TestEraUnderAgentCredential(t *testing.T) {
	t.Parallel()
	up := startScriptedModern(t, &scriptedModern{needsAuth: creatorToken,
		tools: `{"tools":[{"name":"echo","inputSchema":{"type":"object"}}]}`})
	s, url := startProxy(t, up.url, nil)
	list := `{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28",` +
		`"io.modelcontextprotocol/clientInfo":{"name":"raw","version":"1"},"io.modelcontextprotocol/clientCapabilities":{}}}}`
	modern := func(auth string) (*http.Response, []byte) {
		req := peers.PostRequest(t, url, "", list)
		req.Header.Set("MCP-Protocol-Version", "2026-07-28")
		req.Header.Set("Mcp-Method", "tools/list")
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		return peers.RawDo(t, req)
	}
	for range 2 {
		resp, body := modern("")
		if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(resp.Header.Get("WWW-Authenticate"), "resource_metadata=") {
			t.Fatalf("a 2026-07-28 agent without credential: %d %q %s; want the upstream's 401 and challenge",
				resp.StatusCode, resp.Header.Get("WWW-Authenticate"), body)
		}
	}
	if n := len(up.received("server/discover", "")); n != 1 {
		t.Errorf("%d unauthenticated probes for two requests, want 1 (a refused credential is not sent again at once)", n)
	}
	if resp, body := modern(creatorToken); resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"echo"`) {
		t.Fatalf("a 2026-07-28 agent with its credential: %d %s", resp.StatusCode, body)
	}
	if v := s.eras.V.Load(); v != era.EraModern {
		t.Errorf("era %s, want %s", era.EraNames[v], era.EraNames[era.EraModern])
	}
	sid := agentInitialize(t, url, creatorToken)
	resp, body := agentPost(t, url, sid, creatorToken, `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`)
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"echo"`) {
		t.Errorf("a bridged session-era agent: %d %s", resp.StatusCode, body)
	}
	if n := agentInits(up); n != 0 {
		t.Errorf("the 2026-07-28-only upstream got %d initialize", n)
	}
}

// TestStatelessEraProbe: a Go SDK 1.8 client probes server/discover
// (2026-07-28) first; through the proxy it works against a stateful 2025
// server and against a stateless one.
func TestStatelessEraProbe(t *testing.T) {
	t.Parallel()
	for _, o := range []peers.GoSDKOpts{{}, {Stateless: true}} {
		up := peers.StartGoSDK(t, o)
		s, url := startProxy(t, up.URL(), nil)
		cs := peers.GoSDK2026Client(t, url, nil)
		peers.CallEcho(t, cs, "probe")
		if up.Calls("server/discover") == 0 {
			t.Errorf("stateless=%v: no server/discover reached the upstream", o.Stateless)
		}
		// A stateless server speaks 2026-07-28 itself: the client's
		// requests pass through, without sessions. For a server of the
		// session era only, mcpheal answers the probe and holds a session
		// for the 2026-07-28 client (held.go).
		want := 1
		if o.Stateless {
			want = 0
		}
		if n := s.Stats().Sessions; n != want {
			t.Errorf("stateless=%v: %d client sessions, want %d", o.Stateless, n, want)
		}
	}
}
