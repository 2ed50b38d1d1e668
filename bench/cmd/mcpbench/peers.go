package main

import (
	"context"
	"flag"
	"fmt"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/mcpheal/mcpheal/bench"
)

// The peers leg (bench/run.sh -peers, mcpbench -only peers): IBM
// ContextForge (contextforge.go) in front of the same Go SDK echo upstream
// as nginx and mcpheal, in the same rounds, at the rates a sidecar sees
// (10, 100, 200 req/s) and at the bench's usual ones (1000, 2000 req/s),
// which it is not expected to hold: there its success rate and the rate it
// answers at are the figures. Then, with a few direct requests, what it
// does with upstream sessions, restarts and writes (observe.go).

const (
	onlyPeers = "peers"
	// viaContextForge is the ContextForge target.
	viaContextForge = "contextforge"
)

// peersConfig is the peers leg's part of the configuration.
type peersConfig struct {
	venv        string // ContextForge's virtual environment (bench/peers/contextforge.sh)
	rates       []int
	rounds      int
	duration    time.Duration // of one run, at least
	minRequests int           // and at least this many requests per run
	timeout     time.Duration // of one request, every target
	idleMax     time.Duration // wait at most this long for a peer's queue to drain after a run
	rpm         int           // ContextForge's RATE_LIMIT_MEDIUM_RPM in the rounds
	observe     bool
	sweep       []int // rates at which ContextForge alone runs once, to find where it saturates
}

// flags registers the -peer-* flags; the rates are parsed by parseRates.
func (p *peersConfig) flags(fs *flag.FlagSet) *string {
	fs.StringVar(&p.venv, "contextforge", "", "-only peers: ContextForge's virtual environment (bench/peers/contextforge.sh prints it)")
	rates := fs.String("peer-rates", "10,100,200,1000,2000", "-only peers: open-model rates, requests per second")
	fs.IntVar(&p.rounds, "peer-rounds", 3, "-only peers: rounds per rate, target order rotating (0: no rounds; with -peer-sweep \"\" the observations only, written only to -out)")
	fs.DurationVar(&p.duration, "peer-duration", 10*time.Second, "-only peers: length of one run, at least")
	fs.IntVar(&p.minRequests, "peer-min-requests", 300, "-only peers: requests per run, at least (a run at 10 req/s lasts 30 s)")
	fs.DurationVar(&p.timeout, "peer-timeout", 10*time.Second, "-only peers: vegeta's timeout of one request, every target")
	fs.DurationVar(&p.idleMax, "peer-idle-max", time.Minute, "-only peers: after a run, wait at most this long for ContextForge to finish the requests it queued")
	fs.IntVar(&p.rpm, "peer-rpm", 1_000_000, "-only peers: ContextForge's RATE_LIMIT_MEDIUM_RPM (MCP requests per minute per client IP and per user; its default, 100, would refuse the rounds)")
	fs.Func("peer-sweep", "-only peers: rates (req/s, comma-separated) at which ContextForge alone runs once after the rounds, to find the rate it holds (default 15,20,25,30,40; \"\" skips)", func(s string) error {
		var err error
		p.sweep, err = parseRateList("-peer-sweep", s)
		return err
	})
	p.sweep = []int{15, 20, 25, 30, 40}
	fs.BoolVar(&p.observe, "peer-observe", true, "-only peers: after the rounds, observe upstream sessions, restarts and writes through ContextForge and mcpheal")
	return rates
}

// parseRates sets the rates from -peer-rates.
func (p *peersConfig) parseRates(s string) error {
	var err error
	p.rates, err = parseRateList("-peer-rates", s)
	return err
}

// parseRateList parses comma-separated positive rates; "" is none.
func parseRateList(flagName, s string) ([]int, error) {
	var rates []int
	for _, r := range strings.Split(s, ",") {
		if r = strings.TrimSpace(r); r == "" {
			continue
		}
		n, err := strconv.Atoi(r)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("%s: %q is not a positive rate", flagName, r)
		}
		rates = append(rates, n)
	}
	return rates, nil
}

// runLength is how long a run at rate lasts: -peer-duration, or long
// enough for -peer-min-requests.
func (p *peersConfig) runLength(rate int) time.Duration {
	return max(p.duration, time.Duration(float64(p.minRequests)/float64(rate)*float64(time.Second)))
}

// onlyPeersLeg switches every other section off and writes the leg's own
// report, bench/RESULTS-peers.md, unless -out says otherwise.
func (c *config) onlyPeersLeg(fs *flag.FlagSet) error {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	c.variants, c.satDuration, c.healRate, c.storm, c.memSessions = nil, 0, 0, 0, 0
	c.goBench, c.profile, c.largeSizes, c.hostileBudgets, c.bare, c.tracing = false, false, nil, nil, false, false
	if !set["out"] {
		c.out = "bench/RESULTS-peers.md"
		if c.peers.rounds == 0 {
			c.out = "" // the observations alone print their lines and replace no report
		}
	}
	if !set["plot"] {
		c.plot = ""
	}
	if !set["warmup"] {
		c.warmup = 5 * time.Second
	}
	if c.peers.venv == "" {
		return fmt.Errorf("-only peers needs -contextforge (bench/run.sh -peers installs it)")
	}
	if len(c.peers.rates) == 0 && c.peers.rounds > 0 {
		return fmt.Errorf("-only peers: -peer-rates is empty")
	}
	return nil
}

// peersState is what the leg keeps for its report.
type peersState struct {
	version   string             // ContextForge's
	idleCPU   map[string]float64 // each proxy's CPU while no request came, ms per second
	nsCPU     bool               // CPU counted by cpuacct groups (tree.go), not ticks
	obs       []observation      // observe.go
	sweep     []*runResult       // ContextForge alone at -peer-sweep's rates
	obsNote   []string
	elapsed   time.Duration
	cfLog     string
	upstream  string
	serverURL string
}

// peersRun runs the leg.
func (h *harness) peersRun(ctx context.Context) error {
	start := time.Now()
	p := &h.peersRes
	e := &env{variant: "json", dir: filepath.Join(h.dir, "peers"), hc: &http.Client{Timeout: 30 * time.Second}}
	if err := os.MkdirAll(e.dir, 0o755); err != nil {
		return err
	}
	var cf *contextForge
	var groups []*cpuGroup
	defer func() {
		e.stop()
		cf.stop()
		for _, g := range groups {
			g.remove()
		}
	}()
	var err error
	if e.upAddr, err = freeAddr(); err != nil {
		return err
	}
	if err := h.startUpstream(ctx, e); err != nil {
		return err
	}
	upURL := "http://" + e.upAddr + "/mcp"
	p.upstream = upURL
	e.targets = append(e.targets, &target{name: direct, sess: bench.Session{URL: upURL}})
	if h.nginx != "" {
		addr, err := freeAddr()
		if err != nil {
			return err
		}
		if e.nginx, err = startNginx(ctx, h.nginx, filepath.Join(e.dir, "nginx"), e.upAddr, addr); err != nil {
			return err
		}
		e.targets = append(e.targets, &target{name: viaNginx, sess: bench.Session{URL: "http://" + addr + "/mcp"},
			pids: func() []int { return e.nginx.pids }, tree: true})
	}
	proxyURL, statsURL, px, err := h.startProxy(ctx, e.dir, upURL)
	if err != nil {
		return err
	}
	e.proxy, e.statsURL = px, statsURL
	e.targets = append(e.targets, &target{name: mcpheal, sess: bench.Session{URL: proxyURL},
		pids: func() []int { return []int{e.proxy.pid()} }, stats: statsURL, tree: true})
	h.logf("peers: starting ContextForge from %s (RATE_LIMIT_MEDIUM_RPM=%d)", h.cfg.peers.venv, h.cfg.peers.rpm)
	cf, err = startContextForge(ctx, h.cfg.peers.venv, filepath.Join(e.dir, "contextforge"), h.cfg.peers.rpm)
	if err != nil {
		return err
	}
	p.version, p.cfLog = cf.version(ctx), filepath.Join(cf.dir, "contextforge.log")
	srv, err := cf.register(ctx, "bench", upURL)
	if err != nil {
		return fmt.Errorf("contextforge: %w", err)
	}
	p.serverURL = srv.URL
	e.targets = append(e.targets, &target{name: viaContextForge,
		sess: bench.Session{URL: srv.URL, Auth: "Bearer " + cf.token, Tool: srv.Tools[bench.EchoTool]},
		pids: func() []int { return []int{cf.root.pid()} }, tree: true, peer: true})
	for _, t := range e.targets {
		if t.sess, err = bench.InitializeAs(ctx, e.hc, t.sess, true); err != nil {
			return fmt.Errorf("session via %s: %w", t.name, err)
		}
		if t.pids != nil {
			if t.cg = newCPUGroup(t.name, t.pids()[0]); t.cg != nil {
				groups = append(groups, t.cg)
			}
		}
	}
	p.nsCPU = len(groups) == len(e.targets)-1
	h.logf("peers: upstream %s; ContextForge %s serves it at %s as tool %q; CPU from %s", upURL, p.version, srv.URL,
		srv.Tools[bench.EchoTool], map[bool]string{true: "cpuacct groups (ns)", false: "/proc ticks"}[p.nsCPU])
	cft := e.target(viaContextForge)
	h.waitIdle(ctx, cft)
	if p.idleCPU, err = h.idleCPU(ctx, e.targets[1:], 10*time.Second); err != nil {
		return err
	}
	h.logf("peers: idle, ms CPU per second: %v", p.idleCPU)
	if h.cfg.peers.rounds > 0 {
		for _, t := range e.targets {
			if _, err := h.measure(ctx, e, t, h.cfg.peers.rates[0], h.cfg.warmup, -1); err != nil {
				return fmt.Errorf("warm-up %s: %w", t.name, err)
			}
		}
	}
	for _, rate := range h.cfg.peers.rates {
		for round := 0; round < h.cfg.peers.rounds; round++ {
			for _, t := range rotate(e.targets, round) {
				r, err := h.measure(ctx, e, t, rate, h.cfg.peers.runLength(rate), round)
				if err != nil {
					return err
				}
				h.runs = append(h.runs, r)
				h.logRun(r)
			}
		}
	}
	if len(h.cfg.peers.sweep) > 0 {
		if h.cfg.peers.rounds == 0 {
			if _, err := h.measure(ctx, e, cft, h.cfg.peers.sweep[0], h.cfg.warmup, -1); err != nil {
				return fmt.Errorf("warm-up %s: %w", cft.name, err)
			}
		}
		for _, rate := range h.cfg.peers.sweep {
			r, err := h.measure(ctx, e, cft, rate, h.cfg.peers.runLength(rate), 0)
			if err != nil {
				return err
			}
			p.sweep = append(p.sweep, r)
			h.logRun(r)
		}
	}
	if h.cfg.peers.observe {
		if err := h.observe(ctx, e, cf); err != nil {
			return fmt.Errorf("observations: %w", err)
		}
	}
	p.elapsed = time.Since(start)
	return nil
}

// treeCPU returns t's CPU so far, in milliseconds: its cpuacct group's, or
// its process tree's ticks.
func treeCPU(t *target) (float64, error) {
	if t.cg != nil {
		ns, err := t.cg.usageNs()
		return float64(ns) / 1e6, err
	}
	s, err := sampleTree(t.pids()[0])
	return float64(s.cpuTicks) * 1000 / clockTick, err
}

// waitIdle waits until t's process tree used less than a tenth of a core
// over a second (the requests it queued are done), at most -peer-idle-max.
func (h *harness) waitIdle(ctx context.Context, t *target) {
	start := time.Now()
	prev, err := treeCPU(t)
	if err != nil {
		return
	}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for time.Since(start) < h.cfg.peers.idleMax {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		cur, err := treeCPU(t)
		if err != nil {
			return
		}
		if cur-prev < 100 {
			if d := time.Since(start); d > 2*time.Second {
				h.logf("%s: idle again %.0f s after the run", t.name, d.Seconds())
			}
			return
		}
		prev = cur
	}
	h.logf("%s: still busy %s after the run", t.name, h.cfg.peers.idleMax)
}

// idleCPU measures each target's CPU over the same d with no request
// sent, in ms per second.
func (h *harness) idleCPU(ctx context.Context, ts []*target, d time.Duration) (map[string]float64, error) {
	a := map[string]float64{}
	for _, t := range ts {
		v, err := treeCPU(t)
		if err != nil {
			return nil, err
		}
		a[t.name] = v
	}
	if err := sleepCtx(ctx, d); err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, t := range ts {
		v, err := treeCPU(t)
		if err != nil {
			return nil, err
		}
		out[t.name] = (v - a[t.name]) / d.Seconds()
	}
	return out, nil
}

// peerTargets are the targets of the leg's tables, in order.
func (h *harness) peerTargets() []string {
	return []string{direct, viaNginx, mcpheal, viaContextForge}
}

// writePeers writes the leg's report.
func (h *harness) writePeers(path string) error {
	if !filepath.IsAbs(path) {
		path = filepath.Join(h.root, path)
	}
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	p := &h.peersRes
	w("# mcpheal beside IBM ContextForge\n\n")
	w("Written by `bench/run.sh -peers` (`mcpbench -only peers`); every figure below comes from one run.\n\n")
	h.writeMachine(w)
	w("## ContextForge\n\n| | |\n|---|---|\n")
	w("| version | %s (PyPI `mcp-contextforge-gateway`, `bench/peers/contextforge.lock`), `mcpgateway --workers 1` (uvicorn, one worker), SQLite, its defaults but the settings below |\n", p.version)
	w("| settings | `JWT_SECRET_KEY`, `AUTH_ENCRYPTION_SECRET` (random), `BASIC_AUTH_PASSWORD`, `PLATFORM_ADMIN_PASSWORD`, `DEFAULT_USER_PASSWORD` (random, 28 characters), `PLATFORM_ADMIN_EMAIL=%s`, `DATABASE_URL=sqlite:///…/mcp.db`, `SSRF_ALLOW_LOCALHOST=true`, `RATE_LIMIT_MEDIUM_RPM=%d` |\n", contextForgeAdmin, h.cfg.peers.rpm)
	w("| idle | %.1f ms CPU per second with no request (its own background work, inside every run's figure; nginx %.2f, mcpheal %.2f, over the same 10 s) |\n\n",
		p.idleCPU[viaContextForge], p.idleCPU[viaNginx], p.idleCPU[mcpheal])
	h.writePeerRounds(w)
	h.writePeerSweep(w)
	h.writeObservations(w)
	w("## Method\n\n")
	w("- One Go SDK echo upstream (JSON answers, stateful sessions) behind every target, all on 127.0.0.1; ContextForge reaches it as gateway `bench` (transport `STREAMABLEHTTP`) through virtual server `%s`, its agents with `Authorization: Bearer <JWT>` (`python -m mcpgateway.utils.create_jwt_token --username %s --exp 10080 --secret $JWT_SECRET_KEY`).\n", p.serverURL, contextForgeAdmin)
	w("- Each target gets one agent session (initialize, notifications/initialized, tools/list); every request is a `tools/call` of the echo tool (ContextForge names it `bench-echo`) with a unique JSON-RPC id, and every answer is checked to be the echo of its own id. Failed answers of ContextForge are counted, not failures of the run.\n")
	w("- vegeta v12.12.0 at each rate for max(%s, %d requests), `-timeout %s`, at most %d workers; rounds rotate the target order; warm-up %s per target at %d req/s first.\n",
		h.cfg.peers.duration, h.cfg.peers.minRequests, h.cfg.peers.timeout, maxWorkers, h.cfg.warmup, firstRate(h.cfg.peers.rates))
	cpu := "CPU is counted in nanoseconds by a cpuacct cgroup per proxy that holds its whole process tree (moved in after start; what it forks later is born in it)"
	if !p.nsCPU {
		cpu = "CPU is utime+stime (10 ms ticks) of the proxy's whole process tree, walked at every sample, plus each process's reaped children's (cutime+cstime)"
	}
	w("- %s: nginx's master and workers, mcpheal's one process, ContextForge's uvicorn process and the workers it forks. ContextForge's second sample is taken once its tree used under a tenth of a core for a second (at most %s), so that the requests it had queued when vegeta stopped waiting count in the run that sent them.\n", cpu, h.cfg.peers.idleMax)
	w("- *ms/req* is CPU over the requests sent; *ms/answer* over the verified answers. *upstream inits/req* is the upstream's initialize requests over the requests sent.\n")
	if len(p.obsNote) > 0 {
		for _, n := range p.obsNote {
			w("- %s\n", n)
		}
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

func firstRate(rates []int) int {
	if len(rates) == 0 {
		return 0
	}
	return rates[0]
}

// writePeerRounds writes the rounds' table: medians (min–max) per rate and
// target.
func (h *harness) writePeerRounds(w writer) {
	if h.cfg.peers.rounds == 0 {
		return
	}
	w("## Open model, JSON answers\n\n")
	w("%d rounds per rate; median (min–max) over the rounds. Latency in ms, of the verified answers and the failed ones alike (a timed-out request counts at vegeta's timeout, %s).\n\n", h.cfg.peers.rounds, h.cfg.peers.timeout)
	w("| rate | target | verified | success | answered req/s | p50 ms | p99 ms | CPU ms/req | CPU ms/answer | CPU / nginx | CPU / mcpheal | upstream inits/req | peak RSS MB | foreign %% |\n")
	w("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, rate := range h.cfg.peers.rates {
		cpuOf := func(t string) float64 {
			return figure(h.cell("json", rate, t), func(r *runResult) float64 { return r.CPUus / 1e3 }).Med
		}
		ng, mh := cpuOf(viaNginx), cpuOf(mcpheal)
		for _, t := range h.peerTargets() {
			rs := h.cell("json", rate, t)
			if len(rs) == 0 {
				continue
			}
			n, ok := 0, 0
			for _, r := range rs {
				n += r.Requests
				ok += r.OK
			}
			cpu := figure(rs, func(r *runResult) float64 { return r.CPUus / 1e3 })
			w("| %d | %s | %d/%d | %.1f %% | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", rate, t, ok, n, 100*float64(ok)/float64(n),
				figure(rs, func(r *runResult) float64 { return r.Throughput }).f(1),
				figure(rs, func(r *runResult) float64 { return msOf(r.P50) }).f(3),
				figure(rs, func(r *runResult) float64 { return msOf(r.P99) }).f(3),
				cpu.f(3),
				figure(rs, func(r *runResult) float64 {
					if r.OK == 0 {
						return math.NaN()
					}
					return r.CPUus / 1e3 * float64(r.Requests) / float64(r.OK)
				}).f(3),
				ratioCell(cpu.Med, ng, t), ratioCell(cpu.Med, mh, t),
				figure(rs, func(r *runResult) float64 { return r.UpInits }).f(3),
				figure(rs, func(r *runResult) float64 { return mbOrNaN(r.PeakRSSKB) }).f(1),
				figure(rs, func(r *runResult) float64 { return r.ForeignPct }).f(0))
		}
	}
	w("\nContextForge's failed answers, all rounds of a rate:\n\n| rate | failed | kinds | one of them |\n|---|---|---|---|\n")
	for _, rate := range h.cfg.peers.rates {
		kinds := map[string]int{}
		sample, failed := "", 0
		for _, r := range h.cell("json", rate, viaContextForge) {
			failed += r.Requests - r.OK
			for k, n := range r.Errors {
				kinds[k] += n
			}
			if sample == "" {
				sample = r.Sample
			}
		}
		var ks []string
		for k, n := range kinds {
			ks = append(ks, fmt.Sprintf("%s × %d", k, n))
		}
		w("| %d | %d | %s | %s |\n", rate, failed, orDash(strings.Join(ks, ", ")), orDash(mdEscape(sample, 160)))
	}
	w("\n")
}

// writePeerSweep writes ContextForge's runs alone at -peer-sweep's rates.
func (h *harness) writePeerSweep(w writer) {
	rs := h.peersRes.sweep
	if len(rs) == 0 {
		return
	}
	w("## Where ContextForge saturates\n\n")
	w("ContextForge alone, one run per rate (the other targets idle), as in the rounds: max(%s, %d requests), `-timeout %s`.\n\n", h.cfg.peers.duration, h.cfg.peers.minRequests, h.cfg.peers.timeout)
	w("| rate | verified | success | answered req/s | p50 ms | p99 ms | CPU ms/req | upstream inits/req | foreign %% |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rs {
		w("| %d | %d/%d | %.1f %% | %.1f | %.3f | %.3f | %.3f | %.3f | %.0f |\n", r.Rate, r.OK, r.Requests, 100*float64(r.OK)/float64(r.Requests),
			r.Throughput, msOf(r.P50), msOf(r.P99), r.CPUus/1e3, r.UpInits, r.ForeignPct)
	}
	w("\n")
}

func orDash(s string) string {
	if s == "" {
		return "–"
	}
	return s
}

// mdEscape shortens s to n bytes for a table cell and escapes its pipes.
func mdEscape(s string, n int) string {
	if len(s) > n {
		s = s[:n] + "…"
	}
	s = strings.ReplaceAll(s, "\n", " ")
	return strings.ReplaceAll(s, "|", "\\|")
}
