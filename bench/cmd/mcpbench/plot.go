package main

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Plot geometry, in SVG user units.
const (
	panelW, panelH = 440.0, 300.0
	padL, padR     = 58.0, 14.0
	padT, padB     = 34.0, 44.0
	maxNines       = 4.0 // x axis ends at p99.99
)

var lineColor = map[string]string{direct: "#7f7f7f", viaNginx: "#2ca02c", mcpheal: "#1f77b4", bareProxy: "#ff7f0e", tracedProxy: "#9467bd", altProxy: "#d62728"}

// writePlot draws latency by percentile (HdrHistogram style: x is
// log10(1/(1-q))) for every variant and rate, each target one line, all
// counted rounds pooled.
func (h *harness) writePlot(path string) error {
	path = absTo(h.root, path)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	rows, cols := len(h.cfg.variants), len(h.cfg.rates)
	W, H := panelW*float64(cols), panelH*float64(rows)+30
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="sans-serif" font-size="11">`+"\n", W, H, W, H)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	x := 10.0
	for _, t := range h.targetNames() {
		fmt.Fprintf(&b, `<line x1="%.0f" y1="16" x2="%.0f" y2="16" stroke="%s" stroke-width="2.5"/><text x="%.0f" y="20">%s</text>`+"\n",
			x, x+22, lineColor[t], x+27, t)
		x += 100
	}
	fmt.Fprintf(&b, `<text x="%.0f" y="20" fill="#555">latency by percentile, open model, all counted rounds pooled</text>`+"\n", x+10)
	for i, v := range h.cfg.variants {
		for j, rate := range h.cfg.rates {
			h.plotPanel(&b, float64(j)*panelW, 30+float64(i)*panelH, v, rate)
		}
	}
	b.WriteString("</svg>\n")
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

// pooled returns the sorted latencies of all counted runs of a cell.
func (h *harness) pooled(v string, rate int, t string) []time.Duration {
	var all []time.Duration
	for _, r := range h.cell(v, rate, t) {
		all = append(all, r.Lat...)
	}
	slices.Sort(all)
	return all
}

func (h *harness) plotPanel(b *strings.Builder, ox, oy float64, v string, rate int) {
	lines := map[string][]time.Duration{}
	ymin, ymax := math.Inf(1), 0.0
	for _, t := range h.targetNames() {
		if l := h.pooled(v, rate, t); len(l) > 0 {
			lines[t] = l
			ymin = min(ymin, msOf(l[0]))
			ymax = max(ymax, msOf(quantile(l, 1-math.Pow(10, -maxNines))))
		}
	}
	if ymax == 0 {
		return
	}
	// Log scale: the median and the tail both stay readable.
	lo := math.Pow(10, math.Floor(math.Log10(max(ymin, 0.001))))
	hi := niceCeil(ymax * 1.05)
	pw, ph := panelW-padL-padR, panelH-padT-padB
	px := func(nines float64) float64 { return ox + padL + nines/maxNines*pw }
	py := func(msv float64) float64 {
		f := (math.Log10(max(min(msv, hi), lo)) - math.Log10(lo)) / (math.Log10(hi) - math.Log10(lo))
		return oy + padT + ph - f*ph
	}
	fmt.Fprintf(b, `<text x="%.1f" y="%.1f" font-weight="bold">%s, %d req/s</text>`+"\n", ox+padL, oy+padT-10, strings.ToUpper(v), rate)
	fmt.Fprintf(b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="none" stroke="#999"/>`+"\n", ox+padL, oy+padT, pw, ph)
	for k, lab := range []string{"p0", "p90", "p99", "p99.9", "p99.99"} {
		X := px(float64(k))
		fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#eee"/><text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n",
			X, oy+padT, X, oy+padT+ph, X, oy+padT+ph+14, lab)
	}
	for _, val := range logTicks(lo, hi) {
		Y := py(val)
		fmt.Fprintf(b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#eee"/><text x="%.1f" y="%.1f" text-anchor="end">%s</text>`+"\n",
			ox+padL, Y, ox+padL+pw, Y, ox+padL-4, Y+4, trimFloat(val))
	}
	fmt.Fprintf(b, `<text x="%.1f" y="%.1f" text-anchor="middle">percentile</text>`+"\n", ox+padL+pw/2, oy+panelH-12)
	fmt.Fprintf(b, `<text transform="translate(%.1f,%.1f) rotate(-90)" text-anchor="middle">latency ms (log)</text>`+"\n", ox+14, oy+padT+ph/2)
	for _, t := range h.targetNames() {
		l := lines[t]
		if l == nil {
			continue
		}
		var pts []string
		for s := 0.0; s <= maxNines+1e-9; s += 0.05 {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", px(s), py(msOf(quantile(l, 1-math.Pow(10, -s))))))
		}
		fmt.Fprintf(b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`+"\n", lineColor[t], strings.Join(pts, " "))
	}
}

// quantile returns the q-quantile (0 ≤ q ≤ 1) of sorted latencies.
func quantile(sorted []time.Duration, q float64) time.Duration { return pct(sorted, q*100) }

// logTicks returns 1, 2 and 5 times the powers of ten within [lo, hi].
func logTicks(lo, hi float64) []float64 {
	var ts []float64
	for d := lo; d <= hi*1.0001; d *= 10 {
		for _, m := range []float64{1, 2, 5} {
			if v := d * m; v >= lo*0.9999 && v <= hi*1.0001 {
				ts = append(ts, v)
			}
		}
	}
	return ts
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten.
func niceCeil(v float64) float64 {
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

func trimFloat(v float64) string {
	s := fmt.Sprintf("%.3f", v)
	s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	return s
}
