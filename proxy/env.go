package proxy

import "github.com/rs/zerolog"

// env is what an exchange (attempt.go) and the routes above it use of the
// stages below: the front door makes one per upstream and hands it down,
// and nothing below calls back up.
type env struct {
	cfg         *Config
	log         *zerolog.Logger
	count       *counters
	mem         *budget
	bg          *bgGroup
	done        <-chan struct{}
	link        *link
	sessions    *sessions
	healer      *healer
	eras        *eraState
	trace       *tracing
	answers     *answerLogs     // answers agents may resume (answerlog.go)
	replayTools map[string]bool // Config.ReplayTools
	challenges  *challenges     // the upstream's OAuth challenges, as the agent gets them
}
