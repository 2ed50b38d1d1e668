package proxy

// session_max_age bounds a session's life "however active" (Config): the
// sealed id stops opening at its expiry, and the session this process holds
// in memory must end then too, used or idle, its upstream session with it.
// Before, a session kept in memory lived on past its max age until the
// process restarted.

import (
	"net/http"
	"slices"
	"testing"
	"time"
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
		s, url := startProxy(t, up.url, func(c *Config) {
			c.SessionMaxAge = maxAge
			c.Keepalive = -1
		})
		return up, s, url, memSettled(t, s)
	}
	ended := func(t *testing.T, up *ledger, s *Server, before int64) {
		t.Helper()
		peerWait(t, "the upstream session to be DELETEd", func() bool { return slices.Contains(up.Deletes(), "s-1") })
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
		sid := peerRawInitialize(t, url)
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
		sid := peerRawInitialize(t, url)
		time.Sleep(maxAge + time.Second)
		if status, ans := agentRPC(t, url, sid, ping); status != http.StatusNotFound || ans.Get("error.code").Int() != -32001 {
			t.Fatalf("ping on a session idle past its max age: %d %s, want 404 -32001", status, ans.Raw)
		}
		ended(t, up, s, before)
		noPanics(t, s)
	})
}
