package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"
)

// harness holds one benchmark run: its tools, its results, and the
// correctness failures that fail it.
type harness struct {
	cfg    config
	root   string // repository root
	dir    string // work directory
	self   string // this binary, re-run as upstream and proxy
	vegeta string
	nginx  string // "" when nginx is not used
	// image is the environment the shipped image gives mcpheal (the
	// Dockerfile's ENV, image.go): every mcpheal process starts with it.
	image []string
	note  []string
	ids   atomic.Uint64 // JSON-RPC ids handed out

	runs      []*runResult
	heals     []*healResult
	storms    []*stormResult
	memory    *memResult
	large     []*largeResult
	largeSecs []*largeSection
	hostile   []*hostilePass
	// hostileSlowBytes is the answer the slow agents ask for; hostileElapsed
	// the section's length.
	hostileSlowBytes int
	slowCollector    *slowCollector // the OTLP endpoint of the tracing attack (hostile_pressure.go)
	hostileElapsed   time.Duration
	gobench          []benchLine
	storeBench       []benchLine // BenchmarkSessionStore, -count 5
	profile          *profileResult
	traceTotals      []*traceTotal // mcpheal-traced's whole life, per variant
	peersRes         peersState    // the peers leg (peers.go)
	failed           []string      // correctness failures
	started          time.Time
}

func newHarness(ctx context.Context, cfg config) (*harness, error) {
	h := &harness{cfg: cfg, started: time.Now()}
	if cfg.nice < 0 && os.Geteuid() != 0 {
		h.note = append(h.note, "not root: processes run at the default priority (-nice ignored).")
		cfg.nice = 0
	}
	niceLevel = cfg.nice
	nginxBufferKB = cfg.nginxBufKB
	if cfg.nginxBufKB > 0 {
		h.note = append(h.note, fmt.Sprintf("nginx ran with proxy_buffer_size %dk and proxy_buffers 4 %dk (-nginx-buffer-kb), not its default of one page.", cfg.nginxBufKB, cfg.nginxBufKB))
	}
	var err error
	if h.root, err = repoRoot(); err != nil {
		return nil, err
	}
	if h.self, err = os.Executable(); err != nil {
		return nil, err
	}
	if h.image, err = readImageEnv(h.root); err != nil {
		return nil, err
	}
	// Tracing is on only where the harness turns it on (mcpheal-traced):
	// OTEL_* variables of the harness's own environment would reach every
	// process it starts, and turn it on in mcpheal too.
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "OTEL_") {
			_ = os.Unsetenv(k)
			h.note = append(h.note, fmt.Sprintf("%s was set in the harness's environment: unset for every process it starts.", k))
		}
	}
	h.dir = cfg.dir
	if h.dir == "" {
		if h.dir, err = os.MkdirTemp("", "mcpbench-"); err != nil {
			return nil, err
		}
	} else if err := os.MkdirAll(h.dir, 0o755); err != nil {
		return nil, err
	}
	h.logf("work directory %s", h.dir)
	h.logf("mcpheal runs as the image does, with the Dockerfile's environment: %s", strings.Join(h.image, " "))
	if h.vegeta = cfg.vegeta; h.vegeta == "" && cfg.only == "" { // the sections that run alone need no vegeta
		h.vegeta = filepath.Join(h.dir, "vegeta")
		h.logf("building the pinned vegeta (bench/tools/go.mod)")
		cmd := exec.CommandContext(ctx, "go", "build", "-o", h.vegeta, "github.com/tsenart/vegeta/v12")
		cmd.Dir = filepath.Join(h.root, "bench", "tools")
		if out, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("build vegeta: %v\n%s", err, out)
		}
	}
	switch cfg.nginx {
	case "off":
		h.note = append(h.note, "nginx was switched off (-nginx=off).")
	case "auto":
		if h.nginx = findNginx(); h.nginx == "" {
			h.note = append(h.note, "nginx is not installed: its target is skipped.")
		}
	default:
		h.nginx = cfg.nginx
	}
	for _, n := range h.note {
		h.logf("note: %s", n)
	}
	return h, nil
}

// repoRoot finds the directory of the root go.mod (module
// github.com/mcpheal/mcpheal) from the working directory up.
func repoRoot() (string, error) {
	d, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		b, err := os.ReadFile(filepath.Join(d, "go.mod"))
		if err == nil && strings.HasPrefix(string(b), "module github.com/mcpheal/mcpheal\n") {
			return d, nil
		}
		parent := filepath.Dir(d)
		if parent == d {
			return "", fmt.Errorf("run mcpbench inside the mcpheal repository")
		}
		d = parent
	}
}

func (h *harness) logf(format string, args ...any) {
	fmt.Printf("[%6.1fs] %s\n", time.Since(h.started).Seconds(), fmt.Sprintf(format, args...))
}

// fail records a correctness failure: the run exits 1.
func (h *harness) fail(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	h.failed = append(h.failed, msg)
	h.logf("FAIL: %s", msg)
}

// run does every part of the benchmark that the configuration asks for.
func (h *harness) run(ctx context.Context) error {
	if h.cfg.only == onlyPeers {
		return h.peersRun(ctx)
	}
	for _, v := range h.cfg.variants {
		if err := h.runVariant(ctx, v); err != nil {
			return fmt.Errorf("variant %s: %w", v, err)
		}
	}
	for _, size := range h.cfg.largeSizeBytes() {
		if err := h.largeRun(ctx, size); err != nil {
			return fmt.Errorf("large SSE event: %w", err)
		}
	}
	if len(h.cfg.hostileBudgets) > 0 {
		if err := h.hostileRun(ctx); err != nil {
			return fmt.Errorf("hostile input: %w", err)
		}
	}
	if h.cfg.memSessions > 0 {
		m, err := h.memoryRun(ctx)
		if err != nil {
			return fmt.Errorf("memory run: %w", err)
		}
		h.memory = m
	}
	if h.cfg.goBench {
		if err := h.runGoBench(ctx); err != nil {
			return fmt.Errorf("go micro-benchmarks: %w", err)
		}
	}
	return nil
}

// runVariant measures one upstream variant. The heal run and the storm come
// last, in that order: they end the upstream sessions that the other targets
// hold, and the heal run must start on a live session.
func (h *harness) runVariant(ctx context.Context, variant string) error {
	e, err := h.startEnv(ctx, variant)
	if err != nil {
		return err
	}
	defer e.stop()
	if err := h.openModel(ctx, e); err != nil {
		return err
	}
	if h.cfg.satDuration > 0 {
		if err := h.closedModel(ctx, e); err != nil {
			return err
		}
	}
	if h.cfg.profile && variant == "json" {
		p, err := h.profileRun(ctx, e)
		if err != nil {
			return fmt.Errorf("profile: %w", err)
		}
		h.profile = p
	}
	if h.cfg.healRate > 0 {
		for _, name := range h.buildNames() {
			r, err := h.healRun(ctx, e, name)
			if err != nil {
				return fmt.Errorf("heal under load (%s): %w", name, err)
			}
			h.heals = append(h.heals, r)
		}
	}
	if h.cfg.storm > 0 {
		s, err := h.stormRun(ctx, e)
		if err != nil {
			return fmt.Errorf("expiry storm: %w", err)
		}
		h.storms = append(h.storms, s)
	}
	if e.traced != nil {
		tt, err := h.stopTraced(ctx, e)
		if err != nil {
			return fmt.Errorf("%s: %w", tracedProxy, err)
		}
		h.traceTotals = append(h.traceTotals, tt)
	}
	return nil
}

// close leaves the work directory for inspection in a full run.
func (h *harness) close() {
	if h.cfg.smoke && h.cfg.dir == "" && len(h.failed) == 0 {
		_ = os.RemoveAll(h.dir)
	}
}
