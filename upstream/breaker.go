package upstream

import (
	"sync"
	"sync/atomic"
	"time"
)

// BreakerState is the state of a circuit breaker.
type BreakerState int32

// Breaker states. The zero value is Closed.
const (
	Closed   BreakerState = iota // requests flow
	HalfOpen                     // one probe request is allowed through
	Open                         // requests fail fast until the cooldown ends
)

func (s BreakerState) String() string {
	switch s {
	case Closed:
		return "closed"
	case HalfOpen:
		return "half-open"
	case Open:
		return "open"
	}
	return "unknown"
}

// BreakerConfig configures a Breaker. Zero values take the defaults.
type BreakerConfig struct {
	// Threshold is how many consecutive infrastructure failures open the
	// breaker; zero means 5.
	Threshold int
	// MinStreak is how long the failures must have lasted as well; zero
	// means 5 s. An upstream restart of a second or two then costs the
	// agents latency (they retry within their heal budget), not a storm of
	// fast failures.
	MinStreak time.Duration
	// Cooldown is the first open period; it doubles on every failed probe up
	// to MaxCooldown, with ±20 % jitter. Zero means 1 s (and 60 s).
	Cooldown, MaxCooldown time.Duration
	// OnChange, if set, is called after each transition, outside the lock.
	// It must not block.
	OnChange func(from, to BreakerState, cooldown time.Duration)
}

// Breaker is a per-upstream circuit breaker that counts only infrastructure
// failures (refused connections, failed heals, 5xx to initialize). A tool
// error or an expiry that healed is not a failure. It is safe for
// concurrent use; the closed-state fast path takes no lock.
type Breaker struct {
	cfg   BreakerConfig
	now   func() time.Time // the clock; tests replace it
	state atomic.Int32     // BreakerState
	fails atomic.Int32     // consecutive failures, for the lock-free fast path

	mu          sync.Mutex // protects streakStart, openUntil, cooldown, probeAt
	streakStart time.Time
	openUntil   time.Time
	cooldown    Backoff   // the open periods: Cooldown doubling to MaxCooldown
	probeAt     time.Time // when the current half-open probe was let through
}

// NewBreaker returns a closed breaker.
func NewBreaker(cfg BreakerConfig) *Breaker {
	if cfg.Threshold <= 0 {
		cfg.Threshold = 5
	}
	cfg.MinStreak = orDur(cfg.MinStreak, 5*time.Second)
	cfg.Cooldown = orDur(cfg.Cooldown, time.Second)
	cfg.MaxCooldown = orDur(cfg.MaxCooldown, 60*time.Second)
	return &Breaker{cfg: cfg, now: time.Now, cooldown: Backoff{Min: cfg.Cooldown, Max: cfg.MaxCooldown}}
}

// State returns the current state.
func (b *Breaker) State() BreakerState { return BreakerState(b.state.Load()) }

// Allow reports whether a request may go upstream now. When it may not, it
// returns how long until the breaker lets a probe through.
func (b *Breaker) Allow() (bool, time.Duration) {
	if b.State() == Closed {
		return true, 0
	}
	b.mu.Lock()
	now := b.now()
	var changed bool
	var from BreakerState
	switch b.State() {
	case Closed:
		b.mu.Unlock()
		return true, 0
	case Open:
		if now.Before(b.openUntil) {
			wait := b.openUntil.Sub(now)
			b.mu.Unlock()
			return false, wait
		}
		from, changed = Open, true
		b.state.Store(int32(HalfOpen))
		b.probeAt = now
	case HalfOpen:
		// One probe at a time; a probe that never reported (its request
		// ended without reaching the upstream) is replaced after a cooldown.
		if cd := b.cooldown.Step(); now.Sub(b.probeAt) < cd {
			wait := cd - now.Sub(b.probeAt)
			b.mu.Unlock()
			return false, wait
		}
		b.probeAt = now
	}
	cd := b.cooldown.Step()
	b.mu.Unlock()
	if changed {
		b.changed(from, HalfOpen, cd)
	}
	return true, 0
}

// Reachable records that the upstream takes connections again while the
// breaker is open: it half-opens at once, so that the next request is the
// probe, instead of at the end of its cooldown. A connection proves less
// than an answer (a balancer with no backend takes them too): the probe's
// outcome decides, as after a cooldown.
func (b *Breaker) Reachable() {
	if b.State() != Open {
		return
	}
	b.mu.Lock()
	if b.State() != Open {
		b.mu.Unlock()
		return
	}
	b.openUntil = b.now()
	b.mu.Unlock()
}

// Success records that the upstream answered.
func (b *Breaker) Success() {
	if b.State() == Closed && b.fails.Load() == 0 {
		return
	}
	b.mu.Lock()
	from := b.State()
	b.fails.Store(0)
	b.state.Store(int32(Closed))
	b.cooldown.Reset()
	b.mu.Unlock()
	if from != Closed {
		b.changed(from, Closed, 0)
	}
}

// Failure records an infrastructure failure.
func (b *Breaker) Failure() {
	b.mu.Lock()
	now := b.now()
	from := b.State()
	n := b.fails.Add(1)
	if n == 1 {
		b.streakStart = now
	}
	open := from == HalfOpen ||
		from == Closed && int(n) >= b.cfg.Threshold && now.Sub(b.streakStart) >= b.cfg.MinStreak
	if !open {
		b.mu.Unlock()
		return
	}
	// The first open period is Cooldown; each failed probe doubles it.
	jittered := b.cooldown.Next()
	b.openUntil = now.Add(jittered)
	b.state.Store(int32(Open))
	b.mu.Unlock()
	b.changed(from, Open, jittered)
}

func (b *Breaker) changed(from, to BreakerState, cd time.Duration) {
	if b.cfg.OnChange != nil {
		b.cfg.OnChange(from, to, cd)
	}
}
