package proxy

import "github.com/mcpheal/mcpheal/classify"

// Stats is a snapshot of one upstream's counters.
type Stats struct {
	Requests       uint64
	UpstreamInits  uint64
	Heals          uint64 // successful re-inits, whatever their reason
	HealFailures   uint64
	Replays        uint64
	ReplaysRefused uint64
	// UnsafeResends counts requests that are not replay-safe sent again
	// although they may have run: always 0 unless mcpheal has a bug.
	UnsafeResends uint64
	UpstreamDown  uint64
	AgentGone     uint64 // requests whose agent closed its connection while they waited on the upstream
	Panics        uint64
	Sessions      int
	Classes       map[classify.Class]uint64
}

// Stats returns a snapshot of the counters.
func (s *Server) Stats() Stats {
	c := &s.count
	st := Stats{
		UpstreamInits:  c.upstreamInits.Load(),
		Replays:        c.replays.Load(),
		ReplaysRefused: c.replaysRefused.Load(),
		UnsafeResends:  c.unsafeResends.Load(),
		UpstreamDown:   c.upstreamDown.Load(),
		AgentGone:      c.agentGone.Load(),
		Panics:         c.panics.Load(),
		Sessions:       s.sessions.store.Len(),
		Classes:        make(map[classify.Class]uint64),
	}
	for m := range c.requests {
		for k := range c.requests[m] {
			st.Requests += c.requests[m][k].Load()
		}
	}
	for r := range c.heals {
		st.Heals += c.heals[r][outcomeOK].Load()
		st.HealFailures += c.heals[r][outcomeFailed].Load() + c.heals[r][outcomeRefused].Load()
	}
	for i := range c.classes {
		if v := c.classes[i].Load(); v > 0 {
			st.Classes[classify.Class(i)] = v
		}
	}
	return st
}
