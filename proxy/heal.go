package proxy

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"

	"github.com/mcpheal/mcpheal/classify"
	"github.com/mcpheal/mcpheal/session"
	"github.com/mcpheal/mcpheal/upstream"
)

// healer re-creates upstream sessions (docs/healing.md "What it does with each
// answer"): the single-flight re-initialize of a session from its recipe,
// the journal replay on the new upstream session, the check of the tool
// list after it, and the keepalive that heals a quiet session before its
// agent's next call. Requests reach it through attempt.heal, GET streams
// through getStream.heal, the keepalive on its own.
type healer struct {
	cfg      *Config
	log      *zerolog.Logger
	count    *counters
	mem      *budget
	link     *link
	sessions *sessions
	streams  streamNotes
	bg       *bgGroup
	trace    *tracing // nil: tracing off

	pingUnsupported atomic.Bool // the upstream answered -32601 to ping: keepalive lists tools
}

// streams is what a heal tells the agents' open streams of a session (the
// GET stream route implements it): that the session healed into
// generation gen (a stream moves to the new upstream session), and an
// event for them (tools/list_changed after a heal). It is given to the
// healer from above: nothing here calls up.
type streamNotes interface {
	healed(id session.ClientID, gen uint64)
	inject(id session.ClientID, event []byte)
}

// errRecipeRefused: the upstream no longer accepts the session's initialize
// (another protocol version, a credential it rejects, a session id past
// maxUpstreamID). The agent must start over, so it is told its session is
// gone.
var errRecipeRefused = errors.New("upstream refused the recorded initialize")

// heal runs (or joins) the session's re-init from generation seen, under
// the agent headers hdr, and counts and logs the outcome once per
// generation: only the caller that saw the generation change reports it.
func (h *healer) heal(ctx context.Context, sess *session.Session, seen uint64, reason int, hdr *fasthttp.RequestHeader) (session.UpstreamID, uint64, error) {
	start := time.Now()
	age := sess.UpstreamAge()
	budget := time.Until(deadlineOf(ctx, start.Add(h.cfg.HealTimeout)))
	ctx, sp := h.trace.child(ctx, "mcpheal heal", attribute.String("mcpheal.heal.reason", reasonNames[reason]),
		attribute.String("mcp.session.id", sess.ID.Short()), attribute.Int64("mcpheal.heal.from_generation", int64(seen)))
	dead, _ := sess.Current()
	up, gen, err := sess.Heal(ctx, seen, budget, h.reinit(sess, hdr, dead, seen))
	outcome := "joined" // another request's heal served this one
	ev := (*zerolog.Event)(nil)
	switch {
	case err == nil && gen > seen && !sess.WasAdopted(gen) && sess.MarkReported(gen):
		outcome = "ok"
		h.count.heals[reason][outcomeOK].Add(1)
		h.count.healDuration.Observe(time.Since(start).Seconds())
		h.count.sessionAge.Observe(age.Seconds())
		ev = h.log.Warn().Uint64(logGen, gen).Dur("upstream_age", age)
		defer ev.Msg("session healed")
		h.streams.healed(sess.ID, gen)
		if sess.ToolsSeen() {
			sess.DueTools(true) // after the replay (attempt.sent)
		}
	case errors.Is(err, session.ErrClosed):
		outcome = "ended"
		h.log.Debug().Str(logSession, sess.ID.Short()).Msg("heal abandoned: the session ended")
	case errors.Is(err, errClosing) || errors.Is(err, context.Canceled):
		// Not a failure an operator acts on: the stream that was healing
		// ended, or mcpheal is shutting down.
		outcome = "abandoned"
		h.log.Info().Str(logSession, sess.ID.Short()).Msg("heal abandoned: the request or stream that needed it ended, or mcpheal is shutting down")
	case err != nil:
		o := outcomeFailed
		outcome = "failed"
		if errors.Is(err, errRecipeRefused) {
			o, outcome = outcomeRefused, "refused"
		}
		h.count.heals[reason][o].Add(1)
		ev = h.log.Error().Uint64(logGen, seen).Err(err)
		defer ev.Msg("heal failed")
	}
	if ev != nil {
		ev.Str(logSession, sess.ID.Short()).Str(logReason, reasonNames[reason]).Dur(logDuration, time.Since(start))
		if id := traceID(ctx); id != "" {
			ev.Str("trace_id", id)
		}
	}
	if sp != nil {
		sp.SetAttributes(attribute.String("mcpheal.heal.outcome", outcome), attribute.Int64("mcpheal.heal.generation", int64(gen)))
		if err != nil && outcome == "failed" || outcome == "refused" {
			sp.SetStatus(codes.Error, err.Error())
		}
		sp.End()
	}
	return up, gen, err
}

func deadlineOf(ctx context.Context, def time.Time) time.Time {
	if dl, ok := ctx.Deadline(); ok {
		return dl
	}
	return def
}

// breakerOpenError: the circuit breaker refused the work.
type breakerOpenError struct{ wait time.Duration }

func (e *breakerOpenError) Error() string {
	return fmt.Sprintf("circuit breaker open for %v", e.wait.Round(time.Millisecond))
}

// healAuthError: the upstream refused the credential of the request
// that healed (401 or 403 to the recorded initialize). The session stays:
// the request is answered with the upstream's status and challenge.
type healAuthError struct {
	status    int
	challenge string // the upstream's WWW-Authenticate
}

func (e *healAuthError) Error() string {
	return "upstream refused the credential: initialize answered " + strconv.Itoa(e.status)
}

// busyError: the upstream turned the recorded initialize away as at
// capacity or rate-limited (classify.Busy). The session stays; the request
// is answered with the upstream's status, words and Retry-After, and
// nothing counts it as an outage.
type busyError struct {
	status int
	wait   time.Duration
	msg    []byte // the upstream's JSON-RPC message, if it wrote one
}

func (e *busyError) Error() string {
	return "upstream busy: initialize answered " + strconv.Itoa(e.status)
}

// errClosing: mcpheal is shutting down; work in flight is abandoned.
var errClosing = errors.New("mcpheal is shutting down")

// reinit returns the re-init that Session.Heal runs once per generation:
// POST the recorded initialize under the failing request's headers, then
// notifications/initialized, retrying failures that delivered nothing with
// backoff until ctx ends. The dead upstream session is DELETEd best-effort.
// With a fleet, the upstream session another process made for the
// generation after seen is adopted instead (fleet.go).
func (h *healer) reinit(sess *session.Session, agent *fasthttp.RequestHeader, dead session.UpstreamID, seen uint64) session.InitFunc {
	// The leader may outlive the request that started it: copy its headers.
	hdr := new(fasthttp.RequestHeader)
	agent.CopyTo(hdr)
	if h.link.ownsAuthorization() {
		hdr.DelBytes(hdrAuthorization) // the agent's is the proxy's own, not the upstream's
	}
	auth := hdr.PeekBytes(hdrAuthorization)
	return func(ctx context.Context) (session.UpstreamID, uint64, error) {
		up, gen, grew, err := h.sessions.fleet.adopt(ctx, sess, seen)
		h.mem.charge(int64(grew))
		switch {
		case err == nil:
			sess.NoteAdopted(gen)
			h.log.Info().Str(logSession, sess.ID.Short()).Uint64(logGen, gen).Msg("heal adopted from another process")
			return up, gen, nil
		case !errors.Is(err, errAdopt):
			return "", 0, err
		}
		wait := upstream.Backoff{Min: 25 * time.Millisecond, Max: time.Second}
		busyWaited := false
		for try := 1; ; try++ {
			if ok, w := h.link.breaker.Allow(); !ok {
				// Open while this heal waits out the outage: it waits on
				// within its budget, woken when the upstream is back.
				dl, _ := ctx.Deadline()
				if d := min(w, wait.Next()); time.Now().Add(d).Before(dl) && h.link.sleep(d) {
					continue
				}
				return "", 0, &breakerOpenError{wait: w}
			}
			up, err := h.initUpstream(ctx, hdr, sess.Recipe.InitBody, sess.Recipe.ProtocolVersion)
			if err == nil {
				h.link.success()
				h.replayJournal(ctx, hdr, sess, up)
				return h.publish(ctx, sess, seen, up, dead, auth)
			}
			var (
				ce *credentialError
				he *healAuthError
				be *busyError
			)
			if errors.As(err, &be) {
				// At capacity, not down: wait its Retry-After once if the
				// budget allows, never counted against the breaker.
				dl, _ := ctx.Deadline()
				if busyWaited || !time.Now().Add(be.wait).Before(dl) || !h.link.sleep(be.wait) {
					return "", 0, err
				}
				busyWaited = true
				continue
			}
			if errors.Is(err, errRecipeRefused) || errors.As(err, &ce) || errors.As(err, &he) {
				return "", 0, err
			}
			h.link.failure()
			h.log.Debug().Str(logSession, sess.ID.Short()).Int("try", try).Err(err).Msg("upstream initialize failed; retrying")
			d := wait.Next()
			if dl, _ := ctx.Deadline(); time.Now().Add(d).After(dl) {
				return "", 0, fmt.Errorf("reinit after %d tries: %w", try, err)
			}
			if !h.link.sleep(d) {
				return "", 0, errClosing
			}
		}
	}
}

// publish makes up, the upstream session this process created for the
// generation after seen, the session's: with a fleet, unless another
// process recorded one first (then that one is adopted and up DELETEd).
// The dead upstream session is DELETEd best-effort.
func (h *healer) publish(ctx context.Context, sess *session.Session, seen uint64, up, dead session.UpstreamID, auth []byte) (session.UpstreamID, uint64, error) {
	won, gen, lost, err := h.sessions.fleet.publish(ctx, sess, seen, up)
	if lost {
		h.link.deleteLater(up, auth, true) // another process won the race: its session, not ours
	}
	switch {
	case err != nil:
		return "", 0, err
	case lost:
		sess.NoteAdopted(gen)
		return won, gen, nil
	}
	h.link.deleteLater(dead, auth, true)
	return won, gen, nil
}

// initUpstream creates a new upstream session from a recipe: initialize
// (with a proxy-namespaced id and no session header), then
// notifications/initialized. Failures that delivered nothing or that the
// server called transient are returned for retry; a refusal of the recipe is
// errRecipeRefused.
func (h *healer) initUpstream(ctx context.Context, agent *fasthttp.RequestHeader, initBody string, version string) (session.UpstreamID, error) {
	deadline := deadlineOf(ctx, time.Now().Add(h.cfg.HealTimeout))
	h.count.upstreamInits.Add(1)
	rep, err := h.link.call(&upcall{hdr: agent, body: withID([]byte(initBody), h.link.upcallID("init")), deadline: deadline,
		ctx: ctx, name: "initialize"})
	if errors.Is(err, upstream.ErrHeadTooLarge) {
		return "", fmt.Errorf("%w: %w", errRecipeRefused, err) // it answered, and would again
	}
	if err != nil {
		return "", err
	}
	switch st := rep.status; {
	case rep.sessionErr != nil:
		return "", fmt.Errorf("%w: %w", errRecipeRefused, rep.sessionErr)
	case st == fasthttp.StatusUnauthorized || st == fasthttp.StatusForbidden:
		// The credential, not the recipe: the agent's SDK renews its token
		// on a 401 and comes back with one the upstream takes (and a
		// credential the upstream now refuses must not end a session that
		// another, rotated one still uses).
		h.link.deleteLater(rep.session, agent.PeekBytes(hdrAuthorization), true)
		return "", &healAuthError{status: st, challenge: rep.challenge}
	case rep.class == classify.Busy:
		h.link.deleteLater(rep.session, agent.PeekBytes(hdrAuthorization), true)
		return "", &busyError{status: st, wait: rep.wait, msg: rep.msg}
	case st == fasthttp.StatusRequestTimeout || st >= 500:
		h.link.deleteLater(rep.session, agent.PeekBytes(hdrAuthorization), true)
		return "", fmt.Errorf("initialize answered %d", st)
	case st/100 != 2:
		h.link.deleteLater(rep.session, agent.PeekBytes(hdrAuthorization), true)
		return "", fmt.Errorf("%w: status %d", errRecipeRefused, st)
	}
	if got := initializedVersion(rep.status, rep.msg); got != version {
		h.link.deleteLater(rep.session, agent.PeekBytes(hdrAuthorization), true)
		return "", fmt.Errorf("%w: protocol version %q, session has %q", errRecipeRefused, got, version)
	}
	if err := h.initialized(ctx, agent, rep.session, version, deadline); err != nil {
		h.link.deleteLater(rep.session, agent.PeekBytes(hdrAuthorization), true)
		return "", err
	}
	return rep.session, nil
}

// initialized sends notifications/initialized on a new upstream session
// (MCP lifecycle: the client MUST send it). A notification does no harm
// twice, so a transport failure (a pooled connection the upstream closed
// as it restarted) sends it again on a checked connection: giving up
// would throw away the session the initialize just made, and make another.
func (h *healer) initialized(ctx context.Context, agent *fasthttp.RequestHeader, up session.UpstreamID, version string, deadline time.Time) error {
	note := upcall{hdr: agent, session: up, version: version, body: initializedNote, deadline: deadline,
		ctx: ctx, name: "notifications/initialized"}
	for try := 1; ; try++ {
		_, err := h.link.call(&note)
		if err == nil {
			return nil
		}
		if try == 3 || time.Now().After(deadline) {
			return fmt.Errorf("notifications/initialized: %w", err)
		}
		note.checked = true
	}
}

var initializedNote = []byte(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)
