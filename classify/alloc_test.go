//go:build !race

package classify

import "testing"

// The race detector allocates on its own, so allocation counts are only
// meaningful without -race. This file also turns on the per-input
// allocation check in FuzzClassify.
func init() { checkAllocs = true }

// sink keeps the compiler from discarding calls whose result is unused.
var sink Class

// TestClassifyAllocs asserts that Classify allocates nothing, for every
// golden file and every table case. It must not run in parallel with other
// tests: AllocsPerRun counts allocations process-wide.
func TestClassifyAllocs(t *testing.T) {
	for _, g := range loadGoldens(t) {
		if n := testing.AllocsPerRun(100, func() { sink = Classify(g.status, g.contentType, g.body) }); n != 0 {
			t.Errorf("Classify(%s) allocates %v times, want 0", g.name, n)
		}
	}
	for _, tc := range tableCases {
		ct, body := []byte(tc.contentType), []byte(tc.body)
		if n := testing.AllocsPerRun(100, func() { sink = Classify(tc.status, ct, body) }); n != 0 {
			t.Errorf("Classify(%s) allocates %v times, want 0", tc.name, n)
		}
	}
}

// sinkRefused keeps the compiler from discarding Refused calls.
var sinkRefused bool

// TestRefusedAllocs asserts that Refused allocates nothing, for every
// refused golden file and table case. Not parallel, like TestClassifyAllocs.
func TestRefusedAllocs(t *testing.T) {
	for _, g := range loadRefusedGoldens(t) {
		if n := testing.AllocsPerRun(100, func() { sinkRefused = Refused(g.status, g.contentType, g.body) }); n != 0 {
			t.Errorf("Refused(%s) allocates %v times, want 0", g.name, n)
		}
	}
	for _, tc := range refusedCases {
		ct, body := []byte(tc.contentType), []byte(tc.body)
		if n := testing.AllocsPerRun(100, func() { sinkRefused = Refused(tc.status, ct, body) }); n != 0 {
			t.Errorf("Refused(%s) allocates %v times, want 0", tc.name, n)
		}
	}
}
