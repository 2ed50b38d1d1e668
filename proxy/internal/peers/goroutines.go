package peers

import (
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

// leakWait bounds how long goroutines may take to finish once a test's
// cleanups have run.
const leakWait = 5 * time.Second

// leakIgnored names goroutines that outlive a test by fasthttp's design, not
// a leak of ours: the process-wide Date header ticker, started once by the
// first fasthttp.Server; and a stopped server's idle-worker cleaner, which
// sleeps up to MaxIdleWorkerDuration (10 s) before it sees the stop.
var leakIgnored = []string{
	"fasthttp.updateServerDate",
	"fasthttp.(*workerPool).Start",
}

// CheckGoroutines fails t if goroutines started during it are still running
// leakWait after it ended. Call it first in a test that does not run in
// parallel: its cleanup then runs after every cleanup registered later
// (clients, proxy, relay, peer).
func CheckGoroutines(t *testing.T) {
	t.Helper()
	before := goroutineStacks()
	t.Cleanup(func() {
		deadline := time.Now().Add(leakWait)
		for {
			var left []string
			for id, stack := range goroutineStacks() {
				if _, ok := before[id]; ok || slices.ContainsFunc(leakIgnored, func(s string) bool { return strings.Contains(stack, s) }) {
					continue
				}
				left = append(left, stack)
			}
			if len(left) == 0 {
				return
			}
			if time.Now().After(deadline) {
				t.Errorf("%d goroutines started by the test still run %v after it ended:\n\n%s",
					len(left), leakWait, strings.Join(left, "\n\n"))
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
}

// goroutineStacks returns every goroutine's stack by goroutine id.
func goroutineStacks() map[string]string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	out := make(map[string]string)
	for _, g := range strings.Split(string(buf), "\n\n") {
		head, _, _ := strings.Cut(g, " [")
		out[strings.TrimPrefix(head, "goroutine ")] = g
	}
	return out
}
