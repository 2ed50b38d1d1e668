package session

import (
	"crypto/rand"
	"sync"
	"testing"
	"time"
)

// epoch is the tests' now: a window boundary for every maxAge they use.
var epoch = time.Unix(1_800_000_000-1_800_000_000%(24*3600), 0)

// tombstonesAt returns tombstones whose clock reads *now.
func tombstonesAt(maxAge time.Duration, now *time.Time) *Tombstones {
	t := NewTombstones(maxAge)
	t.now = func() time.Time { return *now }
	return t
}

func nonce() (id [16]byte) {
	_, _ = rand.Read(id[:])
	return id
}

// maxFilters is the bound the type's doc states: the windows from one
// before now to now+maxAge, and the far filter.
func maxFilters(maxAge time.Duration) int {
	w := max(maxAge/8, time.Minute)
	return int((maxAge+w-1)/w) + 3
}

// TestTombstonesNoFalseNegative: every buried id is reported buried until
// it expires, however many others share or surround its window.
func TestTombstonesNoFalseNegative(t *testing.T) {
	t.Parallel()
	const maxAge, n = 24 * time.Hour, 300_000
	now := epoch
	ts := tombstonesAt(maxAge, &now)
	type grave struct {
		id      [16]byte
		expires time.Time
	}
	graves := make([]grave, n)
	for i := range graves {
		// Expiries spread over every window up to maxAge ahead, at whole
		// seconds as sealed records carry them.
		g := grave{nonce(), now.Add(time.Duration(1+i%int(maxAge/time.Second)) * time.Second)}
		graves[i] = g
		ts.Bury(g.id, g.expires)
	}
	for _, at := range []time.Duration{0, maxAge / 3, maxAge - time.Second} {
		for _, g := range graves {
			if now := epoch.Add(at); now.Before(g.expires) && !ts.Buried(g.id, g.expires, now) {
				t.Fatalf("Buried(%x, %v, %v) = false, want true", g.id, g.expires, now)
			}
		}
	}
	if got, limit := ts.Bytes(), maxFilters(maxAge)*filterBytes; got > limit {
		t.Errorf("Bytes() = %d, want at most %d", got, limit)
	}
}

// TestTombstonesFlood: the DELETEs that pushed an ended id out of a
// graveyard capped at 65 536 ids leave it buried here, in its own window
// and in every other.
func TestTombstonesFlood(t *testing.T) {
	t.Parallel()
	now := epoch
	ts := tombstonesAt(24*time.Hour, &now)
	ended, exp := nonce(), now.Add(24*time.Hour)
	ts.Bury(ended, exp)
	for i := range 65_600 {
		ts.Bury(nonce(), exp.Add(-time.Duration(i%2)*12*time.Hour))
	}
	if !ts.Buried(ended, exp, now) {
		t.Errorf("Buried(%x, %v, %v) after 65 600 other burials = false, want true", ended, exp, now)
	}
}

// TestTombstonesExpire: a filter is dropped, with every id in it, once its
// window has passed (plus the window kept for a lagging clock); ids in
// later windows stay.
func TestTombstonesExpire(t *testing.T) {
	t.Parallel()
	const maxAge = 8 * time.Hour // one window is an hour
	now := epoch
	ts := tombstonesAt(maxAge, &now)
	early, late := nonce(), nonce()
	earlyExp, lateExp := now.Add(30*time.Minute), now.Add(5*time.Hour)
	ts.Bury(early, earlyExp)
	ts.Bury(late, lateExp)
	if got, want := ts.Bytes(), 2*filterBytes; got != want {
		t.Fatalf("Bytes() = %d, want %d", got, want)
	}
	// Each step moves the clock, then buries one more id a minute ahead,
	// which sweeps; then it asks with a clock from before both expiries,
	// so that only a dropped filter can answer false.
	cases := []struct {
		name        string
		advance     time.Duration
		filters     int  // held after the step
		early, late bool // still reported buried
	}{
		{"before the expiry", 10 * time.Minute, 2, true, true}, // the new id shares early's window
		{"early's window over", time.Hour, 3, true, true},      // kept a window for a lagging clock
		{"a window later", 2 * time.Hour, 3, false, true},
		{"everything expired", 8 * time.Hour, 1, false, false},
	}
	for _, c := range cases {
		now = epoch.Add(c.advance)
		ts.Bury(nonce(), now.Add(time.Minute))
		if got := ts.Buried(early, earlyExp, epoch); got != c.early {
			t.Errorf("%s: Buried(early, %v, %v) = %v, want %v", c.name, earlyExp, epoch, got, c.early)
		}
		if got := ts.Buried(late, lateExp, epoch); got != c.late {
			t.Errorf("%s: Buried(late, %v, %v) = %v, want %v", c.name, lateExp, epoch, got, c.late)
		}
		if got, want := ts.Bytes(), c.filters*filterBytes; got != want {
			t.Errorf("%s: Bytes() = %d, want %d", c.name, got, want)
		}
	}
	if ts.Buried(early, earlyExp, earlyExp) {
		t.Error("Buried at its expiry = true, want false")
	}
}

// TestTombstonesFar: an id sealed to live longer than maxAge (a process
// with a longer session_max_age) is remembered too, in the far filter,
// until it expires; then the far filter goes.
func TestTombstonesFar(t *testing.T) {
	t.Parallel()
	const maxAge = time.Hour
	now := epoch
	ts := tombstonesAt(maxAge, &now)
	id, exp := nonce(), now.Add(30*24*time.Hour)
	ts.Bury(id, exp)
	for _, at := range []time.Duration{0, 24 * time.Hour, 30*24*time.Hour - time.Second} {
		now = epoch.Add(at)
		ts.Bury(nonce(), now.Add(maxAge)) // sweeps, and holds a near window
		if !ts.Buried(id, exp, now) {
			t.Fatalf("after %v: Buried(far) = false, want true", at)
		}
		if got, limit := ts.Bytes(), maxFilters(maxAge)*filterBytes; got > limit {
			t.Fatalf("after %v: Bytes() = %d, want at most %d", at, got, limit)
		}
	}
	// A window after its last expiry (as any filter), the far filter goes:
	// asked with a clock from before the expiry, it no longer answers.
	before := ts.Bytes()
	now = exp.Add(time.Duration(ts.window) * time.Second)
	ts.Bury(nonce(), now.Add(time.Second)) // sweeps; the last id's filter stays, one more comes
	if ts.Buried(id, exp, exp.Add(-time.Second)) {
		t.Error("far expired: Buried = true, want false")
	}
	if got, want := ts.Bytes(), before; got != want {
		t.Errorf("far expired: Bytes() = %d, want %d", got, want)
	}
}

// TestTombstonesFalsePositives measures how often an id never buried is
// reported buried, with n ids buried in its window, against the bound the
// type's doc states ((1 - e^(-10n/2^23))^10 is 6e-12 and 2.7 %).
func TestTombstonesFalsePositives(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		buried int
		bound  float64
	}{
		{"65 600 ids", 65_600, 1e-4},
		{"1 000 000 ids", 1_000_000, 0.03},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			if testing.Short() && c.buried > 100_000 {
				t.Skip("a million burials: not in -short")
			}
			now := epoch
			ts := tombstonesAt(24*time.Hour, &now)
			exp := now.Add(time.Hour) // one window
			for range c.buried {
				ts.Bury(nonce(), exp)
			}
			const probes = 1_000_000
			fp := 0
			for range probes {
				if ts.Buried(nonce(), exp, now) {
					fp++
				}
			}
			rate := float64(fp) / probes
			t.Logf("%d ids buried in one window: %d false positives in %d (%.2g), %d bytes", c.buried, fp, probes, rate, ts.Bytes())
			if rate >= c.bound {
				t.Errorf("false-positive rate %.3g, want under %g", rate, c.bound)
			}
			if got := ts.Bytes(); got != filterBytes {
				t.Errorf("Bytes() = %d, want %d", got, filterBytes)
			}
		})
	}
}

// TestTombstonesBounded: memory stays within the bound the doc states
// while ids keep being buried across many lifetimes, each window full,
// with maxAge too short for eight minute-long windows and long enough.
func TestTombstonesBounded(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		maxAge time.Duration
	}{
		{"maxAge 5 minutes", 5 * time.Minute},
		{"maxAge 24 hours", 24 * time.Hour},
		{"maxAge 1 hour 1 second", time.Hour + time.Second},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			now := epoch.Add(123 * time.Second) // off every boundary
			ts := tombstonesAt(c.maxAge, &now)
			limit, most := maxFilters(c.maxAge)*filterBytes, 0
			step := max(c.maxAge/64, time.Second)
			for i := range 64 * 5 {
				now = now.Add(step)
				ts.Bury(nonce(), now.Add(c.maxAge))                      // the longest life
				ts.Bury(nonce(), now.Add(time.Second))                   // the shortest
				ts.Bury(nonce(), now.Add(c.maxAge*time.Duration(i%7)/7)) // between
				ts.Bury(nonce(), now.Add(c.maxAge+time.Hour))            // far
				most = max(most, ts.Bytes())
				if most > limit {
					t.Fatalf("after %v: Bytes() = %d, want at most %d", now.Sub(epoch), most, limit)
				}
			}
			t.Logf("at most %d bytes (bound %d)", most, limit)
		})
	}
}

// TestTombstonesConcurrent: Bury and Buried from many goroutines; each
// sees its own ids buried at once and after everyone else's (run with
// -race).
func TestTombstonesConcurrent(t *testing.T) {
	t.Parallel()
	now := epoch
	ts := tombstonesAt(24*time.Hour, &now) // the clock is only read
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			ids := make([][16]byte, 2000)
			for i := range ids {
				ids[i] = nonce()
				exp := epoch.Add(time.Duration(1+(g*len(ids)+i)%86400) * time.Second)
				ts.Bury(ids[i], exp)
				if !ts.Buried(ids[i], exp, epoch) {
					t.Errorf("Buried(%x) right after Bury = false, want true", ids[i])
				}
				_ = ts.Buried(nonce(), exp, epoch)
				_ = ts.Bytes()
			}
			for i, id := range ids {
				exp := epoch.Add(time.Duration(1+(g*len(ids)+i)%86400) * time.Second)
				if !ts.Buried(id, exp, epoch) {
					t.Errorf("Buried(%x) = false, want true", id)
				}
			}
		})
	}
	wg.Wait()
}

// TestTombstonesBuriedAllocs: Buried is on every restore, so it allocates
// nothing, found or not.
func TestTombstonesBuriedAllocs(t *testing.T) {
	now := epoch
	ts := tombstonesAt(24*time.Hour, &now)
	id, other, exp := nonce(), nonce(), now.Add(time.Hour)
	ts.Bury(id, exp)
	ts.Bury(nonce(), now.Add(48*time.Hour)) // and a far filter to consult
	if got := testing.AllocsPerRun(1000, func() {
		if !ts.Buried(id, exp, now) || ts.Buried(other, exp, now) {
			t.Fatal("Buried answered wrong")
		}
	}); got != 0 {
		t.Errorf("Buried: %v allocs/op, want 0", got)
	}
}
