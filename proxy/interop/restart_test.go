//go:build unix

package interop

import (
	"crypto/rand"
	"encoding/base64"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// keyRing returns a session key ring of one fresh 32-byte key, as
// MCPHEAL_SESSION_KEYS holds it.
func keyRing(t testing.TB) string {
	t.Helper()
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return "1:" + base64.StdEncoding.EncodeToString(b)
}

// runs counts the executions of the work tool with tag in countFile.
func runs(countFile, tag string) int {
	b, _ := os.ReadFile(countFile)
	n := 0
	for line := range strings.SplitSeq(string(b), "\n") {
		if strings.HasPrefix(line, tag+" ") {
			n++
		}
	}
	return n
}

// TestProxyRestart (docs/deployment.md "Sessions that outlive mcpheal"): each real
// client holds a session through mcpheal; mcpheal is killed (kill -9: agent
// connections reset, no DELETE upstream) and a new one takes its address.
// Given the same key ring, the client's next call succeeds after exactly one
// upstream initialize for its session, and every call runs the tool once.
// Given another ring (the control), the new mcpheal cannot open the id: the
// client's next call fails with the spec's 404 "Session not found", the
// tool does not run and the upstream sees no initialize, as without sealed
// ids; so the ring is what heals.
func TestProxyRestart(t *testing.T) {
	t.Parallel()
	for _, flavour := range flavours {
		for _, sameRing := range []bool{true, false} {
			name := flavour + "/same-ring"
			if !sameRing {
				name = flavour + "/other-ring"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				countFile := filepath.Join(t.TempDir(), "work.count")
				srv := startV1Server(t, v1Opts{countFile: countFile})
				keys := keyRing(t)
				addr := "127.0.0.1:" + strconv.Itoa(freeFixedPort(t))
				first := startProxyAt(t, addr, srv.url(), keys)

				agentName := "restart-" + flavour
				a := newAgent(t, flavour, first.url(), agentName)
				// mcp-remote appends " (via mcp-remote 0.15.1)" to the
				// clientInfo name.
				initLine := "INITIALIZE " + agentName
				inits := func() int {
					return srv.proc.out.count(func(l string) bool { return l == initLine || strings.HasPrefix(l, initLine+" (via ") })
				}
				work := func(tag string) result {
					return a.call("work", map[string]any{"tag": tag})
				}

				if r := a.connect(); !r.OK {
					t.Fatalf("connect through mcpheal: %v", r)
				}
				if r := work("before"); !r.OK || r.IsError || r.TextHead != "done before" {
					t.Fatalf("call through mcpheal: %v, text %q", r, r.TextHead)
				}
				before := inits()
				if before != 1 {
					t.Fatalf("the server saw %d initialize for %s before the restart, want 1", before, agentName)
				}

				first.kill()
				second := keys
				if !sameRing {
					second = keyRing(t)
				}
				startProxyAt(t, addr, srv.url(), second)

				r := work("after")
				if sameRing {
					if !r.OK || r.IsError || r.TextHead != "done after" {
						t.Fatalf("call after mcpheal restarted with the same key ring: %v, text %q; want it healed", r, r.TextHead)
					}
					if r := work("again"); !r.OK || r.IsError || r.TextHead != "done again" {
						t.Fatalf("second call after the restart: %v, text %q", r, r.TextHead)
					}
					if n := inits() - before; n != 1 {
						t.Errorf("the server saw %d initialize for %s after the restart, want exactly 1 (one heal)", n, agentName)
					}
					if rm, ok := a.(*remote); ok && strings.Contains(rm.p.stderr.String(), "Remote session expired") {
						t.Errorf("mcp-remote started a new session of its own: it got a 404, mcpheal did not heal; stderr (tail):\n%s", rm.p.stderr.String())
					}
					for _, tag := range []string{"before", "after", "again"} {
						if n := runs(countFile, tag); n != 1 {
							t.Errorf("work %q ran %d times, want exactly 1", tag, n)
						}
					}
					return
				}

				t.Logf("%s after a restart with another key ring: %v", flavour, r)
				if n := runs(countFile, "before"); n != 1 {
					t.Errorf("work %q ran %d times, want exactly 1", "before", n)
				}
				if flavour == "mcp-remote" {
					// mcp-remote 0.15.1 does what the spec asks of a client on
					// a 404: it starts a new session (a fresh initialize) and
					// sends the call again. The 404 shows only in its log;
					// the call succeeds on a session that is not the old one.
					log := a.(*remote).p.stderr.String()
					if !strings.Contains(log, "Session not found") || !strings.Contains(log, "Remote session expired, re-initializing") {
						t.Errorf("mcp-remote's log shows no 404 Session not found followed by its own re-initialize; stderr (tail):\n%s", log)
					}
					if !r.OK || r.TextHead != "done after" {
						t.Errorf("mcp-remote after its own re-initialize: %v, text %q; want the call to succeed on its new session", r, r.TextHead)
					}
					if n := inits() - before; n != 1 {
						t.Errorf("the server saw %d initialize for %s after a restart with another key ring, want 1 (mcp-remote's own new session)", n, agentName)
					}
					if n := runs(countFile, "after"); n != 1 {
						t.Errorf("work %q ran %d times, want exactly 1 (the 404 is answered before the upstream)", "after", n)
					}
					return
				}
				// The TS SDK clients do not start over on a 404: the call
				// fails with mcpheal's answer for an unknown session.
				if r.OK {
					t.Fatalf("call after mcpheal restarted with another key ring succeeded (text %q): the session healed without its key", r.TextHead)
				}
				if !strings.Contains(r.Message, `"code":-32001,"message":"Session not found"`) || (flavour == "ts-sdk-v1" && !r.hasCode(404)) {
					t.Errorf("call after a restart with another key ring: %v; want HTTP 404, JSON-RPC -32001 Session not found", r)
				}
				if n := inits() - before; n != 0 {
					t.Errorf("the server saw %d initialize for %s after a restart with another key ring, want 0", n, agentName)
				}
				if n := runs(countFile, "after"); n != 0 {
					t.Errorf("work ran %d times for a call refused as an unknown session, want 0", n)
				}
			})
		}
	}
}
