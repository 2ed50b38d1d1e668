package redisstore_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/mcpheal/mcpheal/session"
)

// info returns one integer field of the server's INFO section.
func info(tb testing.TB, raw *redis.Client, section, field string) int64 {
	tb.Helper()
	s, err := raw.Info(context.Background(), section).Result()
	if err != nil {
		tb.Fatal(err)
	}
	for l := range strings.SplitSeq(s, "\r\n") {
		if v, ok := strings.CutPrefix(l, field+":"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				tb.Fatalf("INFO %s %s = %q", section, field, v)
			}
			return n
		}
	}
	tb.Fatalf("INFO %s has no %s", section, field)
	return 0
}

// received returns the bytes the server has read from all its clients.
func received(tb testing.TB, raw *redis.Client) int64 {
	return info(tb, raw, "stats", "total_net_input_bytes")
}

// uri1K returns a distinct resource URI of exactly 1 KiB.
func uri1K(i int) string {
	u := fmt.Sprintf("file:///r/%06d/", i)
	return u + strings.Repeat("x", 1024-len(u))
}

// TestNoteIsADelta: what a subscription sends to Redis does not grow with
// the subscriptions the session already has. Rewriting the whole journal
// sent 1 MiB for the 1000th subscription of 1 KiB URIs against 10 KiB for
// the 10th; a delta sends the same for both.
func TestNoteIsADelta(t *testing.T) {
	st, raw, key := redisPair(t)
	ctx := context.Background()
	id := session.NewClientID()
	// What asking for the count costs, taken off each measurement.
	r0 := received(t, raw)
	ask := received(t, raw) - r0
	type figure struct {
		sent int64
		wall time.Duration
		mem  int64
	}
	figures := map[int]figure{}
	for i := 1; i <= 1000; i++ {
		r0 := received(t, raw)
		start := time.Now()
		if err := st.Note(ctx, id, session.JournalChange{URI: uri1K(i), Subscribed: true}); err != nil {
			t.Fatalf("subscription %d: %v", i, err)
		}
		wall := time.Since(start)
		sent := received(t, raw) - r0 - ask
		if i == 10 || i == 100 || i == 1000 {
			mem, err := raw.MemoryUsage(ctx, key(id), 0).Result() // every field, not a sample
			if err != nil {
				t.Fatal(err)
			}
			figures[i] = figure{sent, wall, mem}
			t.Logf("subscription %4d: %5d bytes sent, %8v, key %7d bytes in Redis", i, sent, wall, mem)
		}
	}
	if f10, f1000 := figures[10], figures[1000]; f1000.sent > f10.sent || f10.sent > 1024+256 {
		t.Errorf("the 1000th subscription sent %d bytes, the 10th %d: want the same, a 1 KiB URI and little more",
			f1000.sent, f10.sent)
	}
	s, err := st.Load(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Journal.Subscriptions) != 1000 || !slices.IsSorted(s.Journal.Subscriptions) ||
		s.Journal.Subscriptions[0] != uri1K(1) || s.Journal.Subscriptions[999] != uri1K(1000) {
		t.Fatalf("Load: %d subscriptions, want the 1000 noted, sorted", len(s.Journal.Subscriptions))
	}
}

// BenchmarkNote: one subscription and its unsubscription of a 1 KiB URI, in
// turn, on a session that holds 10 or 1000 others; sent-B/op is what each
// Note sent to Redis, which must not grow with the others.
func BenchmarkNote(b *testing.B) {
	for _, n := range []int{10, 1000} {
		b.Run(fmt.Sprintf("memory/subs=%d", n), func(b *testing.B) {
			benchNote(b, session.NewMemShared(), n, nil)
		})
		b.Run(fmt.Sprintf("redis/subs=%d", n), func(b *testing.B) {
			st, raw, _ := redisPair(b)
			benchNote(b, st, n, raw)
		})
	}
}

func benchNote(b *testing.B, sh session.Shared, n int, raw *redis.Client) {
	ctx := context.Background()
	id := session.NewClientID()
	for i := range n {
		if err := sh.Note(ctx, id, session.JournalChange{URI: uri1K(i), Subscribed: true}); err != nil {
			b.Fatal(err)
		}
	}
	u := uri1K(n)
	var r0 int64
	if raw != nil {
		r0 = received(b, raw)
	}
	i := 0
	for b.Loop() {
		if err := sh.Note(ctx, id, session.JournalChange{URI: u, Subscribed: i%2 == 0}); err != nil {
			b.Fatal(err)
		}
		i++
	}
	if raw != nil {
		b.ReportMetric(float64(received(b, raw)-r0)/float64(i), "sent-B/op")
	}
}
