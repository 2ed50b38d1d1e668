package heal

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/mcpheal/mcpheal/proxy/internal/conf"
	"github.com/mcpheal/mcpheal/session"
)

// Sessions shared by a fleet (docs/deployment.md "Replicas"). With Config.Shared set,
// what changes in a session's life (its upstream session and generation,
// its journal, its credential binding after a rotation, its end) is kept
// where every mcpheal process of the fleet sees it, and so is the
// initialize of a session whose sealed id could not carry it. It is read
// only when a process lacks something:
//
//   - restore: an id this process does not hold adopts the fleet's upstream
//     session instead of creating one (or finds it ended: 404);
//   - heal: before creating an upstream session, a process adopts the one
//     another process already made for this generation, or waits for the
//     one it is making (a lease per generation); its own is recorded with a
//     compare-and-set on the generation, and a process that loses the race
//     adopts the winner's and DELETEs its own.
//
// and written when something changes: a new session, a heal, a journal
// entry (as that one change), a rotation, a DELETE. A healthy session's
// requests never touch it. When the store fails or is slow
// (Config.StoreTimeout), each process carries on alone: heals become
// per-process, the journal may be stale, and a DELETE is not seen by the
// other processes until their upstream session dies.
//
// A nil *fleet is a process alone: every method does nothing.
type Fleet struct {
	Cfg     *conf.Config
	Log     *zerolog.Logger
	Shared  session.Shared
	Watcher session.Watcher // shared's events, or nil
	keys    sync.Map        // Watcher.Key → session.ClientID of the sessions held (with a watcher)
	// instance names this process among the fleet's (Event.Owner).
	Instance string
	Stats    fleetStats
	Sleep    func(time.Duration) bool // the link's: ends early when the server closes
}

// fleetStats counts the store's use.
type fleetStats struct {
	latency *prometheus.HistogramVec // seconds per store call, by op
	errors  [numStoreOps]prometheus.Counter
	Adopted prometheus.Counter // heals adopted from another process
	Lost    prometheus.Counter // heals whose own upstream session lost the race
}

const (
	opLoad = iota
	opAdvance
	opLead
	opJournal
	opEnd
	opStream
	opBind
	opRecipe
	numStoreOps
)

var storeOpNames = [numStoreOps]string{"load", "advance", "lead", "journal", "end", "stream", "bind", "recipe"}

func (st *fleetStats) Init(upstream string) {
	labels := prometheus.Labels{"upstream": upstream}
	st.latency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:        "mcpheal_store_seconds",
		Help:        "Time per call to the shared session store, by operation.",
		ConstLabels: labels,
		Buckets:     []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1},
	}, []string{"op"})
	for op := range st.errors {
		st.errors[op] = prometheus.NewCounter(prometheus.CounterOpts{
			Name:        "mcpheal_store_errors_total",
			Help:        "Failed or timed-out calls to the shared session store, by operation.",
			ConstLabels: prometheus.Labels{"upstream": upstream, "op": storeOpNames[op]},
		})
	}
	st.Adopted = prometheus.NewCounter(prometheus.CounterOpts{
		Name:        "mcpheal_heals_adopted_total",
		Help:        "Heals served by an upstream session another mcpheal process created.",
		ConstLabels: labels,
	})
	st.Lost = prometheus.NewCounter(prometheus.CounterOpts{
		Name:        "mcpheal_heals_lost_race_total",
		Help:        "Upstream sessions created by a heal that another process won first, and DELETEd.",
		ConstLabels: labels,
	})
}

func (f *Fleet) Collect(ch chan<- prometheus.Metric) {
	if f == nil {
		return
	}
	st := &f.Stats
	st.latency.Collect(ch)
	for op := range st.errors {
		st.errors[op].Collect(ch)
	}
	st.Adopted.Collect(ch)
	st.Lost.Collect(ch)
}

// call runs one call to the shared store, bounded by Config.StoreTimeout,
// timing and counting it.
func (f *Fleet) call(ctx context.Context, op int, fn func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, f.Cfg.StoreTimeout)
	defer cancel()
	start := time.Now()
	err := fn(ctx)
	f.Stats.latency.WithLabelValues(storeOpNames[op]).Observe(time.Since(start).Seconds())
	if err != nil {
		f.Stats.errors[op].Inc()
		f.Log.Warn().Str("op", storeOpNames[op]).Err(err).Msg("session store call failed; carrying on alone")
	}
	return err
}

// Load returns the fleet's state of id; ok false when there is no store or
// it failed.
func (f *Fleet) Load(ctx context.Context, id session.ClientID) (st session.State, ok bool) {
	if f == nil {
		return st, false
	}
	err := f.call(ctx, opLoad, func(ctx context.Context) (err error) {
		st, err = f.Shared.Load(ctx, id)
		return err
	})
	return st, err == nil
}

// created records a new session's first upstream session, and its
// initialize when its sealed id carries only a digest of it.
func (f *Fleet) created(sess *session.Session) {
	if f == nil {
		return
	}
	up, gen := sess.Current()
	_ = f.call(context.Background(), opAdvance, func(ctx context.Context) error {
		_, _, err := f.Shared.Advance(ctx, sess.ID, gen-1, up)
		return err
	})
	if !sess.Recipe.InitSealed {
		f.Keep(sess.ID, []byte(sess.Recipe.InitBody))
	}
}

// Keep records the initialize of a session whose id carries only its
// digest; for a held session (held.go), the upstream's answer to it.
func (f *Fleet) Keep(id session.ClientID, init []byte) {
	if f == nil {
		return
	}
	_ = f.call(context.Background(), opRecipe, func(ctx context.Context) error {
		return f.Shared.SaveRecipe(ctx, id, init)
	})
}

// ended records that the agent ended the session.
func (f *Fleet) ended(id session.ClientID) {
	if f == nil {
		return
	}
	_ = f.call(context.Background(), opEnd, func(ctx context.Context) error {
		return f.Shared.End(ctx, id)
	})
}

// note records one change of the session's journal.
func (f *Fleet) note(sess *session.Session, c session.JournalChange) {
	if f == nil {
		return
	}
	_ = f.call(context.Background(), opJournal, func(ctx context.Context) error {
		return f.Shared.Note(ctx, sess.ID, c)
	})
}

// bind records the credential binding the session moved to.
func (f *Fleet) bind(sess *session.Session, binding string) {
	if f == nil {
		return
	}
	_ = f.call(context.Background(), opBind, func(ctx context.Context) error {
		return f.Shared.Bind(ctx, sess.ID, binding)
	})
}

// errAdopt: no upstream session to adopt; create one.
var errAdopt = errors.New("nothing to adopt")

// adopt runs before a heal creates an upstream session for the generation
// after seen: it returns the one another process created or is creating,
// or errAdopt when this process should create it (it holds the lease, the
// lease holder gave up, or the store does not answer). An ended session
// gives session.ErrClosed. The fleet's journal replaces the local one;
// grew is how much it grew.
func (f *Fleet) adopt(ctx context.Context, sess *session.Session, seen uint64) (up session.UpstreamID, gen uint64, grew int, err error) {
	if f == nil {
		return "", 0, 0, errAdopt
	}
	var leaseUntil time.Time
	for {
		st, ok := f.Load(ctx, sess.ID)
		switch {
		case !ok:
			return "", 0, grew, errAdopt
		case st.Ended:
			return "", 0, grew, session.ErrClosed
		}
		if st.HasJournal {
			grew += sess.SetJournal(st.Journal)
		}
		if st.Gen > seen && st.Upstream != "" {
			f.Stats.Adopted.Inc()
			return st.Upstream, st.Gen, grew, nil
		}
		if time.Now().After(leaseUntil) {
			// No lease yet, or its holder neither recorded a session nor
			// gave up in time (it died mid-heal): claim it.
			var lead bool
			err := f.call(ctx, opLead, func(ctx context.Context) (err error) {
				lead, err = f.Shared.Lead(ctx, sess.ID, seen, LeaseTTL)
				return err
			})
			if err != nil || lead {
				return "", 0, grew, errAdopt
			}
			leaseUntil = time.Now().Add(LeaseTTL)
		}
		if !f.Sleep(25*time.Millisecond) || ctx.Err() != nil {
			return "", 0, grew, errAdopt // time is up: try alone
		}
	}
}

// LeaseTTL bounds how long one process may hold a generation's heal: an
// upstream initialize takes milliseconds, and a process that dies holding
// the lease must not stall the session's heals fleet-wide for longer. A
// heal slower than this may meet a second one; the compare-and-set then
// keeps one upstream session.
const LeaseTTL = 3 * time.Second

// publish records up, created by this process for the generation after
// seen. When another process recorded one first, the winner's is returned
// (gen != 0) and lost is true: the caller DELETEs its own; a session ended
// meanwhile gives session.ErrClosed. When the store fails, up stands
// (gen 0).
func (f *Fleet) publish(ctx context.Context, sess *session.Session, seen uint64, up session.UpstreamID) (_ session.UpstreamID, gen uint64, lost bool, err error) {
	if f == nil {
		return up, 0, false, nil
	}
	var (
		st  session.State
		won bool
	)
	err = f.call(ctx, opAdvance, func(ctx context.Context) (err error) {
		st, won, err = f.Shared.Advance(ctx, sess.ID, seen, up)
		return err
	})
	switch {
	case err != nil || won:
		return up, st.Gen, false, nil
	case st.Ended:
		return "", 0, true, session.ErrClosed
	}
	f.Stats.Lost.Inc()
	return st.Upstream, st.Gen, true, nil
}

// Follow brings the session up to the fleet's generation (another process
// healed it) and returns the session's generation afterwards.
func (f *Fleet) Follow(sess *session.Session) uint64 {
	if st, ok := f.Load(context.Background(), sess.ID); ok && st.Gen > 0 && st.Upstream != "" {
		sess.Follow(st.Upstream, st.Gen)
	}
	_, gen := sess.Current()
	return gen
}

// index makes a session just added to the store findable by the events
// that name it.
func (f *Fleet) index(sess *session.Session) {
	if f != nil && f.Watcher != nil {
		f.keys.Store(f.Watcher.Key(sess.ID), sess.ID)
	}
}

// forget undoes index once the session left the store.
func (f *Fleet) forget(sess *session.Session) {
	if f != nil && f.Watcher != nil {
		f.keys.Delete(f.Watcher.Key(sess.ID))
	}
}

// ClaimStream tells the fleet that this process opens the session's GET
// stream: one that holds another lets go, since the upstream allows one.
func (f *Fleet) ClaimStream(sess *session.Session) {
	if f == nil || f.Watcher == nil {
		return
	}
	_ = f.call(context.Background(), opStream, func(ctx context.Context) error {
		return f.Watcher.Tell(ctx, session.Event{Key: f.Watcher.Key(sess.ID), Stream: true, Owner: f.Instance})
	})
}

// Watch applies the fleet's events with apply until done closes.
func (f *Fleet) Watch(done <-chan struct{}, apply func(session.ClientID, session.Event)) {
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-done
		cancel()
	}()
	f.Watcher.Watch(ctx, func(e session.Event) {
		v, ok := f.keys.Load(e.Key)
		if !ok {
			return
		}
		if e.Stream && e.Owner == f.Instance {
			return // our own claim
		}
		apply(v.(session.ClientID), e)
	})
}
