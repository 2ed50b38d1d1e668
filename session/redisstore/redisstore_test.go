package redisstore_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/mcpheal/mcpheal/session"
	"github.com/mcpheal/mcpheal/session/redisstore"
	"github.com/mcpheal/mcpheal/session/redisstore/redistest"
)

// each runs f against both implementations of session.Shared: they must
// behave the same.
func each(t *testing.T, f func(t *testing.T, sh session.Shared)) {
	t.Run("memory", func(t *testing.T) { f(t, session.NewMemShared()) })
	t.Run("redis", func(t *testing.T) {
		srv := redistest.Start(t)
		st, err := redisstore.New(redisstore.Config{Addr: srv.Addr, Prefix: "t", TTL: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		f(t, st)
	})
}

// TestAdvanceOneWinnerPerGeneration: of many processes healing the same
// generation at once, exactly one records its upstream session, and every
// loser learns the winner's.
func TestAdvanceOneWinnerPerGeneration(t *testing.T) {
	each(t, func(t *testing.T, sh session.Shared) {
		ctx := context.Background()
		id := session.NewClientID()
		for from := uint64(1); from <= 3; from++ {
			var wins atomic.Int32
			var wg sync.WaitGroup
			states := make([]session.State, 20)
			for i := range states {
				wg.Add(1)
				go func() {
					defer wg.Done()
					up := session.UpstreamID("up-" + string(rune('a'+i)))
					st, won, err := sh.Advance(ctx, id, from, up)
					if err != nil {
						t.Error(err)
						return
					}
					if won {
						wins.Add(1)
					}
					states[i] = st
				}()
			}
			wg.Wait()
			if wins.Load() != 1 {
				t.Fatalf("generation %d: %d winners, want 1", from, wins.Load())
			}
			for _, st := range states {
				if st.Gen != from+1 || st.Upstream != states[0].Upstream {
					t.Fatalf("generation %d: a caller saw %+v, another %+v", from, st, states[0])
				}
			}
			got, err := sh.Load(ctx, id)
			if err != nil || got.Gen != from+1 || got.Upstream != states[0].Upstream {
				t.Fatalf("Load = %+v, %v; want gen %d up %q", got, err, from+1, states[0].Upstream)
			}
		}
		// A late heal of an old generation does not go back.
		if st, won, _ := sh.Advance(ctx, id, 1, "late"); won || st.Gen != 4 {
			t.Fatalf("late Advance from 1 = %+v, won %v", st, won)
		}
	})
}

// TestAdvanceAfterEmptyStore: a store that lost everything (restarted
// empty) accepts the generation a process brings.
func TestAdvanceAfterEmptyStore(t *testing.T) {
	each(t, func(t *testing.T, sh session.Shared) {
		st, won, err := sh.Advance(context.Background(), session.NewClientID(), 7, "up-8")
		if err != nil || !won || st.Gen != 8 || st.Upstream != "up-8" {
			t.Fatalf("Advance = %+v, %v, %v", st, won, err)
		}
	})
}

// TestEndIsFinal: an ended session loads as ended and never advances again.
func TestEndIsFinal(t *testing.T) {
	each(t, func(t *testing.T, sh session.Shared) {
		ctx := context.Background()
		id := session.NewClientID()
		if _, _, err := sh.Advance(ctx, id, 0, "up-1"); err != nil {
			t.Fatal(err)
		}
		if err := sh.SaveJournal(ctx, id, session.Journal{Level: `{"level":"debug"}`}); err != nil {
			t.Fatal(err)
		}
		if err := sh.End(ctx, id); err != nil {
			t.Fatal(err)
		}
		st, err := sh.Load(ctx, id)
		if err != nil || !st.Ended || st.Upstream != "" {
			t.Fatalf("Load after End = %+v, %v", st, err)
		}
		if st, won, _ := sh.Advance(ctx, id, 1, "up-2"); won || !st.Ended {
			t.Fatalf("Advance after End = %+v, won %v", st, won)
		}
		if st, _ := sh.Load(ctx, id); !st.Ended {
			t.Fatal("a heal brought an ended session back")
		}
	})
}

// TestJournalRoundTrip: the journal comes back as saved; a session with
// none saved reports none.
func TestJournalRoundTrip(t *testing.T) {
	each(t, func(t *testing.T, sh session.Shared) {
		ctx := context.Background()
		id := session.NewClientID()
		if st, _ := sh.Load(ctx, id); st.HasJournal || st.Gen != 0 {
			t.Fatalf("unknown session loads as %+v", st)
		}
		j := session.Journal{Level: `{"level":"warning"}`, Subscriptions: []string{"file:///a", "file:///b\n\"c\""}}
		if err := sh.SaveJournal(ctx, id, j); err != nil {
			t.Fatal(err)
		}
		st, err := sh.Load(ctx, id)
		if err != nil || !st.HasJournal || st.Journal.Level != j.Level || len(st.Journal.Subscriptions) != 2 ||
			st.Journal.Subscriptions[1] != j.Subscriptions[1] {
			t.Fatalf("Load = %+v, %v; want journal %+v", st, err, j)
		}
	})
}

// TestLeadOncePerGeneration: one lease per generation until it expires.
func TestLeadOncePerGeneration(t *testing.T) {
	each(t, func(t *testing.T, sh session.Shared) {
		ctx := context.Background()
		id := session.NewClientID()
		var got atomic.Int32
		var wg sync.WaitGroup
		for range 20 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if ok, err := sh.Lead(ctx, id, 3, 200*time.Millisecond); err != nil {
					t.Error(err)
				} else if ok {
					got.Add(1)
				}
			}()
		}
		wg.Wait()
		if got.Load() != 1 {
			t.Fatalf("%d leaders of generation 3, want 1", got.Load())
		}
		if ok, _ := sh.Lead(ctx, id, 4, time.Second); !ok {
			t.Fatal("generation 4's lease was taken by generation 3's")
		}
		time.Sleep(300 * time.Millisecond)
		if ok, _ := sh.Lead(ctx, id, 3, time.Second); !ok {
			t.Fatal("an expired lease was never released")
		}
	})
}

// TestEveryKeyExpires: nothing the store writes lives forever, and the
// session id itself never reaches Redis.
func TestEveryKeyExpires(t *testing.T) {
	srv := redistest.Start(t)
	st, err := redisstore.New(redisstore.Config{Addr: srv.Addr, Prefix: "up", TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx := context.Background()
	a, b := session.NewClientID(), session.NewClientID()
	_, _, _ = st.Advance(ctx, a, 1, "up-1")
	_, _ = st.Lead(ctx, a, 2, time.Minute)
	_ = st.SaveJournal(ctx, b, session.Journal{Level: "{}"})
	_ = st.End(ctx, a)
	raw := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer raw.Close()
	keys, err := raw.Keys(ctx, "*").Result()
	if err != nil || len(keys) != 3 {
		t.Fatalf("keys = %v, %v; want 3", keys, err)
	}
	for _, k := range keys {
		ttl, _ := raw.PTTL(ctx, k).Result()
		if ttl <= 0 || ttl > time.Hour {
			t.Errorf("key %q has TTL %v", k, ttl)
		}
		if len(k) > 64 || k[:len("mcpheal:up:")] != "mcpheal:up:" {
			t.Errorf("key %q: want mcpheal:up:<digest>", k)
		}
	}
}

// TestStoreDownIsAnError: a store that is down or frozen answers with an
// error within its timeout, never a hang.
func TestStoreDownIsAnError(t *testing.T) {
	srv := redistest.Start(t)
	st, err := redisstore.New(redisstore.Config{Addr: srv.Addr, Prefix: "t", Timeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx := context.Background()
	if err := st.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	srv.Freeze()
	start := time.Now()
	_, err = st.Load(ctx, session.NewClientID())
	if err == nil || time.Since(start) > time.Second {
		t.Fatalf("frozen store: Load err %v after %v", err, time.Since(start))
	}
	srv.Thaw()
	srv.Stop()
	start = time.Now()
	if _, _, err := st.Advance(ctx, session.NewClientID(), 1, "x"); err == nil || time.Since(start) > time.Second {
		t.Fatalf("stopped store: Advance err %v after %v", err, time.Since(start))
	}
}
