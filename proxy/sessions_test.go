package proxy

// session_max_age bounds a session's life "however active" (Config): the
// sealed id stops opening at its expiry, and the session this process holds
// in memory must end then too, used or idle, its upstream session with it.
// Before, a session kept in memory lived on past its max age until the
// process restarted.

import (
	"context"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mcpheal/mcpheal/proxy/internal/conf"
	"github.com/mcpheal/mcpheal/proxy/internal/peers"
)

// TestSessionMaxAgeEndsLiveSession: with a max age of 2 s, a session pinged
// every 300 ms answers until its max age and 404 from then on; an idle
// one answers 404 on its first request past it. Either way the upstream
// session is DELETEd and the budget gets the session's memory back. Sealed
// expiries have whole-second precision, hence the second of slack.
func TestSessionMaxAgeEndsLiveSession(t *testing.T) {
	t.Parallel()
	const maxAge = 2 * time.Second
	ping := `{"jsonrpc":"2.0","id":2,"method":"ping"}`
	start := func(t *testing.T) (*ledger, *Server, string, int64) {
		up := startLedger(t, false)
		s, url := startProxy(t, up.url, func(c *conf.Config) {
			c.SessionMaxAge = maxAge
			c.Keepalive = -1
		})
		return up, s, url, memSettled(t, s)
	}
	ended := func(t *testing.T, up *ledger, s *Server, before int64) {
		t.Helper()
		peers.Wait(t, "the upstream session to be DELETEd", func() bool { return slices.Contains(up.Deletes(), "s-1") })
		if n := up.inits.Load(); n != 1 {
			t.Fatalf("%d upstream initializes, want 1: an expired session must not heal", n)
		}
		if got := memSettled(t, s); got != before {
			t.Fatalf("the memory budget counts %d bytes after the session ended, want %d as before it", got, before)
		}
	}

	t.Run("used", func(t *testing.T) {
		t.Parallel()
		up, s, url, before := start(t)
		t0 := time.Now()
		sid := peers.RawInitialize(t, url)
		t1 := time.Now()
		var gone time.Time
		after := 0 // 404s seen: once ended, the session stays ended
		for at := t1; time.Since(t0) < maxAge+3*time.Second && after < 3; at = at.Add(300 * time.Millisecond) {
			time.Sleep(time.Until(at))
			sent := time.Now()
			status, ans := agentRPC(t, url, sid, ping)
			switch {
			case status == http.StatusOK && gone.IsZero():
				// Within its max age, or just past it by the slack.
				if sent.After(t1.Add(maxAge + time.Second)) {
					t.Fatalf("ping %v after the initialize answered 200, want 404: the session outlived its max age of %v",
						sent.Sub(t1).Round(time.Millisecond), maxAge)
				}
			case status == http.StatusNotFound && ans.Get("error.code").Int() == -32001:
				after++
				if gone.IsZero() {
					gone = sent
					if sent.Before(t0.Add(maxAge - time.Second)) {
						t.Fatalf("404 %v after the initialize, before the max age of %v", sent.Sub(t0), maxAge)
					}
				}
			default:
				t.Fatalf("ping %v after the initialize: %d %s", sent.Sub(t0), status, ans.Raw)
			}
		}
		if gone.IsZero() {
			t.Fatal("the session never ended")
		}
		t.Logf("the session ended %v after its initialize (max age %v)", gone.Sub(t0).Round(time.Millisecond), maxAge)
		ended(t, up, s, before)
		noPanics(t, s)
	})
	t.Run("idle", func(t *testing.T) {
		t.Parallel()
		up, s, url, before := start(t)
		sid := peers.RawInitialize(t, url)
		time.Sleep(maxAge + time.Second)
		if status, ans := agentRPC(t, url, sid, ping); status != http.StatusNotFound || ans.Get("error.code").Int() != -32001 {
			t.Fatalf("ping on a session idle past its max age: %d %s, want 404 -32001", status, ans.Raw)
		}
		ended(t, up, s, before)
		noPanics(t, s)
	})
}

// TestSessionMaxAgeStopsKeepalive: a session no agent uses past its max age
// is over: keepalive must neither ping its upstream session (keeping alive
// what should end) nor, when the upstream forgets it, heal it into a new
// upstream session; its upstream session is DELETEd.
func TestSessionMaxAgeStopsKeepalive(t *testing.T) {
	t.Parallel()
	const maxAge = 2 * time.Second
	up := startLedger(t, false)
	s, url := startProxy(t, up.url, func(c *conf.Config) {
		c.SessionMaxAge = maxAge
		c.Keepalive = 200 * time.Millisecond
	})
	peers.RawInitialize(t, url)
	t1 := time.Now()
	pings := func() int {
		n := 0
		for _, e := range up.Got("ping") {
			if strings.HasPrefix(e.ID, `"mcpheal-keepalive-`) {
				n++
			}
		}
		return n
	}
	time.Sleep(maxAge / 2)
	if pings() == 0 {
		t.Fatal("no keepalive ping within the max age: the test cannot tell")
	}
	time.Sleep(time.Until(t1.Add(maxAge + time.Second))) // the whole-second slack
	if !slices.Contains(up.Deletes(), "s-1") {
		t.Errorf("the upstream session was not DELETEd within a second of the session's max age (DELETEs: %q)", up.Deletes())
	}
	before := pings()
	up.Expire() // a keepalive ping now finds the upstream session gone
	time.Sleep(time.Second)
	if n := pings() - before; n != 0 {
		t.Errorf("%d keepalive pings for a session past its max age, want 0", n)
	}
	if n := up.inits.Load(); n != 1 {
		t.Errorf("%d upstream initializes: keepalive healed a session past its max age into a new upstream session", n)
	}
	noPanics(t, s)
}

// TestSessionMaxAgeEndsStream: an agent's GET stream is use of its session
// too; it must not outlive the session's max age, nor keep the upstream's
// stream open. Keepalive is off: max age is not a keepalive feature.
func TestSessionMaxAgeEndsStream(t *testing.T) {
	t.Parallel()
	const maxAge = 2 * time.Second
	up := startLedger(t, false)
	s, url := startProxy(t, up.url, func(c *conf.Config) {
		c.SessionMaxAge = maxAge
		c.Keepalive = -1
		c.StreamKeepalive = 200 * time.Millisecond
	})
	sid := peers.RawInitialize(t, url)
	t1 := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), maxAge+3*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("MCP-Protocol-Version", "2025-11-25")
	req.Header.Set("Mcp-Session-Id", sid)
	resp, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET: %d", resp.StatusCode)
	}
	peers.Wait(t, "the upstream's GET stream", func() bool { return up.streams.Load() == 1 })
	_, _ = io.Copy(io.Discard, resp.Body) // until the proxy ends it, or the context does
	if el := time.Since(t1); el > maxAge+1500*time.Millisecond {
		t.Fatalf("the GET stream lasted %v, past the session's max age of %v", el.Round(time.Millisecond), maxAge)
	}
	peers.Wait(t, "the upstream's GET stream to close", func() bool { return up.streams.Load() == 0 })
	noPanics(t, s)
}
