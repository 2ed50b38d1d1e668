//go:build unix

package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/mcpheal/mcpheal/session/redisstore/redistest"
)

// countingServer is a stateful go-sdk streamable HTTP server on 127.0.0.1
// that counts the initializes it receives and the runs of its echo tool.
type countingServer struct {
	URL   string
	inits atomic.Int64
	calls atomic.Int64
}

func startCountingServer(t *testing.T) *countingServer {
	t.Helper()
	c := &countingServer{}
	srv := mcp.NewServer(&mcp.Implementation{Name: "restart-upstream", Version: "1.0.0"}, nil)
	mcp.AddTool(srv, &mcp.Tool{Name: "echo", Description: "returns text"},
		func(_ context.Context, _ *mcp.CallToolRequest, in echoIn) (*mcp.CallToolResult, any, error) {
			c.calls.Add(1)
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: in.Text}}}, nil, nil
		})
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil)
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			body, err := io.ReadAll(r.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			var msg struct{ Method string }
			if json.Unmarshal(body, &msg) == nil && msg.Method == "initialize" {
				c.inits.Add(1)
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
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
	c.URL = hs.URL + "/mcp"
	return c
}

// buildBinary builds mcpheal into a temporary directory.
func buildBinary(t *testing.T) string {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("go is not on PATH: %v", err)
	}
	bin := filepath.Join(t.TempDir(), "mcpheal")
	if out, err := exec.Command(goTool, "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// fixedAddr returns a free 127.0.0.1 address whose port is below Linux's
// default ephemeral range (32768-60999), so that no outgoing connection can
// take it while the process that listened there is being replaced.
func fixedAddr(t *testing.T) string {
	t.Helper()
	for range 100 {
		n, err := rand.Int(rand.Reader, big.NewInt(10000))
		if err != nil {
			t.Fatal(err)
		}
		addr := "127.0.0.1:" + strconv.Itoa(20000+int(n.Int64()))
		if ln, err := net.Listen("tcp", addr); err == nil {
			_ = ln.Close()
			return addr
		}
	}
	t.Fatal("no free port in 20000-29999")
	return ""
}

// child is one mcpheal process.
type child struct {
	cmd    *exec.Cmd
	stderr *syncBuf
	exited chan struct{}
}

// startChild runs bin with args and env, and waits until it answers /healthz
// on addr. Cleanup kills it.
func startChild(t *testing.T, bin, addr string, env []string, args ...string) *child {
	t.Helper()
	c := &child{cmd: exec.Command(bin, args...), stderr: &syncBuf{}, exited: make(chan struct{})}
	c.cmd.Env = append(os.Environ(), env...)
	c.cmd.Stdout = c.stderr
	c.cmd.Stderr = c.stderr
	if err := c.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	go func() {
		_ = c.cmd.Wait()
		close(c.exited)
	}()
	t.Cleanup(func() {
		c.kill(t)
		if t.Failed() {
			t.Logf("mcpheal (pid %d) output:\n%s", c.cmd.Process.Pid, c.stderr)
		}
	})
	deadline := time.Now().Add(5 * time.Second)
	for {
		select {
		case <-c.exited:
			t.Fatalf("mcpheal exited at start (%v):\n%s", c.cmd.ProcessState, c.stderr)
		default:
		}
		if resp, err := http.Get("http://" + addr + "/healthz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return c
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("mcpheal did not answer /healthz on %s within 5 s:\n%s", addr, c.stderr)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// kill sends SIGKILL and waits until the process is gone.
func (c *child) kill(t *testing.T) {
	t.Helper()
	select {
	case <-c.exited:
		return
	default:
	}
	_ = c.cmd.Process.Kill()
	select {
	case <-c.exited:
	case <-time.After(5 * time.Second):
		t.Errorf("mcpheal (pid %d) still running 5 s after SIGKILL", c.cmd.Process.Pid)
	}
}

// TestBinaryRestartHealsFromID (docs/deployment.md "Sessions that outlive mcpheal"):
// the real binary, given MCPHEAL_SESSION_KEYS, is SIGKILLed between two
// calls of an official go-sdk client and started again on the same port with
// the same environment. The client's next call succeeds on the session id it
// holds, after exactly one new upstream initialize; each call ran the tool
// once.
func TestBinaryRestartHealsFromID(t *testing.T) {
	bin := buildBinary(t)
	up := startCountingServer(t)
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		t.Fatal(err)
	}
	env := []string{"MCPHEAL_SESSION_KEYS=1:" + base64.StdEncoding.EncodeToString(key)}
	addr := fixedAddr(t)
	args := []string{"--upstream", up.URL, "--listen", addr, "--admin-listen", "off", "--log-format", "json"}
	first := startChild(t, bin, addr, env, args...)

	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
	defer cancel()
	client := mcp.NewClient(&mcp.Implementation{Name: "restart-main-test", Version: "1"}, nil)
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: "http://" + addr + "/mcp", HTTPClient: &http.Client{Transport: tr}}, sessionEra)
	if err != nil {
		t.Fatalf("connect through mcpheal: %v", err)
	}
	defer cs.Close()
	call := func(text string) {
		t.Helper()
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"text": text}})
		if err != nil {
			t.Fatalf("echo(%q) through mcpheal: %v", text, err)
		}
		if res.IsError || len(res.Content) != 1 {
			t.Fatalf("echo(%q): isError %v, %d contents", text, res.IsError, len(res.Content))
		}
		if got, _ := res.Content[0].(*mcp.TextContent); got == nil || got.Text != text {
			t.Fatalf("echo(%q) = %+v", text, res.Content[0])
		}
	}

	call("before")
	if n := up.inits.Load(); n != 1 {
		t.Fatalf("%d upstream initializes before the restart, want 1", n)
	}
	first.kill(t)
	startChild(t, bin, addr, env, args...)
	call("after the restart")
	if n := up.inits.Load() - 1; n != 1 {
		t.Errorf("%d upstream initializes after the restart, want exactly 1 (one heal)", n)
	}
	call("and again") // the healed session is a live one now
	if n := up.inits.Load() - 1; n != 1 {
		t.Errorf("%d upstream initializes after the restart, want still 1", n)
	}
	if n := up.calls.Load(); n != 3 {
		t.Errorf("echo ran %d times for 3 calls, want 3", n)
	}
}

// sessionEra pins a go-sdk client to the session era: left to itself it
// asks server/discover first and, through mcpheal, speaks MCP 2026-07-28
// on a held session (TestBinaryRestartWithRedisHeld covers that route).
var sessionEra = &mcp.ClientSessionOptions{ProtocolVersion: "2025-11-25"}

// TestBinaryRestartWithRedis: with --session-store redis (a real
// redis-server that requires a password, given as MCPHEAL_REDIS_PASSWORD),
// the SIGKILLed binary's successor adopts the live upstream session from
// the store: the client's next call costs no upstream initialize at all.
func TestBinaryRestartWithRedis(t *testing.T) { restartWithRedis(t, sessionEra) }

// TestBinaryRestartWithRedisHeld: the same for a 2026-07-28 agent (a
// go-sdk 1.8 client as it comes), which holds no session: the successor
// takes over the upstream session mcpheal held for it.
func TestBinaryRestartWithRedisHeld(t *testing.T) { restartWithRedis(t, nil) }

func restartWithRedis(t *testing.T, era *mcp.ClientSessionOptions) {
	rs := redistest.Start(t, "--requirepass", "s3cret-pw")
	bin := buildBinary(t)
	up := startCountingServer(t)
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		t.Fatal(err)
	}
	env := []string{"MCPHEAL_SESSION_KEYS=1:" + base64.StdEncoding.EncodeToString(key), "MCPHEAL_REDIS_PASSWORD=s3cret-pw"}
	addr := fixedAddr(t)
	args := []string{"--upstream", up.URL, "--listen", addr, "--admin-listen", "off", "--log-format", "json",
		"--session-store", "redis", "--redis-addr", rs.Addr}
	first := startChild(t, bin, addr, env, args...)

	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
	defer cancel()
	client := mcp.NewClient(&mcp.Implementation{Name: "restart-main-test", Version: "1"}, nil)
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: "http://" + addr + "/mcp", HTTPClient: &http.Client{Transport: tr}}, era)
	if err != nil {
		t.Fatalf("connect through mcpheal: %v", err)
	}
	defer cs.Close()
	if held := cs.ID() == ""; held != (era == nil) {
		t.Fatalf("session id %q: the client did not speak the era it was meant to", cs.ID())
	}
	call := func(text string) {
		t.Helper()
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"text": text}})
		if err != nil {
			t.Fatalf("echo(%q) through mcpheal: %v", text, err)
		}
		if got, _ := res.Content[0].(*mcp.TextContent); got == nil || got.Text != text {
			t.Fatalf("echo(%q) = %+v", text, res.Content[0])
		}
	}
	call("before")
	first.kill(t)
	second := startChild(t, bin, addr, env, args...)
	call("after the restart")
	call("and again")
	if n := up.inits.Load(); n != 1 {
		t.Errorf("%d upstream initializes, want 1: the restarted process adopts the session from Redis", n)
	}
	if n := up.calls.Load(); n != 3 {
		t.Errorf("echo ran %d times for 3 calls, want 3", n)
	}
	if out := second.stderr.String(); bytes.Contains([]byte(out), []byte("session store call failed")) {
		t.Errorf("the store failed (password not used?):\n%s", out)
	}
}

// TestBinarySysmonAwake (docs/performance.md "Performance"): the real binary runs with
// the GODEBUG it was started with, as the same process (nothing re-executes
// it to change it), and its start-up line says whether that keeps the
// runtime's sysmon awake.
func TestBinarySysmonAwake(t *testing.T) {
	bin := buildBinary(t)
	up := startCountingServer(t)
	for _, c := range []struct {
		godebug string
		awake   bool
	}{
		{shippedGODEBUG, true}, // as the image and the Kubernetes examples set it
		{"http2client=0", false},
		{"", false},
	} {
		t.Setenv("GODEBUG", c.godebug)
		addr := fixedAddr(t)
		ch := startChild(t, bin, addr, nil, "--upstream", up.URL, "--listen", addr, "--admin-listen", "off", "--log-format", "json")
		if runtime.GOOS == "linux" {
			env, err := os.ReadFile("/proc/" + strconv.Itoa(ch.cmd.Process.Pid) + "/environ")
			if err != nil {
				t.Fatal(err)
			}
			godebug := slices.DeleteFunc(strings.Split(string(env), "\x00"), func(kv string) bool {
				return !strings.HasPrefix(kv, "GODEBUG=")
			})
			if !slices.Equal(godebug, []string{"GODEBUG=" + c.godebug}) {
				t.Errorf("GODEBUG %q: process %d runs with %q", c.godebug, ch.cmd.Process.Pid, godebug)
			}
		}
		if want := `"sysmon_awake":` + strconv.FormatBool(c.awake); !strings.Contains(ch.stderr.String(), want) {
			t.Errorf("GODEBUG %q: start-up log has no %s:\n%s", c.godebug, want, ch.stderr)
		}
		ch.kill(t)
	}
}
