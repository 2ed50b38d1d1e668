package upstream

import (
	"testing"
	"time"
)

func TestBackoff(t *testing.T) {
	t.Parallel()
	b := Backoff{Min: 10 * time.Millisecond, Max: 80 * time.Millisecond}
	steps := []time.Duration{10, 20, 40, 80, 80, 80}
	for i, want := range steps {
		want *= time.Millisecond
		got := b.Next()
		if b.Step() != want {
			t.Fatalf("try %d: step %v, want %v", i+1, b.Step(), want)
		}
		if lo, hi := want*8/10, want*12/10; got < lo || got > hi {
			t.Fatalf("try %d: wait %v outside [%v, %v]", i+1, got, lo, hi)
		}
	}
	b.Reset()
	if b.Next(); b.Step() != 10*time.Millisecond {
		t.Fatalf("after Reset: step %v, want 10ms", b.Step())
	}
	var zero Backoff
	if d := zero.Next(); d != 0 {
		t.Fatalf("zero Backoff waits %v, want 0", d)
	}
}

// TestBackoffSpreads: waits of one step differ, so that sessions failing
// together do not retry in lockstep.
func TestBackoffSpreads(t *testing.T) {
	t.Parallel()
	seen := map[time.Duration]bool{}
	for range 50 {
		b := Backoff{Min: time.Second}
		seen[b.Next()] = true
	}
	if len(seen) < 10 {
		t.Fatalf("50 first waits took %d values; want them spread", len(seen))
	}
}
