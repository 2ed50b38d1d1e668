// Command demo shows mcpheal working, with nothing to set up (README "See it work in 20 seconds"):
//
//	go run ./bench/demo                 # 20 s; sessions die every 3 s
//	go run ./bench/demo -duration 1m -kill-every 5s -log
//
// It starts, all on 127.0.0.1 and in this one process, an MCP server (the
// official Go SDK) that kills every session every few seconds, mcpheal in
// front of it, and two identical Go SDK clients calling a tool in a loop:
// one talks to the server directly, one through mcpheal. Each second it
// prints what both saw. The direct client does what an agent must do
// without mcpheal: it gets an error, then reconnects (a new session, like an
// agent restart). The client behind mcpheal never sees the deaths: mcpheal
// re-initializes upstream and replays the call. It stops by itself.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/rs/zerolog"

	"github.com/mcpheal/mcpheal/proxy"
)

// config is what the flags set.
type config struct {
	Duration  time.Duration // how long the clients call
	KillEvery time.Duration // how often the server closes every session
	Pace      time.Duration // pause between two calls of one client
	ProxyLog  io.Writer     // mcpheal's log, or nil to drop it
}

func main() {
	var c config
	showLog := false
	flag.DurationVar(&c.Duration, "duration", 20*time.Second, "how long to run")
	flag.DurationVar(&c.KillEvery, "kill-every", 3*time.Second, "the server closes every session this often")
	flag.DurationVar(&c.Pace, "pace", 20*time.Millisecond, "pause between two calls of one client")
	flag.BoolVar(&showLog, "log", false, "show mcpheal's own log (one 'session healed' line per heal) on stderr")
	flag.Parse()
	if showLog {
		c.ProxyLog = zerolog.ConsoleWriter{Out: os.Stderr, TimeFormat: "15:04:05"}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if _, err := run(ctx, c, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

// result is what the demo measured.
type result struct {
	Direct, Proxied summary
	Heals           uint64 // re-inits mcpheal did
	Kills           int    // sessions the server closed
}

// run starts server, proxy and clients, prints a line per second to w and
// a summary at the end, and returns the totals. It returns when c.Duration
// has passed or ctx ends, with everything it started stopped.
func run(ctx context.Context, c config, w io.Writer) (*result, error) {
	up, err := startServer()
	if err != nil {
		return nil, err
	}
	defer up.stop()
	px, err := startProxy(up.url, c.ProxyLog)
	if err != nil {
		return nil, err
	}
	defer px.stop()

	fmt.Fprintf(w, "MCP server   %s  (closes every session every %v)\n", up.url, c.KillEvery)
	fmt.Fprintf(w, "mcpheal      %s  → the server\n", px.url)
	fmt.Fprintf(w, "two Go SDK clients call the echo tool every %v for %v: one direct, one through mcpheal\n\n", c.Pace, c.Duration)

	ctx, cancel := context.WithTimeout(ctx, c.Duration)
	defer cancel()
	direct, proxied := &client{name: "direct", url: up.url}, &client{name: "mcpheal", url: px.url}
	var wg sync.WaitGroup
	for _, cl := range []*client{direct, proxied} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl.loop(ctx, c.Pace)
		}()
	}
	kills := make(chan int, 1)
	go func() { kills <- up.killLoop(ctx, c.KillEvery) }()

	start := time.Now()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	fmt.Fprintf(w, "%5s  %-36s  %-36s  %s\n", "", "direct", "through mcpheal", "heals")
	for done := false; !done; {
		select {
		case <-tick.C:
		case <-ctx.Done():
			done = true
		}
		d, p := direct.window(), proxied.window()
		if done && d.Calls+p.Calls == 0 {
			break // the run ended right on a tick: no partial line
		}
		fmt.Fprintf(w, "%4.0fs  %-36s  %-36s  %d\n", time.Since(start).Seconds(), d, p, px.srv.Stats().Heals)
	}
	wg.Wait()
	r := &result{Direct: direct.total(), Proxied: proxied.total(), Heals: px.srv.Stats().Heals, Kills: <-kills}
	printSummary(w, r)
	return r, nil
}

func printSummary(w io.Writer, r *result) {
	fmt.Fprintf(w, "\nsummary: the server closed every session %d times\n", r.Kills)
	fmt.Fprintf(w, "  direct           %s, %d reconnects (each one a lost session: an agent restart)\n", r.Direct, r.Direct.Reconnects)
	fmt.Fprintf(w, "  through mcpheal  %s, %d reconnects; mcpheal healed %d times\n", r.Proxied, r.Proxied.Reconnects, r.Heals)
	if r.Direct.LastErr != nil {
		fmt.Fprintf(w, "  the direct client's last error: %v\n", r.Direct.LastErr)
	}
	if r.Proxied.LastErr != nil {
		fmt.Fprintf(w, "  the mcpheal client's last error: %v\n", r.Proxied.LastErr)
	}
	if r.Proxied.Errors == 0 && r.Direct.Errors > 0 {
		fmt.Fprintf(w, "the agent behind mcpheal saw none of the %d errors the direct one saw.\n", r.Direct.Errors)
	}
}

// ---------------------------------------------------------------------------
// the MCP server

type echoIn struct {
	Text string `json:"text"`
}

// server is the embedded go-sdk MCP server.
type server struct {
	url  string
	srv  *mcp.Server
	http *http.Server
	done chan struct{}
	// gate makes session deaths fall between POSTs: each POST holds it for
	// reading until answered, killLoop takes it for writing. A session then
	// dies the way idle expiry or a restart between calls kills it, which is
	// what mcpheal heals transparently. (A death in the middle of a call is
	// ambiguous: mcpheal replays it only if the tool is safe to run twice.)
	gate sync.RWMutex
}

func (s *server) gated(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			s.gate.RLock()
			defer s.gate.RUnlock()
		}
		h.ServeHTTP(w, r)
	})
}

func startServer() (*server, error) {
	ms := mcp.NewServer(&mcp.Implementation{Name: "demo-server", Version: "1.0.0"}, nil)
	mcp.AddTool(ms, &mcp.Tool{Name: "echo", Description: "returns its text"},
		func(_ context.Context, _ *mcp.CallToolRequest, in echoIn) (*mcp.CallToolResult, any, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: in.Text}}}, nil, nil
		})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("server listen: %w", err)
	}
	s := &server{
		url:  "http://" + ln.Addr().String() + "/mcp",
		srv:  ms,
		done: make(chan struct{}),
	}
	s.http = &http.Server{
		Handler:           s.gated(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return ms }, nil)),
		ReadHeaderTimeout: 5 * time.Second,
		ErrorLog:          log.New(io.Discard, "", 0),
	}
	go func() {
		defer close(s.done)
		_ = s.http.Serve(ln)
	}()
	return s, nil
}

// killLoop closes every session every period until ctx ends, between
// requests, as an idle expiry or a restart would, and returns how many
// rounds it ran.
func (s *server) killLoop(ctx context.Context, period time.Duration) int {
	t := time.NewTicker(period)
	defer t.Stop()
	n := 0
	for {
		select {
		case <-ctx.Done():
			return n
		case <-t.C:
			s.gate.Lock()
			for ss := range s.srv.Sessions() {
				_ = ss.Close()
			}
			s.gate.Unlock()
			n++
		}
	}
}

func (s *server) stop() {
	for ss := range s.srv.Sessions() {
		_ = ss.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if s.http.Shutdown(ctx) != nil {
		_ = s.http.Close()
	}
	<-s.done
}

// ---------------------------------------------------------------------------
// mcpheal

type proxyRun struct {
	url  string
	srv  *proxy.Server
	done chan struct{}
}

func startProxy(upstream string, logTo io.Writer) (*proxyRun, error) {
	if logTo == nil {
		logTo = io.Discard
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("proxy listen: %w", err)
	}
	log := zerolog.New(logTo).Level(zerolog.InfoLevel).With().Timestamp().Logger()
	srv, err := proxy.New(proxy.Config{Upstream: upstream, Listen: ln.Addr().String()}, log)
	if err != nil {
		ln.Close()
		return nil, err
	}
	p := &proxyRun{url: "http://" + ln.Addr().String() + "/mcp", srv: srv, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		_ = srv.Serve(ln)
	}()
	return p, nil
}

func (p *proxyRun) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	_ = p.srv.Shutdown(ctx)
	<-p.done
}

// ---------------------------------------------------------------------------
// the clients

// client is a go-sdk client calling echo in a loop. On an error it counts
// it, drops its session and connects again, as an agent would on restart.
type client struct {
	name string
	url  string

	mu         sync.Mutex // protects the fields below
	calls      int        // tool calls attempted
	errors     int
	reconnects int
	win        []time.Duration // latencies of successful calls this second
	all        []time.Duration
	winCalls   int
	winErrs    int
	lastErr    error
}

// loop calls until ctx ends.
func (c *client) loop(ctx context.Context, pace time.Duration) {
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	var cs *mcp.ClientSession
	defer func() {
		if cs != nil {
			_ = cs.Close()
		}
	}()
	for i := 0; ctx.Err() == nil; i++ {
		if cs == nil {
			var err error
			if cs, err = c.connect(ctx, tr); err != nil {
				c.record(ctx, 0, err)
				sleep(ctx, 100*time.Millisecond)
				continue
			}
		}
		text := fmt.Sprintf("%s-%d", c.name, i)
		callCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		start := time.Now()
		res, err := cs.CallTool(callCtx, &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"text": text}})
		cancel()
		if err == nil && !isEcho(res, text) {
			err = errors.New("wrong answer")
		}
		if ctx.Err() != nil {
			return // the demo ended mid-call: not the server's fault
		}
		c.record(ctx, time.Since(start), err)
		if err != nil {
			_ = cs.Close()
			cs = nil
			c.mu.Lock()
			c.reconnects++
			c.mu.Unlock()
		}
		sleep(ctx, pace)
	}
}

func (c *client) connect(ctx context.Context, tr *http.Transport) (*mcp.ClientSession, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	cl := mcp.NewClient(&mcp.Implementation{Name: "demo-" + c.name, Version: "1.0.0"}, nil)
	return cl.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: c.url, HTTPClient: &http.Client{Transport: tr}}, nil)
}

func isEcho(res *mcp.CallToolResult, text string) bool {
	if res == nil || res.IsError || len(res.Content) != 1 {
		return false
	}
	tc, ok := res.Content[0].(*mcp.TextContent)
	return ok && tc.Text == text
}

// record counts one call; d is its latency when it succeeded. A failed
// connect counts as an error but not as a call.
func (c *client) record(ctx context.Context, d time.Duration, err error) {
	if ctx.Err() != nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if d > 0 {
		c.calls++
		c.winCalls++
	}
	if err != nil {
		c.errors++
		c.winErrs++
		c.lastErr = err
		return
	}
	c.win = append(c.win, d)
	c.all = append(c.all, d)
}

// summary is one client's counts over a period.
type summary struct {
	Calls, Errors, Reconnects int
	P50                       time.Duration
	LastErr                   error // the most recent error, nil if none
}

func (s summary) String() string {
	return fmt.Sprintf("%5d calls %4d errors  p50 %6.2fms", s.Calls, s.Errors, float64(s.P50.Microseconds())/1000)
}

// window returns the counts since the last call and starts a new second.
func (c *client) window() summary {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := summary{Calls: c.winCalls, Errors: c.winErrs, P50: p50(c.win)}
	c.win, c.winCalls, c.winErrs = c.win[:0], 0, 0
	return s
}

func (c *client) total() summary {
	c.mu.Lock()
	defer c.mu.Unlock()
	return summary{Calls: c.calls, Errors: c.errors, Reconnects: c.reconnects, P50: p50(c.all), LastErr: c.lastErr}
}

func p50(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}
