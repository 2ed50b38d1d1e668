package session

import (
	"errors"
	"sync"
	"testing"
	"time"
)

func collect() (func(*Session), func() []ClientID) {
	var mu sync.Mutex
	var got []ClientID
	return func(s *Session) {
			mu.Lock()
			got = append(got, s.ID)
			mu.Unlock()
		}, func() []ClientID {
			mu.Lock()
			defer mu.Unlock()
			return append([]ClientID(nil), got...)
		}
}

// TestStoreIdleExpiry: a session unused for IdleTTL is dropped and handed to
// onDrop; a session in use stays.
func TestStoreIdleExpiry(t *testing.T) {
	onDrop, dropped := collect()
	st, err := NewStore(StoreConfig{IdleTTL: 100 * time.Millisecond}, onDrop)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	idle := New("idle", Recipe{}, "u1")
	busy := New("busy", Recipe{}, "u2")
	st.Add(idle)
	st.Add(busy)
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		if _, ok := st.Get("busy"); !ok {
			t.Fatal("busy session expired while in use")
		}
		if d := dropped(); len(d) == 1 {
			if d[0] != "idle" {
				t.Fatalf("dropped %v, want [idle]", d)
			}
			if _, ok := st.Get("idle"); ok {
				t.Fatal("expired session still found")
			}
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("idle session never expired; dropped %v", dropped())
}

// TestStoreAdmission: at MaxSessions a new session takes the place of the
// oldest one never used and past its grace, and of no other: a used session
// is never evicted to admit a newcomer (a flood of bare initializes once
// evicted an idle agent at work), and without such a place Add refuses.
func TestStoreAdmission(t *testing.T) {
	onDrop, dropped := collect()
	st, err := NewStore(StoreConfig{MaxSessions: 2, Grace: 50 * time.Millisecond}, onDrop)
	if err != nil {
		t.Fatal(err)
	}
	victim, junk := New("victim", Recipe{}, ""), New("junk1", Recipe{}, "")
	for _, s := range []*Session{victim, junk} {
		if err := st.Add(s); err != nil {
			t.Fatalf("Add(%s): %v", s.ID, err)
		}
	}
	st.Used(victim)
	if err := st.Add(New("junk2", Recipe{}, "")); !errors.Is(err, ErrFull) {
		t.Fatalf("Add within junk1's grace = %v, want ErrFull", err)
	}
	time.Sleep(60 * time.Millisecond) // victim is now idle too
	if err := st.Add(New("junk2", Recipe{}, "")); err != nil {
		t.Fatalf("Add past junk1's grace: %v", err)
	}
	if err := st.Add(New("junk3", Recipe{}, "")); !errors.Is(err, ErrFull) {
		t.Fatalf("Add with only the used victim and a fresh junk2 = %v, want ErrFull", err)
	}
	if _, ok := st.Get("victim"); !ok {
		t.Fatal("the used session was evicted")
	}
	if s, ok := st.Remove("junk2"); !ok || !s.Removed() {
		t.Fatal("Remove(junk2) failed")
	}
	st.Close() // drains queued drops
	if d := dropped(); len(d) != 1 || d[0] != "junk1" {
		t.Fatalf("dropped %v, want [junk1] (Remove does not call onDrop)", d)
	}
	if st.Len() != 1 {
		t.Fatalf("Len = %d, want 1", st.Len())
	}
}

// TestStorePerCredential: past MaxPerCredential a credential's new session
// takes the place of its own oldest unused one, never another credential's;
// the count follows removals.
func TestStorePerCredential(t *testing.T) {
	st, err := NewStore(StoreConfig{MaxPerCredential: 1, Grace: time.Nanosecond}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	a1, b1 := New("a1", Recipe{Credential: "A"}, ""), New("b1", Recipe{Credential: ""}, "")
	if st.Add(a1) != nil || st.Add(b1) != nil {
		t.Fatal("first sessions refused")
	}
	time.Sleep(time.Millisecond)
	if err := st.Add(New("a2", Recipe{Credential: "A"}, "")); err != nil {
		t.Fatalf("Add(a2): %v", err)
	}
	if st.Has("a1") || !st.Has("b1") {
		t.Fatalf("a2 must replace a1 (unused) and leave b1: a1 %v b1 %v", st.Has("a1"), st.Has("b1"))
	}
	st.Used(b1)
	if err := st.Add(New("b2", Recipe{Credential: ""}, "")); !errors.Is(err, ErrCredentialFull) {
		t.Fatalf("Add(b2) with b1 used = %v, want ErrCredentialFull", err)
	}
	st.Remove("b1")
	if err := st.Add(New("b2", Recipe{Credential: ""}, "")); err != nil || st.Count("") != 1 {
		t.Fatalf("Add(b2) after Remove(b1) = %v, count %d", err, st.Count(""))
	}
}

// TestStoreCompact: the admission queues let go of sessions used or gone,
// so that they can be collected.
func TestStoreCompact(t *testing.T) {
	st, err := NewStore(StoreConfig{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for i := range 100 {
		s := New(ClientID(NewClientID()), Recipe{Credential: string(rune('a' + i%10))}, "")
		if err := st.Add(s); err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 {
			st.Used(s)
		} else {
			st.Remove(s.ID)
		}
	}
	st.compact()
	st.mu.Lock()
	defer st.mu.Unlock()
	if len(st.unusedAll) != 0 || len(st.unused) != 0 || st.cache.Len() != 50 || st.counts["a"] != 10 {
		t.Fatalf("after compact: %d queued, %d credentials queued, %d live, %d under a; want 0, 0, 50, 10",
			len(st.unusedAll), len(st.unused), st.cache.Len(), st.counts["a"])
	}
}

// TestStoreEvictCallbackNonBlocking: onDrop that blocks does not stall Add,
// which runs the LRU's eviction callback under its lock.
func TestStoreEvictCallbackNonBlocking(t *testing.T) {
	block := make(chan struct{})
	st, err := NewStore(StoreConfig{MaxSessions: 1, Grace: time.Nanosecond}, func(*Session) { <-block })
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		for i := range 2000 {
			_ = st.Add(New(ClientID(rune('a'+i%26))+ClientID(NewClientID()), Recipe{}, ""))
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Add blocked behind a slow onDrop")
	}
	close(block)
	st.Close()
}
