package heal

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
	"go.opentelemetry.io/otel/trace"

	"github.com/mcpheal/mcpheal/classify"
	"github.com/mcpheal/mcpheal/proxy/internal/conf"
	"github.com/mcpheal/mcpheal/proxy/internal/link"
	"github.com/mcpheal/mcpheal/proxy/internal/obs"
	"github.com/mcpheal/mcpheal/proxy/internal/wire"
	"github.com/mcpheal/mcpheal/session"
	"github.com/mcpheal/mcpheal/upstream"
)

// Healer re-creates upstream sessions (docs/healing.md "What it does with each
// answer"): the single-flight re-initialize of a session from its recipe,
// the journal replay on the new upstream session, the check of the tool
// list after it, and the keepalive that heals a quiet session before its
// agent's next call. Requests reach it through attempt.heal, GET streams
// through getStream.heal, the keepalive on its own.
type Healer struct {
	Cfg      *conf.Config
	Log      *zerolog.Logger
	Count    *obs.Counters
	Mem      *wire.Budget
	Link     *link.Link
	Sessions *Sessions
	Streams  StreamNotes
	Bg       *wire.BgGroup
	Trace    *obs.Tracing // nil: tracing off

	pingUnsupported atomic.Bool // the upstream answered -32601 to ping: keepalive lists tools
}

// streams is what a heal tells the agents' open streams of a session (the
// GET stream route implements it): that the session healed into
// generation gen (a stream moves to the new upstream session), and an
// event for them (tools/list_changed after a heal). It is given to the
// healer from above: nothing here calls up.
type StreamNotes interface {
	Healed(id session.ClientID, gen uint64)
	Inject(id session.ClientID, event []byte)
}

// ErrRecipeRefused: the upstream no longer accepts the session's initialize
// (another protocol version, a credential it rejects, a session id past
// maxUpstreamID). The agent must start over, so it is told its session is
// gone.
var ErrRecipeRefused = errors.New("upstream refused the recorded initialize")

// Heal runs (or joins) the session's re-init from generation seen, under
// the agent headers hdr, and counts and logs the outcome once per
// generation: only the caller that saw the generation change reports it.
func (h *Healer) Heal(ctx context.Context, sess *session.Session, seen uint64, reason int, hdr *fasthttp.RequestHeader) (session.UpstreamID, uint64, error) {
	start := time.Now()
	age := sess.UpstreamAge()
	budget := time.Until(deadlineOf(ctx, start.Add(h.Cfg.HealTimeout)))
	var sp trace.Span // tracing off: no span, and nothing built for one
	if h.Trace != nil {
		ctx, sp = h.Trace.Child(ctx, "mcpheal heal", attribute.String("mcpheal.heal.reason", obs.ReasonNames[reason]),
			attribute.String("mcp.session.id", sess.ID.Short()), attribute.Int64("mcpheal.heal.from_generation", int64(seen)))
	}
	dead, _ := sess.Current()
	up, gen, err := sess.Heal(ctx, seen, budget, h.reinit(sess, hdr, dead, seen))
	outcome := "joined" // another request's heal served this one
	ev := (*zerolog.Event)(nil)
	switch {
	case err == nil && gen > seen && !sess.WasAdopted(gen) && sess.MarkReported(gen):
		outcome = "ok"
		h.Count.Heals[reason][obs.OutcomeOK].Add(1)
		h.Count.HealDuration.Observe(time.Since(start).Seconds())
		h.Count.SessionAge.Observe(age.Seconds())
		ev = h.Log.Warn().Uint64(obs.LogGen, gen).Dur("upstream_age", age)
		defer ev.Msg("session healed")
		h.Streams.Healed(sess.ID, gen)
		if sess.ToolsSeen() {
			sess.DueTools(true) // after the replay (attempt.sent)
		}
	case errors.Is(err, session.ErrClosed):
		outcome = "ended"
		h.Log.Debug().Str(obs.LogSession, sess.ID.Short()).Msg("heal abandoned: the session ended")
	case errors.Is(err, ErrClosing) || errors.Is(err, context.Canceled):
		// Not a failure an operator acts on: the stream that was healing
		// ended, or mcpheal is shutting down.
		outcome = "abandoned"
		h.Log.Info().Str(obs.LogSession, sess.ID.Short()).Msg("heal abandoned: the request or stream that needed it ended, or mcpheal is shutting down")
	case err != nil:
		o := obs.OutcomeFailed
		outcome = "failed"
		if errors.Is(err, ErrRecipeRefused) {
			o, outcome = obs.OutcomeRefused, "refused"
		}
		h.Count.Heals[reason][o].Add(1)
		ev = h.Log.Error().Uint64(obs.LogGen, seen).Err(err)
		defer ev.Msg("heal failed")
	}
	if ev != nil {
		ev.Str(obs.LogSession, sess.ID.Short()).Str(obs.LogReason, obs.ReasonNames[reason]).Dur(obs.LogDuration, time.Since(start))
		if sp != nil {
			ev.Str("trace_id", obs.TraceID(ctx))
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

// BreakerOpenError: the circuit breaker refused the work.
type BreakerOpenError struct{ Wait time.Duration }

func (e *BreakerOpenError) Error() string {
	return fmt.Sprintf("circuit breaker open for %v", e.Wait.Round(time.Millisecond))
}

// HealAuthError: the upstream refused the credential of the request
// that healed (401 or 403 to the recorded initialize). The session stays:
// the request is answered with the upstream's status and challenge.
type HealAuthError struct {
	Status    int
	Challenge string // the upstream's WWW-Authenticate
}

func (e *HealAuthError) Error() string {
	return "upstream refused the credential: initialize answered " + strconv.Itoa(e.Status)
}

// BusyError: the upstream turned the recorded initialize away as at
// capacity or rate-limited (classify.Busy). The session stays; the request
// is answered with the upstream's status, words and Retry-After, and
// nothing counts it as an outage.
type BusyError struct {
	Status int
	Wait   time.Duration
	Msg    []byte // the upstream's JSON-RPC message, if it wrote one
}

func (e *BusyError) Error() string {
	return "upstream busy: initialize answered " + strconv.Itoa(e.Status)
}

// ErrClosing: mcpheal is shutting down; work in flight is abandoned.
var ErrClosing = errors.New("mcpheal is shutting down")

// reinit returns the re-init that Session.Heal runs once per generation:
// POST the recorded initialize under the failing request's headers, then
// notifications/initialized, retrying failures that delivered nothing with
// backoff until ctx ends. The dead upstream session is DELETEd best-effort.
// With a fleet, the upstream session another process made for the
// generation after seen is adopted instead (fleet.go).
func (h *Healer) reinit(sess *session.Session, agent *fasthttp.RequestHeader, dead session.UpstreamID, seen uint64) session.InitFunc {
	// The leader may outlive the request that started it: copy its headers.
	hdr := new(fasthttp.RequestHeader)
	agent.CopyTo(hdr)
	if h.Link.OwnsAuthorization() {
		hdr.DelBytes(wire.HdrAuthorization) // the agent's is the proxy's own, not the upstream's
	}
	auth := hdr.PeekBytes(wire.HdrAuthorization)
	return func(ctx context.Context) (session.UpstreamID, uint64, error) {
		up, gen, grew, err := h.Sessions.Fleet.adopt(ctx, sess, seen)
		if grew != 0 {
			h.Mem.Charge(int64(grew))
		}
		switch {
		case err == nil:
			sess.NoteAdopted(gen)
			h.Log.Info().Str(obs.LogSession, sess.ID.Short()).Uint64(obs.LogGen, gen).Msg("heal adopted from another process")
			return up, gen, nil
		case !errors.Is(err, errAdopt):
			return "", 0, err
		}
		dl, _ := ctx.Deadline()
		retry := h.Link.Retry(link.PaceHeal, 0)
		retry.Until(dl)
		for try := 1; ; try++ {
			// Open while this heal waits out the outage: it waits on
			// within its budget, woken when the upstream is back.
			if ok, w := retry.Gate(); !ok {
				return "", 0, &BreakerOpenError{Wait: w}
			}
			up, err := h.initUpstream(ctx, hdr, sess.Recipe.InitBody, sess.Recipe.ProtocolVersion)
			if err == nil {
				h.Link.Success()
				h.replayJournal(ctx, hdr, sess, up)
				return h.publish(ctx, sess, seen, up, dead, auth)
			}
			var (
				ce *link.CredentialError
				he *HealAuthError
				be *BusyError
			)
			if errors.As(err, &be) {
				// At capacity, not down: its Retry-After is waited out
				// once if the budget allows, never counted against the breaker.
				if waited, fits := retry.BusyWait(be.Wait); waited || !fits || !retry.WaitBusy(be.Wait) {
					return "", 0, err
				}
				continue
			}
			if errors.Is(err, ErrRecipeRefused) || errors.As(err, &ce) || errors.As(err, &he) {
				return "", 0, err
			}
			h.Link.Failure()
			h.Log.Debug().Str(obs.LogSession, sess.ID.Short()).Int("try", try).Err(err).Msg("upstream initialize failed; retrying")
			if d := retry.Next(); !retry.Fits(d) {
				return "", 0, fmt.Errorf("reinit after %d tries: %w", try, err)
			} else if !h.Link.Sleep(d) {
				return "", 0, ErrClosing
			}
		}
	}
}

// publish makes up, the upstream session this process created for the
// generation after seen, the session's: with a fleet, unless another
// process recorded one first (then that one is adopted and up DELETEd).
// The dead upstream session is DELETEd best-effort.
func (h *Healer) publish(ctx context.Context, sess *session.Session, seen uint64, up, dead session.UpstreamID, auth []byte) (session.UpstreamID, uint64, error) {
	won, gen, lost, err := h.Sessions.Fleet.publish(ctx, sess, seen, up)
	if lost {
		h.Link.DeleteLater(up, auth, true) // another process won the race: its session, not ours
	}
	switch {
	case err != nil:
		return "", 0, err
	case lost:
		sess.NoteAdopted(gen)
		return won, gen, nil
	}
	h.Link.DeleteLater(dead, auth, true)
	return won, gen, nil
}

// initUpstream creates a new upstream session from a recipe: initialize
// (with a proxy-namespaced id and no session header), then
// notifications/initialized. Failures that delivered nothing or that the
// server called transient are returned for retry; a refusal of the recipe is
// errRecipeRefused.
func (h *Healer) initUpstream(ctx context.Context, agent *fasthttp.RequestHeader, initBody string, version string) (session.UpstreamID, error) {
	deadline := deadlineOf(ctx, time.Now().Add(h.Cfg.HealTimeout))
	h.Count.UpstreamInits.Add(1)
	rep, err := h.Link.Call(&link.Upcall{Hdr: agent, Body: wire.WithID([]byte(initBody), h.Link.UpcallID("init")), Deadline: deadline,
		Ctx: ctx, Name: "initialize"})
	if errors.Is(err, upstream.ErrHeadTooLarge) {
		return "", fmt.Errorf("%w: %w", ErrRecipeRefused, err) // it answered, and would again
	}
	if err != nil {
		return "", err
	}
	switch st := rep.Status; {
	case rep.SessionErr != nil:
		return "", fmt.Errorf("%w: %w", ErrRecipeRefused, rep.SessionErr)
	case st == fasthttp.StatusUnauthorized || st == fasthttp.StatusForbidden:
		// The credential, not the recipe: the agent's SDK renews its token
		// on a 401 and comes back with one the upstream takes (and a
		// credential the upstream now refuses must not end a session that
		// another, rotated one still uses).
		h.Link.DeleteLater(rep.Session, agent.PeekBytes(wire.HdrAuthorization), true)
		return "", &HealAuthError{Status: st, Challenge: rep.Challenge}
	case rep.Class == classify.Busy:
		h.Link.DeleteLater(rep.Session, agent.PeekBytes(wire.HdrAuthorization), true)
		return "", &BusyError{Status: st, Wait: rep.Wait, Msg: rep.Msg}
	case st == fasthttp.StatusRequestTimeout || st >= 500:
		h.Link.DeleteLater(rep.Session, agent.PeekBytes(wire.HdrAuthorization), true)
		return "", fmt.Errorf("initialize answered %d", st)
	case st/100 != 2:
		h.Link.DeleteLater(rep.Session, agent.PeekBytes(wire.HdrAuthorization), true)
		return "", fmt.Errorf("%w: status %d", ErrRecipeRefused, st)
	}
	if got := wire.InitializedVersion(rep.Status, rep.Msg); got != version {
		h.Link.DeleteLater(rep.Session, agent.PeekBytes(wire.HdrAuthorization), true)
		return "", fmt.Errorf("%w: protocol version %q, session has %q", ErrRecipeRefused, got, version)
	}
	if err := h.Initialized(ctx, agent, rep.Session, version, deadline); err != nil {
		h.Link.DeleteLater(rep.Session, agent.PeekBytes(wire.HdrAuthorization), true)
		return "", err
	}
	return rep.Session, nil
}

// Initialized sends notifications/initialized on a new upstream session
// (MCP lifecycle: the client MUST send it). A notification does no harm
// twice, so a transport failure (a pooled connection the upstream closed
// as it restarted) sends it again on a checked connection: giving up
// would throw away the session the initialize just made, and make another.
func (h *Healer) Initialized(ctx context.Context, agent *fasthttp.RequestHeader, up session.UpstreamID, version string, deadline time.Time) error {
	note := link.Upcall{Hdr: agent, Session: up, Version: version, Body: initializedNote, Deadline: deadline,
		Ctx: ctx, Name: "notifications/initialized"}
	for try := 1; ; try++ {
		_, err := h.Link.Call(&note)
		if err == nil {
			return nil
		}
		if try == 3 || time.Now().After(deadline) {
			return fmt.Errorf("notifications/initialized: %w", err)
		}
		note.Checked = true
	}
}

var initializedNote = []byte(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)
