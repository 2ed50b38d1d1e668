package proxy

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/mcpheal/mcpheal/classify"
	"github.com/mcpheal/mcpheal/proxy/internal/obs"
)

// Metric descriptions. Every series carries the upstream's name.
var (
	descRequests = prometheus.NewDesc("mcpheal_requests_total",
		"Agent requests by method and the class of the answer they finally got.",
		[]string{"upstream", "method", "class"}, nil)
	descClassified = prometheus.NewDesc("mcpheal_classified_total",
		"Upstream answers by class, each attempt and replay counted.",
		[]string{"upstream", "class"}, nil)
	descHeals = prometheus.NewDesc("mcpheal_heals_total",
		"Upstream session re-creations by reason and outcome.",
		[]string{"upstream", "reason", "outcome"}, nil)
	descReplays = prometheus.NewDesc("mcpheal_replays_total",
		"Requests sent again after a failure (done), or not because they may have run (refused).",
		[]string{"upstream", "outcome"}, nil)
	descShared = prometheus.NewDesc("mcpheal_shared_answers_total",
		"Answers shared by a fleet (docs/streams.md \"Across replicas\"): written to the shared store, fallen back to the local log, resumptions served from it, lost replicas' answers taken over, resumptions that found none.",
		[]string{"upstream", "result"}, nil)
	descResumes = prometheus.NewDesc("mcpheal_stream_resumes_total",
		"Answer streams resumed: by=upstream, mcpheal resumed the server's stream that ended before its response (ok) or could not (failed); by=agent, an agent resumed mcpheal's (ok) or came too late (failed).",
		[]string{"upstream", "by", "outcome"}, nil)
	descKeepalive = prometheus.NewDesc("mcpheal_keepalive_total",
		"Keepalive probes of idle sessions by result.",
		[]string{"upstream", "result"}, nil)
	descJournal = prometheus.NewDesc("mcpheal_journal_replays_total",
		"Session state (log level, subscriptions) restored on a new upstream session, by outcome.",
		[]string{"upstream", "outcome"}, nil)
	descInits = prometheus.NewDesc("mcpheal_upstream_initializes_total",
		"initialize requests sent upstream (the agents' and re-inits).",
		[]string{"upstream"}, nil)
	descDown = prometheus.NewDesc("mcpheal_upstream_unavailable_total",
		"Requests answered 503 because the upstream stayed unreachable for the heal budget.",
		[]string{"upstream"}, nil)
	descAgentGone = prometheus.NewDesc("mcpheal_agent_gone_total",
		"Requests whose agent closed its connection while they waited on the upstream; the exchange was interrupted, nothing resent.",
		[]string{"upstream"}, nil)
	descPanics = prometheus.NewDesc("mcpheal_panics_total",
		"Recovered panics (bugs).", []string{"upstream"}, nil)
	descBytes = prometheus.NewDesc("mcpheal_bytes_total",
		"Body bytes: in = agent requests sent upstream, out = answers returned to agents.",
		[]string{"upstream", "direction"}, nil)
	descSessions = prometheus.NewDesc("mcpheal_sessions",
		"Live client sessions.", []string{"upstream"}, nil)
	descBreaker = prometheus.NewDesc("mcpheal_breaker_state",
		"Circuit breaker: 0 closed, 1 half-open, 2 open.", []string{"upstream"}, nil)
	descAcceptErrors = prometheus.NewDesc("mcpheal_accept_errors_total",
		"Errors accepting agents' connections (too many open files, aborted connections), waited out: mcpheal goes on accepting.",
		nil, nil)
	descConnsShed = prometheus.NewDesc("mcpheal_connections_shed_total",
		"Agents' connections closed (the one idle longest) or refused at the connection cap, three quarters of the file descriptor limit.",
		nil, nil)
	descMemory = prometheus.NewDesc("mcpheal_memory_budget_bytes",
		"The memory budget: used = session state, journals and buffered answers counted now; limit = memory_budget.",
		[]string{"upstream", "kind"}, nil)
)

// collector exposes the counters of the router's current servers at scrape
// time, so the hot path pays only for atomic adds.
type collector struct{ r *Router }

// Describe implements prometheus.Collector. It describes nothing: the
// collector is "unchecked", because its set of upstreams changes on reload.
func (c collector) Describe(chan<- *prometheus.Desc) {}

// Collect implements prometheus.Collector.
func (c collector) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(descAcceptErrors, prometheus.CounterValue, float64(c.r.acceptErrors.Load()))
	ch <- prometheus.MustNewConstMetric(descConnsShed, prometheus.CounterValue, float64(c.r.connsShed.Load()))
	t := c.r.routes.Load()
	seen := map[string]bool{}
	for _, s := range t.servers() {
		seen[s.cfg.Name] = true
		collectServer(ch, s)
	}
	for _, list := range t.retired {
		for _, s := range list {
			if !seen[s.cfg.Name] { // a retired server's name is served anew: count the new one
				collectServer(ch, s)
			}
		}
	}
}

func collectServer(ch chan<- prometheus.Metric, s *Server) {
	k := &s.count
	name := s.cfg.Name
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), append([]string{name}, labels...)...)
	}
	for m := range k.Requests {
		for cl := range k.Requests[m] {
			if v := k.Requests[m][cl].Load(); v > 0 {
				counter(descRequests, v, obs.MethodNames[m], classify.Class(cl).String())
			}
		}
	}
	for cl := range k.Classes {
		counter(descClassified, k.Classes[cl].Load(), classify.Class(cl).String())
	}
	for r := range k.Heals {
		for o := range k.Heals[r] {
			counter(descHeals, k.Heals[r][o].Load(), obs.ReasonNames[r], obs.OutcomeNames[o])
		}
	}
	counter(descReplays, k.Replays.Load(), "done")
	counter(descReplays, k.ReplaysRefused.Load(), "refused")
	counter(descResumes, k.Resumes[obs.OutcomeOK].Load(), "upstream", "ok")
	counter(descResumes, k.Resumes[obs.OutcomeFailed].Load(), "upstream", "failed")
	counter(descResumes, k.AgentResumes[obs.OutcomeOK].Load(), "agent", "ok")
	counter(descResumes, k.AgentResumes[obs.OutcomeFailed].Load(), "agent", "failed")
	for i, name := range obs.SharedNames {
		counter(descShared, k.SharedAnswers[i].Load(), name)
	}
	for r := range k.Keepalive {
		counter(descKeepalive, k.Keepalive[r].Load(), obs.KeepaliveNames[r])
	}
	counter(descJournal, k.Journal[obs.OutcomeOK].Load(), "ok")
	counter(descJournal, k.Journal[obs.OutcomeFailed].Load(), "failed")
	counter(descInits, k.UpstreamInits.Load())
	counter(descDown, k.UpstreamDown.Load())
	counter(descAgentGone, k.AgentGone.Load())
	counter(descPanics, k.Panics.Load())
	counter(descBytes, k.BytesIn.Load(), "in")
	counter(descBytes, k.BytesOut.Load(), "out")
	ch <- prometheus.MustNewConstMetric(descSessions, prometheus.GaugeValue, float64(s.sessions.Store.Len()), name)
	ch <- prometheus.MustNewConstMetric(descBreaker, prometheus.GaugeValue, float64(s.breakerState()), name)
	ch <- prometheus.MustNewConstMetric(descMemory, prometheus.GaugeValue, float64(s.mem.Used.Load()), name, "used")
	ch <- prometheus.MustNewConstMetric(descMemory, prometheus.GaugeValue, float64(s.mem.Limit), name, "limit")
	k.HealDuration.Collect(ch)
	k.SessionAge.Collect(ch)
	s.sessions.Fleet.Collect(ch)
}
