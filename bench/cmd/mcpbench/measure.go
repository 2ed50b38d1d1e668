package main

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// runResult is what one vegeta run against one target measured.
type runResult struct {
	Target, Variant string
	Rate            int // requests per second; 0 is the closed model
	Round           int
	Requests, OK    int
	Errors          map[string]int // failure kind → count
	Sample          string         // one failure, verbatim
	P50, P90, P99   time.Duration
	Max             time.Duration
	Achieved        float64 // vegeta's rate: requests / (last send − first send)
	Throughput      float64 // verified answers / (last answer − first send)
	StealPct        float64
	BusyPct         float64 // all CPUs of the machine
	ForeignPct      float64 // machine CPU used by none of vegeta, upstream, proxy and OTLP sink
	GenCPUus        float64 // vegeta's CPU per request, µs
	CPUus           float64 // the proxy's CPU per request, µs; NaN for direct
	Syscalls        float64 // the proxy's read+write system calls per request
	UpCPUus         float64 // the upstream's CPU per request, µs
	PeakRSSKB       uint64  // the proxy's VmHWM after the run
	Allocs          float64 // mcpheal: heap allocations per request; NaN otherwise
	Heavy           bool    // steal above -steal-max: repeated, left out of medians
	Noisy           bool    // foreign CPU above -foreign-max: repeated, left out of medians
	Lat             []time.Duration
	// Spans is what the OTLP sink received per request of a mcpheal-traced
	// run (Server: agent request spans, Client: upstream exchange spans),
	// SinkCPUus the sink's CPU per request, outside the proxy's; NaN for
	// the other targets.
	Spans, ServerSpans, ClientSpans float64
	SinkCPUus                       float64
	// UpInits is the upstream's initialize requests per request of the
	// run (the peers leg: how many upstream sessions a call opens); NaN
	// where not read. CPUns is set when CPUus came from a cpuacct group's
	// nanoseconds rather than /proc's 10 ms ticks.
	UpInits float64
	CPUns   bool
}

// rateOK reports whether vegeta kept the requested rate within 1 %.
func (r *runResult) rateOK() bool {
	return r.Rate == 0 || math.Abs(r.Achieved-float64(r.Rate)) <= 0.01*float64(r.Rate)
}

// measure runs one attack on t and samples the processes around it.
func (h *harness) measure(ctx context.Context, e *env, t *target, rate int, d time.Duration, round int) (*runResult, error) {
	spec := attackSpec{
		label: fmt.Sprintf("%s-%s-%d-r%d", e.variant, t.name, rate, round), sess: t.sess,
		rate: rate, workers: h.cfg.satWorkers, duration: d,
	}
	if h.cfg.only == onlyPeers {
		spec.timeout = h.cfg.peers.timeout
	}
	n := int(float64(rate)*d.Seconds()*1.05) + 100
	if rate == 0 {
		n = int(25_000 * d.Seconds()) // beyond what two cores serve; vegeta stops early if not
	}
	first := h.ids.Add(uint64(n)) - uint64(n) + 1
	targets := filepath.Join(h.dir, spec.label+".targets")
	if err := writeTargets(targets, t.sess, first, n); err != nil {
		return nil, err
	}
	defer os.Remove(targets)
	s0, err := h.sample(ctx, e, t)
	if err != nil {
		return nil, err
	}
	out, genCPU, err := h.runVegeta(ctx, spec, targets, rate == 0)
	if err != nil {
		return nil, err
	}
	defer os.Remove(out)
	if t.peer {
		h.waitIdle(ctx, t)
	}
	s1, err := h.sample(ctx, e, t)
	if err != nil {
		return nil, err
	}
	r := &runResult{Target: t.name, Variant: e.variant, Rate: rate, Round: round, Errors: map[string]int{}}
	if err := r.collect(out, first, first+uint64(n)-1); err != nil {
		return nil, err
	}
	r.account(s0, s1, h.cfg.stealMax)
	r.GenCPUus = float64(genCPU.Microseconds()) / float64(r.Requests)
	r.ForeignPct = foreignPct(s0, s1, genCPU)
	r.Noisy = r.ForeignPct > h.cfg.foreignMax
	if r.OK != r.Requests && !t.peer {
		h.fail("%s: %d of %d answers failed the echo check, e.g. %s", spec.label, r.Requests-r.OK, r.Requests, r.Sample)
	}
	if t.name == tracedProxy && rate > 0 && (r.ServerSpans < 1 || r.ClientSpans < 1) {
		// Every answered call is one agent request span and at least one
		// upstream exchange span, and the proxy flushed them all before
		// the second sample: fewer means spans were lost on the way. (In
		// the closed model the SDK's batch queue, 2048 spans by default,
		// may overflow by design; there the figure is only reported.)
		h.fail("%s: the OTLP sink received %.3f request spans and %.3f exchange spans per request; want at least 1 of each",
			spec.label, r.ServerSpans, r.ClientSpans)
	}
	return r, nil
}

// collect reads the run's answers into latency figures and failures.
func (r *runResult) collect(path string, first, last uint64) error {
	var t0, tLast, tEnd time.Time
	err := readHits(path, first, last, func(hh *hit, err error) {
		r.Requests++
		r.Lat = append(r.Lat, hh.Latency)
		if t0.IsZero() || hh.Timestamp.Before(t0) {
			t0 = hh.Timestamp
		}
		if hh.Timestamp.After(tLast) {
			tLast = hh.Timestamp
		}
		if end := hh.Timestamp.Add(hh.Latency); end.After(tEnd) {
			tEnd = end
		}
		if err == nil {
			r.OK++
			return
		}
		kind, _, _ := strings.Cut(err.Error(), ":")
		r.Errors[kind]++
		if r.Sample == "" {
			r.Sample = err.Error()
		}
	})
	if err != nil {
		return err
	}
	if r.Requests == 0 {
		return fmt.Errorf("%s: vegeta sent nothing", path)
	}
	slices.Sort(r.Lat)
	r.P50, r.P90, r.P99, r.Max = pct(r.Lat, 50), pct(r.Lat, 90), pct(r.Lat, 99), r.Lat[len(r.Lat)-1]
	if d := tLast.Sub(t0).Seconds(); d > 0 {
		r.Achieved = float64(r.Requests) / d
	}
	if d := tEnd.Sub(t0).Seconds(); d > 0 {
		r.Throughput = float64(r.OK) / d
	}
	return nil
}

// pct returns the p-th percentile of sorted latencies (nearest rank).
func pct(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(p/100*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// snapshot is the state of the measured processes at one instant.
type snapshot struct {
	cpu     cpuStat
	proxy   procSample
	up      procSample
	sink    procSample // mcpheal-traced's OTLP sink, when there is one
	spans   sinkStats  // what the sink received, for a mcpheal-traced run
	mallocs uint64
	cgNs    uint64 // the proxy's cpuacct group, when it has one
	hasCG   bool
	upInits int64 // the upstream's initialize requests so far (peers leg); -1 unread
}

func (h *harness) sample(ctx context.Context, e *env, t *target) (snapshot, error) {
	s := snapshot{upInits: -1}
	var err error
	if h.cfg.only == onlyPeers {
		st, err := e.upstreamStatsOf(ctx)
		if err != nil {
			return s, err
		}
		s.upInits = st.Initializes
	}
	if s.cpu, err = readCPUStat(); err != nil {
		return s, err
	}
	if s.up, err = sampleProcs([]int{e.up.pid()}); err != nil {
		return s, err
	}
	if t.name == tracedProxy {
		// The spans of the requests so far leave the proxy now, not at the
		// batch processor's next tick, inside the run that made them.
		var ok map[string]bool
		if err := getJSON(ctx, e.hc, http.MethodPost, t.stats+"/flush-traces", &ok); err != nil {
			return s, err
		}
		if err := getJSON(ctx, e.hc, http.MethodGet, e.sinkURL+"/stats", &s.spans); err != nil {
			return s, err
		}
	}
	if e.sink != nil {
		if s.sink, err = sampleProcs([]int{e.sink.pid()}); err != nil {
			return s, err
		}
	}
	if t.pids != nil {
		if t.tree {
			s.proxy, err = sampleTree(t.pids()[0])
		} else {
			s.proxy, err = sampleProcs(t.pids())
		}
		if err != nil {
			return s, err
		}
	}
	if t.cg != nil {
		if s.cgNs, err = t.cg.usageNs(); err != nil {
			return s, err
		}
		s.hasCG = true
	}
	if t.stats != "" {
		st, err := e.proxyStatsOf(ctx, t.stats)
		if err != nil {
			return s, err
		}
		s.mallocs = st.Mallocs
	}
	return s, nil
}

// account turns two snapshots into per-request costs.
func (r *runResult) account(a, b snapshot, stealMax float64) {
	perReq := func(ticks uint64) float64 { return float64(ticks) / clockTick * 1e6 / float64(r.Requests) }
	r.StealPct = stealPct(a.cpu, b.cpu)
	r.BusyPct = busyPct(a.cpu, b.cpu)
	r.Heavy = r.StealPct > stealMax
	r.UpCPUus = perReq(b.up.cpuTicks - a.up.cpuTicks)
	r.CPUus, r.Allocs, r.Syscalls = math.NaN(), math.NaN(), math.NaN()
	r.Spans, r.ServerSpans, r.ClientSpans, r.SinkCPUus = math.NaN(), math.NaN(), math.NaN(), math.NaN()
	r.UpInits = math.NaN()
	if a.upInits >= 0 && b.upInits >= 0 {
		r.UpInits = float64(b.upInits-a.upInits) / float64(r.Requests)
	}
	if r.Target != direct {
		r.CPUus = perReq(b.proxy.cpuTicks - a.proxy.cpuTicks)
		if a.hasCG && b.hasCG {
			r.CPUus, r.CPUns = float64(b.cgNs-a.cgNs)/1e3/float64(r.Requests), true
		}
		r.Syscalls = float64(b.proxy.syscalls-a.proxy.syscalls) / float64(r.Requests)
		r.PeakRSSKB = b.proxy.hwmKB
	}
	if isMcpheal(r.Target) {
		r.Allocs = float64(b.mallocs-a.mallocs) / float64(r.Requests)
	}
	if r.Target == tracedProxy {
		n := float64(r.Requests)
		r.Spans = float64(b.spans.Spans-a.spans.Spans) / n
		r.ServerSpans = float64(b.spans.Server-a.spans.Server) / n
		r.ClientSpans = float64(b.spans.Client-a.spans.Client) / n
		r.SinkCPUus = perReq(b.sink.cpuTicks - a.sink.cpuTicks)
	}
}

// foreignPct is the share of the machine's CPU time that went to processes
// other than the measured ones (the OTLP sink is one of them) (and to interrupt work no process is charged
// for): a shared machine's noise, reported per run.
func foreignPct(a, b snapshot, gen time.Duration) float64 {
	total := b.cpu.total - a.cpu.total
	if total == 0 {
		return 0
	}
	busy := float64(total - (b.cpu.idle - a.cpu.idle))
	known := float64(b.proxy.cpuTicks-a.proxy.cpuTicks+b.up.cpuTicks-a.up.cpuTicks+b.sink.cpuTicks-a.sink.cpuTicks) +
		gen.Seconds()*clockTick
	return max(0, 100*(busy-known)/float64(total))
}

// rotate returns ts starting at index k, wrapping around.
func rotate[T any](ts []T, k int) []T {
	k %= len(ts)
	return append(append([]T(nil), ts[k:]...), ts[:k]...)
}

// openModel warms every target up, then runs the fixed-rate matrix: for each
// rate, rounds of all targets in an order that rotates each round. A round
// with a run above -steal-max or -foreign-max is repeated (at most
// maxRepeats times per rate) and its runs are kept but left out of the
// medians.
func (h *harness) openModel(ctx context.Context, e *env) error {
	for _, t := range e.targets {
		if _, err := h.measure(ctx, e, t, h.cfg.rates[0], h.cfg.warmup, -1); err != nil {
			return fmt.Errorf("warm-up %s: %w", t.name, err)
		}
	}
	for _, rate := range h.cfg.rates {
		repeats := 0
		for round := 0; round < h.cfg.rounds; round++ {
			heavy := false
			for _, t := range rotate(e.targets, round+repeats) {
				r, err := h.measure(ctx, e, t, rate, h.cfg.duration, round)
				if err != nil {
					return err
				}
				h.runs = append(h.runs, r)
				heavy = heavy || r.Heavy || r.Noisy
				h.logRun(r)
			}
			if heavy && repeats < maxRepeats(h.cfg.rounds) {
				h.logf("round %d at %d req/s had heavy steal or foreign load: repeating it", round, rate)
				h.markHeavy(e.variant, rate, round)
				repeats++
				round--
			}
		}
	}
	return nil
}

// maxRepeats bounds the repeated rounds per rate, and so the run's length.
func maxRepeats(rounds int) int { return max(1, rounds/2) }

// markHeavy flags every run of one round so the medians leave it out.
func (h *harness) markHeavy(variant string, rate, round int) {
	for _, r := range h.runs {
		if r.Variant == variant && r.Rate == rate && r.Round == round {
			r.Heavy = true
			r.Round = -2 // superseded by the repeat
		}
	}
}

// closedModel runs the saturation rounds: -rate=0 with a fixed pool of
// workers, throughput in verified answers per second.
func (h *harness) closedModel(ctx context.Context, e *env) error {
	for round := 0; round < h.cfg.satRounds; round++ {
		for _, t := range rotate(e.targets, round) {
			r, err := h.measure(ctx, e, t, 0, h.cfg.satDuration, round)
			if err != nil {
				return err
			}
			h.runs = append(h.runs, r)
			h.logRun(r)
		}
	}
	return nil
}

func (h *harness) logRun(r *runResult) {
	rate := fmt.Sprintf("%d/s", r.Rate)
	if r.Rate == 0 {
		rate = fmt.Sprintf("closed %.0f/s", r.Throughput)
	}
	spans := ""
	if r.Target == tracedProxy {
		spans = fmt.Sprintf(" spans=%.3f sink=%.1fµs", r.Spans, r.SinkCPUus)
	}
	h.logf("%-4s %-14s %-14s r%d  n=%d ok=%d p50=%s p99=%s max=%s rate=%.1f cpu=%.1fµs up=%.1fµs gen=%.1fµs allocs=%.2f sys=%.1f busy=%.0f%% foreign=%.0f%% steal=%.1f%%%s",
		r.Variant, r.Target, rate, r.Round, r.Requests, r.OK, ms(r.P50), ms(r.P99), ms(r.Max), r.Achieved,
		r.CPUus, r.UpCPUus, r.GenCPUus, r.Allocs, r.Syscalls, r.BusyPct, r.ForeignPct, r.StealPct, spans)
}

// ms formats a duration in milliseconds with three decimals.
func ms(d time.Duration) string { return fmt.Sprintf("%.3fms", float64(d)/1e6) }
