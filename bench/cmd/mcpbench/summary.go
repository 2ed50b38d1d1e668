package main

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// agg is the median and range of one figure over the rounds.
type agg struct {
	Med, Lo, Hi float64
	N           int
}

func aggregate(vs []float64) agg {
	vs = slices.DeleteFunc(slices.Clone(vs), math.IsNaN)
	if len(vs) == 0 {
		return agg{Med: math.NaN(), Lo: math.NaN(), Hi: math.NaN()}
	}
	slices.Sort(vs)
	m := vs[len(vs)/2]
	if len(vs)%2 == 0 {
		m = (vs[len(vs)/2-1] + vs[len(vs)/2]) / 2
	}
	return agg{Med: m, Lo: vs[0], Hi: vs[len(vs)-1], N: len(vs)}
}

// counted reports whether a run enters the medians.
func (r *runResult) counted() bool { return !r.Heavy && r.Round >= 0 }

// cell returns the counted runs of one variant, rate and target.
func (h *harness) cell(variant string, rate int, target string) []*runResult {
	var out []*runResult
	for _, r := range h.runs {
		if r.Variant == variant && r.Rate == rate && r.Target == target && r.counted() {
			out = append(out, r)
		}
	}
	return out
}

// figure aggregates f over a cell.
func figure(rs []*runResult, f func(*runResult) float64) agg {
	vs := make([]float64, len(rs))
	for i, r := range rs {
		vs[i] = f(r)
	}
	return aggregate(vs)
}

func msOf(d time.Duration) float64 { return float64(d) / 1e6 }

// added aggregates a target's latency minus direct's, paired by round so
// that drift between rounds cancels.
func (h *harness) added(variant string, rate int, target string, lat func(*runResult) time.Duration) agg {
	base := map[int]time.Duration{}
	for _, r := range h.cell(variant, rate, direct) {
		base[r.Round] = lat(r)
	}
	var vs []float64
	for _, r := range h.cell(variant, rate, target) {
		if b, ok := base[r.Round]; ok {
			vs = append(vs, msOf(lat(r)-b))
		}
	}
	return aggregate(vs)
}

// verdict is one performance target with its measured value.
type verdict struct {
	Name, Limit, Value string
	Status             string // PASS, MISS or SKIP
	Stretch            string // stretch goal status, if any
}

func passMiss(ok bool) string {
	if ok {
		return "PASS"
	}
	return "MISS"
}

// altSuffix marks a verdict about the -alt build.
func altSuffix(target string) string {
	if target == altProxy {
		return ", " + altProxy
	}
	return ""
}

// ratio divides two medians; NaN when the divisor is not positive.
func ratio(a, b float64) float64 {
	if b <= 0 || math.IsNaN(a) || math.IsNaN(b) {
		return math.NaN()
	}
	return a / b
}

// verdicts evaluates the targets for every variant measured.
func (h *harness) verdicts() []verdict {
	var vs []verdict
	for _, p := range h.buildNames() {
		for _, v := range h.cfg.variants {
			vs = append(vs, h.latencyVerdicts(v, p)...)
			vs = append(vs, h.costVerdicts(v, p)...)
		}
	}
	for _, r := range h.heals {
		ok := r.OK == r.Requests && r.ExtraP99 < 50*time.Millisecond
		vs = append(vs, verdict{
			Name:   fmt.Sprintf("heal under load, %d req/s (%s%s)", r.Rate, r.Variant, altSuffix(r.Target)),
			Limit:  "0 lost, heal p99 < 50 ms beyond the restart",
			Value:  fmt.Sprintf("%d lost, extra p99 %.1f ms (max %.1f ms)", r.Requests-r.OK, msOf(r.ExtraP99), msOf(r.ExtraMax)),
			Status: passMiss(ok),
		})
	}
	if m := h.memory; m != nil {
		last := m.Steps[len(m.Steps)-1]
		v := verdict{Name: fmt.Sprintf("%d idle sessions", last.Sessions), Limit: "< 300 MB RSS (at 100 000)",
			Value: fmt.Sprintf("%.1f MB RSS", mb(last.RSSKB)), Status: passMiss(mb(last.RSSKB) < 300)}
		if last.Sessions < 100_000 {
			v.Status = "SKIP"
		}
		vs = append(vs, v)
	}
	return vs
}

func (h *harness) latencyVerdicts(v, p string) []verdict {
	var vs []verdict
	for _, rate := range []int{1000, 2000} {
		if !slices.Contains(h.cfg.rates, rate) {
			continue
		}
		p50 := func(r *runResult) time.Duration { return r.P50 }
		rt := ratio(h.added(v, rate, p, p50).Med, h.added(v, rate, viaNginx, p50).Med)
		vs = append(vs, h.ratioVerdict(fmt.Sprintf("added p50 vs nginx, %d req/s (%s%s)", rate, v, altSuffix(p)), "≤ 1.0", rt, 1.0, math.NaN()))
		p99 := func(r *runResult) float64 { return msOf(r.P99) }
		rt = ratio(figure(h.cell(v, rate, p), p99).Med, figure(h.cell(v, rate, viaNginx), p99).Med)
		vs = append(vs, h.ratioVerdict(fmt.Sprintf("p99 vs nginx, %d req/s (%s%s)", rate, v, altSuffix(p)), "≤ 1.2", rt, 1.2, math.NaN()))
	}
	return vs
}

func (h *harness) costVerdicts(v, p string) []verdict {
	var vs []verdict
	if slices.Contains(h.cfg.rates, 2000) {
		cpu := func(r *runResult) float64 { return r.CPUus }
		rt := ratio(figure(h.cell(v, 2000, p), cpu).Med, figure(h.cell(v, 2000, viaNginx), cpu).Med)
		vs = append(vs, h.ratioVerdict(fmt.Sprintf("CPU per request vs nginx, 2000 req/s (%s%s)", v, altSuffix(p)), "≤ 1.2 (stretch ≤ 1.0)", rt, 1.2, 1.0))
		a := figure(h.cell(v, 2000, p), func(r *runResult) float64 { return r.Allocs })
		vd := verdict{Name: fmt.Sprintf("allocations per proxied request, 2000 req/s (%s%s)", v, altSuffix(p)), Limit: "≤ 2 (stretch 0)",
			Value: fmt.Sprintf("%.2f (%.2f–%.2f)", a.Med, a.Lo, a.Hi), Status: passMiss(a.Med <= 2)}
		vd.Stretch = passMiss(a.Med < 0.5)
		if a.N == 0 {
			vd.Status, vd.Stretch = "SKIP", ""
		}
		vs = append(vs, vd)
	}
	if h.cfg.satDuration > 0 {
		tp := func(r *runResult) float64 { return r.Throughput }
		rt := ratio(figure(h.cell(v, 0, p), tp).Med, figure(h.cell(v, 0, viaNginx), tp).Med)
		vd := h.ratioVerdict(fmt.Sprintf("closed-model throughput vs nginx (%s%s)", v, altSuffix(p)), "≥ 0.9", rt, math.NaN(), math.NaN())
		if !math.IsNaN(rt) {
			vd.Status = passMiss(rt >= 0.9)
		}
		vs = append(vs, vd)
	}
	return vs
}

// ratioVerdict builds a "ratio ≤ limit" verdict; SKIP when there is no
// ratio (no nginx). A NaN limit leaves the status to the caller.
func (h *harness) ratioVerdict(name, limit string, rt, max, stretch float64) verdict {
	v := verdict{Name: name, Limit: limit, Value: fmt.Sprintf("%.3f×", rt), Status: "SKIP"}
	if math.IsNaN(rt) {
		v.Value = "n/a"
		return v
	}
	if !math.IsNaN(max) {
		v.Status = passMiss(rt <= max)
	}
	if !math.IsNaN(stretch) {
		v.Stretch = passMiss(rt <= stretch)
	}
	return v
}

// finish prints the verdicts, writes the results and the plot, and returns
// the exit code.
func (h *harness) finish() (int, error) {
	fmt.Println()
	for _, v := range h.verdicts() {
		s := ""
		if v.Stretch != "" {
			s = " (stretch " + v.Stretch + ")"
		}
		fmt.Printf("%-4s %-55s %-32s %s%s\n", v.Status, v.Name, v.Value, v.Limit, s)
	}
	h.printBare()
	h.printTracing()
	h.printValidity()
	h.printLarge()
	h.printHostile()
	if h.cfg.plot != "" {
		if err := h.writePlot(h.cfg.plot); err != nil {
			return 0, err
		}
		h.logf("wrote %s", h.cfg.plot)
	}
	if h.cfg.out != "" && h.cfg.only == onlyPeers {
		if err := h.writePeers(h.cfg.out); err != nil {
			return 0, err
		}
		h.logf("wrote %s", h.cfg.out)
	} else if h.cfg.out != "" {
		if err := h.writeResults(h.cfg.out); err != nil {
			return 0, err
		}
		h.logf("wrote %s", h.cfg.out)
	}
	if len(h.failed) > 0 {
		fmt.Printf("\n%d correctness failures:\n", len(h.failed))
		for _, f := range h.failed {
			fmt.Println("  -", f)
		}
		return 1, nil
	}
	fmt.Printf("\nall answers verified (%d runs, %d large-event rounds, %d hostile-input passes); total %s\n", len(h.runs), len(h.large), len(h.hostile), time.Since(h.started).Round(time.Second))
	return 0, nil
}

// printValidity reports runs where vegeta missed the rate or steal was heavy.
func (h *harness) printValidity() {
	off, heavy := 0, 0
	for _, r := range h.runs {
		if !r.rateOK() {
			off++
		}
		if r.Heavy {
			heavy++
		}
	}
	fmt.Printf("\nruns: %d; achieved rate off by > 1 %%: %d; left out for steal > %.0f %% or foreign load > %.0f %%: %d\n",
		len(h.runs), off, h.cfg.stealMax, h.cfg.foreignMax, heavy)
}

// printBare prints mcpheal's CPU per request as the image runs it beside
// mcpheal-bare's, the same process with Go's default scheduler, and
// nginx's, for every variant and rate measured (docs/deployment.md "Keeping the
// runtime's sysmon awake").
func (h *harness) printBare() {
	if !h.cfg.bare || len(h.runs) == 0 {
		return
	}
	fmt.Printf("\nCPU µs per request, median: %s as the image runs it, %s without schedtrace in GODEBUG\n", mcpheal, bareProxy)
	rates := h.cfg.rates
	if h.cfg.satDuration > 0 {
		rates = append(slices.Clip(rates), 0) // the closed model
	}
	for _, v := range h.cfg.variants {
		for _, rate := range rates {
			cpu := func(t string) float64 {
				return figure(h.cell(v, rate, t), func(r *runResult) float64 { return r.CPUus }).Med
			}
			shipped, bare := cpu(mcpheal), cpu(bareProxy)
			if math.IsNaN(shipped) && math.IsNaN(bare) {
				continue
			}
			label := fmt.Sprintf("%d req/s", rate)
			if rate == 0 {
				label = "closed model"
			}
			us := func(x float64) string {
				if math.IsNaN(x) {
					return fmt.Sprintf("%6s", "–")
				}
				return fmt.Sprintf("%6.1f", x)
			}
			fmt.Printf("  %-4s %-12s %s %s   %s %s   %s / %s %s   nginx %s\n", v, label,
				mcpheal, us(shipped), bareProxy, us(bare), bareProxy, mcpheal, fmtRatio(ratio(bare, shipped)), us(cpu(viaNginx)))
		}
	}
}
