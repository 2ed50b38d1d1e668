package main

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// traceTotal is what mcpheal-traced was asked and what the OTLP sink
// received from it over one variant's whole run (warm-ups, sessions and
// every round), counted after it flushed its last spans at shutdown.
type traceTotal struct {
	Variant  string
	Requests uint64 // agent requests mcpheal-traced handled (proxy.Stats)
	Sink     sinkStats
}

// stopTraced ends mcpheal-traced's session, reads how many requests it
// handled, stops it (it flushes its last spans as it shuts down) and reads
// what the sink received in all.
func (h *harness) stopTraced(ctx context.Context, e *env) (*traceTotal, error) {
	t := e.target(tracedProxy)
	if t.sess.ID != "" {
		t.sess.Delete(ctx, e.hc)
		t.sess.ID = ""
	}
	st, err := e.proxyStatsOf(ctx, t.stats)
	if err != nil {
		return nil, err
	}
	e.traced.stop(10 * time.Second)
	e.traced = nil
	tt := &traceTotal{Variant: e.variant, Requests: st.Requests}
	if err := getJSON(ctx, e.hc, "GET", e.sinkURL+"/stats", &tt.Sink); err != nil {
		return nil, err
	}
	h.logf("%s %s: %d requests, the OTLP sink received %d spans (%d request, %d exchange, %d other) in %d exports, %d rejected",
		e.variant, tracedProxy, tt.Requests, tt.Sink.Spans, tt.Sink.Server, tt.Sink.Client, tt.Sink.Internal, tt.Sink.Exports, tt.Sink.Rejected)
	if tt.Sink.Rejected > 0 {
		h.fail("%s %s: the OTLP sink could not decode %d of what it was sent", e.variant, tracedProxy, tt.Sink.Rejected)
	}
	return tt, nil
}

// tracingRates are the rates of the tracing table: the open model's, then
// the closed model (0) when it ran.
func (h *harness) tracingRates() []int {
	rates := slices.Clip(h.cfg.rates)
	if h.cfg.satDuration > 0 {
		rates = append(rates, 0)
	}
	return rates
}

// addedCPU aggregates a target's CPU per request minus mcpheal's, paired
// by round.
func (h *harness) addedCPU(v string, rate int, t string) agg {
	base := map[int]float64{}
	for _, r := range h.cell(v, rate, mcpheal) {
		base[r.Round] = r.CPUus
	}
	var vs []float64
	for _, r := range h.cell(v, rate, t) {
		if b, ok := base[r.Round]; ok {
			vs = append(vs, r.CPUus-b)
		}
	}
	return aggregate(vs)
}

func rateLabel(rate int) string {
	if rate == 0 {
		return "closed"
	}
	return fmt.Sprintf("%d", rate)
}

// writeTracing writes the tracing section: mcpheal with tracing off and
// on, and nginx, side by side from the same rounds.
func (h *harness) writeTracing(w writer) {
	if !h.cfg.tracing || len(h.runs) == 0 {
		return
	}
	w("## Tracing on: %s\n\n", tracedProxy)
	w("*%s* is mcpheal as the image runs it, with OpenTelemetry tracing turned on the standard way (`%s`, the sink's port varying): every request is sampled, the worst case; the SDK's batch span processor and OTLP/HTTP exporter run with their defaults. ",
		tracedProxy, strings.Join(tracingVars("http://127.0.0.1:<port>"), " "))
	w("The proxy subcommand builds its tracer provider as the binary does (`telemetry.New` from the environment). ")
	w("The spans go to `mcpbench otlp-sink`, a process of its own on 127.0.0.1 that decodes every `POST /v1/traces` with the OTLP protobuf definitions and counts the spans; its CPU is not in %s's and is shown apart. ", tracedProxy)
	w("Before each run's closing sample the harness has %s flush its spans (`ForceFlush`), so that a run's spans, and the CPU spent exporting them, are that run's. ", tracedProxy)
	w("*Added* is %s's CPU per request minus mcpheal's in the same round; *spans/req* is the spans the sink received per request, median (min–max), = the medians of request spans (kind server) + upstream exchange spans (kind client).\n\n", tracedProxy)
	w("| variant | rate | target | CPU µs/req | CPU / nginx | added µs/req | allocs/req | syscalls/req | p50 ms | p99 ms | spans/req (request + exchange) | sink CPU µs/req | verified |\n")
	w("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, v := range h.cfg.variants {
		for _, rate := range h.tracingRates() {
			cpu := func(r *runResult) float64 { return r.CPUus }
			ngCPU := figure(h.cell(v, rate, viaNginx), cpu).Med
			for _, t := range []string{mcpheal, tracedProxy, viaNginx} {
				rs := h.cell(v, rate, t)
				if len(rs) == 0 {
					continue
				}
				c := figure(rs, cpu)
				added, spans, sink := "–", "–", "–"
				if t == tracedProxy {
					added = h.addedCPU(v, rate, t).f(1)
					spans = fmt.Sprintf("%s = %.3f + %.3f", figure(rs, func(r *runResult) float64 { return r.Spans }).f(3),
						figure(rs, func(r *runResult) float64 { return r.ServerSpans }).Med,
						figure(rs, func(r *runResult) float64 { return r.ClientSpans }).Med)
					sink = figure(rs, func(r *runResult) float64 { return r.SinkCPUus }).f(1)
				}
				w("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", v, rateLabel(rate), t,
					c.f(1), ratioCell(c.Med, ngCPU, t), added,
					figure(rs, func(r *runResult) float64 { return r.Allocs }).f(2), syscallCell(rs, t),
					figure(rs, func(r *runResult) float64 { return msOf(r.P50) }).f(3),
					figure(rs, func(r *runResult) float64 { return msOf(r.P99) }).f(3),
					spans, sink, verified(rs))
			}
		}
	}
	w("\n")
	for _, tt := range h.traceTotals {
		w("- %s, %s's whole life (warm-up, session set-up and every round; its last spans flushed at shutdown): %d agent requests, %d spans received (%d request, %d exchange, %d other) in %d exports of %.1f MB, %.3f spans per request; %d exports rejected.\n",
			tt.Variant, tracedProxy, tt.Requests, tt.Sink.Spans, tt.Sink.Server, tt.Sink.Client, tt.Sink.Internal,
			tt.Sink.Exports, float64(tt.Sink.Bytes)/1e6, float64(tt.Sink.Spans)/float64(max(tt.Requests, 1)), tt.Sink.Rejected)
	}
	if len(h.traceTotals) > 0 {
		w("\n")
	}
}

// printTracing prints mcpheal's CPU per request with tracing off and on
// beside nginx's, and the spans received per request.
func (h *harness) printTracing() {
	if !h.cfg.tracing || len(h.runs) == 0 {
		return
	}
	fmt.Printf("\nCPU µs per request, median: %s (tracing off), %s (always_on, OTLP/HTTP to the sink), nginx\n", mcpheal, tracedProxy)
	us := func(x float64) string {
		if math.IsNaN(x) {
			return fmt.Sprintf("%6s", "–")
		}
		return fmt.Sprintf("%6.1f", x)
	}
	for _, v := range h.cfg.variants {
		for _, rate := range h.tracingRates() {
			med := func(t string, f func(*runResult) float64) float64 { return figure(h.cell(v, rate, t), f).Med }
			cpu := func(r *runResult) float64 { return r.CPUus }
			off, on, ng := med(mcpheal, cpu), med(tracedProxy, cpu), med(viaNginx, cpu)
			if math.IsNaN(off) && math.IsNaN(on) {
				continue
			}
			added := "–"
			if a := h.addedCPU(v, rate, tracedProxy).Med; !math.IsNaN(a) {
				added = fmt.Sprintf("%+.1f", a)
			}
			fmt.Printf("  %-4s %-7s %s %s (%s× nginx)   %s %s (%s× nginx, %s paired)   nginx %s   spans/req %.3f   sink %s µs/req\n",
				v, rateLabel(rate), mcpheal, us(off), fmtRatio(ratio(off, ng)), tracedProxy, us(on), fmtRatio(ratio(on, ng)),
				added, us(ng),
				med(tracedProxy, func(r *runResult) float64 { return r.Spans }),
				strings.TrimSpace(us(med(tracedProxy, func(r *runResult) float64 { return r.SinkCPUus }))))
		}
	}
	for _, tt := range h.traceTotals {
		fmt.Printf("  %-4s whole life: %d requests, %d spans received (%d request, %d exchange, %d other), %.3f per request\n",
			tt.Variant, tt.Requests, tt.Sink.Spans, tt.Sink.Server, tt.Sink.Client, tt.Sink.Internal,
			float64(tt.Sink.Spans)/float64(max(tt.Requests, 1)))
	}
}
