package main

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

func (h *harness) writeSaturation(w writer) {
	if h.cfg.satDuration == 0 {
		return
	}
	w("## Closed model (saturation)\n\n")
	w("vegeta `-rate=0 -workers=%[1]d -max-workers=%[1]d`, %[2]s per run, %[3]d rounds; throughput is verified answers per second. ", h.cfg.satWorkers, h.cfg.satDuration, h.cfg.satRounds)
	w("Load generator, proxy and upstream share the two cores, so this is the throughput of the whole machine with each proxy in the path.\n\n")
	w("| variant | target | throughput req/s | vs nginx | p50 ms | p99 ms | CPU µs/req | CPU / nginx | syscalls/req | upstream CPU µs/req | vegeta CPU µs/req | foreign %% | verified |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, v := range h.cfg.variants {
		ng := figure(h.cell(v, 0, viaNginx), func(r *runResult) float64 { return r.Throughput }).Med
		ngCPU := figure(h.cell(v, 0, viaNginx), func(r *runResult) float64 { return r.CPUus }).Med
		for _, t := range h.targetNames() {
			rs := h.cell(v, 0, t)
			if len(rs) == 0 {
				continue
			}
			tp := figure(rs, func(r *runResult) float64 { return r.Throughput })
			cpu := figure(rs, func(r *runResult) float64 { return r.CPUus })
			w("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", v, t, tp.f(0), ratioCell(tp.Med, ng, t),
				figure(rs, func(r *runResult) float64 { return msOf(r.P50) }).f(3),
				figure(rs, func(r *runResult) float64 { return msOf(r.P99) }).f(3),
				cpu.f(1), ratioCell(cpu.Med, ngCPU, t),
				syscallCell(rs, t),
				figure(rs, func(r *runResult) float64 { return r.UpCPUus }).f(1),
				figure(rs, func(r *runResult) float64 { return r.GenCPUus }).f(1),
				figure(rs, func(r *runResult) float64 { return r.ForeignPct }).f(0), verified(rs))
		}
	}
	w("\n")
}

func (h *harness) writeHealStorm(w writer) {
	if len(h.heals) > 0 {
		w("## Heal under load\n\n")
		w("vegeta at %d req/s for %s through mcpheal on one session; at %s the upstream gets SIGTERM (graceful shutdown), stays down %s after it exited, and is started again on the same port. ",
			h.cfg.healRate, h.cfg.healFor, h.cfg.healAt, h.cfg.healDown)
		w("*Caught* are the requests that ended after the stop began and started before the new upstream listened + 1 s; their *extra* latency is their latency minus the wait for the upstream to listen again (which no proxy can avoid) minus the pre-restart median.\n\n")
		w("| variant | target | requests | lost | upstream down ms | caught | pre-restart p50 ms | extra p99 ms | extra max ms | upstream initializes | heals | replays |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n")
		for _, r := range h.heals {
			w("| %s | %s | %d | %d | %.1f | %d | %.3f | %.1f | %.1f | %d | %d | %d |\n", r.Variant, r.Target, r.Requests, r.Requests-r.OK,
				msOf(r.Down), r.Caught, msOf(r.BaseP50), msOf(r.ExtraP99), msOf(r.ExtraMax), r.UpInits, r.Heals, r.Replays)
		}
		w("\n")
	}
	if len(h.storms) > 0 {
		w("## Expiry storm\n\n")
		w("Sessions opened through mcpheal; then the upstream closes every session at once (the Go SDK then answers 404 `session not found`), and each session sends %d calls together. *Healed* is from the first call until every call was answered.\n\n", stormCalls)
		w("| variant | sessions | calls | failed | healed in ms | upstream initializes | mcpheal heals | one initialize per session |\n|---|---|---|---|---|---|---|---|\n")
		for _, s := range h.storms {
			w("| %s | %d | %d | %d | %.1f | %d | %d | %s |\n", s.Variant, s.Sessions, s.Sessions*s.CallsPerSess, s.Failed,
				msOf(s.Healed), s.UpInits, s.Heals, yesNo(s.UpInits == int64(s.Sessions) && s.Heals == uint64(s.Sessions)))
		}
		w("\n")
	}
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func (h *harness) writeMemory(w writer) {
	m := h.memory
	if m == nil {
		return
	}
	w("## Memory per session\n\n")
	w("A fresh mcpheal in front of a stub upstream (initialize only, no state, so the Go SDK's own per-session memory does not count); sessions opened by `initialize` through the proxy and left idle. RSS is VmRSS of the proxy process, no forced GC.\n\n")
	w("| sessions | RSS MB | Go heap in use MB |\n|---|---|---|\n")
	for _, s := range m.Steps {
		w("| %d | %.1f | %.1f |\n", s.Sessions, mb(s.RSSKB), float64(s.HeapInuse)/1e6)
	}
	w("\nRSS growth: **%.1f MB per 10 000 idle sessions**; peak RSS (VmHWM) %.1f MB; %s to open them.\n\n",
		m.perTenK(), mb(m.PeakKB), m.Elapsed.Round(time.Millisecond))
}

func (h *harness) writeGoBench(w writer) {
	if len(h.gobench) == 0 {
		return
	}
	w("## Go micro-benchmarks\n\n")
	w("`go test -run '^$' -bench . -benchmem ./classify/ ./bench/`. `BenchmarkRequestPath` counts allocations of the whole test process (fasthttp client, fasthttp fake upstream and, for mcpheal, the proxy; its `mallocs/op`, the same count to two decimals, where reported): the proxy's own share is the mcpheal line minus the direct line; *mcpheal-traced* is mcpheal with tracing on, every request sampled, its spans batched to an exporter that counts and drops them (making the spans, not encoding or sending them). `cN` is N concurrent clients.\n\n")
	w("| package | benchmark | ns/op | B/op | allocs/op |\n|---|---|---|---|---|\n")
	for _, b := range h.gobench {
		w("| %s | %s | %.0f | %.0f | %s |\n", strings.TrimPrefix(b.Pkg, "github.com/mcpheal/mcpheal/"), b.Name, b.NsOp, b.BOp, allocsCell(b.AllocsOp))
	}
	w("\n")
	h.writeStoreBench(w)
}

// allocsCell shows allocs/op as go test printed it: an integer, or two
// decimals where the benchmark reported them (BenchmarkRequestPath).
func allocsCell(v float64) string {
	if v == math.Trunc(v) {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.2f", v)
}

// writeStoreBench compares a healthy session's call with the memory and
// the Redis session store: medians of five runs, and their ratio.
func (h *harness) writeStoreBench(w writer) {
	type agg struct{ ns, p99, allocs []float64 }
	runs := map[string]*agg{}
	var names []string
	for _, b := range h.storeBench {
		name := strings.TrimPrefix(b.Name, "BenchmarkSessionStore/")
		if i := strings.LastIndex(name, "-"); i > 0 {
			name = name[:i] // the GOMAXPROCS suffix
		}
		a := runs[name]
		if a == nil {
			a = &agg{}
			runs[name] = a
			names = append(names, name)
		}
		a.ns, a.p99, a.allocs = append(a.ns, b.NsOp), append(a.p99, b.P99us), append(a.allocs, b.AllocsOp)
	}
	if len(names) == 0 {
		return
	}
	w("## Session store: memory against Redis\n\n")
	w("`go test -run '^$' -bench BenchmarkSessionStore -count 5 ./bench/`: one healthy session's echo call through mcpheal with the in-memory store and with `session_store: redis` (a real redis-server on loopback), medians of 5 runs. A held session never reads the store, so the ratio is noise around 1.0 (`TestFleetHealsOncePerDeath` asserts 0 store calls for healthy calls).\n\n")
	w("| store/clients | ns/op (median) | p99 µs (median) | allocs/op | ratio to memory (ns/op, p99) |\n|---|---|---|---|---|\n")
	for _, name := range names {
		a := runs[name]
		base := runs["memory/"+strings.TrimPrefix(strings.TrimPrefix(name, "memory/"), "redis/")]
		ratio := "1.00, 1.00"
		if strings.HasPrefix(name, "redis/") && base != nil {
			ratio = fmt.Sprintf("%.2f, %.2f", median(a.ns)/median(base.ns), median(a.p99)/median(base.p99))
		}
		w("| %s | %.0f | %.0f | %.0f | %s |\n", name, median(a.ns), median(a.p99), median(a.allocs), ratio)
	}
	w("\n")
}

func (h *harness) writeProfile(w writer) {
	p := h.profile
	if p == nil {
		return
	}
	w("## Profile of mcpheal at %d req/s (JSON)\n\n", p.Rate)
	w("A dedicated mcpheal process (allocation sampling every %d bytes instead of 512 KiB); CPU profile and the allocations of the same %d s in the middle of a %d req/s run (p50 %.3f ms, CPU %.1f µs/req, %.2f allocs/req). Raw files: `%s`, `%s`.\n\n",
		p.MemRate, p.Seconds, p.Rate, msOf(p.Run.P50), p.Run.CPUus, p.Run.Allocs, p.CPUFile, p.AllocsFile)
	w("CPU (`go tool pprof -top`):\n\n```\n%s```\n\n", trimPprof(p.CPUTop))
	w("Allocated objects (`-sample_index=alloc_objects`):\n\n```\n%s```\n\n", trimPprof(p.AllocsTop))
}

// trimPprof drops pprof's header lines that name local files.
func trimPprof(s string) string {
	var keep []string
	for _, l := range strings.Split(s, "\n") {
		if strings.HasPrefix(l, "File:") || strings.HasPrefix(l, "Build ID:") {
			continue
		}
		keep = append(keep, l)
	}
	return strings.Join(keep, "\n")
}

func (h *harness) writeValidity(w writer) {
	w("## Did we measure the proxy?\n\n")
	off, heavy := 0, 0
	var offs []string
	for _, r := range h.runs {
		if !r.rateOK() {
			off++
			offs = append(offs, fmt.Sprintf("%s/%s/%d r%d: %.1f req/s", r.Variant, r.Target, r.Rate, r.Round, r.Achieved))
		}
		if r.Heavy {
			heavy++
		}
	}
	if len(h.runs) > 0 {
		w("- %d measured runs; vegeta's achieved rate was within 1 %% of the requested rate in %d", len(h.runs), len(h.runs)-off)
		if off > 0 {
			w(" (off: %s)", strings.Join(offs, "; "))
		}
		w(".\n- Hypervisor steal (`/proc/stat`) and foreign load are in the tables per cell; a round with a run above %.0f %% steal or %.0f %% foreign load was repeated (at most %d times per rate), and its %d runs left out of the medians.\n", h.cfg.stealMax, h.cfg.foreignMax, maxRepeats(h.cfg.rounds), heavy)
	}
	if len(h.large) > 0 {
		rep := 0
		for _, sec := range h.largeSecs {
			rep += sec.Repeated
		}
		w("- Large SSE event: %d target-rounds; %d rounds repeated for steal or foreign load and left out of the medians; the foreign load of the counted ones is in the table.\n", len(h.large), rep)
	}
	if len(h.hostile) > 0 {
		n, bad := 0, 0
		for _, p := range h.hostile {
			for _, r := range p.Results {
				for _, c := range r.Checks {
					n++
					if !c.OK {
						bad++
					}
				}
			}
		}
		w("- Hostile input: %d passes, %d checks of what the attacker and the other agents got; %d failed.\n", len(h.hostile), n, bad)
	}
	if h.cfg.nice != 0 {
		w("- This machine is shared: every process the harness started (upstream, nginx, mcpheal, vegeta, `go test`) ran at nice %d, the same for all targets, so that other people's builds wait behind the measurement instead of in front of it.\n", h.cfg.nice)
	}
	if len(h.failed) > 0 {
		w("- **Correctness failures**: %s\n", strings.Join(h.failed, "; "))
	} else {
		if len(h.runs) > 0 {
			w("- Every answer of every run was checked to be the echo of its own request (unique JSON-RPC id, `bench-<id>` text); none failed.\n")
		}
		if len(h.large) > 0 {
			w("- Every large-event answer was checked whole and byte-identical (length, start with its own id, SHA-256 of the rest); none failed.\n")
		}
	}
	w("\n")
}

func (h *harness) writeMethod(w writer) {
	w("## Method\n\n")
	w("- The upstream and vegeta run with GOGC=400: at the default the Go SDK server spends about a third of its CPU in GC, and neither is what is measured; mcpheal runs with the image's environment (the Dockerfile's `ENV`: `%s`) and Go's defaults otherwise.\n", strings.Join(h.image, " "))
	w("- Upstream: the official Go SDK (`github.com/modelcontextprotocol/go-sdk` v1.8.0) Streamable HTTP server, stateful, one `echo` tool annotated `readOnlyHint`; a JSON-answer and an SSE-answer variant, each in its own process.\n")
	w("- Targets, all on 127.0.0.1: *direct* to the upstream; *nginx* with keepalive upstream connections, `proxy_buffering off`, `proxy_request_buffering off`, Host rewritten, 2 workers; *mcpheal* (`proxy.New` with the binary's defaults, info-level JSON log) in its own process, which also serves `/stats` (runtime.MemStats) and pprof on a second port; *mcpheal-bare*, when measured, the same with `schedtrace` taken out of `GODEBUG`, as the bare binary runs unless its operator sets it (Go's default scheduler: sysmon parks while the process is idle); *mcpheal-traced*, when measured, the same as mcpheal with OpenTelemetry tracing on, every request sampled, exporting to a span-counting OTLP sink (\"Tracing on\").\n")
	w("- Each target gets one session (initialize, notifications/initialized, tools/list) per variant; every request is a `tools/call` of `echo` with a unique JSON-RPC id, and every answer is checked to be the echo of that id.\n")
	w("- Open model: vegeta v12.12.0 (pinned in `bench/tools/go.mod`) at each rate; warm-up of %s per target first; rounds rotate the target order (A B C, B C A, C A B …).\n", h.cfg.warmup)
	w("- CPU: utime+stime from `/proc/<pid>/stat` before and after each run, per request. Peak RSS: VmHWM. Allocations: `runtime.MemStats.Mallocs` delta of the mcpheal process per request (the `/stats` reads are included, a few hundred objects per run).\n")
	w("- Latency percentiles are exact (nearest rank) over all requests of a run, as vegeta measures them (request written → body read).\n")
}

// median returns the median of v (0 for none); v is not modified.
func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]float64(nil), v...)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
