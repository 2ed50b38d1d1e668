package main

import (
	"context"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestDemo runs the demo briefly with sessions dying every half second:
// the client behind mcpheal sees no error while the direct one does, and
// everything the demo started has stopped when run returns.
func TestDemo(t *testing.T) {
	var out strings.Builder
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	before := len(ours())
	start := time.Now()
	r, err := run(ctx, config{Duration: 3 * time.Second, KillEvery: 500 * time.Millisecond, Pace: 20 * time.Millisecond}, &out)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("output:\n%s", out.String())
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("demo took %v, want about 3 s: it must stop by itself", took)
	}
	if r.Kills < 4 {
		t.Errorf("server closed its sessions %d times, want ≥ 4 in 3 s", r.Kills)
	}
	if r.Proxied.Errors != 0 {
		t.Errorf("client behind mcpheal saw %d errors (last: %v), want 0", r.Proxied.Errors, r.Proxied.LastErr)
	}
	if r.Direct.Errors == 0 {
		t.Errorf("direct client saw no error although sessions died %d times", r.Kills)
	}
	if r.Heals == 0 {
		t.Error("mcpheal healed nothing")
	}
	if r.Proxied.Calls < 20 || r.Direct.Calls < 20 {
		t.Errorf("calls: direct %d, proxied %d; want both ≥ 20 (the direct one reconnects and goes on)", r.Direct.Calls, r.Proxied.Calls)
	}
	for _, want := range []string{"through mcpheal", "summary:", "saw none of the"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q", want)
		}
	}
	if lines := regexp.MustCompile(`(?m)^ +\d+s  `).FindAllString(out.String(), -1); len(lines) < 3 {
		t.Errorf("%d live lines, want one per second", len(lines))
	}
	// Nothing keeps running: goroutines return to where they were.
	deadline := time.Now().Add(3 * time.Second)
	for len(ours()) > before && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if g := ours(); len(g) > before {
		t.Errorf("%d goroutines after run, %d before:\n%s", len(g), before, strings.Join(g, "\n\n"))
	}
}

// ours returns the stacks of the running goroutines except fasthttp's
// process-wide ones (the server date updater, worker pool cleaners), which
// outlive any server by design.
func ours() []string {
	buf := make([]byte, 1<<20)
	var out []string
	for _, g := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
		if !strings.Contains(g, "valyala/fasthttp.updateServerDate") && !strings.Contains(g, "fasthttp.(*workerPool).Start") {
			out = append(out, g)
		}
	}
	return out
}
