package wire

import "testing"

// TestQueueCounts: a queued event is counted until taken or the queue
// closes, never past the budget, and never given back twice.
func TestQueueCounts(t *testing.T) {
	mem := &Budget{Limit: 100}
	q := NewQueue(mem, 4)
	quit := make(chan struct{})
	ev := make([]byte, 40)
	for i, want := range []int{Queued, Queued, OverBudget} {
		if got := q.Put(ev, quit); got != want {
			t.Fatalf("put %d: %d, want %d", i, got, want)
		}
	}
	if u := mem.Used.Load(); u != 80 {
		t.Fatalf("two events of 40 queued: %d counted", u)
	}
	q.Took(<-q.C)
	if u := mem.Used.Load(); u != 40 {
		t.Fatalf("one taken: %d counted, want 40", u)
	}
	q.Close()
	if u := mem.Used.Load(); u != 0 {
		t.Fatalf("closed with one queued: %d counted, want 0", u)
	}
	q.Took(<-q.C) // taken after the close: given back by the close already
	if u := mem.Used.Load(); u != 0 {
		t.Fatalf("a take after the close gave back again: %d", u)
	}
	if got := q.Put(ev, quit); got != Stopped {
		t.Fatalf("put after close: %d, want Stopped", got)
	}
}

// TestQueueGivesUp: a Put that finds no room gives its count back when
// quit closes, a TryPut at once.
func TestQueueGivesUp(t *testing.T) {
	mem := &Budget{Limit: 1 << 20}
	q := NewQueue(mem, 1)
	quit := make(chan struct{})
	ev := make([]byte, 10)
	if q.Put(ev, quit) != Queued {
		t.Fatal("first put")
	}
	if got := q.TryPut(ev); got != Late {
		t.Fatalf("full queue, TryPut: %d, want Late", got)
	}
	close(quit)
	if got := q.Put(ev, quit); got != Stopped {
		t.Fatalf("full queue, quit closed: %d, want Stopped", got)
	}
	if u := mem.Used.Load(); u != 10 {
		t.Fatalf("one event queued: %d counted, want 10", u)
	}
	q.Close()
	if u := mem.Used.Load(); u != 0 {
		t.Fatalf("after close: %d counted", u)
	}
}
