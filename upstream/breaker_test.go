package upstream

import (
	"testing"
	"time"
)

// pseudoClock is a manual clock for breaker tables (gobreaker's pseudoSleep).
type pseudoClock struct{ t time.Time }

func (c *pseudoClock) now() time.Time        { return c.t }
func (c *pseudoClock) sleep(d time.Duration) { c.t = c.t.Add(d) }
func newTestBreaker(cfg BreakerConfig) (*Breaker, *pseudoClock) {
	clk := &pseudoClock{t: time.Unix(1_000_000, 0)}
	b := NewBreaker(cfg)
	b.now = clk.now
	return b, clk
}

func TestBreakerOpensAfterThresholdAndStreak(t *testing.T) {
	t.Parallel()
	b, clk := newTestBreaker(BreakerConfig{Threshold: 3, MinStreak: 2 * time.Second})
	for range 10 { // many failures within a short restart: stays closed
		b.Failure()
		clk.sleep(100 * time.Millisecond)
	}
	if b.State() != Closed {
		t.Fatalf("state after a 1 s streak = %v, want closed", b.State())
	}
	clk.sleep(time.Second)
	b.Failure()
	if b.State() != Open {
		t.Fatalf("state after 11 failures over 2 s = %v, want open", b.State())
	}
	if ok, wait := b.Allow(); ok || wait <= 0 || wait > 1200*time.Millisecond {
		t.Fatalf("Allow while open = %v, %v; want false with ≤1.2 s wait", ok, wait)
	}
}

func TestBreakerSuccessResetsStreak(t *testing.T) {
	t.Parallel()
	b, clk := newTestBreaker(BreakerConfig{Threshold: 2, MinStreak: time.Second})
	b.Failure()
	clk.sleep(2 * time.Second)
	b.Success()
	b.Failure() // a new streak starts now
	if b.State() != Closed {
		t.Fatalf("state = %v, want closed: the success broke the streak", b.State())
	}
}

// TestBreakerProbeCycle: open → one probe → failure doubles the cooldown →
// probe → success closes and resets the growth.
func TestBreakerProbeCycle(t *testing.T) {
	t.Parallel()
	var transitions []string
	b, clk := newTestBreaker(BreakerConfig{Threshold: 2, MinStreak: 5 * time.Millisecond,
		Cooldown: time.Second, MaxCooldown: 3 * time.Second,
		OnChange: func(from, to BreakerState, _ time.Duration) {
			transitions = append(transitions, from.String()+">"+to.String())
		}})
	trip := func() { b.Failure(); clk.sleep(10 * time.Millisecond); b.Failure() }
	trip()
	wantOpenFor := func(lo, hi time.Duration) {
		t.Helper()
		ok, wait := b.Allow()
		if ok || wait < lo || wait > hi {
			t.Fatalf("Allow = %v, %v; want closed gate for %v–%v", ok, wait, lo, hi)
		}
	}
	wantOpenFor(800*time.Millisecond, 1200*time.Millisecond)
	clk.sleep(1300 * time.Millisecond)
	if ok, _ := b.Allow(); !ok {
		t.Fatal("no probe after the cooldown")
	}
	if ok, _ := b.Allow(); ok {
		t.Fatal("a second request passed while the probe is out")
	}
	b.Failure() // probe failed: cooldown doubles to 2 s
	wantOpenFor(1600*time.Millisecond, 2400*time.Millisecond)
	clk.sleep(2500 * time.Millisecond)
	b.Allow()
	b.Failure() // doubles again, capped at 3 s
	wantOpenFor(2400*time.Millisecond, 3600*time.Millisecond)
	clk.sleep(3700 * time.Millisecond)
	if ok, _ := b.Allow(); !ok {
		t.Fatal("no probe after the capped cooldown")
	}
	b.Success()
	if b.State() != Closed {
		t.Fatalf("state after a good probe = %v, want closed", b.State())
	}
	trip() // growth was reset: back to 1 s
	wantOpenFor(800*time.Millisecond, 1200*time.Millisecond)
	want := []string{"closed>open", "open>half-open", "half-open>open", "open>half-open", "half-open>open",
		"open>half-open", "half-open>closed", "closed>open"}
	if len(transitions) != len(want) {
		t.Fatalf("transitions %v, want %v", transitions, want)
	}
	for i := range want {
		if transitions[i] != want[i] {
			t.Fatalf("transitions %v, want %v", transitions, want)
		}
	}
}

// TestBreakerLostProbe: a probe that never reports does not wedge the
// breaker half-open.
func TestBreakerLostProbe(t *testing.T) {
	t.Parallel()
	b, clk := newTestBreaker(BreakerConfig{Threshold: 2, MinStreak: 5 * time.Millisecond})
	b.Failure()
	clk.sleep(10 * time.Millisecond)
	b.Failure()
	clk.sleep(1300 * time.Millisecond)
	if ok, _ := b.Allow(); !ok {
		t.Fatal("no probe")
	}
	clk.sleep(1500 * time.Millisecond)
	if ok, _ := b.Allow(); !ok {
		t.Fatal("a lost probe wedged the breaker")
	}
}

func BenchmarkBreakerClosed(b *testing.B) {
	br := NewBreaker(BreakerConfig{})
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			br.Allow()
			br.Success()
		}
	})
}
