package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/tidwall/gjson"

	"github.com/mcpheal/mcpheal/bench"
)

// The hostile-input section: what one agent or one upstream can take from
// mcpheal (docs/security.md "Under attack"). mcpheal is the real binary, built from
// this tree, run as its own process with its default limits (a pass may add
// --memory-budget); each attack gets a fresh process, so that its RSS
// before, its peak during (VmHWM, reset with clear_refs just before) and its
// RSS 2 s after belong to that attack alone. The upstream is
// `upstream -mode hostile` (hostile_upstream.go): a session-era server, or
// one that speaks only 2026-07-28 (mcpheal bridges it). Each attack is
// bounded in count and time (at most ~30 s), everything on 127.0.0.1.

// hostilePass is every attack against one mcpheal configuration.
type hostilePass struct {
	Name    string   // how the pass configures mcpheal
	Flags   []string // its mcpheal flags
	Budget  int      // memory_budget in bytes
	Results []*hostileResult
}

// hostileResult is one attack.
type hostileResult struct {
	Attack   string   // short name
	Sends    string   // what the attacker sends
	Cap      string   // the limit that bounds it
	Flags    []string // mcpheal flags the attack adds to the pass's
	BeforeKB uint64   // VmRSS just before the attack
	PeakKB   uint64   // VmHWM over the attack
	AfterKB  uint64   // VmRSS 2 s after it
	RSSReset bool     // VmHWM was reset before the attack
	CPUs     float64  // mcpheal's CPU during the attack, seconds
	Got      string   // what the attacker got
	Messages []string // one error message per kind of answer
	Notes    []string
	Checks   []hostileCheck
	Elapsed  time.Duration
}

type hostileCheck struct {
	What string
	OK   bool
}

// The defaults the section relies on (proxy.Config's, docs/configuration.md "Flags").
const (
	defMemoryBudget  = 512 << 20
	defWriteTimeout  = 30 * time.Second
	slowWriteTimeout = 3 * time.Second // the slow-agent attack's --write-timeout
	sessionGrace     = 10 * time.Second
)

// hostileAttack is one attack: setup runs before the RSS baseline, run is
// the attack (the peak is read when it returns), after runs 2 s later.
type hostileAttack struct {
	id               string // for -hostile-attacks
	name, sends, cap string
	path             string // the upstream mcpheal fronts, on the hostile server; "": hostilePath
	flags            []string
	env              func() []string // environment the attack adds to mcpheal's (nil: none)
	setup, run       func(ctx context.Context, a *attackRun) error
	after            func(ctx context.Context, a *attackRun) error
}

// attackRun is one attack against one mcpheal process.
type attackRun struct {
	h     *harness
	pass  *hostilePass
	res   *hostileResult
	url   string // mcpheal's MCP endpoint
	addr  string // its agent listener, host:port
	admin string // its admin listener, http://host:port
	pid   int
	upURL string // the upstream's base, http://host:port
	hc    *http.Client
	sess  []bench.Session
	stats hostileStats // the upstream's counters after setup
}

func (a *attackRun) check(ok bool, format string, args ...any) {
	what := fmt.Sprintf(format, args...)
	a.res.Checks = append(a.res.Checks, hostileCheck{What: what, OK: ok})
	if !ok {
		a.h.fail("hostile input, %s, %s: %s", a.pass.Name, a.res.Attack, what)
	}
}

// got records what the attacker got: the tally, extra, and one message
// per kind of answer.
func (a *attackRun) got(t *tally, extra string) {
	a.res.Got, a.res.Messages = t.String()+extra, t.messages()
}

func (a *attackRun) note(format string, args ...any) {
	a.res.Notes = append(a.res.Notes, fmt.Sprintf(format, args...))
}

// hostileRun builds mcpheal, starts the hostile upstream and runs every
// attack once per pass.
func (h *harness) hostileRun(ctx context.Context) error {
	dir := filepath.Join(h.dir, "hostile")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	bin := h.cfg.mcphealBin
	if bin == "" {
		bin = filepath.Join(dir, "mcpheal")
		h.logf("hostile input: building mcpheal from %s", h.root)
		cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, ".")
		cmd.Dir = h.root
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("build mcpheal: %v\n%s", err, out)
		}
	}
	upAddr, err := freeAddr()
	if err != nil {
		return err
	}
	up, err := startChild(ctx, "upstream", filepath.Join(dir, "upstream.log"), true, helperEnv,
		h.self, "upstream", "-listen", upAddr, "-mode", "hostile")
	if err != nil {
		return err
	}
	defer up.stop(5 * time.Second)
	h.hostileSlowBytes = h.slowAnswerBytes()
	sink, stopSink, err := startSlowCollector()
	if err != nil {
		return err
	}
	defer stopSink()
	h.slowCollector = sink
	start := time.Now()
	for _, mib := range h.cfg.hostileBudgets {
		pass := &hostilePass{Name: "defaults", Budget: defMemoryBudget}
		if mib > 0 {
			pass.Budget = mib << 20
			pass.Name = fmt.Sprintf("--memory-budget %d MiB", mib)
			pass.Flags = []string{"--memory-budget", strconv.Itoa(pass.Budget)}
		}
		for i, at := range h.hostileAttacks(pass) {
			label := "defaults"
			if mib > 0 {
				label = fmt.Sprintf("budget%dMiB", mib)
			}
			d := filepath.Join(dir, fmt.Sprintf("%s-%d-%s", label, i+1, strings.ReplaceAll(at.name, " ", "-")))
			r, err := h.hostileAttack(ctx, bin, d, "http://"+upAddr, pass, at)
			if err != nil {
				return fmt.Errorf("%s, %s: %w", pass.Name, at.name, err)
			}
			pass.Results = append(pass.Results, r)
			h.logHostile(pass, r)
		}
		h.hostile = append(h.hostile, pass)
	}
	h.hostileElapsed = time.Since(start)
	return nil
}

// slowAnswerBytes is the answer the slow agents ask for: 2 MiB, or more
// when the kernel's socket buffers could take that whole (the sender's
// tcp_wmem maximum; the agents shrink their receive buffers to 4 KiB), so
// that mcpheal's write really stalls.
func (h *harness) slowAnswerBytes() int {
	if h.cfg.hostileSlowMiB > 0 {
		return h.cfg.hostileSlowMiB << 20
	}
	n := 2 << 20
	if f := strings.Fields(readFile("/proc/sys/net/ipv4/tcp_wmem")); len(f) == 3 {
		if w, err := strconv.Atoi(f[2]); err == nil && 2*w > n {
			n = (2*w + 1<<20 - 1) &^ (1<<20 - 1)
		}
	}
	return n
}

// hostileAttack runs one attack on a fresh mcpheal and measures it.
func (h *harness) hostileAttack(ctx context.Context, bin, dir, upURL string, pass *hostilePass, at hostileAttack) (*hostileResult, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	res := &hostileResult{Attack: at.name, Sends: at.sends, Cap: at.cap, Flags: at.flags}
	flags := append(slices.Clone(pass.Flags), at.flags...)
	var env []string
	if at.env != nil {
		env = at.env()
	}
	p, addr, admin, err := h.startMcpheal(ctx, bin, dir, upURL+cmp.Or(at.path, hostilePath), flags, env...)
	if err != nil {
		return nil, err
	}
	defer p.stop(5 * time.Second)
	a := &attackRun{h: h, pass: pass, res: res, url: "http://" + addr + "/mcp", addr: addr, admin: admin, pid: p.pid(), upURL: upURL,
		hc: &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{DisableCompression: true, MaxIdleConnsPerHost: 32}}}
	defer a.hc.CloseIdleConnections()
	if at.setup != nil {
		if err := at.setup(ctx, a); err != nil {
			return nil, fmt.Errorf("setup: %w", err)
		}
	}
	if a.stats, err = a.upStats(ctx); err != nil {
		return nil, err
	}
	if err := sleepCtx(ctx, 300*time.Millisecond); err != nil {
		return nil, err
	}
	s0, err := sampleProcs([]int{a.pid})
	if err != nil {
		return nil, err
	}
	res.BeforeKB = s0.rssKB
	res.RSSReset = resetHWM([]int{a.pid})
	t0 := time.Now()
	if err := at.run(ctx, a); err != nil {
		return nil, err
	}
	res.Elapsed = time.Since(t0)
	s1, err := sampleProcs([]int{a.pid})
	if err != nil {
		return nil, fmt.Errorf("mcpheal gone after the attack (log %s): %w", filepath.Join(dir, "mcpheal.log"), err)
	}
	res.PeakKB = s1.hwmKB
	res.CPUs = float64(s1.cpuTicks-s0.cpuTicks) / clockTick
	if err := sleepCtx(ctx, 2*time.Second); err != nil {
		return nil, err
	}
	s2, err := sampleProcs([]int{a.pid})
	if err != nil {
		return nil, fmt.Errorf("mcpheal gone 2 s after the attack (log %s): %w", filepath.Join(dir, "mcpheal.log"), err)
	}
	res.AfterKB = s2.rssKB
	res.PeakKB = max(res.PeakKB, s2.hwmKB) // what lingered after run returned
	if at.after != nil {
		if err := at.after(ctx, a); err != nil {
			return nil, err
		}
	}
	if l := h.cfg.hostileLinger; l > 0 {
		// How long the peak stays resident: Go collects an idle heap only
		// at its forced GC (every 2 min) and returns pages in the background.
		t := time.Now()
		min1 := res.AfterKB
		for time.Since(t) < l {
			if err := sleepCtx(ctx, min(5*time.Second, l-time.Since(t))); err != nil {
				return nil, err
			}
			min1 = min(min1, a.rssKB())
		}
		a.note("RSS %s after the attack: %.1f MB (lowest seen %.1f MB)", (l + 2*time.Second).Round(time.Second), mb(a.rssKB()), mb(min1))
	}
	return res, nil
}

// startMcpheal starts the mcpheal binary in front of upURL with flags on
// free loopback ports, and waits until its /healthz answers.
func (h *harness) startMcpheal(ctx context.Context, bin, dir, upURL string, flags []string, env ...string) (*child, string, string, error) {
	listen, err := freeAddr()
	if err != nil {
		return nil, "", "", err
	}
	admin, err := freeAddr()
	if err != nil {
		return nil, "", "", err
	}
	log := filepath.Join(dir, "mcpheal.log")
	argv := append([]string{bin, "--upstream", upURL, "--listen", listen, "--admin-listen", admin, "--log-format", "json"}, flags...)
	if err := os.WriteFile(filepath.Join(dir, "cmdline"), []byte(strings.Join(argv, " ")+"\n"), 0o644); err != nil {
		return nil, "", "", err
	}
	c, err := startChild(ctx, "mcpheal", log, false, append(slices.Clone(h.image), env...), argv...) // as the image runs it
	if err != nil {
		return nil, "", "", err
	}
	hc := &http.Client{Timeout: time.Second}
	for deadline := time.Now().Add(10 * time.Second); ; {
		select {
		case <-c.done:
			return nil, "", "", fmt.Errorf("mcpheal exited: %v (log %s)", c.err, log)
		default:
		}
		if resp, err := hc.Get("http://" + listen + "/healthz"); err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return c, listen, "http://" + admin, nil
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			c.kill()
			return nil, "", "", fmt.Errorf("mcpheal not serving /healthz after 10 s (log %s)", log)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// upStats reads the hostile upstream's counters.
func (a *attackRun) upStats(ctx context.Context) (hostileStats, error) {
	var s hostileStats
	err := getJSON(ctx, a.hc, http.MethodGet, a.upURL+"/admin/stats", &s)
	return s, err
}

// metric sums the samples of one metric on mcpheal's admin listener.
func (a *attackRun) metric(ctx context.Context, name string) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, a.admin+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := a.hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		l := sc.Text()
		if rest, ok := strings.CutPrefix(l, name); ok && (strings.HasPrefix(rest, "{") || strings.HasPrefix(rest, " ")) {
			f := strings.Fields(l)
			v, _ := strconv.ParseFloat(f[len(f)-1], 64)
			sum += v
		}
	}
	return sum, sc.Err()
}

// sockets counts mcpheal's open sockets (/proc/<pid>/fd).
func (a *attackRun) sockets() int {
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", a.pid))
	if err != nil {
		return -1
	}
	n := 0
	for _, e := range ents {
		if l, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", a.pid, e.Name())); err == nil && strings.HasPrefix(l, "socket:") {
			n++
		}
	}
	return n
}

func (a *attackRun) rssKB() uint64 {
	_, rss, _ := memKB(a.pid)
	return rss
}

// openSessions opens n sessions as agents do (initialize,
// notifications/initialized, tools/list).
func (a *attackRun) openSessions(ctx context.Context, n int) error {
	for range n {
		s, err := bench.Initialize(ctx, a.hc, a.url, true)
		if err != nil {
			return err
		}
		a.sess = append(a.sess, s)
	}
	return nil
}

// agentAnswer is what an agent's request got.
type agentAnswer struct {
	status int
	sid    string
	code   int64  // JSON-RPC error code, 0 for none
	msg    string // its message
	n      int64  // body bytes
	err    error  // no answer
}

// key is the answer as the tally counts it: "400 -32600", "200", or the
// transport error.
func (x agentAnswer) key() string {
	switch {
	case x.err != nil:
		return "no answer (" + shortErr(x.err) + ")"
	case x.code != 0:
		return fmt.Sprintf("%d %d", x.status, x.code)
	}
	return strconv.Itoa(x.status)
}

func shortErr(err error) string {
	s := err.Error()
	if i := strings.LastIndex(s, ": "); i >= 0 {
		s = s[i+2:]
	}
	if len(s) > 40 {
		s = s[:40]
	}
	return s
}

// request builds an agent's POST of body on session sid ("" for none).
func (a *attackRun) request(ctx context.Context, sid string, body []byte) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, a.url, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if sid != "" {
		req.Header.Set("Mcp-Session-Id", sid)
		req.Header.Set("Mcp-Protocol-Version", bench.ProtocolVersion)
	}
	return req, nil
}

// post sends body as an agent and reads the answer (its first MiB; the
// rest is counted and dropped).
func (a *attackRun) post(ctx context.Context, sid string, body []byte) agentAnswer {
	req, err := a.request(ctx, sid, body)
	if err != nil {
		return agentAnswer{err: err}
	}
	resp, err := a.hc.Do(req)
	if err != nil {
		return agentAnswer{err: err}
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	rest, err2 := io.Copy(io.Discard, resp.Body)
	x := agentAnswer{status: resp.StatusCode, sid: resp.Header.Get("Mcp-Session-Id"), n: int64(len(raw)) + rest}
	if err == nil {
		err = err2
	}
	if err != nil {
		x.err = err
		return x
	}
	if ans := bench.Answer(raw); ans != nil {
		x.code, x.msg = gjson.GetBytes(ans, "error.code").Int(), gjson.GetBytes(ans, "error.message").Str
	}
	return x
}

// tally counts answers by key, keeping one message per key.
type tally struct {
	mu     sync.Mutex
	keys   []string
	n      map[string]int
	sample map[string]string
}

func (t *tally) add(key, msg string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.n == nil {
		t.n, t.sample = map[string]int{}, map[string]string{}
	}
	if t.n[key] == 0 {
		t.keys = append(t.keys, key)
		t.sample[key] = msg
	}
	t.n[key]++
}

// String is "400 -32600 ×8, 200 ×2" in order of first appearance.
func (t *tally) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var parts []string
	for _, k := range t.keys {
		parts = append(parts, fmt.Sprintf("%s ×%d", k, t.n[k]))
	}
	if len(parts) == 0 {
		return "nothing"
	}
	return strings.Join(parts, ", ")
}

// messages lists one message per key that had one.
func (t *tally) messages() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []string
	for _, k := range t.keys {
		if m := t.sample[k]; m != "" {
			if len(m) > 140 {
				m = m[:140] + "…"
			}
			out = append(out, fmt.Sprintf("%s: %q", k, m))
		}
	}
	return out
}

// parallel runs f(i) for i in [0, n) on workers goroutines.
func parallel(n, workers int, f func(i int)) {
	var wg sync.WaitGroup
	next := make(chan int)
	for range min(n, workers) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				f(i)
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
}

func initBodyNamed(name string) []byte {
	return []byte(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"` + bench.ProtocolVersion +
		`","capabilities":{},"clientInfo":{"name":"` + name + `","version":"1"}}}`)
}

func toolCall(id int, name, args string) []byte {
	return []byte(`{"jsonrpc":"2.0","id":` + strconv.Itoa(id) + `,"method":"tools/call","params":{"name":"` + name + `","arguments":` + args + `}}`)
}

// mib formats a byte count in MiB, or KiB below one MiB.
func mib(n int) string {
	if n < 1<<20 {
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
}

// hostileAttackIDs name the attacks for -hostile-attacks, in order.
var hostileAttackIDs = []string{"nested", "fat", "flood", "sse", "held", "slow", "huge", "hugecl", "journal", "journal-bridged", "discover",
	"conns", "listens", "tracing", "wellknown", "held-events", "renumbered"}

// hostileAttacks are the attacks of one pass, in order (those -hostile-attacks
// names, if it names any).
func (h *harness) hostileAttacks(pass *hostilePass) []hostileAttack {
	all := []hostileAttack{
		h.attackNested(), h.attackFat(pass), h.attackFlood(), h.attackEndless(), h.attackHeldLine(),
		h.attackSlow(), h.attackHuge(false), h.attackHuge(true),
		h.attackJournal(false), h.attackJournal(true), h.attackDiscover(),
		h.attackConns(), h.attackListens(), h.attackTracing(),
		h.attackWellKnown(), h.attackHeldEvents(), h.attackRenumbered(),
	}
	for i := range all {
		all[i].id = hostileAttackIDs[i]
	}
	if len(h.cfg.hostileAttacks) == 0 {
		return all
	}
	return slices.DeleteFunc(all, func(at hostileAttack) bool { return !slices.Contains(h.cfg.hostileAttacks, at.id) })
}

// 1. Nested JSON: 8 concurrent bodies of 4 MiB of '[' with no session.
func (h *harness) attackNested() hostileAttack {
	const n, size = 8, 4 << 20
	return hostileAttack{
		name: "nested JSON", sends: fmt.Sprintf("%d concurrent POSTs of %s of `[`, no session", n, mib(size)),
		cap: "max_json_depth 64 (checked before parsing); max_body 4 MiB",
		run: func(ctx context.Context, a *attackRun) error {
			body := bytes.Repeat([]byte("["), size)
			var t tally
			named := 0
			var mu sync.Mutex
			parallel(n, n, func(int) {
				x := a.post(ctx, "", body)
				t.add(x.key(), x.msg)
				if x.status == http.StatusBadRequest && x.code == -32600 && strings.Contains(x.msg, "max_json_depth") {
					mu.Lock()
					named++
					mu.Unlock()
				}
			})
			a.got(&t, "")
			a.check(named == n, "%d of %d refused 400 -32600 naming max_json_depth", named, n)
			return nil
		},
	}
}

// 2. Fat sessions: 150 distinct initializes of ~60 KiB.
func (h *harness) attackFat(pass *hostilePass) hostileAttack {
	const n, size = 150, 60 << 10
	body := func(i int) []byte {
		return initBodyNamed(strings.Repeat(string(rune('a'+i%26)), size) + strconv.Itoa(i))
	}
	per := len(body(100)) + 2<<10 // what the budget counts per session, about (proxy/budget.go)
	return hostileAttack{
		name: "fat sessions", sends: fmt.Sprintf("%d initializes of %s each, all distinct (8 at a time)", n, mib(len(body(100)))),
		cap: "max_init_body 64 KiB per session; memory_budget for all of them",
		run: func(ctx context.Context, a *attackRun) error {
			var t tally
			var mu sync.Mutex
			var admitted []string
			refusedOK := 0
			parallel(n, 8, func(i int) {
				x := a.post(ctx, "", body(i))
				t.add(x.key(), x.msg)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case x.status == http.StatusOK && x.sid != "":
					admitted = append(admitted, x.sid)
				case x.status == http.StatusOK && x.code == -32015 && strings.Contains(x.msg, "memory_budget"):
					refusedOK++
				}
			})
			a.got(&t, "")
			want := min(n, pass.Budget/per)
			if want == n {
				a.check(len(admitted) == n, "all %d admitted (%s of initialize bodies is within memory_budget)", n, mib(n*per))
			} else {
				a.check(len(admitted)+refusedOK == n && len(admitted) >= want*9/10,
					"about %d admitted under the budget (%d), the rest refused -32015 naming memory_budget (%d)", want, len(admitted), refusedOK)
			}
			if len(admitted) > 0 {
				worked := 0
				for _, sid := range []string{admitted[0], admitted[len(admitted)-1]} {
					x := a.post(ctx, sid, toolCall(7, bench.EchoTool, `{"text":"fat"}`))
					if x.status == http.StatusOK && x.code == 0 && x.err == nil {
						worked++
					}
				}
				a.check(worked == 2, "the first and the last admitted session answer a call")
			}
			if v, err := a.metric(ctx, "mcpheal_sessions"); err == nil {
				a.note("%d sessions live after the attack (mcpheal_sessions)", int(v))
			}
			return nil
		},
	}
}

// 3. Session flood: 1000 credential-less initializes; a session that made
// a call before must keep working, and a new agent gets in after the grace.
func (h *harness) attackFlood() hostileAttack {
	const n = 1000
	var victim bench.Session
	var floodStart time.Time
	return hostileAttack{
		name: "session flood", sends: fmt.Sprintf("%d initializes without a credential, 16 at a time, as fast as they go", n),
		cap: "max_sessions_per_credential 1000 (max_sessions 100 000); a session that made a call is never evicted, unused ones after a 10 s grace",
		setup: func(ctx context.Context, a *attackRun) error {
			var err error
			if victim, err = bench.Initialize(ctx, a.hc, a.url, true); err != nil {
				return err
			}
			return victim.Call(ctx, a.hc, 1)
		},
		run: func(ctx context.Context, a *attackRun) error {
			var t tally
			floodStart = time.Now()
			parallel(n, 16, func(i int) {
				x := a.post(ctx, "", initBodyNamed("flood-"+strconv.Itoa(i)))
				t.add(x.key(), x.msg)
			})
			took := time.Since(floodStart)
			a.got(&t, "")
			a.note("the flood took %s", took.Round(time.Millisecond))
			err := victim.Call(ctx, a.hc, 2)
			a.check(err == nil, "the victim's session (it made a call before) answers after the flood%s", errSuffix(err))
			x := a.post(ctx, "", initBodyNamed("newcomer"))
			a.note("a new agent's initialize right after the flood: %s", x.key())
			if x.msg != "" {
				a.note("…with %q, Retry-After per README", x.msg)
			}
			if err := sleepCtx(ctx, time.Until(floodStart.Add(sessionGrace+time.Second))); err != nil {
				return err
			}
			y := a.post(ctx, "", initBodyNamed("newcomer-late"))
			a.check(y.status == http.StatusOK && y.sid != "", "a new agent %s after the flood began (past the grace) is admitted: %s",
				(sessionGrace + time.Second).String(), y.key())
			return nil
		},
		after: func(ctx context.Context, a *attackRun) error {
			// Every session mcpheal refused or evicted must be gone upstream
			// too: the upstream's sessions opened since setup are mcpheal's
			// new ones.
			st, err := a.upStats(ctx)
			if err != nil {
				return err
			}
			live, err := a.metric(ctx, "mcpheal_sessions")
			if err != nil {
				return err
			}
			opened := st.Sessions - a.stats.Sessions
			a.note("upstream: %d initializes during the attack; 2 s later %d sessions live in mcpheal (mcpheal_sessions)", st.Initializes-a.stats.Initializes, int(live))
			a.check(opened == int64(live)-1, "the upstream holds %d sessions from the attack for mcpheal's %d new ones (the refused and the evicted ones were deleted upstream)", opened, int(live)-1)
			return nil
		},
	}
}

func errSuffix(err error) string {
	if err == nil {
		return ""
	}
	return ": " + err.Error()
}

// streamCall posts a tools/call that answers with a stream and reads it
// until it ends or ctx ends; it returns the status, the bytes read and the
// last 64 KiB of them.
func (a *attackRun) streamCall(ctx context.Context, sid string, body []byte) (status int, n int64, tail []byte, err error) {
	req, err := a.request(ctx, sid, body)
	if err != nil {
		return 0, 0, nil, err
	}
	resp, err := a.hc.Do(req)
	if err != nil {
		return 0, 0, nil, err
	}
	defer resp.Body.Close()
	buf := make([]byte, 64<<10)
	keep := make([]byte, 0, 128<<10)
	for {
		k, rerr := resp.Body.Read(buf)
		n += int64(k)
		keep = append(keep, buf[:k]...)
		if len(keep) > 64<<10 {
			keep = append(keep[:0], keep[len(keep)-64<<10:]...)
		}
		if rerr != nil {
			if errors.Is(rerr, io.EOF) || ctx.Err() != nil {
				rerr = nil
			}
			return resp.StatusCode, n, keep, rerr
		}
	}
}

// 4. Unbounded SSE: 4 agents reading an endless data line for 5 s.
func (h *harness) attackEndless() hostileAttack {
	const agents, rate, read = 4, 8, 5 * time.Second
	return hostileAttack{
		name: "unbounded SSE", sends: fmt.Sprintf("%d agents call `endless` (a data: line that never ends, %d MiB/s each) and read it for %s", agents, rate, read),
		cap: "nothing held: a data line streams through (one read buffer per stream)",
		setup: func(ctx context.Context, a *attackRun) error {
			return a.openSessions(ctx, agents)
		},
		run: func(ctx context.Context, a *attackRun) error {
			var t tally
			got := make([]int64, agents)
			parallel(agents, agents, func(i int) {
				rctx, cancel := context.WithTimeout(ctx, read)
				defer cancel()
				st, n, _, err := a.streamCall(rctx, a.sess[i].ID, toolCall(10+i, "endless", fmt.Sprintf(`{"mibps":%d}`, rate)))
				got[i] = n
				x := agentAnswer{status: st, err: err}
				t.add(x.key(), "")
			})
			a.got(&t, fmt.Sprintf("; %s–%s each in %s", mib(int(slices.Min(got))), mib(int(slices.Max(got))), read))
			a.check(slices.Min(got) >= 1<<20, "every agent got the line as it came (at least 1 MiB in %s)", read)
			return nil
		},
		after: func(ctx context.Context, a *attackRun) error {
			st, err := a.upStats(ctx)
			if err != nil {
				return err
			}
			a.check(st.Streams == 0, "2 s after the agents left, the upstream writes %d endless answers (mcpheal closed them)", st.Streams)
			return nil
		},
	}
}

// lastEventError finds the JSON-RPC error in the last data: line of tail.
func lastEventError(tail []byte) (code int64, msg string) {
	i := bytes.LastIndex(tail, []byte("data:"))
	if i < 0 {
		return 0, ""
	}
	line := tail[i+len("data:"):]
	if j := bytes.IndexByte(line, '\n'); j >= 0 {
		line = line[:j]
	}
	line = bytes.TrimSpace(line)
	return gjson.GetBytes(line, "error.code").Int(), gjson.GetBytes(line, "error.message").Str
}

// 4b. A line mcpheal must hold whole: an endless id: line.
func (h *harness) attackHeldLine() hostileAttack {
	const agents, rate, limit = 4, 16, 15 * time.Second
	return hostileAttack{
		name: "held SSE line", sends: fmt.Sprintf("%d agents call `endless_id` (an id: line that never ends, %d MiB/s each) and read until the answer ends", agents, rate),
		cap: "max_sse_line 8 MiB per held line, counted in memory_budget past 64 KiB with its copy (-32017 beyond)",
		setup: func(ctx context.Context, a *attackRun) error {
			return a.openSessions(ctx, agents)
		},
		run: func(ctx context.Context, a *attackRun) error {
			var t tally
			named := 0
			var mu sync.Mutex
			got := make([]int64, agents)
			parallel(agents, agents, func(i int) {
				rctx, cancel := context.WithTimeout(ctx, limit)
				defer cancel()
				st, n, tail, err := a.streamCall(rctx, a.sess[i].ID, toolCall(20+i, "endless_id", fmt.Sprintf(`{"mibps":%d}`, rate)))
				got[i] = n
				code, msg := lastEventError(tail)
				key := agentAnswer{status: st, err: err}.key()
				switch {
				case rctx.Err() != nil:
					key += ", still open after " + limit.String()
				case code != 0:
					key += fmt.Sprintf(", last event %d", code)
				default:
					key += ", ended without an error event"
				}
				t.add(key, msg)
				// Either cap may end a line first: max_sse_line, or, with
				// a small budget, memory_budget while the lines grow.
				if code == -32016 && strings.Contains(msg, "max_sse_line") || code == -32017 && strings.Contains(msg, "memory_budget") {
					mu.Lock()
					named++
					mu.Unlock()
				}
			})
			a.got(&t, fmt.Sprintf("; %s–%s each", mib(int(slices.Min(got))), mib(int(slices.Max(got)))))
			a.check(named == agents, "%d of %d answers end with -32016 naming max_sse_line or -32017 naming memory_budget", named, agents)
			if m := slices.Max(got); m > 1<<20 {
				a.note("an agent received up to %s before the error event: the held id: line itself, not rewritten, which the blank line before the error event completes", mib(int(m)))
			}
			return nil
		},
		after: func(ctx context.Context, a *attackRun) error {
			st, err := a.upStats(ctx)
			if err != nil {
				return err
			}
			a.check(st.Streams == 0, "2 s later the upstream writes %d endless answers (mcpheal closed them)", st.Streams)
			return nil
		},
	}
}

// slowConn is one agent that sent its request and does not read.
type slowConn struct {
	c   *net.TCPConn
	err error
}

// dialSmallWindow connects with a 4 KiB receive buffer, set before the
// handshake so that the advertised window stays small.
func dialSmallWindow(ctx context.Context, addr string) (*net.TCPConn, error) {
	d := net.Dialer{Timeout: 5 * time.Second, Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096)
		})
		if err != nil {
			return err
		}
		return serr
	}}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	return c.(*net.TCPConn), nil
}

// readSlow reads what a slow agent's connection holds once it starts
// reading: the head, and the body until the connection ends or deadline.
// cut is true when the body ended before its Content-Length, open when the
// connection was still open at the deadline.
func readSlow(c net.Conn, deadline time.Time) (x agentAnswer, want int64, cut, open bool) {
	_ = c.SetReadDeadline(deadline)
	br := bufio.NewReaderSize(c, 64<<10)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		var ne net.Error
		open = errors.As(err, &ne) && ne.Timeout()
		return agentAnswer{err: err}, 0, false, open
	}
	defer resp.Body.Close()
	x.status, want = resp.StatusCode, resp.ContentLength
	var raw []byte
	if want >= 0 && want < 64<<10 {
		raw, err = io.ReadAll(resp.Body)
		x.n = int64(len(raw))
	} else {
		x.n, err = io.Copy(io.Discard, resp.Body)
	}
	if err != nil {
		var ne net.Error
		open = errors.As(err, &ne) && ne.Timeout()
		cut = !open
	}
	if ans := bench.Answer(raw); ans != nil {
		x.code, x.msg = gjson.GetBytes(ans, "error.code").Int(), gjson.GetBytes(ans, "error.message").Str
	}
	return x, want, cut, open
}

// 5. Slow agents: 10 raw connections ask for a large answer and never read.
func (h *harness) attackSlow() hostileAttack {
	const agents = 10
	size := h.hostileSlowBytes
	var conns []slowConn
	return hostileAttack{
		name:  "slow agents",
		sends: fmt.Sprintf("%d raw TCP agents (4 KiB receive buffer) call `big` (%s JSON) and do not read", agents, mib(size)),
		cap:   fmt.Sprintf("write_timeout (default %s); a buffered answer counts in memory_budget until the handler returns", defWriteTimeout),
		flags: []string{"--write-timeout", slowWriteTimeout.String()},
		setup: func(ctx context.Context, a *attackRun) error {
			conns = nil
			return a.openSessions(ctx, 1)
		},
		run: func(ctx context.Context, a *attackRun) error {
			defer func() {
				for _, c := range conns {
					if c.c != nil {
						_ = c.c.Close()
					}
				}
			}()
			body := toolCall(30, "big", fmt.Sprintf(`{"bytes":%d}`, size))
			head := "POST /mcp HTTP/1.1\r\nHost: " + a.addr + "\r\nContent-Type: application/json\r\n" +
				"Accept: application/json, text/event-stream\r\nMcp-Session-Id: " + a.sess[0].ID +
				"\r\nMcp-Protocol-Version: " + bench.ProtocolVersion + "\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n"
			for range agents {
				c, err := dialSmallWindow(ctx, a.addr)
				if err == nil {
					_, err = c.Write(append([]byte(head), body...))
				}
				conns = append(conns, slowConn{c: c, err: err})
			}
			// Wait until the upstream has answered every call.
			var st hostileStats
			for deadline := time.Now().Add(10 * time.Second); ; {
				var err error
				if st, err = a.upStats(ctx); err != nil {
					return err
				}
				if st.Calls["big"]-a.stats.Calls["big"] >= agents || time.Now().After(deadline) {
					break
				}
				if err := sleepCtx(ctx, 20*time.Millisecond); err != nil {
					return err
				}
			}
			answered := time.Now()
			a.note("the upstream ran `big` %d times", st.Calls["big"]-a.stats.Calls["big"])
			if err := sleepCtx(ctx, time.Second); err != nil {
				return err
			}
			a.note("while they hang (1 s): RSS %.1f MB, %d sockets open", mb(a.rssKB()), a.sockets())
			if err := sleepCtx(ctx, time.Until(answered.Add(slowWriteTimeout+1500*time.Millisecond))); err != nil {
				return err
			}
			a.note("after write_timeout (+1.5 s): RSS %.1f MB, %d sockets open (RSS falls only after Go's next GC; the sockets show the release)", mb(a.rssKB()), a.sockets())
			// Now the agents read: what did each get, and did mcpheal let go?
			var t tally
			var mu sync.Mutex
			letGo, whole := 0, 0
			var bodies []int64
			deadline := time.Now().Add(3 * time.Second)
			parallel(len(conns), len(conns), func(i int) {
				c := conns[i]
				if c.err != nil {
					t.add("no connection ("+shortErr(c.err)+")", "")
					return
				}
				x, want, cut, open := readSlow(c.c, deadline)
				key := x.key()
				switch {
				case open:
					key += ", connection still open"
				case cut:
					key += ", cut"
				}
				t.add(key, x.msg)
				mu.Lock()
				defer mu.Unlock()
				if !open {
					letGo++
				}
				if x.status == http.StatusOK {
					bodies = append(bodies, x.n)
					if !cut && !open && x.n == want {
						whole++
					}
				}
			})
			a.got(&t, "")
			if len(bodies) > 0 {
				a.res.Got += fmt.Sprintf("; the 200s carried %s–%s of %s", mib(int(slices.Min(bodies))), mib(int(slices.Max(bodies))), mib(size))
			}
			a.check(letGo == len(conns), "no agent left hanging past write_timeout: %d of %d connections cut and closed, %d answers whole (they fit in the socket buffers, no write stalled)",
				letGo-whole, len(conns), whole)
			return nil
		},
	}
}

// 6. Oversized upstream answer: 5 concurrent calls of a 100 MiB JSON
// answer, with the tool named by --replay-tool: chunked (huge: mcpheal
// learns its size only by reading it), or announced by Content-Length (big
// with 100 MiB: it can refuse before reading).
func (h *harness) attackHuge(announced bool) hostileAttack {
	const calls, size = 5, 100 << 20
	tool, args, name, how := "huge", "{}", "oversized answer", "chunked"
	capText := "max_answer 32 MiB per answer read whole; memory_budget counts each answer from its first byte (-32017 beyond)"
	if announced {
		tool, args, name, how = "big", fmt.Sprintf(`{"bytes":%d}`, size), "oversized, announced", "with Content-Length"
		capText = "max_answer 32 MiB, known from Content-Length before any of the body is read"
	}
	return hostileAttack{
		name: name, sends: fmt.Sprintf("%d concurrent calls of `%s`: a %s JSON answer, %s, from the upstream", calls, tool, mib(size), how),
		cap:   capText,
		flags: []string{"--replay-tool", tool},
		setup: func(ctx context.Context, a *attackRun) error {
			return a.openSessions(ctx, 1)
		},
		run: func(ctx context.Context, a *attackRun) error {
			var t tally
			named := 0
			var mu sync.Mutex
			parallel(calls, calls, func(i int) {
				x := a.post(ctx, a.sess[0].ID, toolCall(40+i, tool, args))
				t.add(x.key(), x.msg)
				// Either cap may stop an answer first: max_answer
				// (-32016), or, with a small budget, memory_budget
				// (-32017) while several are read at once.
				if x.status == http.StatusOK && x.code == -32016 && strings.Contains(x.msg, "max_answer") ||
					x.status == http.StatusOK && x.code == -32017 && strings.Contains(x.msg, "memory_budget") {
					mu.Lock()
					named++
					mu.Unlock()
				}
			})
			a.got(&t, "")
			a.check(named == calls, "%d of %d got -32016 naming max_answer or -32017 naming memory_budget", named, calls)
			st, err := a.upStats(ctx)
			if err != nil {
				return err
			}
			ran := st.Calls[tool] - a.stats.Calls[tool]
			a.check(ran == calls, "the upstream ran `%s` %d times for %d calls (no replay, although --replay-tool names it)", tool, ran, calls)
			x := a.post(ctx, a.sess[0].ID, toolCall(49, bench.EchoTool, `{"text":"after"}`))
			a.check(x.status == http.StatusOK && x.code == 0 && x.err == nil, "a normal call right after is answered (no outage): %s", x.key())
			return nil
		},
	}
}

func (h *harness) logHostile(pass *hostilePass, r *hostileResult) {
	h.logf("hostile [%s] %-20s RSS before %.1f MB, peak %.1f MB, after 2 s %.1f MB, CPU %.2f s, %s; got: %s",
		pass.Name, r.Attack, mb(r.BeforeKB), mb(r.PeakKB), mb(r.AfterKB), r.CPUs, r.Elapsed.Round(time.Millisecond), r.Got)
	for _, m := range r.Messages {
		h.logf("    message: %s", m)
	}
	for _, n := range r.Notes {
		h.logf("    note: %s", n)
	}
	for _, c := range r.Checks {
		h.logf("    %s: %s", okFail(c.OK), c.What)
	}
}

func okFail(ok bool) string {
	if ok {
		return "ok"
	}
	return "FAIL"
}

// writeHostile writes the section into the results.
func (h *harness) writeHostile(w writer) {
	if len(h.hostile) == 0 {
		return
	}
	w("## Hostile input\n\n")
	w("What one agent or one upstream can take (docs/security.md \"Under attack\"). mcpheal is the real binary built from this tree, each attack against a fresh process with its default limits ")
	w("(memory_budget 512 MiB, max_body 4 MiB, max_json_depth 64, max_init_body 64 KiB, max_journal 64 KiB, max_answer 32 MiB, max_sse_line 8 MiB, write_timeout 30 s, max_sessions 100 000, max_sessions_per_credential 1000) ")
	w("unless the pass or the attack names a flag; the upstream is `mcpbench upstream -mode hostile`, a minimal stateful MCP server whose tools answer 2 MiB+, 100 MiB, never-ending or with one %s event, whose OAuth protected resource metadata is %s, ",
		mib(hostileEvent), mib(hostileMetadata))
	w("or (the bridged rows) a server that speaks only MCP 2026-07-28, whose server/discover may carry %s of instructions. ", mib(hostileInstructions))
	w("Slow agents ask for %s (2 MiB would fit in this kernel's socket buffers, tcp_wmem max %s, and never stall a write). %s in all.\n\n",
		mib(h.hostileSlowBytes), strings.TrimSpace(lastField(readFile("/proc/sys/net/ipv4/tcp_wmem"))), h.hostileElapsed.Round(time.Second))
	w("How to read: *before* is mcpheal's VmRSS just before the attack, *peak* its VmHWM during it (reset with `/proc/<pid>/clear_refs` first), *after* its VmRSS 2 s after the attack ended (Go hands freed memory back to the kernel lazily, so *after* ≥ what is still live), in MB (10⁶ bytes), beside the cap that should bound it; *got* counts what the attacker received, as HTTP status and JSON-RPC error code.\n\n")
	for _, p := range h.hostile {
		w("### %s\n\n", p.Name)
		w("| attack | the attacker sends | cap that bounds it | RSS before MB | peak RSS MB | RSS 2 s after MB | mcpheal CPU s | what the attacker got | checks | notes |\n")
		w("|---|---|---|---|---|---|---|---|---|---|\n")
		for _, r := range p.Results {
			capCell := r.Cap
			if len(r.Flags) > 0 {
				capCell += " (`" + strings.Join(r.Flags, " ") + "`)"
			}
			var checks []string
			for _, c := range r.Checks {
				checks = append(checks, okFail(c.OK)+": "+c.What)
			}
			peak := fmt.Sprintf("**%.1f**", mb(r.PeakKB))
			if !r.RSSReset {
				peak += " (since start: clear_refs failed)"
			}
			w("| %s | %s | %s | %.1f | %s | %.1f | %.2f | %s | %s | %s |\n", r.Attack, mdCell(r.Sends), mdCell(capCell),
				mb(r.BeforeKB), peak, mb(r.AfterKB), r.CPUs, mdCell(r.Got), mdCell(strings.Join(checks, "; ")), mdCell(strings.Join(r.Notes, "; ")))
		}
		w("\nThe errors the attacker read, one per kind of answer:\n\n")
		for _, r := range p.Results {
			for _, m := range r.Messages {
				w("- %s: %s\n", r.Attack, m)
			}
		}
		w("\n")
	}
}

func lastField(s string) string {
	f := strings.Fields(s)
	if len(f) == 0 {
		return "?"
	}
	n, err := strconv.Atoi(f[len(f)-1])
	if err != nil {
		return f[len(f)-1]
	}
	return mib(n)
}

// mdCell escapes a table cell.
func mdCell(s string) string {
	return strings.NewReplacer("|", "\\|", "\n", " ").Replace(s)
}

// printHostile prints the section's figures at the end of a run.
func (h *harness) printHostile() {
	if len(h.hostile) == 0 {
		return
	}
	fmt.Println()
	fmt.Println("hostile input: mcpheal RSS MB before / peak (VmHWM) / 2 s after; what the attacker got")
	for _, p := range h.hostile {
		fmt.Printf("  %s\n", p.Name)
		for _, r := range p.Results {
			bad := 0
			for _, c := range r.Checks {
				if !c.OK {
					bad++
				}
			}
			fmt.Printf("    %-20s %6.1f / %6.1f / %6.1f  checks %d/%d ok  %s\n", r.Attack, mb(r.BeforeKB), mb(r.PeakKB), mb(r.AfterKB),
				len(r.Checks)-bad, len(r.Checks), r.Got)
		}
	}
}
