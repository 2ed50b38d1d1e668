//go:build unix

package main

// First contact, with the real binary started as the README's quick start
// says: two processes on one host, the terminal that started one going
// away (SIGHUP), an upstream that is down at start and comes back, and
// GOMEMLIMIT set but empty.

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os/exec"
	"runtime/debug"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/rs/zerolog"

	"github.com/mcpheal/mcpheal/proxy"
)

// startupLine returns the fields of the binary's "mcpheal serving" log
// line, waiting for it.
func startupLine(t *testing.T, c *child) map[string]any {
	t.Helper()
	var fields map[string]any
	waitFor(t, "the start-up line", func() bool {
		for _, line := range strings.Split(c.stderr.String(), "\n") {
			if strings.Contains(line, `"mcpheal serving"`) && json.Unmarshal([]byte(line), &fields) == nil {
				return true
			}
		}
		return false
	})
	return fields
}

// getBody GETs url and returns its status and body.
func getBody(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// pairAddr returns a free fixed address whose next port is free too: an
// agent port and its derived admin port.
func pairAddr(t *testing.T) string {
	t.Helper()
	for range 100 {
		a := fixedAddr(t)
		if ln, err := net.Listen("tcp", nextPort(t, a)); err == nil {
			ln.Close()
			return a
		}
	}
	t.Fatal("no free pair of ports")
	return ""
}

// nextPort is addr with its port + 1.
func nextPort(t *testing.T, addr string) string {
	t.Helper()
	host, port, _ := net.SplitHostPort(addr)
	p, err := strconv.Atoi(port)
	if err != nil {
		t.Fatal(err)
	}
	return net.JoinHostPort(host, strconv.Itoa(p+1))
}

// TestTwoProcessesOneHost: two mcpheal processes started as the quick start
// says, `--upstream URL --listen ADDR` and nothing else, both serve, and
// each serves its metrics at its listen port + 1 (the default 8787 → 8788
// is the same rule). A second process whose derived admin port is taken
// (here by a listener of the test's; in the field, another process) serves
// anyway and names where its metrics went.
func TestTwoProcessesOneHost(t *testing.T) {
	t.Parallel()
	bin := buildBinary(t)
	up := startCountingServer(t)
	var addrs []string
	for len(addrs) < 3 {
		addrs = append(addrs, pairAddr(t))
	}
	for _, addr := range addrs[:2] {
		c := startChild(t, bin, addr, nil, "--upstream", up.URL, "--listen", addr, "--log-format", "json")
		fields := startupLine(t, c)
		want := "http://" + nextPort(t, addr) + "/metrics"
		if fields["metrics"] != want {
			t.Fatalf("process on %s: metrics at %v, want %s", addr, fields["metrics"], want)
		}
		if code, body := getBody(t, want); code != 200 || !strings.Contains(body, "mcpheal_sessions") {
			t.Fatalf("process on %s: GET %s: %d %.100q", addr, want, code, body)
		}
	}

	addr := addrs[2]
	taken, err := net.Listen("tcp", nextPort(t, addr))
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	c := startChild(t, bin, addr, nil, "--upstream", up.URL, "--listen", addr, "--log-format", "json")
	fields := startupLine(t, c)
	metrics, _ := fields["metrics"].(string)
	if metrics == "" || strings.Contains(metrics, nextPort(t, addr)) {
		t.Fatalf("with the derived admin port taken: metrics at %q; want another port, named", metrics)
	}
	if code, _ := getBody(t, metrics); code != 200 {
		t.Fatalf("GET %s: %d", metrics, code)
	}
	if !strings.Contains(c.stderr.String(), "is taken") {
		t.Fatalf("no warning that the derived admin port was taken:\n%s", c.stderr)
	}
}

// TestExplicitAdminTakenFails: an admin address the operator chose must be
// free; mcpheal does not move it.
func TestExplicitAdminTakenFails(t *testing.T) {
	t.Parallel()
	up := startCountingServer(t)
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	err = run(t.Context(), []string{"--upstream", up.URL, "--listen", freeAddr(t), "--admin-listen", taken.Addr().String()},
		io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "admin listen") {
		t.Fatalf("run with a taken --admin-listen = %v; want an admin listen error", err)
	}
}

// contactServer is a go-sdk server on 127.0.0.1 with a slow tool that
// holds its call until release is closed, counting initializes, slow calls
// and DELETEs.
type contactServer struct {
	url       string
	release   chan struct{}
	inits     atomic.Int64
	slowCalls atomic.Int64
	deletes   atomic.Int64
}

// startContactServer serves at addr ("" for any free port) until the test
// ends.
func startContactServer(t *testing.T, addr string) *contactServer {
	t.Helper()
	c := &contactServer{release: make(chan struct{})}
	srv := mcp.NewServer(&mcp.Implementation{Name: "contact", Version: "1"}, nil)
	mcp.AddTool(srv, &mcp.Tool{Name: "slow", Description: "answers once released"},
		func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
			c.slowCalls.Add(1)
			<-c.release
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "slow done"}}}, nil, nil
		})
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil)
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Method {
		case http.MethodDelete:
			c.deletes.Add(1)
		case http.MethodPost:
			body, _ := io.ReadAll(r.Body)
			if strings.Contains(string(body), `"method":"initialize"`) {
				c.inits.Add(1)
			}
			r.Body = io.NopCloser(strings.NewReader(string(body)))
		}
		h.ServeHTTP(w, r)
	})}
	go func() { _ = hs.Serve(ln) }()
	t.Cleanup(func() {
		select {
		case <-c.release:
		default:
			close(c.release)
		}
		_ = hs.Close()
	})
	c.url = "http://" + ln.Addr().String() + "/mcp"
	return c
}

const contactInit = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"contact","version":"1"}}}`

// postRPC POSTs one JSON-RPC message (with the session id, if any) and
// returns the status, the session id the answer names, and the body.
func postRPC(t *testing.T, url, sid, body string) (int, string, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if sid != "" {
		req.Header.Set("Mcp-Session-Id", sid)
		req.Header.Set("MCP-Protocol-Version", "2025-11-25")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Errorf("POST %s: %v", url, err)
		return 0, "", ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("Mcp-Session-Id"), string(b)
}

// initSession initializes an agent session through mcpheal at url.
func initSession(t *testing.T, url string) string {
	t.Helper()
	status, sid, body := postRPC(t, url, "", contactInit)
	if status != http.StatusOK || sid == "" {
		t.Fatalf("initialize: %d %s", status, body)
	}
	postRPC(t, url, sid, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	return sid
}

// TestSIGHUPWithoutConfigEndsGracefully: closing the terminal that ran
// `mcpheal --upstream URL` sends it SIGHUP. With no --config file to
// reload, mcpheal ends as for SIGTERM: the call in flight finishes, the
// upstream session is DELETEd, the process exits 0 and frees its ports.
func TestSIGHUPWithoutConfigEndsGracefully(t *testing.T) {
	t.Parallel()
	bin := buildBinary(t)
	up := startContactServer(t, "")
	addr := fixedAddr(t)
	c := startChild(t, bin, addr, nil, "--upstream", up.url, "--listen", addr, "--admin-listen", "off", "--log-format", "json")
	url := "http://" + addr + "/mcp"
	sid := initSession(t, url)
	done := make(chan string, 1)
	go func() {
		_, _, body := postRPC(t, url, sid, `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"slow","arguments":{}}}`)
		done <- body
	}()
	waitFor(t, "the slow call to reach the upstream", func() bool { return up.slowCalls.Load() == 1 })
	if err := c.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	// The shutdown has begun (its log line says so); the call is still in
	// flight.
	waitFor(t, "the shutdown to begin", func() bool {
		return strings.Contains(c.stderr.String(), "shutting down: finishing in-flight requests")
	})
	select {
	case <-c.exited:
		t.Fatalf("mcpheal exited before its call in flight finished:\n%s", c.stderr)
	default:
	}
	close(up.release)
	if body := <-done; !strings.Contains(body, `"slow done"`) {
		t.Fatalf("the call in flight got %q; want its answer", body)
	}
	select {
	case <-c.exited:
	case <-time.After(10 * time.Second):
		t.Fatalf("mcpheal still running 10 s after SIGHUP:\n%s", c.stderr)
	}
	if code := c.cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("exit code %d after SIGHUP; want 0:\n%s", code, c.stderr)
	}
	if up.deletes.Load() != 1 {
		t.Fatalf("%d upstream DELETEs; want the session's one", up.deletes.Load())
	}
	if ln, err := net.Listen("tcp", addr); err != nil {
		t.Fatalf("port %s still taken after exit: %v", addr, err)
	} else {
		ln.Close()
	}
}

// TestUpstreamDownAtStart: the upstream is down when mcpheal starts. One
// line at start says so; the first agent waits out its heal budget and
// gets docs/observability.md's 503 -32010 "upstream unreachable" (not "circuit
// breaker open" part-way, though the breaker opened meanwhile); once the
// upstream is back, the next agent is served at once, not after the
// breaker's cooldown.
func TestUpstreamDownAtStart(t *testing.T) {
	t.Parallel()
	bin := buildBinary(t)
	upAddr := fixedAddr(t)
	addr := fixedAddr(t)
	c := startChild(t, bin, addr, nil, "--upstream", "http://"+upAddr+"/mcp", "--listen", addr,
		"--admin-listen", "off", "--heal-timeout", "6s", "--log-format", "json")
	waitFor(t, "the start-up probe's line", func() bool {
		return strings.Contains(c.stderr.String(), "upstream unreachable at start")
	})
	if n := strings.Count(c.stderr.String(), "upstream unreachable at start"); n != 1 {
		t.Fatalf("%d start-up lines about the upstream; want 1:\n%s", n, c.stderr)
	}
	url := "http://" + addr + "/mcp"
	start := time.Now()
	status, _, body := postRPC(t, url, "", contactInit)
	took := time.Since(start)
	if status != http.StatusOK || !strings.Contains(body, "-32010") || !strings.Contains(body, "upstream unreachable") {
		t.Fatalf("first agent: %d %s; want 200 -32010 upstream unreachable", status, body)
	}
	if took < 5*time.Second {
		t.Fatalf("first agent answered after %v; want its heal budget of 6 s spent waiting", took)
	}
	up := startContactServer(t, upAddr)
	waitFor(t, "the outage watcher's line", func() bool { // it tries a connection every 100 ms
		return strings.Contains(c.stderr.String(), "upstream takes connections again")
	})
	start = time.Now()
	status, _, body = postRPC(t, url, "", contactInit)
	if status != http.StatusOK || time.Since(start) > 2*time.Second {
		t.Fatalf("agent after the upstream came back: %d %s after %v; want served at once", status, body, time.Since(start))
	}
	if up.inits.Load() < 1 {
		t.Fatal("the upstream saw no initialize")
	}
}

// TestEmptyGOMEMLIMITIsUnset: GOMEMLIMIT set but empty is unset to the Go
// runtime, so mcpheal sets its own memory limit, as when it is absent.
func TestEmptyGOMEMLIMITIsUnset(t *testing.T) {
	t.Setenv("GOMEMLIMIT", "")
	old := debug.SetMemoryLimit(-1)
	defer debug.SetMemoryLimit(old)
	setMemoryLimit([]proxy.Config{{MemoryBudget: 64 << 20}}, zerolog.Nop())
	if got, want := debug.SetMemoryLimit(-1), int64(64<<20+memoryHeadroom); got != want {
		t.Fatalf("memory limit with GOMEMLIMIT empty = %d; want %d (the budget plus headroom)", got, want)
	}
}

// TestListenPortZeroAnnouncesItsPort: with --listen 127.0.0.1:0 the
// start-up lines name the port the kernel gave, and it serves there.
func TestListenPortZeroAnnouncesItsPort(t *testing.T) {
	t.Parallel()
	up := startCountingServer(t)
	bin := buildBinary(t)
	c := &child{cmd: exec.Command(bin, "--upstream", up.URL, "--listen", "127.0.0.1:0", "--admin-listen", "off", "--log-format", "json"),
		stderr: &syncBuf{}, exited: make(chan struct{})}
	c.cmd.Stdout, c.cmd.Stderr = c.stderr, c.stderr
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = c.cmd.Wait(); close(c.exited) }()
	t.Cleanup(func() { c.kill(t) })
	fields := startupLine(t, c)
	listen, _ := fields["listen"].(string)
	if listen == "" || strings.HasSuffix(listen, ":0") {
		t.Fatalf("start-up line names %q; want the port it listens on", listen)
	}
	if st, body := getBody(t, listen+"/healthz"); st != 200 {
		t.Fatalf("GET %s/healthz: %d %s", listen, st, body)
	}
	if !strings.Contains(c.stderr.String(), `"agents use `+listen+`/mcp"`) {
		t.Errorf("the upstream's line does not name %s/mcp:\n%s", listen, c.stderr)
	}
}

// TestExportErrorsAreJSON: with traces sent to a collector that refuses
// connections, mcpheal says so in its own JSON log lines (the SDK's own
// handler printed plain text into a JSON log).
func TestExportErrorsAreJSON(t *testing.T) {
	t.Parallel()
	up := startCountingServer(t)
	bin := buildBinary(t)
	addr := fixedAddr(t)
	refused, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	collector := "http://" + refused.Addr().String()
	_ = refused.Close() // nothing listens there now: every export is refused
	c := startChild(t, bin, addr, []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + collector, "OTEL_BSP_SCHEDULE_DELAY=50",
		"OTEL_EXPORTER_OTLP_TIMEOUT=500"}, "--upstream", up.URL, "--listen", addr, "--admin-listen", "off", "--log-format", "json")
	initSession(t, "http://"+addr+"/mcp") // spans to export
	waitFor(t, "the export error's log line", func() bool { return strings.Contains(c.stderr.String(), "traces: export failed") })
	for _, line := range strings.Split(strings.TrimSpace(c.stderr.String()), "\n") {
		var fields map[string]any
		if err := json.Unmarshal([]byte(line), &fields); err != nil {
			t.Errorf("a log line is not JSON: %q", line)
		}
	}
}
