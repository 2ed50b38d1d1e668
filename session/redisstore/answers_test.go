package redisstore_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/mcpheal/mcpheal/session"
	"github.com/mcpheal/mcpheal/session/redisstore"
	"github.com/mcpheal/mcpheal/session/redisstore/redistest"
)

func answerStore(t *testing.T) *redisstore.Store {
	t.Helper()
	srv := redistest.Start(t)
	st, err := redisstore.New(redisstore.Config{Addr: srv.Addr, Prefix: "t", TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

func events(from, to int) [][]byte {
	var evs [][]byte
	for n := from; n <= to; n++ {
		evs = append(evs, []byte("id: m1-"+strconv.Itoa(n)+"\ndata: {}\n\n"))
	}
	return evs
}

// TestAnswerLog: an answer's log in Redis, as one owner writes it and
// another process reads it: the events after the reader's, each once
// however often it is written, the last resume_buffer bytes of them,
// the upstream's last id, the end, and the owner's lease that only one
// process takes over, and only once it ran out.
func TestAnswerLog(t *testing.T) {
	t.Parallel()
	st := answerStore(t)
	ctx := context.Background()
	info := &session.AnswerInfo{Session: "s1", Request: "7", Upstream: "up-1", Version: "2025-06-18", Owner: "a"}
	w := func(w session.AnswerWrite) bool {
		t.Helper()
		w.Max, w.Window = 1<<20, time.Minute
		if w.Lease == 0 {
			w.Lease = time.Minute
		}
		if w.Owner == "" {
			w.Owner = "a"
		}
		ok, err := st.WriteAnswer(ctx, "m1", &w)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	read := func(after int, wait time.Duration) session.AnswerRead {
		t.Helper()
		r, err := st.ReadAnswer(ctx, "m1", after, wait, true)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	if r := read(0, 0); r.Found {
		t.Fatalf("read before the first write: %+v", r)
	}
	if !w(session.AnswerWrite{Open: info, Events: events(1, 3), First: 1, UpLastID: "u3"}) {
		t.Fatal("the first write was refused")
	}
	// Written again (a retried write), and on: each event once.
	if !w(session.AnswerWrite{Events: events(2, 5), First: 2, UpLastID: "u5"}) {
		t.Fatal("the owner's write was refused")
	}
	r := read(1, 0)
	if !r.Found || r.Info != *info || len(r.Events) != 4 || r.First != 2 || r.Last != 5 || r.Tail != 5 || r.UpLastID != "u5" || r.Numbered != 5 ||
		r.Done || r.Lost || !r.OwnerLive || !r.Read {
		t.Fatalf("read after 1: %+v", r)
	}
	if string(r.Events[0]) != string(events(2, 2)[0]) {
		t.Fatalf("event 2 = %q", r.Events[0])
	}
	if r := read(5, 0); len(r.Events) != 0 || r.Last != 5 || r.Tail != 5 {
		t.Fatalf("read after the last: %+v", r)
	}

	// A reader waiting for more wakes at the next write.
	got := make(chan session.AnswerRead, 1)
	go func() {
		r, _ := st.ReadAnswer(ctx, "m1", 5, 10*time.Second, true)
		got <- r
	}()
	if !w(session.AnswerWrite{Events: events(6, 6), First: 6}) {
		t.Fatal("write 6 refused")
	}
	if r := <-got; len(r.Events) != 1 || r.First != 6 || r.UpLastID != "u5" {
		t.Fatalf("the waiting reader got %+v", r)
	}

	// Another process cannot take it while the lease runs, nor write it.
	if ok, err := st.TakeAnswer(ctx, "m1", "b", time.Minute); ok || err != nil {
		t.Fatalf("take under a live lease: %v %v", ok, err)
	}
	if w(session.AnswerWrite{Owner: "b", Events: events(7, 7), First: 7}) {
		t.Fatal("a process that does not own the answer wrote it")
	}
	// The lease runs out: one process takes it, the old owner writes no more.
	if !w(session.AnswerWrite{Lease: time.Millisecond}) {
		t.Fatal("renewal refused")
	}
	deadline := time.Now().Add(5 * time.Second)
	for read(6, 0).OwnerLive {
		if time.Now().After(deadline) {
			t.Fatal("a 1 ms lease still live after 5 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	wins := 0
	for _, p := range []string{"b", "c"} {
		if ok, err := st.TakeAnswer(ctx, "m1", p, time.Minute); err != nil {
			t.Fatal(err)
		} else if ok {
			wins++
		}
	}
	if wins != 1 {
		t.Fatalf("%d processes took the answer over, want 1", wins)
	}
	if w(session.AnswerWrite{Owner: "a", Events: events(7, 7), First: 7}) {
		t.Fatal("the old owner wrote an answer taken over")
	}
	if r := read(0, 0); r.Info.Owner != "b" {
		t.Fatalf("owner %q after the take, want b", r.Info.Owner)
	}
	// Event 9 was larger than Max: not written, but numbered, with its id.
	if !w(session.AnswerWrite{Owner: "b", Events: events(7, 8), First: 7, Last: 9, UpLastID: "u9", Done: true}) {
		t.Fatal("the new owner's write refused")
	}
	r = read(6, time.Second)
	if len(r.Events) != 2 || r.Last != 8 || r.Tail != 8 || r.Numbered != 9 || !r.Done || r.UpLastID != "u9" {
		t.Fatalf("read of the ended answer: %+v", r)
	}
	if ok, _ := st.TakeAnswer(ctx, "m1", "c", time.Minute); ok {
		t.Fatal("an ended answer was taken over")
	}
	if err := st.DropAnswer(ctx, "m1", "a"); err != nil {
		t.Fatal(err)
	}
	if r := read(0, 0); !r.Found {
		t.Fatal("a process that no longer owns the answer dropped it")
	}
	if err := st.DropAnswer(ctx, "m1", "b"); err != nil {
		t.Fatal(err)
	}
	if r := read(0, 0); r.Found {
		t.Fatalf("read after the drop: %+v", r)
	}
}

// TestAnswerLogKeepsLastBytes: the log keeps the last Max bytes of events
// (at least one event); a reader from further back finds them lost, and
// one after an event left out (larger than Max) too.
func TestAnswerLogKeepsLastBytes(t *testing.T) {
	t.Parallel()
	st := answerStore(t)
	ctx := context.Background()
	evs := events(1, 10)
	w := session.AnswerWrite{Open: &session.AnswerInfo{Session: "s", Owner: "a"}, Owner: "a", Events: evs, First: 1,
		Max: 3 * len(evs[9]), Lease: time.Minute, Window: time.Minute}
	if ok, err := st.WriteAnswer(ctx, "m1", &w); !ok || err != nil {
		t.Fatal(ok, err)
	}
	r, err := st.ReadAnswer(ctx, "m1", 2, 0, false)
	if err != nil || !r.Lost || r.First != 8 || len(r.Events) != 3 || r.Read {
		t.Fatalf("read from before what is kept: %+v %v", r, err)
	}
	if r, _ := st.ReadAnswer(ctx, "m1", 7, 0, false); r.Lost || len(r.Events) != 3 {
		t.Fatalf("read of what is kept: %+v", r)
	}
	// Event 11 was not kept: a reader at 10 finds 12 after a gap.
	w = session.AnswerWrite{Owner: "a", Events: events(12, 12), First: 12, Max: w.Max, Lease: time.Minute, Window: time.Minute}
	if ok, err := st.WriteAnswer(ctx, "m1", &w); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if r, _ := st.ReadAnswer(ctx, "m1", 10, 0, false); !r.Lost || r.First != 12 {
		t.Fatalf("read across a left-out event: %+v", r)
	}
}
