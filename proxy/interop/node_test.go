//go:build unix

package interop

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/mcpheal/mcpheal/proxy"
	"github.com/mcpheal/mcpheal/session"
)

// testdata is the absolute path of the npm fixtures; node runs there.
var testdata string

const (
	// startTimeout bounds a node server's start (module loading included).
	startTimeout = 20 * time.Second
	// opTimeout bounds every client operation. mcp-remote gives up on an
	// unanswered initialize after 30 s; a proxy that loses an answer must
	// fail the test well before that, with a readable message.
	opTimeout = 25 * time.Second
	// sdkTimeout is the TS SDK clients' own request timeout, under opTimeout
	// so that the SDK reports a lost answer itself.
	sdkTimeout = 20 * time.Second
)

func TestMain(m *testing.M) {
	if client := os.Getenv(wrapClientEnv); client != "" {
		os.Exit(wrapClient(client, os.Args[len(os.Args)-1])) // the suite's client command, not a test run
	}
	if err := setup(); err != nil {
		fmt.Fprintf(os.Stderr, "proxy/interop: %v\n", err)
		os.Exit(1)
	}
	code := m.Run()
	removeMcphealBinary()
	os.Exit(code)
}

// setup installs the pinned Python environments (setupPython) and finds
// node and installs the pinned npm fixtures when node_modules is missing or
// does not hold the versions package.json pins. A machine without
// python3.11, node or npm fails here, loudly: these tests are never skipped.
func setup() error {
	dir, err := filepath.Abs("testdata")
	if err != nil {
		return err
	}
	testdata = dir
	if err := setupPython(filepath.Join(dir, "python")); err != nil {
		return err
	}
	if _, err := exec.LookPath("node"); err != nil {
		return fmt.Errorf("node (20 or later) is needed to run the npm MCP clients and servers in %s: %w", dir, err)
	}
	why := fixturesStale(dir)
	if why == "" {
		return nil
	}
	npm, err := exec.LookPath("npm")
	if err != nil {
		return fmt.Errorf("%s, and npm is not on PATH to install it: %w", why, err)
	}
	fmt.Fprintf(os.Stderr, "proxy/interop: %s: running npm ci in %s\n", why, dir)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, npm, "ci", "--no-audit", "--no-fund")
	cmd.Dir = dir
	cmd.Stdout = os.Stderr
	cmd.Stderr = os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("npm ci in %s failed (%w): the interop tests need the npm packages pinned in package.json and package-lock.json", dir, err)
	}
	if why := fixturesStale(dir); why != "" {
		return fmt.Errorf("after npm ci in %s: %s", dir, why)
	}
	return nil
}

// fixturesStale says why node_modules does not match package.json, or "".
func fixturesStale(dir string) string {
	b, err := os.ReadFile(filepath.Join(dir, "package.json"))
	if err != nil {
		return err.Error()
	}
	var pkg struct{ Dependencies map[string]string }
	if err := json.Unmarshal(b, &pkg); err != nil {
		return fmt.Sprintf("package.json: %v", err)
	}
	for name, want := range pkg.Dependencies {
		b, err := os.ReadFile(filepath.Join(dir, "node_modules", name, "package.json"))
		if err != nil {
			return fmt.Sprintf("node_modules/%s is missing", name)
		}
		var got struct{ Version string }
		if err := json.Unmarshal(b, &got); err != nil || got.Version != want {
			return fmt.Sprintf("node_modules/%s is %q, package.json pins %q", name, got.Version, want)
		}
	}
	return ""
}

// tail keeps the last max bytes written to it (a process's stderr, the
// proxy's log) to show when a test fails.
type tail struct {
	mu  sync.Mutex // protects b
	b   []byte
	max int
}

func (w *tail) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.b = append(w.b, p...)
	if len(w.b) > 2*w.max {
		w.b = append(w.b[:0], w.b[len(w.b)-w.max:]...)
	}
	return len(p), nil
}

func (w *tail) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.b) > w.max {
		return "…" + string(w.b[len(w.b)-w.max:])
	}
	return string(w.b)
}

// lineLog collects a process's stdout lines and lets a test wait for one.
type lineLog struct {
	mu      sync.Mutex    // protects lines, eof, changed
	lines   []string      // every line, without its newline
	eof     bool          // stdout ended
	changed chan struct{} // closed and replaced on every change
}

func newLineLog() *lineLog { return &lineLog{changed: make(chan struct{})} }

func (l *lineLog) add(line string, eof bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !eof {
		l.lines = append(l.lines, line)
	}
	l.eof = l.eof || eof
	close(l.changed)
	l.changed = make(chan struct{})
}

// waitFor returns the index and text of the first line at or after from that
// match says yes to; ok is false when stdout ended or d passed first.
func (l *lineLog) waitFor(from int, d time.Duration, match func(string) bool) (int, string, bool) {
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		l.mu.Lock()
		for i := from; i < len(l.lines); i++ {
			if line := l.lines[i]; match(line) {
				l.mu.Unlock()
				return i, line, true
			}
		}
		from = max(from, len(l.lines))
		eof, changed := l.eof, l.changed
		l.mu.Unlock()
		if eof {
			return 0, "", false
		}
		select {
		case <-changed:
		case <-timer.C:
			return 0, "", false
		}
	}
}

// count says how many lines match.
func (l *lineLog) count(match func(string) bool) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, s := range l.lines {
		if match(s) {
			n++
		}
	}
	return n
}

// nodeProc is one node process in its own process group.
type nodeProc struct {
	name   string
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	out    *lineLog
	stderr *tail
	exited chan struct{}
	once   sync.Once
}

// startNode runs node with args in testdata. It is killed (with its process
// group) in cleanup; stdin stays open until then, which is what keeps the
// guard.mjs servers alive.
func startNode(t testing.TB, name string, env []string, args ...string) *nodeProc {
	t.Helper()
	return startProcess(t, name, testdata, env, "node", args...)
}

// lifetimeEnv bounds a process's life (guard.mjs, guard.py) by the test
// binary's own deadline (go test -timeout) and a little more: a parallel
// test may start its servers long before its subtests get to run, and a
// server must not end under them; one still running after the deadline
// outlives the run. An INTEROP_LIFETIME_MS in a process's env wins.
func lifetimeEnv(t testing.TB) string {
	life := 30 * time.Minute
	if d, ok := t.(interface{ Deadline() (time.Time, bool) }); ok {
		if at, ok := d.Deadline(); ok {
			life = time.Until(at) + 30*time.Second
		}
	}
	return fmt.Sprintf("INTEROP_LIFETIME_MS=%d", life.Milliseconds())
}

// startProcess runs prog with args in dir, as startNode runs node: in its
// own process group, killed in cleanup, stdout collected line by line.
func startProcess(t testing.TB, name, dir string, env []string, prog string, args ...string) *nodeProc {
	t.Helper()
	cmd := exec.Command(prog, args...)
	cmd.Dir = dir
	cmd.Env = append(append(os.Environ(), lifetimeEnv(t)), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	p := &nodeProc{name: name, cmd: cmd, out: newLineLog(), stderr: &tail{max: 16 << 10}, exited: make(chan struct{})}
	cmd.Stderr = p.stderr
	var err error
	if p.stdin, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		defer close(p.exited)
		r := bufio.NewReaderSize(stdout, 1<<20)
		for {
			line, err := r.ReadString('\n')
			if line != "" {
				p.out.add(strings.TrimRight(line, "\r\n"), false)
			}
			if err != nil {
				break
			}
		}
		p.out.add("", true)
		_ = cmd.Wait()
	}()
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			t.Logf("%s stderr (tail):\n%s", name, p.stderr.String())
		}
	})
	return p
}

// send writes one line to the process's stdin.
func (p *nodeProc) send(t testing.TB, line []byte) {
	t.Helper()
	if _, err := p.stdin.Write(append(line, '\n')); err != nil {
		t.Fatalf("write to %s: %v", p.name, err)
	}
}

// kill ends the process group at once (SIGKILL, as a crash or an OOM kill
// does) and waits until the process is gone.
func (p *nodeProc) kill() {
	p.once.Do(func() {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		_ = p.stdin.Close()
		select {
		case <-p.exited:
		case <-time.After(10 * time.Second):
		}
	})
}

// server is an MCP server run by node on 127.0.0.1, restartable on its port.
type server struct {
	t    testing.TB
	name string
	env  []string
	args []string
	port int
	proc *nodeProc
	// launch, if set, starts the process on a port instead of node with
	// guard.mjs (the Python servers); it prints "LISTENING <port>" too.
	launch func(port int) *nodeProc
}

// startServer runs a node server script (through guard.mjs) on port, 0
// meaning any free port.
func startServer(t testing.TB, name string, port int, env []string, args ...string) *server {
	t.Helper()
	s := &server{t: t, name: name, env: env, args: args}
	s.start(port)
	return s
}

func (s *server) start(port int) {
	s.t.Helper()
	if s.launch != nil {
		s.proc = s.launch(port)
	} else {
		env := append(append([]string{}, s.env...), "PORT="+strconv.Itoa(port))
		s.proc = startNode(s.t, s.name, env, append([]string{"--import", "./guard.mjs"}, s.args...)...)
	}
	_, line, ok := s.proc.out.waitFor(0, startTimeout, func(l string) bool { return strings.HasPrefix(l, "LISTENING ") })
	if !ok {
		s.t.Fatalf("%s did not start listening within %v; stderr:\n%s", s.name, startTimeout, s.proc.stderr.String())
	}
	got, err := strconv.Atoi(strings.TrimPrefix(line, "LISTENING "))
	if err != nil || (port != 0 && got != port) {
		s.t.Fatalf("%s: %q, want port %d", s.name, line, port)
	}
	s.port = got
}

// url is the server's MCP endpoint.
func (s *server) url() string { return fmt.Sprintf("http://127.0.0.1:%d/mcp", s.port) }

// restart kills the server (SIGKILL) and starts it again on the same port:
// every session it held is gone, as after a crash or a redeploy.
func (s *server) restart() {
	s.t.Helper()
	s.proc.kill()
	s.start(s.port)
}

// v1Opts shapes one testdata/v1server.mjs (TS SDK v1) for one scenario, so
// that each scenario meets only the trouble it is about.
type v1Opts struct {
	// countFile, if set, receives one line per execution of the "work" tool.
	countFile string
	// restartable picks a port the kernel never hands out as an ephemeral
	// one, so that a restart on the same port cannot find it taken by
	// another test's connection.
	restartable bool
	// instructions is the size of the initialize answer's instructions in
	// bytes; zero means 200.
	instructions int
	// fillers is how many filler tools it lists besides work, big and echo.
	fillers int
	// eventStore keeps each session's events, so that answer streams carry
	// event ids and can be resumed.
	eventStore bool
}

func startV1Server(t testing.TB, o v1Opts) *server {
	t.Helper()
	port := 0
	if o.restartable {
		port = freeFixedPort(t)
	}
	if o.instructions == 0 {
		o.instructions = 200
	}
	env := []string{
		"COUNT_FILE=" + o.countFile,
		"INSTRUCTIONS_BYTES=" + strconv.Itoa(o.instructions),
		"FILLER_TOOLS=" + strconv.Itoa(o.fillers),
	}
	if o.eventStore {
		env = append(env, "EVENT_STORE=1")
	}
	return startServer(t, "v1server", port, env, "v1server.mjs")
}

// startEverything runs @modelcontextprotocol/server-everything in
// streamableHttp mode.
func startEverything(t testing.TB) *server {
	t.Helper()
	return startServer(t, "server-everything", 0, nil,
		"node_modules/@modelcontextprotocol/server-everything/dist/index.js", "streamableHttp")
}

// startFastMCP runs testdata/fastmcp.mjs (npm fastmcp, httpStream).
func startFastMCP(t testing.TB) *server {
	t.Helper()
	return startServer(t, "fastmcp", 0, nil, "fastmcp.mjs")
}

// freeFixedPort returns a free 127.0.0.1 port below Linux's default
// ephemeral range (32768-60999).
func freeFixedPort(t testing.TB) int {
	t.Helper()
	for range 100 {
		port := 20000 + rand.IntN(10000)
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err == nil {
			_ = ln.Close()
			return port
		}
	}
	t.Fatal("no free port in 20000-29999")
	return 0
}

// startProxy serves mcpheal in front of upstream on a 127.0.0.1 port and
// returns the URL agents use. Its log is shown if the test fails.
func startProxy(t testing.TB, upstream string) string {
	t.Helper()
	_, url := startProxyServer(t, upstream)
	return url
}

// startProxyServer is startProxy that also returns the server, for its
// counters.
func startProxyServer(t testing.TB, upstream string) (*proxy.Server, string) {
	t.Helper()
	return startProxyConfig(t, proxy.Config{Upstream: upstream}, &tail{max: 64 << 10})
}

// startProxyConfig is startProxyServer for the config c (its Listen and,
// if zero, HealTimeout are set here), logging at debug level to logs.
func startProxyConfig(t testing.TB, c proxy.Config, logs interface {
	io.Writer
	fmt.Stringer
}) (*proxy.Server, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c.Listen = ln.Addr().String()
	if c.HealTimeout == 0 {
		c.HealTimeout = 5 * time.Second
	}
	s, err := proxy.New(c, zerolog.New(logs).Level(zerolog.DebugLevel))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := s.Serve(ln); err != nil && !errors.Is(err, net.ErrClosed) {
			t.Logf("proxy Serve: %v", err)
		}
	}()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		_ = s.Shutdown(ctx)
		<-done
		checkNoUnsafeResends(t, s)
		if t.Failed() {
			t.Logf("mcpheal log (tail):\n%s", logs)
		}
	})
	return s, "http://" + ln.Addr().String() + "/mcp"
}

// checkNoUnsafeResends fails t if s sent a request that is not replay-safe
// again after it may have run.
func checkNoUnsafeResends(t testing.TB, s *proxy.Server) {
	t.Helper()
	if n := s.Stats().UnsafeResends; n != 0 {
		t.Errorf("INVARIANT: %d requests that are not replay-safe were sent again after they may have run", n)
	}
}

// proxyProcess is one mcpheal "process" served in-process on a fixed
// address, which kill ends as kill -9 ends a real one.
type proxyProcess struct {
	s    *proxy.Server
	ln   net.Listener
	addr string
	logs *tail
	done chan struct{}
	once sync.Once

	mu     sync.Mutex // protects conns, killed
	conns  []net.Conn // every agent connection accepted
	killed bool
}

// startProxyAt serves mcpheal in front of upstream on addr (host:port, the
// port fixed so that a restart can take it again) with the session key ring
// keys and, if given, a shared session store. Its log is shown if the test
// fails; cleanup kills it.
func startProxyAt(t testing.TB, addr, upstream, keys string, shared ...session.Shared) *proxyProcess {
	t.Helper()
	var ln net.Listener
	var err error
	for try := 0; try < 100; try++ { // the killed process's port may linger a moment
		if ln, err = net.Listen("tcp", addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	logs := &tail{max: 32 << 10}
	s, err := proxy.New(proxy.Config{
		Upstream:    upstream,
		Listen:      addr,
		HealTimeout: 5 * time.Second,
		SessionKeys: keys,
		AdminListen: "off",
		Shared:      sharedOrNil(shared),
	}, zerolog.New(logs).Level(zerolog.DebugLevel))
	if err != nil {
		_ = ln.Close()
		t.Fatal(err)
	}
	p := &proxyProcess{s: s, ln: ln, addr: addr, logs: logs, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		if err := s.Serve(&trackingListener{Listener: ln, p: p}); err != nil && !errors.Is(err, net.ErrClosed) {
			t.Logf("proxy Serve: %v", err)
		}
	}()
	t.Cleanup(func() {
		p.kill()
		checkNoUnsafeResends(t, s)
		if t.Failed() {
			t.Logf("mcpheal on %s, log (tail):\n%s", addr, logs.String())
		}
	})
	return p
}

func sharedOrNil(s []session.Shared) session.Shared {
	if len(s) == 0 {
		return nil
	}
	return s[0]
}

// url is the URL agents use.
func (p *proxyProcess) url() string { return "http://" + p.addr + "/mcp" }

// kill ends the process as kill -9 would: the listener closes, every agent
// connection it accepted is reset, and its upstream connections drop with
// no DELETE for any session. It returns once Serve has returned.
func (p *proxyProcess) kill() {
	p.once.Do(func() {
		_ = p.ln.Close()
		p.mu.Lock()
		p.killed = true
		for _, c := range p.conns {
			reset(c)
		}
		p.mu.Unlock()
		p.s.Close()
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
		}
	})
}

// trackingListener records the connections it accepts in p.
type trackingListener struct {
	net.Listener
	p *proxyProcess
}

func (l *trackingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.p.mu.Lock()
		l.p.conns = append(l.p.conns, c)
		if l.p.killed { // accepted as kill ran: the kernel would reset it too
			reset(c)
		}
		l.p.mu.Unlock()
	}
	return c, err
}

// reset closes c with an RST, as the kernel does for a killed process.
func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}
