package proxy

import (
	"github.com/mcpheal/mcpheal/classify"
	"github.com/mcpheal/mcpheal/proxy/internal/obs"
)

// Stats is a snapshot of one upstream's counters.
type Stats struct {
	Requests       uint64
	UpstreamInits  uint64
	Heals          uint64 // successful re-inits, whatever their reason
	HealFailures   uint64
	Replays        uint64
	Keepalives     uint64 // keepalive pings the upstream answered (mcpheal_keepalive_total{result="ok"})
	ReplaysRefused uint64
	// UnsafeResends counts requests that are not replay-safe sent again
	// although they may have run: always 0 unless mcpheal has a bug.
	UnsafeResends uint64
	UpstreamDown  uint64
	AgentGone     uint64 // requests whose agent closed its connection while they waited on the upstream
	Panics        uint64
	Sessions      int
	Classes       map[classify.Class]uint64
	// SharedAnswers counts what became of answers a fleet shares, by
	// result: written, fallback, served, taken, missing
	// (mcpheal_shared_answers_total).
	SharedAnswers map[string]uint64
}

// Stats returns a snapshot of the counters.
func (s *Server) Stats() Stats {
	c := &s.count
	st := Stats{
		UpstreamInits:  c.UpstreamInits.Load(),
		Replays:        c.Replays.Load(),
		Keepalives:     c.Keepalive[obs.KeepaliveOK].Load(),
		ReplaysRefused: c.ReplaysRefused.Load(),
		UnsafeResends:  c.UnsafeResends.Load(),
		UpstreamDown:   c.UpstreamDown.Load(),
		AgentGone:      c.AgentGone.Load(),
		Panics:         c.Panics.Load(),
		Sessions:       s.sessions.Store.Len(),
		Classes:        make(map[classify.Class]uint64),
		SharedAnswers:  make(map[string]uint64),
	}
	for i, name := range obs.SharedNames {
		st.SharedAnswers[name] = c.SharedAnswers[i].Load()
	}
	for m := range c.Requests {
		for k := range c.Requests[m] {
			st.Requests += c.Requests[m][k].Load()
		}
	}
	for r := range c.Heals {
		st.Heals += c.Heals[r][obs.OutcomeOK].Load()
		st.HealFailures += c.Heals[r][obs.OutcomeFailed].Load() + c.Heals[r][obs.OutcomeRefused].Load()
	}
	for i := range c.Classes {
		if v := c.Classes[i].Load(); v > 0 {
			st.Classes[classify.Class(i)] = v
		}
	}
	return st
}
