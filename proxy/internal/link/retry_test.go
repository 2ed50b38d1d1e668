package link

import (
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/mcpheal/mcpheal/proxy/internal/conf"
	"github.com/mcpheal/mcpheal/proxy/internal/obs"
	"github.com/mcpheal/mcpheal/proxy/internal/wire"
	"github.com/mcpheal/mcpheal/upstream"
)

// testLink is a Link to an upstream nobody serves, whose breaker opens at
// the first failure for cooldown.
func testLink(t *testing.T, cooldown time.Duration) (*Link, chan struct{}) {
	t.Helper()
	done := make(chan struct{})
	log := zerolog.Nop()
	cfg := &conf.Config{Upstream: "http://127.0.0.1:1/mcp", HealTimeout: time.Second,
		Breaker: upstream.BreakerConfig{Threshold: 1, MinStreak: time.Nanosecond, Cooldown: cooldown, MaxCooldown: cooldown}}
	l, err := NewLink(cfg, &log, new(obs.Counters), new(wire.BgGroup), done)
	if err != nil {
		t.Fatal(err)
	}
	return l, done
}

// TestRetryBudget: the budget begins at the first wait that needs one,
// waits are cut to it, and a spent budget ends the loop.
func TestRetryBudget(t *testing.T) {
	l, _ := testLink(t, time.Second)
	r := l.Retry(Pace{Min: 20 * time.Millisecond, Max: 20 * time.Millisecond}, 50*time.Millisecond)
	if r.Begun() {
		t.Fatal("a new Retry's budget has begun")
	}
	if !r.Fits(40 * time.Millisecond) {
		t.Fatal("40 ms does not fit a 50 ms budget")
	}
	if !r.Begun() || r.Fits(time.Second) {
		t.Fatalf("begun %v; a second fits a 50 ms budget", r.Begun())
	}
	start := time.Now()
	tries := 0
	for r.Wait() {
		tries++
	}
	if took := time.Since(start); tries < 1 || tries > 3 || took > 500*time.Millisecond {
		t.Fatalf("%d waits in %v within a 50 ms budget of 20 ms steps", tries, took)
	}
	none := l.Retry(PaceListen, 0)
	if !none.Fits(time.Hour) || !none.Begin().IsZero() {
		t.Fatal("a Retry without budget has one")
	}
}

// TestRetryBusyOnce: a busy upstream's Retry-After is waited out once,
// and only when it fits the budget.
func TestRetryBusyOnce(t *testing.T) {
	l, _ := testLink(t, time.Second)
	r := l.Retry(PaceRequest, time.Second)
	if waited, fits := r.BusyWait(2 * time.Second); waited || fits {
		t.Fatalf("2 s in a 1 s budget: waited %v fits %v", waited, fits)
	}
	if waited, fits := r.BusyWait(time.Millisecond); waited || !fits {
		t.Fatalf("1 ms: waited %v fits %v", waited, fits)
	}
	if !r.WaitBusy(time.Millisecond) {
		t.Fatal("WaitBusy false while mcpheal runs")
	}
	if waited, _ := r.BusyWait(time.Millisecond); !waited {
		t.Fatal("a second Retry-After would be waited out too")
	}
}

// TestRetryGate: an open breaker is waited out within the budget; past
// it the loop gives up with the breaker's window; closing ends the wait.
func TestRetryGate(t *testing.T) {
	l, done := testLink(t, 10*time.Second)
	r := l.Retry(PaceRequest, time.Second)
	if ok, _ := r.Gate(); !ok {
		t.Fatal("a closed breaker refused a try")
	}
	for l.Breaker.State() != upstream.Open {
		l.Breaker.Failure() // open once the streak is longer than a nanosecond
	}
	start := time.Now()
	ok, w := r.Gate()
	if ok || w < 5*time.Second {
		t.Fatalf("open for ~10 s within a 1 s budget: ok %v, window %v", ok, w)
	}
	if took := time.Since(start); took > 1500*time.Millisecond {
		t.Fatalf("gave up after %v, past the 1 s budget", took)
	}
	close(done)
	r = l.Retry(PaceRequest, time.Minute)
	start = time.Now()
	if ok, _ := r.Gate(); ok || time.Since(start) > time.Second {
		t.Fatalf("closing: ok %v after %v", ok, time.Since(start))
	}
}
