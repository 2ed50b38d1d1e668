package session

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestHealDupSuppress: N concurrent failures under one generation cause
// exactly one re-init, and every caller gets the new upstream.
func TestHealDupSuppress(t *testing.T) {
	t.Parallel()
	s := New(NewClientID(), Recipe{}, "up-1")
	_, gen := s.Current()
	var inits atomic.Int32
	release := make(chan struct{})
	init := func(context.Context) (UpstreamID, uint64, error) {
		inits.Add(1)
		<-release
		return "up-2", 0, nil
	}
	const n = 50
	var wg sync.WaitGroup
	results := make(chan UpstreamID, n)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			up, g, err := s.Heal(context.Background(), gen, time.Second, init)
			if err != nil || g != gen+1 {
				t.Errorf("Heal = %q, %d, %v; want up-2, %d, nil", up, g, err, gen+1)
			}
			results <- up
		}()
	}
	// Let every goroutine reach Heal before the leader finishes.
	for deadline := time.Now().Add(2 * time.Second); inits.Load() == 0 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	close(release)
	wg.Wait()
	close(results)
	for up := range results {
		if up != "up-2" {
			t.Errorf("upstream = %q, want up-2", up)
		}
	}
	if got := inits.Load(); got != 1 {
		t.Fatalf("inits = %d, want 1", got)
	}
}

// TestHealStaleGeneration: a failure reported under an old generation does
// not re-init again; it is pointed at the current upstream.
func TestHealStaleGeneration(t *testing.T) {
	t.Parallel()
	s := New(NewClientID(), Recipe{}, "up-1")
	_, g1 := s.Current()
	n := 0
	init := func(context.Context) (UpstreamID, uint64, error) { n++; return UpstreamID("up-new"), 0, nil }
	if _, _, err := s.Heal(context.Background(), g1, time.Second, init); err != nil {
		t.Fatal(err)
	}
	up, g, err := s.Heal(context.Background(), g1, time.Second, init) // late failure of gen 1
	if err != nil || up != "up-new" || g != g1+1 || n != 1 {
		t.Fatalf("late Heal = %q, %d, %v with %d inits; want up-new, %d, nil with 1", up, g, err, n, g1+1)
	}
}

// TestHealFailureKeepsGeneration: a failed re-init leaves the generation,
// so the next failure tries again.
func TestHealFailureKeepsGeneration(t *testing.T) {
	t.Parallel()
	s := New(NewClientID(), Recipe{}, "up-1")
	_, g := s.Current()
	boom := errors.New("refused")
	if _, _, err := s.Heal(context.Background(), g, time.Second, func(context.Context) (UpstreamID, uint64, error) {
		return "", 0, boom
	}); !errors.Is(err, boom) {
		t.Fatalf("Heal error = %v, want %v", err, boom)
	}
	up, g2 := s.Current()
	if up != "up-1" || g2 != g {
		t.Fatalf("after failed heal Current = %q, %d; want up-1, %d", up, g2, g)
	}
	up, g3, err := s.Heal(context.Background(), g, time.Second, func(context.Context) (UpstreamID, uint64, error) { return "up-2", 0, nil })
	if err != nil || up != "up-2" || g3 != g+1 {
		t.Fatalf("retry Heal = %q, %d, %v", up, g3, err)
	}
}

// TestHealWaiterDeadline: a waiter whose own deadline passes returns, while
// the leader's re-init still completes for everyone else.
func TestHealWaiterDeadline(t *testing.T) {
	t.Parallel()
	s := New(NewClientID(), Recipe{}, "up-1")
	_, g := s.Current()
	release := make(chan struct{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	_, _, err := s.Heal(ctx, g, time.Second, func(context.Context) (UpstreamID, uint64, error) {
		<-release
		return "up-2", 0, nil
	})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Heal error = %v, want deadline exceeded", err)
	}
	close(release)
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if up, g2 := s.Current(); up == "up-2" && g2 == g+1 {
			return
		}
	}
	t.Fatal("leader's re-init never landed")
}

// TestHealPanicIsError: a panicking re-init becomes an error for the
// waiters, not a crash.
func TestHealPanicIsError(t *testing.T) {
	t.Parallel()
	s := New(NewClientID(), Recipe{}, "up-1")
	_, g := s.Current()
	_, _, err := s.Heal(context.Background(), g, time.Second, func(context.Context) (UpstreamID, uint64, error) { panic("bug") })
	if err == nil {
		t.Fatal("Heal after panic returned nil error")
	}
}

func TestNewClientID(t *testing.T) {
	t.Parallel()
	seen := map[ClientID]bool{}
	for range 1000 {
		id := NewClientID()
		if len(id) != 32 || seen[id] {
			t.Fatalf("NewClientID() = %q: want 32 unique hex chars", id)
		}
		for _, c := range []byte(id) {
			if c < 0x21 || c > 0x7e {
				t.Fatalf("NewClientID() = %q has a non-visible character", id)
			}
		}
		seen[id] = true
	}
}

func TestJournal(t *testing.T) {
	t.Parallel()
	s := New(NewClientID(), Recipe{}, "u")
	if j := s.Journal(); j.Level != "" || len(j.Subscriptions) != 0 {
		t.Fatalf("new session journal = %+v, want empty", j)
	}
	s.SetLevel(`{"level":"info"}`)
	s.SetLevel(`{"level":"debug"}`)
	s.Subscribe("file:///b", true)
	s.Subscribe("file:///a", true)
	s.Subscribe("file:///c", true)
	s.Subscribe("file:///c", false)
	j := s.Journal()
	if j.Level != `{"level":"debug"}` || len(j.Subscriptions) != 2 || j.Subscriptions[0] != "file:///a" || j.Subscriptions[1] != "file:///b" {
		t.Fatalf("journal = %+v", j)
	}
}

func TestSeeTools(t *testing.T) {
	t.Parallel()
	s := New(NewClientID(), Recipe{}, "u")
	if s.SeeTools([]byte(`{"tools":[1]}`)) || !s.ToolsSeen() {
		t.Fatal("first tools/list reported a change")
	}
	if s.SeeTools([]byte(`{"tools":[1]}`)) {
		t.Fatal("same list reported a change")
	}
	if !s.SeeTools([]byte(`{"tools":[1,2]}`)) {
		t.Fatal("changed list not reported")
	}
}

// TestProbeOnePerOutage: of the requests waiting out an outage on one
// session, one is elected to retry; the others are released together when
// it is done, and the next outage elects again.
func TestProbeOnePerOutage(t *testing.T) {
	t.Parallel()
	s := New(NewClientID(), Recipe{}, "up-1")
	lead, done := s.Probe()
	if !lead || done != nil {
		t.Fatalf("first Probe = %v, %v; want the lead", lead, done)
	}
	var waits []<-chan struct{}
	for range 3 {
		lead, done := s.Probe()
		if lead || done == nil {
			t.Fatalf("Probe during a probe = %v, %v; want a wait", lead, done)
		}
		waits = append(waits, done)
	}
	for _, w := range waits {
		select {
		case <-w:
			t.Fatal("a waiter was released before the probe ended")
		default:
		}
	}
	s.ProbeDone()
	for _, w := range waits {
		select {
		case <-w:
		case <-time.After(time.Second):
			t.Fatal("a waiter was not released when the probe ended")
		}
	}
	s.ProbeDone() // a second end is harmless
	if lead, _ := s.Probe(); !lead {
		t.Fatal("the next outage elected no probe")
	}
}

// TestRestoredHealsOnce: a restored session needs an upstream session; the
// first heal creates it (however many requests ask at once) and clears the
// need.
func TestRestoredHealsOnce(t *testing.T) {
	s := Restored("m-sealed", Recipe{InitBody: "{}", ProtocolVersion: "2025-11-25"})
	if !s.NeedsInit() {
		t.Fatal("a restored session needs its upstream session")
	}
	up, gen := s.Current()
	if up != "" || gen != 1 {
		t.Fatalf("Current = %q %d", up, gen)
	}
	var inits atomic.Int64
	init := func(context.Context) (UpstreamID, uint64, error) {
		inits.Add(1)
		time.Sleep(10 * time.Millisecond)
		return "up-1", 0, nil
	}
	var wg sync.WaitGroup
	for range 5 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if up, gen, err := s.Heal(context.Background(), 1, time.Second, init); err != nil || up != "up-1" || gen != 2 {
				t.Errorf("Heal = %q %d %v", up, gen, err)
			}
		}()
	}
	wg.Wait()
	if inits.Load() != 1 || s.NeedsInit() {
		t.Fatalf("%d inits, needs init %v; want 1, false", inits.Load(), s.NeedsInit())
	}
}

// TestParamHeadersBounded: a session keeps the x-mcp-header parameters of
// its tools, at most maxParamHeaders in all, however many the upstream
// lists; a tool listed again replaces its own.
func TestParamHeadersBounded(t *testing.T) {
	t.Parallel()
	s := &Session{}
	s.SetParamHeaders("a", map[string]string{"region": "Region"})
	if got := s.ParamHeaders("a")["region"]; got != "Region" {
		t.Fatalf("ParamHeaders(a) = %q", got)
	}
	big := map[string]string{}
	for i := range maxParamHeaders {
		big[fmt.Sprint("p", i)] = "H"
	}
	s.SetParamHeaders("b", big)
	if s.ParamHeaders("b") != nil {
		t.Error("a tool past the bound was kept")
	}
	s.SetParamHeaders("a", nil)
	s.SetParamHeaders("b", big)
	if len(s.ParamHeaders("b")) != maxParamHeaders || s.ParamHeaders("a") != nil {
		t.Errorf("after forgetting a: b has %d, a %v", len(s.ParamHeaders("b")), s.ParamHeaders("a"))
	}
}
