package proxy

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/mcpheal/mcpheal/proxy/internal/era"
	"github.com/mcpheal/mcpheal/proxy/internal/heal"
	"github.com/mcpheal/mcpheal/proxy/internal/wire"
	"github.com/mcpheal/mcpheal/session"
)

// Ready reports whether the upstream can take requests now: its breaker is
// not open and a TCP connection to it succeeds. The probe result is cached
// for a second so that frequent readiness checks do not hammer the upstream.
func (s *Server) Ready() error {
	if s.breakerState() == breakerOpen {
		return errors.New("circuit breaker open")
	}
	s.readyMu.Lock()
	defer s.readyMu.Unlock()
	if time.Since(s.readyAt) < time.Second {
		return s.readyErr
	}
	s.readyErr = s.link.Up.Probe(time.Now().Add(time.Second))
	s.readyAt = time.Now()
	return s.readyErr
}

// probeAtStart asks the upstream once, as mcpheal starts, and logs one
// line: reachable, and the protocol era it speaks (server/discover), or
// why not. An operator then sees at once that a server is down or
// misaddressed, instead of in the first agent's 503.
func (s *Server) probeAtStart() {
	origin := s.link.Up.Origin()
	if err := s.link.Up.Probe(time.Now().Add(2 * time.Second)); err != nil {
		s.log.Warn().Str("server", origin).Err(err).
			Msg("upstream unreachable at start: agents' requests wait for it up to heal_timeout, then get -32010")
		return
	}
	v := s.eras.Detect(false, nil)
	s.log.Info().Str("server", origin).Str("era", era.EraNames[v]).Msg("upstream reachable")
}

// drain waits until no request is in flight (or timeout), then ends the
// upstream sessions and closes the server. A reload that removed the
// upstream runs it.
func (s *Server) drain(timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for s.inflight.Load() > 0 && time.Now().Before(deadline) {
		if !s.link.Sleep(50 * time.Millisecond) {
			break
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	s.closeSessions(ctx)
}

// closeSessions DELETEs every upstream session the server holds (bounded by
// ctx, a few seconds at most) and closes the server. With a fleet (a
// shared store) it DELETEs none: a stop is not the end of a session, and
// the other processes, or this one restarted, go on with them (docs/deployment.md
// "Replicas"); only a session that ends is DELETEd, by the process that
// ends it.
func (s *Server) closeSessions(ctx context.Context) {
	sessions := s.sessions.Store.Sessions()
	if s.sessions.Fleet != nil {
		s.log.Info().Int("sessions", len(sessions)).Msg("stopping: upstream sessions left to the fleet")
		s.Close()
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	sem := make(chan struct{}, 16)
	var wg sync.WaitGroup
	for _, sess := range sessions {
		up, _ := sess.Current()
		if up == "" {
			continue
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		wg.Add(1)
		go func(up session.UpstreamID, auth []byte) {
			defer wg.Done()
			defer func() { <-sem }()
			dl, _ := ctx.Deadline()
			_ = s.link.DeleteNow(up, auth, dl)
		}(up, heal.RecipeHeader(sess).PeekBytes(wire.HdrAuthorization))
	}
	wg.Wait()
	s.Close()
}
