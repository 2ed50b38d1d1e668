package exchange

import (
	"github.com/rs/zerolog"

	"github.com/mcpheal/mcpheal/proxy/internal/conf"
	"github.com/mcpheal/mcpheal/proxy/internal/era"
	"github.com/mcpheal/mcpheal/proxy/internal/heal"
	"github.com/mcpheal/mcpheal/proxy/internal/link"
	"github.com/mcpheal/mcpheal/proxy/internal/obs"
	"github.com/mcpheal/mcpheal/proxy/internal/wire"
)

// Env is what an exchange (attempt.go) uses of the stages below: the
// front door makes one per upstream (NewEnv) and hands it down, and
// nothing below calls back up. Its exported fields are the ground every
// stage stands on; the stages are the exchange's own. A route is given
// the few stages it uses beside the Env it starts its attempts with
// (held.Route, bridge.Route, stream.Route), and reaches no other through
// it: the link least of all, which a route sends on only through its own
// narrow Upstream.
type Env struct {
	Cfg    *conf.Config
	Log    *zerolog.Logger
	Count  *obs.Counters
	Mem    *wire.Budget
	Bg     *wire.BgGroup
	Done   <-chan struct{}
	stages Stages
}

// Stages are the stages an exchange uses below it.
type Stages struct {
	Link        *link.Link
	Sessions    *heal.Sessions
	Healer      *heal.Healer
	Eras        *era.State
	Trace       *obs.Tracing
	Answers     *AnswerLogs     // answers agents may resume (answerlog.go)
	ReplayTools map[string]bool // Config.ReplayTools
	Challenges  *Challenges     // the upstream's OAuth challenges, as the agent gets them
}

// NewEnv returns the Env of the ground e and the stages st.
func NewEnv(e Env, st Stages) *Env {
	e.stages = st
	if st.Answers != nil {
		fa := &st.Answers.FleetAnswers
		fa.cfg, fa.log, fa.count, fa.mem, fa.bg, fa.done = e.Cfg, e.Log, e.Count, e.Mem, e.Bg, e.Done
	}
	return &e
}
