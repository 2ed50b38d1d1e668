package proxy

import (
	"strconv"
	"testing"
	"time"
)

// TestGraveyardBounded: the ids ended by DELETE are kept up to maxGraves,
// and burying stays cheap at the cap.
func TestGraveyardBounded(t *testing.T) {
	var g graveyard
	id := string(make([]byte, 400))
	start := time.Now()
	for i := 0; i < 1<<16+5000; i++ {
		g.bury(id+strconv.Itoa(i), 7*24*time.Hour)
	}
	el := time.Since(start)
	if len(g.ids) > maxGraves || len(g.order) != len(g.ids) {
		t.Fatalf("%d ids kept (%d in order) after %d burials, want at most %d", len(g.ids), len(g.order), 1<<16+5000, maxGraves)
	}
	if g.has(id+"0") || !g.has(id+strconv.Itoa(1<<16+4999)) {
		t.Fatal("the oldest id must leave first, the newest stay")
	}
	t.Logf("%d ids buried in %v", 1<<16+5000, el)
}
