package proxy

// A DELETEd session never opens again (docs/deployment.md "Sessions that outlive
// mcpheal"): not under another spelling of its sealed id, not after any
// number of other DELETEs, not on another replica. Each test counts the
// upstream's initializes server-side: an ended id that opened again would
// heal, and heal means a new upstream initialize.

import (
	"crypto/rand"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcpheal/mcpheal/proxy/internal/conf"
	"github.com/mcpheal/mcpheal/proxy/internal/peers"
	"github.com/mcpheal/mcpheal/session/redisstore/redistest"
	"github.com/mcpheal/mcpheal/session/seal"
)

const b64url = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"

// otherSpellings returns the other texts a lenient base64url decoder reads
// as the same bytes as the sealed id sid: its last character with its
// unused low bits set otherwise (RFC 4648 §3.5). Unpadded, a last group of
// 2 characters leaves 4 bits unused, one of 3 leaves 2; a full group none.
func otherSpellings(sid string) []string {
	enc := sid[1:]
	var unused uint
	switch len(enc) % 4 {
	case 2:
		unused = 4
	case 3:
		unused = 2
	default:
		return nil
	}
	last := strings.IndexByte(b64url, enc[len(enc)-1])
	var out []string
	for x := 1; x < 1<<unused; x++ {
		out = append(out, sid[:len(sid)-1]+string(b64url[last^x]))
	}
	return out
}

// spelledSession initializes sessions at url until one's sealed id has
// other spellings (the length of a sealed id follows from its deflated
// initialize, so a longer clientInfo name changes it).
func spelledSession(t *testing.T, url string) string {
	t.Helper()
	for pad := range 12 {
		body := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},` +
			`"clientInfo":{"name":"spelled` + strings.Repeat("x", pad) + `","version":"1"}}}`
		resp, raw := peers.RawPost(t, url, "", body)
		sid := resp.Header.Get("Mcp-Session-Id")
		if resp.StatusCode != http.StatusOK || sid == "" {
			t.Fatalf("initialize: %d %s", resp.StatusCode, raw)
		}
		if len(otherSpellings(sid)) > 0 {
			return sid
		}
	}
	t.Fatal("no sealed id with unused bits in 12 sessions")
	return ""
}

// TestDeletedIDOtherSpellings: once DELETEd, an id's other spellings (the
// unused low bits of its last base64url character set otherwise) are
// unknown sessions like the id itself, on the process that ended it alone,
// and in a fleet sharing a store (memory and Redis) on the replica that
// ended it and on one that never held it. None reaches the upstream.
//
// CR and LF, which Go's base64 decoders skip, cannot be tried: fasthttp
// refuses them in a header value (400) or, set in-process, makes them
// spaces.
func TestDeletedIDOtherSpellings(t *testing.T) {
	t.Parallel()
	ping := `{"jsonrpc":"2.0","id":2,"method":"ping"}`
	refused := func(t *testing.T, up *ledger, urls []string, sid string) {
		t.Helper()
		inits := up.inits.Load()
		spellings := otherSpellings(sid)
		for _, url := range urls {
			for _, alt := range append(spellings, sid) {
				status, ans := agentRPC(t, url, alt, ping)
				if status != http.StatusNotFound || ans.Get("error.code").Int() != -32001 {
					t.Errorf("%s: ping on the DELETEd id spelled %q (sealed %q): %d %s, want 404 -32001",
						url, alt[len(alt)-6:], sid[len(sid)-6:], status, ans.Raw)
				}
			}
		}
		if n := up.inits.Load() - inits; n != 0 {
			t.Fatalf("%d upstream initializes after the DELETE: an ended session opened again under another spelling", n)
		}
		t.Logf("%d other spellings refused on %d processes", len(spellings), len(urls))
	}

	t.Run("alone", func(t *testing.T) {
		t.Parallel()
		up := startLedger(t, false)
		_, url := startProxy(t, up.url, func(c *conf.Config) { c.Keepalive = -1 })
		sid := spelledSession(t, url)
		if status := agentDelete(t, url, sid); status != http.StatusOK {
			t.Fatalf("DELETE: %d", status)
		}
		refused(t, up, []string{url}, sid)
	})
	t.Run("fleet", func(t *testing.T) {
		t.Parallel()
		sharedKinds(t, func(t *testing.T, sh *countingShared, _ *redistest.Server) {
			up := startLedger(t, false)
			f := startFleet(t, 2, up.url, sh)
			sid := spelledSession(t, f.replica(0))
			if status, ans := agentRPC(t, f.replica(1), sid, ping); status != http.StatusOK {
				t.Fatalf("ping on replica 1 before the DELETE: %d %s", status, ans.Raw)
			}
			if status := agentDelete(t, f.replica(0), sid); status != http.StatusOK {
				// The session is ended all the same (TestFleetDeleteRacesItsOwnEvent):
				// its spellings are still worth trying.
				t.Errorf("DELETE: %d, want 200", status)
			}
			// A third replica never held the session: only the store
			// and its sealed id can tell it of the end.
			f.procs = append(f.procs, f.start("127.0.0.1:0"))
			refused(t, up, []string{f.replica(0), f.replica(1), f.replica(2)}, sid)
			f.check()
		})
	})
}

// TestDeletedIDSurvivesDeleteFlood: a DELETEd id stays ended however many
// other sessions are DELETEd after it. A list of ended ids with a cap
// (65 536) was flooded by 65 600 DELETEs of ids the test sealed itself
// with the proxy's key ring (each DELETE restores its session from the id
// and ends it) and the victim's id opened again. Run in-process (handle):
// the DELETEs never reach the upstream, since a restored session has no
// upstream session until its first request.
func TestDeletedIDSurvivesDeleteFlood(t *testing.T) {
	t.Parallel()
	const flood = 65600
	up := startLedger(t, false)
	keys := testKeys(1)
	const host = "127.0.0.1:8787"
	s, err := New(conf.Config{Upstream: up.url, Listen: host, SessionKeys: keys, Keepalive: -1, AdminListen: "off",
		HealTimeout: 5 * time.Second}, nopLog())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	const jsonCT, both = "application/json", "application/json, text/event-stream"
	initBody := []byte(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"flood","version":"1"}}}`)
	call := func(method, sid string, body []byte) (int, []byte) {
		ct, accept := jsonCT, both
		if method != "POST" {
			ct, accept = "", ""
		}
		status, out, _ := handle(s, method, host, ct, accept, "", sid, body)
		return status, out
	}

	status, out := call("POST", "", initBody)
	if status != http.StatusOK {
		t.Fatalf("victim initialize: %d %s", status, out)
	}
	sessions := s.sessions.Store.Sessions()
	if len(sessions) != 1 {
		t.Fatalf("%d sessions after one initialize", len(sessions))
	}
	victim := string(sessions[0].ID)
	ping := []byte(`{"jsonrpc":"2.0","id":2,"method":"ping"}`)
	if status, out := call("POST", victim, ping); status != http.StatusOK {
		t.Fatalf("victim ping: %d %s", status, out)
	}
	if status, out := call("DELETE", victim, nil); status != http.StatusOK {
		t.Fatalf("victim DELETE: %d %s", status, out)
	}
	inits := up.inits.Load()

	ks, err := seal.ParseKeys(keys)
	if err != nil {
		t.Fatal(err)
	}
	ring, err := seal.NewRing(ks)
	if err != nil {
		t.Fatal(err)
	}
	// One record, a fresh nonce per id: each id is another session.
	rec := seal.NewRecord("default", "", "2025-11-25", initBody, time.Now(), 7*24*time.Hour)
	start := time.Now()
	var (
		next, bad atomic.Int64
		wg        sync.WaitGroup
		firstBad  atomic.Value
	)
	for range 4 {
		r := *rec
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= flood {
				_, _ = rand.Read(r.Nonce[:])
				if status, out := call("DELETE", ring.Seal(&r), nil); status != http.StatusOK {
					bad.Add(1)
					firstBad.CompareAndSwap(nil, strconv.Itoa(status)+" "+string(out))
				}
			}
		}()
	}
	wg.Wait()
	el := time.Since(start)
	t.Logf("%d DELETEs of sealed ids in %v (%v each)", flood, el.Round(time.Millisecond), (el / flood).Round(time.Microsecond))
	if n := bad.Load(); n != 0 {
		t.Fatalf("%d of the %d DELETEs of sealed ids were not 200 (first: %v): they did not end a session", n, flood, firstBad.Load())
	}
	if n := s.sessions.Store.Len(); n != 0 {
		t.Fatalf("%d sessions left after the DELETEs, want 0", n)
	}

	if status, out := call("POST", victim, ping); status != http.StatusNotFound {
		t.Fatalf("victim ping after %d other DELETEs: %d %s, want 404", flood, status, out)
	}
	if n := up.inits.Load() - inits; n != 0 {
		t.Fatalf("%d upstream initializes after the DELETE: the victim's session opened again", n)
	}
	noPanics(t, s)
}
