package proxy

import "github.com/rs/zerolog"

// env is what an exchange (attempt.go) and the routes above it use of the
// stages below: the front door makes one per upstream and hands it down,
// and nothing below calls back up.
type Env struct {
	Cfg         *Config
	Log         *zerolog.Logger
	Count       *Counters
	Mem         *Budget
	Bg          *BgGroup
	Done        <-chan struct{}
	Link        *Link
	Sessions    *Sessions
	Healer      *Healer
	Eras        *EraState
	Trace       *Tracing
	Answers     *AnswerLogs     // answers agents may resume (answerlog.go)
	ReplayTools map[string]bool // Config.ReplayTools
	Challenges  *Challenges     // the upstream's OAuth challenges, as the agent gets them
}
