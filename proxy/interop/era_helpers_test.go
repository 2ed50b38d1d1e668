//go:build unix

package interop

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// eraServerName is the serverInfo name testdata/eraserver.mjs announces.
const eraServerName = "mcpheal-interop-era"

// eraTools are the tools testdata/eraserver.mjs lists, in its order.
var eraTools = []string{"echo", "work", "progress", "confirm", "sample", "slow"}

// sdkFlavours are the clients that run every bridge scenario; mcp-remote,
// driven by raw JSON-RPC lines, runs connect, list and call only.
var sdkFlavours = []string{"ts-sdk-v1", "ts-sdk-v2"}

// eraOpts shapes one testdata/eraserver.mjs (TS SDK v2 server).
type eraOpts struct {
	// countFile, if set, receives one line per execution of the "work" tool.
	countFile string
	// restartable picks a port outside the ephemeral range (see v1Opts).
	restartable bool
	// dual serves both eras (the SDK's legacy 'stateless'), not 2026-07-28
	// only (legacy 'reject').
	dual bool
}

func startEraServer(t testing.TB, o eraOpts) *server {
	t.Helper()
	port := 0
	if o.restartable {
		port = freeFixedPort(t)
	}
	legacy := "reject"
	if o.dual {
		legacy = "stateless"
	}
	name := "eraserver-" + legacy
	return startServer(t, name, port, []string{"COUNT_FILE=" + o.countFile, "LEGACY=" + legacy}, "eraserver.mjs")
}

// setEra makes the server's next life (after restart) serve both eras
// (dual) or 2026-07-28 only: a redeploy that changes the protocol era.
func (s *server) setEra(dual bool) {
	legacy := "LEGACY=reject"
	if dual {
		legacy = "LEGACY=stateless"
	}
	// exec keeps the last value of a duplicated key.
	s.env = append(s.env, legacy)
}

// nudge writes one command line to the server's stdin (eraserver.mjs:
// "notify-resource <uri>", "notify-tools").
func (s *server) nudge(cmd string) {
	s.t.Helper()
	s.proc.send(s.t, []byte(cmd))
}

// serverLines counts the lines of p's stdout that equal line or start with
// line+" ".
func serverLines(p *nodeProc, line string) int {
	return p.out.count(func(l string) bool { return l == line || strings.HasPrefix(l, line+" ") })
}

// checkNoInitialize fails t if any of the server lives procs saw an
// initialize: a 2026-07-28-only server refuses it, so a bridge that lets one
// through has already failed the agent once.
func checkNoInitialize(t *testing.T, procs ...*nodeProc) {
	t.Helper()
	for _, p := range procs {
		if n := serverLines(p, "INITIALIZE"); n != 0 {
			t.Errorf("%s saw %d initialize; the bridge must never send initialize to a 2026-07-28-only server", p.name, n)
		}
	}
}

// eraResult is a client.mjs answer with the fields of the bridge ops.
type eraResult struct {
	result
	ProgressCount *int     `json:"progressCount"`
	Updates       []string `json:"updates"`
	Logs          int      `json:"logs"`
}

// eraClient is testdata/client.mjs with CLIENT_CAPABILITIES=1: it declares
// sampling, elicitation (form) and roots and answers them.
type eraClient struct{ *sdkClient }

func startEraClient(t testing.TB, version, url, name string) *eraClient {
	t.Helper()
	env := []string{"CLIENT_NAME=" + name, fmt.Sprintf("REQUEST_TIMEOUT_MS=%d", sdkTimeout.Milliseconds()), "CLIENT_CAPABILITIES=1"}
	return &eraClient{&sdkClient{t: t, p: startNode(t, "client-"+version+" "+name, env, "client.mjs", version, url)}}
}

// newEraAgent is newAgent with the SDK clients from startEraClient.
func newEraAgent(t testing.TB, flavour, url, name string) agent {
	t.Helper()
	switch flavour {
	case "ts-sdk-v1":
		return startEraClient(t, "v1", url, name)
	case "ts-sdk-v2":
		return startEraClient(t, "v2", url, name)
	}
	return newAgent(t, flavour, url, name)
}

// ask sends one command and reads its answer with the bridge ops' fields.
func (c *eraClient) ask(cmd map[string]any) eraResult {
	c.t.Helper()
	c.send(cmd)
	op, _ := cmd["op"].(string)
	i, line, ok := c.p.out.waitFor(c.next, opTimeout, func(l string) bool { return strings.HasPrefix(l, "RESULT ") })
	if !ok {
		return eraResult{result: result{Op: op, Kind: "timeout", Message: fmt.Sprintf("no answer within %v; client stderr:\n%s", opTimeout, c.p.stderr.String())}}
	}
	c.next = i + 1
	var r eraResult
	if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "RESULT ")), &r); err != nil {
		c.t.Fatalf("client output %q: %v", line, err)
	}
	return r
}

// callText calls a tool and fails t unless it answers text want.
func (c *eraClient) callText(t *testing.T, name string, args map[string]any, want string) {
	t.Helper()
	r := c.ask(map[string]any{"op": "call", "name": name, "arguments": args})
	if !r.OK || r.IsError || r.TextHead != want {
		t.Errorf("tools/call %s: %v, isError %v, text %q; want %q", name, r, r.IsError, r.TextHead, want)
	}
}

// updatesOf says how many notifications/resources/updated for uri the
// client has received.
func (c *eraClient) updatesOf(t *testing.T, uri string) int {
	t.Helper()
	r := c.ask(map[string]any{"op": "updates"})
	if !r.OK {
		t.Fatalf("updates: %v", r)
	}
	n := 0
	for _, u := range r.Updates {
		if u == uri {
			n++
		}
	}
	return n
}

// nudgeUntilUpdate makes srv publish an update of uri every 300 ms until the
// client has received more than have of them, or d passes. The agent's GET
// stream delivers it, and the bridge may still be opening the upstream
// subscriptions/listen when the first nudge goes out. It returns the count.
func nudgeUntilUpdate(t *testing.T, srv *server, c *eraClient, uri string, have int, d time.Duration) int {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		srv.nudge("notify-resource " + uri)
		time.Sleep(300 * time.Millisecond)
		if n := c.updatesOf(t, uri); n > have || time.Now().After(deadline) {
			return n
		}
	}
}

// sameNames says whether got lists exactly the names in want, in any order.
func sameNames(got, want []string) bool {
	a, b := slices.Clone(got), slices.Clone(want)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}
