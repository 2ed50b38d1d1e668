package link

import (
	"time"

	"github.com/mcpheal/mcpheal/upstream"
)

// A Pace is how quickly a loop tries the upstream again: the first and
// the last step of its backoff (each spread by ±20 %).
type Pace struct{ Min, Max time.Duration }

// The paces of the loops that try the upstream again; the one of each is
// named here, not at the loop.
var (
	// PaceRequest: an agent's request waiting out a failure that proves
	// no harm, and its answer stream asking for the rest.
	PaceRequest = Pace{10 * time.Millisecond, time.Second}
	// PaceHeal: a heal sending initialize again.
	PaceHeal = Pace{25 * time.Millisecond, time.Second}
	// PaceListen: a GET stream or a bridged listen opening again for an
	// agent that still listens.
	PaceListen = Pace{100 * time.Millisecond, 5 * time.Second}
	// PaceWatch: the outage watcher waking the loops above while the
	// upstream takes connections but may still fail requests.
	PaceWatch = Pace{watchEvery, time.Second}
)

// Retry is the one retry policy of every loop that tries the upstream
// again (an agent's request, its answer stream's resumption, a heal, a
// GET stream, a bridged listen): the circuit breaker asked before a try,
// a backoff at the loop's pace between tries, a budget they all end
// within, and a busy upstream's Retry-After waited out once. Which
// failure is tried again is the exchange's decide (and, for the loops
// without an agent's request, the loop's own switch); how often and for
// how long is Retry's.
//
// A Retry is a value, one per loop (per request for an attempt); make it
// with Link.Retry. Its budget begins at the first wait that needs one
// (Begin), so that a loop that never fails never reads the clock for it.
type Retry struct {
	l      *Link
	step   upstream.Backoff
	budget time.Duration // 0: none (the loop runs while its agent listens)
	by     time.Time     // the budget's end; zero until it begins
	busy   bool          // a busy upstream's Retry-After was waited out
}

// Retry returns a retry policy at pace p within budget (0: none).
func (l *Link) Retry(p Pace, budget time.Duration) Retry {
	return Retry{l: l, step: upstream.Backoff{Min: p.Min, Max: p.Max}, budget: budget}
}

// Begun reports whether the budget has begun.
func (r *Retry) Begun() bool { return !r.by.IsZero() }

// Begin begins the budget now, unless it has begun, and returns its end;
// zero when the Retry has no budget.
func (r *Retry) Begin() time.Time {
	if r.by.IsZero() && r.budget > 0 {
		r.by = time.Now().Add(r.budget)
	}
	return r.by
}

// Until begins the budget with its end at end instead (an outage begun
// before the request came: its wait ends with the outage's budget).
func (r *Retry) Until(end time.Time) { r.by = end }

// Fits reports whether a wait of d ends within the budget.
func (r *Retry) Fits(d time.Duration) bool {
	end := r.Begin()
	return end.IsZero() || time.Now().Add(d).Before(end)
}

// Next returns the next backoff step, for a loop that sleeps on its own
// signals (its agent's stream stopping).
func (r *Retry) Next() time.Duration { return r.step.Next() }

// Reset starts the backoff over: the loop made progress.
func (r *Retry) Reset() { r.step.Reset() }

// Wait sleeps the next backoff step, cut to the budget left and ended
// early when the upstream answers again. It reports false when the budget
// is spent or mcpheal is closing.
func (r *Retry) Wait() bool {
	d := r.step.Next()
	if end := r.Begin(); !end.IsZero() {
		left := time.Until(end)
		if left <= 0 {
			return false
		}
		d = min(d, left)
	}
	return r.l.Sleep(d)
}

// Gate asks the circuit breaker for a try. While it is open, Gate waits
// (its window or a backoff step, whichever is shorter, ended early when
// the upstream answers again) and asks again, within the budget. When the
// budget cannot cover the wait or mcpheal is closing, it reports false
// with the breaker's window: the loop gives up.
func (r *Retry) Gate() (bool, time.Duration) {
	for {
		ok, w := r.l.Breaker.Allow()
		if ok {
			return true, 0
		}
		d := r.step.Next()
		if w > 0 {
			d = min(d, w)
		}
		if !r.Fits(d) || !r.l.Sleep(d) {
			return false, w
		}
	}
}

// BusyWait reports how a busy upstream's Retry-After of d stands: waited
// says one was waited out already, fits that d ends within the budget.
// An upstream at capacity is not down: it is waited out once, when the
// wait fits, and never counted as an outage.
func (r *Retry) BusyWait(d time.Duration) (waited, fits bool) {
	return r.busy, r.Fits(d)
}

// WaitBusy waits out a busy upstream's Retry-After of d, the once BusyWait
// allows. It reports false when mcpheal is closing.
func (r *Retry) WaitBusy(d time.Duration) bool {
	r.busy = true
	return r.l.Sleep(d)
}
