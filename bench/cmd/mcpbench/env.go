package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/mcpheal/mcpheal/bench"
)

// Target names, in the order of the first round.
const (
	direct   = "direct"
	viaNginx = "nginx"
	mcpheal  = "mcpheal" // as the image runs it: with the Dockerfile's environment
	// bareProxy is the same mcpheal process as the bare binary runs it
	// without the image's GODEBUG: Go's default scheduler, its sysmon
	// parking when idle (docs/deployment.md "Keeping the runtime's sysmon awake"). It is
	// measured beside mcpheal in the open and closed models (-bare).
	bareProxy = "mcpheal-bare"
	// altProxy is a second mcpheal build (-alt), measured beside the first
	// in the same rounds to record a fix's before and after.
	altProxy = "mcpheal-alt"
	// tracedProxy is mcpheal as the image runs it with OpenTelemetry
	// tracing on and every request sampled (always_on, the worst case),
	// exporting OTLP/HTTP to the harness's sink (otlpsink.go). It is
	// measured beside mcpheal in the open and closed models (-tracing).
	tracedProxy = "mcpheal-traced"
)

// targetNames lists the targets of the tables, in order.
func (h *harness) targetNames() []string {
	names := []string{direct, viaNginx, mcpheal}
	if h.cfg.bare {
		names = append(names, bareProxy)
	}
	if h.cfg.tracing {
		names = append(names, tracedProxy)
	}
	if h.cfg.alt != "" {
		names = append(names, altProxy)
	}
	return names
}

// buildNames lists the mcpheal builds under test, mcpheal and mcpheal-alt
// if any: the targets of the verdicts, the heal runs and the large-event
// section. mcpheal-bare and mcpheal-traced are the same build as mcpheal,
// only compared with it.
func (h *harness) buildNames() []string {
	if h.cfg.alt != "" {
		return []string{mcpheal, altProxy}
	}
	return []string{mcpheal}
}

// isMcpheal reports whether target t is a mcpheal process, with its /stats
// and its read and write system calls counted.
func isMcpheal(t string) bool {
	return t == mcpheal || t == bareProxy || t == tracedProxy || t == altProxy
}

// target returns the target named name.
func (e *env) target(name string) *target {
	for _, t := range e.targets {
		if t.name == name {
			return t
		}
	}
	panic("no target " + name) // a harness bug: mcpheal is always there
}

// target is one way to reach the upstream, with one initialized session.
type target struct {
	name  string
	sess  bench.Session
	pids  func() []int // the proxy's processes; nil for direct
	stats string       // mcpheal's /stats URL; "" otherwise
	// tree: the proxy's CPU is that of pids()[0]'s whole process tree
	// (tree.go), walked at every sample.
	tree bool
	// peer: a gateway measured beside mcpheal in the peers leg (peers.go).
	// Its failed answers are figures, not correctness failures, and a run's
	// second sample waits until the work it queued is done.
	peer bool
	// cg, when not nil, counts the proxy's CPU in nanoseconds (tree.go).
	cg *cpuGroup
}

// env is one upstream variant with the proxies in front of it.
type env struct {
	variant  string
	dir      string
	upAddr   string
	up       *child
	nginx    *nginxProc
	proxy    *child
	bare     *child // mcpheal-bare, in the open and closed models only
	traced   *child // mcpheal-traced, in the open and closed models only
	sink     *child // mcpheal-traced's OTLP collector (otlpsink.go)
	sinkURL  string
	alt      *child
	statsURL string
	targets  []*target
	hc       *http.Client
}

// freeAddr returns a loopback address with a port that was free just now.
func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// startEnv starts the upstream, nginx (if used) and mcpheal for variant, and
// opens one session on each target.
func (h *harness) startEnv(ctx context.Context, variant string) (*env, error) {
	e := &env{variant: variant, dir: filepath.Join(h.dir, variant), hc: &http.Client{Timeout: 30 * time.Second}}
	if err := os.MkdirAll(e.dir, 0o755); err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			e.stop()
		}
	}()
	var err error
	if e.upAddr, err = freeAddr(); err != nil {
		return nil, err
	}
	if err := h.startUpstream(ctx, e); err != nil {
		return nil, err
	}
	upURL := "http://" + e.upAddr + "/mcp"
	e.targets = append(e.targets, &target{name: direct})
	if h.nginx != "" {
		addr, err := freeAddr()
		if err != nil {
			return nil, err
		}
		if e.nginx, err = startNginx(ctx, h.nginx, filepath.Join(e.dir, "nginx"), e.upAddr, addr); err != nil {
			return nil, err
		}
		e.targets = append(e.targets, &target{name: viaNginx, sess: bench.Session{URL: "http://" + addr + "/mcp"},
			pids: func() []int { return e.nginx.pids }})
	}
	proxyURL, statsURL, p, err := h.startProxy(ctx, e.dir, upURL)
	if err != nil {
		return nil, err
	}
	e.proxy, e.statsURL = p, statsURL
	e.targets = append(e.targets, &target{name: mcpheal, sess: bench.Session{URL: proxyURL},
		pids: func() []int { return []int{e.proxy.pid()} }, stats: statsURL})
	godebug := fmt.Sprintf("%s %q", mcpheal, godebugOf(e.proxy.pid()))
	if h.cfg.bare {
		bareURL, bareStats, bp, err := h.startProxyBin(ctx, h.self, filepath.Join(e.dir, "bare"), upURL, h.bareEnv())
		if err != nil {
			return nil, err
		}
		e.bare = bp
		e.targets = append(e.targets, &target{name: bareProxy, sess: bench.Session{URL: bareURL},
			pids: func() []int { return []int{e.bare.pid()} }, stats: bareStats})
		godebug += fmt.Sprintf(", %s %q", bareProxy, godebugOf(e.bare.pid()))
	}
	if h.cfg.tracing {
		if err := h.startTraced(ctx, e, upURL); err != nil {
			return nil, err
		}
	}
	if h.cfg.alt != "" {
		altURL, altStats, ap, err := h.startProxyBin(ctx, h.altBin(), filepath.Join(e.dir, "alt"), upURL, h.altEnv())
		if err != nil {
			return nil, err
		}
		e.alt = ap
		e.targets = append(e.targets, &target{name: altProxy, sess: bench.Session{URL: altURL},
			pids: func() []int { return []int{e.alt.pid()} }, stats: altStats})
		godebug += fmt.Sprintf(", %s %q", altProxy, godebugOf(e.alt.pid()))
	}
	e.targets[0].sess.URL = upURL
	for _, t := range e.targets {
		if t.sess, err = bench.Initialize(ctx, e.hc, t.sess.URL, true); err != nil {
			return nil, fmt.Errorf("session via %s: %w", t.name, err)
		}
	}
	h.logf("%s: upstream %s, targets %d, sessions open; GODEBUG of %s", variant, e.upAddr, len(e.targets), godebug)
	ok = true
	return e, nil
}

// startTraced starts the OTLP sink and mcpheal-traced in front of upURL,
// exporting to it, and adds mcpheal-traced to e's targets.
func (h *harness) startTraced(ctx context.Context, e *env, upURL string) error {
	addr, err := freeAddr()
	if err != nil {
		return err
	}
	if e.sink, err = startChild(ctx, "otlp-sink", filepath.Join(e.dir, "otlp-sink.log"), true, helperEnv,
		h.self, "otlp-sink", "-listen", addr); err != nil {
		return err
	}
	e.sinkURL = "http://" + addr
	url, stats, p, err := h.startProxyBin(ctx, h.self, filepath.Join(e.dir, "traced"), upURL, h.tracedEnv(e.sinkURL))
	if err != nil {
		return err
	}
	e.traced = p
	e.targets = append(e.targets, &target{name: tracedProxy, sess: bench.Session{URL: url},
		pids: func() []int { return []int{e.traced.pid()} }, stats: stats})
	return nil
}

// startUpstream starts the upstream child for e's variant on e.upAddr.
func (h *harness) startUpstream(ctx context.Context, e *env) error {
	up, err := startChild(ctx, "upstream", filepath.Join(e.dir, "upstream.log"), true, helperEnv,
		h.self, "upstream", "-listen", e.upAddr, "-mode", e.variant)
	if err != nil {
		return err
	}
	e.up = up
	return nil
}

// startProxy starts a mcpheal child in front of upURL and returns its MCP
// URL and its /stats URL. extra are more flags for the child.
func (h *harness) startProxy(ctx context.Context, dir, upURL string, extra ...string) (string, string, *child, error) {
	return h.startProxyBin(ctx, h.self, dir, upURL, h.proxyEnv(), extra...)
}

// startProxyBin is startProxy with the proxy subcommand of another mcpbench
// binary.
func (h *harness) startProxyBin(ctx context.Context, bin, dir, upURL string, env []string, extra ...string) (string, string, *child, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", "", nil, err
	}
	listen, err := freeAddr()
	if err != nil {
		return "", "", nil, err
	}
	stats, err := freeAddr()
	if err != nil {
		return "", "", nil, err
	}
	argv := append([]string{bin, "proxy", "-upstream", upURL, "-listen", listen, "-stats", stats}, extra...)
	p, err := startChild(ctx, "mcpheal", filepath.Join(dir, "mcpheal.log"), true, env, argv...)
	if err != nil {
		return "", "", nil, err
	}
	return "http://" + listen + "/mcp", "http://" + stats, p, nil
}

// restartUpstream stops the upstream gracefully (SIGTERM), keeps it down
// for down after it exited, and starts it again on the same address. It
// returns when the stop began and when the new process was listening.
func (h *harness) restartUpstream(ctx context.Context, e *env, down time.Duration) (stopped, ready time.Time, err error) {
	stopped = time.Now()
	e.up.stop(5 * time.Second)
	t := time.NewTimer(down) // the outage itself is what is being simulated
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		return stopped, ready, ctx.Err()
	}
	if err := h.startUpstream(ctx, e); err != nil {
		return stopped, ready, err
	}
	return stopped, time.Now(), nil
}

func (e *env) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, t := range e.targets {
		if t.sess.ID != "" {
			t.sess.Delete(ctx, e.hc)
		}
	}
	if e.proxy != nil {
		e.proxy.stop(5 * time.Second)
	}
	if e.bare != nil {
		e.bare.stop(5 * time.Second)
	}
	if e.traced != nil {
		e.traced.stop(10 * time.Second) // it flushes its last spans to the sink
	}
	if e.sink != nil {
		e.sink.stop(5 * time.Second)
	}
	if e.alt != nil {
		e.alt.stop(5 * time.Second)
	}
	if e.nginx != nil {
		e.nginx.stop()
	}
	if e.up != nil {
		e.up.stop(5 * time.Second)
	}
}

// getJSON fetches url into v.
func getJSON(ctx context.Context, hc *http.Client, method, url string, v any) error {
	req, err := http.NewRequestWithContext(ctx, method, url, nil)
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s %s: status %d", method, url, resp.StatusCode)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// proxyStatsOf reads a mcpheal child's counters.
func (e *env) proxyStatsOf(ctx context.Context, statsURL string) (proxyStats, error) {
	var s proxyStats
	err := getJSON(ctx, e.hc, http.MethodGet, statsURL+"/stats", &s)
	return s, err
}

// upstreamStatsOf reads the upstream child's counters.
func (e *env) upstreamStatsOf(ctx context.Context) (upstreamStats, error) {
	var s upstreamStats
	err := getJSON(ctx, e.hc, http.MethodGet, "http://"+e.upAddr+"/admin/stats", &s)
	return s, err
}

// altBin is the binary whose "proxy" subcommand is measured as mcpheal-alt.
func (h *harness) altBin() string {
	if h.cfg.alt == "self" {
		return h.self
	}
	return h.cfg.alt
}

// proxyEnv is mcpheal's extra environment: the image's (the Dockerfile's
// ENV), then -proxy-env, whose values win (os/exec keeps the last value of
// a key).
func (h *harness) proxyEnv() []string {
	return append(slices.Clip(h.image), h.cfg.proxyEnv...)
}

// altEnv is the alt proxy's extra environment: mcpheal's, then -alt-env,
// whose values win.
func (h *harness) altEnv() []string {
	return append(h.proxyEnv(), h.cfg.altEnv...)
}

// tracingVars turn tracing on in mcpheal the standard way, every request
// sampled, exporting OTLP/HTTP (protobuf) to the sink at sinkURL; the
// batch processor, the exporter's timeout and its compression (none) are
// the SDK's defaults, as an operator who sets only these gets them.
func tracingVars(sinkURL string) []string {
	return []string{
		"OTEL_EXPORTER_OTLP_ENDPOINT=" + sinkURL,
		"OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf",
		"OTEL_TRACES_SAMPLER=always_on",
		"OTEL_SERVICE_NAME=mcpheal",
	}
}

// tracedEnv is mcpheal-traced's extra environment: mcpheal's, then
// tracingVars.
func (h *harness) tracedEnv(sinkURL string) []string {
	return append(h.proxyEnv(), tracingVars(sinkURL)...)
}

// bareEnv is mcpheal-bare's extra environment: mcpheal's, then
// bareGODEBUG.
func (h *harness) bareEnv() []string {
	return append(h.proxyEnv(), h.bareGODEBUG())
}

// bareGODEBUG is the GODEBUG entry of mcpheal-bare: mcpheal's GODEBUG
// without schedtrace.
func (h *harness) bareGODEBUG() string {
	return "GODEBUG=" + withoutSchedtrace(append(os.Environ(), h.proxyEnv()...))
}

// withoutSchedtrace returns the GODEBUG that a process started with env
// would get (os/exec keeps the last value of a key) with every schedtrace
// entry taken out: any schedtrace above 0 keeps sysmon from parking
// (runtime/proc.go, func sysmon).
func withoutSchedtrace(env []string) string {
	var godebug string
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "GODEBUG="); ok {
			godebug = v
		}
	}
	var keep []string
	for f := range strings.SplitSeq(godebug, ",") {
		if k, _, _ := strings.Cut(f, "="); f != "" && k != "schedtrace" {
			keep = append(keep, f)
		}
	}
	return strings.Join(keep, ",")
}
