package classify

import (
	"bytes"
	"testing"
)

// checkAllocs is set by alloc_test.go, which is built only without -race.
var checkAllocs bool

// FuzzClassify checks, for any input: no panic; no input modification;
// determinism; never Unknown or Timeout; invariance under a prepended byte
// order mark or whitespace; SSE-wrapped == bare for 2xx bodies; and, without
// -race, zero allocations. It checks Refused on the same input: no panic,
// invariance under the same prefixes, true only for a 503 that Classify
// calls TransportDead, and zero allocations.
func FuzzClassify(f *testing.F) {
	for _, g := range loadGoldens(f) {
		f.Add(g.status, g.contentType, g.body)
	}
	for _, tc := range tableCases {
		f.Add(tc.status, []byte(tc.contentType), []byte(tc.body))
	}
	for _, g := range loadRefusedGoldens(f) {
		f.Add(g.status, g.contentType, g.body)
	}
	for _, tc := range refusedCases {
		f.Add(tc.status, []byte(tc.contentType), []byte(tc.body))
	}
	f.Fuzz(func(t *testing.T, status int, contentType, body []byte) {
		before := bytes.Clone(body)
		got := Classify(status, contentType, body)
		if !bytes.Equal(before, body) {
			t.Fatalf("Classify(%d, %q, %q) modified its body", status, contentType, before)
		}
		if again := Classify(status, contentType, body); again != got {
			t.Fatalf("Classify(%d, %q, %q) = %v, then %v", status, contentType, body, got, again)
		}
		if got == Unknown || got == Timeout || got > Busy {
			t.Fatalf("Classify(%d, %q, %q) = %v, which it never returns", status, contentType, body, got)
		}
		refused := Refused(status, contentType, body)
		if !bytes.Equal(before, body) {
			t.Fatalf("Refused(%d, %q, %q) modified its body", status, contentType, before)
		}
		if refused && (status != 503 || (got != TransportDead && got != Busy)) {
			t.Fatalf("Refused(%d, %q, %q) = true, but Classify = %v", status, contentType, body, got)
		}
		for _, prefix := range []string{bom, "\n  "} {
			b := append([]byte(prefix), body...)
			if c := Classify(status, contentType, b); c != got {
				t.Fatalf("Classify(%d, %q, %q) = %v, want %v as without the %q prefix", status, contentType, b, c, got, prefix)
			}
			if r := Refused(status, contentType, b); r != refused {
				t.Fatalf("Refused(%d, %q, %q) = %v, want %v as without the %q prefix", status, contentType, b, r, refused, prefix)
			}
		}
		if status >= 200 && status <= 299 && !bytes.ContainsAny(body, "\r\n") {
			bare := Classify(status, []byte("application/json"), body)
			framed := append(append([]byte("data: "), body...), "\n\n"...)
			if c := Classify(status, []byte("text/event-stream"), framed); c != bare {
				t.Fatalf("Classify(%d, SSE, %q) = %v, want %v as bare", status, framed, c, bare)
			}
		}
		if checkAllocs {
			if n := testing.AllocsPerRun(10, func() { Classify(status, contentType, body) }); n != 0 {
				t.Fatalf("Classify(%d, %q, %q) allocates %v times, want 0", status, contentType, body, n)
			}
			if n := testing.AllocsPerRun(10, func() { Refused(status, contentType, body) }); n != 0 {
				t.Fatalf("Refused(%d, %q, %q) allocates %v times, want 0", status, contentType, body, n)
			}
		}
	})
}
