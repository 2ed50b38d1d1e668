// Command eras measures what an MCP agent in version-negotiation "auto" mode
// gets from mcpheal in front of a server of the MCP session era only, with
// --era-bridge auto (the held route: mcpheal answers server/discover itself
// offering 2026-07-28 and holds one upstream session per credential and
// client) against --era-bridge legacy-agents (server/discover passes through,
// the upstream refuses it, the agent falls back to initialize: one upstream
// session per agent), with a direct connection (no proxy) as reference.
//
// Clients, each in its default/auto mode:
//   - go: the official Go SDK client v1.8.0 (github.com/modelcontextprotocol/go-sdk),
//     whose Connect tries server/discover first; in the session era it
//     opens its standalone GET stream inside Connect and waits for that
//     GET's response head before notifications/initialized;
//   - go-nosse: the same with DisableStandaloneSSE (no GET stream), which
//     shows the session era's cost without that wait (through mcpheal the
//     GET's head reaches the agent only with the upstream's first event or
//     mcpheal's first keepalive comment, 15 s later, when the upstream, like
//     the TS SDK v1 servers, sends no event on a new GET stream);
//   - ts: the TypeScript SDK v2 client @modelcontextprotocol/client 2.4.0 with
//     versionNegotiation {mode: "auto"} (bench/eras/tsclient.mjs, run with node
//     against proxy/interop/testdata/node_modules).
//
// Servers, all session era only, on 127.0.0.1:
//   - gosdk: a Go SDK v1.8.0 server, stateful mcp.NewStreamableHTTPHandler,
//     one echo tool, in this process (it counts the initializes it gets);
//   - everything: @modelcontextprotocol/server-everything streamableHttp;
//   - fastmcp: proxy/interop/testdata/fastmcp.mjs (npm fastmcp, httpStream).
//
// For each server two mcpheal processes run (era_bridge auto and
// legacy-agents, admin listener on for /metrics). Targets: direct, held
// (auto, same clientInfo on every connect: the held session is reused),
// held-cold (auto, a new clientInfo on every connect: each one opens a held
// session), session (legacy-agents). Per server and client:
//
//  1. connect: -connects rounds; each round, the targets in a rotating
//     order, one new client each: connect (timed), the first tools/call echo
//     (timed), close. One untimed round first (warms the era probe, the
//     pooled connections and the held session).
//  2. calls: one connected client per target, -calls rounds of one echo
//     each, targets interleaved in a rotating order.
//  3. count: -n clients of one new clientInfo connect at once and call echo
//     once, per mode; mcpheal_upstream_initializes_total before and after
//     (and, for gosdk, the initializes the server saw; for fastmcp, its
//     "session established" log lines, for server-everything its "Session
//     initialized" ones).
//  4. trace: -trace connects per target with every HTTP exchange timed
//     (start, response head, end of body), written to -tracefile.
//
// A Go client stops timing a target after -stallcap connects of 10 s or
// more (the GET-head wait above), to keep the run under 10 minutes.
//
// Run (about 7 minutes on 2 shared cores; every process it starts ends with
// it, node servers also after 10 minutes by themselves):
//
//	cd /work/main && go build -o /tmp/mcpheal-eras . && go run ./bench/eras
//
// Flags: -mcpheal (binary, default /tmp/mcpheal-eras), -testdata
// (proxy/interop/testdata), -servers gosdk,everything,fastmcp, -clients
// go,go-nosse,ts, -connects 20, -cold 10, -calls 200, -n 10, -trace 2,
// -stallcap 3, -out (JSON of every sample), -tracefile, -logdir, -deadline
// (hard stop, default 9m30s). The tables go to stdout.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

var (
	flagMcpheal   = flag.String("mcpheal", "/tmp/mcpheal-eras", "mcpheal binary")
	flagTestdata  = flag.String("testdata", "proxy/interop/testdata", "directory with guard.mjs, fastmcp.mjs and node_modules")
	flagServers   = flag.String("servers", "gosdk,everything,fastmcp", "servers to measure")
	flagClients   = flag.String("clients", "go,go-nosse,ts", "clients to measure")
	flagConnects  = flag.Int("connects", 20, "timed connect rounds per target")
	flagCold      = flag.Int("cold", 10, "timed connect rounds of held-cold (a new clientInfo each)")
	flagCalls     = flag.Int("calls", 200, "sequential calls per target on one client")
	flagN         = flag.Int("n", 10, "clients of one clientInfo in the count phase")
	flagTrace     = flag.Int("trace", 2, "traced connects per target")
	flagStallCap  = flag.Int("stallcap", 3, "go clients: stop timing a target after this many connects of 10 s or more (0: never)")
	flagOut       = flag.String("out", "/tmp/eras-results.json", "every sample, JSON")
	flagTraceFile = flag.String("tracefile", "/tmp/eras-trace.txt", "per-exchange timings of the traced connects")
	flagLogDir    = flag.String("logdir", "/tmp/eras-logs", "server and mcpheal logs")
	flagDeadline  = flag.Duration("deadline", 9*time.Minute+30*time.Second, "hard stop")
)

// target is one way to reach a server.
type target struct {
	Name string `json:"name"`
	URL  string `json:"url"`
	Cold bool   `json:"cold"` // a new clientInfo on every connect
}

// srv is one upstream with its two mcpheal instances.
type srv struct {
	name     string
	url      string
	tool     string
	args     map[string]any
	held     *mcpheal // era_bridge auto
	session  *mcpheal // era_bridge legacy-agents
	inits    *atomic.Int64
	discover *atomic.Int64
	logLines func(substr string) int // lines of the server's output holding substr
}

func (s *srv) targets() []target {
	return []target{
		{Name: "direct", URL: s.url},
		{Name: "held", URL: s.held.url},
		{Name: "held-cold", URL: s.held.url, Cold: true},
		{Name: "session", URL: s.session.url},
	}
}

// sample is one timed connect: connect, then the first call.
type sample struct {
	Connect   float64 `json:"connect"`
	FirstCall float64 `json:"firstCall"`
	Era       string  `json:"era"`
	Err       string  `json:"err,omitempty"`
}

// connectResult is the connect phase of one client and server.
type connectResult struct {
	Warm    map[string]sample   `json:"warm"` // the untimed round
	Samples map[string][]sample `json:"samples"`
}

// countResult is one mode of the count phase.
type countResult struct {
	Mode        string  `json:"mode"`
	Inits       float64 `json:"inits"`       // mcpheal_upstream_initializes_total delta
	ServerInits int64   `json:"serverInits"` // at the server, -1 unknown
	WallMs      float64 `json:"wallMs"`
	Errors      int     `json:"errors"`
}

type result struct {
	Server  string               `json:"server"`
	Client  string               `json:"client"`
	Connect connectResult        `json:"connect"`
	Calls   map[string][]float64 `json:"calls"`
	Count   []countResult        `json:"count"`
}

var (
	logDir   string
	children []*exec.Cmd
	childMu  sync.Mutex
)

func main() {
	flag.Parse()
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), *flagDeadline)
	defer cancel()
	go func() {
		<-ctx.Done()
		time.Sleep(5 * time.Second)
		fmt.Fprintln(os.Stderr, "eras: deadline passed, stopping")
		killChildren()
		os.Exit(3)
	}()
	defer killChildren()
	logDir = *flagLogDir
	must(os.MkdirAll(logDir, 0o755))
	td, err := filepath.Abs(*flagTestdata)
	must(err)
	*flagTestdata = td
	traceOut, err := os.Create(*flagTraceFile)
	must(err)
	defer traceOut.Close()

	var servers []*srv
	for _, name := range strings.Split(*flagServers, ",") {
		s, err := startServer(ctx, name)
		if err != nil {
			fatal("start %s: %v", name, err)
		}
		s.held, err = startMcpheal(ctx, s.name, "auto", s.url)
		if err != nil {
			fatal("mcpheal auto for %s: %v", name, err)
		}
		s.session, err = startMcpheal(ctx, s.name, "legacy-agents", s.url)
		if err != nil {
			fatal("mcpheal legacy-agents for %s: %v", name, err)
		}
		servers = append(servers, s)
	}
	fmt.Fprintf(os.Stderr, "eras: servers and mcpheals up in %v; load %s\n", time.Since(start).Round(time.Millisecond), loadavg())

	var results []result
	for _, s := range servers {
		for _, client := range strings.Split(*flagClients, ",") {
			t0 := time.Now()
			r := result{Server: s.name, Client: client}
			var err error
			switch client {
			case "go", "go-nosse":
				err = runGo(ctx, s, &r, traceOut, client == "go-nosse")
			case "ts":
				err = runTS(ctx, s, &r, traceOut)
			default:
				err = fmt.Errorf("unknown client %q", client)
			}
			if err != nil {
				fatal("%s/%s: %v", s.name, client, err)
			}
			results = append(results, r)
			fmt.Fprintf(os.Stderr, "eras: %s/%s done in %v; load %s\n", s.name, client, time.Since(t0).Round(time.Millisecond), loadavg())
		}
	}
	b, _ := json.MarshalIndent(results, "", " ")
	must(os.WriteFile(*flagOut, b, 0o644))
	report(os.Stdout, results)
	fmt.Printf("\ntotal %v; load average at the end %s; samples in %s, traces in %s, logs in %s\n",
		time.Since(start).Round(time.Second), loadavg(), *flagOut, *flagTraceFile, logDir)
}

// ---- servers ----

func startServer(ctx context.Context, name string) (*srv, error) {
	switch name {
	case "gosdk":
		return startGoSDK()
	case "everything":
		s, err := startNode(ctx, name, "node_modules/@modelcontextprotocol/server-everything/dist/index.js", "streamableHttp")
		if err != nil {
			return nil, err
		}
		s.tool, s.args = "echo", map[string]any{"message": "hi"}
		return s, nil
	case "fastmcp":
		s, err := startNode(ctx, name, "fastmcp.mjs")
		if err != nil {
			return nil, err
		}
		s.tool, s.args = "echo", map[string]any{"text": "hi"}
		return s, nil
	}
	return nil, fmt.Errorf("unknown server %q", name)
}

type echoIn struct {
	Text string `json:"text"`
}

// startGoSDK serves a stateful Go SDK server with one echo tool, counting
// the initialize and server/discover POSTs it gets.
func startGoSDK() (*srv, error) {
	server := mcp.NewServer(&mcp.Implementation{Name: "eras-gosdk", Version: "1.0.0"}, nil)
	mcp.AddTool(server, &mcp.Tool{Name: "echo", Description: "Echoes text.", Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true}},
		func(_ context.Context, _ *mcp.CallToolRequest, in echoIn) (*mcp.CallToolResult, any, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: in.Text}}}, nil, nil
		})
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, nil)
	inits, disc := &atomic.Int64{}, &atomic.Int64{}
	counted := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			b, _ := io.ReadAll(r.Body)
			_ = r.Body.Close()
			switch rpcMethod(b) {
			case "initialize":
				inits.Add(1)
			case "server/discover":
				disc.Add(1)
			}
			r.Body = io.NopCloser(bytes.NewReader(b))
		}
		h.ServeHTTP(w, r)
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	go func() { _ = http.Serve(ln, counted) }()
	return &srv{name: "gosdk", url: "http://" + ln.Addr().String() + "/mcp", tool: "echo", args: map[string]any{"text": "hi"},
		inits: inits, discover: disc}, nil
}

// startNode runs a node server the way proxy/interop does: node --import
// ./guard.mjs (127.0.0.1, prints LISTENING <port>, exits when stdin
// closes or after INTEROP_LIFETIME_MS).
func startNode(ctx context.Context, name string, args ...string) (*srv, error) {
	cmd := exec.Command("node", append([]string{"--import", "./guard.mjs"}, args...)...)
	cmd.Dir = *flagTestdata
	cmd.Env = append(os.Environ(), "PORT=0", "INTEROP_LIFETIME_MS=600000")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	_ = stdin // kept open until this process exits
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	addChild(cmd)
	logf, err := os.Create(filepath.Join(logDir, name+".log"))
	if err != nil {
		return nil, err
	}
	var mu sync.Mutex
	var lines []string
	port := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<16), 1<<20)
		for sc.Scan() {
			l := sc.Text()
			fmt.Fprintln(logf, l)
			mu.Lock()
			lines = append(lines, l)
			mu.Unlock()
			if p, ok := strings.CutPrefix(l, "LISTENING "); ok {
				select {
				case port <- p:
				default:
				}
			}
		}
	}()
	select {
	case p := <-port:
		s := &srv{name: name, url: "http://127.0.0.1:" + p + "/mcp"}
		s.logLines = func(sub string) int {
			mu.Lock()
			defer mu.Unlock()
			n := 0
			for _, l := range lines {
				if strings.Contains(l, sub) {
					n++
				}
			}
			return n
		}
		return s, nil
	case <-time.After(60 * time.Second):
		return nil, errors.New("no LISTENING line within 60s")
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// mcpheal is one mcpheal process.
type mcpheal struct {
	url, admin string
}

func startMcpheal(ctx context.Context, server, mode, upstream string) (*mcpheal, error) {
	listen, admin := freeAddr(), freeAddr()
	cmd := exec.Command(*flagMcpheal, "--upstream", upstream, "--listen", listen, "--admin-listen", admin,
		"--era-bridge", mode, "--log-format", "json", "--log-level", "info")
	logf, err := os.Create(filepath.Join(logDir, "mcpheal-"+server+"-"+mode+".log"))
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	addChild(cmd)
	m := &mcpheal{url: "http://" + listen + "/mcp", admin: "http://" + admin}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if r, err := http.Get(m.admin + "/healthz"); err == nil {
			_ = r.Body.Close()
			if r.StatusCode == 200 {
				return m, nil
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return nil, errors.New("its /healthz did not answer 200 within 20s")
		}
	}
}

var initsRe = regexp.MustCompile(`(?m)^mcpheal_upstream_initializes_total(?:\{[^}]*\})? ([0-9.e+]+)$`)

// inits returns mcpheal_upstream_initializes_total.
func (m *mcpheal) inits() float64 {
	r, err := http.Get(m.admin + "/metrics")
	if err != nil {
		return -1
	}
	defer r.Body.Close()
	b, _ := io.ReadAll(r.Body)
	sum := 0.0
	for _, mm := range initsRe.FindAllSubmatch(b, -1) {
		v, _ := strconv.ParseFloat(string(mm[1]), 64)
		sum += v
	}
	return sum
}

// serverInits counts the initializes the server itself saw, -1 when it
// cannot tell: the Go SDK server counts them, fastmcp and server-everything
// log each session they open.
func (s *srv) serverInits() int64 {
	switch {
	case s.inits != nil:
		return s.inits.Load()
	case s.name == "fastmcp":
		return int64(s.logLines("HTTP Stream session established"))
	case s.name == "everything":
		return int64(s.logLines("Session initialized with ID"))
	}
	return -1
}

func freeAddr() string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(err)
	a := ln.Addr().String()
	_ = ln.Close()
	return a
}

func addChild(c *exec.Cmd) {
	childMu.Lock()
	children = append(children, c)
	childMu.Unlock()
}

func killChildren() {
	childMu.Lock()
	defer childMu.Unlock()
	for _, c := range children {
		if c.Process != nil {
			_ = syscall.Kill(-c.Process.Pid, syscall.SIGKILL)
			_ = c.Process.Kill()
			_ = c.Wait()
		}
	}
	children = nil
}

// ---- the Go SDK client ----

// tracer times every HTTP exchange of the clients using it.
type tracer struct {
	base http.RoundTripper
	mu   sync.Mutex
	t0   time.Time
	log  []*exchange
}

type exchange struct {
	Method, RPC  string
	Status       int
	Start, Head  time.Duration
	End          time.Duration // end of the body (-1 not yet)
	mu           sync.Mutex
	sessionShort string
}

func (t *tracer) reset() {
	t.mu.Lock()
	t.t0, t.log = time.Now(), nil
	t.mu.Unlock()
}

func (t *tracer) RoundTrip(req *http.Request) (*http.Response, error) {
	e := &exchange{Method: req.Method, End: -1}
	if req.GetBody != nil {
		if b, err := req.GetBody(); err == nil {
			body, _ := io.ReadAll(b)
			e.RPC = rpcMethod(body)
		}
	}
	t.mu.Lock()
	t0 := t.t0
	t.log = append(t.log, e)
	t.mu.Unlock()
	e.Start = time.Since(t0)
	resp, err := t.base.RoundTrip(req)
	e.mu.Lock()
	e.Head = time.Since(t0)
	if err != nil {
		e.Status = -1
	} else {
		e.Status = resp.StatusCode
		if sid := resp.Header.Get("Mcp-Session-Id"); sid != "" {
			e.sessionShort = sid[:min(8, len(sid))]
		}
		resp.Body = &endBody{ReadCloser: resp.Body, done: func() {
			e.mu.Lock()
			if e.End < 0 {
				e.End = time.Since(t0)
			}
			e.mu.Unlock()
		}}
	}
	e.mu.Unlock()
	return resp, err
}

type endBody struct {
	io.ReadCloser
	done func()
}

func (b *endBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil {
		b.done()
	}
	return n, err
}

func (b *endBody) Close() error { b.done(); return b.ReadCloser.Close() }

func (t *tracer) dump(w io.Writer) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, e := range t.log {
		e.mu.Lock()
		end := "open"
		if e.End >= 0 {
			end = ms(e.End)
		}
		fmt.Fprintf(w, "    %-6s %-26s %4d  start %8s  head %8s  end %8s  %s\n", e.Method, e.RPC, e.Status, ms(e.Start), ms(e.Head), end, e.sessionShort)
		e.mu.Unlock()
	}
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1fms", float64(d)/1e6) }

func rpcMethod(b []byte) string {
	var m struct {
		Method string `json:"method"`
		ID     any    `json:"id"`
	}
	if json.Unmarshal(b, &m) != nil {
		return "?"
	}
	if m.Method == "" && m.ID != nil {
		return "(response)"
	}
	return m.Method
}

func newHTTPClient() *http.Client {
	return &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64, IdleConnTimeout: 30 * time.Second}}
}

// goClient is the Go SDK client as configured: noSSE disables its
// standalone GET stream (DisableStandaloneSSE), which it otherwise opens
// right after the initialize answer, waiting for the GET's response head
// before it sends notifications/initialized.
type goClient struct {
	hc    *http.Client
	noSSE bool
}

// session connects a new Go SDK client named name, timing the connect.
func (g goClient) session(ctx context.Context, url, name string) (*mcp.ClientSession, time.Duration, error) {
	c := mcp.NewClient(&mcp.Implementation{Name: name, Version: "1.0.0"}, nil)
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	t0 := time.Now()
	cs, err := c.Connect(cctx, &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: g.hc, MaxRetries: -1,
		DisableStandaloneSSE: g.noSSE}, nil)
	return cs, time.Since(t0), err
}

func goCall(ctx context.Context, cs *mcp.ClientSession, s *srv) (time.Duration, error) {
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	t0 := time.Now()
	r, err := cs.CallTool(cctx, &mcp.CallToolParams{Name: s.tool, Arguments: s.args})
	d := time.Since(t0)
	if err == nil && r.IsError {
		err = fmt.Errorf("tool error: %v", r.Content)
	}
	return d, err
}

func era(cs *mcp.ClientSession) string {
	if ir := cs.InitializeResult(); ir != nil {
		return ir.ProtocolVersion
	}
	return "?"
}

func fms(d time.Duration) float64 { return float64(d) / 1e6 }

func rotate[T any](xs []T, i int) []T {
	i %= len(xs)
	return append(slices.Clone(xs[i:]), xs[:i]...)
}

// stallMs: a connect this long is a stall (mcpheal's GET-head delay).
const stallMs = 10000

func runGo(ctx context.Context, s *srv, r *result, traceOut io.Writer, noSSE bool) error {
	g := goClient{hc: newHTTPClient(), noSSE: noSSE}
	targets := s.targets()
	stalls := map[string]int{} // connects of a target past stallMs
	capped := func(t target) bool { return *flagStallCap > 0 && stalls[t.Name] >= *flagStallCap }
	one := func(t target, name string) sample {
		cs, d, err := g.session(ctx, t.URL, name)
		if fms(d) >= stallMs {
			stalls[t.Name]++
		}
		if err != nil {
			return sample{Connect: fms(d), Err: err.Error()}
		}
		smp := sample{Connect: fms(d), Era: era(cs)}
		fc, err := goCall(ctx, cs, s)
		smp.FirstCall = fms(fc)
		if err != nil {
			smp.Err = err.Error()
		}
		_ = cs.Close()
		return smp
	}
	// 1. connect
	r.Connect = connectResult{Warm: map[string]sample{}, Samples: map[string][]sample{}}
	base := "eras-" + r.Client + "-" + s.name
	for _, t := range targets {
		if !t.Cold {
			r.Connect.Warm[t.Name] = one(t, base)
		}
	}
	stalls = map[string]int{} // the warm-up's stall is not counted
	for i := range *flagConnects {
		for _, t := range rotate(targets, i) {
			if capped(t) {
				continue
			}
			name := base
			if t.Cold {
				if i >= *flagCold {
					continue
				}
				name = fmt.Sprintf("%s-cold-%d", base, i)
			}
			r.Connect.Samples[t.Name] = append(r.Connect.Samples[t.Name], one(t, name))
		}
	}
	// 2. calls
	r.Calls = map[string][]float64{}
	sessions := map[string]*mcp.ClientSession{}
	var callTargets []target
	for _, t := range targets {
		if t.Cold {
			continue
		}
		cs, _, err := g.session(ctx, t.URL, base)
		if err != nil {
			return fmt.Errorf("calls: connect %s: %w", t.Name, err)
		}
		sessions[t.Name] = cs
		callTargets = append(callTargets, t)
	}
	for i := range *flagCalls {
		for _, t := range rotate(callTargets, i) {
			d, err := goCall(ctx, sessions[t.Name], s)
			if err != nil {
				return fmt.Errorf("calls: %s: %w", t.Name, err)
			}
			r.Calls[t.Name] = append(r.Calls[t.Name], fms(d))
		}
	}
	for _, cs := range sessions {
		_ = cs.Close()
	}
	// 3. count
	for _, m := range []struct {
		mode string
		ph   *mcpheal
	}{{"held", s.held}, {"session", s.session}} {
		name := fmt.Sprintf("eras-%s-count-%s-%s", r.Client, s.name, m.mode)
		before, sb := m.ph.inits(), s.serverInits()
		t0 := time.Now()
		var wg sync.WaitGroup
		var errs atomic.Int32
		var mu sync.Mutex
		var open []*mcp.ClientSession
		for range *flagN {
			wg.Go(func() {
				cs, _, err := g.session(ctx, m.ph.url, name)
				if err == nil {
					_, err = goCall(ctx, cs, s)
					mu.Lock()
					open = append(open, cs)
					mu.Unlock()
				}
				if err != nil {
					errs.Add(1)
					fmt.Fprintf(os.Stderr, "eras: go count %s %s: %v\n", s.name, m.mode, err)
				}
			})
		}
		wg.Wait()
		wall := time.Since(t0)
		for _, cs := range open {
			_ = cs.Close()
		}
		time.Sleep(200 * time.Millisecond)
		cr := countResult{Mode: m.mode, Inits: m.ph.inits() - before, ServerInits: -1, WallMs: fms(wall), Errors: int(errs.Load())}
		if sa := s.serverInits(); sb >= 0 {
			cr.ServerInits = sa - sb
		}
		r.Count = append(r.Count, cr)
	}
	// 4. trace
	tr := &tracer{base: &http.Transport{MaxIdleConnsPerHost: 64}}
	tg := goClient{hc: &http.Client{Transport: tr}, noSSE: noSSE}
	for i := range *flagTrace {
		for _, t := range targets {
			if i > 0 && capped(t) {
				continue // one traced stall is enough
			}
			name := base
			if t.Cold {
				name = fmt.Sprintf("%s-tracecold-%d", base, i)
			}
			tr.reset()
			cs, d, err := tg.session(ctx, t.URL, name)
			fmt.Fprintf(traceOut, "%s %s %s #%d: connect %s", r.Client, s.name, t.Name, i, ms(d))
			if err == nil {
				fc, _ := goCall(ctx, cs, s)
				fmt.Fprintf(traceOut, ", first call %s, era %s\n", ms(fc), era(cs))
				time.Sleep(50 * time.Millisecond)
				tr.dump(traceOut)
				_ = cs.Close()
			} else {
				fmt.Fprintf(traceOut, ", error %v\n", err)
				tr.dump(traceOut)
			}
		}
	}
	return nil
}

// ---- the TS SDK v2 client (tsclient.mjs) ----

func tsRun(ctx context.Context, phase string, in any, out any) error {
	here, err := filepath.Abs("bench/eras/tsclient.mjs")
	if err != nil {
		return err
	}
	if _, err := os.Stat(here); err != nil {
		return fmt.Errorf("run from the repository root: %w", err)
	}
	b, _ := json.Marshal(in)
	cctx, cancel := context.WithTimeout(ctx, 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(cctx, "node", here, phase, string(b))
	cmd.Dir = *flagTestdata
	cmd.Env = append(os.Environ(), "ERAS_TESTDATA="+*flagTestdata)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("tsclient %s: %v\n%s", phase, err, stderr.String())
	}
	for _, l := range strings.Split(stdout.String(), "\n") {
		if j, ok := strings.CutPrefix(l, "RESULT "); ok {
			return json.Unmarshal([]byte(j), out)
		}
	}
	return fmt.Errorf("tsclient %s: no RESULT line\n%s\n%s", phase, stdout.String(), stderr.String())
}

type tsIn struct {
	Targets  []target       `json:"targets"`
	Name     string         `json:"name"`
	Tool     string         `json:"tool"`
	Args     map[string]any `json:"args"`
	Connects int            `json:"connects"`
	Cold     int            `json:"cold"`
	Calls    int            `json:"calls"`
	N        int            `json:"n"`
	Trace    int            `json:"trace"`
}

func runTS(ctx context.Context, s *srv, r *result, traceOut io.Writer) error {
	in := tsIn{Targets: s.targets(), Name: "eras-ts-" + s.name, Tool: s.tool, Args: s.args,
		Connects: *flagConnects, Cold: *flagCold, Calls: *flagCalls, N: *flagN, Trace: *flagTrace}
	if err := tsRun(ctx, "connect", in, &r.Connect); err != nil {
		return err
	}
	if err := tsRun(ctx, "calls", in, &r.Calls); err != nil {
		return err
	}
	for _, m := range []struct {
		mode string
		ph   *mcpheal
	}{{"held", s.held}, {"session", s.session}} {
		cin := in
		cin.Targets = []target{{Name: m.mode, URL: m.ph.url}}
		cin.Name = fmt.Sprintf("eras-ts-count-%s-%s", s.name, m.mode)
		before, sb := m.ph.inits(), s.serverInits()
		var out struct {
			WallMs float64 `json:"wallMs"`
			Errors int     `json:"errors"`
		}
		if err := tsRun(ctx, "count", cin, &out); err != nil {
			return err
		}
		time.Sleep(200 * time.Millisecond)
		cr := countResult{Mode: m.mode, Inits: m.ph.inits() - before, ServerInits: -1, WallMs: out.WallMs, Errors: out.Errors}
		if sa := s.serverInits(); sb >= 0 {
			cr.ServerInits = sa - sb
		}
		r.Count = append(r.Count, cr)
	}
	var tr struct {
		Text string `json:"text"`
	}
	if err := tsRun(ctx, "trace", in, &tr); err != nil {
		return err
	}
	_, err := io.WriteString(traceOut, tr.Text)
	return err
}

// ---- report ----

func quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	i := int(q*float64(len(s)-1) + 0.5)
	return s[i]
}

func report(w io.Writer, results []result) {
	fmt.Fprintf(w, "\n## 1–2. Connect, first call, per-call latency (ms; median / p90)\n\n")
	fmt.Fprintf(w, "| server | client | target | era | n | connect med | connect p90 | first call med | per-call med | per-call p90 | connect ÷ session | connect ÷ direct | per-call ÷ session |\n")
	fmt.Fprintf(w, "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range results {
		med := map[string]float64{}
		callMed := map[string]float64{}
		for _, t := range []string{"direct", "held", "held-cold", "session"} {
			med[t] = quantile(connects(r.Connect.Samples[t]), 0.5)
			callMed[t] = quantile(r.Calls[t], 0.5)
		}
		for _, t := range []string{"direct", "held", "held-cold", "session"} {
			ss := r.Connect.Samples[t]
			var first []float64
			eras, errs := map[string]int{}, 0
			for _, x := range ss {
				if x.Err != "" {
					errs++
					continue
				}
				first = append(first, x.FirstCall)
				eras[x.Era]++
			}
			var eraList []string
			for e := range eras {
				eraList = append(eraList, e)
			}
			slices.Sort(eraList)
			n := strconv.Itoa(len(ss))
			if errs > 0 {
				n += fmt.Sprintf(" (%d err)", errs)
			}
			calls := "–"
			callP90 := "–"
			callRatio := "–"
			if c := r.Calls[t]; len(c) > 0 {
				calls = f2(callMed[t])
				callP90 = f2(quantile(c, 0.9))
				callRatio = ratio(callMed[t], callMed["session"])
			}
			fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
				r.Server, r.Client, t, strings.Join(eraList, ","), n,
				f2(med[t]), f2(quantile(connects(ss), 0.9)), f2(quantile(first, 0.5)), calls, callP90,
				ratio(med[t], med["session"]), ratio(med[t], med["direct"]), callRatio)
		}
	}
	fmt.Fprintf(w, "\nwarm-up connects (the untimed first round: era probe, new TCP connections, the held session's creation), ms:\n\n")
	for _, r := range results {
		fmt.Fprintf(w, "- %s/%s:", r.Server, r.Client)
		for _, t := range []string{"direct", "held", "session"} {
			x := r.Connect.Warm[t]
			fmt.Fprintf(w, " %s %s (first call %s)%s;", t, f2(x.Connect), f2(x.FirstCall), errNote(x.Err))
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "\n## 3. Upstream initializes for N=%d clients of one clientInfo (connecting at once, one echo each)\n\n", *flagN)
	fmt.Fprintf(w, "| server | client | mode | mcpheal_upstream_initializes_total Δ | seen by the server | wall ms (all connected + called) | errors |\n|---|---|---|---|---|---|---|\n")
	for _, r := range results {
		for _, c := range r.Count {
			si := "–"
			if c.ServerInits >= 0 {
				si = strconv.FormatInt(c.ServerInits, 10)
			}
			fmt.Fprintf(w, "| %s | %s | %s | %g | %s | %s | %d |\n", r.Server, r.Client, c.Mode, c.Inits, si, f2(c.WallMs), c.Errors)
		}
	}
}

func connects(ss []sample) []float64 {
	var xs []float64
	for _, s := range ss {
		if s.Err == "" {
			xs = append(xs, s.Connect)
		}
	}
	return xs
}

func errNote(e string) string {
	if e == "" {
		return ""
	}
	return " ERROR " + e
}

func f2(x float64) string {
	switch {
	case x >= 100:
		return fmt.Sprintf("%.0f", x)
	case x >= 10:
		return fmt.Sprintf("%.1f", x)
	}
	return fmt.Sprintf("%.2f", x)
}

func ratio(a, b float64) string {
	if a == 0 || b == 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f×", a/b)
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	return strings.Join(f[:min(3, len(f))], " ")
}

func must(err error) {
	if err != nil {
		fatal("%v", err)
	}
}

func fatal(f string, a ...any) {
	fmt.Fprintf(os.Stderr, "eras: "+f+"\n", a...)
	killChildren()
	os.Exit(1)
}
