package proxy

// A DELETE on one replica of a fleet ends the session everywhere: the store
// records the end and tells every process, the one that ends it included
// (Watcher: "the caller's own included"). The process that ends a session
// must still answer its agent 200 and DELETE the upstream session, however
// soon its own end event comes back to it.

import (
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/mcpheal/mcpheal/proxy/internal/peers"
	"github.com/mcpheal/mcpheal/session/redisstore/redistest"
)

// TestFleetDeleteRacesItsOwnEvent: 40 sessions, each used on both replicas
// and DELETEd on one: every DELETE answers 200 and reaches the upstream.
// The end event the store sends back may be applied by the process's
// watcher before the DELETE has dropped the session itself; were that
// taken for "ended meanwhile", the agent would get 404 for its own DELETE
// and the upstream session would never be DELETEd.
func TestFleetDeleteRacesItsOwnEvent(t *testing.T) {
	t.Parallel()
	sharedKinds(t, func(t *testing.T, sh *countingShared, _ *redistest.Server) {
		const n = 40
		up := startLedger(t, false)
		f := startFleet(t, 2, up.url, sh)
		ping := `{"jsonrpc":"2.0","id":2,"method":"ping"}`
		var refused []int
		for i := range n {
			sid := peers.RawInitialize(t, f.replica(0))
			if status, ans := agentRPC(t, f.replica(1), sid, ping); status != http.StatusOK {
				t.Fatalf("session %d: ping on replica 1: %d %s", i, status, ans.Raw)
			}
			if status := agentDelete(t, f.replica(0), sid); status != http.StatusOK {
				refused = append(refused, i)
			}
		}
		var missing []string
		peerWaitOrNot(func() bool {
			missing = missing[:0]
			dels := up.Deletes()
			for _, s := range up.Sessions() {
				if !slices.Contains(dels, s) {
					missing = append(missing, s)
				}
			}
			return len(missing) == 0
		})
		if len(refused) > 0 || len(missing) > 0 {
			t.Fatalf("of %d DELETEs on the replica holding the session, %d were answered other than 200 (sessions %v), "+
				"and %d upstream sessions were never DELETEd (%v)", n, len(refused), refused, len(missing), missing)
		}
		f.check()
	})
}

// peerWaitOrNot polls cond like peers.Wait, and returns when it holds or the
// time is up, leaving the verdict to the caller.
func peerWaitOrNot(cond func() bool) {
	deadline := time.Now().Add(peers.Timeout)
	for !cond() && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
}
