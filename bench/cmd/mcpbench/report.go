package main

import (
	"bufio"
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"
)

// writeResults writes the Markdown report.
func (h *harness) writeResults(path string) error {
	if !filepath.IsAbs(path) {
		path = filepath.Join(h.root, path)
	}
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	w("# mcpheal benchmark results\n\n")
	w("Written by `bench/run.sh` (`go run ./bench/cmd/mcpbench`); every figure below comes from one run.\n\n")
	h.writeMachine(w)
	w("## Targets (docs/performance.md)\n\n| status | target | measured | limit |\n|---|---|---|---|\n")
	for _, v := range h.verdicts() {
		s := v.Status
		if v.Stretch != "" {
			s += " (stretch " + v.Stretch + ")"
		}
		w("| %s | %s | %s | %s |\n", s, v.Name, v.Value, v.Limit)
	}
	w("\n")
	if h.cfg.plot != "" {
		rel, err := filepath.Rel(filepath.Dir(path), absTo(h.root, h.cfg.plot))
		if err == nil {
			w("![Latency by percentile, all counted rounds pooled](%s)\n\n", rel)
		}
	}
	for _, v := range h.cfg.variants {
		h.writeOpenModel(w, v)
	}
	h.writeSaturation(w)
	h.writeTracing(w)
	h.writeHealStorm(w)
	h.writeLarge(w)
	h.writeHostile(w)
	h.writeMemory(w)
	h.writeGoBench(w)
	h.writeProfile(w)
	h.writeValidity(w)
	h.writeMethod(w)
	if notes, err := os.ReadFile(filepath.Join(filepath.Dir(path), findingsFile)); err == nil {
		w("\n%s", notes)
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

// findingsFile, beside the results file, holds the hand-written analysis
// (profile findings, proposed fixes, before/after figures); it is copied
// into the results so that a new run keeps it.
const findingsFile = "FINDINGS.md"

func absTo(root, p string) string {
	if filepath.IsAbs(p) {
		return p
	}
	return filepath.Join(root, p)
}

type writer func(format string, args ...any)

func (h *harness) writeMachine(w writer) {
	w("## Machine\n\n| | |\n|---|---|\n")
	w("| date | %s |\n", h.started.UTC().Format("2006-01-02 15:04 MST"))
	w("| commit | %s |\n", h.commit())
	w("| CPU | %s, %d cores |\n", cpuModel(), runtime.NumCPU())
	w("| memory | %s |\n", memTotal())
	w("| kernel | %s |\n", strings.TrimSpace(readFile("/proc/sys/kernel/osrelease")))
	w("| Go | %s (GOMAXPROCS %d) |\n", runtime.Version(), runtime.GOMAXPROCS(0))
	env := "the Dockerfile's `ENV`, as the image runs it"
	if len(h.cfg.proxyEnv) > 0 {
		env += ", then `-proxy-env`"
	}
	w("| mcpheal environment | `%s` (%s) |\n", strings.Join(h.proxyEnv(), " "), env)
	if h.cfg.bare {
		w("| %s | the same, then `%s` |\n", bareProxy, h.bareGODEBUG())
	}
	if h.cfg.tracing {
		w("| %s | the same, then `%s` |\n", tracedProxy, strings.Join(tracingVars("http://127.0.0.1:<sink port>"), " "))
	}
	if h.cfg.alt != "" {
		w("| %s | `%s` with environment `%s` |\n", altProxy, h.cfg.alt, strings.Join(h.altEnv(), " "))
	}
	w("| vegeta | %s |\n", vegetaVersion(h.vegeta))
	if h.nginx != "" {
		w("| nginx | %s |\n", h.toolVersion(h.nginx, "-v"))
	}
	w("| run | `%s`, %s |\n", strings.TrimSpace("bench/run.sh "+runArgs()), time.Since(h.started).Round(time.Second))
	w("\n")
	for _, n := range h.note {
		w("Note: %s\n\n", n)
	}
}

// commit names the measured tree: HEAD, and whether files differed from it.
func (h *harness) commit() string {
	out, err := exec.Command("git", "-C", h.root, "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return "unknown (not a git checkout)"
	}
	c := strings.TrimSpace(string(out))
	st, _ := exec.Command("git", "-C", h.root, "status", "--porcelain", "--untracked-files=no").Output()
	if n := len(strings.Fields(string(st))) / 2; n > 0 {
		c += fmt.Sprintf(" with %d tracked files modified", n)
	}
	return c
}

func (h *harness) toolVersion(bin string, flag string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	out, _ := exec.CommandContext(ctx, bin, flag).CombinedOutput()
	s := strings.TrimSpace(string(out))
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	return s
}

// vegetaVersion reads the module version built into the vegeta binary
// (a plain go build leaves its -version empty).
func vegetaVersion(bin string) string {
	out, err := exec.Command("go", "version", "-m", bin).Output()
	if err != nil {
		return "?"
	}
	for _, l := range strings.Split(string(out), "\n") {
		if f := strings.Fields(l); len(f) >= 3 && f[0] == "mod" && strings.HasPrefix(f[1], "github.com/tsenart/vegeta") {
			return f[1] + " " + f[2] + " (bench/tools/go.mod)"
		}
	}
	return "?"
}

// runArgs is the command line without the tool paths run.sh adds.
func runArgs() string {
	var out []string
	for i := 1; i < len(os.Args); i++ {
		if os.Args[i] == "-vegeta" || os.Args[i] == "-dir" || os.Args[i] == "-mcpheal" || os.Args[i] == "-contextforge" {
			i++
			continue
		}
		out = append(out, os.Args[i])
	}
	return strings.Join(out, " ")
}

func readFile(p string) string {
	b, _ := os.ReadFile(p)
	return string(b)
}

func cpuModel() string {
	for _, l := range strings.Split(readFile("/proc/cpuinfo"), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return runtime.GOARCH
}

func memTotal() string {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return "?"
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "MemTotal:"); ok {
			var kb float64
			fmt.Sscanf(strings.TrimSpace(v), "%f", &kb)
			return fmt.Sprintf("%.1f GiB", kb/(1<<20))
		}
	}
	return "?"
}

// f formats an aggregate as "median (min–max)".
func (a agg) f(prec int) string {
	if math.IsNaN(a.Med) {
		return "–"
	}
	if a.N == 1 {
		return fmt.Sprintf("%.*f", prec, a.Med)
	}
	return fmt.Sprintf("%.*f (%.*f–%.*f)", prec, a.Med, prec, a.Lo, prec, a.Hi)
}

func (h *harness) writeOpenModel(w writer, v string) {
	w("## Open model, %s answers\n\n", strings.ToUpper(v))
	w("vegeta at a fixed rate, %s per run, %d rounds, target order rotating; median (min–max) over the rounds. ", h.cfg.duration, h.cfg.rounds)
	w("Latency in ms; *added* is the target's figure minus direct's in the same round.\n\n")
	w("| rate | target | p50 | p90 | p99 | max | added p50 | added p99 | p99 / nginx | verified | achieved req/s |\n")
	w("|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, rate := range h.cfg.rates {
		ngP99 := figure(h.cell(v, rate, viaNginx), func(r *runResult) float64 { return msOf(r.P99) }).Med
		for _, t := range h.targetNames() {
			rs := h.cell(v, rate, t)
			if len(rs) == 0 {
				continue
			}
			p99 := figure(rs, func(r *runResult) float64 { return msOf(r.P99) })
			w("| %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", rate, t,
				figure(rs, func(r *runResult) float64 { return msOf(r.P50) }).f(3),
				figure(rs, func(r *runResult) float64 { return msOf(r.P90) }).f(3),
				p99.f(3),
				figure(rs, func(r *runResult) float64 { return msOf(r.Max) }).f(2),
				h.addedCell(v, rate, t, true), h.addedCell(v, rate, t, false),
				ratioCell(p99.Med, ngP99, t), verified(rs),
				figure(rs, func(r *runResult) float64 { return r.Achieved }).f(1))
		}
	}
	w("\nCost per request: CPU is utime+stime of the proxy process (nginx: master and workers) from `/proc/<pid>/stat`; syscalls are mcpheal's read and write system calls (`/proc/<pid>/io` syscr+syscw); allocations are the `runtime.MemStats.Mallocs` delta of the mcpheal process. *Foreign* is machine CPU used by none of vegeta, the upstream and the proxy (other work on this shared machine, and interrupt work no process is charged for).\n\n")
	w("| rate | target | CPU µs/req | CPU / nginx | syscalls/req | allocs/req | peak RSS MB | upstream CPU µs/req | vegeta CPU µs/req | machine busy %% | foreign %% | steal %% |\n")
	w("|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, rate := range h.cfg.rates {
		ngCPU := figure(h.cell(v, rate, viaNginx), func(r *runResult) float64 { return r.CPUus }).Med
		for _, t := range h.targetNames() {
			rs := h.cell(v, rate, t)
			if len(rs) == 0 {
				continue
			}
			cpu := figure(rs, func(r *runResult) float64 { return r.CPUus })
			w("| %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", rate, t,
				cpu.f(1), ratioCell(cpu.Med, ngCPU, t),
				syscallCell(rs, t),
				figure(rs, func(r *runResult) float64 { return r.Allocs }).f(2),
				figure(rs, func(r *runResult) float64 { return mbOrNaN(r.PeakRSSKB) }).f(1),
				figure(rs, func(r *runResult) float64 { return r.UpCPUus }).f(1),
				figure(rs, func(r *runResult) float64 { return r.GenCPUus }).f(1),
				figure(rs, func(r *runResult) float64 { return r.BusyPct }).f(0),
				figure(rs, func(r *runResult) float64 { return r.ForeignPct }).f(0),
				figure(rs, func(r *runResult) float64 { return r.StealPct }).f(1))
		}
	}
	w("\n")
}

func (h *harness) addedCell(v string, rate int, t string, p50 bool) string {
	if t == direct {
		return "–"
	}
	lat := func(r *runResult) time.Duration { return r.P99 }
	if p50 {
		lat = func(r *runResult) time.Duration { return r.P50 }
	}
	return h.added(v, rate, t, lat).f(3)
}

// syscallCell shows read/write system calls per request for mcpheal only:
// /proc/<pid>/io counts read, write, readv and writev, which is every call Go
// makes on a socket, but not nginx's recv, so nginx's figure would mislead.
func syscallCell(rs []*runResult, t string) string {
	if !isMcpheal(t) {
		return "–"
	}
	return figure(rs, func(r *runResult) float64 { return r.Syscalls }).f(2)
}

func ratioCell(a, b float64, t string) string {
	if t == direct {
		return "–"
	}
	r := ratio(a, b)
	if math.IsNaN(r) {
		return "–"
	}
	return fmt.Sprintf("%.2f", r)
}

func mbOrNaN(kb uint64) float64 {
	if kb == 0 {
		return math.NaN()
	}
	return mb(kb)
}

// verified is the share of answers that passed the echo check.
func verified(rs []*runResult) string {
	n, ok := 0, 0
	for _, r := range rs {
		n += r.Requests
		ok += r.OK
	}
	return fmt.Sprintf("%d/%d", ok, n)
}
