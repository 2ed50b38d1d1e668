package upstream

import (
	"math/rand/v2"
	"time"
)

// Backoff is mcpheal's one schedule of waits between tries: a heal's
// initializes, a request waiting out an outage, the reopening of a GET
// stream or of a bridged listen, and the circuit breaker's cooldown all
// wait by it. Each wait is the current step spread by ±20 % (so that
// sessions that failed together do not come back in lockstep, as the MCP
// Go SDK's calculateReconnectDelay spreads its reconnects), and the step
// doubles from Min up to Max. The zero value waits nothing; it is not safe
// for concurrent use.
type Backoff struct {
	// Min is the first step and Max the last; a zero Max means Min.
	Min, Max time.Duration
	step     time.Duration
}

// jitter spreads each wait by ±jitter of its step.
const jitter = 0.2

// Next returns the wait before the next try and doubles the step for the
// try after it, up to Max.
func (b *Backoff) Next() time.Duration {
	if b.step == 0 {
		b.step = b.Min
	} else {
		b.step = min(2*b.step, max(b.Max, b.Min))
	}
	return time.Duration(float64(b.step) * (1 - jitter + 2*jitter*rand.Float64()))
}

// Step returns the step of the last wait Next returned, before spreading;
// zero before the first.
func (b *Backoff) Step() time.Duration { return b.step }

// Reset starts the schedule over at Min.
func (b *Backoff) Reset() { b.step = 0 }
