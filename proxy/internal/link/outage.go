package link

import (
	"time"

	"github.com/mcpheal/mcpheal/upstream"
)

// Waiting out an outage (docs/healing.md "Waiting out a restart"): a request whose
// exchange failed without proof of harm waits with backoff inside its heal
// budget (attempt.backoff); one request per session retries
// (session.Probe) while the others wait for it, and one watcher per
// upstream notices the end of the outage and wakes them all.

// Sleep waits d unless the server is closing; it ends early, reporting
// true, when the upstream answers again after failures, so that requests
// and heals waiting out an outage go at once instead of at their next
// backoff step.
func (l *Link) Sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-l.recovered():
		return true
	case <-l.done:
		return false
	}
}

// recovered returns a channel closed when the upstream next answers after
// a failure.
func (l *Link) recovered() <-chan struct{} {
	l.wakeMu.Lock()
	defer l.wakeMu.Unlock()
	return l.wake
}

// Success records that the upstream answered: it feeds the breaker and
// wakes everyone waiting out a failure.
func (l *Link) Success() {
	l.Breaker.Success()
	if l.failing.Load() && l.failing.Swap(false) {
		l.wakeAll()
		if l.OnRecover != nil {
			l.OnRecover() // it may have restarted as another era
		}
	}
}

// OutageEnd is when the outage in progress stops being waited out: its
// start plus the heal budget. Until then a request that meets the open
// breaker waits for the upstream instead of failing at once, so that a
// redeploy shorter than heal_timeout costs the agents latency, not errors
// (docs/healing.md "Waiting out a restart"); after it, requests fail fast.
// Zero when the upstream is not failing.
func (l *Link) OutageEnd() time.Time {
	since := l.failingSince.Load()
	if !l.failing.Load() || since == 0 {
		return time.Time{}
	}
	return time.Unix(0, since).Add(l.Cfg.HealTimeout)
}

// wakeAll ends every backoff wait now.
func (l *Link) wakeAll() {
	l.wakeMu.Lock()
	close(l.wake)
	l.wake = make(chan struct{})
	l.wakeMu.Unlock()
}

// Failure records an infrastructure failure and makes sure the outage is
// being watched.
func (l *Link) Failure() {
	now := time.Now().UnixNano()
	l.lastFailure.Store(now)
	if !l.failing.Swap(true) {
		l.failingSince.Store(now)
	}
	l.Breaker.Failure()
	if !l.watching.Load() && l.watching.CompareAndSwap(false, true) {
		if l.bg.Add(1) {
			go l.watchOutage()
		} else {
			l.watching.Store(false)
		}
	}
}

// Outage watching: while exchanges fail, one goroutine per upstream tries
// a TCP (and TLS) connection every watchEvery, and wakes the waiting
// requests the moment one succeeds. Each session has one request retrying
// (session.Probe) at a backoff that grows to a second; without the watcher,
// the end of an outage would be noticed up to that late. A connection that
// succeeds while the upstream still fails requests (a balancer with no
// backend) wakes the waiters at a cadence that backs off to a second.
//
// While the circuit breaker is open, new requests fail fast. If the
// upstream refuses connections (its process is down), the watcher goes on
// at openWatchEvery, and the first connection it makes half-opens the
// breaker at once (Breaker.Reachable): an upstream back from a restart
// serves the next request, not one after the breaker's cooldown. If
// connections are taken while requests fail, the cooldown stands.
//
// The watcher stops when an exchange succeeds, when the breaker is closed
// and no exchange has failed for a heal budget (nobody waits longer), or
// when the server closes.
const (
	watchEvery     = 10 * time.Millisecond
	openWatchEvery = 100 * time.Millisecond
)

func (l *Link) watchOutage() {
	defer l.bg.Done()
	defer l.watching.Store(false)
	t := time.NewTimer(watchEvery)
	defer t.Stop()
	// pause: how often it wakes the waiters while the upstream takes
	// connections (and may still fail requests).
	pause := l.Retry(PaceWatch, 0)
	refused := false // the last connection tried was refused
	for {
		select {
		case <-t.C:
		case <-l.done:
			return
		}
		open := l.Breaker.State() != upstream.Closed
		quiet := time.Since(time.Unix(0, l.lastFailure.Load()))
		if !l.failing.Load() || (!open && quiet > l.Cfg.HealTimeout) || (open && !refused) {
			// An open breaker whose upstream takes connections (and fails
			// requests: a balancer with no backend, a host that resets)
			// probes on its own schedule.
			return
		}
		next := watchEvery
		if open {
			next = openWatchEvery
		}
		if l.Up.Probe(time.Now().Add(time.Second)) == nil {
			if open && refused {
				l.Breaker.Reachable()
				l.log.Info().Msg("upstream takes connections again: the next request goes to it")
			}
			refused = false
			l.wakeAll()
			next = max(next, pause.Next())
		} else {
			refused = true
		}
		t.Reset(next)
	}
}
