package proxy

import (
	"sync/atomic"

	"github.com/mcpheal/mcpheal/classify"
)

// counters is the one place where the proxy counts what it did. Later
// exposition (/metrics) reads a Stats snapshot.
type counters struct {
	requests       atomic.Uint64
	upstreamInits  atomic.Uint64 // initialize requests sent upstream (agent's and re-inits)
	heals          atomic.Uint64 // successful re-inits
	healFailures   atomic.Uint64
	replays        atomic.Uint64 // requests sent again after a failure
	replaysRefused atomic.Uint64 // ambiguous failures not replayed
	upstreamDown   atomic.Uint64 // 503 answers after the heal budget
	panics         atomic.Uint64
	classes        [classify.Protocol + 1]atomic.Uint64
}

// Stats is a snapshot of the proxy's counters.
type Stats struct {
	Requests       uint64
	UpstreamInits  uint64
	Heals          uint64
	HealFailures   uint64
	Replays        uint64
	ReplaysRefused uint64
	UpstreamDown   uint64
	Panics         uint64
	Sessions       int
	Classes        map[classify.Class]uint64
}

// Stats returns a snapshot of the counters.
func (s *Server) Stats() Stats {
	c := &s.count
	st := Stats{
		Requests:       c.requests.Load(),
		UpstreamInits:  c.upstreamInits.Load(),
		Heals:          c.heals.Load(),
		HealFailures:   c.healFailures.Load(),
		Replays:        c.replays.Load(),
		ReplaysRefused: c.replaysRefused.Load(),
		UpstreamDown:   c.upstreamDown.Load(),
		Panics:         c.panics.Load(),
		Sessions:       s.store.Len(),
		Classes:        make(map[classify.Class]uint64),
	}
	for i := range c.classes {
		if v := c.classes[i].Load(); v > 0 {
			st.Classes[classify.Class(i)] = v
		}
	}
	return st
}

func (c *counters) class(k classify.Class) {
	if int(k) < len(c.classes) {
		c.classes[k].Add(1)
	}
}
