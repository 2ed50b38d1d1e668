package proxy

import (
	"time"

	"github.com/mcpheal/mcpheal/classify"
	"github.com/mcpheal/mcpheal/upstream"
)

// Waiting out an outage (README "Waiting out a restart"): a request whose
// exchange failed without proof of harm waits with backoff inside its heal
// budget; one request per session retries (session.Probe) while the others
// wait for it, and one watcher per upstream notices the end of the outage.

// backoff waits before the next try, within the heal budget. It reports
// false when the budget is spent.
func (a *attempt) backoff() bool {
	a.next()
	if a.budget.IsZero() {
		a.budget = time.Now().Add(a.s.cfg.HealTimeout)
	}
	if a.delay == 0 {
		a.delay = 10 * time.Millisecond
	}
	left := time.Until(a.budget)
	if left <= 0 {
		return false
	}
	if a.sess != nil && !a.probing {
		lead, done := a.sess.Probe()
		if !lead {
			return a.awaitProbe(done, left)
		}
		a.probing = true
	}
	if !a.s.sleep(min(a.delay, left)) {
		return false
	}
	a.delay = min(2*a.delay, time.Second)
	return true
}

// awaitProbe waits, within the heal budget, for the request probing the
// session's outage, then points this request at the session's current
// upstream id: the probe may have healed it meanwhile.
func (a *attempt) awaitProbe(done <-chan struct{}, left time.Duration) bool {
	t := time.NewTimer(left)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		return false
	case <-a.s.done:
		return false
	}
	a.up, a.gen = a.sess.Current()
	return true
}

// endProbe releases the requests waiting on this one's probe, if it is one.
func (a *attempt) endProbe() {
	if a.probing {
		a.probing = false
		a.sess.ProbeDone()
	}
}

// sleep waits d unless the server is closing; it ends early, reporting
// true, when the upstream answers again after failures, so that requests
// and heals waiting out an outage go at once instead of at their next
// backoff step.
func (s *Server) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-s.recovered():
		return true
	case <-s.done:
		return false
	}
}

// recovered returns a channel closed when the upstream next answers after
// a failure.
func (s *Server) recovered() <-chan struct{} {
	s.wakeMu.Lock()
	defer s.wakeMu.Unlock()
	return s.wake
}

// upSuccess records that the upstream answered: it feeds the breaker and
// wakes everyone waiting out a failure.
func (s *Server) upSuccess() {
	s.breaker.Success()
	if s.failing.Load() && s.failing.Swap(false) {
		s.wakeAll()
		s.recheckEra() // it may have restarted as another era
	}
}

// wakeAll ends every backoff wait now.
func (s *Server) wakeAll() {
	s.wakeMu.Lock()
	close(s.wake)
	s.wake = make(chan struct{})
	s.wakeMu.Unlock()
}

// upFailure records an infrastructure failure and makes sure the outage
// is being watched.
func (s *Server) upFailure() {
	s.lastFailure.Store(time.Now().UnixNano())
	s.failing.Store(true)
	s.breaker.Failure()
	if !s.watching.Load() && s.watching.CompareAndSwap(false, true) {
		if s.bg.Add(1) {
			go s.watchOutage()
		} else {
			s.watching.Store(false)
		}
	}
}

// Outage watching: while exchanges fail, one goroutine per upstream tries
// a TCP (and TLS) connection every watchEvery, and wakes the waiting
// requests the moment one succeeds. Each session has one request retrying
// (session.Probe) at a backoff that grows to a second; without the watcher,
// the end of an outage would be noticed up to that late. A connection that
// succeeds while the upstream still fails requests (a balancer with no
// backend) wakes the waiters at a cadence that doubles up to a second.
// The watcher stops when an exchange succeeds, when no exchange has failed
// for a heal budget (nobody waits longer), when the circuit breaker opens
// (then requests fail fast and the breaker sends one probe per cooldown), or
// when the server closes.
const watchEvery = 10 * time.Millisecond

func (s *Server) watchOutage() {
	defer s.bg.Done()
	defer s.watching.Store(false)
	t := time.NewTimer(watchEvery)
	defer t.Stop()
	pause := watchEvery
	for {
		select {
		case <-t.C:
		case <-s.done:
			return
		}
		quiet := time.Since(time.Unix(0, s.lastFailure.Load()))
		if !s.failing.Load() || quiet > s.cfg.HealTimeout || s.breaker.State() != upstream.Closed {
			return // an open breaker probes on its own schedule
		}
		next := watchEvery
		if s.up.Probe(time.Now().Add(time.Second)) == nil {
			s.wakeAll()
			next, pause = pause, min(2*pause, time.Second)
		}
		t.Reset(next)
	}
}

// recordHealth feeds the breaker: a transport failure is an infrastructure
// failure; any HTTP answer shows the upstream is up.
func (s *Server) recordHealth(cls classify.Class) {
	if cls == classify.TransportDead || cls == classify.Timeout {
		s.upFailure()
	} else {
		s.upSuccess()
	}
}
