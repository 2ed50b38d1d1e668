//go:build unix

package interop

// The fault matrix: real clients (Hermes' own MCP client, the Python SDK
// 2.3 in both protocol modes, the FastMCP client, the TypeScript SDK v1
// and v2, mcp-remote) against real servers (FastMCP 4.1.6 and MCPServer
// 2.3, the TypeScript SDK v1 server, the Go SDK server in process), each
// fault a row, run directly and through mcpheal side by side with the
// executions counted server-side. What the model would read is counted as
// an error: Hermes' {"error": …} string, an SDK's exception; a call its
// session can no longer make counts too. Per cell it asserts that through
// mcpheal is never worse than directly, that no call through mcpheal waits
// for its client's timeout, that no write runs twice, and that a write
// whose outcome mcpheal cannot know is answered -32011 at once.
//
// `go test` runs every fault for Hermes and the Python SDK's session
// client against one server each; with MCPHEAL_PY_TABLE=FILE (or
// MCPHEAL_PY_FULL=1) the whole matrix runs, and the table is written to
// FILE (bench/pyfaults.sh writes bench/pyfaults.md).

import (
	"cmp"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mcpheal/mcpheal/proxy"
)

const (
	// pyTableEnv names the file TestPyFaults writes the matrix's table to;
	// set, the whole matrix runs.
	pyTableEnv = "MCPHEAL_PY_TABLE"
	// pyFullEnv runs the whole matrix without writing the table.
	pyFullEnv = "MCPHEAL_PY_FULL"
	// matrixHealTimeout is mcpheal's default heal_timeout, which every
	// proxy of the matrix keeps.
	matrixHealTimeout = 25 * time.Second
	// atOnce bounds how long an answer mcpheal writes itself (-32011) may
	// take to reach the model: no wait on anything but the client's own
	// work.
	atOnce = 5 * time.Second
)

// pyFull says whether the whole matrix runs.
func pyFull() bool { return os.Getenv(pyTableEnv) != "" || os.Getenv(pyFullEnv) != "" }

// The two ways a seat reaches its server.
const (
	direct = iota
	proxied
)

var sideName = [2]string{"directly", "through mcpheal"}

// clientTimeout is a client's own request timeout, which no call through
// mcpheal may come near: Hermes' timeout: 30 and the Python clients' 30 s,
// the TS SDK clients' REQUEST_TIMEOUT_MS, mcp-remote's wait (it sets none
// of its own under the harness's).
func clientTimeout(flavour string) time.Duration {
	switch flavour {
	case "ts-sdk-v1", "ts-sdk-v2":
		return sdkTimeout
	case "mcp-remote":
		return opTimeout
	}
	return pyCallTimeout
}

// margin is what every call through mcpheal must stay under: 5 s short of
// its client's timeout.
func margin(flavour string) time.Duration { return clientTimeout(flavour) - 5*time.Second }

// startGate bounds how many clients and servers start at once: a 2-core
// machine starting every Python process of the matrix together would take
// longer to start each than the harness waits.
var startGate = make(chan struct{}, 3)

func gated(f func()) {
	startGate <- struct{}{}
	defer func() { <-startGate }()
	f()
}

// target is one server of a scene: where it is reached, how it restarts,
// its write tool and how often a write ran.
type target struct {
	name      string
	url       string
	srv       *server // the process, when it is one
	countFile string  // where it records its writes, when it does
	write     func(tag string) (tool string, args map[string]any, want string)
	runs      func(tag string) int
	restart   func()
}

// serverKind starts one kind of server as a target.
type serverKind struct {
	name  string
	start func(t *testing.T) target
}

// pyKind is a Python server of server.py, restartable on its port, its
// writes counted in a file.
func pyKind(name string, o pyServerOpts) serverKind {
	return serverKind{name, func(t *testing.T) target {
		o := o // each start its own count file
		o.countFile = filepath.Join(t.TempDir(), "writes")
		o.restartable = true
		var srv *server
		gated(func() { srv = startPyServer(t, o) })
		return pyTargetOf(name, srv, o.countFile)
	}}
}

func pyTargetOf(name string, srv *server, countFile string) target {
	return target{
		name: name, url: srv.url(), srv: srv, countFile: countFile,
		write: func(tag string) (string, map[string]any, string) {
			return "write", map[string]any{"tag": tag}, "wrote " + tag
		},
		runs:    func(tag string) int { return runs(countFile, tag) },
		restart: srv.restart, // not gated: the fault comes when it is due
	}
}

// v1Kind is the TypeScript SDK v1 server of v1server.mjs: an unknown
// session gets 400 "No valid session ID provided"; its write is work.
var v1Kind = serverKind{"ts-sdk-v1-server", func(t *testing.T) target {
	countFile := filepath.Join(t.TempDir(), "writes")
	var srv *server
	gated(func() { srv = startV1Server(t, v1Opts{countFile: countFile, restartable: true}) })
	return target{
		name: "ts-sdk-v1-server", url: srv.url(), srv: srv, countFile: countFile,
		write: func(tag string) (string, map[string]any, string) {
			return "work", map[string]any{"tag": tag}, "done " + tag
		},
		runs:    func(tag string) int { return runs(countFile, tag) },
		restart: srv.restart,
	}
}}

func goTargetOf(name, url string, g *goFaultServer) target {
	return target{
		name: name, url: url,
		write: func(tag string) (string, map[string]any, string) {
			return "write", map[string]any{"tag": tag}, "wrote " + tag
		},
		runs: g.runs,
	}
}

var (
	mcpserverPy       = pyKind("mcpserver-py", pyServerOpts{impl: pyMCPServer})
	mcpserverPyJSON   = pyKind("mcpserver-py-json", pyServerOpts{impl: pyMCPServer, json: true})
	mcpserverPyEvents = pyKind("mcpserver-py-events", pyServerOpts{impl: pyMCPServer, eventStore: true})
	fastmcpPy         = pyKind("fastmcp-py", pyServerOpts{impl: pyFastMCP})
	fastmcpPyEvents   = pyKind("fastmcp-py-events", pyServerOpts{impl: pyFastMCP, eventStore: true})
	fastmcpPyJSON     = pyKind("fastmcp-py-json-events", pyServerOpts{impl: pyFastMCP, json: true, eventStore: true})
)

// allClients are the clients of the whole matrix; ciClients those every
// fault runs on every `go test`: Hermes and one SDK client.
var (
	allClients = []string{"hermes", "py-sdk", "py-client-legacy", "py-client-auto", "fastmcp-py", "ts-sdk-v1", "ts-sdk-v2", "mcp-remote"}
	pyClients  = []string{"hermes", "py-sdk", "py-client-legacy", "py-client-auto", "fastmcp-py"}
	ciClients  = []string{"hermes", "py-sdk"}
)

// measure is what one seat saw.
type measure struct {
	mu        sync.Mutex // protects the rest
	calls     int
	errors    int
	ambiguous int           // -32011: may or may not have run
	slowest   time.Duration // of every call
	slowAmbig time.Duration // of the -32011 answers
	timedOut  int           // calls that took the client's timeout or got no answer
	writes    []string      // tags of the writes asked
	firstErr  string
	inFlight  int // errors of calls in flight when the server was killed
}

// add counts one call that took took; ok says whether the model got what
// it asked for, inFlight whether the server was killed while the call was
// in flight (whether it ran then is not known on either side).
func (m *measure) add(r result, took time.Duration, ok, inFlight bool, timeout time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.calls++
	m.slowest = max(m.slowest, took)
	if r.Kind == "timeout" || took >= timeout {
		m.timedOut++
	}
	if ok {
		return
	}
	m.errors++
	if inFlight {
		m.inFlight++
	}
	if r.hasCode(codeMayHaveRun) || strings.Contains(r.Message, "may or may not have run") {
		m.ambiguous++
		m.slowAmbig = max(m.slowAmbig, took)
	}
	if m.firstErr == "" {
		msg := r.Message
		if r.OK {
			msg = fmt.Sprintf("isError %v, text %q", r.IsError, r.TextHead)
		}
		m.firstErr = fmt.Sprintf("%s: %.300s", r.Kind, msg)
	}
}

// seat is one client process on one side of a scene.
type seat struct {
	sc     *scene
	client string
	side   int
	idx    int    // among the seats of its client and side
	name   string // unique in the scene; the clientInfo name (Hermes sends "mcp") and the tags' prefix
	a      agent
	dead   string // why it never connected: its calls are never made
	m      measure
}

// tag is the seat's write tag n.
func (s *seat) tag(n string) string { return s.name + "-" + n }

// call makes one tools/call as the model would; ok judges a result the
// model would read as the tool's own.
func (s *seat) call(name string, args map[string]any, ok func(result) bool) result {
	return s.finish(s.callAsync(name, args), ok)
}

// callAsync sends a tools/call; finish waits for and counts its answer.
func (s *seat) callAsync(name string, args map[string]any) func() (result, time.Time, time.Duration) {
	if s.dead != "" {
		return func() (result, time.Time, time.Duration) {
			return result{Op: "call", Kind: "never made", Message: "the session never opened: " + s.dead}, time.Now(), 0
		}
	}
	// The answer is awaited at once, so that its time is when it came,
	// however late the caller collects it.
	type answer struct {
		r    result
		took time.Duration
	}
	got := make(chan answer, 1)
	start := time.Now()
	wait := s.a.callAsync(name, args)
	go func() { r := wait(); got <- answer{r, time.Since(start)} }()
	return func() (result, time.Time, time.Duration) { a := <-got; return a.r, start, a.took }
}

// callProgress is call asking for progress notifications where the client
// can (the SDK clients); Hermes and mcp-remote call without.
func (s *seat) callProgress(name string, args map[string]any, ok func(result) bool) result {
	c, isSDK := s.a.(*sdkClient)
	if s.dead != "" || !isSDK || s.client == "hermes" {
		return s.call(name, args, ok)
	}
	start := time.Now()
	r := c.do(map[string]any{"op": "call", "name": name, "arguments": args, "progress": true})
	took := time.Since(start)
	return s.finish(func() (result, time.Time, time.Duration) { return r, start, took }, ok)
}

func (s *seat) finish(wait func() (result, time.Time, time.Duration), ok func(result) bool) result {
	r, start, took := wait()
	good := r.OK && ok(r)
	inFlight := s.sc.killedDuring(start, start.Add(took))
	if !good && !inFlight && s.side == proxied && s.sc.killed() && (r.hasCode(codeMayHaveRun) || strings.Contains(r.Message, "may or may not have run")) {
		s.sc.t.Logf("%s (%s): a write that no kill overlapped was answered -32011: sent %s, answered after %v: %v",
			s.name, sideName[s.side], s.sc.since(start), took.Round(time.Millisecond), r)
	}
	s.m.add(r, took, good, inFlight, clientTimeout(s.client))
	return r
}

// write calls the target's write tool with tag.
func (s *seat) write(tag string) result {
	tool, args, want := s.sc.tg.write(tag)
	s.asked(tag)
	return s.call(tool, args, func(r result) bool { return !r.IsError && r.TextHead == want })
}

// writeAsync sends the write tool with args (tag among them) and returns
// the wait for its answer, counted.
func (s *seat) writeAsync(tag, tool string, args map[string]any, want string) func() result {
	s.asked(tag)
	wait := s.callAsync(tool, args)
	return func() result {
		return s.finish(wait, func(r result) bool { return !r.IsError && r.TextHead == want })
	}
}

func (s *seat) asked(tag string) {
	s.m.mu.Lock()
	s.m.writes = append(s.m.writes, tag)
	s.m.mu.Unlock()
}

// scene is one fault against one server: its seats, both sides of each
// client.
type scene struct {
	t     *testing.T
	fault string
	tg    target

	mu    sync.Mutex // protects seats, kills
	seats []*seat
	kills [][2]time.Time // from the SIGKILL to the process gone, each time the server was killed
}

// restart kills the server (SIGKILL) and starts it on its port again,
// noting when, so that the calls it cut are known.
func (sc *scene) restart() {
	sc.mu.Lock()
	i := len(sc.kills)
	// Until the process is gone, the kill has no end: a call answered
	// meanwhile overlaps it.
	sc.kills = append(sc.kills, [2]time.Time{time.Now(), time.Now().Add(time.Hour)})
	sc.mu.Unlock()
	sc.tg.srv.proc.kill()
	sc.mu.Lock()
	sc.kills[i][1] = time.Now()
	sc.mu.Unlock()
	sc.tg.srv.start(sc.tg.srv.port)
}

// killed says whether the server was killed yet.
func (sc *scene) killed() bool {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return len(sc.kills) > 0
}

// since describes t against the kills: how long after the last kill's
// end, or before the next's start.
func (sc *scene) since(t time.Time) string {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	out := ""
	for i, k := range sc.kills {
		out += fmt.Sprintf("[kill %d: %+v from its start, %+v from its end] ", i+1, t.Sub(k[0]).Round(time.Millisecond), t.Sub(k[1]).Round(time.Millisecond))
	}
	return out
}

// killedDuring says whether a kill of the server overlaps from..to: a call
// sent while the process was dying may have been read by it.
func (sc *scene) killedDuring(from, to time.Time) bool {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	for _, k := range sc.kills {
		if k[0].Before(to) && k[1].After(from) {
			return true
		}
	}
	return false
}

// openSeat starts s, reaching url, connects it and lists the tools
// (mcpheal learns their annotations so), then makes one read-only call
// that is not counted: the connections a client opens for its first call
// are not the fault's to time. A seat that cannot connect is dead: its
// calls are never made, and count as errors.
func (sc *scene) openSeat(s *seat, url string) {
	gated(func() {
		s.a = newAgent(sc.t, s.client, url, s.name)
		if r := s.a.connect(); !r.OK {
			s.dead = "connect: " + r.String()
			return
		}
		if r := s.a.list(); !r.OK {
			s.dead = "tools/list: " + r.String()
			return
		}
		s.a.call("echo", map[string]any{"text": "warm-up"})
	})
	if s.dead != "" {
		sc.t.Logf("%s (%s, %s): %s", s.name, s.client, sideName[s.side], s.dead)
	}
}

func newScene(t *testing.T, fault string, tg target) *scene {
	return &scene{t: t, fault: fault, tg: tg}
}

// join adds n seats of client on side; open starts them.
func (sc *scene) join(client string, side, n int) []*seat {
	var out []*seat
	for i := range n {
		s := &seat{sc: sc, client: client, side: side, idx: i, name: fmt.Sprintf("%s-%s-%d", [2]string{"d", "p"}[side], client, i)}
		out = append(out, s)
	}
	sc.mu.Lock()
	sc.seats = append(sc.seats, out...)
	sc.mu.Unlock()
	return out
}

// open starts every seat not yet started (openSeat), reaching urls(seat),
// a few at a time.
func (sc *scene) open(urls func(*seat) string) {
	sc.each(func(s *seat) {
		if s.a == nil {
			sc.openSeat(s, urls(s))
		}
	})
}

// joinBoth adds n seats per side for each client and opens them: directly
// at the target's URL, through mcpheal at proxyURL.
func (sc *scene) joinBoth(clients []string, n int, directURL, proxyURL string) {
	for _, c := range clients {
		sc.join(c, direct, n)
		sc.join(c, proxied, n)
	}
	sc.open(func(s *seat) string { return [2]string{directURL, proxyURL}[s.side] })
}

// each runs f for every seat at once and waits for all.
func (sc *scene) each(f func(*seat)) {
	sc.mu.Lock()
	seats := slices.Clone(sc.seats)
	sc.mu.Unlock()
	var wg sync.WaitGroup
	for _, s := range seats {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f(s)
		}()
	}
	wg.Wait()
}

// sideTally is one side of a cell.
type sideTally struct {
	calls, errors, ambiguous, timedOut int
	inFlight                           int // errors of calls the server was killed under
	slowest, slowAmbig                 time.Duration
	asked, ran, twice                  int
	firstErr                           string
}

// cell is one row of the table: a fault, a client, a server, both sides.
type cell struct {
	fault, server, client string
	side                  [2]sideTally
	// zeroErrors asks that nothing through mcpheal fails (the outage: calls
	// that were never sent cost latency, not errors).
	zeroErrors bool
}

// cells sums the scene's seats per client and side, with the executions
// the server counted for their writes.
func (sc *scene) cells(server string) []cell {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	byClient := map[string]*cell{}
	var order []string
	for _, s := range sc.seats {
		c := byClient[s.client]
		if c == nil {
			c = &cell{fault: sc.fault, server: server, client: s.client}
			byClient[s.client] = c
			order = append(order, s.client)
		}
		s.m.mu.Lock()
		tl := &c.side[s.side]
		tl.calls += s.m.calls
		tl.errors += s.m.errors
		tl.ambiguous += s.m.ambiguous
		tl.timedOut += s.m.timedOut
		tl.inFlight += s.m.inFlight
		tl.slowest = max(tl.slowest, s.m.slowest)
		tl.slowAmbig = max(tl.slowAmbig, s.m.slowAmbig)
		if tl.firstErr == "" && s.m.firstErr != "" {
			tl.firstErr = s.name + ": " + s.m.firstErr
		}
		for _, tag := range s.m.writes {
			tl.asked++
			switch n := sc.tg.runs(tag); {
			case n > 1:
				tl.ran++
				tl.twice++
				sc.t.Logf("%s: write %s ran %d times", sideName[s.side], tag, n)
			case n == 1:
				tl.ran++
			}
		}
		s.m.mu.Unlock()
	}
	out := make([]cell, 0, len(order))
	for _, c := range order {
		out = append(out, *byClient[c])
	}
	return out
}

// checkCell asserts what every cell must show:
//   - through mcpheal never worse than directly: no more errors than
//     directly, where a write the client ran twice directly counts as an
//     error too (an answer that hides a second run is worse than an error).
//     A call the server was killed under fails on either side (nobody
//     knows whether it ran): those are left out of both counts, since how
//     many calls a kill meets depends on how busy each side was at that
//     instant (a client that hangs 30 s on the first kill has none in
//     flight at the second); mcpheal must answer them at once, below;
//   - no call through mcpheal near its client's timeout;
//   - no write through mcpheal ran twice;
//   - an answer that a write may or may not have run (-32011) comes at
//     once.
func checkCell(t *testing.T, c cell) {
	t.Helper()
	d, p := c.side[direct], c.side[proxied]
	t.Logf("%s | %s | %s: directly %s; through mcpheal %s", c.fault, c.client, c.server, d, p)
	if d.calls == 0 || p.calls == 0 {
		t.Errorf("no calls measured (directly %d, through mcpheal %d): the scene did not run", d.calls, p.calls)
	}
	if excess := (p.errors - p.inFlight) - (d.errors - d.inFlight + d.twice); excess > 0 {
		t.Errorf("through mcpheal worse than directly: %d errors of %d calls, %d of them in flight at a kill (first: %s); directly %d errors (%d in flight at a kill) and %d writes run twice of %d calls",
			p.errors, p.calls, p.inFlight, p.firstErr, d.errors, d.inFlight, d.twice, d.calls)
	}
	if c.zeroErrors && p.errors > 0 {
		t.Errorf("through mcpheal %d of %d calls failed (first: %s); want none: the outage must cost latency, not errors", p.errors, p.calls, p.firstErr)
	}
	if lim := margin(c.client); p.slowest >= lim || p.timedOut > 0 {
		t.Errorf("a call through mcpheal took %v (%d at the client's timeout of %v or without an answer); want every call under %v",
			p.slowest.Round(time.Millisecond), p.timedOut, clientTimeout(c.client), lim)
	}
	if p.twice > 0 {
		t.Errorf("through mcpheal %d writes ran twice", p.twice)
	}
	if p.ambiguous > 0 && p.slowAmbig >= atOnce {
		t.Errorf("through mcpheal a write that may or may not have run was answered after %v; want at once (under %v)", p.slowAmbig.Round(time.Millisecond), atOnce)
	}
}

func (tl sideTally) String() string {
	s := fmt.Sprintf("%d/%d errors, slowest %v, %d/%d writes ran, %d twice", tl.errors, tl.calls, tl.slowest.Round(time.Millisecond), tl.ran, tl.asked, tl.twice)
	if tl.ambiguous > 0 {
		s += fmt.Sprintf(", %d answered -32011 (slowest %v)", tl.ambiguous, tl.slowAmbig.Round(time.Millisecond))
	}
	if tl.timedOut > 0 {
		s += fmt.Sprintf(", %d at the client's timeout", tl.timedOut)
	}
	if tl.firstErr != "" {
		s += "; first error " + tl.firstErr
	}
	return s
}

// matrixProxy serves mcpheal in front of upstream with its default
// heal_timeout (25 s); set, if not nil, adjusts the rest of its config.
func matrixProxy(t testing.TB, upstream string, set func(*proxy.Config)) (*proxy.Server, string) {
	t.Helper()
	c := proxy.Config{Upstream: upstream, HealTimeout: matrixHealTimeout}
	if set != nil {
		set(&c)
	}
	return startProxyConfig(t, c, &tail{max: 64 << 10})
}

// faultCase is one row group of the matrix: a fault, the servers and
// clients it runs against (CI: the first server, Hermes and the Python
// SDK's session client; the whole matrix: all of them), and the scene.
type faultCase struct {
	name    string
	servers []serverKind
	clients []string // the whole matrix's
	ci      []string // every go test's; nil: ciClients
	run     func(t *testing.T, fault string, sk serverKind, clients []string) []cell
}

// pyFaultCases are the rows of TestPyFaults (the outage is TestPyOutage's).
func pyFaultCases() []faultCase {
	return []faultCase{
		{name: "server restarted between calls", servers: []serverKind{mcpserverPy, fastmcpPy, mcpserverPyJSON, fastmcpPyJSON}, clients: allClients, run: runRestartBetween},
		{name: "idle expiry (session_idle_timeout 2 s; no GET stream)", servers: []serverKind{
			pyKind("mcpserver-py", pyServerOpts{impl: pyMCPServer, idleTimeout: 2 * time.Second}),
			pyKind("fastmcp-py", pyServerOpts{impl: pyFastMCP, idleTimeout: 2 * time.Second}),
		}, clients: allClients, run: runIdleExpiry},
		{name: "server restarted with a write in flight", servers: []serverKind{mcpserverPy, fastmcpPy, mcpserverPyJSON}, clients: allClients, run: runRestartInFlight},
		{name: "write delivered, connection dropped", servers: []serverKind{{name: "go-sdk + relay"}}, clients: allClients, run: runCutAfterRequest},
		{name: "200 + -32602 Invalid or expired session", servers: []serverKind{{name: "go-sdk, WordPress.com's answer"}}, clients: allClients, run: runWordPress},
		{name: "TS SDK server restarted (400 No valid session ID)", servers: []serverKind{v1Kind}, clients: allClients, run: runRestartBetween},
		{name: "middlebox drops idle flows after 2 s", servers: []serverKind{mcpserverPy, fastmcpPy}, clients: allClients, run: runMiddlebox},
		{name: "capped server (max_sessions 2) restarted", servers: []serverKind{
			pyKind("mcpserver-py max_sessions 2", pyServerOpts{impl: pyMCPServer, maxSessions: 2}),
			pyKind("fastmcp-py max_sessions 2", pyServerOpts{impl: pyFastMCP, maxSessions: 2}),
		}, clients: pyClients, run: runCappedRestart},
		{name: "4 agents × 20 writes, 2 restarts (SIGKILL)", servers: []serverKind{mcpserverPy, fastmcpPy}, clients: []string{"hermes", "py-sdk", "py-client-legacy", "py-client-auto", "fastmcp-py", "ts-sdk-v1"}, run: runBurst},
		{name: "long call, upstream stream cut", servers: []serverKind{mcpserverPyEvents, mcpserverPy, fastmcpPyEvents}, clients: allClients, run: runLongCut},
		{name: "elicitation and tools/list_changed across a heal", servers: []serverKind{mcpserverPy, fastmcpPy}, clients: pyClients, run: runElicitAcrossHeal},
	}
}

// outageCells are TestPyOutage's rows, for TestPyFaults' table (Go runs
// TestPyOutage first: it comes first in this file).
var outageCells struct {
	sync.Mutex
	cells []cell
}

// outageFault is TestPyOutage's row.
const outageFault = "server gone 20 s (redeploy), a write every 2 s"

// TestPyOutage (docs/healing.md "Keeping upstream healthy"): the server is
// gone for 20 s, a redeploy: it is killed (SIGKILL) and its address
// refuses connections for 20 s (a relay in front of it closes its
// listener), then it is back, restarted, every session gone. Two agents
// per client and side write every 2 s: one from the outage's first
// moment, one from 8 s into it, when mcpheal's circuit breaker is open
// (5 failures over 5 s). Through mcpheal, with its default heal_timeout
// (25 s from the outage's first failure), every write, never sent while
// the server was gone, waits and then runs once on a healed session: the
// outage costs latency, not errors, and no call comes near the client's
// timeout (Hermes' timeout: 30). Directly, what each client makes of it.
// With MCPHEAL_PY_TABLE (or MCPHEAL_PY_FULL) also FastMCP and every Python
// client.
func TestPyOutage(t *testing.T) {
	servers, clients := []serverKind{mcpserverPy}, ciClients
	if pyFull() {
		servers, clients = []serverKind{mcpserverPy, fastmcpPy}, pyClients
	}
	var wg sync.WaitGroup
	for _, sk := range servers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t.Run(sk.name, func(t *testing.T) {
				got := runOutage(t, sk, clients)
				for _, c := range got {
					t.Run(c.client, func(t *testing.T) { checkCell(t, c) })
				}
				outageCells.Lock()
				outageCells.cells = append(outageCells.cells, got...)
				outageCells.Unlock()
			})
		}()
	}
	wg.Wait()
}

// runOutage is TestPyOutage against one server.
func runOutage(t *testing.T, sk serverKind, clients []string) []cell {
	const (
		gone  = 20 * time.Second
		late  = 8 * time.Second  // when the second agent starts writing
		until = 26 * time.Second // when the agents stop writing
		every = 2 * time.Second
	)
	tg := sk.start(t)
	relay := startFaultRelay(t, tg.url, nil)
	logs := &watchLog{tail: tail{max: 64 << 10}, want: `"message":"circuit breaker open"`}
	_, purl := startProxyConfig(t, proxy.Config{Upstream: relay.url(), HealTimeout: matrixHealTimeout}, logs)
	sc := newScene(t, outageFault, tg)
	sc.joinBoth(clients, 2, relay.url(), purl)
	sc.each(func(s *seat) { s.write(s.tag("before")) })

	start := time.Now()
	relay.down()
	tg.srv.proc.kill()
	restarted := make(chan struct{})
	go func() { // the new server starts behind the closed address
		defer close(restarted)
		gated(func() { tg.srv.start(tg.srv.port) })
	}()
	back := time.AfterFunc(gone, func() { <-restarted; relay.up() })
	defer back.Stop()

	sc.each(func(s *seat) {
		next := start.Add(time.Duration(s.idx) * late)
		for i := 0; next.Before(start.Add(until)); i++ {
			time.Sleep(time.Until(next)) // the agent's pace: a write every 2 s
			s.write(s.tag("w" + strconv.Itoa(i)))
			next = next.Add(every)
			if now := time.Now(); next.Before(now) {
				next = now // a write that waited is followed at once
			}
		}
	})
	if !logs.seen.Load() {
		t.Errorf("mcpheal's circuit breaker never opened in the outage: the writes from 8 s into it did not meet an open breaker")
	}
	cells := sc.cells(tg.name)
	for i := range cells {
		cells[i].zeroErrors = true
	}
	return cells
}

// watchLog is a log tail that notes whether a line holding want was
// written (zerolog writes a line at a time).
type watchLog struct {
	tail
	want string
	seen atomic.Bool
}

func (w *watchLog) Write(p []byte) (int, error) {
	if strings.Contains(string(p), w.want) {
		w.seen.Store(true)
	}
	return w.tail.Write(p)
}

// TestPyFaults runs the matrix (the outage is TestPyOutage): every fault
// against its servers at once, each scene with both sides of each client,
// and checks every cell (checkCell). With MCPHEAL_PY_TABLE set it writes
// the table, TestPyOutage's rows included when it ran first.
func TestPyFaults(t *testing.T) {
	full := pyFull()
	var mu sync.Mutex
	var cells []cell
	var wg sync.WaitGroup
	scenes := make(chan struct{}, cmp.Or(sceneLimit(full), 1000))
	for _, fc := range pyFaultCases() {
		servers, clients := fc.servers[:1], fc.ci
		if clients == nil {
			clients = ciClients
		}
		if full {
			servers, clients = fc.servers, fc.clients
		}
		for _, sk := range servers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				scenes <- struct{}{}
				defer func() { <-scenes }()
				t.Run(fc.name+"/"+sk.name, func(t *testing.T) {
					got := fc.run(t, fc.name, sk, clients)
					for _, c := range got {
						t.Run(c.client, func(t *testing.T) { checkCell(t, c) })
					}
					mu.Lock()
					cells = append(cells, got...)
					mu.Unlock()
				})
			}()
		}
	}
	wg.Wait()
	outageCells.Lock()
	cells = append(cells, outageCells.cells...)
	outageCells.Unlock()
	table := renderPyTable(cells)
	t.Logf("\n%s", table)
	if p := os.Getenv(pyTableEnv); p != "" {
		if err := os.WriteFile(p, []byte(table), 0o644); err != nil {
			t.Error(err)
		}
	}
}

// sceneLimit is how many scenes run at once: all of CI's; a few of the
// whole matrix's, whose processes would not fit a 2-core machine at once.
func sceneLimit(full bool) int {
	if full {
		return 4
	}
	return 0
}

// renderPyTable is the matrix as Markdown, in the order of the faults,
// then the servers and clients as they were listed.
func renderPyTable(cells []cell) string {
	rank := map[string]int{}
	for i, fc := range pyFaultCases() {
		rank[fc.name] = i
	}
	rank[outageFault] = len(rank)
	clientRank := map[string]int{}
	for i, c := range allClients {
		clientRank[c] = i
	}
	slices.SortStableFunc(cells, func(a, b cell) int {
		return cmp.Or(cmp.Compare(rank[a.fault], rank[b.fault]), strings.Compare(a.server, b.server), cmp.Compare(clientRank[a.client], clientRank[b.client]))
	})
	var b strings.Builder
	b.WriteString("| fault | client | server | directly: errors / slowest / executions | through mcpheal: errors / slowest / executions |\n|---|---|---|---|---|\n")
	for _, c := range cells {
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", c.fault, c.client, c.server, c.side[direct].cell(), c.side[proxied].cell())
	}
	return b.String()
}

// cell is one side's table cell: errors of calls (how many -32011), the
// slowest call, writes that ran of those asked and those that ran twice.
func (tl sideTally) cell() string {
	errs := fmt.Sprintf("%d/%d", tl.errors, tl.calls)
	var notes []string
	if tl.inFlight > 0 {
		notes = append(notes, fmt.Sprintf("%d in flight at a kill", tl.inFlight))
	}
	if tl.ambiguous > 0 {
		notes = append(notes, fmt.Sprintf("%d -32011", tl.ambiguous))
	}
	if tl.timedOut > 0 {
		notes = append(notes, fmt.Sprintf("%d at the timeout", tl.timedOut))
	}
	if len(notes) > 0 {
		errs += " (" + strings.Join(notes, ", ") + ")"
	}
	exec := fmt.Sprintf("%d/%d ran", tl.ran, tl.asked)
	if tl.twice > 0 {
		exec += fmt.Sprintf(", **%d twice**", tl.twice)
	}
	return fmt.Sprintf("%s / %.1f s / %s", errs, tl.slowest.Seconds(), exec)
}

// runRestartBetween: one write; the server restarts (SIGKILL, the same
// port: every session gone); two more writes.
func runRestartBetween(t *testing.T, fault string, sk serverKind, clients []string) []cell {
	tg := sk.start(t)
	_, purl := matrixProxy(t, tg.url, nil)
	sc := newScene(t, fault, tg)
	sc.joinBoth(clients, 1, tg.url, purl)
	sc.each(func(s *seat) { s.write(s.tag("1")) })
	sc.restart()
	sc.each(func(s *seat) { s.write(s.tag("2")); s.write(s.tag("3")) })
	return sc.cells(tg.name)
}

// runIdleExpiry: each seat, once open, writes, idles past the server's
// session_idle_timeout (2 s: the fault lasts 3 s) and writes twice more.
// The SDK's idle timeout counts an open GET stream as activity, and every
// client here opens one: the server is reached through a relay that
// refuses GET (405), as a gateway that serves no long-lived stream does,
// so that the sessions do idle.
func runIdleExpiry(t *testing.T, fault string, sk serverKind, clients []string) []cell {
	tg := sk.start(t)
	relay := startFaultRelay(t, tg.url, func(r *faultRelay) { r.refuseGet = true })
	_, purl := matrixProxy(t, relay.url(), nil)
	sc := newScene(t, fault, tg)
	for _, c := range clients {
		sc.join(c, direct, 1)
		sc.join(c, proxied, 1)
	}
	sc.each(func(s *seat) {
		sc.openSeat(s, [2]string{relay.url(), purl}[s.side])
		s.write(s.tag("1"))
		time.Sleep(3 * time.Second) // the fault: idle past session_idle_timeout
		s.write(s.tag("2"))
		s.write(s.tag("3"))
	})
	return sc.cells(tg.name + " (idle timeout 2 s)")
}

// runRestartInFlight: a write that takes 4 s to answer after it ran; once
// every seat's write ran, the server restarts (SIGKILL) under them; then
// one more write.
func runRestartInFlight(t *testing.T, fault string, sk serverKind, clients []string) []cell {
	tg := sk.start(t)
	_, purl := matrixProxy(t, tg.url, nil)
	sc := newScene(t, fault, tg)
	sc.joinBoth(clients, 1, tg.url, purl)
	waits := map[*seat]func() result{}
	var mu sync.Mutex
	sc.each(func(s *seat) {
		tag := s.tag("inflight")
		w := s.writeAsync(tag, "slow_write", map[string]any{"tag": tag, "after_ms": 4000}, "wrote "+tag)
		mu.Lock()
		waits[s] = w
		mu.Unlock()
	})
	sc.each(func(s *seat) {
		if s.dead != "" {
			return
		}
		want := "WROTE " + s.tag("inflight")
		if _, _, ok := tg.srv.proc.out.waitFor(0, 20*time.Second, func(l string) bool { return l == want }); !ok {
			t.Logf("%s: its write did not run within 20 s", s.name)
		}
	})
	sc.restart()
	sc.each(func(s *seat) { waits[s]() })
	sc.each(func(s *seat) { s.write(s.tag("after")) })
	return sc.cells(tg.name)
}

// runCutAfterRequest: the Go SDK server behind a relay that, for a write
// tagged CUT-…, lets the request reach the server, lets the tool run, and
// resets both connections before any of its answer leaves (a write
// delivered, the connection dropped: what a real server cannot do on
// cue). A write before, the cut one, a write after.
func runCutAfterRequest(t *testing.T, fault string, sk serverKind, clients []string) []cell {
	g := startGoFaultServer(t, nil)
	relay := startFaultRelay(t, g.url, func(r *faultRelay) { r.cutRequest, r.hold = goHeld, g.hold })
	tg := goTargetOf(sk.name, relay.url(), g)
	_, purl := matrixProxy(t, relay.url(), nil)
	sc := newScene(t, fault, tg)
	sc.joinBoth(clients, 1, relay.url(), purl)
	sc.each(func(s *seat) {
		s.write(s.tag("1"))
		s.write("CUT-" + s.name)
		s.write(s.tag("3"))
	})
	t.Logf("the relay cut %d connections", relay.cuts.Load())
	return sc.cells(tg.name)
}

// runWordPress: the Go SDK server behind WordPress.com's answer to a
// session it no longer knows (HTTP 200, -32602 "Invalid params: Invalid or
// expired session"); one write, every session forgotten, two writes.
func runWordPress(t *testing.T, fault string, sk serverKind, clients []string) []cell {
	var wp *wordPressDialect
	g := startGoFaultServer(t, func(h http.Handler) http.Handler { wp = newWordPressDialect(h); return wp })
	tg := goTargetOf(sk.name, g.url, g)
	_, purl := matrixProxy(t, g.url, nil)
	sc := newScene(t, fault, tg)
	sc.joinBoth(clients, 1, g.url, purl)
	sc.each(func(s *seat) { s.write(s.tag("1")) })
	wp.forgetAll()
	sc.each(func(s *seat) { s.write(s.tag("2")); s.write(s.tag("3")) })
	return sc.cells(tg.name)
}

// runMiddlebox: the server behind a relay that drops a flow idle for 2 s
// without a word to either end (the next bytes on it get a reset). Each
// seat, once open: a write, 3 s idle, a write, 3 s idle, a read-only echo.
func runMiddlebox(t *testing.T, fault string, sk serverKind, clients []string) []cell {
	tg := sk.start(t)
	relay := startFaultRelay(t, tg.url, func(r *faultRelay) { r.idleDrop = 2 * time.Second })
	_, purl := matrixProxy(t, relay.url(), nil)
	sc := newScene(t, fault, tg)
	for _, c := range clients {
		sc.join(c, direct, 1)
		sc.join(c, proxied, 1)
	}
	sc.each(func(s *seat) {
		sc.openSeat(s, [2]string{relay.url(), purl}[s.side])
		s.write(s.tag("1"))
		time.Sleep(3 * time.Second) // the fault: idle past the middlebox's 2 s
		s.write(s.tag("2"))
		time.Sleep(3 * time.Second)
		s.call("echo", map[string]any{"text": "after idle"}, func(r result) bool { return !r.IsError && r.TextHead == "after idle" })
	})
	t.Logf("the relay dropped %d idle flows, %d of them reset when used again", relay.drops.Load(), relay.resets.Load())
	return sc.cells(tg.name + " behind the middlebox")
}

// runCappedRestart: per client, two servers capped at 2 sessions (the SDK's
// max_sessions), one for each side, each with two seats (the cap full); a
// write each, both servers restarted, two writes each.
func runCappedRestart(t *testing.T, fault string, sk serverKind, clients []string) []cell {
	var mu sync.Mutex
	var out []cell
	var wg sync.WaitGroup
	for _, client := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d, p := sk.start(t), sk.start(t)
			_, purl := matrixProxy(t, p.url, nil)
			tg := d
			tg.runs = func(tag string) int { return d.runs(tag) + p.runs(tag) }
			sc := newScene(t, fault, tg)
			sc.join(client, direct, 2)
			sc.join(client, proxied, 2)
			sc.open(func(s *seat) string { return [2]string{d.url, purl}[s.side] })
			sc.each(func(s *seat) { s.write(s.tag("1")) })
			var rw sync.WaitGroup
			for _, srv := range []target{d, p} {
				rw.Add(1)
				go func() { defer rw.Done(); srv.restart() }()
			}
			rw.Wait()
			sc.each(func(s *seat) { s.write(s.tag("2")); s.write(s.tag("3")) })
			mu.Lock()
			out = append(out, sc.cells(sk.name)...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	return out
}

// runBurst: 4 seats per side and client write 20 times each, back to back;
// the server is killed (SIGKILL) and started again on its port twice under
// them, once a third and once two thirds of the writes through mcpheal
// have run.
func runBurst(t *testing.T, fault string, sk serverKind, clients []string) []cell {
	const agents, writes = 4, 20
	tg := sk.start(t)
	_, purl := matrixProxy(t, tg.url, nil)
	sc := newScene(t, fault, tg)
	sc.joinBoth(clients, agents, tg.url, purl)
	total := agents * writes * len(clients)
	proxiedRan := func() int {
		b, _ := os.ReadFile(tg.countFile)
		return strings.Count("\n"+string(b), "\np-")
	}
	done := make(chan struct{})
	restarted := make(chan int, 1)
	go func() {
		n := 0
		defer func() { restarted <- n }()
		for _, at := range []int{total / 3, 2 * total / 3} {
			deadline := time.Now().Add(60 * time.Second)
			for proxiedRan() < at && time.Now().Before(deadline) {
				select {
				case <-done:
					return
				case <-time.After(20 * time.Millisecond):
				}
			}
			sc.restart()
			n++
		}
	}()
	sc.each(func(s *seat) {
		for i := range writes {
			s.write(s.tag(strconv.Itoa(i)))
		}
	})
	close(done)
	if n := <-restarted; n != 2 {
		t.Errorf("the server was restarted %d times under the writes, want 2", n)
	}
	return sc.cells(tg.name)
}

// runLongCut: a call that reports progress for 1 s (and first a log
// message where the session era lets the server send one) has its
// upstream stream reset right after its first event: each seat has its own
// relay to the server, and through mcpheal its own mcpheal in front of it.
// Then an echo. Executions are the tool's starts.
func runLongCut(t *testing.T, fault string, sk serverKind, clients []string) []cell {
	tg := sk.start(t)
	tg.runs = func(tag string) int {
		return tg.srv.proc.out.count(func(l string) bool { return l == "STARTED long "+tag })
	}
	sc := newScene(t, fault, tg)
	relays := map[*seat]*faultRelay{}
	urls := map[*seat]string{}
	for _, c := range clients {
		for _, side := range []int{direct, proxied} {
			for _, s := range sc.join(c, side, 1) {
				r := startFaultRelay(t, tg.url, nil)
				relays[s], urls[s] = r, r.url()
				if side == proxied {
					_, urls[s] = matrixProxy(t, r.url(), nil)
				}
			}
		}
	}
	sc.open(func(s *seat) string { return urls[s] })
	sc.each(func(s *seat) {
		tag := s.tag("long")
		relays[s].arm("long " + tag + " started")
		relays[s].arm("notifications/progress")
		s.asked(tag)
		s.callProgress("long", map[string]any{"steps": 4, "ms": 250, "tag": tag, "notify": true},
			func(r result) bool { return !r.IsError && r.TextHead == "done 4" })
		s.call("echo", map[string]any{"text": "after the cut"}, func(r result) bool { return !r.IsError && r.TextHead == "after the cut" })
	})
	return sc.cells(tg.name)
}

// runElicitAcrossHeal: a write; the server restarts; then the server asks
// the agent's user (elicitation, on the call's stream) and changes its
// tool list (tools/list_changed, on the session's GET stream): the ask
// must be answered, and the new tool must reach the agent's list (a
// 2026-07-28 agent, which has no GET stream, lists again). Each is a call
// of the sideTally: the ask, change_tools, and the new tool seen.
func runElicitAcrossHeal(t *testing.T, fault string, sk serverKind, clients []string) []cell {
	tg := sk.start(t)
	_, purl := matrixProxy(t, tg.url, nil)
	sc := newScene(t, fault, tg)
	sc.joinBoth(clients, 1, tg.url, purl)
	sc.each(func(s *seat) { s.write(s.tag("1")) })
	sc.restart()
	sc.each(func(s *seat) {
		s.call("ask", map[string]any{"question": "go on?"}, func(r result) bool { return !r.IsError && strings.HasPrefix(r.TextHead, "accept") })
		event := "toolsChanged"
		if s.client == "hermes" {
			event = "toolsRefreshed" // Hermes lists the tools again itself
		}
		before := 0
		if s.dead == "" {
			ev := events(s.a)
			before = map[string]int{"toolsChanged": ev.ToolsChanged, "toolsRefreshed": ev.ToolsRefreshed}[event]
		}
		r := s.call("change_tools", map[string]any{}, func(r result) bool { return !r.IsError && strings.HasPrefix(r.TextHead, "added_") })
		name := r.TextHead
		seen := result{Op: "call", Kind: "not seen", Message: "change_tools failed"}
		if r.OK && !r.IsError && s.dead == "" {
			// The agent may be told more than once (mcpheal tells it after a
			// heal when the tool list changed): wait until it holds the new
			// tool, each notification at a time, 10 s in all.
			deadline := time.Now().Add(10 * time.Second)
			for want := before + 1; ; want++ {
				if !pyModern(s.client) {
					ev := waitEvent(s.a, event, want, max(time.Until(deadline), time.Millisecond))
					if !ev.OK {
						seen.Message = fmt.Sprintf("no %s #%d within 10 s: %v", event, want-before, ev)
						break
					}
				}
				l := s.a.list()
				if slices.Contains(l.Names, name) {
					seen = result{Op: "call", OK: true}
					break
				}
				if pyModern(s.client) || time.Now().After(deadline) {
					seen.Message = fmt.Sprintf("%s not in the agent's tools %v (%v)", name, l.Names, l)
					break
				}
			}
		}
		// Not a call: the wait for the notification is no call's time.
		s.m.add(seen, 0, seen.OK, false, clientTimeout(s.client))
	})
	return sc.cells(tg.name)
}
