package exchange

import (
	"testing"

	"github.com/mcpheal/mcpheal/classify"
)

// TestDecide is the docs/healing.md's "What it does with each answer" and "Replay
// rules", row by row. A row that would send a request that is not
// replay-safe a second time although it may have run is a bug by
// definition; TestDecideNeverRunsTwice checks that over every input.
func TestDecide(t *testing.T) {
	t.Parallel()
	sess := Facts{Session: true, MayHeal: true}
	with := func(f Facts, mod func(*Facts)) Facts { mod(&f); return f }
	tests := []struct {
		name string
		in   Facts
		want action
	}{
		// Answers that are the upstream's own.
		{"OK passes", with(sess, func(f *Facts) { f.Class = classify.OK }), actPass},
		{"tool error passes", with(sess, func(f *Facts) { f.Class = classify.ToolError }), actPass},
		{"401/403 pass", with(sess, func(f *Facts) { f.Class = classify.Auth }), actPass},
		{"405/406/415 pass", with(sess, func(f *Facts) { f.Class = classify.Protocol }), actPass},
		{"unknown passes", with(sess, func(f *Facts) { f.Class = classify.Unknown }), actPass},

		// Session gone: heal and replay, whatever the method.
		{"session gone heals a tools/call", with(sess, func(f *Facts) {
			f.Class, f.Dispatched, f.ReplaySafe = classify.SessionGone, false, false
		}), actHeal},
		{"session gone heals a replay-safe request", with(sess, func(f *Facts) {
			f.Class, f.ReplaySafe = classify.SessionGone, true
		}), actHeal},
		{"session gone right after a heal fails 503", with(sess, func(f *Facts) {
			f.Class, f.healed = classify.SessionGone, true
		}), actFail},
		{"session gone under another credential passes", with(sess, func(f *Facts) {
			f.Class, f.MayHeal = classify.SessionGone, false
		}), actPass},
		{"404 on session-less traffic passes", Facts{Class: classify.SessionGone}, actPass},

		// Transport death: retry on proof or when safe, else refuse.
		{"refused connection retries a tools/call", with(sess, func(f *Facts) {
			f.Class = classify.TransportDead
		}), actRetry},
		{"known server refusal (503) retries a tools/call", with(sess, func(f *Facts) {
			f.Class = classify.TransportDead
		}), actRetry},
		{"written then reset refuses a tools/call", with(sess, func(f *Facts) {
			f.Class, f.Dispatched = classify.TransportDead, true
		}), actRefuse},
		{"gateway 503 after the write refuses a tools/call", with(sess, func(f *Facts) {
			f.Class, f.Dispatched = classify.TransportDead, true
		}), actRefuse},
		{"timeout refuses a tools/call", with(sess, func(f *Facts) {
			f.Class, f.Dispatched = classify.Timeout, true
		}), actRefuse},
		{"written then reset retries a replay-safe request", with(sess, func(f *Facts) {
			f.Class, f.Dispatched, f.ReplaySafe = classify.TransportDead, true, true
		}), actRetry},
		{"timeout retries a replay-safe request", with(sess, func(f *Facts) {
			f.Class, f.Dispatched, f.ReplaySafe = classify.Timeout, true, true
		}), actRetry},
		{"session-less traffic retries when not dispatched", Facts{Class: classify.TransportDead}, actRetry},
		{"session-less tools/call refused when it may have run", Facts{Class: classify.TransportDead, Dispatched: true}, actRefuse},

		// A busy upstream (429, a 503 in its own words): one wait of its
		// Retry-After, only when harmless and within the budget.
		{"busy, refused unseen, wait fits", Facts{Class: classify.Busy, waitFits: true}, actWait},
		{"busy, replay-safe, wait fits", Facts{Class: classify.Busy, Dispatched: true, ReplaySafe: true, waitFits: true}, actWait},
		{"busy, may have run", Facts{Class: classify.Busy, Dispatched: true, waitFits: true}, actPass},
		{"busy, wait past the budget", Facts{Class: classify.Busy, waitFits: false}, actPass},
		{"busy again after the wait", Facts{Class: classify.Busy, waitFits: true, waited: true}, actPass},

		// An answer past max_answer: mcpheal's 502, never a retry.
		{"answer too large, replay-safe", with(sess, func(f *Facts) {
			f.Class, f.TooLarge, f.ReplaySafe, f.Dispatched = classify.Protocol, true, true, true
		}), actTooLarge},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Decide(tt.in); got != tt.want {
				t.Errorf("decide(%+v) = %v, want %v", tt.in, got, tt.want)
			}
		})
	}
}

// TestDecideNeverRunsTwice walks every input: a request that may have run
// and is not replay-safe is never retried; it is healed (and so replayed)
// only on a session rejection, which is proof it did not run.
func TestDecideNeverRunsTwice(t *testing.T) {
	t.Parallel()
	for c := classify.Class(0); c <= classify.Busy+1; c++ {
		for bits := 0; bits < 256; bits++ {
			f := Facts{Class: c, Dispatched: bits&1 != 0, ReplaySafe: bits&2 != 0,
				Session: bits&4 != 0, MayHeal: bits&8 != 0, healed: bits&16 != 0, TooLarge: bits&32 != 0,
				waitFits: bits&64 != 0, waited: bits&128 != 0}
			got := Decide(f)
			if (got == actRetry || got == actWait) && f.Dispatched && !f.ReplaySafe {
				t.Errorf("decide(%+v) = retry: a request that may have run would run twice", f)
			}
			if got == actHeal && c != classify.SessionGone {
				t.Errorf("decide(%+v) = heal without a session rejection", f)
			}
		}
	}
}
