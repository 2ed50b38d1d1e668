package session

import (
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

// TestStoreEvictionAndRemove: past MaxSessions the least recently used is
// dropped (onDrop called); Remove does not call onDrop.
func TestStoreEvictionAndRemove(t *testing.T) {
	onDrop, dropped := collect()
	st, err := NewStore(StoreConfig{MaxSessions: 2}, onDrop)
	if err != nil {
		t.Fatal(err)
	}
	st.Add(New("a", Recipe{}, ""))
	st.Add(New("b", Recipe{}, ""))
	st.Get("a") // b is now the least recently used
	st.Add(New("c", Recipe{}, ""))
	if s, ok := st.Remove("c"); !ok || !s.Removed() {
		t.Fatal("Remove(c) failed")
	}
	st.Close() // drains queued drops
	if d := dropped(); len(d) != 1 || d[0] != "b" {
		t.Fatalf("dropped %v, want [b]", d)
	}
	if st.Len() != 1 {
		t.Fatalf("Len = %d, want 1", st.Len())
	}
}

// TestStoreEvictCallbackNonBlocking: onDrop that blocks does not stall Add,
// which runs the LRU's eviction callback under its lock.
func TestStoreEvictCallbackNonBlocking(t *testing.T) {
	block := make(chan struct{})
	st, err := NewStore(StoreConfig{MaxSessions: 1}, func(*Session) { <-block })
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		for i := range 2000 {
			st.Add(New(ClientID(rune('a'+i%26))+ClientID(NewClientID()), Recipe{}, ""))
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
