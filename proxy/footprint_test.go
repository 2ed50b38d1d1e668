package proxy

import (
	"github.com/mcpheal/mcpheal/proxy/internal/peers"
	"net/http"
	"runtime/debug"
	"strings"
	"testing"
)

// The two runs bench/healcover.sh compares: an agent's tools/call on a live
// session, and the same call after the upstream expired the session (a
// heal). What the second runs more than the first is what a heal runs
// (docs/healing.md "What a heal runs").

// footprintCall is one raw tools/call of the echo tool on sid; it fails t
// unless the tool answered text.
func footprintCall(t *testing.T, url, sid, text string) {
	t.Helper()
	resp, body := peers.RawPost(t, url, sid,
		`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo","arguments":{"text":"`+text+`"}}}`)
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), text) {
		t.Fatalf("tools/call echo %q: %d %s", text, resp.StatusCode, body)
	}
}

// quietGC turns the collector off for a footprint run: a collection empties
// the pools, and a run that happens to allocate afresh would count that as
// its own.
func quietGC(t *testing.T) {
	old := debug.SetGCPercent(-1)
	t.Cleanup(func() { debug.SetGCPercent(old) })
}

// TestFootprintCall: two calls on one live session, no heal.
func TestFootprintCall(t *testing.T) {
	quietGC(t)
	up := peers.StartGoSDK(t, peers.GoSDKOpts{})
	s, url := startProxy(t, up.URL(), nil)
	sid := peers.RawInitialize(t, url)
	footprintCall(t, url, sid, "one")
	footprintCall(t, url, sid, "two")
	if n := s.Stats().Heals; n != 0 || up.ToolCalls("echo") != 2 {
		t.Fatalf("heals %d, echo ran %d times; want 0 and 2", n, up.ToolCalls("echo"))
	}
}

// TestFootprintHeal: a call, the upstream expires the session, a call: one
// heal, and the second call ran once.
func TestFootprintHeal(t *testing.T) {
	quietGC(t)
	up := peers.StartGoSDK(t, peers.GoSDKOpts{})
	s, url := startProxy(t, up.URL(), nil)
	sid := peers.RawInitialize(t, url)
	footprintCall(t, url, sid, "one")
	up.ExpireSessions()
	footprintCall(t, url, sid, "two")
	if n := s.Stats().Heals; n != 1 || up.ToolCalls("echo") != 2 {
		t.Fatalf("heals %d, echo ran %d times; want 1 and 2", n, up.ToolCalls("echo"))
	}
}
