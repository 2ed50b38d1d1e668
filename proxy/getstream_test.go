package proxy

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcpheal/mcpheal/proxy/internal/peers"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Tests of an agent's GET stream (getstream.go) across heals, restarts and reconnects.

// TestStateGetStreamAcrossRestart: the agent's standalone GET stream stays
// open while the upstream restarts, without any agent request: the proxy
// sees its upstream stream die, heals the session by itself, opens the new
// session's GET stream, and a notification the new server sends unprompted
// (resources/list_changed, gated by no session state) reaches the agent on
// the GET it opened before the restart.
func TestStateGetStreamAcrossRestart(t *testing.T) {
	t.Parallel()
	up := peers.StartGoSDK(t, peers.GoSDKOpts{State: true})
	_, url := startProxy(t, up.URL(), nil)
	tap := &wireTap{}
	var changed atomic.Int64
	cs := peers.GoSDKClientVia(t, url, &mcp.ClientOptions{
		ResourceListChangedHandler: func(context.Context, *mcp.ResourceListChangedRequest) { changed.Add(1) },
	}, tap.wrap)
	peers.Wait(t, "the agent's GET stream", func() bool { return tap.snapshot().getsOpen == 1 })
	var n atomic.Int64
	addResource := func() { up.AddResource(fmt.Sprintf("test://peer/added/%d", n.Add(1))) }
	nudge(t, "resources/list_changed before the restart", addResource, func() bool { return changed.Load() > 0 })
	old := up.SessionIDs()
	if len(old) != 1 {
		t.Fatalf("upstream sessions = %q, want 1", old)
	}

	up.Restart()
	peers.Wait(t, "the proxy's GET on a new upstream session", func() bool {
		for _, r := range up.Requests() {
			if r.HTTPMethod == http.MethodGet && r.SessionID != "" && r.SessionID != old[0] {
				return true
			}
		}
		return false
	})
	seen := changed.Load()
	nudge(t, "resources/list_changed after the restart", addResource, func() bool { return changed.Load() > seen })
	if w := tap.snapshot(); w.gets != 1 || w.getsEnded != 0 {
		t.Errorf("agent opened %d GET streams, %d ended; want its first one held open", w.gets, w.getsEnded)
	}
	if got := up.Inits(); got != 2 {
		t.Errorf("upstream initializes = %d, want 2 (the first, then one heal by the stream)", got)
	}
	peers.CallEcho(t, cs, "after")
	if got := up.Inits(); got != 2 {
		t.Errorf("upstream initializes after a call = %d, want still 2: the stream already healed the session", got)
	}
}

// TestStateGetStreamAgentReconnect: the connection between the agent and
// the proxy breaks while the GET stream is idle, so the proxy learns of it
// only at its next write, and the agent's SDK reopens its GET stream. The
// new stream must be accepted (the go-sdk client fails its whole session
// when a GET reconnect is refused), carry the server's notifications, and
// the session keep working. Directly against the go-sdk server this works:
// it releases a GET stream as soon as its connection closes.
func TestStateGetStreamAgentReconnect(t *testing.T) {
	t.Parallel()
	up := peers.StartGoSDK(t, peers.GoSDKOpts{State: true})
	_, url := startProxy(t, up.URL(), nil)
	tap := &wireTap{}
	var changed atomic.Int64
	cs := peers.GoSDKClientVia(t, url, &mcp.ClientOptions{
		ResourceListChangedHandler: func(context.Context, *mcp.ResourceListChangedRequest) { changed.Add(1) },
	}, tap.wrap)
	peers.Wait(t, "the agent's GET stream", func() bool { return tap.snapshot().getsOpen == 1 })

	tap.cutGET()
	// go-sdk reconnects after 1-2 s (its first backoff, with jitter).
	peers.Wait(t, "the agent's GET reconnect", func() bool { return len(tap.snapshot().getStatus) >= 2 })
	if st := tap.snapshot().getStatus; st[1] != http.StatusOK {
		t.Fatalf("agent's GET reconnect answered %d, want 200 (GET answers %v)", st[1], st)
	}
	peers.CallEcho(t, cs, "after")
	var n atomic.Int64
	nudge(t, "resources/list_changed on the reopened stream", func() { up.AddResource(fmt.Sprintf("test://peer/added/%d", n.Add(1))) },
		func() bool { return changed.Load() > 0 })
}

// TestQuietGetStreamHeadAtOnce: an upstream whose GET stream sends its
// head but no byte of body (the TypeScript SDK 1.x servers: no event until
// there is one) still lets a Go SDK client connect at once: that client
// waits for its GET stream's answer before notifications/initialized, and
// mcpheal writes the head with a comment rather than waiting for the first
// event or keepalive (15 s).
func TestQuietGetStreamHeadAtOnce(t *testing.T) {
	t.Parallel()
	srv := mcp.NewServer(&mcp.Implementation{Name: "quiet-get", Version: "1"}, nil)
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet {
			h.ServeHTTP(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}))
	t.Cleanup(func() { up.CloseClientConnections(); up.Close() })
	_, url := startProxy(t, up.URL, nil)
	start := time.Now()
	peers.GoSDKClient(t, url)
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("the Go SDK client took %v to connect; want the GET stream's head at once", d)
	}
}
