package obs

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mcpheal/mcpheal/classify"
	"github.com/mcpheal/mcpheal/proxy/internal/wire"
)

// Methods the request counters tell apart; anything else is "other".
var MethodNames = [...]string{
	"other", "initialize", "ping", "tools/call", "tools/list", "resources/list", "resources/read",
	"resources/templates/list", "resources/subscribe", "resources/unsubscribe", "prompts/list",
	"prompts/get", "completion/complete", "logging/setLevel", "server/discover", "notification",
	"response", "GET", "DELETE",
}

const NumClasses = int(classify.Busy) + 1

// methodIndex maps a request to its slot in methodNames.
func methodIndex(m *wire.Message) int {
	switch {
	case m.Get:
		return 17
	case m.Batch:
		return 0
	case m.Method == "":
		return 16
	case m.ID == "":
		return 15
	}
	switch m.Method { // compiled to a binary search
	case "initialize":
		return 1
	case "ping":
		return 2
	case "tools/call":
		return 3
	case "tools/list":
		return 4
	case "resources/list":
		return 5
	case "resources/read":
		return 6
	case "resources/templates/list":
		return 7
	case "resources/subscribe":
		return 8
	case "resources/unsubscribe":
		return 9
	case "prompts/list":
		return 10
	case "prompts/get":
		return 11
	case "completion/complete":
		return 12
	case "logging/setLevel":
		return 13
	case "server/discover":
		return 14
	}
	return 0
}

// Heal reasons and outcomes for mcpheal_heals_total.
const (
	ReasonSessionGone = iota // the upstream said the session is gone
	reasonTransport          // the connection died or timed out
	ReasonRestored           // a session restored from its sealed id needs an upstream session
	numReasons
)

var ReasonNames = [numReasons]string{"session_gone", "transport", "restored"}

const (
	OutcomeOK      = iota // re-created
	OutcomeFailed         // upstream unreachable within the budget
	OutcomeRefused        // the upstream refused the recipe; the agent must start over
	numOutcomes
)

var OutcomeNames = [numOutcomes]string{"ok", "failed", "refused"}

// Keepalive results for mcpheal_keepalive_total.
const (
	KeepaliveOK     = iota // the session answered
	KeepaliveGone          // it was gone: the agent's next request heals it
	KeepaliveFailed        // the ping or the heal failed
	numKeepalive
)

var KeepaliveNames = [numKeepalive]string{"ok", "gone", "failed"}

// Shared answers (Counters.SharedAnswers).
const (
	SharedWritten  = iota // an answer's log written to the shared store
	SharedFallback        // a write failed or was late: the answer stays local
	SharedServed          // an agent's resumption served from the shared log
	SharedTaken           // a lost replica's answer taken over
	SharedMissing         // a resumption found no shared log, or could not read it
	numShared
)

var SharedNames = [numShared]string{"written", "fallback", "served", "taken", "missing"}

// Counters is the one place where the proxy counts what it did: plain
// atomics on the hot path, exposed by collector at scrape time.
type Counters struct {
	Requests       [len(MethodNames)][NumClasses]atomic.Uint64
	Classes        [NumClasses]atomic.Uint64 // every classified upstream answer, replays included
	Heals          [numReasons][numOutcomes]atomic.Uint64
	Keepalive      [numKeepalive]atomic.Uint64
	Journal        [2]atomic.Uint64 // state replayed after a re-init: [outcomeOK], [outcomeFailed]
	Replays        atomic.Uint64    // requests sent again after a failure
	ReplaysRefused atomic.Uint64    // ambiguous failures not replayed
	// resumes counts answer streams resumed upstream ([outcomeOK]) and
	// those that could not be ([outcomeFailed]), resume.go.
	Resumes [numOutcomes]atomic.Uint64
	// agentResumes counts agents' GETs with a Last-Event-ID of mcpheal's
	// own, served from the answer's log ([outcomeOK]) or not, the log gone
	// ([outcomeFailed]), answerlog.go.
	AgentResumes [numOutcomes]atomic.Uint64
	// sharedAnswers counts what became of answers shared by the fleet
	// (exchange/answershare.go, route/stream/shared.go), by SharedNames.
	SharedAnswers [numShared]atomic.Uint64
	// unsafeResends counts requests that are not replay-safe sent again
	// after an exchange that may have run them. decide forbids it, so it
	// stays 0: tests assert it as an invariant.
	UnsafeResends atomic.Uint64
	Restored      atomic.Uint64 // sessions re-created from their sealed id
	UpstreamInits atomic.Uint64 // initialize requests sent upstream (agent's and re-inits)
	UpstreamDown  atomic.Uint64 // 503 answers after the heal budget
	AgentGone     atomic.Uint64 // agents that closed their connection while their request waited (agentWatch)
	Panics        atomic.Uint64
	BytesIn       atomic.Uint64 // request bodies sent upstream
	BytesOut      atomic.Uint64 // response bodies returned to agents

	HealDuration prometheus.Histogram // seconds from first failure to a usable session
	SessionAge   prometheus.Histogram // seconds an upstream session lived before it died
}

func (c *Counters) Init(upstream string) {
	labels := prometheus.Labels{"upstream": upstream}
	c.HealDuration = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:        "mcpheal_heal_duration_seconds",
		Help:        "Time from a session's death to its re-created upstream session.",
		ConstLabels: labels,
		Buckets:     []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 15, 30},
	})
	c.SessionAge = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:        "mcpheal_upstream_session_age_seconds",
		Help:        "How long an upstream session lived before it died.",
		ConstLabels: labels,
		Buckets:     []float64{1, 10, 60, 300, 900, 1800, 3600, 7200, 14400, 43200, 86400},
	})
}

func (c *Counters) Class(k classify.Class) {
	if int(k) < NumClasses {
		c.Classes[k].Add(1)
	}
}

func (c *Counters) Request(m *wire.Message, k classify.Class) {
	if int(k) < NumClasses {
		c.Requests[methodIndex(m)][k].Add(1)
	}
}
