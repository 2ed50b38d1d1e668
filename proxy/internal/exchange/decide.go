package exchange

import (
	"github.com/mcpheal/mcpheal/classify"
	"github.com/mcpheal/mcpheal/proxy/internal/wire"
	"github.com/mcpheal/mcpheal/session"
)

// action is what the attempt loop does with one upstream outcome.
type action int

const (
	// actPass gives the upstream's answer to the agent as it is.
	actPass action = iota
	// actHeal re-creates the upstream session, then sends the request again.
	actHeal
	// actRetry waits (backoff, or for the session's outage probe) and sends
	// the request again on the same upstream session.
	actRetry
	// actRefuse answers -32011: the request may have run and is not safe to
	// run twice, so it is not sent again.
	actRefuse
	// actFail answers 503 with Retry-After: the upstream dropped the session
	// it had just created; the agent's session stays valid.
	actFail
	// actTooLarge answers 502 with -32016: the upstream's answer passed
	// mcpheal's cap (or 503 with -32017: its memory_budget). The upstream
	// answered, so it is neither retried nor a transport failure.
	actTooLarge
	// actAbandon gives up on the request: its agent closed its connection
	// while it waited, so there is nobody to answer and nothing is sent
	// again.
	ActAbandon
	// actCredential answers -32018: mcpheal could not get the upstream
	// credential it owns, so nothing was sent. Trying again would only ask
	// the token endpoint again (it holds its own retry schedule).
	actCredential
	// actWait waits out a busy upstream's Retry-After, then sends the
	// request once more.
	actWait
)

var actionNames = [...]string{"pass", "heal", "retry", "refuse", "fail", "too large", "abandon", "credential", "wait"}

func (a action) String() string { return actionNames[a] }

// Facts are what the decision needs to know of one exchange.
type Facts struct {
	Class classify.Class
	// dispatched: the upstream may have run the request. False only on
	// proof that it did not: nothing written, a refused connection, a
	// session rejection, a 5xx that is a known server refusal
	// (classify.Refused). Any other failure after the request was written
	// (reset, EOF, a cut SSE answer, a gateway's 502/503/504) leaves it
	// true.
	Dispatched bool
	// replaySafe: running the request twice does no harm (docs/healing.md "Replay
	// rules": a side-effect-free method, a tool annotated readOnlyHint or
	// idempotentHint, a tool the operator allow-listed, a notification or a
	// response).
	ReplaySafe bool
	// session: the request belongs to an agent session mcpheal can heal
	// (not 2026-07-28 session-less traffic).
	Session bool
	// mayHeal: the request carries the credential the session is bound to
	// (docs/security.md "Security": only that credential may re-create it).
	MayHeal bool
	// healed: this request already healed the session once.
	healed bool
	// tooLarge: the answer passed max_answer, or the memory budget, and
	// was not read.
	TooLarge bool
	// agentGone: the agent closed its connection while the request waited
	// on the upstream (agentWatch), which interrupted the exchange.
	AgentGone bool
	// credential: the exchange never started: mcpheal could not get the
	// upstream credential it owns.
	credential bool
	// waitFits: a Busy answer's Retry-After (1 s if it gave none) ends
	// within the request's heal budget; waited: the request already waited
	// one out.
	waitFits, waited bool
}

// Decide is the docs/healing.md's "What it does with each answer" and "Replay
// rules" as one pure function; TestDecide is that table row by row.
//
// A request is sent again only if it is safe to run twice or the upstream
// provably did not run it. A session rejection is such proof: every server
// checks the session before it dispatches (docs/healing.md "Replay rules"), so a heal
// replays whatever the method. Everything else that fails after the request
// was written is ambiguous, and an ambiguous request that is not replay-safe
// is refused, never run twice.
func Decide(f Facts) action {
	if f.AgentGone {
		return ActAbandon // whatever the upstream did, nobody waits for it
	}
	if f.credential {
		return actCredential // nothing was sent, and nothing will be until the token endpoint answers
	}
	if f.TooLarge {
		return actTooLarge // never replayed: it ran, and would be as large again
	}
	switch f.Class {
	case classify.SessionGone:
		switch {
		case !f.Session || !f.MayHeal:
			return actPass // nothing mcpheal may heal: the agent's SDK decides
		case f.healed:
			return actFail // the new session was refused at once: do not loop
		}
		return actHeal
	case classify.TransportDead, classify.Timeout:
		if f.Dispatched && !f.ReplaySafe {
			return actRefuse
		}
		return actRetry
	case classify.Busy:
		// At capacity, not down: once, and only when it is harmless and
		// the server's wait fits; else its own answer, Retry-After and all.
		if f.waited || !f.waitFits || (f.Dispatched && !f.ReplaySafe) {
			return actPass
		}
		return actWait
	}
	return actPass // OK, ToolError, Auth, Protocol: the upstream's own answer
}

// replayable reports whether a request may run twice without harm (docs/healing.md
// "Replay rules"): the one rule, for every route. tools/call is replay-safe
// only for a tool the upstream annotated readOnlyHint or idempotentHint
// (learned from the tools/list answers of the session) or one the operator
// allow-listed (replay_tools).
func replayable(m *wire.Message, sess *session.Session, allow map[string]bool) bool {
	if m.Batch {
		return false // its elements are not judged one by one: one may be a tools/call
	}
	if m.Get || !m.IsRequest() {
		return true // a GET stream, a notification, an answer: nothing runs twice
	}
	switch m.Method {
	case "ping", "initialize", "tools/list", "resources/list", "resources/templates/list",
		"resources/read", "prompts/list", "prompts/get", "completion/complete",
		"logging/setLevel", "resources/subscribe", "resources/unsubscribe", "server/discover":
		return true
	case "tools/call":
		return allow[m.Tool] || (sess != nil && sess.Replayable(m.Tool))
	}
	return false
}
