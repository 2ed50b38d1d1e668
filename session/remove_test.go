package session

import (
	"sync"
	"sync/atomic"
	"testing"
)

// TestRemoveReportsOnce: of several concurrent Removes of one session,
// one succeeds (each success gives the memory budget back).
func TestRemoveReportsOnce(t *testing.T) {
	st, _ := NewStore(StoreConfig{}, nil)
	defer st.Close()
	doubles := 0
	for i := 0; i < 20000; i++ {
		s := New(NewClientID(), Recipe{}, "u")
		if err := st.Add(s); err != nil {
			t.Fatal(err)
		}
		var oks atomic.Int32
		var wg sync.WaitGroup
		start := make(chan struct{})
		for j := 0; j < 4; j++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				if _, ok := st.Remove(s.ID); ok {
					oks.Add(1)
				}
			}()
		}
		close(start)
		wg.Wait()
		if oks.Load() > 1 {
			doubles++
		}
	}
	if doubles > 0 {
		t.Fatalf("Remove reported the same session removed by several callers in %d of 2000 rounds (each gives its memory budget back)", doubles)
	}
}
