package proxy

import (
	"net/http"
	"strings"
	"testing"

	"github.com/mcpheal/mcpheal/proxy/internal/peers"
	"github.com/mcpheal/mcpheal/proxy/internal/wire"
)

// Tests of the pass-through route and DELETE (pipeline.go).

// TestPassThroughBytes: a JSON answer reaches the agent byte for byte, with
// the upstream's own headers, the session id swapped and 202 kept.
func TestPassThroughBytes(t *testing.T) {
	t.Parallel()
	up := peers.StartDialect(t, peers.DialectWP200)
	_, url := startProxy(t, up.URL(), nil)
	sid := peers.RawInitialize(t, url)
	const call = `{"jsonrpc":"2.0","id":"x-9","method":"tools/call","params":{"name":"echo","arguments":{"text":"bytes"}}}`
	resp, body := peers.RawPost(t, url, sid, call)
	upSID := up.Requests()[len(up.Requests())-1].SessionID
	direct, dbody := peers.RawPost(t, up.URL(), upSID, call)
	if string(body) != string(dbody) || resp.StatusCode != direct.StatusCode {
		t.Fatalf("proxied %d %q, direct %d %q", resp.StatusCode, body, direct.StatusCode, dbody)
	}
	if got := resp.Header.Get("Mcp-Session-Id"); got != sid {
		t.Fatalf("Mcp-Session-Id = %q, want the client id %q", got, sid)
	}
	if resp.Header.Get("Content-Type") != direct.Header.Get("Content-Type") {
		t.Fatalf("Content-Type %q, direct %q", resp.Header.Get("Content-Type"), direct.Header.Get("Content-Type"))
	}
	resp, _ = peers.RawPost(t, url, sid, `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1}}`)
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("notification answered %d, want 202", resp.StatusCode)
	}
	for _, r := range up.Requests() {
		if r.SessionID == sid {
			t.Fatal("upstream saw the client id")
		}
		if r.Header.Get("Host") != "" && !strings.HasPrefix(r.Header.Get("Host"), "127.0.0.1") {
			t.Fatalf("upstream saw Host %q", r.Header.Get("Host"))
		}
	}
}

// TestDeleteEndsSession: the agent's DELETE reaches the upstream with the
// upstream id and the client id is unknown afterwards.
func TestDeleteEndsSession(t *testing.T) {
	t.Parallel()
	up := peers.StartGoSDK(t, peers.GoSDKOpts{})
	_, url := startProxy(t, up.URL(), nil)
	sid := peers.RawInitialize(t, url)
	req, _ := http.NewRequest(http.MethodDelete, url, nil)
	req.Header.Set("Mcp-Session-Id", sid)
	resp, _ := peers.RawDo(t, req)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("DELETE = %d, want 200", resp.StatusCode)
	}
	peers.Wait(t, "upstream DELETE", func() bool {
		for _, r := range up.Requests() {
			if r.HTTPMethod == http.MethodDelete && r.SessionID != "" && r.SessionID != sid {
				return true
			}
		}
		return false
	})
	resp, body := peers.RawPost(t, url, sid, `{"jsonrpc":"2.0","id":2,"method":"ping"}`)
	if code, _, id := rpcError(t, body); resp.StatusCode != http.StatusNotFound || code != wire.CodeSessionNotFound || id != "2" {
		t.Fatalf("after DELETE: %d %s", resp.StatusCode, body)
	}
}
