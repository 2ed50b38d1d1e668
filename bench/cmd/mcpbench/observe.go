package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/tidwall/gjson"

	"github.com/mcpheal/mcpheal/bench"
)

// The observations of the peers leg: a few direct requests through
// ContextForge and, for comparison, through mcpheal, each in front of its
// own observe upstream (mode "observe" of the upstream subcommand), which
// appends every initialize and every tool execution to an events file that
// outlives its restarts. They answer: does a call open a new upstream
// session; what does an agent get when the upstream restarts between two
// calls, and when it dies during one; is a write (a tools/call that is not
// idempotent) ever run twice.

// observeServer is the observe upstream: the Go SDK's Streamable HTTP
// server (stateful, JSON answers) with two tools. echo {text, sleep_ms}
// is read-only and idempotent; write {key, sleep_ms} is neither (it is
// destructive: each execution counts). Both sleep sleep_ms before they
// answer, and log their execution when they begin it.
func observeServer(events string) (http.Handler, error) {
	f, err := os.OpenFile(events, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	var mu sync.Mutex
	logEv := func(ev string) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(f, "%d %s\n", time.Now().UnixNano(), ev) // one write(2): O_APPEND keeps lines whole
	}
	srv := mcp.NewServer(&mcp.Implementation{Name: "bench-observe", Version: "1"}, nil)
	type args struct {
		Text    string `json:"text"`
		Key     string `json:"key"`
		SleepMS int    `json:"sleep_ms"`
	}
	run := func(kind string) mcp.ToolHandler {
		return func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			var a args
			if err := json.Unmarshal(req.Params.Arguments, &a); err != nil {
				return nil, err
			}
			arg := a.Text
			if kind == "write" {
				arg = a.Key
			}
			logEv(kind + " " + arg)
			if a.SleepMS > 0 {
				select {
				case <-time.After(time.Duration(a.SleepMS) * time.Millisecond):
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			}
			text := arg
			if kind == "write" {
				text = "wrote " + arg
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: text}}}, nil
		}
	}
	destructive := true
	srv.AddTool(&mcp.Tool{Name: "echo", Description: "Returns its text argument after sleep_ms.",
		InputSchema: json.RawMessage(`{"type":"object","properties":{"text":{"type":"string"},"sleep_ms":{"type":"integer"}},"required":["text"]}`),
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, IdempotentHint: true}}, run("echo"))
	srv.AddTool(&mcp.Tool{Name: "write", Description: "Records one write of key after sleep_ms.",
		InputSchema: json.RawMessage(`{"type":"object","properties":{"key":{"type":"string"},"sleep_ms":{"type":"integer"}},"required":["key"]}`),
		Annotations: &mcp.ToolAnnotations{DestructiveHint: &destructive}}, run("write"))
	srv.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			if method == "initialize" {
				logEv("init")
			}
			return next(ctx, method, req)
		}
	})
	return mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv },
		&mcp.StreamableHTTPOptions{JSONResponse: true}), nil
}

// observation is one observed case through one target.
type observation struct {
	Case, Target string
	Calls        int           // calls the agent sent
	Got          string        // what the agent got (the last call's answer)
	Inits        int           // initialize requests the upstream received meanwhile
	Execs        int           // executions of the case's tool arguments at the upstream; -1: not counted
	Latency      time.Duration // of the last call
}

// obsUpstream is one observe upstream and its events file.
type obsUpstream struct {
	addr, events, log string
	c                 *child
}

func (h *harness) startObsUpstream(ctx context.Context, u *obsUpstream) error {
	c, err := startChild(ctx, "upstream", u.log, true, helperEnv,
		h.self, "upstream", "-listen", u.addr, "-mode", "observe", "-events", u.events)
	if err != nil {
		return err
	}
	u.c = c
	return nil
}

// count returns how many events of kind (init, echo or write) with
// argument arg ("" for any) the upstream logged.
func (u *obsUpstream) count(kind, arg string) int {
	f, err := os.Open(u.events)
	if err != nil {
		return 0
	}
	defer f.Close()
	n := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		_, ev, _ := strings.Cut(sc.Text(), " ")
		k, a, _ := strings.Cut(ev, " ")
		if k == kind && (arg == "" || a == arg) {
			n++
		}
	}
	return n
}

// obsAgent is an agent session on one target with the names it calls the
// observe tools by.
type obsAgent struct {
	target string
	sess   bench.Session
	echo   string
	write  string
	hc     *http.Client
}

// call sends one tools/call and says what the agent got: "ok: <text>",
// "tool error: …", "JSON-RPC error <code>: …", "HTTP <status>: …" or the
// transport error.
func (a *obsAgent) call(ctx context.Context, id int, tool string, args map[string]any) (string, time.Duration) {
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "method": "tools/call",
		"params": map[string]any{"name": tool, "arguments": args}})
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, a.sess.URL, bytes.NewReader(body))
	if err != nil {
		return err.Error(), 0
	}
	req.Header = a.sess.Header()
	start := time.Now()
	resp, err := a.hc.Do(req)
	if err != nil {
		return "transport: " + err.Error(), time.Since(start)
	}
	b, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	d := time.Since(start)
	ans := bench.Answer(b)
	switch {
	case resp.StatusCode != http.StatusOK && ans == nil:
		return fmt.Sprintf("HTTP %d: %s", resp.StatusCode, strings.TrimSpace(mdEscape(string(b), 140))), d
	case ans == nil:
		return fmt.Sprintf("HTTP 200, no JSON-RPC answer: %s", mdEscape(string(b), 140)), d
	}
	if resp.StatusCode != http.StatusOK {
		// A refusal's own words, where its JSON body has them.
		if msg := gjson.GetBytes(ans, "message").Str; msg != "" {
			return fmt.Sprintf("HTTP %d: %s", resp.StatusCode, mdEscape(msg, 140)), d
		}
		return fmt.Sprintf("HTTP %d: %s", resp.StatusCode, strings.TrimSpace(mdEscape(string(ans), 140))), d
	}
	m := gjson.ParseBytes(ans)
	if e := m.Get("error"); e.Exists() {
		return fmt.Sprintf("JSON-RPC error %s: %s", e.Get("code").Raw, mdEscape(e.Get("message").Str, 140)), d
	}
	text := m.Get("result.content.0.text").Str
	if m.Get("result.isError").Bool() {
		return "tool error: " + mdEscape(text, 140), d
	}
	return "ok: " + mdEscape(text, 60), d
}

// observe runs the observations through mcpheal and ContextForge, then
// ContextForge's default rate limit.
func (h *harness) observe(ctx context.Context, e *env, cf *contextForge) error {
	dir := filepath.Join(e.dir, "observe")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, name := range []string{mcpheal, viaContextForge} {
		u := &obsUpstream{events: filepath.Join(dir, name+".events"), log: filepath.Join(dir, name+"-upstream.log")}
		var err error
		if u.addr, err = freeAddr(); err != nil {
			return err
		}
		if err := h.startObsUpstream(ctx, u); err != nil {
			return err
		}
		upURL := "http://" + u.addr + "/mcp"
		a := &obsAgent{target: name, hc: &http.Client{Timeout: 2 * time.Minute}, echo: "echo", write: "write"}
		var px *child
		switch name {
		case mcpheal:
			var url string
			if url, _, px, err = h.startProxy(ctx, filepath.Join(dir, "mcpheal"), upURL); err != nil {
				u.c.stop(5 * time.Second)
				return err
			}
			a.sess = bench.Session{URL: url}
		default:
			srv, err := cf.register(ctx, "observe", upURL)
			if err != nil {
				u.c.stop(5 * time.Second)
				return err
			}
			a.sess = bench.Session{URL: srv.URL, Auth: "Bearer " + cf.token}
			a.echo, a.write = srv.Tools["echo"], srv.Tools["write"]
		}
		a.sess.Tool = a.echo
		err = h.observeOne(ctx, a, u)
		if px != nil {
			px.stop(5 * time.Second)
		}
		if u.c != nil {
			u.c.stop(5 * time.Second)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	return h.observeRateLimit(ctx, dir)
}

// obsCalls is how many calls the sessions-per-call case sends.
const obsCalls = 20

// observeOne runs the cases through one agent.
func (h *harness) observeOne(ctx context.Context, a *obsAgent, u *obsUpstream) error {
	var err error
	inits0 := u.count("init", "")
	if a.sess, err = bench.InitializeAs(ctx, a.hc, a.sess, true); err != nil {
		return err
	}
	p := &h.peersRes
	add := func(o observation) {
		o.Target = a.target
		p.obs = append(p.obs, o)
		h.logf("observe %-12s %-58s calls=%d inits=%d execs=%d %s: %s", o.Target, o.Case, o.Calls, o.Inits, o.Execs, ms(o.Latency), o.Got)
	}
	add(observation{Case: "agent session opened (initialize, notifications/initialized, tools/list)", Calls: 0,
		Got:   map[bool]string{true: "an Mcp-Session-Id", false: "no Mcp-Session-Id (stateless)"}[a.sess.ID != ""],
		Inits: u.count("init", "") - inits0, Execs: -1})
	id := 1
	// Sessions per call.
	inits0 = u.count("init", "")
	var got string
	var lat time.Duration
	for i := range obsCalls {
		got, lat = a.call(ctx, id, a.echo, map[string]any{"text": fmt.Sprintf("seq-%d", i)})
		id++
	}
	add(observation{Case: fmt.Sprintf("%d read-only calls in a row", obsCalls), Calls: obsCalls, Got: got,
		Inits: u.count("init", "") - inits0, Execs: u.count("echo", ""), Latency: lat})
	// Writes, the upstream healthy.
	inits0 = u.count("init", "")
	execs := 0
	for i := range 5 {
		key := fmt.Sprintf("healthy-%d", i)
		got, lat = a.call(ctx, id, a.write, map[string]any{"key": key})
		id++
		execs += u.count("write", key)
	}
	add(observation{Case: "5 writes, the upstream healthy", Calls: 5, Got: got, Inits: u.count("init", "") - inits0, Execs: execs, Latency: lat})
	// The upstream restarted between two calls (SIGTERM, down 0.5 s).
	u.c.stop(5 * time.Second)
	if err := sleepCtx(ctx, 500*time.Millisecond); err != nil {
		return err
	}
	if err := h.startObsUpstream(ctx, u); err != nil {
		return err
	}
	inits0 = u.count("init", "")
	got, lat = a.call(ctx, id, a.echo, map[string]any{"text": "after-restart"})
	id++
	add(observation{Case: "read-only call after the upstream restarted (SIGTERM, 0.5 s down)", Calls: 1, Got: got,
		Inits: u.count("init", "") - inits0, Execs: u.count("echo", "after-restart"), Latency: lat})
	inits0 = u.count("init", "")
	got, lat = a.call(ctx, id, a.write, map[string]any{"key": "after-restart"})
	id++
	add(observation{Case: "write after that", Calls: 1, Got: got,
		Inits: u.count("init", "") - inits0, Execs: u.count("write", "after-restart"), Latency: lat})
	// The upstream killed during a call (SIGKILL 0.5 s into a 1.5 s tool, back 0.5 s later).
	for _, c := range []struct{ tool, arg, kind, label string }{
		{a.echo, "text", "echo", "read-only call (1.5 s) during which the upstream is killed (SIGKILL at 0.5 s, back 0.5 s later)"},
		{a.write, "key", "write", "write (1.5 s) during which the upstream is killed (the same)"},
	} {
		key := "killed-" + c.kind
		inits0 = u.count("init", "")
		type answer struct {
			got string
			lat time.Duration
		}
		done := make(chan answer, 1)
		callID := id
		id++
		go func() {
			g, l := a.call(ctx, callID, c.tool, map[string]any{c.arg: key, "sleep_ms": 1500})
			done <- answer{g, l}
		}()
		if err := sleepCtx(ctx, 500*time.Millisecond); err != nil {
			return err
		}
		u.c.kill()
		if err := sleepCtx(ctx, 500*time.Millisecond); err != nil {
			return err
		}
		if err := h.startObsUpstream(ctx, u); err != nil {
			return err
		}
		var ans answer
		select {
		case ans = <-done:
		case <-ctx.Done():
			return ctx.Err()
		}
		// A resent call may still be running at the upstream: let it end.
		if err := sleepCtx(ctx, 2*time.Second); err != nil {
			return err
		}
		add(observation{Case: c.label, Calls: 1, Got: ans.got, Inits: u.count("init", "") - inits0, Execs: u.count(c.kind, key), Latency: ans.lat})
	}
	inits0 = u.count("init", "")
	got, lat = a.call(ctx, id, a.echo, map[string]any{"text": "after-kill"})
	add(observation{Case: "read-only call after that", Calls: 1, Got: got,
		Inits: u.count("init", "") - inits0, Execs: u.count("echo", "after-kill"), Latency: lat})
	return nil
}

// observeRateLimit sends 150 calls at 10 per second through a second
// ContextForge with its default rate limit, and counts what they got.
func (h *harness) observeRateLimit(ctx context.Context, dir string) error {
	u := &obsUpstream{events: filepath.Join(dir, "ratelimit.events"), log: filepath.Join(dir, "ratelimit-upstream.log")}
	var err error
	if u.addr, err = freeAddr(); err != nil {
		return err
	}
	if err := h.startObsUpstream(ctx, u); err != nil {
		return err
	}
	defer u.c.stop(5 * time.Second)
	h.logf("observe: a second ContextForge with its default rate limit")
	cf, err := startContextForge(ctx, h.cfg.peers.venv, filepath.Join(dir, "contextforge-default"), 0)
	if err != nil {
		return err
	}
	defer cf.stop()
	srv, err := cf.register(ctx, "observe", "http://"+u.addr+"/mcp")
	if err != nil {
		return err
	}
	a := &obsAgent{target: viaContextForge, hc: &http.Client{Timeout: time.Minute},
		sess: bench.Session{URL: srv.URL, Auth: "Bearer " + cf.token, Tool: srv.Tools["echo"]}}
	if a.sess, err = bench.InitializeAs(ctx, a.hc, a.sess, true); err != nil {
		return err
	}
	const calls, every = 150, 100 * time.Millisecond
	outcomes := map[string]int{}
	var order []string
	firstRefused := -1
	tick := time.NewTicker(every)
	defer tick.Stop()
	for i := range calls {
		got, _ := a.call(ctx, i+1, srv.Tools["echo"], map[string]any{"text": fmt.Sprintf("rl-%d", i)})
		kind := got
		if strings.HasPrefix(got, "ok: ") {
			kind = "ok"
		} else if firstRefused < 0 {
			firstRefused = i + 1
		}
		if outcomes[kind] == 0 {
			order = append(order, kind)
		}
		outcomes[kind]++
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
	var parts []string
	for _, k := range order {
		parts = append(parts, fmt.Sprintf("%d × %s", outcomes[k], k))
	}
	o := observation{Case: fmt.Sprintf("%d read-only calls at 10/s, its default rate limit (RATE_LIMIT_MEDIUM_RPM unset: 100/min, burst 20)", calls),
		Target: viaContextForge, Calls: calls, Got: strings.Join(parts, "; "), Inits: u.count("init", ""), Execs: u.count("echo", "")}
	if firstRefused > 0 {
		o.Got += fmt.Sprintf(" (first refusal: call %d)", firstRefused)
	}
	h.peersRes.obs = append(h.peersRes.obs, o)
	h.logf("observe %s: %s", o.Case, o.Got)
	return nil
}

// writeObservations writes the observations' table.
func (h *harness) writeObservations(w writer) {
	obs := h.peersRes.obs
	if len(obs) == 0 {
		return
	}
	w("## Observed with a few direct requests\n\n")
	w("Each target in front of its own observe upstream (the Go SDK server, stateful, JSON answers; `echo` read-only and idempotent, `write` destructive), which logs every initialize and every tool execution it begins to a file that outlives its restarts. *Initializes* and *executions* are what that upstream logged during the case (the executions of the case's own argument: a write run twice shows 2). The agent is one session per target; *got* is the answer to the case's last call.\n\n")
	w("| case | target | calls | got | upstream initializes | executions | latency ms |\n|---|---|---|---|---|---|---|\n")
	for _, o := range obs {
		ex := "–"
		if o.Execs >= 0 {
			ex = fmt.Sprint(o.Execs)
		}
		w("| %s | %s | %d | %s | %d | %s | %.1f |\n", o.Case, o.Target, o.Calls, mdEscape(o.Got, 400), o.Inits, ex, msOf(o.Latency))
	}
	w("\n")
}
