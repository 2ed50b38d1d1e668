package main

import (
	"math"
	"slices"
	"testing"
	"time"

	"github.com/mcpheal/mcpheal/bench"
)

func TestAggregate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		in   []float64
		want agg
	}{
		{"odd", []float64{3, 1, 2}, agg{Med: 2, Lo: 1, Hi: 3, N: 3}},
		{"even", []float64{4, 1, 2, 3}, agg{Med: 2.5, Lo: 1, Hi: 4, N: 4}},
		{"nan-dropped", []float64{math.NaN(), 5}, agg{Med: 5, Lo: 5, Hi: 5, N: 1}},
	} {
		if got := aggregate(tc.in); got != tc.want {
			t.Errorf("aggregate(%s) = %+v, want %+v", tc.name, got, tc.want)
		}
	}
	if got := aggregate(nil); !math.IsNaN(got.Med) || got.N != 0 {
		t.Errorf("aggregate(nil) = %+v, want NaN median", got)
	}
}

func TestPct(t *testing.T) {
	t.Parallel()
	l := make([]time.Duration, 100)
	for i := range l {
		l[i] = time.Duration(i + 1)
	}
	for _, tc := range []struct {
		p    float64
		want time.Duration
	}{{0, 1}, {50, 50}, {99, 99}, {99.9, 100}, {100, 100}} {
		if got := pct(l, tc.p); got != tc.want {
			t.Errorf("pct(1..100, %v) = %v, want %v", tc.p, got, tc.want)
		}
	}
}

func TestRotate(t *testing.T) {
	t.Parallel()
	ts := []string{"a", "b", "c"}
	for k, want := range [][]string{{"a", "b", "c"}, {"b", "c", "a"}, {"c", "a", "b"}, {"a", "b", "c"}} {
		if got := rotate(ts, k); !slices.Equal(got, want) {
			t.Errorf("rotate(%d) = %v, want %v", k, got, want)
		}
	}
}

func TestCheckHit(t *testing.T) {
	t.Parallel()
	seen := map[uint64]bool{}
	ok := &hit{Code: 200, Body: []byte(`{"jsonrpc":"2.0","id":5,"result":{"content":[{"type":"text","text":"bench-5"}]}}`)}
	for _, tc := range []struct {
		name string
		h    *hit
		ok   bool
	}{
		{"first", ok, true},
		{"twice", ok, false},
		{"other-run", &hit{Code: 200, Body: bench.CallBody(50)}, false},
		{"status", &hit{Code: 503, Body: ok.Body}, false},
		{"transport", &hit{Error: "EOF"}, false},
	} {
		if err := checkHit(tc.h, 1, 10, seen); (err == nil) != tc.ok {
			t.Errorf("checkHit(%s) = %v, want ok %v", tc.name, err, tc.ok)
		}
	}
}

func TestParseBench(t *testing.T) {
	t.Parallel()
	out := []byte("pkg: github.com/mcpheal/mcpheal/classify\n" +
		"BenchmarkClassify/OK/json-2   \t 1000000\t      95.5 ns/op\t 400 MB/s\t       0 B/op\t       0 allocs/op\n" +
		"pkg: github.com/mcpheal/mcpheal/bench\n" +
		"BenchmarkRequestPath/mcpheal/json/c100-2 \t   62367\t     18730 ns/op\t         1.134 mallocs/op\t      21 B/op\t       1 allocs/op\n" +
		"BenchmarkRequestPath/direct/json/c1-2 \t   62367\t     9859 ns/op\t       7 B/op\t       0 allocs/op\t         0.0200 mallocs/op\n" +
		"PASS\n")
	got := parseBench(out)
	want := []benchLine{{Pkg: "github.com/mcpheal/mcpheal/classify", Name: "BenchmarkClassify/OK/json-2", NsOp: 95.5},
		{Pkg: "github.com/mcpheal/mcpheal/bench", Name: "BenchmarkRequestPath/mcpheal/json/c100-2", NsOp: 18730, BOp: 21, AllocsOp: 1.134},
		{Pkg: "github.com/mcpheal/mcpheal/bench", Name: "BenchmarkRequestPath/direct/json/c1-2", NsOp: 9859, BOp: 7, AllocsOp: 0.02}}
	if !slices.Equal(got, want) {
		t.Errorf("parseBench = %+v, want %+v", got, want)
	}
}

func TestSmokeDefaults(t *testing.T) {
	t.Parallel()
	c, err := parseFlags([]string{"-smoke", "-rounds", "2"})
	if err != nil {
		t.Fatal(err)
	}
	if c.rounds != 2 || c.duration != 2*time.Second || len(c.rates) != 1 || c.out != "" || c.memSessions != 0 {
		t.Errorf("smoke config = %+v, want 2 rounds (explicit), 2 s, one rate, no results file, no memory run", c)
	}
}

// TestWithoutSchedtrace: mcpheal-bare's GODEBUG is mcpheal's, the last one
// of its environment (os/exec keeps a key's last value), without schedtrace.
func TestWithoutSchedtrace(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		env  []string
		want string
	}{
		{nil, ""},
		{[]string{"PATH=/bin", "GODEBUG=schedtrace=2147483647"}, ""},
		{[]string{"GODEBUG=http2client=0", "GODEBUG=x=1,schedtrace=2147483647"}, "x=1"},
		{[]string{"GODEBUG=schedtrace=1,x=1,scheddetail=1,schedtrace=0"}, "x=1,scheddetail=1"},
		{[]string{"GODEBUG=noschedtrace=1"}, "noschedtrace=1"},
	} {
		if got := withoutSchedtrace(c.env); got != c.want {
			t.Errorf("withoutSchedtrace(%q) = %q, want %q", c.env, got, c.want)
		}
	}
}

// TestTargetNames: mcpheal-bare and mcpheal-traced are targets of the
// tables but not builds under test (no verdicts, heal runs or large-event
// rounds of their own).
func TestTargetNames(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		bare, tracing bool
		alt           string
		names, builds []string
	}{
		{false, false, "", []string{direct, viaNginx, mcpheal}, []string{mcpheal}},
		{true, false, "", []string{direct, viaNginx, mcpheal, bareProxy}, []string{mcpheal}},
		{true, false, "self", []string{direct, viaNginx, mcpheal, bareProxy, altProxy}, []string{mcpheal, altProxy}},
		{false, true, "", []string{direct, viaNginx, mcpheal, tracedProxy}, []string{mcpheal}},
		{true, true, "self", []string{direct, viaNginx, mcpheal, bareProxy, tracedProxy, altProxy}, []string{mcpheal, altProxy}},
	} {
		h := &harness{cfg: config{bare: c.bare, tracing: c.tracing, alt: c.alt}}
		if got := h.targetNames(); !slices.Equal(got, c.names) {
			t.Errorf("bare %v, tracing %v, alt %q: targetNames() = %q, want %q", c.bare, c.tracing, c.alt, got, c.names)
		}
		if got := h.buildNames(); !slices.Equal(got, c.builds) {
			t.Errorf("bare %v, tracing %v, alt %q: buildNames() = %q, want %q", c.bare, c.tracing, c.alt, got, c.builds)
		}
	}
}
