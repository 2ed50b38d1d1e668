//go:build unix

package interop

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The Python MCP stack, run as processes from testdata/python: two pinned
// virtual environments (setup.sh builds them from the hash-locked hermes.txt
// and sdk.txt), the servers of server.py and the line-driven agents of
// client.py and hermes_client.py, which answer the commands of client.mjs.

// pyDir is the absolute path of testdata/python.
var pyDir string

// pyFlavours are the Python agents, each a flavour of newAgent:
//   - hermes: Hermes Agent 0.19.0's own MCP client (mcp 1.26.0 under it),
//     driven through its tool registry as its agent loop drives it
//     (hermes_client.py);
//   - py-sdk: the mcp 2.3 SDK's ClientSession over streamable_http_client,
//     one session, no reconnect of its own;
//   - py-client-auto: mcp 2.3's mcp.Client, mode "auto" (2026-07-28 where
//     the server speaks it);
//   - py-client-legacy: mcp.Client, mode "legacy" (initialize);
//   - fastmcp-py: FastMCP 4.1.6's fastmcp.Client (mode "auto" too).
var pyFlavours = []string{"hermes", "py-sdk", "py-client-auto", "py-client-legacy", "fastmcp-py"}

const (
	// pyCallTimeout is every Python agent's own request timeout: Hermes'
	// timeout: 30 in its mcp_servers entry, the SDK clients' 30 s.
	pyCallTimeout = 30 * time.Second
	// pyOpTimeout bounds the wait for a Python agent's answer. A Hermes call
	// can time out, ask for a reconnect (it waits up to 15 s for one) and
	// time out again on the retry: a hang is a slow error, never a stuck
	// test.
	pyOpTimeout = 2*pyCallTimeout + 20*time.Second
)

// setupPython builds the two Python environments of dir (testdata/python)
// with its setup.sh when a venv is missing or was built from another lock
// file. Without python3.11 it fails: these tests are never skipped.
func setupPython(dir string) error {
	pyDir = dir
	if _, err := exec.LookPath("python3.11"); err != nil {
		return fmt.Errorf("python3.11 is needed to run the Python MCP clients and servers in %s: %w", dir, err)
	}
	why := pyStale(dir)
	if why == "" {
		return nil
	}
	fmt.Fprintf(os.Stderr, "proxy/interop: %s: running %s\n", why, filepath.Join(dir, "setup.sh"))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(dir, "setup.sh"))
	cmd.Dir = dir
	cmd.Stdout = os.Stderr
	cmd.Stderr = os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s/setup.sh failed (%w): the interop tests need the Python packages pinned in hermes.txt and sdk.txt", dir, err)
	}
	if why := pyStale(dir); why != "" {
		return fmt.Errorf("after %s/setup.sh: %s", dir, why)
	}
	return nil
}

// pyStale says why a venv of dir does not match its lock file, or "".
func pyStale(dir string) string {
	for _, env := range []string{"hermes", "sdk"} {
		lock, err := os.ReadFile(filepath.Join(dir, env+".txt"))
		if err != nil {
			return err.Error()
		}
		sum := sha256.Sum256(lock)
		have, err := os.ReadFile(filepath.Join(dir, ".venv", env, "lock.sha256"))
		if err != nil {
			return fmt.Sprintf(".venv/%s is missing", env)
		}
		if strings.TrimSpace(string(have)) != hex.EncodeToString(sum[:]) {
			return fmt.Sprintf(".venv/%s was built from another %s.txt", env, env)
		}
		if _, err := os.Stat(pyPython(env)); err != nil {
			return fmt.Sprintf(".venv/%s has no python: %v", env, err)
		}
	}
	return ""
}

// pyPython is the interpreter of the venv env ("hermes" or "sdk").
func pyPython(env string) string { return filepath.Join(pyDir, ".venv", env, "bin", "python") }

// The Python servers (server.py).
const (
	pyFastMCP   = "fastmcp"   // FastMCP 4.1.6
	pyMCPServer = "mcpserver" // the mcp 2.3 SDK's MCPServer
)

// pyServerOpts shapes one testdata/python/server.py.
type pyServerOpts struct {
	// impl is pyFastMCP or pyMCPServer.
	impl string
	// json answers every POST as one JSON body instead of an SSE stream.
	json bool
	// eventStore keeps each stream's events: answer streams carry event
	// ids, and a GET with Last-Event-ID resumes one.
	eventStore bool
	// idleTimeout is the SDK's session_idle_timeout; zero keeps its default
	// (1800 s).
	idleTimeout time.Duration
	// maxSessions is the SDK's max_sessions; zero keeps its default.
	maxSessions int
	// countFile, if set, receives one line "<tag> <pid>" per execution of
	// the write and slow_write tools (runs counts them).
	countFile string
	// restartable picks a fixed port below the ephemeral range (as v1Opts
	// does), so that restart can take it again.
	restartable bool
	// instructions is the size of the initialize answer's instructions in
	// bytes; zero means 600.
	instructions int
	// slowInitialize holds every initialize that long before the server
	// serves it, as a server busy at start does.
	slowInitialize time.Duration
	// stateTools adds the tools remember and recall, which keep a value per
	// session (server.py STATE_TOOLS).
	stateTools bool
}

// startPyServer runs testdata/python/server.py on 127.0.0.1 and waits until
// it listens. The result is a server like the node ones: url, restart (a
// SIGKILL, then the same port), proc.kill, and proc.out, whose lines are the
// server's signals (see server.py): "INITIALIZE <clientInfo.name>",
// "DISCOVER", "CALL <tool>", "STARTED <tool> <tag>", "WROTE <tag>",
// "ELICITED <action>".
func startPyServer(t testing.TB, o pyServerOpts) *server {
	t.Helper()
	if o.impl != pyFastMCP && o.impl != pyMCPServer {
		t.Fatalf("startPyServer: impl %q, want %q or %q", o.impl, pyFastMCP, pyMCPServer)
	}
	env := []string{"COUNT_FILE=" + o.countFile}
	if o.json {
		env = append(env, "JSON_RESPONSE=1")
	}
	if o.eventStore {
		env = append(env, "EVENT_STORE=1")
	}
	if o.idleTimeout > 0 {
		env = append(env, "SESSION_IDLE_TIMEOUT="+strconv.FormatFloat(o.idleTimeout.Seconds(), 'f', -1, 64))
	}
	if o.maxSessions > 0 {
		env = append(env, "MAX_SESSIONS="+strconv.Itoa(o.maxSessions))
	}
	if o.instructions > 0 {
		env = append(env, "INSTRUCTIONS_BYTES="+strconv.Itoa(o.instructions))
	}
	if o.slowInitialize > 0 {
		env = append(env, "SLOW_INITIALIZE_MS="+strconv.FormatInt(o.slowInitialize.Milliseconds(), 10))
	}
	if o.stateTools {
		env = append(env, "STATE_TOOLS=1")
	}
	name := o.impl + "-py"
	s := &server{t: t, name: name}
	s.launch = func(port int) *nodeProc {
		return startProcess(t, name, pyDir, append(env, "PORT="+strconv.Itoa(port)), pyPython("sdk"), "server.py", o.impl)
	}
	port := 0
	if o.restartable {
		port = freeFixedPort(t)
	}
	s.start(port)
	return s
}

// startHermes starts hermes_client.py for url: Hermes' MCP client with a
// fresh HERMES_HOME whose config.yaml names the server "interop". Hermes
// sends the mcp SDK's default clientInfo name ("mcp"), not name. Its calls
// answer like the other agents' (result); Raw is the string Hermes hands
// its model, and a failure's Kind is "hermes-error" when Hermes answered
// the model with an error, its Message what the model reads.
func startHermes(t testing.TB, url, name string) *sdkClient {
	t.Helper()
	env := []string{
		"HERMES_HOME=" + t.TempDir(),
		"SERVER_NAME=interop",
		"CALL_TIMEOUT_S=" + strconv.Itoa(int(pyCallTimeout.Seconds())),
	}
	p := startProcess(t, "hermes "+name, pyDir, env, pyPython("hermes"), "hermes_client.py", url)
	return &sdkClient{t: t, p: p, timeout: pyOpTimeout}
}

// pyClientKinds maps the SDK flavours to client.py's names for them.
var pyClientKinds = map[string]string{
	"py-sdk":           "sdk",
	"py-client-auto":   "client-auto",
	"py-client-legacy": "client-legacy",
	"fastmcp-py":       "fastmcp",
}

// startPyClient starts client.py as flavour (one of pyClientKinds) for url,
// with name as its clientInfo name.
func startPyClient(t testing.TB, flavour, url, name string) *sdkClient {
	t.Helper()
	kind, ok := pyClientKinds[flavour]
	if !ok {
		t.Fatalf("startPyClient: unknown flavour %q", flavour)
	}
	env := []string{
		"CLIENT_NAME=" + name,
		"CALL_TIMEOUT_S=" + strconv.Itoa(int(pyCallTimeout.Seconds())),
	}
	p := startProcess(t, flavour+" "+name, pyDir, env, pyPython("sdk"), "client.py", kind, url)
	return &sdkClient{t: t, p: p, timeout: pyOpTimeout}
}

// pyModern says whether a Python flavour speaks 2026-07-28 to a server that
// offers it (no session, no server-initiated requests or notifications
// outside a request's own stream).
func pyModern(flavour string) bool { return flavour == "py-client-auto" || flavour == "fastmcp-py" }

// hermesClientName is the clientInfo name Hermes sends: the mcp SDK's
// default.
const hermesClientName = "mcp"

// pyClientInfoName is the clientInfo name a server sees from a Python agent
// that newAgent started with name.
func pyClientInfoName(flavour, name string) string {
	if flavour == "hermes" {
		return hermesClientName
	}
	return name
}

// linesWithPrefix counts the lines of p's stdout that start with prefix.
func linesWithPrefix(p *nodeProc, prefix string) int {
	return p.out.count(func(l string) bool { return strings.HasPrefix(l, prefix) })
}

// waitEvent asks a Python agent to wait until its count of event (see
// client.py and hermes_client.py: toolsChanged, toolsRefreshed, reconnects,
// logs) reaches n, for at most d.
func waitEvent(a agent, event string, n int, d time.Duration) result {
	return a.(*sdkClient).do(map[string]any{"op": "waitEvent", "event": event, "count": n, "timeoutMs": d.Milliseconds()})
}

// events asks a Python agent for its event counts.
func events(a agent) result { return a.(*sdkClient).do(map[string]any{"op": "events"}) }
