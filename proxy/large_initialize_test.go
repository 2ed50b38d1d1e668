package proxy

// A sealed id carries the agent's initialize deflated only up to a size
// (seal's maxInit, 1200 bytes), so that the id stays short; past it, the id
// holds a digest and a fleet's store keeps the initialize itself (docs/deployment.md
// "Replicas"). These tests pin both sides: with a store, a session with a
// large initialize lives on another replica and after a restart, and heals
// with that very initialize; without one, a restarted process cannot
// re-create it (404), the documented limit.

import (
	"crypto/rand"
	"encoding/base64"
	"net/http"
	"testing"

	"github.com/mcpheal/mcpheal/proxy/internal/conf"
	"github.com/mcpheal/mcpheal/proxy/internal/peers"
	"github.com/mcpheal/mcpheal/session/redisstore/redistest"
)

// largeInitialize returns an initialize whose clientInfo carries 6 KiB of
// random bytes as base64 text: it deflates to about 6 KB, far past what a
// sealed id carries, and stays well under max_init_body (64 KiB).
func largeInitialize(t *testing.T) string {
	t.Helper()
	noise := make([]byte, 6<<10)
	if _, err := rand.Read(noise); err != nil {
		t.Fatal(err)
	}
	return `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},` +
		`"clientInfo":{"name":"large","version":"1","description":"` + base64.StdEncoding.EncodeToString(noise) + `"}}}`
}

// initializeAt runs the handshake with body at url and returns the id.
func initializeAt(t *testing.T, url, body string) string {
	t.Helper()
	resp, raw := peers.RawPost(t, url, "", body)
	sid := resp.Header.Get("Mcp-Session-Id")
	if resp.StatusCode != http.StatusOK || sid == "" {
		t.Fatalf("initialize: %d, session %q, body %s", resp.StatusCode, sid, raw)
	}
	if resp, raw := peers.RawPost(t, url, sid, `{"jsonrpc":"2.0","method":"notifications/initialized"}`); resp.StatusCode != http.StatusAccepted {
		t.Fatalf("notifications/initialized: %d %s", resp.StatusCode, raw)
	}
	return sid
}

// TestLargeInitializeAcrossReplicas: a session whose initialize is too
// large for its sealed id, created on replica 0 of a fleet sharing a store,
// answers on replica 1, which never held it; heals there when the upstream
// forgets it; and answers on replica 0 again after that process restarted,
// healing there too. Every upstream initialize is the agent's own.
func TestLargeInitializeAcrossReplicas(t *testing.T) {
	t.Parallel()
	sharedKinds(t, func(t *testing.T, sh *countingShared, _ *redistest.Server) {
		up := startLedger(t, false)
		f := startFleet(t, 2, up.url, sh)
		body := largeInitialize(t)
		sid := initializeAt(t, f.replica(0), body)
		if len(sid) > 2048 {
			t.Fatalf("sealed id of %d bytes: the initialize was sealed whole", len(sid))
		}
		ping := func(i int, what string) {
			t.Helper()
			if status, ans := agentRPC(t, f.replica(i), sid, `{"jsonrpc":"2.0","id":2,"method":"ping"}`); status != http.StatusOK || !ans.Get("result").Exists() {
				t.Fatalf("ping on replica %d %s: %d %s, want 200", i, what, status, ans.Raw)
			}
		}
		ping(1, "that never held the session")
		if n := up.inits.Load(); n != 1 {
			t.Fatalf("%d upstream initializes, want 1: replica 1 adopts the upstream session", n)
		}
		up.Expire()
		ping(1, "after the upstream forgot the session")
		f.restart(0)
		up.Expire()
		ping(0, "restarted, after the upstream forgot the session again")

		inits := up.Got("initialize")
		if len(inits) != 3 {
			t.Fatalf("%d upstream initializes, want 3: the agent's and one heal on each replica", len(inits))
		}
		want := rpcAnswer([]byte(body)).Get("params").Raw
		for i, e := range inits {
			if e.Params != want {
				t.Fatalf("upstream initialize %d carried params of %d bytes, not the agent's %d", i, len(e.Params), len(want))
			}
		}
		f.check()
	})
}

// TestLargeInitializeWithoutStore: without a store nothing keeps an
// initialize too large for the sealed id, so a restarted process answers
// its session 404, as an unknown one (docs/deployment.md "Sessions that outlive
// mcpheal"), and asks the upstream nothing; a session with a small
// initialize heals from its id alone.
func TestLargeInitializeWithoutStore(t *testing.T) {
	t.Parallel()
	up := startLedger(t, false)
	keys := testKeys(1)
	mod := func(c *conf.Config) { c.SessionKeys = keys; c.Keepalive = -1 }
	a := startProxyAt(t, "127.0.0.1:0", up.url, mod)
	addr := a.ln.Addr().String()
	url := "http://" + addr + "/mcp"
	large := initializeAt(t, url, largeInitialize(t))
	small := peers.RawInitialize(t, url)
	a.kill()
	b := startProxyAt(t, addr, up.url, mod)
	inits := up.inits.Load()
	ping := `{"jsonrpc":"2.0","id":2,"method":"ping"}`
	if status, ans := agentRPC(t, url, large, ping); status != http.StatusNotFound || ans.Get("error.code").Int() != -32001 {
		t.Fatalf("large-initialize session after a restart without a store: %d %s, want 404 -32001", status, ans.Raw)
	}
	if n := up.inits.Load() - inits; n != 0 {
		t.Fatalf("%d upstream initializes for a session that cannot be re-created, want 0", n)
	}
	if status, ans := agentRPC(t, url, small, ping); status != http.StatusOK || !ans.Get("result").Exists() {
		t.Fatalf("small-initialize session after a restart: %d %s, want 200", status, ans.Raw)
	}
	noPanics(t, b.s)
}
