package exchange

import (
	"time"

	"github.com/mcpheal/mcpheal/classify"
)

// Outcome is how an agent's request ends: the one answer it gets.
type Outcome struct {
	Kind  outcomeKind
	Class classify.Class // of the upstream's answer (outUpstream, outRefused)
	Err   error          // why the exchange failed (outRefused, outTooLarge, outCredential), for the log
	Why   string         // outDown: what was unreachable
	wait  time.Duration  // outBreakerOpen: until the breaker half-opens
}

type outcomeKind int

const (
	// outUpstream: the upstream's answer, passed through (docs/healing.md "What it
	// does with each answer").
	OutUpstream outcomeKind = iota
	// outRefused: -32011, the request may have run and was not retried.
	outRefused
	// outDown: 503 + Retry-After, the upstream stayed unreachable for the
	// heal budget; the agent's session stays valid.
	OutDown
	// outBreakerOpen: 503 + Retry-After at once, the circuit is open.
	outBreakerOpen
	// outGone: 404 on the client id, the upstream refused the recorded
	// initialize; the agent's SDK starts over.
	outGone
	// outAccepted: 202 for a notification or response addressed to a dead
	// upstream session.
	outAccepted
	// outEndResumption: an empty event stream for a GET resuming a dead
	// session's events.
	outEndResumption
	// outTooLarge: 502, the upstream's answer passed max_answer; or 503,
	// it passed the memory budget as it was read.
	OutTooLarge
	// outAgentGone: the agent closed its connection while its request
	// waited; the answer written goes nowhere (unless the agent only
	// half-closed it).
	OutAgentGone
	// outCredential: -32018, mcpheal could not get the upstream
	// credential it owns; nothing was sent.
	outCredential
	// outFull: 429 or 503 -32015, a new session the caps or the memory
	// budget have no room for (err says which).
	outFull
	// outInvalid: 502 -32020, an upstream answer mcpheal cannot carry
	// (err says why).
	outInvalid
	// outHealAuth: the upstream's 401 or 403 (and its challenge) to the
	// recorded initialize under this request's credential; the session
	// stays.
	outHealAuth
	// outBusy: the upstream's 429 or 503 at capacity to the recorded
	// initialize, after waiting out its Retry-After once if that fit: its
	// status, words and Retry-After; the session stays.
	outBusy
)
