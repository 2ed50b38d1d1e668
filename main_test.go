package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// mcpServer is a real go-sdk MCP server on 127.0.0.1 with an echo tool
// that counts its calls.
type mcpServer struct {
	URL     string
	calls   atomic.Int64
	xTested atomic.Int64 // requests that carried an X-Test header
}

type echoIn struct {
	Text string `json:"text"`
}

func startMCPServer(t *testing.T, name string) *mcpServer {
	t.Helper()
	m := &mcpServer{}
	srv := mcp.NewServer(&mcp.Implementation{Name: name, Version: "1.0.0"}, nil)
	mcp.AddTool(srv, &mcp.Tool{Name: "echo", Description: "returns text"},
		func(_ context.Context, _ *mcp.CallToolRequest, in echoIn) (*mcp.CallToolResult, any, error) {
			m.calls.Add(1)
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: name + ":" + in.Text}}}, nil, nil
		})
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil)
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Test") != "" {
			m.xTested.Add(1)
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(func() {
		for ss := range srv.Sessions() {
			_ = ss.Close()
		}
		hs.CloseClientConnections()
		hs.Close()
	})
	m.URL = hs.URL + "/mcp"
	return m
}

// echo connects a go-sdk client to url, calls echo once and closes.
func echo(t *testing.T, url, text string) (string, error) {
	t.Helper()
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c := mcp.NewClient(&mcp.Implementation{Name: "main-test", Version: "1"}, nil)
	cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: &http.Client{Transport: tr}}, nil)
	if err != nil {
		return "", err
	}
	defer cs.Close()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"text": text}})
	if err != nil {
		return "", err
	}
	if len(res.Content) != 1 {
		return "", fmt.Errorf("%d contents", len(res.Content))
	}
	return res.Content[0].(*mcp.TextContent).Text, nil
}

// syncBuf is a goroutine-safe log sink.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// startRun runs the proxy command with args until the test ends, waits for
// /healthz, and checks that it then stops cleanly. Without --admin-listen in
// args the admin listener takes a free port, not the shared default.
func startRun(t *testing.T, addr string, args ...string) *syncBuf {
	t.Helper()
	if !slices.Contains(args, "--admin-listen") {
		args = append(args, "--admin-listen", freeAddr(t))
	}
	logs := &syncBuf{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, append(args, "--listen", addr, "--log-format", "json"), io.Discard, logs) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("run returned %v after cancel, want nil", err)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("run did not stop within 10s")
		}
		if t.Failed() {
			t.Logf("proxy log:\n%s", logs)
		}
	})
	waitFor(t, "proxy /healthz", func() bool {
		select {
		case err := <-done:
			t.Fatalf("run ended early: %v\n%s", err, logs)
		default:
		}
		resp, err := http.Get("http://" + addr + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return logs
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestRunUpstreamAlone: `mcpheal --upstream URL` works as it always has: one
// upstream at /mcp, the agent URL logged at start, a clean stop.
func TestRunUpstreamAlone(t *testing.T) {
	up := startMCPServer(t, "one")
	addr := freeAddr(t)
	logs := startRun(t, addr, "--upstream", up.URL)
	got, err := echo(t, "http://"+addr+"/mcp", "hi")
	if err != nil || got != "one:hi" {
		t.Fatalf("echo through the proxy = %q, %v; want one:hi", got, err)
	}
	for _, want := range []string{`"message":"mcpheal serving"`, `"message":"agents use http://` + addr + `/mcp"`, `"upstream":"default"`} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("startup log lacks %s:\n%s", want, logs)
		}
	}
}

// TestRunConfigReload: two upstreams routed by path in one process; SIGHUP
// adds an upstream from the edited file; a bad file is rejected and the
// running configuration keeps serving.
func TestRunConfigReload(t *testing.T) {
	a, b := startMCPServer(t, "a"), startMCPServer(t, "b")
	cfg := filepath.Join(t.TempDir(), "mcpheal.yaml")
	writeFile(t, cfg, "upstreams:\n  a: {url: "+a.URL+"}\n")
	addr := freeAddr(t)
	logs := startRun(t, addr, "--config", cfg)
	base := "http://" + addr

	if got, err := echo(t, base+"/a/mcp", "1"); err != nil || got != "a:1" {
		t.Fatalf("echo /a/mcp = %q, %v", got, err)
	}
	if _, err := echo(t, base+"/b/mcp", "1"); err == nil {
		t.Fatal("/b/mcp answered before it was configured")
	}

	writeFile(t, cfg, "upstreams:\n  a: {url: "+a.URL+"}\n  b: {url: "+b.URL+"}\n")
	if err := syscall.Kill(syscall.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "/b/mcp after SIGHUP", func() bool {
		got, err := echo(t, base+"/b/mcp", "2")
		return err == nil && got == "b:2"
	})
	if got, err := echo(t, base+"/a/mcp", "3"); err != nil || got != "a:3" {
		t.Fatalf("echo /a/mcp after reload = %q, %v", got, err)
	}

	writeFile(t, cfg, "upstreams:\n  a: {url: "+a.URL+", heal_timeout: 15}\n")
	if err := syscall.Kill(syscall.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the rejected reload in the log", func() bool {
		return strings.Contains(logs.String(), "config reload rejected")
	})
	if !strings.Contains(logs.String(), cfg+":2: upstreams.a.heal_timeout: bad duration") {
		t.Errorf("rejection does not name file, line and key:\n%s", logs)
	}
	if got, err := echo(t, base+"/b/mcp", "4"); err != nil || got != "b:4" {
		t.Errorf("/b/mcp after a rejected reload = %q, %v; want the old config serving", got, err)
	}
	if a.calls.Load() != 2 || b.calls.Load() < 2 {
		t.Errorf("tool calls a=%d b=%d, want 2 and ≥2: each path reaches its own upstream", a.calls.Load(), b.calls.Load())
	}
}

// TestRunAdminListener: /metrics and /readyz are served on --admin-listen
// only, with readiness details there; the agent listener answers /healthz
// with "ok" and nothing else, whatever the Host; `mcpheal healthcheck`
// keeps working against it; an empty --admin-listen turns it off.
func TestRunAdminListener(t *testing.T) {
	up := startMCPServer(t, "adm")
	addr, admin := freeAddr(t), freeAddr(t)
	logs := startRun(t, addr, "--upstream", up.URL, "--admin-listen", admin)
	get := func(url, host string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		if host != "" {
			req.Host = host
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get("http://"+admin+"/metrics", ""); code != 200 || !strings.Contains(body, "mcpheal_sessions") {
		t.Errorf("admin /metrics: %d %.200q", code, body)
	}
	if code, body := get("http://"+admin+"/readyz", ""); code != 200 {
		t.Errorf("admin /readyz: %d %q", code, body)
	}
	for _, path := range []string{"/metrics", "/readyz"} {
		if code, body := get("http://"+addr+path, ""); code != 404 {
			t.Errorf("agent listener %s: %d %.200q, want 404", path, code, body)
		}
	}
	if code, body := get("http://"+addr+"/healthz", "evil.example"); code != 200 || body != "ok\n" {
		t.Errorf("agent /healthz: %d %q, want 200 ok", code, body)
	}
	if code := cli(context.Background(), []string{"healthcheck", "http://" + addr + "/healthz"}, io.Discard, io.Discard); code != 0 {
		t.Errorf("healthcheck: exit %d", code)
	}
	if !strings.Contains(logs.String(), `"metrics":"http://`+admin+`/metrics"`) {
		t.Errorf("startup log does not name the metrics URL:\n%s", logs)
	}

	off := freeAddr(t)
	logs = startRun(t, off, "--upstream", up.URL, "--admin-listen", "")
	if !strings.Contains(logs.String(), `"admin":"off"`) {
		t.Errorf("--admin-listen '' did not turn the admin listener off:\n%s", logs)
	}
}

// TestCheckConfigCLI: --check-config exits 0 for a good file (printing the
// agent URLs) and 1 for a bad one (printing file:line: key).
func TestCheckConfigCLI(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	good, bad := filepath.Join(dir, "good.yaml"), filepath.Join(dir, "bad.yaml")
	writeFile(t, good, "listen: 0.0.0.0:8787\ninsecure_listen: true\nupstreams:\n  wp: {url: https://mcp.example.com/mcp}\n")
	writeFile(t, bad, "upstreams:\n  wp: {url: https://mcp.example.com/mcp, keepalive: soon}\n")
	var out, errb bytes.Buffer
	if code := cli(context.Background(), []string{"--check-config", good}, &out, &errb); code != 0 {
		t.Errorf("check good file: exit %d, stderr %s", code, errb.String())
	}
	if !strings.Contains(out.String(), "http://127.0.0.1:8787/wp/mcp → https://mcp.example.com/mcp") {
		t.Errorf("check output lacks the agent URL:\n%s", out.String())
	}
	out.Reset()
	errb.Reset()
	if code := cli(context.Background(), []string{"--check-config", bad}, &out, &errb); code != 1 {
		t.Errorf("check bad file: exit %d, want 1", code)
	}
	if !strings.Contains(errb.String(), bad+":2: upstreams.wp.keepalive: bad duration \"soon\"") {
		t.Errorf("check bad file stderr:\n%s", errb.String())
	}
}

// TestHealthcheckCLI: `mcpheal healthcheck URL` exits 0 against a serving
// proxy and 1 when nothing listens.
func TestHealthcheckCLI(t *testing.T) {
	up := startMCPServer(t, "h")
	addr := freeAddr(t)
	startRun(t, addr, "--upstream", up.URL)
	if code := cli(context.Background(), []string{"healthcheck", "http://" + addr + "/healthz"}, io.Discard, io.Discard); code != 0 {
		t.Errorf("healthcheck of a serving proxy: exit %d, want 0", code)
	}
	if code := cli(context.Background(), []string{"healthcheck", "http://" + freeAddr(t) + "/healthz"}, io.Discard, io.Discard); code != 1 {
		t.Errorf("healthcheck with nothing listening: exit %d, want 1", code)
	}
}

// TestDoctorCLI: `mcpheal doctor URL -H …` sends the header, prints the
// report and exits 0 for a healable server; a usage mistake exits 2.
func TestDoctorCLI(t *testing.T) {
	t.Parallel()
	up := startMCPServer(t, "d")
	var out, errb bytes.Buffer
	if code := cli(context.Background(), []string{"doctor", up.URL, "-H", "X-Test: 1"}, &out, &errb); code != 0 {
		t.Errorf("doctor: exit %d, stderr %s", code, errb.String())
	}
	if !strings.Contains(out.String(), "verdict: healable") || !strings.Contains(out.String(), "→ SessionGone") {
		t.Errorf("doctor report:\n%s", out.String())
	}
	if up.xTested.Load() == 0 {
		t.Error("the -H header never reached the server")
	}
	if code := cli(context.Background(), []string{"doctor"}, io.Discard, io.Discard); code != 2 {
		t.Errorf("doctor without URL: exit %d, want 2", code)
	}
}

// TestLoginCLI: `mcpheal login` needs a token file and one URL; against a
// server that asks for no login it says so and writes nothing. The full
// login runs against a real authorization server in proxy/interop.
func TestLoginCLI(t *testing.T) {
	t.Parallel()
	var errb bytes.Buffer
	if code := cli(context.Background(), []string{"login", "http://127.0.0.1:1/mcp"}, io.Discard, &errb); code != 2 ||
		!strings.Contains(errb.String(), "-token-file") {
		t.Errorf("login without -token-file: exit %d, %s", code, errb.String())
	}
	up := startCountingServer(t)
	file := filepath.Join(t.TempDir(), "login.json")
	errb.Reset()
	if code := cli(context.Background(), []string{"login", "-token-file", file, up.URL}, io.Discard, &errb); code != 2 ||
		!strings.Contains(errb.String(), "nothing to log in to") {
		t.Errorf("login to a server without OAuth: exit %d, %s", code, errb.String())
	}
	if _, err := os.Stat(file); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a token file was written: %v", err)
	}
	// --upstream-login makes the login the upstream's credential.
	o := &options{upstream: up.URL, listen: "127.0.0.1:0", loginFile: file, set: map[string]bool{}}
	creds := newCredCache()
	defer creds.Close()
	rc, err := resolve(o, func(string) (string, bool) { return "", false }, creds)
	if err != nil || rc.ups[0].Credentials == nil {
		t.Fatalf("--upstream-login: %v, credentials %v", err, rc.ups[0].Credentials)
	}
}

// TestBinaryLinksNoGRPC keeps the binary small (docs/observability.md "Traces"): neither
// gRPC nor html/template (whose reflection turns off the linker's removal
// of unused methods for the whole program) nor golang.org/x/net/trace may
// be linked again; OTLP goes over HTTP through proxy/telemetry's own
// exporter. With them the binary was 40.9 MB, without 21.3 MB.
func TestBinaryLinksNoGRPC(t *testing.T) {
	t.Parallel()
	gobin, err := exec.LookPath("go")
	if err != nil {
		gobin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	out, err := exec.Command(gobin, "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	for _, p := range strings.Fields(string(out)) {
		if strings.HasPrefix(p, "google.golang.org/grpc") || p == "html/template" || p == "golang.org/x/net/trace" {
			t.Errorf("the binary links %s", p)
		}
	}
}
