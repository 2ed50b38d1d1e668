package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/tidwall/gjson"

	"github.com/mcpheal/mcpheal/bench"
)

// The large-SSE-event section: a tools/call answered by one SSE event of
// several MB (a legitimate large tool result), relayed direct, through
// nginx and through mcpheal, target order rotating each round. Per call it
// measures the wall time, the relaying process's CPU (/proc ticks, as the
// rest of the harness), the upstream's and the client's CPU (getrusage, so
// that the whole call's CPU can be compared with a direct call's), the
// relaying process's peak RSS per round, and checks every answer byte for
// byte. The upstream is a small net/http server (upstream -mode large), not
// the Go SDK: it writes a precomputed event in 64 KiB writes, as
// bench/large_bench_test.go's largeEventUpstream does, with the request's
// JSON-RPC id spliced in so every answer is the answer to its own call.

// largeChunk is the upstream's write size.
const largeChunk = 64 << 10

// largeEvent is the SSE answer of one size: prefix(id) + tail.
type largeEvent struct {
	size int      // bytes of tool-result text
	tail []byte   // everything after the JSON-RPC id
	sum  [32]byte // SHA-256 of tail
}

// largeAlphabet has 64 characters that need no JSON escaping.
const largeAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"

// newLargeEvent builds the event with size bytes of deterministic
// pseudo-random text (not one repeated byte, so that a reordered or
// duplicated piece changes the hash). The upstream and the harness build
// the same bytes independently.
func newLargeEvent(size int) *largeEvent {
	r := rand.New(rand.NewPCG(0x6d637068, uint64(size)))
	text := make([]byte, size)
	for i := 0; i < size; {
		x := r.Uint64()
		for k := 0; k < 10 && i < size; k++ {
			text[i] = largeAlphabet[x&63]
			x >>= 6
			i++
		}
	}
	var t bytes.Buffer
	t.Grow(size + 128)
	t.WriteString(`,"result":{"content":[{"type":"text","text":"`)
	t.Write(text)
	t.WriteString(`"}]}}` + "\n\n")
	e := &largeEvent{size: size, tail: t.Bytes()}
	e.sum = sha256.Sum256(e.tail)
	return e
}

// appendPrefix appends the event's start up to and including the id.
func appendPrefix(dst []byte, rawID string) []byte {
	dst = append(dst, "event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":"...)
	return append(dst, rawID...)
}

// ownIDRoom is the room an answer's buffer keeps for the id line mcpheal
// gives the event (docs/streams.md): "id: m<answer>-<n>".
const ownIDRoom = 48

// ownIDLine is that id line, where mcpheal puts it in an event that had
// none: just before the blank line that ends it.
var ownIDLine = regexp.MustCompile(`\nid: m[0-9a-z]+-[0-9]+\n\n$`)

// check reports whether body is exactly the event answering id, but for an
// id line of mcpheal's own: its length, its prefix with the id, and the
// SHA-256 of the rest. It may change body.
func (e *largeEvent) check(body []byte, id uint64) error {
	if loc := ownIDLine.FindIndex(body); loc != nil {
		body = append(body[:loc[0]+1], '\n')
	}
	pre := appendPrefix(nil, strconv.FormatUint(id, 10))
	if want := len(pre) + len(e.tail); len(body) != want {
		return fmt.Errorf("answer to %d: %d bytes, want %d", id, len(body), want)
	}
	if !bytes.Equal(body[:len(pre)], pre) {
		return fmt.Errorf("answer to %d starts %.80q, want %q", id, body, pre)
	}
	if sha256.Sum256(body[len(pre):]) != e.sum {
		return fmt.Errorf("answer to %d: right length and id, but the bytes after the id differ (SHA-256)", id)
	}
	return nil
}

// largeUpstream is the section's MCP server: initialize, tools/list (one
// echo tool), notifications, DELETE, and every tools/call answered with the
// large event as text/event-stream.
type largeUpstream struct {
	ev    *largeEvent
	inits atomic.Int64
	sids  atomic.Uint64
}

func (u *largeUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.Method {
	case http.MethodDelete:
		w.WriteHeader(http.StatusOK)
		return
	case http.MethodPost:
	default:
		w.WriteHeader(http.StatusMethodNotAllowed)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	id := gjson.GetBytes(body, "id").Raw
	if id == "" { // a notification
		w.WriteHeader(http.StatusAccepted)
		return
	}
	switch gjson.GetBytes(body, "method").Str {
	case "initialize":
		u.inits.Add(1)
		w.Header().Set("Mcp-Session-Id", "large-"+strconv.FormatUint(u.sids.Add(1), 10))
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"jsonrpc":"2.0","id":`+id+`,"result":{"protocolVersion":"`+bench.ProtocolVersion+
			`","capabilities":{"tools":{}},"serverInfo":{"name":"bench-large","version":"1"}}}`)
	case "tools/list":
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"jsonrpc":"2.0","id":`+id+`,"result":{"tools":[{"name":"`+bench.EchoTool+
			`","inputSchema":{"type":"object"},"annotations":{"readOnlyHint":true}}]}}`)
	case "tools/call":
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Cache-Control", "no-cache")
		_, _ = w.Write(appendPrefix(make([]byte, 0, 64), id))
		t := u.ev.tail
		for i := 0; i < len(t); i += largeChunk {
			if _, err := w.Write(t[i:min(i+largeChunk, len(t))]); err != nil {
				return
			}
		}
	default:
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"jsonrpc":"2.0","id":`+id+`,"error":{"code":-32601,"message":"method not found"}}`)
	}
}

// selfCPU is this process's user+system CPU time so far (getrusage: exact,
// not in ticks).
func selfCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// fetchLarge sends one tools/call with id on s and reads the answer into
// buf (whose length is one more than the answer should be, so an overlong
// answer shows). cpu is this process's CPU during the call only, so that
// checking the answer afterwards is not counted as the client's cost.
func fetchLarge(ctx context.Context, hc *http.Client, s bench.Session, id uint64, buf []byte) (body []byte, wall, cpu time.Duration, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.URL, bytes.NewReader(bench.CallBody(id)))
	if err != nil {
		return nil, 0, 0, err
	}
	req.Header = s.Header()
	c0, t0 := selfCPU(), time.Now()
	resp, err := hc.Do(req)
	if err != nil {
		return nil, 0, 0, err
	}
	n := 0
	for n < len(buf) {
		var k int
		k, err = resp.Body.Read(buf[n:])
		n += k
		if err != nil {
			break
		}
	}
	if errors.Is(err, io.EOF) {
		err = nil
	} else if err == nil { // buf is full: the answer is too long
		extra, _ := io.Copy(io.Discard, resp.Body)
		err = fmt.Errorf("answer to %d: at least %d bytes, want %d", id, int64(n)+extra, len(buf)-1)
	}
	_ = resp.Body.Close()
	wall, cpu = time.Since(t0), selfCPU()-c0
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("answer to %d: status %d: %.120s", id, resp.StatusCode, buf[:n])
	}
	if err == nil && resp.Header.Get("Content-Type") != "text/event-stream" {
		err = fmt.Errorf("answer to %d: Content-Type %q", id, resp.Header.Get("Content-Type"))
	}
	return buf[:n], wall, cpu, err
}

// largeResult is one target's round of large calls.
type largeResult struct {
	Size, Round int
	Target      string
	Calls, OK   int
	Sample      string        // one failure
	WallMean    time.Duration // per call
	WallP50     time.Duration // median call
	RelayCPUus  float64       // the relaying process(es), µs per call; 0 for direct
	RelayTickUs float64       // the same from /proc/<pid>/stat ticks (10 ms resolution), as a cross-check
	Precise     bool          // RelayCPUus is from per-thread sum_exec_runtime, not ticks
	Syscalls    float64       // mcpheal's read+write system calls per call; NaN otherwise
	UpCPUus     float64       // the upstream, µs per call
	ClientCPUus float64       // the client (this process during the calls), µs per call
	PeakRSSKB   uint64        // the relay's VmHWM over the round (since start if it could not be reset)
	BusyPct     float64
	ForeignPct  float64
	StealPct    float64
	RSSReset    bool // VmHWM was reset before the round (clear_refs)
	Heavy       bool // a target of the round ran above -steal-max or -foreign-max: repeated, left out of the medians
}

// WholeCPUus is the whole call's CPU: client, upstream and relay.
func (r *largeResult) WholeCPUus() float64 { return r.ClientCPUus + r.UpCPUus + r.RelayCPUus }

// largeSection is what the section measured of one size besides the rounds.
type largeSection struct {
	Size       int
	Calls      int               // per target per round
	Hash       string            // SHA-256 of the part after the id, shortened
	EventBytes int               // the event's length with a 6-digit id
	StartRSSKB map[string]uint64 // relay RSS after its session opened, before any large answer
	MaxRSSKB   map[string]uint64 // relay VmHWM over the whole section
	Elapsed    time.Duration
	Repeated   int // rounds repeated for steal or foreign load
}

// largeSizes returns the section's sizes in bytes.
func (c *config) largeSizeBytes() []int {
	var out []int
	for _, m := range c.largeSizes {
		out = append(out, m<<20)
	}
	return out
}

// largeCallsFor is the calls per target per round for size: at least
// -large-calls, and at least -large-round-mb of answers, so that the relay's
// CPU, read in 10 ms ticks from /proc, moves by enough ticks per round.
func (c *config) largeCallsFor(size int) int {
	n := c.largeCalls
	if c.largeRoundMB > 0 {
		n = max(n, int(math.Ceil(float64(c.largeRoundMB<<20)/float64(size))))
	}
	return max(1, n)
}

// largeRun measures one size: a fresh upstream, nginx and mcpheal (so that
// their peak RSS belongs to this section), sessions, a warm-up of two calls
// per target, then the rounds.
func (h *harness) largeRun(ctx context.Context, size int) error {
	ev := newLargeEvent(size)
	label := fmt.Sprintf("large-%dMB", size>>20)
	e := &env{variant: label, dir: filepath.Join(h.dir, label), hc: &http.Client{Timeout: 30 * time.Second}}
	if err := os.MkdirAll(e.dir, 0o755); err != nil {
		return err
	}
	defer e.stop()
	var err error
	if e.upAddr, err = freeAddr(); err != nil {
		return err
	}
	if e.up, err = startChild(ctx, "upstream", filepath.Join(e.dir, "upstream.log"), true, helperEnv,
		h.self, "upstream", "-listen", e.upAddr, "-mode", "large", "-size", strconv.Itoa(size)); err != nil {
		return err
	}
	upURL := "http://" + e.upAddr + "/mcp"
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
			pids: func() []int { return e.nginx.pids }})
	}
	proxyURL, statsURL, p, err := h.startProxy(ctx, e.dir, upURL)
	if err != nil {
		return err
	}
	e.proxy, e.statsURL = p, statsURL
	e.targets = append(e.targets, &target{name: mcpheal, sess: bench.Session{URL: proxyURL},
		pids: func() []int { return []int{e.proxy.pid()} }, stats: statsURL})
	if h.cfg.alt != "" {
		altURL, altStats, ap, err := h.startProxyBin(ctx, h.altBin(), filepath.Join(e.dir, "alt"), upURL, h.altEnv())
		if err != nil {
			return err
		}
		e.alt = ap
		e.targets = append(e.targets, &target{name: altProxy, sess: bench.Session{URL: altURL},
			pids: func() []int { return []int{e.alt.pid()} }, stats: altStats})
	}
	for _, t := range e.targets {
		if t.sess, err = bench.Initialize(ctx, e.hc, t.sess.URL, true); err != nil {
			return fmt.Errorf("%s session via %s: %w", label, t.name, err)
		}
	}
	sec := &largeSection{Size: size, Calls: h.cfg.largeCallsFor(size), StartRSSKB: map[string]uint64{}, MaxRSSKB: map[string]uint64{},
		EventBytes: len(appendPrefix(nil, "100000")) + len(ev.tail)}
	sec.Hash = hex.EncodeToString(ev.sum[:])[:16]
	for _, t := range e.targets {
		if t.pids != nil {
			s, err := sampleProcs(t.pids())
			if err != nil {
				return err
			}
			sec.StartRSSKB[t.name] = s.rssKB
		}
	}
	h.logf("%s: upstream %s, %d targets, %d calls per target per round, event %d bytes, SHA-256 after the id %s…",
		label, e.upAddr, len(e.targets), sec.Calls, sec.EventBytes, sec.Hash)
	hc := &http.Client{Transport: &http.Transport{DisableCompression: true, MaxIdleConnsPerHost: 2, IdleConnTimeout: time.Minute}}
	defer hc.CloseIdleConnections()
	buf := make([]byte, len(appendPrefix(nil, strconv.FormatUint(math.MaxUint64, 10)))+len(ev.tail)+ownIDRoom+1)
	start := time.Now()
	for _, t := range e.targets { // warm-up: connections, pools, page cache
		if _, err := h.largeRound(ctx, e, t, ev, hc, buf, 2, -1); err != nil {
			return fmt.Errorf("%s warm-up %s: %w", label, t.name, err)
		}
	}
	// A round with a target above -steal-max or -foreign-max is repeated (a
	// round takes about a second, so up to -large-rounds times) and left
	// out of the medians, as in the open model.
	for round, repeats := 0, 0; round < h.cfg.largeRounds; round++ {
		var rs []*largeResult
		noisy := false
		for _, t := range rotate(e.targets, round+repeats) {
			r, err := h.largeRound(ctx, e, t, ev, hc, buf, sec.Calls, round)
			if err != nil {
				return fmt.Errorf("%s %s round %d: %w", label, t.name, round, err)
			}
			h.large = append(h.large, r)
			rs = append(rs, r)
			h.logLarge(r)
			noisy = noisy || r.StealPct > h.cfg.stealMax || r.ForeignPct > h.cfg.foreignMax
		}
		if noisy && repeats < h.cfg.largeRounds {
			h.logf("%s round %d had heavy steal or foreign load: repeating it", label, round)
			for _, r := range rs {
				r.Heavy = true
			}
			sec.Repeated++
			repeats++
			round--
		}
	}
	sec.Elapsed = time.Since(start)
	for _, t := range e.targets {
		if t.pids == nil {
			continue
		}
		// The section's peak: the largest VmHWM read after a round; the
		// warm-up's peak counts too when the reset is not available.
		for _, r := range h.large {
			if r.Size == size && r.Target == t.name {
				sec.MaxRSSKB[t.name] = max(sec.MaxRSSKB[t.name], r.PeakRSSKB)
			}
		}
	}
	h.largeSecs = append(h.largeSecs, sec)
	return nil
}

// resetHWM resets the peak RSS of pids to their current RSS (clear_refs 5,
// Linux ≥ 4.0), so that the next VmHWM read is the peak of what follows.
func resetHWM(pids []int) bool {
	ok := true
	for _, pid := range pids {
		if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0); err != nil {
			ok = false
		}
	}
	return ok
}

// taskCPU sums se.sum_exec_runtime of every live thread of pids
// (/proc/<pid>/task/<tid>/sched, nanoseconds; the same time as utime+stime,
// which /proc/<pid>/stat rounds to 10 ms ticks). ok is false when the
// kernel does not publish it (no CONFIG_SCHED_DEBUG); a thread that exits
// between two reads takes its time with it, which Go and nginx threads do
// not do under a steady load.
func taskCPU(pids []int) (d time.Duration, ok bool) {
	for _, pid := range pids {
		tids, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		if err != nil {
			return 0, false
		}
		for _, t := range tids {
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/sched", pid, t.Name()))
			if err != nil {
				continue // exited meanwhile
			}
			i := bytes.Index(b, []byte("se.sum_exec_runtime"))
			if i < 0 {
				return 0, false
			}
			line := b[i:]
			if j := bytes.IndexByte(line, '\n'); j >= 0 {
				line = line[:j]
			}
			_, v, found := bytes.Cut(line, []byte(":"))
			f, err := strconv.ParseFloat(string(bytes.TrimSpace(v)), 64)
			if !found || err != nil {
				return 0, false
			}
			d += time.Duration(f * 1e6) // milliseconds
		}
	}
	return d, true
}

// largeUpCPU reads the upstream's own CPU time (getrusage), in µs.
func (e *env) largeUpCPU(ctx context.Context) (int64, error) {
	s, err := e.upstreamStatsOf(ctx)
	return s.CPUus, err
}

// largeRound makes calls sequential calls on t and measures them. Round -1
// is the warm-up: checked, not kept.
func (h *harness) largeRound(ctx context.Context, e *env, t *target, ev *largeEvent, hc *http.Client, buf []byte, calls, round int) (*largeResult, error) {
	r := &largeResult{Size: ev.size, Round: round, Target: t.name, Syscalls: math.NaN()}
	if t.pids != nil {
		r.RSSReset = resetHWM(t.pids())
	}
	var s0, s1 procSample
	var t0, t1 time.Duration
	ok0, ok1 := false, false
	var err error
	cpu0, err := readCPUStat()
	if err != nil {
		return nil, err
	}
	if t.pids != nil {
		if s0, err = sampleProcs(t.pids()); err != nil {
			return nil, err
		}
		t0, ok0 = taskCPU(t.pids())
	}
	up0, err := e.largeUpCPU(ctx)
	if err != nil {
		return nil, err
	}
	self0 := selfCPU()
	var walls []time.Duration
	var total, clientCPU time.Duration
	for range calls {
		id := h.ids.Add(1)
		cctx, cancel := context.WithTimeout(ctx, time.Minute)
		body, wall, cpu, err := fetchLarge(cctx, hc, t.sess, id, buf)
		cancel()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if err == nil {
			err = ev.check(body, id)
		}
		r.Calls++
		if err != nil {
			if r.Sample == "" {
				r.Sample = err.Error()
			}
			hc.CloseIdleConnections() // a half-read answer leaves its connection unusable
			continue
		}
		r.OK++
		walls = append(walls, wall)
		total += wall
		clientCPU += cpu
	}
	selfAll := selfCPU() - self0
	up1, err := e.largeUpCPU(ctx)
	if err != nil {
		return nil, err
	}
	if t.pids != nil {
		t1, ok1 = taskCPU(t.pids())
		if s1, err = sampleProcs(t.pids()); err != nil {
			return nil, err
		}
	}
	cpu1, err := readCPUStat()
	if err != nil {
		return nil, err
	}
	if r.OK != r.Calls {
		h.fail("large SSE event, %d MB via %s: %d of %d answers not whole and byte-identical, e.g. %s",
			ev.size>>20, t.name, r.Calls-r.OK, r.Calls, r.Sample)
	}
	if r.OK == 0 {
		return r, nil
	}
	n := float64(r.OK)
	slices.Sort(walls)
	r.WallMean, r.WallP50 = total/time.Duration(r.OK), pct(walls, 50)
	r.ClientCPUus = float64(clientCPU.Microseconds()) / n
	r.UpCPUus = float64(up1-up0) / n
	if t.pids != nil {
		r.RelayTickUs = float64(s1.cpuTicks-s0.cpuTicks) / clockTick * 1e6 / n
		r.RelayCPUus, r.Precise = r.RelayTickUs, ok0 && ok1 && t1 >= t0
		if r.Precise {
			r.RelayCPUus = float64((t1 - t0).Microseconds()) / n
		}
		r.PeakRSSKB = s1.hwmKB
		if t.stats != "" {
			r.Syscalls = float64(s1.syscalls-s0.syscalls) / n
		}
	}
	r.BusyPct, r.StealPct = busyPct(cpu0, cpu1), stealPct(cpu0, cpu1)
	if tot := cpu1.total - cpu0.total; tot > 0 {
		busy := float64(tot - (cpu1.idle - cpu0.idle))
		known := float64(s1.cpuTicks-s0.cpuTicks) + (float64(up1-up0)/1e6+selfAll.Seconds())*clockTick
		r.ForeignPct = max(0, 100*(busy-known)/float64(tot))
	}
	return r, nil
}

func (h *harness) logLarge(r *largeResult) {
	h.logf("large %2dMB %-7s r%d n=%d ok=%d wall=%s p50=%s relay=%.0fµs (ticks %.0fµs) up=%.0fµs client=%.0fµs whole=%.0fµs sys=%.1f peakRSS=%.1fMB busy=%.0f%% foreign=%.0f%% steal=%.1f%%",
		r.Size>>20, r.Target, r.Round, r.Calls, r.OK, ms(r.WallMean), ms(r.WallP50), r.RelayCPUus, r.RelayTickUs, r.UpCPUus, r.ClientCPUus,
		r.WholeCPUus(), r.Syscalls, mb(r.PeakRSSKB), r.BusyPct, r.ForeignPct, r.StealPct)
}

// largeCell returns the rounds of one size and target.
func (h *harness) largeCell(size int, t string) []*largeResult {
	var out []*largeResult
	for _, r := range h.large {
		if r.Size == size && r.Target == t && r.OK > 0 && !r.Heavy {
			out = append(out, r)
		}
	}
	return out
}

// largeFigure aggregates f over a cell.
func largeFigure(rs []*largeResult, f func(*largeResult) float64) agg {
	vs := make([]float64, len(rs))
	for i, r := range rs {
		vs[i] = f(r)
	}
	return aggregate(vs)
}

var (
	largeWall   = func(r *largeResult) float64 { return msOf(r.WallMean) }
	largeP50    = func(r *largeResult) float64 { return msOf(r.WallP50) }
	largeRelay  = func(r *largeResult) float64 { return r.RelayCPUus / 1000 }
	largeUp     = func(r *largeResult) float64 { return r.UpCPUus / 1000 }
	largeClient = func(r *largeResult) float64 { return r.ClientCPUus / 1000 }
	largeWhole  = func(r *largeResult) float64 { return r.WholeCPUus() / 1000 }
	largeRSS    = func(r *largeResult) float64 { return mbOrNaN(r.PeakRSSKB) }
)

// largeRatio is the ratio of the medians of f for targets a and b.
func (h *harness) largeRatio(size int, a, b string, f func(*largeResult) float64) float64 {
	return ratio(largeFigure(h.largeCell(size, a), f).Med, largeFigure(h.largeCell(size, b), f).Med)
}

// largeRatioCell is the ratio of t's median to base's, "–" for base itself
// and for direct (whose relay CPU is 0).
func (h *harness) largeRatioCell(size int, t, base string, f func(*largeResult) float64) string {
	if t == base || t == direct {
		return "–"
	}
	return fmtRatio(h.largeRatio(size, t, base, f))
}

func fmtRatio(r float64) string {
	if math.IsNaN(r) {
		return "–"
	}
	return fmt.Sprintf("%.2f", r)
}

// writeLarge writes the section into the results.
func (h *harness) writeLarge(w writer) {
	if len(h.largeSecs) == 0 {
		return
	}
	w("## Large SSE event\n\n")
	w("One `tools/call` answered by **one SSE event** carrying a single large text result, relayed direct, through nginx (the harness's config, `proxy_buffering off`: see Method) and through mcpheal; ")
	w("the upstream is a small net/http server (not the Go SDK) writing a precomputed event in 64 KiB writes, with the request's JSON-RPC id spliced in. ")
	w("Each size gets fresh upstream, nginx and mcpheal processes, one session per target, 2 warm-up calls per target, then %d rounds, target order rotating, of sequential calls on one keep-alive connection; median (min–max) over the rounds.\n\n", h.cfg.largeRounds)
	w("How to read: *relay CPU* is what the proxy process itself spent per call (nginx: master + workers; direct has no relay, 0), %s; ", h.largeCPUSource())
	w("*whole-call CPU* = client + upstream + relay, so *whole / direct* is what a call costs the machine through the proxy compared with the same call without one. Ratios are of the medians. ")
	w("*Peak RSS* is the relay's VmHWM over one round (reset before each round with `/proc/<pid>/clear_refs`); *section max* is the largest of them, *at start* its RSS once the session was open, before any large answer. ")
	w("Every answer is checked whole and byte-identical, but for the id line mcpheal gives the event (docs/streams.md): its length, the event's start with its own id, and the SHA-256 of the rest.\n\n")
	for _, sec := range h.largeSecs {
		size := sec.Size
		w("### %d MB event (%d bytes with its id; %d calls per target per round; SHA-256 after the id `%s…`)\n\n", size>>20, sec.EventBytes, sec.Calls, sec.Hash)
		if sec.Repeated > 0 {
			w("%d rounds were repeated for steal above %.0f %% or foreign load above %.0f %% and are left out of the medians (their answers are in *verified*).\n\n", sec.Repeated, h.cfg.stealMax, h.cfg.foreignMax)
		}
		w("| target | verified | wall ms/call | median call ms | wall / nginx | wall / direct | relay CPU ms/call | relay CPU / nginx | upstream CPU ms/call | client CPU ms/call | whole-call CPU ms/call | whole / direct | syscalls/call | peak RSS MB | section max MB | RSS at start MB | foreign %% |\n")
		w("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
		for _, t := range h.targetNames() {
			all := h.largeAll(size, t)
			if len(all) == 0 {
				continue
			}
			rs := h.largeCell(size, t)
			relay := "0 (none)"
			maxRSS, startRSS := "–", "–"
			if t != direct {
				relay = largeFigure(rs, largeRelay).f(3)
				maxRSS, startRSS = fmt.Sprintf("%.1f", mb(sec.MaxRSSKB[t])), fmt.Sprintf("%.1f", mb(sec.StartRSSKB[t]))
			}
			w("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", t, largeVerified(all),
				largeFigure(rs, largeWall).f(3), largeFigure(rs, largeP50).f(3),
				h.largeRatioCell(size, t, viaNginx, largeWall), h.largeRatioCell(size, t, direct, largeWall),
				relay, h.largeRatioCell(size, t, viaNginx, largeRelay),
				largeFigure(rs, largeUp).f(3), largeFigure(rs, largeClient).f(3),
				largeFigure(rs, largeWhole).f(3), h.largeRatioCell(size, t, direct, largeWhole),
				largeSyscallCell(rs, t), largeFigure(rs, largeRSS).f(1), maxRSS, startRSS,
				largeFigure(rs, func(r *largeResult) float64 { return r.ForeignPct }).f(0))
		}
		w("\n")
	}
	w("*Syscalls* are mcpheal's read- and write-class system calls per call (`/proc/<pid>/io`); nginx's `recv` is not counted there, so it has none. ")
	buf := "nginx's default, one memory page"
	if nginxBufferKB > 0 {
		buf = fmt.Sprintf("%d KiB here, set by -nginx-buffer-kb", nginxBufferKB)
	}
	w("With `proxy_buffering off` nginx passes on each read of its `proxy_buffer_size` buffer (%s) as it arrives, so the write sizes, and with them the relay's and the client's CPU, differ between targets.\n\n", buf)
}

// largeCPUSource says where the relay CPU figures come from.
func (h *harness) largeCPUSource() string {
	for _, r := range h.large {
		if r.Target != direct && !r.Precise {
			return "from utime+stime of `/proc/<pid>/stat` (10 ms ticks; the per-thread scheduler time was not readable)"
		}
	}
	return "summed over the process's threads from `/proc/<pid>/task/<tid>/sched` (`se.sum_exec_runtime`, ns: the time `/proc/<pid>/stat` rounds to 10 ms ticks); the tick-based figure is in the log as a cross-check"
}

func largeSyscallCell(rs []*largeResult, t string) string {
	if !isMcpheal(t) {
		return "–"
	}
	return largeFigure(rs, func(r *largeResult) float64 { return r.Syscalls }).f(0)
}

// largeAll returns every round of one size and target, failed ones too.
func (h *harness) largeAll(size int, t string) []*largeResult {
	var out []*largeResult
	for _, r := range h.large {
		if r.Size == size && r.Target == t {
			out = append(out, r)
		}
	}
	return out
}

func largeVerified(rs []*largeResult) string {
	n, ok := 0, 0
	for _, r := range rs {
		n += r.Calls
		ok += r.OK
	}
	return fmt.Sprintf("%d/%d", ok, n)
}

// printLarge prints the section's medians and ratios at the end of a run.
func (h *harness) printLarge() {
	if len(h.largeSecs) == 0 {
		return
	}
	fmt.Println()
	fmt.Println("large SSE event: median (min–max) over rounds; ms per call")
	for _, sec := range h.largeSecs {
		size := sec.Size
		for _, t := range h.targetNames() {
			rs := h.largeCell(size, t)
			if len(h.largeAll(size, t)) == 0 {
				continue
			}
			fmt.Printf("  %2d MB %-11s verified %-9s wall %-24s relay CPU %-24s upstream %-24s client %-24s whole %-24s peak RSS MB %s\n",
				size>>20, t, largeVerified(h.largeAll(size, t)),
				largeFigure(rs, largeWall).f(3), largeFigure(rs, largeRelay).f(3), largeFigure(rs, largeUp).f(3),
				largeFigure(rs, largeClient).f(3), largeFigure(rs, largeWhole).f(3), largeFigure(rs, largeRSS).f(1))
		}
		for _, p := range h.buildNames() {
			fmt.Printf("  %2d MB %-11s relay CPU / nginx %s, wall / nginx %s, whole-call CPU / direct %s (nginx %s), wall / direct %s (nginx %s)\n",
				size>>20, p, fmtRatio(h.largeRatio(size, p, viaNginx, largeRelay)), fmtRatio(h.largeRatio(size, p, viaNginx, largeWall)),
				fmtRatio(h.largeRatio(size, p, direct, largeWhole)), fmtRatio(h.largeRatio(size, viaNginx, direct, largeWhole)),
				fmtRatio(h.largeRatio(size, p, direct, largeWall)), fmtRatio(h.largeRatio(size, viaNginx, direct, largeWall)))
		}
	}
}
