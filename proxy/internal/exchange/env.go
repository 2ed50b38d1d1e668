package exchange

import (
	"github.com/rs/zerolog"

	"github.com/mcpheal/mcpheal/proxy/internal/conf"
	"github.com/mcpheal/mcpheal/proxy/internal/era"
	"github.com/mcpheal/mcpheal/proxy/internal/heal"
	"github.com/mcpheal/mcpheal/proxy/internal/link"
	"github.com/mcpheal/mcpheal/proxy/internal/obs"
	"github.com/mcpheal/mcpheal/proxy/internal/wire"
	"github.com/mcpheal/mcpheal/session"
)

// env is what an exchange (attempt.go) and the routes above it use of the
// stages below: the front door makes one per upstream and hands it down,
// and nothing below calls back up.
type Env struct {
	Cfg         *conf.Config
	Log         *zerolog.Logger
	Count       *obs.Counters
	Mem         *wire.Budget
	Bg          *wire.BgGroup
	Done        <-chan struct{}
	Link        *link.Link
	Sessions    *heal.Sessions
	Healer      *heal.Healer
	Eras        *era.State
	Trace       *obs.Tracing
	Answers     *AnswerLogs     // answers agents may resume (answerlog.go)
	ReplayTools map[string]bool // Config.ReplayTools
	Challenges  *Challenges     // the upstream's OAuth challenges, as the agent gets them
}

// ShareAnswers has the answers agents may resume kept for the fleet too
// (answershare.go): shared keeps them, owner names this process there.
func (e *Env) ShareAnswers(shared session.Answers, owner string) {
	fa := &e.Answers.FleetAnswers
	fa.Shared, fa.Owner = shared, owner
	fa.cfg, fa.log, fa.count, fa.mem, fa.bg, fa.done = e.Cfg, e.Log, e.Count, e.Mem, e.Bg, e.Done
}
