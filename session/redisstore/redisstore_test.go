package redisstore_test

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
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
		if err := sh.Note(ctx, id, session.JournalChange{Level: `{"level":"debug"}`}); err != nil {
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

// TestJournalDeltas: the changes noted one by one load back as the whole
// journal, subscriptions sorted; a session none was noted for has none.
func TestJournalDeltas(t *testing.T) {
	const (
		a, b  = "file:///a", "file:///b"
		odd   = "s:file:///c\n\"d\"\x00é" // a field-like prefix, a newline, a quote, a NUL
		debug = `{"level":"debug"}`
		warn  = `{"level":"warning"}`
	)
	sub := func(uri string) session.JournalChange { return session.JournalChange{URI: uri, Subscribed: true} }
	unsub := func(uri string) session.JournalChange { return session.JournalChange{URI: uri} }
	for _, c := range []struct {
		name    string
		changes []session.JournalChange
		want    session.Journal
		has     bool
	}{
		{name: "none noted"},
		{name: "level", changes: []session.JournalChange{{Level: debug}}, want: session.Journal{Level: debug}, has: true},
		{name: "level replaced", changes: []session.JournalChange{{Level: debug}, {Level: warn}},
			want: session.Journal{Level: warn}, has: true},
		{name: "subscriptions sorted", changes: []session.JournalChange{sub(odd), sub(b), sub(a)},
			want: session.Journal{Subscriptions: []string{a, b, odd}}, has: true},
		{name: "subscribed twice is once", changes: []session.JournalChange{sub(a), sub(a)},
			want: session.Journal{Subscriptions: []string{a}}, has: true},
		{name: "unsubscribed", changes: []session.JournalChange{sub(a), sub(b), unsub(a)},
			want: session.Journal{Subscriptions: []string{b}}, has: true},
		{name: "all unsubscribed still has a journal", changes: []session.JournalChange{sub(a), unsub(a)}, has: true},
		{name: "unsubscribed but never subscribed", changes: []session.JournalChange{unsub(a)}, has: true},
		{name: "level and subscription in one change",
			changes: []session.JournalChange{{Level: debug, URI: a, Subscribed: true}},
			want:    session.Journal{Level: debug, Subscriptions: []string{a}}, has: true},
		{name: "an unsubscription keeps the level",
			changes: []session.JournalChange{{Level: debug}, sub(a), unsub(a)},
			want:    session.Journal{Level: debug}, has: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			each(t, func(t *testing.T, sh session.Shared) {
				ctx := context.Background()
				id := session.NewClientID()
				for _, ch := range c.changes {
					if err := sh.Note(ctx, id, ch); err != nil {
						t.Fatalf("Note(%+v): %v", ch, err)
					}
				}
				st, err := sh.Load(ctx, id)
				if err != nil {
					t.Fatal(err)
				}
				if st.HasJournal != c.has || !reflect.DeepEqual(st.Journal, c.want) {
					t.Fatalf("Load: journal %+v (has %v), want %+v (has %v)", st.Journal, st.HasJournal, c.want, c.has)
				}
			})
		})
	}
}

// TestBindAndRecipe: the binding and the initialize come back as recorded,
// alongside the generation and the journal, each write leaving the others'
// fields alone.
func TestBindAndRecipe(t *testing.T) {
	recipe := []byte("{\"jsonrpc\":\"2.0\",\"method\":\"initialize\"}\x00\xff") // any bytes
	for _, c := range []struct {
		name string
		do   func(ctx context.Context, sh session.Shared, id session.ClientID) error
		want session.State
	}{
		{name: "nothing", want: session.State{}},
		{name: "bind", do: func(ctx context.Context, sh session.Shared, id session.ClientID) error {
			return sh.Bind(ctx, id, "cred-2")
		}, want: session.State{Binding: "cred-2"}},
		{name: "bound again", do: func(ctx context.Context, sh session.Shared, id session.ClientID) error {
			if err := sh.Bind(ctx, id, "cred-2"); err != nil {
				return err
			}
			return sh.Bind(ctx, id, "cred-3")
		}, want: session.State{Binding: "cred-3"}},
		{name: "recipe", do: func(ctx context.Context, sh session.Shared, id session.ClientID) error {
			return sh.SaveRecipe(ctx, id, recipe)
		}, want: session.State{Init: recipe}},
		{name: "empty recipe is none", do: func(ctx context.Context, sh session.Shared, id session.ClientID) error {
			return sh.SaveRecipe(ctx, id, []byte{})
		}, want: session.State{}},
		{name: "everything", do: func(ctx context.Context, sh session.Shared, id session.ClientID) error {
			return errors.Join(
				sh.SaveRecipe(ctx, id, recipe),
				sh.Bind(ctx, id, "cred-2"),
				sh.Note(ctx, id, session.JournalChange{URI: "file:///a", Subscribed: true}),
				func() error { _, _, err := sh.Advance(ctx, id, 0, "up-1"); return err }(),
				sh.Bind(ctx, id, "cred-3"),
			)
		}, want: session.State{Upstream: "up-1", Gen: 1, Binding: "cred-3", Init: recipe,
			Journal: session.Journal{Subscriptions: []string{"file:///a"}}, HasJournal: true}},
	} {
		t.Run(c.name, func(t *testing.T) {
			each(t, func(t *testing.T, sh session.Shared) {
				ctx := context.Background()
				id := session.NewClientID()
				if c.do != nil {
					if err := c.do(ctx, sh, id); err != nil {
						t.Fatal(err)
					}
				}
				st, err := sh.Load(ctx, id)
				if err != nil || !reflect.DeepEqual(st, c.want) {
					t.Fatalf("Load = %+v, %v; want %+v", st, err, c.want)
				}
			})
		})
	}
}

// TestWritesAfterEndKeepItEnded: a write that comes after End (a request
// that was already under way) does not bring the session back: Load
// reports it ended and nothing else.
func TestWritesAfterEndKeepItEnded(t *testing.T) {
	for _, c := range []struct {
		name  string
		write func(ctx context.Context, sh session.Shared, id session.ClientID) error
	}{
		{"note subscribe", func(ctx context.Context, sh session.Shared, id session.ClientID) error {
			return sh.Note(ctx, id, session.JournalChange{URI: "file:///b", Subscribed: true})
		}},
		{"note unsubscribe", func(ctx context.Context, sh session.Shared, id session.ClientID) error {
			return sh.Note(ctx, id, session.JournalChange{URI: "file:///a"})
		}},
		{"note level", func(ctx context.Context, sh session.Shared, id session.ClientID) error {
			return sh.Note(ctx, id, session.JournalChange{Level: `{"level":"error"}`})
		}},
		{"bind", func(ctx context.Context, sh session.Shared, id session.ClientID) error {
			return sh.Bind(ctx, id, "cred-2")
		}},
		{"save recipe", func(ctx context.Context, sh session.Shared, id session.ClientID) error {
			return sh.SaveRecipe(ctx, id, []byte(`{"method":"initialize"}`))
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			each(t, func(t *testing.T, sh session.Shared) {
				ctx := context.Background()
				id := session.NewClientID()
				if err := errors.Join(
					sh.Note(ctx, id, session.JournalChange{URI: "file:///a", Subscribed: true}),
					sh.Bind(ctx, id, "cred-1"),
					sh.SaveRecipe(ctx, id, []byte("{}")),
					sh.End(ctx, id),
				); err != nil {
					t.Fatal(err)
				}
				if err := c.write(ctx, sh, id); err != nil {
					t.Fatalf("write after End: %v", err)
				}
				if st, err := sh.Load(ctx, id); err != nil || !reflect.DeepEqual(st, session.State{Ended: true}) {
					t.Fatalf("Load after End and a write = %+v, %v; want only Ended", st, err)
				}
			})
		})
	}
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

// redisPair starts a server and returns a Store on it (prefix "up", TTL an
// hour), a plain client to look at what the Store wrote, and the key of a
// session's hash.
func redisPair(t testing.TB) (*redisstore.Store, *redis.Client, func(session.ClientID) string) {
	t.Helper()
	srv := redistest.Start(t)
	st, err := redisstore.New(redisstore.Config{Addr: srv.Addr, Prefix: "up", TTL: time.Hour, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	raw := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { raw.Close() })
	return st, raw, func(id session.ClientID) string { return "mcpheal:up:" + st.Key(id) }
}

// TestEveryKeyExpires: nothing the store writes lives forever, and the
// session id itself never reaches Redis.
func TestEveryKeyExpires(t *testing.T) {
	st, raw, _ := redisPair(t)
	ctx := context.Background()
	a, b, c, d := session.NewClientID(), session.NewClientID(), session.NewClientID(), session.NewClientID()
	if err := errors.Join(
		func() error { _, _, err := st.Advance(ctx, a, 1, "up-1"); return err }(),
		func() error { _, err := st.Lead(ctx, a, 2, time.Minute); return err }(),
		st.Note(ctx, b, session.JournalChange{Level: "{}", URI: "file:///a", Subscribed: true}),
		st.Bind(ctx, c, "cred"),
		st.SaveRecipe(ctx, d, []byte("{}")),
		st.End(ctx, a),
	); err != nil {
		t.Fatal(err)
	}
	keys, err := raw.Keys(ctx, "*").Result()
	if err != nil || len(keys) != 5 {
		t.Fatalf("keys = %v, %v; want 5", keys, err)
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

// TestEveryWriteRefreshesTTL: a session kept alive by its changes alone
// (no heal for days) lives as long as its last change, not its first.
func TestEveryWriteRefreshesTTL(t *testing.T) {
	st, raw, key := redisPair(t)
	for _, c := range []struct {
		name  string
		write func(ctx context.Context, id session.ClientID) error
	}{
		{"note subscribe", func(ctx context.Context, id session.ClientID) error {
			return st.Note(ctx, id, session.JournalChange{URI: "file:///b", Subscribed: true})
		}},
		{"note unsubscribe", func(ctx context.Context, id session.ClientID) error {
			return st.Note(ctx, id, session.JournalChange{URI: "file:///a"})
		}},
		{"note level", func(ctx context.Context, id session.ClientID) error {
			return st.Note(ctx, id, session.JournalChange{Level: "{}"})
		}},
		{"bind", func(ctx context.Context, id session.ClientID) error { return st.Bind(ctx, id, "cred") }},
		{"save recipe", func(ctx context.Context, id session.ClientID) error { return st.SaveRecipe(ctx, id, []byte("{}")) }},
		{"advance", func(ctx context.Context, id session.ClientID) error {
			_, _, err := st.Advance(ctx, id, 1, "up-2")
			return err
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			id := session.NewClientID()
			if _, _, err := st.Advance(ctx, id, 0, "up-1"); err != nil {
				t.Fatal(err)
			}
			if err := raw.PExpire(ctx, key(id), time.Minute).Err(); err != nil {
				t.Fatal(err)
			}
			if err := c.write(ctx, id); err != nil {
				t.Fatal(err)
			}
			if ttl, err := raw.PTTL(ctx, key(id)).Result(); err != nil || ttl < 59*time.Minute || ttl > time.Hour {
				t.Fatalf("TTL after the write = %v, %v; want an hour again", ttl, err)
			}
		})
	}
}

// TestTombstoneStaysBare: in Redis, a write after End adds nothing to the
// tombstone, so it holds no journal, binding or initialize of the session.
func TestTombstoneStaysBare(t *testing.T) {
	st, raw, key := redisPair(t)
	ctx := context.Background()
	id := session.NewClientID()
	if err := errors.Join(
		st.Note(ctx, id, session.JournalChange{Level: "{}", URI: "file:///a", Subscribed: true}),
		st.End(ctx, id),
		st.Note(ctx, id, session.JournalChange{Level: "{}", URI: "file:///b", Subscribed: true}),
		st.Note(ctx, id, session.JournalChange{URI: "file:///a"}),
		st.Bind(ctx, id, "cred"),
		st.SaveRecipe(ctx, id, []byte("{}")),
	); err != nil {
		t.Fatal(err)
	}
	h, err := raw.HGetAll(ctx, key(id)).Result()
	if err != nil || !reflect.DeepEqual(h, map[string]string{"end": "1"}) {
		t.Fatalf("tombstone = %q, %v; want only end", h, err)
	}
}

// TestLoadReadsOldJournal: a fleet upgraded in place holds hashes whose
// journal an older mcpheal wrote whole, as JSON in field j. Load reads it,
// and the first write turns it into fields, so that an unsubscription of a
// URI it lists holds.
func TestLoadReadsOldJournal(t *testing.T) {
	st, raw, key := redisPair(t)
	ctx := context.Background()
	// The old encoding, byte for byte: encoding/json of this struct.
	old := func(level string, subs ...string) string {
		b, err := json.Marshal(struct {
			Level string   `json:"l,omitempty"`
			Subs  []string `json:"s,omitempty"`
		}{level, subs})
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	// What encoding/json escapes, and a character beyond 16 bits; "<" sorts
	// before the letters.
	const odd = "file:///<&>\u2028\"é😀"
	load := func(id session.ClientID) session.State {
		t.Helper()
		s, err := st.Load(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}

	t.Run("read, then migrated by a write", func(t *testing.T) {
		id := session.NewClientID()
		raw.HSet(ctx, key(id), "gen", "2", "up", "up-2", "j", old(`{"level":"info"}`, "file:///b", odd, "file:///a"))
		want := session.State{Upstream: "up-2", Gen: 2, HasJournal: true,
			Journal: session.Journal{Level: `{"level":"info"}`, Subscriptions: []string{odd, "file:///a", "file:///b"}}}
		if got := load(id); !reflect.DeepEqual(got, want) {
			t.Fatalf("Load of an old journal = %+v, want %+v", got, want)
		}
		if err := st.Note(ctx, id, session.JournalChange{URI: "file:///a"}); err != nil {
			t.Fatal(err)
		}
		if err := st.Note(ctx, id, session.JournalChange{URI: "file:///c", Subscribed: true}); err != nil {
			t.Fatal(err)
		}
		want.Journal.Subscriptions = []string{odd, "file:///b", "file:///c"}
		if got := load(id); !reflect.DeepEqual(got, want) {
			t.Fatalf("Load after the changes = %+v, want %+v", got, want)
		}
		if n, _ := raw.HExists(ctx, key(id), "j").Result(); n {
			t.Fatal("field j outlived the first write")
		}
	})

	t.Run("written by an old replica after new fields", func(t *testing.T) {
		id := session.NewClientID()
		if err := st.Note(ctx, id, session.JournalChange{Level: "{}", URI: "file:///new", Subscribed: true}); err != nil {
			t.Fatal(err)
		}
		raw.HSet(ctx, key(id), "j", old("", "file:///old"))
		want := session.Journal{Subscriptions: []string{"file:///old"}}
		if got := load(id); !got.HasJournal || !reflect.DeepEqual(got.Journal, want) {
			t.Fatalf("Load = %+v, want journal %+v", got, want)
		}
		if err := st.Bind(ctx, id, "cred"); err != nil {
			t.Fatal(err)
		}
		if got := load(id); !got.HasJournal || !reflect.DeepEqual(got.Journal, want) || got.Binding != "cred" {
			t.Fatalf("Load after a migrating write = %+v, want journal %+v", got, want)
		}
	})
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
