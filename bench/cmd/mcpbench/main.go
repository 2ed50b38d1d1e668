// Command mcpbench measures mcpheal against a direct connection and nginx in
// one run, all on 127.0.0.1 (mcpheal as the image runs it and, beside it in
// the open and closed models, the same process with Go's default scheduler,
// as the bare binary runs, and the same with OpenTelemetry tracing on,
// every request sampled and exported to a span-counting OTLP sink: env.go,
// tracing.go): a Go SDK echo upstream (JSON and SSE
// answers), vegeta open-model runs at fixed rates alternating the targets, a
// closed-model saturation run, heal under load, an expiry storm, one large
// SSE event (1 and 12 MB) relayed by each target, hostile input against
// the mcpheal binary (hostile.go), memory per idle session, the Go
// micro-benchmarks and a CPU and allocation profile.
// It writes bench/RESULTS.md and a latency plot, and prints PASS or MISS for
// every performance target docs/performance.md states.
//
//	bench/run.sh            # the full run (~30 min); installs nginx and vegeta
//	bench/run.sh --smoke    # CI: 2 s per target, one rate, correctness only
//	bench/run.sh -only large  # the large-SSE-event section alone (~1 min)
//	bench/run.sh -only hostile  # the hostile-input section alone (~4 min)
//	bench/run.sh -peers     # IBM ContextForge beside nginx and mcpheal (~25 min)
//
// The same binary is its own upstream and proxy processes (subcommands
// "upstream" and "proxy"), and the OTLP collector mcpheal-traced exports
// its spans to ("otlp-sink"), so that each has its own CPU and memory
// figures.
// "nginx-conf", "targets" and "image-env" give bench/syscalls.sh the
// harness's nginx configuration, its session and vegeta targets, and the
// environment mcpheal runs with (the Dockerfile's, image.go).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func main() {
	var err error
	switch {
	case len(os.Args) > 1 && os.Args[1] == "upstream":
		err = runUpstream(os.Args[2:])
	case len(os.Args) > 1 && os.Args[1] == "proxy":
		err = runProxy(os.Args[2:])
	case len(os.Args) > 1 && os.Args[1] == "otlp-sink":
		err = runOTLPSink(os.Args[2:])
	case len(os.Args) > 1 && os.Args[1] == "nginx-conf":
		err = runNginxConf(os.Args[2:])
	case len(os.Args) > 1 && os.Args[1] == "targets":
		err = runTargets(os.Args[2:])
	case len(os.Args) > 1 && os.Args[1] == "image-env":
		err = runImageEnv(os.Args[2:])
	default:
		var code int
		code, err = runHarness(os.Args[1:])
		if err == nil {
			os.Exit(code)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "mcpbench:", err)
		os.Exit(2)
	}
}

// config is what one harness run does; zero-cost defaults are the full run.
type config struct {
	smoke        bool
	variants     []string
	rates        []int
	rounds       int
	duration     time.Duration
	warmup       time.Duration
	satDuration  time.Duration // 0 skips the saturation run
	satRounds    int
	satWorkers   int
	stealMax     float64 // percent; a run above it is repeated
	foreignMax   float64 // percent of machine CPU used by others; a run above it is repeated
	nice         int
	proxyEnv     []string // extra environment of the mcpheal processes, after the image's (experiments)
	alt          string   // a second mcpbench binary whose proxy is measured as mcpheal-alt ("self": this one)
	altEnv       []string // extra environment of the alt proxy, after the image's and proxyEnv
	bare         bool     // measure mcpheal-bare beside mcpheal in the open and closed models
	tracing      bool     // measure mcpheal-traced beside mcpheal in the open and closed models
	healRate     int      // 0 skips heal under load
	healFor      time.Duration
	healAt       time.Duration
	healDown     time.Duration
	storm        int // sessions; 0 skips the expiry storm
	memSessions  int // 0 skips the memory run
	goBench      bool
	profile      bool
	largeSizes   []int // MiB of the large-SSE-event section; none skips it
	largeRounds  int
	largeCalls   int    // calls per target per round, at least
	largeRoundMB int    // and at least this many MiB of answers per target per round
	only         string // "large" or "hostile": only that section
	// hostileBudgets are the hostile-input passes: mcpheal's --memory-budget
	// in MiB, 0 for its default; none skips the section.
	hostileBudgets []int
	hostileSlowMiB int           // the slow agents' answer; 0: 2 MiB or more, past the socket buffers
	hostileAttacks []string      // only these attacks (hostileAttackIDs); none: all
	hostileLinger  time.Duration // watch RSS this much longer after each attack; 0: not at all
	mcphealBin     string        // the mcpheal binary of the hostile-input section; "": built from the tree
	out            string        // RESULTS.md; "" writes none
	plot           string
	vegeta         string
	nginx          string // "auto", "off" or a path
	nginxBufKB     int    // proxy_buffer_size in KiB; 0: nginx\'s default (one page)
	dir            string
	timeout        time.Duration
	peers          peersConfig // -only peers: ContextForge beside nginx and mcpheal (peers.go)
}

func parseFlags(args []string) (config, error) {
	var c config
	var variants, rates, proxyEnv, altEnv, largeSizes, hostile, hostileAttacks string
	fs := flag.NewFlagSet("mcpbench", flag.ContinueOnError)
	fs.BoolVar(&c.smoke, "smoke", false, "CI mode: one round of 2 s per target at one rate, short heal and storm, correctness only")
	fs.StringVar(&variants, "variants", "json,sse", "upstream answer variants")
	fs.StringVar(&rates, "rates", "1000,2000,3000", "open-model rates, requests per second")
	fs.IntVar(&c.rounds, "rounds", 5, "rounds per rate (target order rotates each round)")
	fs.DurationVar(&c.duration, "duration", 10*time.Second, "length of one open-model run")
	fs.DurationVar(&c.warmup, "warmup", 3*time.Second, "warm-up per target before measuring")
	fs.DurationVar(&c.satDuration, "sat-duration", 10*time.Second, "length of one closed-model run (0 skips)")
	fs.IntVar(&c.satRounds, "sat-rounds", 3, "closed-model rounds")
	fs.IntVar(&c.satWorkers, "sat-workers", 32, "closed-model concurrent workers")
	fs.Float64Var(&c.stealMax, "steal-max", 5, "repeat a round with a run above this hypervisor steal, percent")
	fs.Float64Var(&c.foreignMax, "foreign-max", 30, "repeat a round with a run where other processes used more of the machine's CPU, percent")
	fs.IntVar(&c.nice, "nice", -10, "nice value of every process started (0: inherit); negative needs root")
	fs.StringVar(&c.alt, "alt", "", "another mcpbench binary (built from a patched tree), or \"self\" for this one with -alt-env: its proxy is measured beside mcpheal as "+altProxy)
	fs.StringVar(&altEnv, "alt-env", "", "comma-separated KEY=VALUE added to the -alt proxy's environment after mcpheal's (the image's, then -proxy-env), e.g. GOMAXPROCS=1, or MCPBENCH_PROXY=passthrough for a bare fasthttp relay")
	fs.BoolVar(&c.bare, "bare", true, "also measure "+bareProxy+": the same mcpheal without schedtrace in GODEBUG (Go's default scheduler, as the bare binary runs), in the open and closed models")
	fs.BoolVar(&c.tracing, "tracing", true, "also measure "+tracedProxy+": the same mcpheal with OpenTelemetry tracing on, every request sampled (OTEL_TRACES_SAMPLER=always_on), exporting OTLP/HTTP to a span-counting sink on 127.0.0.1, in the open and closed models")
	fs.StringVar(&proxyEnv, "proxy-env", "", "comma-separated KEY=VALUE added to mcpheal's environment after the image's (the Dockerfile's ENV), e.g. GOMAXPROCS=1")
	fs.IntVar(&c.healRate, "heal-rate", 300, "heal-under-load rate (0 skips)")
	fs.DurationVar(&c.healFor, "heal-duration", 10*time.Second, "heal-under-load length")
	fs.DurationVar(&c.healAt, "heal-at", 4*time.Second, "when the upstream is restarted")
	fs.DurationVar(&c.healDown, "heal-down", 500*time.Millisecond, "how long the upstream stays down")
	fs.IntVar(&c.storm, "storm", 1000, "expiry-storm sessions (0 skips)")
	fs.IntVar(&c.memSessions, "mem-sessions", 100_000, "idle sessions for the memory run (0 skips)")
	fs.BoolVar(&c.goBench, "gobench", true, "run the Go micro-benchmarks")
	fs.BoolVar(&c.profile, "profile", true, "take pprof CPU and alloc profiles of mcpheal at 2000 req/s")
	fs.StringVar(&largeSizes, "large-sizes", "1,12", "large-SSE-event section: sizes of the one event's text, MiB (\"\" skips the section)")
	fs.IntVar(&c.largeRounds, "large-rounds", 7, "large-SSE-event rounds (target order rotates each round)")
	fs.IntVar(&c.largeCalls, "large-calls", 20, "large-SSE-event calls per target per round, at least")
	fs.IntVar(&c.largeRoundMB, "large-round-mb", 240, "large-SSE-event: at least this many MiB of answers per target per round (the relay's CPU is read in 10 ms ticks)")
	fs.StringVar(&hostile, "hostile", "0,64", "hostile-input section: one pass per mcpheal --memory-budget, MiB, 0 for its default (\"\" skips the section)")
	fs.IntVar(&c.hostileSlowMiB, "hostile-slow-mib", 0, "hostile input: MiB of the answer slow agents ask for (0: 2 MiB, or twice tcp_wmem's maximum if larger)")
	fs.StringVar(&hostileAttacks, "hostile-attacks", "", "hostile input: only these attacks, comma-separated, of "+strings.Join(hostileAttackIDs, ","))
	fs.DurationVar(&c.hostileLinger, "hostile-linger", 0, "hostile input: after each attack, watch mcpheal's RSS this much longer (at most 5m; Go's forced GC runs every 2 min)")
	fs.StringVar(&c.mcphealBin, "mcpheal", "", "mcpheal binary for the hostile-input section (default: go build from the repository root)")
	fs.StringVar(&c.only, "only", "", "run only one section: \"large\" (the large SSE event) or \"hostile\" (hostile input), which write no results file or plot unless -out/-plot are given; or \"peers\" (ContextForge beside nginx and mcpheal, -peer-* flags), which writes bench/RESULTS-peers.md unless -out is given")
	fs.StringVar(&c.out, "out", "bench/RESULTS.md", "results file (\"\" writes none)")
	fs.StringVar(&c.plot, "plot", "bench/latency.svg", "latency plot (SVG)")
	fs.StringVar(&c.vegeta, "vegeta", "", "vegeta binary (default: build bench/tools' pinned vegeta)")
	fs.StringVar(&c.nginx, "nginx", "auto", "nginx binary, auto (use it if installed) or off")
	fs.IntVar(&c.nginxBufKB, "nginx-buffer-kb", 0, "nginx proxy_buffer_size in KiB (proxy_buffers 4 of it); 0 keeps nginx's default of one page (an experiment: it changes how nginx relays large answers)")
	fs.StringVar(&c.dir, "dir", "", "work directory for logs and results (default: a temp dir)")
	fs.DurationVar(&c.timeout, "timeout", 45*time.Minute, "stop everything after this long")
	peerRates := c.peers.flags(fs)
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if err := c.peers.parseRates(*peerRates); err != nil {
		return c, err
	}
	c.variants = strings.Split(variants, ",")
	for _, m := range strings.Split(largeSizes, ",") {
		if m = strings.TrimSpace(m); m == "" {
			continue
		}
		n, err := strconv.Atoi(m)
		if err != nil || n <= 0 {
			return c, fmt.Errorf("-large-sizes: %q is not a positive number of MiB", m)
		}
		c.largeSizes = append(c.largeSizes, n)
	}
	for _, m := range strings.Split(hostile, ",") {
		if m = strings.TrimSpace(m); m == "" {
			continue
		}
		n, err := strconv.Atoi(m)
		if err != nil || n < 0 {
			return c, fmt.Errorf("-hostile: %q is not a number of MiB (0: mcpheal's default budget)", m)
		}
		c.hostileBudgets = append(c.hostileBudgets, n)
	}
	c.hostileLinger = min(max(c.hostileLinger, 0), 5*time.Minute)
	for _, a := range strings.Split(hostileAttacks, ",") {
		if a = strings.TrimSpace(a); a == "" {
			continue
		}
		if !slices.Contains(hostileAttackIDs, a) {
			return c, fmt.Errorf("-hostile-attacks: no attack %q (have %s)", a, strings.Join(hostileAttackIDs, ", "))
		}
		c.hostileAttacks = append(c.hostileAttacks, a)
	}
	if proxyEnv != "" {
		c.proxyEnv = strings.Split(proxyEnv, ",")
	}
	if altEnv != "" {
		c.altEnv = strings.Split(altEnv, ",")
	}
	for _, r := range strings.Split(rates, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(r))
		if err != nil || n <= 0 {
			return c, fmt.Errorf("-rates: %q is not a positive rate", r)
		}
		c.rates = append(c.rates, n)
	}
	if c.smoke {
		c.smokeDefaults(fs)
	}
	switch c.only {
	case "":
	case "large":
		c.onlyLarge(fs)
	case "hostile":
		c.onlyHostile(fs)
	case onlyPeers:
		if err := c.onlyPeersLeg(fs); err != nil {
			return c, err
		}
	default:
		return c, fmt.Errorf("-only %q: the sections that run alone are \"large\", \"hostile\" and \"peers\"", c.only)
	}
	return c, nil
}

// onlyLarge switches every other section off. The results file and the
// plot are written only when asked for explicitly, so that a partial run
// does not replace bench/RESULTS.md.
func (c *config) onlyLarge(fs *flag.FlagSet) {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	c.variants, c.satDuration, c.healRate, c.storm, c.memSessions = nil, 0, 0, 0, 0
	c.goBench, c.profile, c.hostileBudgets, c.bare, c.tracing = false, false, nil, false, false
	c.partialOutput(set)
	if len(c.largeSizes) == 0 {
		c.largeSizes = []int{1, 12}
	}
}

// onlyHostile switches every other section off, as onlyLarge does.
func (c *config) onlyHostile(fs *flag.FlagSet) {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	c.variants, c.satDuration, c.healRate, c.storm, c.memSessions = nil, 0, 0, 0, 0
	c.goBench, c.profile, c.largeSizes, c.bare, c.tracing = false, false, nil, false, false
	c.partialOutput(set)
	if len(c.hostileBudgets) == 0 {
		c.hostileBudgets = []int{0, 64}
	}
}

// partialOutput keeps a partial run from replacing bench/RESULTS.md and
// the plot unless -out or -plot was given.
func (c *config) partialOutput(set map[string]bool) {
	if !set["out"] {
		c.out = ""
	}
	if !set["plot"] {
		c.plot = ""
	}
}

// smokeDefaults shrinks the run to what CI needs to prove the harness works,
// unless a flag was given explicitly.
func (c *config) smokeDefaults(fs *flag.FlagSet) {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	def := func(name string, apply func()) {
		if !set[name] {
			apply()
		}
	}
	def("rates", func() { c.rates = []int{300} })
	def("rounds", func() { c.rounds = 1 })
	def("duration", func() { c.duration = 2 * time.Second })
	def("warmup", func() { c.warmup = 500 * time.Millisecond })
	def("sat-duration", func() { c.satDuration = 0 })
	def("heal-rate", func() { c.healRate = 200 })
	def("heal-duration", func() { c.healFor = 3 * time.Second })
	def("heal-at", func() { c.healAt = time.Second })
	def("storm", func() { c.storm = 100 })
	def("mem-sessions", func() { c.memSessions = 0 })
	def("gobench", func() { c.goBench = false })
	def("profile", func() { c.profile = false })
	def("large-sizes", func() { c.largeSizes = []int{1} })
	def("large-rounds", func() { c.largeRounds = 1 })
	def("large-round-mb", func() { c.largeRoundMB = 0 })
	def("hostile", func() { c.hostileBudgets = nil }) // ~4 min: too long for CI
	def("out", func() { c.out = "" })
	def("plot", func() { c.plot = "" })
	def("steal-max", func() { c.stealMax = 101 })
	def("foreign-max", func() { c.foreignMax = 101 })
	def("nice", func() { c.nice = 0 })
	def("timeout", func() { c.timeout = 5 * time.Minute })
}

// runHarness runs the benchmark and returns the exit code: 0, or 1 when a
// correctness check failed (a lost or wrong answer, a second initialize).
func runHarness(args []string) (int, error) {
	cfg, err := parseFlags(args)
	if err != nil {
		return 0, err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, cfg.timeout)
	defer cancel()
	h, err := newHarness(ctx, cfg)
	if err != nil {
		return 0, err
	}
	defer h.close()
	if err := h.run(ctx); err != nil {
		return 0, err
	}
	return h.finish()
}
