package proxy

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mcpheal/mcpheal/session"
)

// Sessions shared by a fleet (README "Replicas"). With Config.Shared set,
// what changes in a session's life (its upstream session and generation,
// its journal, its end) is kept where every mcpheal process of the fleet
// sees it. It is read only when a process lacks something:
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
// entry, a DELETE. A healthy session's requests never touch it. When the
// store fails or is slow (Config.StoreTimeout), each process carries on
// alone: heals become per-process, the journal may be stale, and a DELETE
// is not seen by the other processes until their upstream session dies.

// sharedStats counts the store's use.
type sharedStats struct {
	latency *prometheus.HistogramVec // seconds per store call, by op
	errors  [numStoreOps]countVec
	adopted countVec // heals adopted from another process
	lost    countVec // heals whose own upstream session lost the race
}

type countVec struct{ n prometheus.Counter }

const (
	opLoad = iota
	opAdvance
	opLead
	opJournal
	opEnd
	opStream
	numStoreOps
)

var storeOpNames = [numStoreOps]string{"load", "advance", "lead", "journal", "end", "stream"}

func (st *sharedStats) init(upstream string) {
	labels := prometheus.Labels{"upstream": upstream}
	st.latency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:        "mcpheal_store_seconds",
		Help:        "Time per call to the shared session store, by operation.",
		ConstLabels: labels,
		Buckets:     []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1},
	}, []string{"op"})
	for op := range st.errors {
		st.errors[op].n = prometheus.NewCounter(prometheus.CounterOpts{
			Name:        "mcpheal_store_errors_total",
			Help:        "Failed or timed-out calls to the shared session store, by operation.",
			ConstLabels: prometheus.Labels{"upstream": upstream, "op": storeOpNames[op]},
		})
	}
	st.adopted.n = prometheus.NewCounter(prometheus.CounterOpts{
		Name:        "mcpheal_heals_adopted_total",
		Help:        "Heals served by an upstream session another mcpheal process created.",
		ConstLabels: labels,
	})
	st.lost.n = prometheus.NewCounter(prometheus.CounterOpts{
		Name:        "mcpheal_heals_lost_race_total",
		Help:        "Upstream sessions created by a heal that another process won first, and DELETEd.",
		ConstLabels: labels,
	})
}

func (st *sharedStats) collect(ch chan<- prometheus.Metric) {
	if st.latency == nil {
		return
	}
	st.latency.Collect(ch)
	for op := range st.errors {
		st.errors[op].n.Collect(ch)
	}
	st.adopted.n.Collect(ch)
	st.lost.n.Collect(ch)
}

// storeCall runs one call to the shared store, bounded by
// Config.StoreTimeout, timing and counting it.
func (s *Server) storeCall(ctx context.Context, op int, f func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.StoreTimeout)
	defer cancel()
	start := time.Now()
	err := f(ctx)
	s.shared.latency.WithLabelValues(storeOpNames[op]).Observe(time.Since(start).Seconds())
	if err != nil {
		s.shared.errors[op].n.Inc()
		s.log.Warn().Str("op", storeOpNames[op]).Err(err).Msg("session store call failed; carrying on alone")
	}
	return err
}

// loadShared returns the fleet's state of id; ok false when there is no
// store or it failed.
func (s *Server) loadShared(ctx context.Context, id session.ClientID) (st session.State, ok bool) {
	if s.cfg.Shared == nil {
		return st, false
	}
	err := s.storeCall(ctx, opLoad, func(ctx context.Context) (err error) {
		st, err = s.cfg.Shared.Load(ctx, id)
		return err
	})
	return st, err == nil
}

// created records a new session's first upstream session.
func (s *Server) created(sess *session.Session) {
	if s.cfg.Shared == nil {
		return
	}
	up, gen := sess.Current()
	_ = s.storeCall(context.Background(), opAdvance, func(ctx context.Context) error {
		_, _, err := s.cfg.Shared.Advance(ctx, sess.ID, gen-1, up)
		return err
	})
}

// ended records that the agent ended the session.
func (s *Server) ended(id session.ClientID) {
	if s.cfg.Shared == nil {
		return
	}
	_ = s.storeCall(context.Background(), opEnd, func(ctx context.Context) error {
		return s.cfg.Shared.End(ctx, id)
	})
}

// saveJournal records the session's journal after the agent changed it.
func (s *Server) saveJournal(sess *session.Session) {
	if s.cfg.Shared == nil {
		return
	}
	j := sess.Journal()
	_ = s.storeCall(context.Background(), opJournal, func(ctx context.Context) error {
		return s.cfg.Shared.SaveJournal(ctx, sess.ID, j)
	})
}

// errAdopt: no upstream session to adopt; create one.
var errAdopt = errors.New("nothing to adopt")

// adopt runs before a heal creates an upstream session for the generation
// after seen: it returns the one another process created or is creating,
// or errAdopt when this process should create it (it holds the lease, the
// lease holder gave up, or the store does not answer). An ended session
// gives session.ErrClosed. The fleet's journal replaces the local one.
func (s *Server) adopt(ctx context.Context, sess *session.Session, seen uint64) (session.UpstreamID, uint64, error) {
	if s.cfg.Shared == nil {
		return "", 0, errAdopt
	}
	var leaseUntil time.Time
	for {
		st, ok := s.loadShared(ctx, sess.ID)
		switch {
		case !ok:
			return "", 0, errAdopt
		case st.Ended:
			return "", 0, session.ErrClosed
		}
		if st.HasJournal {
			sess.SetJournal(st.Journal)
		}
		if st.Gen > seen && st.Upstream != "" {
			s.shared.adopted.n.Inc()
			return st.Upstream, st.Gen, nil
		}
		if time.Now().After(leaseUntil) {
			// No lease yet, or its holder neither recorded a session nor
			// gave up in time (it died mid-heal): claim it.
			var lead bool
			err := s.storeCall(ctx, opLead, func(ctx context.Context) (err error) {
				lead, err = s.cfg.Shared.Lead(ctx, sess.ID, seen, leaseTTL)
				return err
			})
			if err != nil || lead {
				return "", 0, errAdopt
			}
			leaseUntil = time.Now().Add(leaseTTL)
		}
		if !s.sleep(25*time.Millisecond) || ctx.Err() != nil {
			return "", 0, errAdopt // time is up: try alone
		}
	}
}

// leaseTTL bounds how long one process may hold a generation's heal: an
// upstream initialize takes milliseconds, and a process that dies holding
// the lease must not stall the session's heals fleet-wide for longer. A
// heal slower than this may meet a second one; the compare-and-set then
// keeps one upstream session.
const leaseTTL = 3 * time.Second

// publish records up, created by this process for the generation after
// seen. When another process recorded one first, up is DELETEd and the
// winner's returned (gen != 0); a session ended meanwhile gives
// session.ErrClosed. When the store fails, up stands (gen 0).
func (s *Server) publish(ctx context.Context, sess *session.Session, seen uint64, up session.UpstreamID, auth []byte) (session.UpstreamID, uint64, error) {
	if s.cfg.Shared == nil {
		return up, 0, nil
	}
	var (
		st  session.State
		won bool
	)
	err := s.storeCall(ctx, opAdvance, func(ctx context.Context) (err error) {
		st, won, err = s.cfg.Shared.Advance(ctx, sess.ID, seen, up)
		return err
	})
	switch {
	case err != nil || won:
		return up, st.Gen, nil
	case st.Ended:
		s.deleteUpstream(up, auth, true)
		return "", 0, session.ErrClosed
	}
	s.shared.lost.n.Inc()
	s.deleteUpstream(up, auth, true)
	return st.Upstream, st.Gen, nil
}

// follow brings the session up to the fleet's generation (another process
// healed it) and returns the session's generation afterwards.
func (s *Server) follow(sess *session.Session) uint64 {
	if st, ok := s.loadShared(context.Background(), sess.ID); ok && st.Gen > 0 && st.Upstream != "" {
		sess.Follow(st.Upstream, st.Gen)
	}
	_, gen := sess.Current()
	return gen
}

// release gives back what a session held once it left the store.
func (s *Server) release(sess *session.Session) {
	s.mem.give(sessionCost(sess))
	s.stopListen(sess.ID)
	if s.watcher != nil {
		s.keys.Delete(s.watcher.Key(sess.ID))
	}
}

// index makes a session just added to the store findable by the events
// that name it.
func (s *Server) index(sess *session.Session) {
	if s.watcher != nil {
		s.keys.Store(s.watcher.Key(sess.ID), sess.ID)
	}
}

// watchShared applies the fleet's events until Close.
func (s *Server) watchShared() {
	defer s.bg.Done()
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-s.done
		cancel()
	}()
	s.watcher.Watch(ctx, s.onShared)
}

// onShared applies one event of the fleet to the session it names, if
// this process holds it: an ended session is dropped here too (no upstream
// DELETE: the process that ended it sent one); a session healed elsewhere
// moves to the new upstream session, and its GET streams here reopen on it.
func (s *Server) onShared(e session.Event) {
	v, ok := s.keys.Load(e.Key)
	if !ok {
		return
	}
	id := v.(session.ClientID)
	if e.Stream {
		if e.Owner != s.instance && s.streams.evict(id, 0) {
			s.log.Debug().Str(logSession, id.Short()).Msg("GET stream handed to another process")
		}
		return
	}
	if e.Ended {
		s.graves.bury(string(id), s.cfg.SessionMaxAge)
		if sess, ok := s.store.Remove(id); ok {
			s.release(sess)
			s.streams.stop(id)
			s.log.Info().Str(logSession, id.Short()).Msg("session ended by another process")
		}
		return
	}
	sess, ok := s.store.Peek(id)
	if !ok {
		s.keys.Delete(e.Key)
		return
	}
	if _, gen := sess.Current(); gen < e.Gen {
		sess.Follow(e.Upstream, e.Gen)
		if _, now := sess.Current(); now == e.Gen {
			s.streams.healed(id, e.Gen)
		}
	}
}

// claimStream tells the fleet that this process opens the session's GET
// stream: one that holds another lets go, since the upstream allows one.
func (s *Server) claimStream(sess *session.Session) {
	if s.watcher == nil {
		return
	}
	_ = s.storeCall(context.Background(), opStream, func(ctx context.Context) error {
		return s.watcher.Tell(ctx, session.Event{Key: s.watcher.Key(sess.ID), Stream: true, Owner: s.instance})
	})
}
