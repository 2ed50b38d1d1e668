package main

import (
	"context"
	"net/http/httptest"
	"testing"

	"github.com/mcpheal/mcpheal/bench"
)

func TestLargeEvent(t *testing.T) {
	t.Parallel()
	const size = 300_000 // not a multiple of the 64 KiB writes
	ev := newLargeEvent(size)
	srv := httptest.NewServer(&largeUpstream{ev: ev})
	defer srv.Close()
	ctx := context.Background()
	s, err := bench.Initialize(ctx, srv.Client(), srv.URL, true)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, len(appendPrefix(nil, "18446744073709551615"))+len(ev.tail)+1)
	body, _, _, err := fetchLarge(ctx, srv.Client(), s, 4711, buf)
	if err != nil {
		t.Fatal(err)
	}
	if err := ev.check(body, 4711); err != nil {
		t.Fatal(err)
	}
	// Through mcpheal the event carries an id of mcpheal's own.
	if err := ev.check(append(append([]byte(nil), body[:len(body)-1]...), "id: m1x-1\n\n"...), 4711); err != nil {
		t.Errorf("with mcpheal's id line: %v", err)
	}
	if newLargeEvent(size).sum != ev.sum {
		t.Error("the event is not deterministic: upstream and harness would disagree")
	}
	for name, bad := range map[string][]byte{
		"other id":      append(appendPrefix(nil, "4712"), ev.tail...),
		"short":         body[:len(body)-1],
		"one byte":      func() []byte { b := append([]byte(nil), body...); b[len(b)/2] ^= 1; return b }(),
		"duplicate":     append(append([]byte(nil), body...), body[len(body)-3:]...),
		"other id line": append(append([]byte(nil), body[:len(body)-1]...), "id: 7\n\n"...),
	} {
		if ev.check(bad, 4711) == nil {
			t.Errorf("check accepted a %s answer", name)
		}
	}
	// An answer longer than expected is reported by the read, not cut.
	if _, _, _, err := fetchLarge(ctx, srv.Client(), s, 4712, buf[:len(body)-10]); err == nil {
		t.Error("fetchLarge accepted an answer longer than its buffer")
	}
}

func TestOnlyLarge(t *testing.T) {
	t.Parallel()
	c, err := parseFlags([]string{"-only", "large", "-large-sizes", "12"})
	if err != nil {
		t.Fatal(err)
	}
	if len(c.variants) != 0 || c.memSessions != 0 || c.goBench || c.out != "" || c.plot != "" || len(c.largeSizes) != 1 {
		t.Errorf("-only large config = %+v, want only the large section (12 MB), no results file", c)
	}
	if got := c.largeCallsFor(12 << 20); got != 20 {
		t.Errorf("calls for 12 MB = %d, want 20", got)
	}
	if got := c.largeCallsFor(1 << 20); got != 240 {
		t.Errorf("calls for 1 MB = %d, want 240 (-large-round-mb)", got)
	}
	if _, err := parseFlags([]string{"-only", "json"}); err == nil {
		t.Error("-only json accepted")
	}
	s, err := parseFlags([]string{"-smoke"})
	if err != nil {
		t.Fatal(err)
	}
	if len(s.largeSizes) != 1 || s.largeSizes[0] != 1 || s.largeRounds != 1 || s.largeCallsFor(1<<20) != 20 {
		t.Errorf("smoke large section = %v MiB, %d rounds, %d calls; want 1 MiB, 1 round, 20 calls",
			s.largeSizes, s.largeRounds, s.largeCallsFor(1<<20))
	}
}
